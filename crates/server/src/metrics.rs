//! The server's Prometheus metrics: connections, and the store's own figures, read when scraped
//! (the failure policy's fallbacks, breaker and debts on Redis; keys, bytes and evictions in
//! memory), and the seconds per Redis call. The decisions and store errors are the engine's (`tollgate-engine`); all of
//! them are rendered together at `GET /metrics` in the OpenMetrics text format.

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::registry::Registry;

use crate::backend::Backend;

/// The server's own metrics; the engine registers the decisions and store errors.
#[derive(Debug)]
pub struct Metrics {
    /// RESP connections open now.
    pub connections: Gauge,
    /// RESP connections accepted since start.
    pub connections_total: Counter,
    /// RESP connections refused because `max_connections` were open.
    pub connections_refused: Counter,
}

impl Metrics {
    /// The server's metrics registered in `registry`, with the store's figures read from
    /// `store` when scraped.
    pub fn new(registry: &mut Registry, store: Arc<Backend>) -> Self {
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
        if let Some(latency) = store.latency() {
            registry.register("store_latency_seconds", "Seconds per call to Redis", latency.clone());
        }
        registry.register_collector(Box::new(StoreCollector(store)));
        Metrics { connections, connections_total, connections_refused }
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
