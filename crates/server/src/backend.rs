//! The store behind the server, chosen at start-up: memory, or Redis / Redis Cluster behind the
//! configured failure policy and circuit breaker, with leases for its hot keys. Calls through the
//! failure policy are timed for `tollgate_store_latency_seconds` (a decision from a leased slice
//! makes none); the memory store decides in well under a microsecond, where
//! reading the clock twice would cost more than the decision.

use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

use tollgate_core::{Decision, Limit};
use tollgate_store::fallback::{CallTimer, FallbackOptions};
use tollgate_store::memory::Evictions;
use tollgate_store::{
    Breaker, BreakerState, Check, Fallback, FallbackStats, LeaseStats, Leased, MemoryStore, RedisOptions, RedisStore,
    Refund, Remote, Reserved, Store, StoreError,
};

use crate::config::{Config, StoreConfig};

/// Any of the server's stores.
#[derive(Debug)]
pub enum Backend {
    /// The embedded store.
    Memory(MemoryStore),
    /// Redis or Redis Cluster, with its failure policy and leases, and the seconds per call.
    Redis(Leased<Fallback<RedisStore>>, Histogram),
}

impl BackendStats {
    /// The figures of two stores on the same backend, added (the breaker open if either is).
    #[must_use]
    pub fn plus(self, other: BackendStats) -> BackendStats {
        let fallback = match (self.fallback, other.fallback) {
            (Some(a), Some(b)) => Some(FallbackStats {
                fallbacks: a.fallbacks + b.fallbacks,
                backend_errors: a.backend_errors + b.backend_errors,
                breaker_open: a.breaker_open || b.breaker_open,
                breaker_opened: a.breaker_opened + b.breaker_opened,
                debts: a.debts + b.debts,
                charges_paid: a.charges_paid + b.charges_paid,
                ledger_evictions: a.ledger_evictions + b.ledger_evictions,
            }),
            (a, b) => a.or(b),
        };
        let lease = match (self.lease, other.lease) {
            (Some(a), Some(b)) => Some(LeaseStats {
                grants: a.grants + b.grants,
                units_granted: a.units_granted + b.units_granted,
                units_forfeited: a.units_forfeited + b.units_forfeited,
                failures: a.failures + b.failures,
                local_decisions: a.local_decisions + b.local_decisions,
                exact_decisions: a.exact_decisions + b.exact_decisions,
                hot_keys_detected: a.hot_keys_detected + b.hot_keys_detected,
                leased_keys: a.leased_keys + b.leased_keys,
            }),
            (a, b) => a.or(b),
        };
        // Both stores share one connection and its count of script calls.
        let script_calls = self.script_calls.max(other.script_calls);
        let mut breakers = self.breakers;
        for state in other.breakers {
            match breakers.iter_mut().find(|b| b.domain == state.domain) {
                Some(b) => {
                    b.open |= state.open;
                    b.opened += state.opened;
                }
                None => breakers.push(state),
            }
        }
        breakers.sort_by(|a, b| a.domain.cmp(&b.domain));
        BackendStats { memory: self.memory.or(other.memory), fallback, lease, script_calls, breakers }
    }
}

/// What the store reports for the metrics.
#[derive(Debug, Clone, Default)]
pub struct BackendStats {
    /// The memory store's keys, bytes and evictions (the memory store only).
    pub memory: Option<(usize, usize, Evictions)>,
    /// The failure policy's counters (Redis only).
    pub fallback: Option<FallbackStats>,
    /// The leases' counters (Redis only).
    pub lease: Option<LeaseStats>,
    /// Script calls sent to Redis (Redis only).
    pub script_calls: Option<u64>,
    /// The circuit breaker of each Redis server calls went to (Redis only).
    pub breakers: Vec<BreakerState>,
}

impl Backend {
    /// Opens the configured store. Redis (a server or a cluster) may be down at start: the
    /// connection is made on first use, and the failure policy answers meanwhile.
    pub async fn open(config: &Config) -> Result<Self, String> {
        let options =
            RedisOptions { timeout: config.store_timeout, module: config.store_module, ..RedisOptions::default() };
        let redis = match &config.store {
            StoreConfig::Memory { max_keys, max_memory } => {
                return Ok(Backend::Memory(
                    MemoryStore::builder()
                        .max_keys(*max_keys)
                        .max_memory(*max_memory)
                        .clock(config.clock.clone())
                        .build(),
                ));
            }
            StoreConfig::Redis(target) => RedisStore::connect(target, options).map_err(|e| e.to_string())?,
        };
        let policy = config.on_store_error;
        // 50 µs .. ~6.5 s: a loopback round trip up to a store timeout.
        let latency = Histogram::new(exponential_buckets(0.000_05, 2.0, 18));
        let options = FallbackOptions {
            breaker: Breaker::new(config.breaker_threshold, config.breaker_probe),
            clock: config.clock.clone(),
            timer: Some(timer(&latency)),
            ..FallbackOptions::default()
        };
        let fallback = Fallback::with_options(redis, policy, options);
        Ok(Backend::Redis(Leased::new(fallback, config.lease.clone(), config.clock.clone()), latency))
    }

