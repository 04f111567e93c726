//! Prometheus metrics: decisions by outcome, algorithm and limit; store errors; store call
//! latency; connections; and the store's own figures, read when scraped (the failure policy's
//! fallbacks, breaker and debts on Redis; keys, bytes and evictions in memory). Rendered in the
//! OpenMetrics text format at `GET /metrics`.

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tollgate_core::Algorithm;

use crate::backend::Backend;

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
}

impl Metrics {
    /// A fresh registry with every metric registered, the store's read from `store` when scraped.
    #[must_use]
    pub fn new(store: Arc<Backend>) -> Self {
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
        registry.register_collector(Box::new(StoreCollector(store)));
        Metrics {
            registry,
            decisions,
            store_errors,
            store_latency,
            connections,
            connections_total,
            connections_refused,
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

/// The store's figures, read when scraped.
#[derive(Debug)]
struct StoreCollector(Arc<Backend>);

/// `kind` of `tollgate_store_evictions_total`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EvictionLabels {
    kind: &'static str,
}

fn counter(encoder: &mut DescriptorEncoder<'_>, name: &str, help: &str, value: u64) -> Result<(), std::fmt::Error> {
    let metric = ConstCounter::new(value);
    metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
}

fn gauge(encoder: &mut DescriptorEncoder<'_>, name: &str, help: &str, value: u64) -> Result<(), std::fmt::Error> {
    let metric = ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX));
    metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
}

impl Collector for StoreCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let stats = self.0.stats();
        if let Some((keys, bytes, evictions)) = stats.memory {
            gauge(&mut encoder, "store_keys", "Keys the memory store holds", keys as u64)?;
            gauge(&mut encoder, "store_bytes", "Bytes the memory store holds", bytes as u64)?;
            let mut family = encoder.encode_descriptor(
                "store_evictions",
                "Keys evicted to stay within the bounds: idle (lossless) or live (each can over-grant)",
                None,
                MetricType::Counter,
            )?;
            for (kind, value) in [("idle", evictions.idle), ("live", evictions.live)] {
                ConstCounter::new(value).encode(family.encode_family(&EvictionLabels { kind })?)?;
            }
        }
        if let Some(f) = stats.fallback {
            counter(&mut encoder, "store_fallbacks", "Store calls answered by the failure policy", f.fallbacks)?;
            counter(
                &mut encoder,
                "store_backend_errors",
                "Calls to the store's backend that failed or timed out",
                f.backend_errors,
            )?;
            gauge(
                &mut encoder,
                "store_breaker_open",
                "1 while the circuit breaker skips the backend",
                u64::from(f.breaker_open),
            )?;
            counter(&mut encoder, "store_breaker_opened", "Times the circuit breaker opened", f.breaker_opened)?;
            gauge(
                &mut encoder,
                "store_debts",
                "Keys whose local admissions the backend has not recorded yet",
                f.debts as u64,
            )?;
            counter(
                &mut encoder,
                "store_charges_paid",
                "Local admissions recorded by the backend afterwards",
                f.charges_paid,
            )?;
            counter(
                &mut encoder,
                "store_ledger_evictions",
                "Keys the failure policy stopped following while needed (each can over-grant)",
                f.ledger_evictions,
            )?;
        }
        Ok(())
    }
}
