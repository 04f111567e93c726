//! The rules file's TOML, parsed and validated into [`Rules`] (the format is described in
//! `rules`): every refusal names the file, the rule and the reason, with a hint for the usual
//! TOML mistakes.

use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;
use tollgate_core::{Algorithm, LimitSpec, parse_period_ns};

use crate::asn::AsnDb;
use crate::ip::{Cidr, ForwardingHeader, TrustedProxies};
use crate::matcher::Match;
use crate::rules::{
    Action, ActionKind, Characteristic, Cost, DEFAULT_IPV6_PREFIX, DEFAULT_RATE_HALF_LIFE_NS, FingerprintHeaders,
    OnBadCost, OnError, OnMissing, PathMatch, Rule, Rules, RulesError, check_name,
};
use crate::usage::{RequestField, ResponseCost};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    trusted_proxies: Vec<String>,
    client_ip_header: Option<String>,
    on_error: Option<String>,
    asn_db: Option<String>,
    ja3_header: Option<String>,
    ja4_header: Option<String>,
    ipv6_prefix: Option<u8>,
    #[serde(default)]
    rules: Vec<RuleEntry>,
    #[serde(default)]
    limits: std::collections::BTreeMap<String, LimitSpec>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleEntry {
    name: String,
    // A LimitSpec's fields (serde cannot flatten it into a table that refuses unknown fields).
    limit: String,
    algorithm: Option<Algorithm>,
    burst: Option<u64>,
    slices: Option<u64>,
    tz: Option<String>,
    #[serde(default)]
    key: Vec<String>,
    cost: Option<CostEntry>,
    estimate: Option<CostEntry>,
    estimate_default: Option<u64>,
    cost_header: Option<String>,
    on_bad_cost: Option<String>,
    on_missing: Option<String>,
    ipv6_prefix: Option<u8>,
    count_status: Option<Vec<u16>>,
    rate_half_life: Option<String>,
    when_rate_above: Option<String>,
    path_match: Option<String>,
    #[serde(default, rename = "match")]
    matcher: Match,
    mitigation: Option<MitigationEntry>,
}

/// `cost = 3`, or `cost = "response.usage.FIELD"` (see `usage`); `estimate` likewise.
#[derive(Deserialize)]
#[serde(
    untagged,
    expecting = "a positive integer, or a string such as \"response.usage.total_tokens\" (cost) or \"request.json.max_tokens\" (estimate)"
)]
enum CostEntry {
    Fixed(u64),
    Source(String),
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct MitigationEntry {
    action: Option<String>,
    #[serde(rename = "match")]
    matcher: Option<Match>,
    timeout: Option<String>,
    max_delay: Option<String>,
    status: Option<u16>,
    body: Option<String>,
    content_type: Option<String>,
    upstream: Option<String>,
}

/// The parser's message, with a hint for a common mistake.
fn with_hint(error: &toml::de::Error, text: &str) -> String {
    let message = error.to_string();
    match hint(error, text) {
        "" => message,
        hint => format!("{}\n{hint}", message.trim_end()),
    }
}

/// A hint for the TOML mistakes that the parser reports only in serde's terms.
fn hint(error: &toml::de::Error, text: &str) -> &'static str {
    let message = error.message();
    let has_line = |wanted: &str| text.lines().any(|line| line.split('#').next().unwrap_or("").trim() == wanted);
    if message.contains("expected a sequence") && has_line("[rules]") {
        "hint: each rule is a [[rules]] table (double brackets: one per rule), not [rules]"
    } else if message.contains("invalid type") && text.lines().any(|l| l.trim().starts_with("[[limits")) {
        "hint: a named limit is a [limits.NAME] table (single brackets), not [[limits.NAME]]"
    } else if message.contains("expected a sequence") && has_line("[rules.mitigation]") {
        "hint: [rules.mitigation] belongs after the [[rules]] table it mitigates"
    } else {
        ""
    }
}

impl Rules {
    /// Loads a rules file.
    pub fn load(path: &Path) -> Result<Rules, RulesError> {
        let origin = path.display().to_string();
        let text =
            std::fs::read_to_string(path).map_err(|e| RulesError { origin: origin.clone(), what: e.to_string() })?;
        parse(&text, &origin, path.parent().unwrap_or(Path::new("")))
    }

