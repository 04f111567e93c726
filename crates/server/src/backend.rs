//! The store behind the server, chosen at start-up: memory, or Redis / Redis Cluster behind the
//! configured failure policy and circuit breaker.

use std::sync::Arc;

use tollgate_core::{Decision, Limit, SystemClock};
use tollgate_store::fallback::FallbackOptions;
use tollgate_store::memory::Evictions;
use tollgate_store::{
    Breaker, Check, FailurePolicy, Fallback, FallbackStats, MemoryStore, RedisOptions, RedisStore, Refund, Reserved,
    Store, StoreError,
};

use crate::config::{Config, OnStoreError, StoreConfig};

/// Any of the server's stores.
#[derive(Debug)]
pub enum Backend {
    /// The embedded store.
    Memory(MemoryStore),
    /// Redis or Redis Cluster, with its failure policy.
    Redis(Fallback<RedisStore>),
}

/// What the store reports for the metrics.
#[derive(Debug, Clone, Copy, Default)]
pub struct BackendStats {
    /// The memory store's keys, bytes and evictions (the memory store only).
    pub memory: Option<(usize, usize, Evictions)>,
    /// The failure policy's counters (Redis only).
    pub fallback: Option<FallbackStats>,
}

impl Backend {
    /// Opens the configured store. A single Redis server may be down at start (the connection
    /// is made on first use); a cluster must answer, to learn its slots.
    pub async fn open(config: &Config) -> Result<Self, String> {
        let options = RedisOptions { timeout: config.store_timeout, ..RedisOptions::default() };
        let redis = match &config.store {
            StoreConfig::Memory { max_keys, max_memory } => {
                return Ok(Backend::Memory(MemoryStore::builder().max_keys(*max_keys).max_memory(*max_memory).build()));
            }
            StoreConfig::Redis(url) => RedisStore::open(url, options).map_err(|e| e.to_string())?,
            StoreConfig::Cluster(nodes) => RedisStore::open_cluster(nodes, options).await.map_err(|e| e.to_string())?,
        };
        let policy = match config.on_store_error {
            OnStoreError::Open => FailurePolicy::Open,
            OnStoreError::Closed => FailurePolicy::Closed,
            OnStoreError::Local => FailurePolicy::Local,
        };
        let options = FallbackOptions {
            breaker: Breaker::new(config.breaker_threshold, config.breaker_probe),
            clock: Arc::new(SystemClock::new()),
            ..FallbackOptions::default()
        };
        Ok(Backend::Redis(Fallback::with_options(redis, policy, options)))
    }

    /// Decides one check.
    pub async fn check_one(&self, check: Check<'_>) -> Result<Decision, StoreError> {
        match self {
            // The memory store decides on this thread; no future to build.
            Backend::Memory(store) => store.check_one(check),
            Backend::Redis(store) => store.check_all(&[check]).await?.pop().ok_or(StoreError::NoChecks),
        }
    }

    /// The store's figures, for the metrics.
    pub fn stats(&self) -> BackendStats {
        match self {
            Backend::Memory(store) => {
                BackendStats { memory: Some((store.len(), store.bytes(), store.evictions())), fallback: None }
            }
            Backend::Redis(store) => BackendStats { memory: None, fallback: Some(store.stats()) },
        }
    }
}

impl Store for Backend {
    async fn check_all(&self, checks: &[Check<'_>]) -> Result<Vec<Decision>, StoreError> {
        match self {
            Backend::Memory(store) => store.check_all_sync(checks),
            Backend::Redis(store) => store.check_all(checks).await,
        }
    }

    async fn reserve(&self, checks: &[Check<'_>]) -> Result<Reserved, StoreError> {
        match self {
            Backend::Memory(store) => store.reserve_sync(checks),
            Backend::Redis(store) => store.reserve(checks).await,
        }
    }

    async fn refund(&self, refunds: &[Refund<'_>]) -> Result<(), StoreError> {
        match self {
            Backend::Memory(store) => {
                store.refund_sync(refunds);
                Ok(())
            }
            Backend::Redis(store) => store.refund(refunds).await,
        }
    }

    async fn check(&self, key: &[u8], limit: &Limit, cost: u64) -> Result<Decision, StoreError> {
        self.check_one(Check::new(key, limit, cost)).await
    }

    async fn reset(&self, scope: &str, key: &[u8], limit: &Limit) -> Result<(), StoreError> {
        match self {
            Backend::Memory(store) => {
                store.reset_sync(scope, key, limit);
                Ok(())
            }
            Backend::Redis(store) => store.reset(scope, key, limit).await,
        }
    }
}
