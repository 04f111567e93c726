//! The client's IP address: the peer's, unless the peer is a trusted proxy; then the forwarding
//! header those proxies write (one, configured: `X-Forwarded-For` by default, or RFC 7239
//! `Forwarded`; the other is ignored, since a client can send it and no proxy of ours rewrites
//! it) is walked from the right (the entries our own proxies appended) past every trusted proxy,
//! and the first untrusted address is the client. A hop that does not parse ends the walk: the
//! client is then the last trusted hop (nothing to its left can be believed).
//!
//! Never the leftmost `X-Forwarded-For` entry: any client can write it (tower_governor's flaw).

use std::net::IpAddr;
use std::str::FromStr;

/// An address block such as `10.0.0.0/8` or `::1/128` (a bare address is a /32 or /128).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    network: IpAddr,
    prefix: u8,
}

impl FromStr for Cidr {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let (address, prefix) = match text.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (text, None),
        };
        let network: IpAddr =
            address.trim().parse().map_err(|_| format!("{text:?} is not an IP address or CIDR block"))?;
        let max = if network.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(p) => p
                .trim()
                .parse::<u8>()
                .ok()
                .filter(|&p| p <= max)
                .ok_or_else(|| format!("{text:?}: prefix must be 0..={max}"))?,
            None => max,
        };
        Ok(Cidr { network, prefix })
    }
}

impl Cidr {
    /// Whether `address` is inside this block (IPv4-mapped IPv6 addresses count as IPv4).
    #[must_use]
    pub fn contains(&self, address: IpAddr) -> bool {
        let address = canonical(address);
        match (canonical(self.network), address) {
            (IpAddr::V4(net), IpAddr::V4(a)) => {
                masked(u128::from(u32::from(net)), u128::from(u32::from(a)), 32, self.prefix)
            }
            (IpAddr::V6(net), IpAddr::V6(a)) => masked(u128::from(net), u128::from(a), 128, self.prefix),
            _ => false,
        }
    }
}

fn canonical(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(address, IpAddr::V4),
        v4 => v4,
    }
}

fn masked(net: u128, address: u128, bits: u32, prefix: u8) -> bool {
    let shift = bits - u32::from(prefix);
    shift >= bits || (net >> shift) == (address >> shift)
}

tollgate_core::words! {
    /// Which header the trusted proxies write the client's address into, by its lowercase name.
    #[derive(Default)]
    pub enum ForwardingHeader: "client_ip_header" {
        /// `X-Forwarded-For: client, proxy1, proxy2` (nginx, most load balancers, `tollgate proxy`).
        #[default]
        XForwardedFor = "x-forwarded-for",
        /// RFC 7239 `Forwarded: for=client, for=proxy1`.
        Forwarded = "forwarded",
    }
}

/// The proxies whose forwarding header is believed, and which header that is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustedProxies {
    blocks: Vec<Cidr>,
    header: ForwardingHeader,
}

impl TrustedProxies {
    /// Trust these blocks, reading `X-Forwarded-For`.
    #[must_use]
    pub fn new(blocks: Vec<Cidr>) -> Self {
        TrustedProxies { blocks, header: ForwardingHeader::default() }
    }

    /// Read `header` instead.
    #[must_use]
    pub fn reading(self, header: ForwardingHeader) -> Self {
        TrustedProxies { header, ..self }
    }

    /// The header read.
    #[must_use]
    pub fn header(&self) -> ForwardingHeader {
        self.header
    }

    /// Whether any proxy is trusted (otherwise the client is always the peer).
    #[must_use]
    pub fn any(&self) -> bool {
        !self.blocks.is_empty()
    }

    /// Whether `address` is a trusted proxy (whose forwarding header is believed).
    #[must_use]
    pub fn trusts(&self, address: IpAddr) -> bool {
        self.blocks.iter().any(|block| block.contains(address))
    }

    /// The client's address for a request from `peer` whose configured forwarding header has
    /// these values (in the order received).
    #[must_use]
    pub fn client_ip(&self, peer: IpAddr, values: &[&[u8]]) -> IpAddr {
        if !self.trusts(peer) {
            return peer;
        }
        // The hops as our proxies recorded them, nearest last; walked from the right.
        // A hop that is not text is no address: the walk stops there (its other hops still count).
        let hops = values.iter().rev().flat_map(|v| v.rsplit(|&b| b == b','));
        let mut client = peer;
        for hop in hops {
            let Ok(hop) = std::str::from_utf8(hop) else { break };
            let parsed = match self.header {
                ForwardingHeader::XForwardedFor => parse_hop(hop),
                ForwardingHeader::Forwarded => forwarded_for(hop),
            };
            let Some(hop) = parsed else { break };
            client = hop;
            if !self.trusts(hop) {
                break;
            }
        }
        client
    }
}

