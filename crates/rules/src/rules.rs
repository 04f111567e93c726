//! The rules file and its evaluation: which rules count a request (under which key and cost) and
//! which rules may mitigate it.
//!
//! ```toml
//! trusted_proxies = ["10.0.0.0/8"]      # whose X-Forwarded-For / Forwarded to believe
//!
//! [[rules]]
//! name = "login-failures"
//! limit = "5/1m"                       # COUNT/PERIOD
//! algorithm = "fixed-window"           # default gcra; burst / slices as for any limit
//! key = ["client_ip"]                  # client_ip, method, path, global, header:NAME, cookie:NAME, query:NAME
//! count_status = [401]                 # count only these responses (counted after the response)
//! match = { method = "POST", path = "/login" }
//! [rules.mitigation]
//! action = "reject"                    # reject | shadow-ban | dry-run | delay
//! match = {}                           # which requests are mitigated while over (default: the rule's match)
//! timeout = "60s"                      # keep mitigating this long after the key went over
//! ```

use std::path::Path;

use serde::Deserialize;
use tollgate_core::{Limit, parse_period_ns};

use crate::Request;
use crate::ip::{Cidr, TrustedProxies};
use crate::matcher::Match;

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
    /// Wait for the request's slot up to `max_delay_ns`, then proceed; reject beyond it.
    Delay {
        /// The longest wait.
        max_delay_ns: u64,
    },
}

/// One part of a rule's key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Characteristic {
    /// The client address (after trusted proxies).
    ClientIp,
    /// The method.
    Method,
    /// The path.
    Path,
    /// Nothing: one key for every request (a global limit).
    Global,
    /// A header's value.
    Header(String),
    /// A cookie's value.
    Cookie(String),
    /// A query parameter's value.
    Query(String),
}

/// The cost of a counted request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cost {
    /// Always this much.
    Fixed(u64),
    /// Taken from this header (a non-negative integer; 1 when absent).
    Header(String),
}

/// A rule, validated.
#[derive(Debug, Clone)]
pub struct Rule {
    /// Its name (unique): the policy name in the RateLimit headers, the metric label.
    pub name: String,
    /// Which requests it counts.
    pub matcher: Match,
    /// What it keys on.
    pub key: Vec<Characteristic>,
    /// Its limit.
    pub limit: Limit,
    /// The cost of a counted request.
    pub cost: Cost,
    /// If set, only responses with these statuses are counted (after the response).
    pub count_status: Option<Vec<u16>>,
    /// What happens once over.
    pub action: Action,
    /// Which requests are mitigated while over (default: `matcher`).
    pub mitigation_matcher: Match,
    /// How long mitigation lasts after the key went over (0: only while over).
    pub timeout_ns: u64,
}

/// A rule that applies to a request, with the request's key and cost under it.
#[derive(Debug, Clone)]
pub struct Applied<'r> {
    /// The rule.
    pub rule: &'r Rule,
    /// The store key: the rule's name and the characteristics' values.
    pub key: String,
    /// The request's cost under the rule.
    pub cost: u64,
}

/// Why a rules file is refused, naming the file, the rule and the reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{origin}: {what}")]
pub struct RulesError {
    origin: String,
    what: String,
}

/// A request the rules cannot evaluate (e.g. a cost header that is not a number).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct RequestError(pub String);

/// A loaded rules file.
#[derive(Debug, Clone, Default)]
pub struct Rules {
    /// Proxies whose forwarding headers are believed.
    pub trusted_proxies: TrustedProxies,
    /// The rules, in file order.
    pub rules: Vec<Rule>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    trusted_proxies: Vec<String>,
    #[serde(default)]
    rules: Vec<RuleEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleEntry {
    name: String,
    limit: String,
    algorithm: Option<String>,
    burst: Option<u64>,
    slices: Option<u64>,
    #[serde(default)]
    key: Vec<String>,
    cost: Option<u64>,
    cost_header: Option<String>,
    count_status: Option<Vec<u16>>,
    #[serde(default, rename = "match")]
    matcher: Match,
    mitigation: Option<MitigationEntry>,
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
}

impl Rules {
    /// Loads a rules file.
    pub fn load(path: &Path) -> Result<Rules, RulesError> {
        let origin = path.display().to_string();
        let text =
            std::fs::read_to_string(path).map_err(|e| RulesError { origin: origin.clone(), what: e.to_string() })?;
        Rules::parse(&text, &origin)
    }

