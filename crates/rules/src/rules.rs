//! The rules, as loaded from their file into [`Rules`] (the parsing and validation live in
//! `file`, planning a request against them in `plan`):
//!
//! ```toml
//! trusted_proxies = ["10.0.0.0/8"]      # whose forwarding header to believe
//! client_ip_header = "x-forwarded-for" # the header those proxies write ("forwarded": RFC 7239)
//! on_error = "reject"                  # a store error for a rule: 503 ("allow": let it through)
//! asn_db = "GeoLite2-ASN.mmdb"         # for `asn`: a MaxMind ASN database or an iptoasn TSV
//! ja3_header = "x-ja3"                 # ja3/ja4 as computed by a trusted proxy in front
//! ja4_header = "x-ja4"
//!
//! [[rules]]
//! name = "login-failures"              # letters, digits, _ - . (the state's scope, a metric label)
//! limit = "5/1m"                       # COUNT/PERIOD
//! algorithm = "fixed-window"           # default gcra; burst / slices as for any limit
//! key = ["client_ip"]                  # client_ip, method, path, global, key, header:NAME, cookie:NAME,
//!                                      # query:NAME, ja3, ja4, asn
//! on_missing = "skip"                  # a key part the request lacks: skip | shared | reject
//! count_status = [401]                 # count only these responses (reserved before, refunded after)
//! cost = 1                             # or "response.usage.FIELD" / "response.header.NAME", with
//! estimate = 1000                      # what to reserve until the response settles it (see `usage`),
//!                                      # or "request.json.max_tokens" with estimate_default = N
//! path_match = "routed"                # paths as applications route them (default) | "exact"
//! rate_half_life = "2s"                # measure each key's rate, with this half-life (default 2 s)
//! when_rate_above = "50/s"             # also mitigate while the measured rate is above this
//! match = { method = "POST", path = "/login" }
//! [rules.mitigation]
//! action = "reject"                    # reject | shadow-ban | dry-run | delay | route
//! match = {}                           # which requests are mitigated while over (default: the rule's match)
//! timeout = "60s"                      # keep mitigating this long after the key went over
//! upstream = "http://127.0.0.1:3001"   # action route: where the proxy sends them instead
//!
//! [limits.api]                         # a named limit: a rule keyed on the caller's key
//! limit = "100/1m"                     # (TG.LIMIT api KEY, {"limit_name": "api", "key": ...})
//! burst = 20
//! ```

use std::sync::Arc;

use tollgate_core::Limit;

use crate::asn::AsnDb;
use crate::ip::TrustedProxies;
use crate::matcher::Match;
use crate::usage::{RequestField, ResponseCost};

tollgate_core::words! {
    /// The kinds of [`Action`], as `action = "…"` names them.
    #[derive(Default)]
    pub enum ActionKind: "action" {
        /// [`Action::Reject`] (the default).
        #[default]
        Reject = "reject",
        /// [`Action::ShadowBan`].
        ShadowBan = "shadow-ban",
        /// [`Action::DryRun`].
        DryRun = "dry-run",
        /// [`Action::Delay`].
        Delay = "delay",
        /// [`Action::Route`].
        Route = "route",
    }
}

/// What to do with a request while its key is over the limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Answer 429.
    Reject,
    /// Answer this fake success; the upstream is never called.
    ShadowBan {
        /// Status code (default 200).
        status: u16,
        /// Body (default empty).
        body: String,
        /// Content type of the body (default `text/plain`).
        content_type: String,
    },
    /// Log and count only; never block.
    DryRun,
    /// Wait for the request's slot up to `max_delay_ns`, then proceed; reject beyond it (and
    /// beyond the time the front end gives the request, or when too many requests wait already).
    Delay {
        /// The longest wait.
        max_delay_ns: u64,
    },
    /// Send it to another upstream (a quarantine) instead of rejecting it: honoured by `tollgate
    /// proxy`; a front end that cannot route answers 429.
    Route {
        /// The quarantine's base URL (`http://…`).
        upstream: String,
    },
}

impl Action {
    /// Its kind.
    #[must_use]
    pub fn kind(&self) -> ActionKind {
        match self {
            Action::Reject => ActionKind::Reject,
            Action::ShadowBan { .. } => ActionKind::ShadowBan,
            Action::DryRun => ActionKind::DryRun,
            Action::Delay { .. } => ActionKind::Delay,
            Action::Route { .. } => ActionKind::Route,
        }
    }
}

