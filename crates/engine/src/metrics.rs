//! The engine's Prometheus metrics, one implementation for every front end (the server, the
//! middleware, the proxy):
//!
//! - `tollgate_rule_decisions_total{rule, outcome}`: requests per rule by what happened
//!   (`allowed`, `rejected`, `shadow_banned`, `dry_run`, `delayed`, `counted`, `refunded`,
//!   `bad_request`, `error`);
//! - `tollgate_decisions_total{outcome, algorithm, limit}`: ad-hoc limits (`CL.THROTTLE`,
//!   `TG.CHECK`, HTTP inline limits; `limit` names the front end);
//! - `tollgate_store_errors_total{kind}`: store calls whose error reached the engine (`backend`,
//!   `timeout`, `bad_state`, `request`), so the request got `on_error`'s answer or an error
//!   reply. A failure the store's own failure policy answered is not one (the server counts
//!   those in `tollgate_store_backend_errors_total`); a front end times its own remote store;
//! - `tollgate_decision_duration_seconds{frontend}`: seconds per decision, by front end
//!   (`resp`, `http`, `grpc`, `middleware`; see [`crate::latency`]);
//! - reservations (reserve → settle): `tollgate_reservations_total{event}`,
//!   `tollgate_reservation_settles_total{estimate}`, `tollgate_reservations_open`,
//!   `tollgate_reservations_expired_total` (see `reservations`);
//! - `tollgate_config_reloads_total{result}`, `tollgate_blocked_keys`,
//!   `tollgate_blocks_dropped_total`;
//! - for an engine with Envoy's configuration ([`EngineBuilder::envoy`](crate::EngineBuilder::envoy)):
//!   `tollgate_envoy_config_reloads_total{result}`, and envoyproxy/ratelimit's per-limit counters
//!   ([`DescriptorMetrics`], in `descriptors`: registered apart, as their names have no prefix).
//!
//! Labels are rule names, outcomes and algorithms from the configuration and the code: never a
//! value a client chose.
//!
//! **Which series exist.** A decision or reload series appears when it first has a value: most
//! (rule, outcome) and (source, algorithm, outcome) pairs never happen (a rule without
//! `shadow_ban` is never `shadow_banned`; `CL.THROTTLE` is always GCRA), and zeros for them would
//! be noise. The store errors are the exception: their zero is what an operator watches and
//! alerts on, so with a remote store (one that does not decide in place) every kind exists from
//! start-up at 0; a store that decides in place (memory) has no backend to fail, and shows a kind
//! only if it ever returns one. A front end's latency series appear with its first decision.
//! The gauges and unlabelled counters are always there.
//!
//! **Cost.** Each counter a decision can touch sits in a `OnceLock`, resolved once per rule and
//! outcome (or source, algorithm and outcome): the family's map is locked the first time only,
//! and every later decision is an atomic load and an atomic increment.

mod descriptors;
mod reservations;

use std::sync::OnceLock;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tollgate_core::Algorithm;
use tollgate_store::StoreError;

pub use descriptors::DescriptorMetrics;
pub(crate) use descriptors::DescriptorOutcome;
pub(crate) use reservations::{Event as ReservationEvent, OpenCollector};

pub use crate::latency::{Frontend, Latency};

