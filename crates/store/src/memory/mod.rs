//! [`MemoryStore`]: the embedded in-memory store, tollgate's default.
//!
//! GCRA keys live in a table of 16-byte slots (fingerprint, TAT) whose TAT is an `AtomicU64`
//! updated by a compare-and-swap loop under a shared (read) lock: checks of any keys never wait
//! for each other. The six other algorithms keep their `State` in a table whose shard lock is
//! held for the few instructions of one step. Both tables are bounded (see [`table`]); both are
//! locked for write, in a fixed order, only to insert, evict, or check several keys at once.

mod many;
mod slots;
mod table;

use std::sync::Arc;

use tollgate_core::{Algorithm, Clock, Decision, Limit, State, SystemClock, algorithm::Gcra};

use crate::{Check, Store, StoreError};
use slots::{GcraSlot, StateSlot, decide_gcra};
use table::{Shard, Sharded};

/// The default bound on keys per table (GCRA keys, and keys of the other algorithms).
pub const DEFAULT_MAX_KEYS: usize = 1_000_000;

/// An in-memory [`Store`]: thread-safe, bounded, with an injectable clock.
///
/// Cheap to share: wrap it in an [`Arc`]. Besides the async [`Store`] methods it answers
/// synchronously with [`check_sync`](Self::check_sync) (no runtime needed, nothing awaits).
pub struct MemoryStore {
    gcra: Sharded<GcraSlot>,
    states: Sharded<StateSlot>,
    clock: Arc<dyn Clock>,
    hasher: foldhash::quality::RandomState,
    max_keys: usize,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("keys", &self.len())
            .field("max_keys", &self.max_keys)
            .field("shards", &self.gcra.shard_count())
            .field("clock", &self.clock)
            .finish_non_exhaustive()
    }
}

/// Options of a [`MemoryStore`].
#[derive(Debug, Clone)]
pub struct MemoryStoreBuilder {
    max_keys: usize,
    shards: Option<usize>,
    clock: Arc<dyn Clock>,
}

impl MemoryStoreBuilder {
    /// At most this many GCRA keys, and at most this many keys of the other algorithms
    /// (default 1,000,000). Idle keys are evicted first.
    #[must_use]
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys.max(1);
        self
    }

    /// The number of lock shards per table, rounded up to a power of two (default: 64, fewer
    /// for small `max_keys`).
    #[must_use]
    pub fn shards(mut self, shards: usize) -> Self {
        self.shards = Some(shards.clamp(1, 1 << 16).next_power_of_two());
        self
    }

    /// The clock (default: [`SystemClock`]).
    #[must_use]
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Builds the store.
    #[must_use]
    pub fn build(self) -> MemoryStore {
        let shards = self.shards.unwrap_or_else(|| (self.max_keys / 1024).next_power_of_two().clamp(1, 64));
        MemoryStore {
            gcra: Sharded::new(shards, self.max_keys),
            states: Sharded::new(shards, self.max_keys),
            clock: self.clock,
            hasher: foldhash::quality::RandomState::default(),
            max_keys: self.max_keys,
        }
    }
}

/// How many keys were evicted to keep the store within its bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Evictions {
    /// Keys dropped while idle: lossless, they decided exactly like absent keys.
    pub idle: u64,
    /// Keys dropped before they were idle because a shard was full of active keys: each of these
    /// keys starts over with full capacity.
    pub active: u64,
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::new()
    }
}

impl MemoryStore {
    /// A store with the default bound (1,000,000 keys) on the system clock.
    #[must_use]
    pub fn new() -> Self {
        MemoryStore::builder().build()
    }

    /// Options: bound, shards, clock.
    #[must_use]
    pub fn builder() -> MemoryStoreBuilder {
        MemoryStoreBuilder { max_keys: DEFAULT_MAX_KEYS, shards: None, clock: Arc::new(SystemClock::new()) }
    }

    /// The store's clock.
    #[must_use]
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// [`Store::check`] without a future: the same decision, computed on the calling thread.
    pub fn check_sync(&self, key: &str, limit: &Limit, cost: u64) -> Result<Decision, StoreError> {
        let now = self.clock.now_ns();
        let fingerprint = self.fingerprint(limit.algorithm(), key);
        if limit.algorithm() == Algorithm::Gcra {
            self.check_gcra(fingerprint, limit, cost, now)
        } else {
            self.check_state(fingerprint, limit, cost, now)
        }
    }