/// The `for=` address of one RFC 7239 element (`for=1.2.3.4;proto=https`).
fn forwarded_for(element: &str) -> Option<IpAddr> {
    element.split(';').find_map(|pair| {
        let (name, value) = pair.split_once('=')?;
        name.trim().eq_ignore_ascii_case("for").then(|| parse_hop(value)).flatten()
    })
}

/// One hop: `1.2.3.4`, `1.2.3.4:5678`, `"[2001:db8::1]:80"`, `2001:db8::1`.
fn parse_hop(text: &str) -> Option<IpAddr> {
    let text = text.trim().trim_matches('"');
    if let Ok(ip) = text.parse() {
        return Some(ip);
    }
    if let Some(rest) = text.strip_prefix('[') {
        return rest.split(']').next()?.parse().ok();
    }
    text.rsplit_once(':').and_then(|(host, _)| host.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn blocks_contain_what_they_should() {
        let block: Cidr = "10.0.0.0/8".parse().unwrap();
        assert!(block.contains(ip("10.255.1.2")) && !block.contains(ip("11.0.0.1")));
        assert!(block.contains(ip("::ffff:10.1.1.1")), "IPv4-mapped");
        assert!("::1".parse::<Cidr>().unwrap().contains(ip("::1")));
        assert!("0.0.0.0/0".parse::<Cidr>().unwrap().contains(ip("8.8.8.8")));
        assert!("10.0.0.0/33".parse::<Cidr>().is_err());
        assert!("nope".parse::<Cidr>().is_err());
    }

    /// Header values as the request gives them (bytes).
    macro_rules! hops {
        ($($value:expr),* $(,)?) => { [$(AsRef::<[u8]>::as_ref($value)),*] };
    }

    #[test]
    fn walks_the_forwarding_header_from_the_right_past_trusted_proxies() {
        let trusted = TrustedProxies::new(vec!["10.0.0.0/8".parse().unwrap()]);
        // Untrusted peer: headers are ignored, whatever they say.
        assert_eq!(trusted.client_ip(ip("203.0.113.9"), &hops!["1.1.1.1"]), ip("203.0.113.9"));
        // A spoofed leftmost entry does not change the key: the first untrusted from the right wins.
        assert_eq!(trusted.client_ip(ip("10.0.0.2"), &hops!["6.6.6.6, 198.51.100.7, 10.0.0.5"]), ip("198.51.100.7"));
        assert_eq!(trusted.client_ip(ip("10.0.0.2"), &hops!["6.6.6.6", "198.51.100.7"]), ip("198.51.100.7"));
        // Only trusted hops: the leftmost trusted one is as far as we can see.
        assert_eq!(trusted.client_ip(ip("10.0.0.2"), &hops!["10.1.1.1"]), ip("10.1.1.1"));
        // A hop that does not parse ends the walk (before: it was skipped, and the attacker's
        // entry to its left was believed).
        assert_eq!(trusted.client_ip(ip("10.0.0.2"), &hops!["6.6.6.6, not-an-ip, 10.0.0.5"]), ip("10.0.0.5"));
        assert_eq!(trusted.client_ip(ip("10.0.0.2"), &hops!["6.6.6.6, not-an-ip"]), ip("10.0.0.2"));
        assert_eq!(trusted.client_ip(ip("10.0.0.2"), &hops!["198.51.100.7:443"]), ip("198.51.100.7"));
        assert_eq!(trusted.client_ip(ip("10.0.0.2"), &[]), ip("10.0.0.2"));
        // Before: a line holding a byte that is not text was dropped whole, and the proxy became
        // the client; now its hops are read, the one that is not an address ending the walk.
        assert_eq!(trusted.client_ip(ip("10.0.0.2"), &hops![b"\xff, 198.51.100.7"]), ip("198.51.100.7"));
        assert_eq!(trusted.client_ip(ip("10.0.0.2"), &hops![b"\xff", b"198.51.100.7"]), ip("198.51.100.7"));
    }

    #[test]
    fn reads_forwarded_only_when_configured() {
        let trusted = TrustedProxies::new(vec!["10.0.0.0/8".parse().unwrap()]).reading(ForwardingHeader::Forwarded);
        assert_eq!(
            trusted.client_ip(ip("10.0.0.2"), &hops!["for=6.6.6.6, for=\"[2001:db8::7]:4711\";proto=https"]),
            ip("2001:db8::7")
        );
        assert_eq!(trusted.client_ip(ip("10.0.0.2"), &hops!["for=unknown"]), ip("10.0.0.2"));
    }
}