/// What happened to a request under one rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Admitted.
    Allowed,
    /// Answered 429.
    Rejected,
    /// Answered the rule's fake success.
    ShadowBanned,
    /// Sent to the rule's quarantine upstream (action `route`).
    Routed,
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
    const ALL: [Outcome; 10] = [
        Outcome::Allowed,
        Outcome::Rejected,
        Outcome::ShadowBanned,
        Outcome::Routed,
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
            Outcome::Routed => "routed",
            Outcome::DryRun => "dry_run",
            Outcome::Delayed => "delayed",
            Outcome::Counted => "counted",
            Outcome::Refunded => "refunded",
            Outcome::BadRequest => "bad_request",
            Outcome::Error => "error",
        }
    }

    /// The position in [`Outcome::ALL`] (the declaration order).
    fn index(self) -> usize {
        self as usize
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

/// The `kind` of a store error: the backend failed, did not answer in time, holds a value
/// tollgate did not write, or the request was invalid for the store (a cost above the capacity,
/// keys in different cluster slots, an unsupported limit).
const STORE_ERROR_KINDS: [&str; 4] = ["backend", "timeout", "bad_state", "request"];

fn store_error_kind(error: &StoreError) -> usize {
    match error {
        StoreError::Backend(_) => 0,
        StoreError::Timeout(_) => 1,
        StoreError::BadState(_) => 2,
        _ => 3,
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FrontendLabels {
    frontend: &'static str,
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

    /// The position in [`Source::ALL`] (the declaration order).
    fn index(self) -> usize {
        self as usize
    }

    fn label(self) -> &'static str {
        match self {
            Source::Throttle => "cl.throttle",
            Source::Check => "tg.check",
            Source::Http => "http",
        }
    }

    /// The front end that carries it.
    pub(crate) fn frontend(self) -> Frontend {
        match self {
            Source::Throttle | Source::Check => Frontend::Resp,
            Source::Http => Frontend::Http,
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
    /// The store error counters by kind: all created at start-up for a remote store.
    store_error_counters: [OnceLock<Counter>; STORE_ERROR_KINDS.len()],
    reloads: Family<ResultLabels, Counter>,
    /// Reloads of Envoy's configuration (registered only for an engine that has one).
    envoy_reloads: Family<ResultLabels, Counter>,
    descriptors: DescriptorMetrics,
    latency: Family<FrontendLabels, Latency>,
    /// The latency histograms by front end, created on first use.
    latency_by_frontend: [OnceLock<Latency>; Frontend::ALL.len()],
    pub(crate) blocked: Gauge,
    pub(crate) blocks_dropped: Counter,
    /// Reservations and their settles (see `reservations`).
    pub(crate) reservations: reservations::ReservationMetrics,
}

impl Metrics {
    /// The metrics, registered in `registry` (whose prefix, e.g. `tollgate`, they take); the
    /// store error kinds exist from the start if the store is `remote`; Envoy's reloads are
    /// registered if the engine has an `envoy` configuration.
    pub(crate) fn new(registry: &mut Registry, remote: bool, envoy: bool) -> Self {
        let rules = Family::<RuleLabels, Counter>::default();
        registry.register("rule_decisions", "Requests per rule and outcome", rules.clone());
        let adhoc = Family::<AdhocLabels, Counter>::default();
        registry.register("decisions", "Decisions of ad-hoc limits by outcome, algorithm and front end", adhoc.clone());
        let store_errors = Family::<KindLabels, Counter>::default();
        registry.register(
            "store_errors",
            "Store errors returned to the caller (on_error answered, or an error reply), by kind; \
             backend failures the failure policy answered are in store_backend_errors instead",
            store_errors.clone(),
        );
        let reloads = Family::<ResultLabels, Counter>::default();
        registry.register("config_reloads", "Rules reloads, by result", reloads.clone());
        let envoy_reloads = Family::<ResultLabels, Counter>::default();
        if envoy {
            registry.register(
                "envoy_config_reloads",
                "Reloads of the Envoy rate-limit configuration, by result",
                envoy_reloads.clone(),
            );
        }
        let latency = Family::<FrontendLabels, Latency>::default();
        registry.register(
            "decision_duration_seconds",
            "Seconds per decision (store call, failure policy and mitigation included), by front end",
            latency.clone(),
        );
        let blocked = Gauge::default();
        registry.register(
            "blocked_keys",
            "Keys a rule's mitigation holds (its timeout, or while over)",
            blocked.clone(),
        );
        let blocks_dropped = Counter::default();
        registry.register(
            "blocks_dropped",
            "Keys whose mitigation hold ended early to keep the table bounded",
            blocks_dropped.clone(),
        );
        let reservations = reservations::ReservationMetrics::new(registry);
        let adhoc_counters = std::array::from_fn(|_| std::array::from_fn(|_| std::array::from_fn(|_| OnceLock::new())));
        let metrics = Metrics {
            rules,
            adhoc,
            adhoc_counters,
            store_errors,
            store_error_counters: std::array::from_fn(|_| OnceLock::new()),
            reloads,
            envoy_reloads,
            descriptors: DescriptorMetrics::default(),
            latency,
            latency_by_frontend: std::array::from_fn(|_| OnceLock::new()),
            blocked,
            blocks_dropped,
            reservations,
        };
        if remote {
            for kind in 0..STORE_ERROR_KINDS.len() {
                metrics.store_error_counter(kind);
            }
        }
        metrics
    }

    fn store_error_counter(&self, kind: usize) -> &Counter {
        self.store_error_counters[kind]
            .get_or_init(|| self.store_errors.get_or_create(&KindLabels { kind: STORE_ERROR_KINDS[kind] }).clone())
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
        let a = Algorithm::ALL.iter().position(|&x| x == algorithm).unwrap_or(0);
        self.adhoc_counters[source.index()][a][usize::from(!allowed)]
            .get_or_init(|| {
                let outcome = if allowed { "allowed" } else { "denied" };
                let labels = AdhocLabels { outcome, algorithm: algorithm.as_str(), limit: source.label() };
                self.adhoc.get_or_create(&labels).clone()
            })
            .inc();
    }

    pub(crate) fn store_error(&self, error: &StoreError) {
        self.store_error_counter(store_error_kind(error)).inc();
    }

    /// Counts a decision `frontend` asked for, which took `elapsed` (see [`crate::Engine::timed`]).
    pub fn observe_decision(&self, frontend: Frontend, elapsed: Duration) {
        self.latency_by_frontend[frontend.index()]
            .get_or_init(|| {
                // One statement: `get_or_create` returns a guard that must not outlive it.
                self.latency.get_or_create(&FrontendLabels { frontend: frontend.label() }).clone()
            })
            .observe(elapsed);
    }

    pub(crate) fn reloaded(&self, ok: bool) {
        self.reloads.get_or_create(&ResultLabels { result: if ok { "ok" } else { "error" } }).inc();
    }

    pub(crate) fn envoy_reloaded(&self, ok: bool) {
        self.envoy_reloads.get_or_create(&ResultLabels { result: if ok { "ok" } else { "error" } }).inc();
    }

    /// Both results of Envoy's reloads from now, at 0: once a file is watched, a first failure
    /// must show as an increase.
    pub(crate) fn envoy_reloads_watched(&self) {
        for result in ["ok", "error"] {
            // One statement each: `get_or_create` returns a guard that must not outlive it.
            let _ = self.envoy_reloads.get_or_create(&ResultLabels { result }).get();
        }
    }

    /// envoyproxy/ratelimit's per-limit counters (see [`DescriptorMetrics`]): register them in the
    /// root registry to serve them.
    #[must_use]
    pub fn descriptors(&self) -> &DescriptorMetrics {
        &self.descriptors
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(registry: &Registry) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
        text
    }

    #[test]
    fn indexes_follow_the_declaration_order() {
        assert!(Outcome::ALL.iter().enumerate().all(|(i, o)| o.index() == i));
        assert!(Source::ALL.iter().enumerate().all(|(i, s)| s.index() == i));
        assert!(Frontend::ALL.iter().enumerate().all(|(i, f)| f.index() == i));
    }

    #[test]
    fn store_errors_exist_from_the_start_only_for_a_remote_store() {
        let mut registry = Registry::with_prefix("tollgate");
        let local = Metrics::new(&mut registry, false, false);
        assert!(!render(&registry).contains("store_errors"));
        local.store_error(&StoreError::NoChecks);
        assert!(render(&registry).contains("tollgate_store_errors_total{kind=\"request\"} 1\n"));

        let mut registry = Registry::with_prefix("tollgate");
        let remote = Metrics::new(&mut registry, true, false);
        remote.store_error(&StoreError::Timeout(std::time::Duration::from_millis(50)));
        let text = render(&registry);
        for (kind, n) in [("backend", 0), ("timeout", 1), ("bad_state", 0), ("request", 0)] {
            assert!(text.contains(&format!("tollgate_store_errors_total{{kind=\"{kind}\"}} {n}\n")), "{text}");
        }
        assert!(!text.contains("tollgate_decisions_total") && !text.contains("tollgate_rule_decisions_total"));
    }

    #[test]
    fn decision_latency_has_a_series_per_front_end_that_decided() {
        let mut registry = Registry::with_prefix("tollgate");
        let metrics = Metrics::new(&mut registry, true, false);
        assert!(!render(&registry).contains("decision_duration"), "no series before a decision");
        metrics.observe_decision(Frontend::Resp, Duration::from_micros(3));
        metrics.observe_decision(Frontend::Resp, Duration::from_micros(300));
        metrics.observe_decision(Source::Http.frontend(), Duration::from_millis(2));
        let text = render(&registry);
        assert!(text.contains("# TYPE tollgate_decision_duration_seconds histogram\n"), "{text}");
        assert!(text.contains("tollgate_decision_duration_seconds_count{frontend=\"resp\"} 2\n"), "{text}");
        assert!(text.contains("tollgate_decision_duration_seconds_count{frontend=\"http\"} 1\n"), "{text}");
        assert!(!text.contains("frontend=\"grpc\"") && !text.contains("frontend=\"middleware\""), "{text}");
    }
}