    /// Parses rules from TOML text; `origin` names it in errors. A relative `asn_db` is read from
    /// the current directory.
    pub fn parse(text: &str, origin: &str) -> Result<Rules, RulesError> {
        parse(text, origin, Path::new(""))
    }
}

/// Parses and validates rules from TOML text (`origin` names it in errors), reading a relative
/// `asn_db` from `dir`.
fn parse(text: &str, origin: &str, dir: &Path) -> Result<Rules, RulesError> {
    let fail = |what: String| RulesError { origin: origin.to_string(), what };
    let file: File = toml::from_str(text).map_err(|e| fail(with_hint(&e, text)))?;
    let trusted = file
        .trusted_proxies
        .iter()
        .map(|t| t.parse::<Cidr>().map_err(|e| fail(format!("trusted_proxies: {e}"))))
        .collect::<Result<Vec<_>, _>>()?;
    // A header name, in any case.
    let header: ForwardingHeader = word(file.client_ip_header.map(|h| h.to_ascii_lowercase())).map_err(&fail)?;
    let on_error: OnError = word(file.on_error).map_err(&fail)?;
    let mut rules: Vec<Rule> = Vec::new();
    let mut add = |rule: Result<Rule, String>, name: &str| -> Result<(), RulesError> {
        let rule = rule.map_err(|e| fail(format!("rule {name:?}: {e}")))?;
        if rules.iter().any(|r| r.name == rule.name) {
            return Err(fail(format!("rule {name:?}: the name is used twice")));
        }
        rules.push(rule);
        Ok(())
    };
    let ipv6_prefix = file.ipv6_prefix.map_or(Ok(DEFAULT_IPV6_PREFIX), |p| prefix(p).map_err(&fail))?;
    for entry in file.rules {
        let name = entry.name.clone();
        add(rule(entry, ipv6_prefix), &name)?;
    }
    for (name, entry) in file.limits {
        add(named_limit(&name, &entry), &name)?;
    }
    let keys_on = |wanted: Characteristic| rules.iter().find(|r| r.key.contains(&wanted)).map(|r| r.name.clone());
    let asn_db = match (&file.asn_db, keys_on(Characteristic::Asn)) {
        (Some(db), _) => Some(Arc::new(AsnDb::load(&dir.join(db)).map_err(|e| fail(format!("asn_db: {e}")))?)),
        (None, Some(rule)) => return Err(fail(format!("rule {rule:?}: key asn needs an asn_db = \"FILE\""))),
        (None, None) => None,
    };
    let header_name = |name: &Option<String>, what: &str| match name {
        Some(name) if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') => {
            Err(fail(format!("{what} {name:?}: a header name (letters, digits and '-')")))
        }
        Some(name) if trusted.is_empty() => {
            Err(fail(format!("{what} {name:?}: a header is believed from trusted_proxies only; name them")))
        }
        name => Ok(name.as_ref().map(|n| n.to_ascii_lowercase())),
    };
    let fingerprint_headers = FingerprintHeaders {
        ja3: header_name(&file.ja3_header, "ja3_header")?,
        ja4: header_name(&file.ja4_header, "ja4_header")?,
    };
    Ok(Rules {
        trusted_proxies: TrustedProxies::new(trusted).reading(header),
        on_error,
        rules,
        asn_db,
        fingerprint_headers,
    })
}

/// A configuration word (`on_missing = "skip"`), its default when absent.
fn word<T: Default + std::str::FromStr<Err = tollgate_core::UnknownWord>>(text: Option<String>) -> Result<T, String> {
    text.map_or(Ok(T::default()), |t| t.parse().map_err(|e: tollgate_core::UnknownWord| e.to_string()))
}

fn duration(text: &str, what: &str) -> Result<u64, String> {
    parse_period_ns(text).map_err(|e| format!("{what}: {e}"))
}

