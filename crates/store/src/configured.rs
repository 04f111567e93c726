//! The store a configuration names ([`StoreConfig`]: `memory` or a Redis URL), opened as one
//! [`Backend`]: the memory store, or Redis (a server, a Cluster or a Sentinel group) behind its
//! failure policy and circuit breaker, with leases for its hot keys. What `tollgate serve` and
//! `tollgate proxy` decide with; a [`CallTimer`] times each call through the failure policy (a
//! decision from a leased slice makes none; the memory store decides in well under a
//! microsecond, where reading the clock twice would cost more than the decision).

use std::sync::Arc;
use std::time::Duration;

use tollgate_core::{Clock, Decision, Limit};

use crate::fallback::{CallTimer, FallbackOptions};
use crate::memory::{DEFAULT_MAX_KEYS, DEFAULT_MAX_MEMORY, Evictions};
use crate::redis::target::RedisTarget;
use crate::{
    Breaker, BreakerState, Check, FailurePolicy, Fallback, FallbackStats, LeaseOptions, LeaseStats, Leased,
    MemoryStore, RedisOptions, RedisStore, Refund, Remote, Reserved, Store, StoreError,
};

/// Which store decides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreConfig {
    /// The embedded in-memory store, bounded in keys and bytes.
    Memory {
        /// See `MemoryStoreBuilder::max_keys`.
        max_keys: usize,
        /// See `MemoryStoreBuilder::max_memory`.
        max_memory: usize,
    },
    /// Redis: one server, a Cluster or a Sentinel group, plain or TLS.
    Redis(Box<RedisTarget>),
}

impl StoreConfig {
    /// Parses `memory` or a Redis URL (`redis://host:port[/db]`, `redis+cluster://…`,
    /// `redis+sentinel://…/MASTER`, and `rediss…` for TLS). No error quotes `text` (see
    /// [`RedisTarget::parse`]).
    pub fn parse(text: &str) -> Result<Self, String> {
        if text == "memory" {
            return Ok(StoreConfig::Memory { max_keys: DEFAULT_MAX_KEYS, max_memory: DEFAULT_MAX_MEMORY });
        }
        if text.starts_with("redis") && text.contains("://") {
            return RedisTarget::parse(text).map(|t| StoreConfig::Redis(Box::new(t)));
        }
        // Not quoted: a store that is not understood may be a URL whose credentials are
        // misplaced (or a password given where the store goes).
        Err("unknown store: use memory, redis://host:port[/db] (e.g. redis://127.0.0.1:6379), \
             redis+cluster://host:port,host:port or redis+sentinel://host:port,host:port/MASTER_NAME \
             (rediss… for TLS)"
            .into())
    }

    /// A Redis store at `url` (any form [`RedisTarget::parse`] reads); panics on a bad URL (for
    /// tests and examples).
    #[must_use]
    pub fn redis(url: &str) -> Self {
        StoreConfig::Redis(Box::new(RedisTarget::parse(url).unwrap_or_else(|e| panic!("{e}"))))
    }

    /// What the logs may say of this store: its kind and address, never its credentials.
    pub fn describe(&self) -> String {
        match self {
            StoreConfig::Memory { .. } => "memory".into(),
            StoreConfig::Redis(target) => target.redacted(),
        }
    }
}

/// How a Redis [`Backend`] behaves (the memory store needs none of it but the clock).
#[derive(Debug, Clone)]
pub struct BackendOptions {
    /// What to answer while Redis fails.
    pub policy: FailurePolicy,
    /// How long one Redis call may take.
    pub timeout: Duration,
    /// Lone checks through tollgate's native module where it is loaded.
    pub module: bool,
    /// Consecutive failures that open a server's breaker.
    pub breaker_threshold: u32,
    /// How often an open breaker probes.
    pub breaker_probe: Duration,
    /// Leases of hot keys.
    pub lease: LeaseOptions,
    /// The clock of every decision.
    pub clock: Arc<dyn Clock>,
    /// Told how long each call through the failure policy took.
    pub timer: Option<CallTimer>,
}