/// One part of a rule's key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Characteristic {
    /// The client address (after trusted proxies).
    ClientIp,
    /// The method.
    Method,
    /// The path: in the routing form, or as `path_match = "exact"` spells it.
    Path,
    /// Nothing: one key for every request (a global limit).
    Global,
    /// The key the caller names (the server's `TG.LIMIT` and `limit_name`).
    Key,
    /// A header's value.
    Header(String),
    /// A cookie's value.
    Cookie(String),
    /// A query parameter's (decoded) value.
    Query(String),
    /// The JA3 fingerprint of the client's TLS ClientHello (32 hex digits).
    Ja3,
    /// The JA4 fingerprint of the client's TLS ClientHello (`t13d1516h2_…`).
    Ja4,
    /// The autonomous system announcing the client address (from `asn_db`), in decimal.
    Asn,
}

/// The cost of a counted request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cost {
    /// Always this much.
    Fixed(u64),
    /// Taken from this header (an integer from 1 to the limit's capacity): as it is from a
    /// trusted proxy, at least the rule's `cost` from any other peer.
    Header(String),
    /// Known from the response (see [`usage`](crate::usage)): `estimate` is reserved when the
    /// request is admitted, and settled with what `from` reads once the response is in.
    Response {
        /// Where the response says what the request cost.
        from: ResponseCost,
        /// What the request reserves meanwhile (1 to the limit's capacity); with
        /// `estimate_from`, what it reserves when the request does not say.
        estimate: u64,
        /// The field of the request's JSON body the estimate is read from, if any.
        estimate_from: Option<RequestField>,
    },
}

tollgate_core::words! {
    /// What a rule does when the request lacks a part of its key (a header, cookie or query
    /// parameter it keys on, or the caller's key).
    #[derive(Default)]
    pub enum OnMissing: "on_missing" {
        /// The rule does not apply to the request (the default, as Envoy's rate-limit actions do):
        /// pair it with a rule on the client address if lacking the part must not be a way around.
        #[default]
        Skip = "skip",
        /// Every request lacking it shares one key (one client can use it up for all of them).
        Shared = "shared",
        /// The request is answered 400.
        Reject = "reject",
    }
}

tollgate_core::words! {
    /// How a rule compares and keys paths (`path_match`): its `match.path`, `path_prefix` and
    /// `path_glob`, its mitigation's, and its `path` key.
    #[derive(Default)]
    pub enum PathMatch: "path_match" {
        /// Every spelling some common backend routes to the same path is that path (the default;
        /// see [`route`](crate::route)): case, a trailing slash, `%2F`, `\`, `;params`, `//` and
        /// dot segments folded.
        #[default]
        Routed = "routed",
        /// The path as spelled, normalised only as [`normalize::path`](crate::normalize::path)
        /// says (unreserved escapes, `//`, dot segments); patterns compared as written.
        Exact = "exact",
    }
}

tollgate_core::words! {
    /// What a rule does with a `cost_header` that is missing, not an integer, 0 or above the
    /// limit's capacity.
    #[derive(Default)]
    pub enum OnBadCost: "on_bad_cost" {
        /// Answer 400, naming the header and what it must hold (the default).
        #[default]
        Reject = "reject",
        /// Count the rule's `cost` (default 1) instead; above the capacity, the capacity.
        Default = "default",
    }
}

tollgate_core::words! {
    /// What to answer when the store fails for a rule (after its own failure policy): never a
    /// silent admission.
    #[derive(Default)]
    pub enum OnError: "on_error" {
        /// 503 (the default).
        #[default]
        Reject = "reject",
        /// Let the request through, logged and counted.
        Allow = "allow",
    }
}

