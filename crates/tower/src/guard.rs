//! The decision logic of the middleware, apart from tower's plumbing: mitigations in force,
//! counting before the request (all-or-nothing across rules), counting after the response (rules
//! with `count_status`), blocks for mitigation timeouts, dry-run and delay.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use axum_core::body::Body;
use http::Response;
use tollgate_core::{Clock, Decision, Limit, SystemClock};
use tollgate_rules::{Action, Request, Rule, Rules};
use tollgate_store::{Check, Store};

use crate::response;

/// What the middleware writes besides decisions.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    /// Also put the `RateLimit` fields on allowed responses.
    pub headers_on_allowed: bool,
    /// Also write the legacy `X-RateLimit-Limit/Remaining/Reset` headers.
    pub legacy_headers: bool,
}

/// The request data the rules need, owned (the request itself goes on to the service).
#[derive(Debug)]
pub(crate) struct Owned {
    pub(crate) method: http::Method,
    /// Cloning a `Uri` shares its bytes: path and query come from it without copying.
    pub(crate) uri: http::Uri,
    pub(crate) host: String,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) client_ip: IpAddr,
}

/// A rule to count once the response status is known.
pub(crate) struct After {
    rule: usize,
    key: String,
    cost: u64,
}

/// What to do with a request.
pub(crate) enum Verdict {
    /// Answer this; the service is not called.
    Respond(Response<Body>),
    /// Call the service (after `delay_ns`), then count `after`; `fields` for the RateLimit headers.
    Proceed { delay_ns: u64, fields: Option<(String, Limit, Decision)>, after: Vec<After> },
}

/// State shared by every clone of the service.
pub(crate) struct Guard<S> {
    pub(crate) rules: Rules,
    pub(crate) store: S,
    pub(crate) options: Options,
    clock: SystemClock,
    /// Keys under mitigation until an instant (ns since the epoch).
    blocks: Mutex<HashMap<String, u64>>,
    dry_run_hits: AtomicU64,
    pub(crate) stats: Stats,
    /// The headers the rules read (lowercase); the others are not copied.
    pub(crate) header_names: Vec<String>,
    /// Whether any rule looks at the host.
    pub(crate) uses_host: bool,
    /// Whether any key was ever blocked: until then, no mitigation lookups are needed.
    any_block: std::sync::atomic::AtomicBool,
}

const MAX_BLOCKS: usize = 100_000;

impl<S: Store> Guard<S> {
    pub(crate) fn new(rules: Rules, store: S, options: Options) -> Self {
        let stats = Stats::new(rules.rules.len());
        let header_names = rules.header_names();
        let uses_host = rules.uses_host();
        Guard {
            header_names,
            uses_host,
            any_block: std::sync::atomic::AtomicBool::new(false),
            rules,
            store,
            options,
            clock: SystemClock::new(),
            blocks: Mutex::default(),
            dry_run_hits: AtomicU64::new(0),
            stats,
        }
    }

    pub(crate) fn dry_run_hits(&self) -> u64 {
        self.dry_run_hits.load(Ordering::Relaxed)
    }

    fn blocked_until(&self, key: &str) -> Option<u64> {
        let blocks = self.blocks.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        blocks.get(key).copied()
    }

    fn block(&self, key: &str, until: u64) {
        let mut blocks = self.blocks.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if blocks.len() >= MAX_BLOCKS {
            let now = self.clock.now_ns();
            blocks.retain(|_, &mut until| until > now);
        }
        self.any_block.store(true, Ordering::Release);
        let entry = blocks.entry(key.to_string()).or_insert(0);
        *entry = (*entry).max(until);
    }

    fn index(&self, rule: &Rule) -> usize {
        self.rules.rules.iter().position(|r| std::ptr::eq(r, rule)).unwrap_or(0)
    }

    fn dry_run(&self, rule: &Rule, key: &str) {
        self.dry_run_hits.fetch_add(1, Ordering::Relaxed);
        self.stats.bump(self.index(rule), "dry_run");
        tracing::warn!(rule = %rule.name, key, "dry-run: this request is over the limit and would be mitigated");
    }

