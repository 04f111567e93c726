//! The engine's Prometheus metrics, one implementation for every front end (the server, the
//! middleware, the proxy):
//!
//! - `tollgate_rule_decisions_total{rule, outcome}`: requests per rule by what happened
//!   (`allowed`, `rejected`, `shadow_banned`, `dry_run`, `delayed`, `counted`, `refunded`,
//!   `bad_request`, `error`);
//! - `tollgate_decisions_total{outcome, algorithm, limit}`: ad-hoc limits (`CL.THROTTLE`,
//!   `TG.CHECK`, HTTP inline limits; `limit` names the front end);
//! - `tollgate_store_errors_total{kind}` (a front end times its own store, if it is remote);
//! - `tollgate_config_reloads_total{result}`, `tollgate_blocked_keys`.
//!
//! Labels are rule names, outcomes and algorithms from the configuration and the code: never a
//! value a client chose. A series appears when it first has a value; the counters a request
//! needs are resolved once per rule, so the hot path only increments atomics.

use std::sync::OnceLock;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tollgate_core::Algorithm;
use tollgate_store::StoreError;

/// What happened to a request under one rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Admitted.
    Allowed,
    /// Answered 429.
    Rejected,
    /// Answered the rule's fake success.
    ShadowBanned,
    /// Over the limit under a dry-run rule: let through, logged.
    DryRun,
    /// Admitted after a wait (a delay rule).
    Delayed,
    /// Counted after its response (`count_status`).
    Counted,
    /// Its reservation given back after a response the rule does not count.
    Refunded,
    /// Refused by the rule before the store was asked (a bad cost header, a missing key part).
    BadRequest,
    /// The store failed for the rule.
    Error,
}

impl Outcome {
    const ALL: [Outcome; 9] = [
        Outcome::Allowed,
        Outcome::Rejected,
        Outcome::ShadowBanned,
        Outcome::DryRun,
        Outcome::Delayed,
        Outcome::Counted,
        Outcome::Refunded,
        Outcome::BadRequest,
        Outcome::Error,
    ];

    /// The `outcome` label.
    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Allowed => "allowed",
            Outcome::Rejected => "rejected",
            Outcome::ShadowBanned => "shadow_banned",
            Outcome::DryRun => "dry_run",
            Outcome::Delayed => "delayed",
            Outcome::Counted => "counted",
            Outcome::Refunded => "refunded",
            Outcome::BadRequest => "bad_request",
            Outcome::Error => "error",
        }
    }

    fn index(self) -> usize {
        Outcome::ALL.iter().position(|&o| o == self).unwrap_or(0)
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RuleLabels {
    rule: String,
    outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AdhocLabels {
    outcome: &'static str,
    algorithm: &'static str,
    limit: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

/// One rule's counters, created on first use.
#[derive(Debug)]
pub(crate) struct RuleCounters {
    rule: String,
    counters: [OnceLock<Counter>; Outcome::ALL.len()],
}

/// Which front end carried an ad-hoc limit (the `limit` label of its decisions).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// `CL.THROTTLE`.
    Throttle,
    /// `TG.CHECK` / `TG.PEEK`.
    Check,
    /// `POST /v1/check` with an inline limit.
    Http,
}

impl Source {
    const ALL: [Source; 3] = [Source::Throttle, Source::Check, Source::Http];

    fn label(self) -> &'static str {
        match self {
            Source::Throttle => "cl.throttle",
            Source::Check => "tg.check",
            Source::Http => "http",
        }
    }
}

/// Every metric of an engine.
#[derive(Debug)]
pub struct Metrics {
    rules: Family<RuleLabels, Counter>,
    adhoc: Family<AdhocLabels, Counter>,
    /// The ad-hoc counters by source, algorithm and outcome, created on first use.
    adhoc_counters: [[[OnceLock<Counter>; 2]; Algorithm::ALL.len()]; Source::ALL.len()],
    store_errors: Family<KindLabels, Counter>,
    reloads: Family<ResultLabels, Counter>,
    pub(crate) blocked: Gauge,
    pub(crate) blocks_dropped: Counter,
}

impl Metrics {
    /// The metrics, registered in `registry` (whose prefix, e.g. `tollgate`, they take).
    pub(crate) fn new(registry: &mut Registry) -> Self {
        let rules = Family::<RuleLabels, Counter>::default();
        registry.register("rule_decisions", "Requests per rule and outcome", rules.clone());
        let adhoc = Family::<AdhocLabels, Counter>::default();
        registry.register("decisions", "Decisions of ad-hoc limits by outcome, algorithm and front end", adhoc.clone());
        let store_errors = Family::<KindLabels, Counter>::default();
        registry.register("store_errors", "Store calls that failed, by kind", store_errors.clone());
        let reloads = Family::<ResultLabels, Counter>::default();
        registry.register("config_reloads", "Rules reloads, by result", reloads.clone());
        let blocked = Gauge::default();
        registry.register("blocked_keys", "Keys under a mitigation timeout", blocked.clone());
        let blocks_dropped = Counter::default();
        registry.register(
            "blocks_dropped",
            "Keys whose mitigation timeout ended early to keep the table bounded",
            blocks_dropped.clone(),
        );
        let adhoc_counters = std::array::from_fn(|_| std::array::from_fn(|_| std::array::from_fn(|_| OnceLock::new())));
        Metrics { rules, adhoc, adhoc_counters, store_errors, reloads, blocked, blocks_dropped }
    }

    pub(crate) fn rule(&self, name: &str) -> RuleCounters {
        RuleCounters { rule: name.to_string(), counters: std::array::from_fn(|_| OnceLock::new()) }
    }

    pub(crate) fn count(&self, rule: &RuleCounters, outcome: Outcome) {
        rule.counters[outcome.index()]
            .get_or_init(|| {
                let labels = RuleLabels { rule: rule.rule.clone(), outcome: outcome.label() };
                // One statement: `get_or_create` returns a guard that must not outlive it.
                self.rules.get_or_create(&labels).clone()
            })
            .inc();
    }

    pub(crate) fn count_adhoc(&self, source: Source, algorithm: Algorithm, allowed: bool) {
        let s = Source::ALL.iter().position(|&x| x == source).unwrap_or(0);
        let a = Algorithm::ALL.iter().position(|&x| x == algorithm).unwrap_or(0);
        self.adhoc_counters[s][a][usize::from(!allowed)]
            .get_or_init(|| {
                let outcome = if allowed { "allowed" } else { "denied" };
                let labels = AdhocLabels { outcome, algorithm: algorithm.name(), limit: source.label() };
                self.adhoc.get_or_create(&labels).clone()
            })
            .inc();
    }

    pub(crate) fn store_error(&self, error: &StoreError) {
        let kind = match error {
            StoreError::Backend(_) => "backend",
            StoreError::Timeout(_) => "timeout",
            StoreError::BadState(_) => "bad_state",
            _ => "request",
        };
        self.store_errors.get_or_create(&KindLabels { kind }).inc();
    }

    pub(crate) fn reloaded(&self, ok: bool) {
        self.reloads.get_or_create(&ResultLabels { result: if ok { "ok" } else { "error" } }).inc();
    }
}
