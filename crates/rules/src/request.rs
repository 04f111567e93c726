//! What the rules see of a request: method, path, query, host, headers, the client address, the
//! TLS fingerprints of its connection, and for the server's named checks the caller's key.

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
    /// The `Host` (or `:authority`), without port.
    pub host: &'a str,
    /// Header (name, value) pairs; names in any case.
    pub headers: &'a [(&'a str, &'a str)],
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
}

impl<'a> Request<'a> {
    /// The first value of header `name` (case-insensitive).
    #[must_use]
    pub fn header(&self, name: &str) -> Option<&'a str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|&(_, v)| v)
    }

    /// Every value of header `name`, in order.
    pub fn headers_named(&self, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.headers.iter().filter(move |(n, _)| n.eq_ignore_ascii_case(name)).map(|&(_, v)| v)
    }

    /// The value of cookie `name`.
    #[must_use]
    pub fn cookie(&self, name: &str) -> Option<&'a str> {
        self.headers_named("cookie")
            .flat_map(|header| header.split(';'))
            .filter_map(|pair| pair.trim().split_once('='))
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v)
    }

    /// The value of query parameter `name`, percent-decoded (names are matched decoded too).
    #[must_use]
    pub fn query_param(&self, name: &str) -> Option<Cow<'a, str>> {
        self.query
            .split('&')
            .map(|pair| pair.split_once('=').unwrap_or((pair, "")))
            .find(|(n, _)| crate::normalize::query_value(n) == name)
            .map(|(_, v)| crate::normalize::query_value(v))
    }
}
