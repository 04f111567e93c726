//! The server's Prometheus metrics: connections, and the store's own figures, read when scraped
//! (the failure policy's fallbacks, breaker and debts on Redis; keys, bytes and evictions in
//! memory), and the seconds per Redis call. The decisions and store errors are the engine's
//! (`tollgate-engine`); every front end (`serve`'s HTTP listener, `proxy`'s admin listener)
//! renders them together with [`render`], as [`CONTENT_TYPE`].
//!
//! The store's figures exist from start-up, 0 included: "no fallback, no backend error" is what
//! an operator watches. They are the failure policy's view: a Redis failure it answered counts in
//! `tollgate_store_backend_errors_total` (and `tollgate_store_fallbacks_total`), never in the
//! engine's `tollgate_store_errors_total`, which counts the errors that reached a caller.

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::backend::{Backend, BackendStats};
use tollgate_store::BreakerState;

/// The one exposition format of every front end: OpenMetrics text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Every metric of `registry` in the OpenMetrics text format (served as [`CONTENT_TYPE`]).
pub fn render(registry: &Registry) -> String {
    let mut text = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut text, registry);
    text
}

/// Registers the stores' figures (read from `stores` when scraped; several on one backend, such
/// as the gRPC service's with its own deadline beside the main one, are added) and, for Redis,
/// the seconds per call in `latency`: what a front end without RESP connections (the proxy) needs.
pub fn register_stores(registry: &mut Registry, stores: Vec<Arc<Backend>>, latency: &Histogram) {
    if stores.iter().any(|store| matches!(**store, Backend::Redis(..))) {
        registry.register("store_latency_seconds", "Seconds per call to Redis", latency.clone());
    }
    registry.register_collector(Box::new(StoreCollector(stores)));
}

/// The server's own metrics; the engine registers the decisions and store errors.
#[derive(Debug)]
pub struct ServerMetrics {
    /// RESP connections open now.
    pub connections: Gauge,
    /// RESP connections accepted since start.
    pub connections_total: Counter,
    /// RESP connections refused because `max_connections` were open.
    pub connections_refused: Counter,
}

impl ServerMetrics {
    /// The server's metrics registered in `registry`, with the store's figures read from
    /// `store` when scraped.
    pub fn new(registry: &mut Registry, stores: Vec<Arc<Backend>>, latency: &Histogram) -> Self {
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
        register_stores(registry, stores, latency);
        ServerMetrics { connections, connections_total, connections_refused }
    }
}

/// The store's figures, read when scraped. Help texts end with a period here, as the registry
/// adds one to those it is given.
#[derive(Debug)]
struct StoreCollector(Vec<Arc<Backend>>);

/// `kind` of `tollgate_store_evictions_total`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EvictionLabels {
    kind: &'static str,
}

/// `path` of `tollgate_lease_decisions_total`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PathLabels {
    path: &'static str,
}