    /// The same store for a front end with a shorter deadline (Envoy's gRPC): on Redis, the same
    /// connection with `timeout` per call, behind a failure policy and breaker of its own (its
    /// keys are its own: they live in their own scope). `None` in memory, which never waits.
    pub fn with_deadline(&self, config: &Config, timeout: std::time::Duration) -> Option<Backend> {
        let Backend::Redis(leased, latency) = self else { return None };
        let store = leased.inner();
        let redis = store.inner().with_options(RedisOptions { timeout, ..store.inner().options().clone() }).ok()?;
        let options = FallbackOptions {
            breaker: Breaker::new(config.breaker_threshold, config.breaker_probe),
            clock: config.clock.clone(),
            timer: Some(timer(latency)),
            ..FallbackOptions::default()
        };
        let fallback = Fallback::with_options(redis, store.policy(), options);
        Some(Backend::Redis(Leased::new(fallback, config.lease.clone(), config.clock.clone()), latency.clone()))
    }

    /// Whether the store answers (always, in memory): Redis's topology read again and a primary
    /// pinged; if not, why in tollgate's words (each server tried on a connection of its own, so
    /// that a certificate, a password or an address is named rather than a timeout).
    pub async fn ping(&self) -> Result<(), String> {
        match self {
            Backend::Memory(_) => Ok(()),
            Backend::Redis(store, _) => {
                let redis = store.inner().inner();
                match redis.probe().await {
                    Ok(()) => Ok(()),
                    Err(error) => Err(redis.diagnose().await.unwrap_or_else(|| error.to_string())),
                }
            }
        }
    }

    /// The servers whose circuit breaker skips them now (none, in memory).
    pub fn open_breakers(&self) -> Vec<String> {
        match self {
            Backend::Memory(_) => Vec::new(),
            Backend::Redis(store, _) => {
                // "": calls made before the topology was known (a cluster's slot map, the Sentinels'
                // primary) have no server to name yet.
                let name = |domain: &str| if domain.is_empty() { "Redis".to_string() } else { domain.to_string() };
                store.inner().breakers().states().into_iter().filter(|b| b.open).map(|b| name(&b.domain)).collect()
            }
        }
    }

    /// Seconds per Redis call (None for the memory store).
    pub fn latency(&self) -> Option<&Histogram> {
        match self {
            Backend::Memory(_) => None,
            Backend::Redis(_, latency) => Some(latency),
        }
    }

    /// The store's figures, for the metrics.
    pub fn stats(&self) -> BackendStats {
        match self {
            Backend::Memory(store) => {
                let memory = Some((store.len(), store.bytes(), store.evictions()));
                BackendStats { memory, ..BackendStats::default() }
            }
            Backend::Redis(store, _) => BackendStats {
                memory: None,
                fallback: Some(store.inner().stats()),
                lease: Some(store.stats()),
                script_calls: Some(store.inner().inner().script_calls()),
                breakers: store.inner().breakers().states(),
            },
        }
    }
}

impl Store for Backend {
    async fn check_all(&self, checks: &[Check<'_>]) -> Result<Vec<Decision>, StoreError> {
        match self {
            Backend::Memory(store) => store.check_all_sync(checks),
            Backend::Redis(store, _) => store.check_all(checks).await,
        }
    }

    async fn reserve(&self, checks: &[Check<'_>]) -> Result<Reserved, StoreError> {
        match self {
            Backend::Memory(store) => store.reserve_sync(checks),
            Backend::Redis(store, _) => store.reserve(checks).await,
        }
    }

    async fn refund(&self, refunds: &[Refund<'_>]) -> Result<(), StoreError> {
        match self {
            Backend::Memory(store) => {
                store.refund_sync(refunds);
                Ok(())
            }
            Backend::Redis(store, _) => store.refund(refunds).await,
        }
    }

    async fn check(&self, key: &[u8], limit: &Limit, cost: u64) -> Result<Decision, StoreError> {
        self.check_one(Check::new(key, limit, cost)).await
    }

    async fn check_one(&self, check: Check<'_>) -> Result<Decision, StoreError> {
        match self {
            // The memory store decides on this thread; no future to build.
            Backend::Memory(store) => store.check_one_sync(check),
            Backend::Redis(store, _) => store.check_one(check).await,
        }
    }

    fn decides_in_place(&self) -> bool {
        matches!(self, Backend::Memory(_))
    }

    async fn reset(&self, scope: &str, key: &[u8], limit: &Limit) -> Result<(), StoreError> {
        match self {
            Backend::Memory(store) => {
                store.reset_sync(scope, key, limit);
                Ok(())
            }
            Backend::Redis(store, _) => store.reset(scope, key, limit).await,
        }
    }
}

/// Observes each call through the failure policy in `latency` (a decision answered from a leased
/// slice is no store call, and not observed).
fn timer(latency: &Histogram) -> CallTimer {
    let latency = latency.clone();
    CallTimer::new(move |elapsed| latency.observe(elapsed.as_secs_f64()))
}
