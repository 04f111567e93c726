//! # tollgate-envoy
//!
//! The pure half of tollgate's drop-in for envoyproxy/ratelimit (the rate-limit service behind
//! Envoy's `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`): its YAML configuration
//! and descriptor matching. No I/O besides reading configuration files, no clock, no store.
//!
//! [`Config::load`] reads a file or a directory of `*.yaml` / `*.yml` files (one domain each);
//! [`Config::limits_for`] gives, for one request's descriptors, each one's [`Matched`] limit, its
//! state key and its metric key.
//!
//! ```
//! use tollgate_envoy::{Config, Unit};
//!
//! let yaml = "
//! domain: sms
//! descriptors:
//!   - key: category
//!     value: promo
//!     descriptors:
//!       - key: recipient
//!         rate_limit: {unit: day, requests_per_unit: 3}
//! ";
//! let config = Config::parse(yaml, "sms.yaml")?;
//! let request: &[(&str, &str)] = &[("category", "promo"), ("recipient", "+15550001")];
//! let matched = config.limits_for("sms", &[request, &[("category", "promo")]]);
//! let promo = matched[0].as_ref().expect("a limit");
//! assert_eq!((promo.limit.requests_per_unit, promo.limit.unit), (3, Unit::Day));
//! assert_eq!(promo.metric_key, "sms.category_promo.recipient");
//! assert_eq!(promo.key, b"3:sms8:category5:promo9:recipient9:+15550001");
//! assert!(matched[1].is_none(), "no limit where that descriptor ends");
//! # Ok::<(), tollgate_envoy::ConfigError>(())
//! ```
//!
//! The semantics are envoyproxy/ratelimit's:
//!
//! - **Matching** ([`Config::limits_for`]): entry by entry down the tree, each entry to the
//!   descriptor with its key and exactly its value, else the first wildcard value (`*` anywhere,
//!   any number of times, in file order) that matches, else the descriptor of that key without a
//!   value. The limit is the one at the node reached by the descriptor's *last* entry. An unknown
//!   domain or a descriptor that matches nothing gives `None` (the answer is OK, no limit).
//! - **`replaces`**: a limit whose `name` is in the `replaces` of any limit matched by the same
//!   request is dropped (`None`). An `unlimited` limit is never dropped, and its `replaces` count.
//! - **State keys** ([`Matched::key`]) are the domain and every entry's key and value *as sent*,
//!   each framed `LEN:VALUE`, so two different descriptors never share one: a descriptor without a
//!   value, and a wildcard, count each request value separately, as envoyproxy/ratelimit's cache
//!   keys do; with `share_threshold: true` a wildcard's values count together, under the pattern.
//! - **Metric keys** ([`Matched::metric_key`]) are envoyproxy/ratelimit's stats keys: the config
//!   path `domain.key_value.key` (a wildcard as its pattern), unsanitised. Request values appear
//!   only where the configuration asks: `detailed_metric: true` (every entry as `key_value`) and
//!   `value_to_metric: true` (that entry's value).
//! - **Limits** are decided by a fixed window of one unit aligned to the Unix epoch, as
//!   envoyproxy/ratelimit counts them, unless the tollgate extensions `algorithm`, `burst` and
//!   `slices` inside `rate_limit` say otherwise; see [`RateLimit::limit`].
//!
//! Where tollgate differs, on purpose:
//!
//! - **A field in the wrong place is an error.** envoyproxy/ratelimit rejects a field name it does
//!   not know anywhere in the file, but ignores a known one out of place (`unit` beside `key`);
//!   tollgate rejects both. `unit` with `unlimited: true` is an error whatever its text
//!   (envoyproxy/ratelimit: only a valid unit).
//! - **Keys are compared as keys.** envoyproxy/ratelimit joins `key_value` into one string before
//!   looking it up, so `{key: a_b}` and `{key: a, value: b}` collide, and a `*` in a key makes a
//!   pattern; tollgate compares the key exactly and only the value as a pattern.
//! - **`unit: year`** (365 days) is refused when `requests_per_unit > 0`: tollgate keeps no state
//!   longer than 50 days. So is a second of more than 10^9 requests (one per nanosecond).
//! - **A request's `limit` override** is counted under the same state key as the configured limit
//!   would be, but its metric key is the domain and the entries' keys only (envoyproxy/ratelimit
//!   writes the request's values too, a metric per value).
//! - **Domains are not merged**: one domain in two files is an error naming both (as
//!   envoyproxy/ratelimit without `MERGE_DOMAIN_CONFIG`).
//! - **YAML**: strings are taken as written (`value: 0123` is `0123`) and booleans accept YAML 1.1's
//!   `yes`/`no`/`on`/`off`, as envoyproxy/ratelimit's parser does; numbers are YAML 1.2's
//!   (`1_000` is not a number). A file holds one document.
//!
//! Everything a configuration can make big is bounded: [`MAX_FILE_BYTES`], [`MAX_FILES`],
//! [`MAX_DEPTH`], [`MAX_DESCRIPTORS`], [`MAX_WILDCARDS`], [`MAX_TEXT_BYTES`], [`MAX_REPLACES`]
//! (and the YAML parser's own nesting and alias-expansion limits).

