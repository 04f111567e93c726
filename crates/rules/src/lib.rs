//! # tollgate-rules
//!
//! Which requests count, under which key and limit, and what happens once a key is over: the
//! rules file shared by the middleware, the server and the proxy. Pure: no I/O besides reading
//! the file (and the ASN database it names), no clock, no store.
//!
//! - [`Rules::counting`]: the rules that count a request, with its key (the values of the
//!   characteristics: client IP, headers, cookies, query parameters, the path as applications
//!   route it, method, the
//!   caller's key, the TLS fingerprints `ja3` and `ja4`, the client's AS number from an
//!   [`AsnDb`]) and cost; each rule's state is scoped by its name;
//! - [`Rules::mitigating`]: the rules whose mitigation match covers it (possibly broader);
//! - [`TrustedProxies::client_ip`]: the client address, never the spoofable leftmost
//!   `X-Forwarded-For` entry;
//! - [`route`]: a path as applications route it (every spelling some backend routes to a path is
//!   that path); [`normalize`]: a path as spelled (`path_match = "exact"`) and query values as
//!   they are meant.

pub mod asn;
pub mod canonical;
mod file;
mod ip;
mod matcher;
pub mod normalize;
mod plan;
mod request;
pub mod route;
mod rules;
pub mod usage;

pub use asn::AsnDb;
pub use ip::{Cidr, ForwardingHeader, TrustedProxies};
pub use matcher::{Glob, HeaderEquals, HeaderRegex, Match, Regex};
pub use plan::{Applied, Asn, KeyBuf, Plan, RequestError};
pub use request::{Ambiguous, Request};
pub use rules::{
    Action, ActionKind, Characteristic, Cost, DEFAULT_IPV6_PREFIX, DEFAULT_RATE_HALF_LIFE_NS, ENVOY_SCOPE,
    FingerprintHeaders, OnBadCost, OnError, OnMissing, PathMatch, Rule, Rules, RulesError, check_name,
};
pub use usage::{RequestField, ResponseCost};