fn characteristic(k: &str) -> Result<Characteristic, String> {
    Ok(match k.split_once(':') {
        None if k == "client_ip" => Characteristic::ClientIp,
        None if k == "method" => Characteristic::Method,
        None if k == "path" => Characteristic::Path,
        None if k == "global" => Characteristic::Global,
        None if k == "key" => Characteristic::Key,
        None if k == "ja3" => Characteristic::Ja3,
        None if k == "ja4" => Characteristic::Ja4,
        None if k == "asn" => Characteristic::Asn,
        Some(("header", name)) if !name.is_empty() => Characteristic::Header(name.to_ascii_lowercase()),
        Some(("cookie", name)) if !name.is_empty() => Characteristic::Cookie(name.to_string()),
        Some(("query", name)) if !name.is_empty() => Characteristic::Query(name.to_string()),
        _ => {
            return Err(format!(
                "key {k:?}: use client_ip, method, path, global, key, ja3, ja4, asn, header:NAME, cookie:NAME or query:NAME"
            ));
        }
    })
}

/// What a rule's cost is made of.
struct CostFields<'e> {
    cost: &'e Option<CostEntry>,
    cost_header: &'e Option<String>,
    estimate: &'e Option<CostEntry>,
    estimate_default: Option<u64>,
    count_status: bool,
}

/// A rule's cost, and its `cost` as a number (the least a `cost_header` may say; a response
/// cost's estimate).
fn cost(entry: &CostFields<'_>, capacity: u64) -> Result<(Cost, u64), String> {
    let within = |what: &str, n: u64| {
        if n == 0 || n > capacity {
            Err(format!("{what} {n}: use 1 to the limit's capacity {capacity}"))
        } else {
            Ok(n)
        }
    };
    let (cost, default_cost) = match (entry.cost, entry.cost_header) {
        (Some(CostEntry::Source(text)), header) => {
            let from = ResponseCost::parse(text).unwrap_or_else(|| {
                Err(format!("cost {text:?}: use a number, \"response.usage.FIELD\" or \"response.header.NAME\""))
            })?;
            if header.is_some() {
                return Err("cost_header and a cost read from the response do not combine".into());
            }
            if entry.count_status {
                return Err(format!(
                    "count_status and cost {text:?} do not combine: a cost read from the response settles \
                     every response (one that does not say keeps the estimate)"
                ));
            }
            let (estimate, estimate_from) = match (entry.estimate, entry.estimate_default) {
                (None, _) => {
                    return Err(format!(
                        "cost {text:?} needs an estimate = N (or \"request.json.FIELD\"): what a request reserves \
                         until its response says"
                    ));
                }
                (Some(CostEntry::Fixed(_)), Some(_)) => {
                    return Err("estimate_default applies with an estimate read from the request only".into());
                }
                (Some(CostEntry::Fixed(n)), None) => (within("estimate", *n)?, None),
                (Some(CostEntry::Source(path)), default) => {
                    let field = RequestField::parse(path)
                        .unwrap_or_else(|| Err(format!("estimate {path:?}: use a number or \"request.json.FIELD\"")))?;
                    let Some(default) = default else {
                        return Err(format!(
                            "estimate {path:?} needs an estimate_default = N: what a request that does not give it \
                             reserves"
                        ));
                    };
                    (within("estimate_default", default)?, Some(field))
                }
            };
            (Cost::Response { from, estimate, estimate_from }, estimate)
        }
        (fixed, header) => {
            if entry.estimate.is_some() || entry.estimate_default.is_some() {
                return Err("estimate applies with a cost read from the response only".into());
            }
            let fixed = match fixed {
                Some(CostEntry::Fixed(n)) => within("cost", *n)?,
                _ => 1,
            };
            let cost = match header {
                Some(header) => Cost::Header(header.to_ascii_lowercase()),
                None => Cost::Fixed(fixed),
            };
            (cost, fixed)
        }
    };
    Ok((cost, default_cost))
}

/// An `ipv6_prefix`: 1 to 128 bits.
fn prefix(bits: u8) -> Result<u8, String> {
    if (1..=128).contains(&bits) {
        Ok(bits)
    } else {
        Err(format!("ipv6_prefix {bits}: use 1 to 128 (64: a host's /64 is one client; 128: each address)"))
    }
}

