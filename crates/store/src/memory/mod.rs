//! [`MemoryStore`]: the embedded in-memory store, tollgate's default.
//!
//! GCRA keys live in a table of 24-byte slots (fingerprint, TAT, the emission interval the TAT is
//! scheduled in) whose TAT is an `AtomicU64` updated by a compare-and-swap loop under a shared
//! (read) lock: checks of any keys never wait for each other. A key checked under another rate
//! (a changed limit) is rescheduled under the shard's write lock, which no such loop holds. The six other algorithms keep their `State` in a table whose shard lock is
//! held for the few instructions of one step. Both tables are bounded in keys and in bytes (see
//! [`table`]); both are locked for write, in a fixed order, only to insert, evict, or check
//! several keys at once. Holds ([`Store::hold`]) live in a third table of the same kind (see
//! `holds`).

mod applied;
mod builder;
mod carry;
mod holds;
mod many;
mod remote;
mod reservations;
mod slots;

pub use builder::MemoryStoreBuilder;
pub use reservations::MAX_OPEN_RESERVATIONS;

use std::sync::Arc;

use tollgate_core::{Algorithm, Clock, Decision, Limit, State, algorithm::Gcra};

use crate::table::SlotTable;
use crate::{Check, Refund, Reserved, Store, StoreError, held_decision};
use slots::{GcraSlot, StateSlot, decide_gcra};

/// The default bound on keys per table (GCRA keys, and keys of the other algorithms).
pub const DEFAULT_MAX_KEYS: usize = 1_000_000;

/// The default bound on the bytes the store holds (both tables and every state): 512 MiB.
pub const DEFAULT_MAX_MEMORY: usize = 512 << 20;

/// An in-memory [`Store`]: thread-safe, bounded, with an injectable clock.
///
/// Cheap to share: wrap it in an [`Arc`]. Besides the async [`Store`] methods it answers
/// synchronously with [`check_sync`](Self::check_sync) (no runtime needed, nothing awaits).
pub struct MemoryStore {
    gcra: SlotTable<GcraSlot>,
    states: SlotTable<StateSlot>,
    /// The holds (see `holds`); boxed, as only checks asking for holds read it.
    holds: Box<SlotTable<holds::HoldSlot>>,
    clock: Arc<dyn Clock>,
    hasher: foldhash::quality::RandomState,
    max_keys: usize,
    max_memory: usize,
    /// Charges applied as a remote, per key and node (see `applied`).
    applied: applied::Applied,
    /// Whether this store has decided as a [`Remote`](crate::Remote) (for a node's failure
    /// policy, in tests and simulations): only then are its refunds remembered in `applied`.
    as_remote: std::sync::atomic::AtomicBool,
    /// The reservations kept (see `reservations`).
    reservations: reservations::Reservations,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("keys", &self.len())
            .field("max_keys", &self.max_keys)
            .field("max_memory", &self.max_memory)
            .field("shards", &self.gcra.shard_count())
            .field("clock", &self.clock)
            .finish_non_exhaustive()
    }
}

