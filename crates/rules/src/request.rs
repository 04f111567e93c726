//! What the rules see of a request: method, path, query, host, headers, the client address, the
//! TLS fingerprints of its connection, and for the server's named checks the caller's key; and
//! the canonical form of each characteristic, equal to what the application behind will act on
//! (see `canonical` for the host and method).
//!
//! Header values are bytes: a value that is not UTF-8 is matched and keyed as it is, never
//! dropped. A characteristic the request gives twice with different values (two `Cookie`
//! `session`s, `?api_key=junk&api_key=REAL`, two `X-Api-Key` lines) is [`Ambiguous`]: servers
//! disagree on which one counts (Go and PHP read the first, Python's cookie parser and Rack the
//! last), so the request is refused rather than keyed on a value the application may not use.

use std::borrow::Cow;
use std::net::IpAddr;

/// A request as the rules see it; borrowed from whatever HTTP types the caller has.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// `GET`, `POST`, ...
    pub method: &'a str,
    /// The path, without the query.
    pub path: &'a str,
    /// The raw query string, without `?`.
    pub query: &'a str,
    /// The host the application will act on, canonical ([`canonical::host`](crate::canonical::host):
    /// the absolute-form target's authority, else `Host`; no port, no trailing dot; compared
    /// case-insensitively).
    pub host: &'a str,
    /// Header (name, value) pairs; names in any case, values as received.
    pub headers: &'a [(&'a str, &'a [u8])],
    /// The client's address (see [`TrustedProxies::client_ip`](crate::TrustedProxies::client_ip)).
    pub client_ip: IpAddr,
    /// The key a caller names (`TG.LIMIT name KEY`, `{"limit_name", "key"}`): the `key`
    /// characteristic; none for HTTP requests.
    pub key: Option<&'a [u8]>,
    /// The JA3 fingerprint of the client's ClientHello: computed by a TLS listener, or read from
    /// a trusted proxy's header (see [`FingerprintHeaders`](crate::FingerprintHeaders)).
    pub ja3: Option<&'a str>,
    /// The JA4 fingerprint, likewise.
    pub ja4: Option<&'a str>,
    /// Whether the request's peer is one of the `trusted_proxies`: only then is a `cost_header`
    /// taken as it is; from any other peer it can only raise the rule's `cost` (see
    /// [`Rule::cost_for`](crate::Rule::cost_for)).
    pub from_trusted_proxy: bool,
}

/// A characteristic whose value servers would read differently: given more than once with
/// different values, or spelled in a way they disagree on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ambiguous {
    /// Why, naming the characteristic (`cookie session`, `query parameter api_key`, ...).
    pub why: String,
}

impl std::fmt::Display for Ambiguous {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.why)
    }
}

/// The one value of a characteristic given possibly several times: `None` if never, an error if
/// with different values.
fn only<V: PartialEq>(
    mut values: impl Iterator<Item = V>,
    what: impl FnOnce() -> String,
) -> Result<Option<V>, Ambiguous> {
    let Some(first) = values.next() else { return Ok(None) };
    if values.any(|other| other != first) {
        return Err(Ambiguous { why: format!("the request gives {} more than once, with different values", what()) });
    }
    Ok(Some(first))
}

impl<'a> Request<'a> {
    /// Every value of header `name` (case-insensitive), in order.
    pub fn headers_named(&self, name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.headers.iter().filter(move |(n, _)| n.eq_ignore_ascii_case(name)).map(|&(_, v)| v)
    }

    /// The value of header `name`: an error if its lines differ.
    pub fn header(&self, name: &str) -> Result<Option<&'a [u8]>, Ambiguous> {
        let values = self.headers.iter().filter(|(n, _)| n.eq_ignore_ascii_case(name)).map(|&(_, v)| v);
        only(values, || format!("header {}", name.to_ascii_lowercase()))
    }

    /// Every cookie of the request, `(name, value)`, as servers read them (RFC 6265 section 5.4
    /// and common servers: pairs split on `;`, name and value trimmed of spaces and tabs, the
    /// value's surrounding double quotes removed; a pair without `=` is a name with an empty
    /// value), across every `Cookie` line.
    pub fn cookies(&self) -> impl Iterator<Item = (&'a [u8], &'a [u8])> + 'a {
        self.headers_named("cookie").flat_map(|line| line.split(|&b| b == b';')).filter_map(|pair| {
            let pair = trim(pair);
            if pair.is_empty() {
                return None;
            }
            let (name, value) = match pair.iter().position(|&b| b == b'=') {
                Some(at) => (trim(&pair[..at]), trim(&pair[at + 1..])),
                None => (pair, &pair[pair.len()..]),
            };
            Some(match value {
                [b'"', inner @ .., b'"'] => (name, inner),
                value => (name, value),
            })
        })
    }

    /// The value of cookie `name`: an error if given twice with different values, or holding
    /// what servers read differently: a space or tab inside, a byte that is not printable ASCII, a
    /// backslash or a double quote inside (Python's `SimpleCookie` reads `"A;B"` whole and stops
    /// at a space, Django reads `"\101"` as `A`, Go drops a cookie holding a byte above 0x7E;
    /// RFC 6265's cookie-octet excludes them all).
    pub fn cookie(&self, name: &str) -> Result<Option<&'a [u8]>, Ambiguous> {
        let what = || format!("cookie {name}");
        let values = || self.cookies().filter(|(n, _)| *n == name.as_bytes()).map(|(_, v)| v);
        let unclear = |value: &[u8]| value.iter().any(|&b| !(0x21..=0x7e).contains(&b) || b == b'"' || b == b'\\');
        if values().any(unclear) {
            return Err(Ambiguous {
                why: format!(
                    "the request's {} holds a space, a quote, a backslash or a byte that is not printable ASCII, \
                     which servers read differently",
                    what()
                ),
            });
        }
        only(values(), what)
    }

    /// The value of query parameter `name`, percent-decoded (names are matched decoded too): an
    /// error if given twice with different values, or if it depends on whether `;` separates
    /// pairs (Rack splits on it, PHP, Go, Django and Node do not: `x=1;api_key=A` and
    /// `api_key=A;x=1` are refused for `api_key`).
    pub fn query_param(&self, name: &str) -> Result<Option<Cow<'a, [u8]>>, Ambiguous> {
        let what = || format!("query parameter {name}");
        let read = |separators: &[char]| {
            let values = self
                .query
                .split(separators)
                .map(|pair| pair.split_once('=').unwrap_or((pair, "")))
                .filter(|(n, _)| crate::normalize::query_value(n) == name.as_bytes())
                .map(|(_, v)| crate::normalize::query_value(v));
            only(values, what)
        };
        let value = read(&['&'])?;
        if self.query.contains(';') && read(&['&', ';'])? != value {
            return Err(Ambiguous {
                why: format!("the request's {} depends on whether ';' separates pairs, as servers disagree", what()),
            });
        }
        Ok(value)
    }
}

/// `bytes` without leading and trailing spaces and tabs.
fn trim(bytes: &[u8]) -> &[u8] {
    let start = bytes.iter().position(|&b| b != b' ' && b != b'\t').unwrap_or(bytes.len());
    let end = bytes.iter().rposition(|&b| b != b' ' && b != b'\t').map_or(start, |i| i + 1);
    &bytes[start..end]
}