fn rule(entry: RuleEntry, ipv6_prefix: u8) -> Result<Rule, String> {
    check_name(&entry.name)?;
    let ipv6_prefix = entry.ipv6_prefix.map_or(Ok(ipv6_prefix), prefix)?;
    let spec = LimitSpec {
        algorithm: entry.algorithm,
        limit: Some(entry.limit),
        burst: entry.burst,
        slices: entry.slices,
        tz: entry.tz,
    };
    let limit = spec.build().map_err(|e| e.to_string())?;
    let key = entry.key.iter().map(|k| characteristic(k)).collect::<Result<Vec<_>, _>>()?;
    if key.is_empty() {
        return Err("key: name at least one characteristic (\"global\" for one key for everyone)".into());
    }
    let fields = CostFields {
        cost: &entry.cost,
        cost_header: &entry.cost_header,
        estimate: &entry.estimate,
        estimate_default: entry.estimate_default,
        count_status: entry.count_status.is_some(),
    };
    let (cost, default_cost) = cost(&fields, limit.capacity())?;
    let on_missing: OnMissing = word(entry.on_missing)?;
    let on_bad_cost: OnBadCost = word(entry.on_bad_cost.clone())?;
    if entry.on_bad_cost.is_some() && !matches!(cost, Cost::Header(_)) {
        return Err("on_bad_cost applies with cost_header only".into());
    }
    let mitigation = entry.mitigation.unwrap_or_default();
    let action = match word(mitigation.action.clone())? {
        ActionKind::Reject => Action::Reject,
        ActionKind::DryRun => Action::DryRun,
        ActionKind::ShadowBan => Action::ShadowBan {
            status: mitigation.status.unwrap_or(200),
            body: mitigation.body.clone().unwrap_or_default(),
            content_type: mitigation.content_type.clone().unwrap_or_else(|| "text/plain".into()),
        },
        ActionKind::Delay => {
            if !limit.algorithm().is_bucket() {
                return Err("action delay shapes with a bucket: use gcra, token-bucket or leaky-bucket".into());
            }
            let default = limit.tolerance_ns();
            let max_delay_ns = mitigation.max_delay.as_deref().map_or(Ok(default), |t| duration(t, "max_delay"))?;
            // The shaper spans burst × T + max_delay: past the longest period it cannot be built.
            let spans = u128::from(default) + u128::from(max_delay_ns);
            if spans > u128::from(tollgate_core::MAX_PERIOD_NS) {
                let written = mitigation.max_delay.clone().unwrap_or_else(|| "(default: burst × T)".into());
                return Err(format!(
                    "max_delay {written}: burst × T ({}) and max_delay together span {}, past the longest \
                     period a limit may span (50 days); shorten max_delay",
                    tollgate_core::format_period(default),
                    tollgate_core::format_period(u64::try_from(spans).unwrap_or(u64::MAX)),
                ));
            }
            Action::Delay { max_delay_ns }
        }
        ActionKind::Route => match mitigation.upstream.as_deref() {
            Some(upstream) => Action::Route { upstream: route_upstream(upstream)? },
            None => return Err("action route needs upstream = \"http://HOST:PORT\"".into()),
        },
    };
    if mitigation.upstream.is_some() && !matches!(action, Action::Route { .. }) {
        return Err("upstream applies to action route only".into());
    }
    let rate_half_life_ns = match entry.rate_half_life.as_deref() {
        None => DEFAULT_RATE_HALF_LIFE_NS,
        Some(text) => match duration(text, "rate_half_life")? {
            0 => return Err("rate_half_life: use a positive duration, e.g. \"2s\"".into()),
            ns => ns,
        },
    };
    let when_rate_above = entry.when_rate_above.as_deref().map(rate_per_second).transpose()?;
    if let Some(above) = when_rate_above {
        // One request alone reads 2·ln 2 / half-life (see the engine's rates): a threshold at or
        // below it would hold every key over.
        #[allow(clippy::cast_precision_loss)] // a half-life far below 2^53 ns
        let one = 2.0 * std::f64::consts::LN_2 / (rate_half_life_ns as f64 / 1e9);
        if above <= one {
            return Err(format!(
                "when_rate_above {above}/s: one request alone measures {one:.3}/s with rate_half_life {}: \
                 raise it, or lengthen rate_half_life",
                tollgate_core::format_period(rate_half_life_ns)
            ));
        }
        if matches!(action, Action::Delay { .. }) {
            return Err("when_rate_above mitigates at once: it does not combine with action delay".into());
        }
    }
    let measured = entry.rate_half_life.is_some()
        || when_rate_above.is_some()
        || matches!(action, Action::DryRun | Action::Route { .. });
    if mitigation.max_delay.is_some() && !matches!(action, Action::Delay { .. }) {
        return Err("max_delay applies to action delay only".into());
    }
    let timeout_ns = mitigation.timeout.as_deref().map_or(Ok(0), |t| duration(t, "timeout"))?;
    let path_match: PathMatch = word(entry.path_match)?;
    // Patterns in the form the request's path is compared in (see `route`).
    let fold = |matcher: Match| match path_match {
        PathMatch::Routed => matcher.routed(),
        PathMatch::Exact => Ok(matcher),
    };
    let mitigation_matcher = fold(mitigation.matcher.unwrap_or_else(|| entry.matcher.clone()))?;
    Ok(Rule {
        name: entry.name,
        matcher: fold(entry.matcher)?,
        path_match,
        key,
        limit,
        cost,
        default_cost,
        on_missing,
        ipv6_prefix,
        on_bad_cost,
        count_status: entry.count_status,
        action,
        mitigation_matcher,
        timeout_ns,
        rate_half_life_ns,
        measured,
        when_rate_above,
    })
}