/// How many keys were evicted to keep the store within its bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Evictions {
    /// Keys dropped while idle: lossless, they decided exactly like absent keys.
    pub idle: u64,
    /// Keys dropped before they were idle because a shard was full of live keys: each of these
    /// keys starts over with full capacity (each one can over-grant).
    pub live: u64,
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
        MemoryStoreBuilder::new()
    }

    /// The store's clock.
    #[must_use]
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// [`Store::check`] without a future: the same decision, computed on the calling thread.
    #[inline]
    pub fn check_sync(&self, key: &[u8], limit: &Limit, cost: u64) -> Result<Decision, StoreError> {
        // An ad-hoc check asks for no hold: its state alone decides.
        Ok(self.decide_state(Check::new(key, limit, cost), self.clock.now_ns())?)
    }

    /// [`Store::check_one`] (in any scope) without a future.
    #[inline]
    pub fn check_one_sync(&self, check: Check<'_>) -> Result<Decision, StoreError> {
        self.check_one_at(check, self.clock.now_ns())
    }

    #[inline]
    fn check_one_at(&self, check: Check<'_>, now: u64) -> Result<Decision, StoreError> {
        Ok(self.decide_one(check, now)?.0)
    }

    /// One check at `now`, and whether a live hold denied it.
    #[inline]
    fn decide_one(&self, check: Check<'_>, now: u64) -> Result<(Decision, bool), StoreError> {
        if let Some(left) = self.hold_left(&check, now) {
            let peek = self.decide_state(Check { cost: 0, ..check }, now)?;
            return Ok((held_decision(&peek, left), true));
        }
        Ok((self.decide_state(check, now)?, false))
    }

    /// One check at `now`, by its state alone. (The core's error, made a [`StoreError`] by the
    /// caller: a check's decision is moved once, not rewrapped at every step.)
    #[inline]
    fn decide_state(&self, check: Check<'_>, now: u64) -> Result<Decision, tollgate_core::Error> {
        let fingerprint = self.fingerprint(&check);
        if check.limit.algorithm() == Algorithm::Gcra {
            self.check_gcra(fingerprint, check.limit, check.cost, now)
        } else {
            self.check_state(fingerprint, check.limit, check.cost, now)
        }
    }

    /// [`Store::check_all`] without a future.
    pub fn check_all_sync(&self, checks: &[Check<'_>]) -> Result<Vec<Decision>, StoreError> {
        Ok(self.reserve_sync(checks)?.decisions)
    }

    /// [`Store::reserve`] without a future.
    pub fn reserve_sync(&self, checks: &[Check<'_>]) -> Result<Reserved, StoreError> {
        match checks {
            [] => Err(StoreError::NoChecks),
            [one] => {
                let at = self.clock.now_ns();
                let (decision, held) = self.decide_one(*one, at)?;
                Ok(Reserved { held: if held { vec![0] } else { Vec::new() }, ..Reserved::at(vec![decision], at) })
            }
            _ => {
                let reply = self.check_many(checks, &[], false)?;
                Ok(Reserved { held: reply.held, ..Reserved::at(reply.decisions, reply.now_ns) })
            }
        }
    }

    /// [`Store::charge`], on this thread: each check's cost charged at now, whatever its limit.
    pub fn charge_sync(&self, checks: &[Check<'_>]) -> Result<(), StoreError> {
        let now = self.clock.now_ns();
        let charges: Vec<(crate::Charge<'_>, u64)> = checks.iter().map(|c| (crate::Charge::new(*c, 0), now)).collect();
        self.check_many(&[], &charges, false).map(drop)
    }

    /// [`Store::refund`] without a future.
    pub fn refund_sync(&self, refunds: &[Refund<'_>]) {
        let now = self.clock.now_ns();
        let remote = self.as_remote.load(std::sync::atomic::Ordering::Relaxed);
        for refund in refunds {
            let Refund { check, at, decision } = *refund;
            let fingerprint = self.fingerprint(&check);
            let refunded = if check.limit.algorithm() == Algorithm::Gcra {
                let shard = self.gcra.read(self.gcra.shard_of(fingerprint));
                shard.slots.find(fingerprint, |s| s.fingerprint == fingerprint).is_some_and(|slot| {
                    // (A slot at another rate is refunded nothing: see `Gcra::refund`.)
                    let mut gcra = slot.gcra();
                    let seen = gcra.tat;
                    tollgate_core::RateState::refund(&mut gcra, at, &decision, check.limit, check.cost);
                    // Only if no other admission moved the schedule meanwhile.
                    gcra.tat != seen
                        && slot
                            .tat
                            .compare_exchange(
                                seen,
                                gcra.tat,
                                std::sync::atomic::Ordering::AcqRel,
                                std::sync::atomic::Ordering::Acquire,
                            )
                            .is_ok()
                })
            } else {
                let mut guard = self.states.write(self.states.shard_of(fingerprint));
                let Some(slot) = guard.slots.find_mut(fingerprint, |s| s.fingerprint == fingerprint) else { continue };
                let before = (slot.state.heap_bytes(), remote.then(|| slot.state.clone()));
                slot.state.refund(at, &decision, check.limit, check.cost);
                slot.idle_at = slot.state.idle_at(check.limit);
                let refunded = before.1.is_some_and(|state| state != slot.state);
                let after = slot.state.heap_bytes();
                guard.heap_bytes -= before.0;
                self.states.grew(&mut guard, after, now, &[fingerprint]);
                refunded
            };
            if remote && refunded {
                // A node's view of the key from before this refund must not undo it.
                self.applied.refunded(fingerprint, now.saturating_add(view_horizon(check.limit)), now);
            }
        }
    }

    /// [`Store::reset`] without a future.
    pub fn reset_sync(&self, scope: &str, key: &[u8], limit: &Limit) {
        self.unhold(scope, key);
        let fingerprint = self.remove(scope, key, limit);
        let now = self.clock.now_ns();
        self.applied.reset(fingerprint, now.saturating_add(view_horizon(limit)), now);
    }

    /// Drops a key as a remote store that lost it would (restarted empty, expired early): its
    /// state and what it remembered of nodes' charges, no reset recorded. For tests of the failure
    /// policy (`testkit::faults`).
    #[doc(hidden)]
    pub fn lose_sync(&self, scope: &str, key: &[u8], limit: &Limit) {
        let fingerprint = self.remove(scope, key, limit);
        self.applied.forget(fingerprint);
    }

    /// Drops a key's state; its fingerprint.
    fn remove(&self, scope: &str, key: &[u8], limit: &Limit) -> u64 {
        let fingerprint = self.fingerprint(&Check::new(key, limit, 0).scoped(scope));
        if limit.algorithm() == Algorithm::Gcra {
            self.gcra.remove(fingerprint);
        } else {
            self.states.remove(fingerprint);
        }
        fingerprint
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
        std::mem::size_of::<Self>() + self.gcra.bytes() + self.states.bytes() + self.holds.bytes()
    }

    /// Keys evicted so far to stay within the bound.
    #[must_use]
    pub fn evictions(&self) -> Evictions {
        let (gcra_idle, gcra_live) = self.gcra.evictions();
        let (idle, live) = self.states.evictions();
        Evictions { idle: gcra_idle + idle, live: gcra_live + live }
    }

    /// The bound on keys per table.
    #[must_use]
    pub fn max_keys(&self) -> usize {
        self.max_keys
    }

    /// The bound on bytes.
    #[must_use]
    pub fn max_memory(&self) -> usize {
        self.max_memory
    }

    /// The fingerprint of a check's state: its scope, algorithm and key, hashed in one pass (an
    /// empty scope, the ad-hoc checks' and the common case, costs nothing but its length).
    #[inline]
    fn fingerprint(&self, check: &Check<'_>) -> u64 {
        use std::hash::{BuildHasher, Hasher};
        let mut hasher = self.hasher.build_hasher();
        if !check.scope.is_empty() {
            hasher.write(check.scope.as_bytes());
        }
        // The scope's length keeps apart the (scope, key) pairs whose bytes run together.
        hasher.write_u64(((check.scope.len() as u64) << 8) | check.limit.algorithm() as u64);
        hasher.write(check.key);
        hasher.finish()
    }

    #[inline]
    fn check_gcra(
        &self,
        fingerprint: u64,
        limit: &Limit,
        cost: u64,
        now: u64,
    ) -> Result<Decision, tollgate_core::Error> {
        let index = self.gcra.shard_of(fingerprint);
        if let Some(slot) = self.gcra.read(index).slots.find(fingerprint, |s| s.fingerprint == fingerprint)
            && slot.at_rate_of(limit)
        {
            return decide_gcra(&slot.tat, now, limit, cost);
        }
        self.check_gcra_locked(fingerprint, index, limit, cost, now)
    }

    /// [`check_gcra`](Self::check_gcra) for a key with no slot, or one at another rate: under the
    /// shard's write lock.
    #[cold]
    #[inline(never)]
    fn check_gcra_locked(
        &self,
        fingerprint: u64,
        index: usize,
        limit: &Limit,
        cost: u64,
        now: u64,
    ) -> Result<Decision, tollgate_core::Error> {
        // A key with no slot is idle: only an admission that consumes needs one.
        let mut idle = Gcra::default();
        let decision = tollgate_core::RateState::check(&mut idle, now, limit, cost)?;
        let mut shard = self.gcra.write(index);
        if let Some(slot) = shard.slots.find(fingerprint, |s| s.fingerprint == fingerprint) {
            // Inserted by another thread meanwhile, or scheduled at another rate (a changed
            // limit): decide on it under the write lock, which no lock-free step holds.
            let read = slot.gcra();
            let mut gcra = read;
            let decision = tollgate_core::RateState::check(&mut gcra, now, limit, cost)?;
            // A refusal under another rate rewrote it in the new one (see the core's `check`).
            if gcra != read {
                slot.set(gcra);
            }
            return Ok(decision);
        }
        if decision.allowed && cost > 0 {
            self.gcra.insert(&mut shard, GcraSlot::new(fingerprint, idle), now, &[]);
        }
        Ok(decision)
    }

    #[inline]
    fn check_state(
        &self,
        fingerprint: u64,
        limit: &Limit,
        cost: u64,
        now: u64,
    ) -> Result<Decision, tollgate_core::Error> {
        let mut guard = self.states.write(self.states.shard_of(fingerprint));
        if let Some(slot) = guard.slots.find_mut(fingerprint, |s| s.fingerprint == fingerprint) {
            let before = slot.state.heap_bytes();
            // A bucket's state (no heap) as read: a refusal under another rate rewrites it.
            let bucket = match &slot.state {
                State::TokenBucket(read) => Some(State::TokenBucket(*read)),
                State::LeakyBucket(read) => Some(State::LeakyBucket(*read)),
                _ => None,
            };
            let decision = slot.state.check(now, limit, cost)?;
            if decision.allowed && cost > 0 {
                slot.idle_at = slot.state.idle_at(limit);
                let after = slot.state.heap_bytes();
                guard.heap_bytes -= before;
                self.states.grew(&mut guard, after, now, &[fingerprint]);
            } else if bucket.is_some_and(|read| read != slot.state) {
                slot.idle_at = slot.state.idle_at(limit);
            }
            return Ok(decision);
        }
        self.check_state_new(&mut guard, fingerprint, limit, cost, now)
    }

    /// [`check_state`](Self::check_state) for a key with no slot (idle): a slot is inserted only
    /// for an admission that consumes.
    #[cold]
    #[inline(never)]
    fn check_state_new(
        &self,
        guard: &mut crate::table::Shard<StateSlot>,
        fingerprint: u64,
        limit: &Limit,
        cost: u64,
        now: u64,
    ) -> Result<Decision, tollgate_core::Error> {
        let mut state = State::idle(limit);
        let decision = state.check(now, limit, cost)?;
        if decision.allowed && cost > 0 {
            self.states.insert(guard, StateSlot::new(fingerprint, state, limit), now, &[]);
        }
        Ok(decision)
    }
}

impl Store for MemoryStore {
    async fn check(&self, key: &[u8], limit: &Limit, cost: u64) -> Result<Decision, StoreError> {
        self.check_sync(key, limit, cost)
    }

    async fn check_all(&self, checks: &[Check<'_>]) -> Result<Vec<Decision>, StoreError> {
        self.check_all_sync(checks)
    }

    async fn check_one(&self, check: Check<'_>) -> Result<Decision, StoreError> {
        self.check_one_sync(check)
    }

    async fn reserve(&self, checks: &[Check<'_>]) -> Result<Reserved, StoreError> {
        self.reserve_sync(checks)
    }

    async fn refund(&self, refunds: &[Refund<'_>]) -> Result<(), StoreError> {
        self.refund_sync(refunds);
        Ok(())
    }

    async fn charge(&self, checks: &[Check<'_>]) -> Result<(), StoreError> {
        self.charge_sync(checks)
    }

    async fn reserve_until(
        &self,
        checks: &[Check<'_>],
        ttl_ns: u64,
    ) -> Result<(Reserved, Option<crate::Reservation>), StoreError> {
        self.reserve_until_sync(checks, ttl_ns)
    }

    async fn settle(&self, id: &str, actual: u64) -> Result<crate::Settled, StoreError> {
        self.settle_sync(id, actual)
    }

    async fn reset(&self, scope: &str, key: &[u8], limit: &Limit) -> Result<(), StoreError> {
        self.reset_sync(scope, key, limit);
        Ok(())
    }

    async fn carry(&self, scope: &str, key: &[u8], from: &Limit, to: &Limit) -> Result<u64, StoreError> {
        self.carry_sync(scope, key, from, to)
    }

    async fn hold(&self, scope: &str, key: &[u8], hold_ns: u64) -> Result<(), StoreError> {
        self.hold_sync(scope, key, hold_ns);
        Ok(())
    }

    async fn held(&self, checks: &[Check<'_>]) -> Result<Vec<Option<u64>>, StoreError> {
        Ok(self.held_sync(checks))
    }

    fn decides_in_place(&self) -> bool {
        true
    }
}

/// How long a node's view of a key can matter after a reset or refund of it (as the Redis
/// script's marker stamps): as long as a full bucket or two windows, and a second.
fn view_horizon(limit: &Limit) -> u64 {
    limit.tolerance_ns().max(limit.period_ns().saturating_mul(2)).saturating_add(1_000_000_000)
}