/// A rule, validated.
#[derive(Debug, Clone)]
pub struct Rule {
    /// Its name (unique): the scope of its state, the policy name in the RateLimit headers, the
    /// metric label.
    pub name: String,
    /// Which requests it counts (its path patterns folded as `path_match` says).
    pub matcher: Match,
    /// How its paths are compared and keyed.
    pub path_match: PathMatch,
    /// What it keys on.
    pub key: Vec<Characteristic>,
    /// Its limit.
    pub limit: Limit,
    /// The cost of a counted request.
    pub cost: Cost,
    /// The rule's `cost`: with a `cost_header`, the least a request from a peer other than a
    /// trusted proxy costs, and the cost when the header cannot be used (see
    /// [`OnBadCost::Default`]).
    pub default_cost: u64,
    /// When the request lacks a key part.
    pub on_missing: OnMissing,
    /// The `client_ip` key of an IPv6 client is its network of this many bits (`ipv6_prefix`,
    /// default 64: a host's /64 is one client; 128: the address).
    pub ipv6_prefix: u8,
    /// When the cost header cannot be used.
    pub on_bad_cost: OnBadCost,
    /// If set, only responses with these statuses are counted (reserved before the request,
    /// refunded after a response with another status).
    pub count_status: Option<Vec<u16>>,
    /// What happens once over.
    pub action: Action,
    /// Which requests are mitigated while over (default: `matcher`).
    pub mitigation_matcher: Match,
    /// How long mitigation lasts after the key went over (0: only while over).
    pub timeout_ns: u64,
    /// The half-life of the rate measured per key (`rate_half_life`, default 2 s).
    pub rate_half_life_ns: u64,
    /// Whether the engine measures the rate of the rule's keys: the rule sets `rate_half_life` or
    /// `when_rate_above`, or its action is dry-run or route (measuring costs a table update per
    /// request: plain rules do without).
    pub measured: bool,
    /// Mitigate a key while its measured rate is above this many per second (`when_rate_above`),
    /// even if its limit is not reached.
    pub when_rate_above: Option<f64>,
}

/// The default `ipv6_prefix`: an IPv6 client is its /64 (a host is usually given a whole /64, and
/// rotates addresses in it for free).
pub const DEFAULT_IPV6_PREFIX: u8 = 64;

/// The default half-life of the measured rate.
pub const DEFAULT_RATE_HALF_LIFE_NS: u64 = 2_000_000_000;

/// Why a rules file is refused, naming the file, the rule and the reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{origin}: {what}")]
pub struct RulesError {
    pub(crate) origin: String,
    pub(crate) what: String,
}

/// A loaded rules file.
#[derive(Debug, Clone, Default)]
pub struct Rules {
    /// Proxies whose forwarding header is believed.
    pub trusted_proxies: TrustedProxies,
    /// What a store error for a rule is answered with.
    pub on_error: OnError,
    /// The rules, in file order (named limits after them, by name).
    pub rules: Vec<Rule>,
    /// The ASN database (`asn_db`), loaded with the rules.
    pub asn_db: Option<Arc<AsnDb>>,
    /// Headers holding the TLS fingerprints a trusted proxy computed (`ja3_header`,
    /// `ja4_header`; lowercase): believed from trusted proxies only.
    pub fingerprint_headers: FingerprintHeaders,
}

/// The headers a trusted proxy in front writes the client's TLS fingerprints in.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FingerprintHeaders {
    /// The JA3 header.
    pub ja3: Option<String>,
    /// The JA4 header.
    pub ja4: Option<String>,
}

/// The scope Envoy's rate-limit service keeps its state under (its descriptors' keys): no rule
/// may be named so, or it would share state with Envoy's limits.
pub const ENVOY_SCOPE: &str = "envoy";

/// A rule's or named limit's name: 1 to 64 letters, digits, `_`, `-` or `.` (it scopes the state,
/// in Redis keys too, and labels metrics), other than a front end's own scope ([`ENVOY_SCOPE`]).
pub fn check_name(name: &str) -> Result<(), String> {
    if name == ENVOY_SCOPE {
        return Err(format!(
            "name {name:?} is reserved: Envoy's rate-limit service keeps its state under it; choose another"
        ));
    }
    let valid = !name.is_empty()
        && name.len() <= 64
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if valid { Ok(()) } else { Err(format!("name {name:?}: use 1 to 64 letters, digits, '_', '-' or '.'")) }
}