mod error;
mod limit;
mod load;
mod tree;
mod yaml;

use std::collections::{HashMap, HashSet};
use std::path::Path;

pub use error::ConfigError;
pub use limit::{DEFAULT_ALGORITHM, RateLimit, Unit, limit_for};

/// The largest configuration file read, in bytes.
pub const MAX_FILE_BYTES: u64 = 16 << 20;
/// The most `*.yaml` / `*.yml` files read from one directory.
pub const MAX_FILES: usize = 1_000;
/// The deepest nesting of descriptors (a request descriptor can match at most this many entries).
pub const MAX_DEPTH: usize = 32;
/// The most descriptors in one domain, at all levels.
pub const MAX_DESCRIPTORS: usize = 100_000;
/// The most wildcard values for one key at one level (each is tried in turn for a request entry).
pub const MAX_WILDCARDS: usize = 1_000;
/// The longest `key`, `value`, `name` or replaced name, in bytes.
pub const MAX_TEXT_BYTES: usize = 4_096;
/// The most names in one `replaces`.
pub const MAX_REPLACES: usize = 64;

/// All loaded domains.
#[derive(Debug, Default)]
pub struct Config {
    domains: HashMap<String, Domain>,
}

#[derive(Debug)]
struct Domain {
    origin: String,
    root: tree::Node,
}

/// A descriptor's matched limit.
#[derive(Debug, Clone, PartialEq)]
pub struct Matched<'a> {
    /// The configured limit (or the request's override).
    pub limit: &'a RateLimit,
    /// The state key: the domain, then each entry's key and value as sent (a `share_threshold`
    /// wildcard's pattern instead of its value), each as `LEN:VALUE`. Unambiguous: two different
    /// descriptors of one domain never share a key, nor do two domains.
    pub key: Vec<u8>,
    /// The metric label: the config path (`domain.key_value.key`), as envoyproxy/ratelimit's
    /// stats key; request values only under `detailed_metric` or `value_to_metric`.
    pub metric_key: String,
}

impl Config {
    /// One YAML document's text; `origin` names it in errors (a file path).
    pub fn parse(yaml: &str, origin: &str) -> Result<Config, ConfigError> {
        let raw = yaml::parse(yaml, origin)?;
        let domain = raw.domain.unwrap_or_default();
        if domain.is_empty() {
            return Err(ConfigError::new(origin, "", "`domain` is missing or empty"));
        }
        if domain.len() > MAX_TEXT_BYTES {
            return Err(ConfigError::new(origin, "", format!("`domain` is longer than {MAX_TEXT_BYTES} bytes")));
        }
        let root = tree::Builder::new(origin, &domain).root(raw.descriptors.unwrap_or_default())?;
        let mut domains = HashMap::new();
        domains.insert(domain, Domain { origin: origin.to_owned(), root });
        Ok(Config { domains })
    }