    /// Records that `key` went over under `rule`: mitigate it until the timeout (or, for rules
    /// counted after the response, until it is back under the limit).
    fn went_over(&self, rule: &Rule, key: &str, decision: &Decision, now: u64) {
        let until = now.saturating_add(rule.timeout_ns.max(decision.retry_after_ns));
        // A rule counted after the response has no check before the request: while its key is
        // over, only a block can mitigate it.
        if rule.timeout_ns > 0 || rule.count_status.is_some() {
            self.block(key, until);
        }
    }

    fn mitigate(&self, rule: &Rule, decision: &Decision) -> Response<Body> {
        let outcome = if matches!(rule.action, Action::ShadowBan { .. }) { "shadow_banned" } else { "rejected" };
        self.stats.bump(self.index(rule), outcome);
        match &rule.action {
            Action::ShadowBan { status, body, content_type } => response::shadow(*status, body, content_type),
            _ => response::too_many_requests(&rule.name, &rule.limit, decision, self.options.legacy_headers),
        }
    }

    pub(crate) async fn admit(&self, owned: &Owned) -> Verdict {
        let headers: Vec<(&str, &str)> = owned.headers.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
        let request = Request {
            method: owned.method.as_str(),
            path: owned.uri.path(),
            query: owned.uri.query().unwrap_or(""),
            host: &owned.host,
            headers: &headers,
            client_ip: owned.client_ip,
        };
        let now = self.clock.now_ns();

        // 1. Mitigations in force (timeouts set earlier).
        let mitigating =
            if self.any_block.load(Ordering::Acquire) { self.rules.mitigating(&request) } else { Vec::new() };
        for applied in mitigating {
            let Some(until) = self.blocked_until(&applied.key).filter(|&until| until > now) else { continue };
            let rule = applied.rule;
            if rule.action == Action::DryRun {
                self.dry_run(rule, &applied.key);
                continue;
            }
            let wait = until - now;
            let decision = Decision {
                allowed: false,
                limit: rule.limit.capacity(),
                remaining: 0,
                retry_after_ns: wait,
                reset_after_ns: wait,
            };
            return Verdict::Respond(self.mitigate(rule, &decision));
        }

        // 2. Counting before the request.
        let counted = match self.rules.counting(&request) {
            Ok(counted) => counted,
            Err(e) => {
                let mut response = Response::new(Body::from(
                    serde_json::json!({"title": "Bad Request", "status": 400, "detail": e.to_string()}).to_string(),
                ));
                *response.status_mut() = http::StatusCode::BAD_REQUEST;
                response
                    .headers_mut()
                    .insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/problem+json"));
                return Verdict::Respond(response);
            }
        };
        let mut after = Vec::new();
        let mut enforce = Vec::new();
        for applied in counted {
            let index = self.rules.rules.iter().position(|r| std::ptr::eq(r, applied.rule)).unwrap_or(0);
            if applied.rule.count_status.is_some() {
                after.push(After { rule: index, key: applied.key, cost: applied.cost });
            } else if applied.rule.action == Action::DryRun {
                match self.store.check(applied.key.as_bytes(), &applied.rule.limit, applied.cost).await {
                    Ok(d) if !d.allowed => self.dry_run(applied.rule, &applied.key),
                    Ok(_) => {}
                    Err(e) => tracing::warn!(rule = %applied.rule.name, error = %e, "store error; not counted"),
                }
            } else {
                enforce.push((applied, shaping_limit(&self.rules.rules[index])));
            }
        }
        if enforce.is_empty() {
            return Verdict::Proceed { delay_ns: 0, fields: None, after };
        }
        let checks: Vec<Check<'_>> =
            enforce.iter().map(|(a, limit)| Check::new(a.key.as_bytes(), limit, a.cost)).collect();
        let decisions = match self.store.check_all(&checks).await {
            Ok(decisions) => decisions,
            Err(e) => {
                // The store's own failure policy (Fallback) has already spoken; an error here is
                // a bad request or a bad key: let the request through and say so.
                tracing::warn!(error = %e, "rate-limit check failed; request let through");
                return Verdict::Proceed { delay_ns: 0, fields: None, after };
            }
        };
        if let Some(i) = decisions.iter().position(|d| !d.allowed) {
            let (applied, _) = &enforce[i];
            self.went_over(applied.rule, &applied.key, &decisions[i], now);
            return Verdict::Respond(self.mitigate(applied.rule, &decisions[i]));
        }
        let mut delay_ns = 0;
        for ((applied, _), decision) in enforce.iter().zip(&decisions) {
            let wait = match applied.rule.action {
                Action::Delay { .. } => decision.reset_after_ns.saturating_sub(applied.rule.limit.tolerance_ns()),
                _ => 0,
            };
            self.stats.bump(self.index(applied.rule), if wait > 0 { "delayed" } else { "allowed" });
            delay_ns = delay_ns.max(wait);
        }
        let fields = enforce
            .iter()
            .zip(&decisions)
            .min_by_key(|(_, d)| d.remaining)
            .map(|((a, _), d)| (a.rule.name.clone(), a.rule.limit.clone(), *d));
        Verdict::Proceed { delay_ns, fields, after }
    }

