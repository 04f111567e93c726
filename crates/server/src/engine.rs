//! The engine every front end calls: the store, the named limits and the metrics, so that RESP
//! and HTTP make the same decisions and count them the same way. A named limit's state is scoped
//! by its name: two named limits never share state for one key, nor share it with an ad-hoc limit.

use std::collections::BTreeMap;

use std::sync::Arc;

use tollgate_core::{Algorithm, Decision, Limit};
use tollgate_store::{Check, Store, StoreError};

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
    store: Arc<Backend>,
    named: BTreeMap<String, Named>,
    adhoc: Vec<DecisionCounters>,
    metrics: Metrics,
}

impl Engine {
    /// Opens the store and resolves the named limits' counters.
    pub async fn new(config: &Config) -> Result<Self, String> {
        let store = Arc::new(Backend::open(config).await?);
        let metrics = Metrics::new(store.clone());
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
        Ok(Engine { store, named, adhoc, metrics })
    }

    /// The named limit `name`.
    pub fn named(&self, name: &str) -> Option<&Limit> {
        self.named.get(name).map(|n| &n.limit)
    }

    /// Decides `cost` for `key` under an ad-hoc `limit`.
    pub async fn check(&self, source: Source, key: &[u8], limit: &Limit, cost: u64) -> Result<Decision, StoreError> {
        let index = Source::ALL.iter().position(|&s| s == source).unwrap_or(0) * Algorithm::ALL.len()
            + Algorithm::ALL.iter().position(|&a| a == limit.algorithm()).unwrap_or(0);
        self.decide(Check::new(key, limit, cost), &self.adhoc[index]).await
    }

    /// Decides `cost` for `key` under the named limit `name` (in its own scope).
    pub async fn check_named(&self, name: &str, key: &[u8], cost: u64) -> Result<(Decision, &Limit), EngineError> {
        let (name, named) =
            self.named.get_key_value(name).ok_or_else(|| EngineError::UnknownLimit(name.to_string()))?;
        let decision = self.decide(Check::new(key, &named.limit, cost).scoped(name), &named.counters).await?;
        Ok((decision, &named.limit))
    }

    /// Forgets the state of `key` in `scope` under `limit`'s algorithm.
    pub async fn reset(&self, scope: &str, key: &[u8], limit: &Limit) -> Result<(), StoreError> {
        self.store.reset(scope, key, limit).await.inspect_err(|e| self.count_error(e))
    }

    async fn decide(&self, check: Check<'_>, counters: &DecisionCounters) -> Result<Decision, StoreError> {
        let started = quanta::Instant::now();
        let cost = check.cost;
        let result = self.store.check_one(check).await;
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

    /// The metrics in the OpenMetrics text format.
    pub fn render_metrics(&self) -> String {
        self.metrics.render()
    }
}