/// Any of the stores a configuration names.
#[derive(Debug)]
// Made once per process and shared: its size moves nothing on the hot path.
#[allow(clippy::large_enum_variant)]
pub enum Backend {
    /// The embedded store.
    Memory(MemoryStore),
    /// Redis, with its failure policy and leases, and the options it was opened with.
    Redis(Leased<Fallback<RedisStore>>, Arc<BackendOptions>),
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
    /// Opens `store`. Redis (a server, a cluster or a Sentinel group) may be down at start: the
    /// connection is made on first use, and the failure policy answers meanwhile.
    pub async fn open(store: &StoreConfig, options: BackendOptions) -> Result<Self, String> {
        let redis = match store {
            StoreConfig::Memory { max_keys, max_memory } => {
                return Ok(Backend::Memory(
                    MemoryStore::builder()
                        .max_keys(*max_keys)
                        .max_memory(*max_memory)
                        .clock(options.clock.clone())
                        .build(),
                ));
            }
            StoreConfig::Redis(target) => {
                let redis =
                    RedisOptions { timeout: options.timeout, module: options.module, ..RedisOptions::default() };
                RedisStore::connect(target, redis).map_err(|e| e.to_string())?
            }
        };
        Ok(Backend::redis(redis, Arc::new(options)))
    }

    fn redis(redis: RedisStore, options: Arc<BackendOptions>) -> Backend {
        let fallback = FallbackOptions {
            breaker: Breaker::new(options.breaker_threshold, options.breaker_probe),
            clock: options.clock.clone(),
            timer: options.timer.clone(),
            ..FallbackOptions::default()
        };
        let fallback = Fallback::with_options(redis, options.policy, fallback);
        Backend::Redis(Leased::new(fallback, options.lease.clone(), options.clock.clone()), options)
    }

    /// The same store for a front end with a shorter deadline (Envoy's gRPC): on Redis, the same
    /// connection with `timeout` per call, behind a failure policy and breaker of its own (its
    /// keys are its own: they live in their own scope). `None` in memory, which never waits.
    #[must_use]
    pub fn with_deadline(&self, timeout: Duration) -> Option<Backend> {
        let Backend::Redis(leased, options) = self else { return None };
        let store = leased.inner();
        let redis = store.inner().with_options(RedisOptions { timeout, ..store.inner().options().clone() }).ok()?;
        Some(Backend::redis(redis, options.clone()))
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

    async fn charge(&self, checks: &[Check<'_>]) -> Result<(), StoreError> {
        match self {
            Backend::Memory(store) => store.charge_sync(checks),
            Backend::Redis(store, _) => store.charge(checks).await,
        }
    }

    /// Straight to Redis (not through the failure policy nor the leases: a reservation made from
    /// a node's local view could not be settled on another node), so a reserve fails while Redis
    /// does. Leased slices are charged in Redis already: still exact.
    async fn reserve_until(
        &self,
        checks: &[Check<'_>],
        ttl_ns: u64,
    ) -> Result<(Reserved, Option<crate::Reservation>), StoreError> {
        match self {
            Backend::Memory(store) => store.reserve_until_sync(checks, ttl_ns),
            Backend::Redis(store, _) => store.inner().inner().reserve_until(checks, ttl_ns).await,
        }
    }

    async fn settle(&self, id: &str, actual: u64) -> Result<crate::Settled, StoreError> {
        match self {
            Backend::Memory(store) => store.settle_sync(id, actual),
            Backend::Redis(store, _) => store.inner().inner().settle(id, actual).await,
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

    async fn carry(&self, scope: &str, key: &[u8], from: &Limit, to: &Limit) -> Result<u64, StoreError> {
        match self {
            Backend::Memory(store) => store.carry_sync(scope, key, from, to),
            Backend::Redis(store, _) => store.carry(scope, key, from, to).await,
        }
    }

    async fn hold(&self, scope: &str, key: &[u8], hold_ns: u64) -> Result<(), StoreError> {
        match self {
            Backend::Memory(store) => {
                store.hold_sync(scope, key, hold_ns);
                Ok(())
            }
            Backend::Redis(store, _) => store.hold(scope, key, hold_ns).await,
        }
    }

    async fn held(&self, checks: &[Check<'_>]) -> Result<Vec<Option<u64>>, StoreError> {
        match self {
            Backend::Memory(store) => Ok(store.held_sync(checks)),
            Backend::Redis(store, _) => store.held(checks).await,
        }
    }
}