    /// Counts the rules that depend on the response's `status`.
    pub(crate) async fn after(&self, after: Vec<After>, status: u16) {
        for After { rule, key, cost } in after {
            let rule = &self.rules.rules[rule];
            if !rule.counts_status(status) {
                continue;
            }
            self.stats.bump(rule_index_of(&self.rules, rule), "counted_after");
            match self.store.check(key.as_bytes(), &rule.limit, cost).await {
                Ok(d) if !d.allowed => {
                    if rule.action == Action::DryRun {
                        self.dry_run(rule, &key);
                    } else {
                        self.went_over(rule, &key, &d, self.clock.now_ns());
                    }
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(rule = %rule.name, error = %e, "store error; response not counted"),
            }
        }
    }
}

fn rule_index_of(rules: &Rules, rule: &Rule) -> usize {
    rules.rules.iter().position(|r| std::ptr::eq(r, rule)).unwrap_or(0)
}

/// The limit a rule is checked under: for `delay`, the bucket widened by `max_delay` (a shaper is
/// GCRA with tolerance `burst*T + max_delay`), so that a request within the delay is admitted and
/// then waits for its slot.
fn shaping_limit(rule: &Rule) -> Limit {
    match rule.action {
        Action::Delay { max_delay_ns } => {
            let extra = max_delay_ns / rule.limit.emission_interval_ns();
            rule.limit
                .to_builder()
                .burst(rule.limit.burst().saturating_add(extra))
                .build()
                .unwrap_or_else(|_| rule.limit.clone())
        }
        _ => rule.limit.clone(),
    }
}

/// Requests per rule and outcome, for the metrics endpoint.
#[derive(Debug)]
pub(crate) struct Stats {
    counts: Vec<[AtomicU64; OUTCOMES.len()]>,
}

/// The outcomes counted per rule.
pub(crate) const OUTCOMES: [&str; 6] = ["allowed", "rejected", "shadow_banned", "dry_run", "delayed", "counted_after"];

impl Stats {
    pub(crate) fn new(rules: usize) -> Self {
        Stats { counts: (0..rules).map(|_| std::array::from_fn(|_| AtomicU64::new(0))).collect() }
    }

    pub(crate) fn bump(&self, rule: usize, outcome: &str) {
        if let (Some(counts), Some(i)) = (self.counts.get(rule), OUTCOMES.iter().position(|o| *o == outcome)) {
            counts[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Prometheus text format.
    pub(crate) fn render(&self, rules: &Rules) -> String {
        let mut text = String::from(
            "# HELP tollgate_rule_requests Requests per rule and outcome.\n# TYPE tollgate_rule_requests counter\n",
        );
        for (rule, counts) in rules.rules.iter().zip(&self.counts) {
            let name = rule.name.replace(['"', '\\', '\n'], "_");
            for (outcome, count) in OUTCOMES.iter().zip(counts) {
                text.push_str(&format!(
                    "tollgate_rule_requests_total{{rule=\"{name}\",outcome=\"{outcome}\"}} {}\n",
                    count.load(Ordering::Relaxed)
                ));
            }
        }
        text
    }
}