/// `node` of `tollgate_store_node_breaker_*`: a Redis server's address, from the topology.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeLabels {
    node: String,
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
        let stats = self.0.iter().map(|store| store.stats()).reduce(BackendStats::plus).unwrap_or_default();
        if let Some((keys, bytes, evictions)) = stats.memory {
            gauge(&mut encoder, "store_keys", "Keys the memory store holds.", keys as u64)?;
            gauge(&mut encoder, "store_bytes", "Bytes the memory store holds.", bytes as u64)?;
            let mut family = encoder.encode_descriptor(
                "store_evictions",
                "Keys evicted to stay within the bounds: idle (lossless) or live (each can over-grant).",
                None,
                MetricType::Counter,
            )?;
            for (kind, value) in [("idle", evictions.idle), ("live", evictions.live)] {
                ConstCounter::new(value).encode(family.encode_family(&EvictionLabels { kind })?)?;
            }
        }
        if let Some(f) = stats.fallback {
            counter(
                &mut encoder,
                "store_fallbacks",
                "Store calls the failure policy answered (Redis failed, or the breaker was open).",
                f.fallbacks,
            )?;
            counter(
                &mut encoder,
                "store_backend_errors",
                "Calls to Redis that failed or timed out, absorbed by the failure policy (an error \
                 returned to a caller counts in store_errors instead).",
                f.backend_errors,
            )?;
            gauge(
                &mut encoder,
                "store_breaker_open",
                "1 while the circuit breaker skips Redis.",
                u64::from(f.breaker_open),
            )?;
            counter(&mut encoder, "store_breaker_opened", "Times the circuit breaker opened.", f.breaker_opened)?;
            gauge(
                &mut encoder,
                "store_debts",
                "Keys whose local admissions Redis has not recorded yet.",
                f.debts as u64,
            )?;
            counter(
                &mut encoder,
                "store_charges_paid",
                "Local admissions recorded by Redis afterwards.",
                f.charges_paid,
            )?;
            counter(
                &mut encoder,
                "store_ledger_evictions",
                "Keys the failure policy stopped following while needed (each can over-grant).",
                f.ledger_evictions,
            )?;
        }
        // The servers by address ("" is calls made before the topology was known: not a server).
        let breakers: Vec<&BreakerState> = stats.breakers.iter().filter(|b| !b.domain.is_empty()).collect();
        if !breakers.is_empty() {
            let mut open = encoder.encode_descriptor(
                "store_node_breaker_open",
                "1 while the circuit breaker of this Redis server skips it (the failure policy answers its keys).",
                None,
                MetricType::Gauge,
            )?;
            for b in &breakers {
                ConstGauge::new(i64::from(b.open))
                    .encode(open.encode_family(&NodeLabels { node: b.domain.to_string() })?)?;
            }
            let mut opened = encoder.encode_descriptor(
                "store_node_breaker_opened",
                "Times the circuit breaker of this Redis server opened.",
                None,
                MetricType::Counter,
            )?;
            for b in &breakers {
                ConstCounter::new(b.opened)
                    .encode(opened.encode_family(&NodeLabels { node: b.domain.to_string() })?)?;
            }
        }
        if let Some(calls) = stats.script_calls {
            counter(
                &mut encoder,
                "store_script_calls",
                "Decision calls (FCALL, EVALSHA or the module's TOLLGATE.CHECK) sent to Redis: decisions, leases, \
                 charges and refunds. Redis calls per decision: rate of this over rate of lease_decisions_total.",
                calls,
            )?;
        }
        if let Some(l) = stats.lease {
            encode_lease(&mut encoder, &l)?;
        }
        Ok(())
    }
}

/// The leases' figures (see `tollgate_store::lease`).
fn encode_lease(encoder: &mut DescriptorEncoder<'_>, l: &tollgate_store::LeaseStats) -> Result<(), std::fmt::Error> {
    counter(encoder, "lease_grants", "Lease calls Redis answered (a slice granted, or refused).", l.grants)?;
    counter(encoder, "lease_units_granted", "Units debited in Redis for this node's slices.", l.units_granted)?;
    counter(
        encoder,
        "lease_units_forfeited",
        "Units of slices that expired unspent (debited, never admitted: an under-grant).",
        l.units_forfeited,
    )?;
    counter(encoder, "lease_failures", "Lease calls that failed (the key is then decided exactly).", l.failures)?;
    counter(encoder, "lease_hot_keys_detected", "Keys found hot (leased from then on).", l.hot_keys_detected)?;
    gauge(encoder, "lease_keys", "Keys this node leases now.", l.leased_keys)?;
    let mut family = encoder.encode_descriptor(
        "lease_decisions",
        "Decisions on Redis by path: local (from a slice or a cached denial) or exact (one script call).",
        None,
        MetricType::Counter,
    )?;
    for (path, value) in [("local", l.local_decisions), ("exact", l.exact_decisions)] {
        ConstCounter::new(value).encode(family.encode_family(&PathLabels { path })?)?;
    }
    Ok(())
}