impl Rules {
    /// The (lowercase) names of the headers the rules read, the forwarding header included:
    /// callers need not copy the others.
    #[must_use]
    pub fn header_names(&self) -> Vec<String> {
        let mut names: Vec<String> = Vec::new();
        let mut add = |name: &str| {
            let name = name.to_ascii_lowercase();
            if !names.contains(&name) {
                names.push(name);
            }
        };
        if self.trusted_proxies.any() {
            add(self.trusted_proxies.header().as_str());
            for name in [&self.fingerprint_headers.ja3, &self.fingerprint_headers.ja4].into_iter().flatten() {
                add(name);
            }
        }
        for rule in &self.rules {
            for matcher in [&rule.matcher, &rule.mitigation_matcher] {
                if matcher.method.is_some() || matcher.method_exact.is_some() {
                    let overrides = crate::canonical::OVERRIDE_HEADER_SPELLINGS.iter();
                    overrides.chain(&crate::canonical::BODY_HEADERS).for_each(|name| add(name));
                }
                if let Some(h) = &matcher.header {
                    add(h);
                }
                if let Some(h) = &matcher.header_equals {
                    add(&h.name);
                }
                if let Some(h) = &matcher.header_regex {
                    add(&h.name);
                }
            }
            for part in &rule.key {
                match part {
                    Characteristic::Header(h) => add(h),
                    Characteristic::Cookie(_) => add("cookie"),
                    _ => {}
                }
            }
            if let Cost::Header(h) = &rule.cost {
                add(h);
            }
        }
        names
    }

    /// The fields of the request's JSON body the rules' estimates are read from, each once: a
    /// front end reads them (see [`RequestField::pseudo_header`]); none, it need not read bodies.
    #[must_use]
    pub fn request_fields(&self) -> Vec<RequestField> {
        let mut fields: Vec<RequestField> = Vec::new();
        for rule in &self.rules {
            if let Cost::Response { estimate_from: Some(field), .. } = &rule.cost
                && !fields.contains(field)
            {
                fields.push(field.clone());
            }
        }
        fields
    }

    /// Whether any rule matches on the host (callers need not extract it otherwise).
    #[must_use]
    pub fn uses_host(&self) -> bool {
        let on_host = |m: &Match| m.host.is_some() || m.host_regex.is_some();
        self.rules.iter().any(|r| on_host(&r.matcher) || on_host(&r.mitigation_matcher))
    }

    /// The rule named `name`, and its index.
    #[must_use]
    pub fn named(&self, name: &str) -> Option<(usize, &Rule)> {
        self.rules.iter().enumerate().find(|(_, r)| r.name == name)
    }
}

impl Rule {
    /// Where the rule reads what a request cost from its response, if it does.
    #[must_use]
    pub fn response_cost(&self) -> Option<&ResponseCost> {
        match &self.cost {
            Cost::Response { from, .. } => Some(from),
            _ => None,
        }
    }

    /// Whether what the rule reserves is settled after the response: it counts statuses, or its
    /// cost is read from the response.
    #[must_use]
    pub fn settles_after(&self) -> bool {
        self.count_status.is_some() || self.response_cost().is_some()
    }

    /// Whether a response with `status` counts under this rule.
    #[must_use]
    pub fn counts_status(&self, status: u16) -> bool {
        self.count_status.as_ref().is_none_or(|statuses| statuses.contains(&status))
    }

    /// The limit a `delay` rule checks a request under when the request may wait up to `wait_ns`
    /// for its slot: a GCRA of the rule's rate, its burst widened by the slots that fit in the
    /// wait (a shaper admits what it can schedule within the wait; the request then waits for its
    /// slot). Every width shares one state, whatever the rule's bucket algorithm (the bucket
    /// family decides alike): a request that may wait less (its time is short, too many wait
    /// already) is checked against the same schedule, only narrower, and one refused charges
    /// nothing. `None` if the widened bucket would span more than the longest period a limit
    /// may have (50 days).
    #[must_use]
    pub fn shaper(&self, wait_ns: u64) -> Option<Limit> {
        let extra = wait_ns / self.limit.emission_interval_ns();
        let burst = self.limit.burst().checked_add(extra)?;
        self.limit.to_builder().algorithm(tollgate_core::Algorithm::Gcra).burst(burst).build().ok()
    }

    /// Whether the rule is keyed on the caller's key alone (usable by `TG.LIMIT` and `limit_name`).
    #[must_use]
    pub fn keyed_on_callers_key(&self) -> bool {
        self.key == [Characteristic::Key]
    }
}
