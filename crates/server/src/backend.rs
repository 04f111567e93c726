//! The store behind the server, chosen at start-up: memory, or Redis / Redis Cluster wrapped in
//! the configured failure policy.

use tollgate_core::{Decision, Limit};
use tollgate_store::{Check, FailurePolicy, Fallback, MemoryStore, RedisOptions, RedisStore, Store, StoreError};

use crate::config::{Config, OnStoreError, StoreConfig};

/// Any of the server's stores.
#[derive(Debug)]
pub enum Backend {
    /// The embedded store.
    Memory(MemoryStore),
    /// Redis or Redis Cluster, with its failure policy.
    Redis(Fallback<RedisStore>),
}

impl Backend {
    /// Opens the configured store. A single Redis server may be down at start (the connection
    /// is made on first use); a cluster must answer, to learn its slots.
    pub async fn open(config: &Config) -> Result<Self, String> {
        let options = RedisOptions { timeout: config.store_timeout, ..RedisOptions::default() };
        let redis = match &config.store {
            StoreConfig::Memory { max_keys } => {
                return Ok(Backend::Memory(MemoryStore::builder().max_keys(*max_keys).build()));
            }
            StoreConfig::Redis(url) => RedisStore::open(url, options).map_err(|e| e.to_string())?,
            StoreConfig::Cluster(nodes) => RedisStore::open_cluster(nodes, options).await.map_err(|e| e.to_string())?,
        };
        let policy = match config.on_store_error {
            OnStoreError::Open => FailurePolicy::Open,
            OnStoreError::Closed => FailurePolicy::Closed,
            OnStoreError::Local => FailurePolicy::Local(MemoryStore::new()),
        };
        Ok(Backend::Redis(Fallback::new(redis, policy)))
    }

    /// Backend errors answered by the failure policy so far.
    pub fn fallbacks(&self) -> u64 {
        match self {
            Backend::Memory(_) => 0,
            Backend::Redis(store) => store.backend_errors(),
        }
    }
}

impl Store for Backend {
    async fn check(&self, key: &str, limit: &Limit, cost: u64) -> Result<Decision, StoreError> {
        match self {
            // The memory store decides on this thread; no future to build.
            Backend::Memory(store) => store.check_sync(key, limit, cost),
            Backend::Redis(store) => store.check(key, limit, cost).await,
        }
    }

    async fn check_all(&self, checks: &[Check<'_>]) -> Result<Vec<Decision>, StoreError> {
        match self {
            Backend::Memory(store) => store.check_all_sync(checks),
            Backend::Redis(store) => store.check_all(checks).await,
        }
    }

    async fn reset(&self, key: &str, limit: &Limit) -> Result<(), StoreError> {
        match self {
            Backend::Memory(store) => {
                store.reset_sync(key, limit);
                Ok(())
            }
            Backend::Redis(store) => store.reset(key, limit).await,
        }
    }
}