    /// Parses rules from TOML text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Rules, RulesError> {
        let fail = |what: String| RulesError { origin: origin.to_string(), what };
        let file: File = toml::from_str(text).map_err(|e| fail(e.to_string()))?;
        let trusted = file
            .trusted_proxies
            .iter()
            .map(|t| t.parse::<Cidr>().map_err(|e| fail(format!("trusted_proxies: {e}"))))
            .collect::<Result<Vec<_>, _>>()?;
        let mut rules: Vec<Rule> = Vec::new();
        for entry in file.rules {
            let name = entry.name.clone();
            if rules.iter().any(|r| r.name == name) {
                return Err(fail(format!("rule {name:?}: the name is used twice")));
            }
            rules.push(rule(entry).map_err(|e| fail(format!("rule {name:?}: {e}")))?);
        }
        Ok(Rules { trusted_proxies: TrustedProxies::new(trusted), rules })
    }

    /// The (lowercase) names of the headers any rule reads: callers need not copy the others.
    #[must_use]
    pub fn header_names(&self) -> Vec<String> {
        let mut names: Vec<String> = Vec::new();
        let mut add = |name: &str| {
            let name = name.to_ascii_lowercase();
            if !names.contains(&name) {
                names.push(name);
            }
        };
        for rule in &self.rules {
            for matcher in [&rule.matcher, &rule.mitigation_matcher] {
                if let Some(h) = &matcher.header {
                    add(h);
                }
                if let Some(h) = &matcher.header_equals {
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

    /// Whether any rule matches on the host (callers need not extract it otherwise).
    #[must_use]
    pub fn uses_host(&self) -> bool {
        self.rules.iter().any(|r| r.matcher.host.is_some() || r.mitigation_matcher.host.is_some())
    }

    /// The rules that count `request`, with its key and cost under each.
    pub fn counting<'r>(&'r self, request: &Request<'_>) -> Result<Vec<Applied<'r>>, RequestError> {
        self.rules
            .iter()
            .filter(|rule| rule.matcher.matches(request))
            .map(|rule| Ok(Applied { rule, key: rule.key_for(request), cost: rule.cost_for(request)? }))
            .collect()
    }

    /// The rules that would mitigate `request` if its key were over, with its key under each.
    pub fn mitigating<'r>(&'r self, request: &Request<'_>) -> Vec<Applied<'r>> {
        self.rules
            .iter()
            .filter(|rule| rule.mitigation_matcher.matches(request))
            .map(|rule| Applied { rule, key: rule.key_for(request), cost: 0 })
            .collect()
    }
}

impl Rule {
    /// The store key of `request` under this rule: the name and each characteristic's value,
    /// separated by a byte no header can hold.
    #[must_use]
    pub fn key_for(&self, request: &Request<'_>) -> String {
        let mut key = self.name.clone();
        for part in &self.key {
            key.push('\u{1f}');
            match part {
                Characteristic::ClientIp => {
                    use std::fmt::Write as _;
                    let _ = write!(key, "{}", request.client_ip);
                }
                Characteristic::Method => key.push_str(&request.method.to_ascii_uppercase()),
                Characteristic::Path => key.push_str(request.path),
                Characteristic::Global => {}
                Characteristic::Header(name) => key.push_str(request.header(name).unwrap_or("")),
                Characteristic::Cookie(name) => key.push_str(request.cookie(name).unwrap_or("")),
                Characteristic::Query(name) => key.push_str(request.query_param(name).unwrap_or("")),
            }
        }
        key
    }

    /// The cost of `request` under this rule.
    pub fn cost_for(&self, request: &Request<'_>) -> Result<u64, RequestError> {
        match &self.cost {
            Cost::Fixed(cost) => Ok(*cost),
            Cost::Header(name) => match request.header(name) {
                None => Ok(1),
                Some(value) => value
                    .trim()
                    .parse()
                    .map_err(|_| RequestError(format!("header {name} must be a non-negative integer, got {value:?}"))),
            },
        }
    }

    /// Whether a response with `status` counts under this rule.
    #[must_use]
    pub fn counts_status(&self, status: u16) -> bool {
        self.count_status.as_ref().is_none_or(|statuses| statuses.contains(&status))
    }
}

fn duration(text: &str, what: &str) -> Result<u64, String> {
    parse_period_ns(text).map_err(|e| format!("{what}: {e}"))
}

fn rule(entry: RuleEntry) -> Result<Rule, String> {
    let limit = Limit::from_parts(&entry.limit, entry.algorithm.as_deref(), entry.burst, entry.slices)
        .map_err(|e| e.to_string())?;
    let key = entry
        .key
        .iter()
        .map(|k| match k.split_once(':') {
            None if k == "client_ip" => Ok(Characteristic::ClientIp),
            None if k == "method" => Ok(Characteristic::Method),
            None if k == "path" => Ok(Characteristic::Path),
            None if k == "global" => Ok(Characteristic::Global),
            Some(("header", name)) if !name.is_empty() => Ok(Characteristic::Header(name.to_string())),
            Some(("cookie", name)) if !name.is_empty() => Ok(Characteristic::Cookie(name.to_string())),
            Some(("query", name)) if !name.is_empty() => Ok(Characteristic::Query(name.to_string())),
            _ => Err(format!("key {k:?}: use client_ip, method, path, global, header:NAME, cookie:NAME or query:NAME")),
        })
        .collect::<Result<Vec<_>, _>>()?;
    if key.is_empty() {
        return Err("key: name at least one characteristic (\"global\" for one key for everyone)".into());
    }
    let cost = match (entry.cost, entry.cost_header) {
        (Some(_), Some(_)) => return Err("give cost or cost_header, not both".into()),
        (_, Some(header)) => Cost::Header(header),
        (cost, None) => Cost::Fixed(cost.unwrap_or(1)),
    };
    if let Cost::Fixed(c) = cost
        && c > limit.capacity()
    {
        return Err(format!("cost {c} exceeds the limit's capacity {}", limit.capacity()));
    }
    let mitigation = entry.mitigation.unwrap_or_default();
    let action = match mitigation.action.as_deref().unwrap_or("reject") {
        "reject" => Action::Reject,
        "dry-run" => Action::DryRun,
        "shadow-ban" => Action::ShadowBan {
            status: mitigation.status.unwrap_or(200),
            body: mitigation.body.clone().unwrap_or_default(),
            content_type: mitigation.content_type.clone().unwrap_or_else(|| "text/plain".into()),
        },
        "delay" => {
            if !limit.algorithm().is_bucket() {
                return Err("action delay shapes with a bucket: use gcra, token-bucket or leaky-bucket".into());
            }
            let default = limit.tolerance_ns();
            let max_delay_ns = mitigation.max_delay.as_deref().map_or(Ok(default), |t| duration(t, "max_delay"))?;
            Action::Delay { max_delay_ns }
        }
        other => return Err(format!("action {other:?}: use reject, shadow-ban, dry-run or delay")),
    };
    if mitigation.max_delay.is_some() && !matches!(action, Action::Delay { .. }) {
        return Err("max_delay applies to action delay only".into());
    }
    let timeout_ns = mitigation.timeout.as_deref().map_or(Ok(0), |t| duration(t, "timeout"))?;
    let mitigation_matcher = mitigation.matcher.unwrap_or_else(|| entry.matcher.clone());
    Ok(Rule {
        name: entry.name,
        matcher: entry.matcher,
        key,
        limit,
        cost,
        count_status: entry.count_status,
        action,
        mitigation_matcher,
        timeout_ns,
    })
}
