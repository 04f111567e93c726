//! The client's IP address: the peer's, unless the peer is a trusted proxy; then the forwarding
//! headers are walked from the right (the entries our own proxies appended) past every trusted
//! proxy, and the first untrusted address is the client.
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

/// The proxies whose forwarding headers are believed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustedProxies(Vec<Cidr>);

impl TrustedProxies {
    /// Trust these blocks.
    #[must_use]
    pub fn new(blocks: Vec<Cidr>) -> Self {
        TrustedProxies(blocks)
    }

    fn trusts(&self, address: IpAddr) -> bool {
        self.0.iter().any(|block| block.contains(address))
    }

    /// The client's address for a request from `peer` with these `X-Forwarded-For` and
    /// `Forwarded` header values (in the order received).
    #[must_use]
    pub fn client_ip(&self, peer: IpAddr, x_forwarded_for: &[&str], forwarded: &[&str]) -> IpAddr {
        if !self.trusts(peer) {
            return peer;
        }
        // The hops as our proxies recorded them, nearest last: prefer `Forwarded` (RFC 7239).
        let hops: Vec<IpAddr> = if forwarded.is_empty() {
            x_forwarded_for.iter().flat_map(|v| v.split(',')).filter_map(parse_hop).collect()
        } else {
            forwarded
                .iter()
                .flat_map(|v| v.split(','))
                .filter_map(|element| {
                    element.split(';').find_map(|pair| {
                        let (name, value) = pair.split_once('=')?;
                        name.trim().eq_ignore_ascii_case("for").then(|| parse_hop(value)).flatten()
                    })
                })
                .collect()
        };
        let mut client = peer;
        for hop in hops.into_iter().rev() {
            client = hop;
            if !self.trusts(hop) {
                break;
            }
        }
        client
    }
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

    #[test]
    fn walks_forwarding_headers_from_the_right_past_trusted_proxies() {
        let trusted = TrustedProxies::new(vec!["10.0.0.0/8".parse().unwrap()]);
        // Untrusted peer: headers are ignored, whatever they say.
        assert_eq!(trusted.client_ip(ip("203.0.113.9"), &["1.1.1.1"], &[]), ip("203.0.113.9"));
        // A spoofed leftmost entry does not change the key: the first untrusted from the right wins.
        assert_eq!(trusted.client_ip(ip("10.0.0.2"), &["6.6.6.6, 198.51.100.7, 10.0.0.5"], &[]), ip("198.51.100.7"));
        assert_eq!(trusted.client_ip(ip("10.0.0.2"), &["6.6.6.6", "198.51.100.7"], &[]), ip("198.51.100.7"));
        // Forwarded (RFC 7239) is preferred, with ports and brackets.
        assert_eq!(
            trusted.client_ip(ip("10.0.0.2"), &["6.6.6.6"], &["for=6.6.6.6, for=\"[2001:db8::7]:4711\";proto=https"]),
            ip("2001:db8::7")
        );
        // Only trusted hops: the leftmost trusted one is as far as we can see.
        assert_eq!(trusted.client_ip(ip("10.0.0.2"), &["10.1.1.1"], &[]), ip("10.1.1.1"));
        // Garbage is skipped, never a panic.
        assert_eq!(trusted.client_ip(ip("10.0.0.2"), &["not-an-ip, 198.51.100.7:443"], &[]), ip("198.51.100.7"));
        assert_eq!(trusted.client_ip(ip("10.0.0.2"), &[], &[]), ip("10.0.0.2"));
    }
}