    /// [`Store::check_all`] without a future.
    pub fn check_all_sync(&self, checks: &[Check<'_>]) -> Result<Vec<Decision>, StoreError> {
        match checks {
            [] => Err(StoreError::NoChecks),
            [one] => Ok(vec![self.check_sync(one.key, one.limit, one.cost)?]),
            _ => self.check_many(checks),
        }
    }

    /// [`Store::reset`] without a future.
    pub fn reset_sync(&self, key: &str, limit: &Limit) {
        let fingerprint = self.fingerprint(limit.algorithm(), key);
        if limit.algorithm() == Algorithm::Gcra {
            self.gcra.remove(fingerprint);
        } else {
            self.states.remove(fingerprint);
        }
    }

    /// Keys currently tracked.
    #[must_use]
    pub fn len(&self) -> usize {
        self.gcra.len() + self.states.len()
    }

    /// Whether no key is tracked.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes the store holds: its tables' allocations and the states' heap memory.
    #[must_use]
    pub fn bytes(&self) -> usize {
        std::mem::size_of::<Self>() + self.gcra.bytes() + self.states.bytes()
    }

    /// Keys evicted so far to stay within the bound.
    #[must_use]
    pub fn evictions(&self) -> Evictions {
        let (gcra_idle, gcra_active) = self.gcra.evictions();
        let (idle, active) = self.states.evictions();
        Evictions { idle: gcra_idle + idle, active: gcra_active + active }
    }

    /// The bound on keys per table.
    #[must_use]
    pub fn max_keys(&self) -> usize {
        self.max_keys
    }

    fn fingerprint(&self, algorithm: Algorithm, key: &str) -> u64 {
        use std::hash::BuildHasher;
        self.hasher.hash_one((algorithm as u8, key))
    }

    fn check_gcra(&self, fingerprint: u64, limit: &Limit, cost: u64, now: u64) -> Result<Decision, StoreError> {
        let index = self.gcra.shard_of(fingerprint);
        if let Some(slot) = self.gcra.read(index).slots.find(fingerprint, |s| s.fingerprint == fingerprint) {
            return Ok(decide_gcra(&slot.tat, now, limit, cost)?);
        }
        // A key with no slot is idle: only an admission that consumes needs one.
        let (decision, next) = Gcra::step(0, now, limit, cost)?;
        let Some(tat) = next else { return Ok(decision) };
        let mut shard = self.gcra.write(index);
        if let Some(slot) = shard.slots.find(fingerprint, |s| s.fingerprint == fingerprint) {
            // Another thread inserted it meanwhile: decide against its state instead.
            return Ok(decide_gcra(&slot.tat, now, limit, cost)?);
        }
        self.gcra.insert(&mut shard, GcraSlot::new(fingerprint, tat), now);
        Ok(decision)
    }

    fn check_state(&self, fingerprint: u64, limit: &Limit, cost: u64, now: u64) -> Result<Decision, StoreError> {
        let mut guard = self.states.write(self.states.shard_of(fingerprint));
        let Shard { slots, heap_bytes } = &mut *guard;
        if let Some(slot) = slots.find_mut(fingerprint, |s| s.fingerprint == fingerprint) {
            let before = slot.state.heap_bytes();
            let decision = slot.state.check(now, limit, cost)?;
            if decision.allowed && cost > 0 {
                slot.idle_at = slot.state.idle_at(limit);
                *heap_bytes = *heap_bytes + slot.state.heap_bytes() - before;
            }
            return Ok(decision);
        }
        let mut state = State::idle(limit);
        let decision = state.check(now, limit, cost)?;
        if decision.allowed && cost > 0 {
            self.states.insert(&mut guard, StateSlot::new(fingerprint, state, limit), now);
        }
        Ok(decision)
    }
}

impl Store for MemoryStore {
    async fn check(&self, key: &str, limit: &Limit, cost: u64) -> Result<Decision, StoreError> {
        self.check_sync(key, limit, cost)
    }

    async fn check_all(&self, checks: &[Check<'_>]) -> Result<Vec<Decision>, StoreError> {
        self.check_all_sync(checks)
    }

    async fn reset(&self, key: &str, limit: &Limit) -> Result<(), StoreError> {
        self.reset_sync(key, limit);
        Ok(())
    }
}