    /// A YAML file, or a directory of `*.yaml` / `*.yml` files (not recursive; sorted by name;
    /// hidden files skipped), one domain each; a domain defined twice is an error naming both
    /// files, and so is a directory without any.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        load::load(path)
    }

    /// Adds `other`'s domains; a domain both define is an error naming both origins.
    pub fn merge(&mut self, other: Config) -> Result<(), ConfigError> {
        for (name, domain) in &other.domains {
            if let Some(first) = self.domains.get(name) {
                return Err(ConfigError::new(
                    &domain.origin,
                    name.as_str(),
                    format!("domain {name:?} is already defined in {}", first.origin),
                ));
            }
        }
        self.domains.extend(other.domains);
        Ok(())
    }

    /// Whether `domain` is configured.
    #[must_use]
    pub fn has_domain(&self, domain: &str) -> bool {
        self.domains.contains_key(domain)
    }

    /// The configured domains, in no particular order.
    pub fn domains(&self) -> impl Iterator<Item = &str> {
        self.domains.keys().map(String::as_str)
    }

    /// Where `domain` was defined (its file), if it is.
    #[must_use]
    pub fn origin(&self, domain: &str) -> Option<&str> {
        self.domains.get(domain).map(|d| d.origin.as_str())
    }

    /// The limits for one request's descriptors, in order: `None` for a descriptor that matches
    /// no limit (or whose limit is replaced by another descriptor's, see `replaces`).
    #[must_use]
    pub fn limits_for(&self, domain: &str, descriptors: &[&[(&str, &str)]]) -> Vec<Option<Matched<'_>>> {
        self.limits_for_request(domain, descriptors, &[])
    }

    /// As [`limits_for`](Self::limits_for), for a request some of whose descriptors carry a
    /// `limit` override: `overrides[i]` (built with [`RateLimit::from_override`]) is descriptor
    /// `i`'s limit instead of the configured one, which is then neither looked up nor counted for
    /// `replaces`, as in envoyproxy/ratelimit. An override applies only in a configured domain.
    /// `overrides` may be shorter than `descriptors` (the rest have none).
    #[must_use]
    pub fn limits_for_request<'a>(
        &'a self,
        domain: &str,
        descriptors: &[&[(&str, &str)]],
        overrides: &[Option<&'a RateLimit>],
    ) -> Vec<Option<Matched<'a>>> {
        let Some(configured) = self.domains.get(domain) else {
            return descriptors.iter().map(|_| None).collect();
        };
        let mut matched: Vec<Option<Matched<'a>>> = descriptors
            .iter()
            .enumerate()
            .map(|(i, entries)| match overrides.get(i).copied().flatten() {
                Some(limit) => {
                    Some(Matched { limit, key: state_key(domain, entries), metric_key: keys_only(domain, entries) })
                }
                None => configured.root.find(domain, entries).map(|f| Matched {
                    limit: f.limit,
                    key: f.key,
                    metric_key: f.metric_key,
                }),
            })
            .collect();
        let replaced: HashSet<&'a str> = matched
            .iter()
            .flatten()
            .flat_map(|m| {
                let limit: &'a RateLimit = m.limit;
                limit.replaces.iter().map(String::as_str)
            })
            .collect();
        if !replaced.is_empty() {
            for slot in &mut matched {
                let drop = slot.as_ref().is_some_and(|m| {
                    !m.limit.unlimited && m.limit.name.as_deref().is_some_and(|n| replaced.contains(n))
                });
                if drop {
                    *slot = None;
                }
            }
        }
        matched
    }
}

/// The state key of `entries` in `domain`, every value as sent: what a request's `limit`
/// override counts under (the same key a configured limit without `share_threshold` uses).
#[must_use]
pub fn state_key(domain: &str, entries: &[(&str, &str)]) -> Vec<u8> {
    let mut key = Vec::new();
    tree::frame(&mut key, domain.as_bytes());
    for (k, v) in entries {
        tree::frame(&mut key, k.as_bytes());
        tree::frame(&mut key, v.as_bytes());
    }
    key
}

/// `domain.key1.key2`: an override's metric key, without the request's values.
fn keys_only(domain: &str, entries: &[(&str, &str)]) -> String {
    let mut out = domain.to_owned();
    for (k, _) in entries {
        out.push('.');
        out.push_str(k);
    }
    out
}
