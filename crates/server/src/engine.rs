//! The engine every front end calls: the store, the named limits and the metrics, so that RESP
//! and HTTP make the same decisions and count them the same way.

use std::collections::BTreeMap;

use prometheus_client::metrics::gauge::Gauge;
use tollgate_core::{Algorithm, Decision, Limit};
use tollgate_store::{Store, StoreError};

use crate::backend::Backend;
use crate::config::Config;
use crate::metrics::{DecisionCounters, Metrics};

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

/// A limit from the config file, with its counters.
#[derive(Debug)]
pub struct Named {
    /// The limit.
    pub limit: Limit,
    counters: DecisionCounters,
}

/// Why a named check failed.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// No limit of that name in the config.
    #[error("no limit named {0:?} in the config")]
    UnknownLimit(String),
    /// The store failed or refused the request.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Store, limits and metrics, shared by every connection.
#[derive(Debug)]
pub struct Engine {
    store: Backend,
    named: BTreeMap<String, Named>,
    adhoc: Vec<DecisionCounters>,
    metrics: Metrics,
    fallbacks: Gauge,
}

impl Engine {
    /// Opens the store and resolves the named limits' counters.
    pub async fn new(config: &Config) -> Result<Self, String> {
        let store = Backend::open(config).await?;
        let metrics = Metrics::new();
        let named = config
            .limits
            .iter()
            .map(|(name, limit)| {
                let counters = metrics.decision_counters(limit.algorithm(), name);
                (name.clone(), Named { limit: limit.clone(), counters })
            })
            .collect();
        let adhoc = Source::ALL
            .iter()
            .flat_map(|source| Algorithm::ALL.iter().map(|&a| metrics.decision_counters(a, source.label())))
            .collect();
        let fallbacks = metrics.fallbacks.clone();
        Ok(Engine { store, named, adhoc, metrics, fallbacks })
    }

    /// The named limit `name`.
    pub fn named(&self, name: &str) -> Option<&Limit> {
        self.named.get(name).map(|n| &n.limit)
    }

    /// Decides `cost` for `key` under an ad-hoc `limit`.
    pub async fn check(&self, source: Source, key: &str, limit: &Limit, cost: u64) -> Result<Decision, StoreError> {
        let index = Source::ALL.iter().position(|&s| s == source).unwrap_or(0) * Algorithm::ALL.len()
            + Algorithm::ALL.iter().position(|&a| a == limit.algorithm()).unwrap_or(0);
        self.decide(key, limit, cost, &self.adhoc[index]).await
    }

    /// Decides `cost` for `key` under the named limit `name`.
    pub async fn check_named(&self, name: &str, key: &str, cost: u64) -> Result<(Decision, &Limit), EngineError> {
        let named = self.named.get(name).ok_or_else(|| EngineError::UnknownLimit(name.to_string()))?;
        let decision = self.decide(key, &named.limit, cost, &named.counters).await?;
        Ok((decision, &named.limit))
    }

    /// Forgets `key`'s state under `limit`'s algorithm.
    pub async fn reset(&self, key: &str, limit: &Limit) -> Result<(), StoreError> {
        self.store.reset(key, limit).await.inspect_err(|e| self.count_error(e))
    }

    async fn decide(
        &self,
        key: &str,
        limit: &Limit,
        cost: u64,
        counters: &DecisionCounters,
    ) -> Result<Decision, StoreError> {
        let started = quanta::Instant::now();
        let result = self.store.check(key, limit, cost).await;
        self.metrics.store_latency.observe(started.elapsed().as_secs_f64());
        match &result {
            // A peek is not a decision to count.
            Ok(decision) if cost > 0 => counters.record(decision.allowed),
            Ok(_) => {}
            Err(e) => self.count_error(e),
        }
        result
    }

    fn count_error(&self, error: &StoreError) {
        let kind = match error {
            StoreError::Backend(_) => "backend",
            StoreError::Timeout(_) => "timeout",
            StoreError::BadState(_) => "bad_state",
            _ => "request",
        };
        self.metrics.store_error(kind);
    }

    /// The metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The metrics in Prometheus text format, with the failure policy's count brought up to date.
    pub fn render_metrics(&self) -> String {
        self.fallbacks.set(i64::try_from(self.store.fallbacks()).unwrap_or(i64::MAX));
        self.metrics.render()
    }
}
