//! Prometheus metrics: decisions by outcome, algorithm and limit; store errors; store call
//! latency; connections. Rendered in the text exposition format at `GET /metrics`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tollgate_core::Algorithm;

/// Labels of `tollgate_decisions_total`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabels {
    /// `allowed` or `denied`.
    pub outcome: String,
    /// The algorithm's name.
    pub algorithm: String,
    /// The named limit, or the command that carried an ad-hoc limit (`cl.throttle`, `tg.check`, `http`).
    pub limit: String,
}

/// Labels of `tollgate_store_errors_total`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    /// `backend`, `timeout`, `bad_state`, `request`.
    pub kind: String,
}

/// The allowed and denied counters of one (algorithm, limit), resolved once so that the hot path
/// only increments an atomic.
#[derive(Debug, Clone)]
pub struct DecisionCounters {
    allowed: Counter,
    denied: Counter,
}

impl DecisionCounters {
    /// Counts one decision.
    pub fn record(&self, allowed: bool) {
        if allowed {
            self.allowed.inc()
        } else {
            self.denied.inc()
        };
    }
}

/// Every metric of one server.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    decisions: Family<DecisionLabels, Counter>,
    store_errors: Family<ErrorLabels, Counter>,
    /// Seconds per store call.
    pub store_latency: Histogram,
    /// RESP connections open now.
    pub connections: Gauge,
    /// RESP connections accepted since start.
    pub connections_total: Counter,
    /// RESP connections refused because `max_connections` were open.
    pub connections_refused: Counter,
    /// Store calls answered by the failure policy (Redis unreachable or slow).
    pub fallbacks: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// A fresh registry with every metric registered.
    #[must_use]
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("tollgate");
        let decisions = Family::<DecisionLabels, Counter>::default();
        registry.register("decisions", "Rate-limit decisions", decisions.clone());
        let store_errors = Family::<ErrorLabels, Counter>::default();
        registry.register("store_errors", "Store calls that failed", store_errors.clone());
        // 10 µs .. ~1.3 s
        let store_latency = Histogram::new(exponential_buckets(0.000_01, 2.0, 18));
        registry.register("store_latency_seconds", "Time per store call", store_latency.clone());
        let connections = Gauge::default();
        registry.register("resp_connections", "Open RESP connections", connections.clone());
        let connections_total = Counter::default();
        registry.register("resp_connections_accepted", "RESP connections accepted", connections_total.clone());
        let connections_refused = Counter::default();
        registry.register(
            "resp_connections_refused",
            "RESP connections refused at the limit",
            connections_refused.clone(),
        );
        let fallbacks = Gauge::default();
        registry.register("store_fallbacks", "Store calls answered by the failure policy", fallbacks.clone());
        Metrics {
            registry,
            decisions,
            store_errors,
            store_latency,
            connections,
            connections_total,
            connections_refused,
            fallbacks,
        }
    }

    /// The counters for decisions of `algorithm` under the limit labelled `limit`.
    #[must_use]
    pub fn decision_counters(&self, algorithm: Algorithm, limit: &str) -> DecisionCounters {
        let labels = |outcome: &str| DecisionLabels {
            outcome: outcome.to_string(),
            algorithm: algorithm.name().to_string(),
            limit: limit.to_string(),
        };
        // One statement each: `get_or_create` returns a read guard, and a second call creating a
        // series while the first guard lives would wait for itself.
        let allowed = self.decisions.get_or_create(&labels("allowed")).clone();
        let denied = self.decisions.get_or_create(&labels("denied")).clone();
        DecisionCounters { allowed, denied }
    }

    /// Counts a failed store call.
    pub fn store_error(&self, kind: &str) {
        self.store_errors.get_or_create(&ErrorLabels { kind: kind.to_string() }).inc();
    }

    /// The text exposition format.
    #[must_use]
    pub fn render(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }
}