/// `COUNT/PERIOD` (`50/s`, `3000/1m`, `0.5/s`) as a rate per second.
fn rate_per_second(text: &str) -> Result<f64, String> {
    let invalid = |why: &str| format!("when_rate_above {text:?}: {why}; write COUNT/PERIOD, e.g. \"50/s\"");
    let (count, period) = text.split_once('/').ok_or_else(|| invalid("no '/'"))?;
    let count: f64 = count.trim().parse().map_err(|_| invalid("the count is not a number"))?;
    let period_ns = parse_period_ns(period).map_err(|e| invalid(&e.to_string()))?;
    if !(count.is_finite() && count > 0.0) || period_ns == 0 {
        return Err(invalid("use a positive count and period"));
    }
    #[allow(clippy::cast_precision_loss)] // a period far beyond 2^53 ns (104 days) loses nothing that matters
    Ok(count / (period_ns as f64 / 1e9))
}

/// A route's upstream: an `http://` URL with a host (the proxy speaks HTTP/1.1 to its upstreams).
fn route_upstream(text: &str) -> Result<String, String> {
    let uri: http::Uri = text.parse().map_err(|e| format!("upstream {text:?}: {e}"))?;
    if uri.scheme_str() != Some("http") || uri.host().is_none() {
        return Err(format!("upstream {text:?}: use an http:// URL with a host, e.g. \"http://127.0.0.1:3001\""));
    }
    Ok(text.trim_end_matches('/').to_string())
}

/// `[limits.NAME]`: a rule keyed on the caller's key, that no HTTP request (which has none) meets.
fn named_limit(name: &str, spec: &LimitSpec) -> Result<Rule, String> {
    check_name(name)?;
    let limit = spec.build().map_err(|e| e.to_string())?;
    Ok(Rule {
        name: name.to_string(),
        matcher: Match::default(),
        path_match: PathMatch::default(),
        key: vec![Characteristic::Key],
        limit,
        cost: Cost::Fixed(1),
        default_cost: 1,
        on_missing: OnMissing::Skip,
        ipv6_prefix: DEFAULT_IPV6_PREFIX,
        on_bad_cost: OnBadCost::Reject,
        count_status: None,
        action: Action::Reject,
        mitigation_matcher: Match::default(),
        timeout_ns: 0,
        rate_half_life_ns: DEFAULT_RATE_HALF_LIFE_NS,
        measured: false,
        when_rate_above: None,
    })
}
