//! The two kinds of slot the memory store keeps, and GCRA's compare-and-swap step.

use std::sync::atomic::{AtomicU64, Ordering};

use tollgate_core::{Decision, Error, Limit, State, algorithm::Gcra};

use crate::table::Slot;

/// A GCRA key: 24 bytes.
pub(super) struct GcraSlot {
    pub(super) fingerprint: u64,
    pub(super) tat: AtomicU64,
    /// The emission interval `tat` is scheduled in. Changed only under the shard's write lock,
    /// so a decision under its read lock sees it fixed.
    pub(super) interval: AtomicU64,
}

impl GcraSlot {
    pub(super) fn new(fingerprint: u64, gcra: Gcra) -> Self {
        GcraSlot { fingerprint, tat: AtomicU64::new(gcra.tat), interval: AtomicU64::new(gcra.interval) }
    }

    /// The slot's state.
    pub(super) fn gcra(&self) -> Gcra {
        Gcra { tat: self.tat.load(Ordering::Acquire), interval: self.interval.load(Ordering::Acquire) }
    }

    /// Whether its TAT is scheduled in `limit`'s emission interval (the lock-free step's case).
    #[inline]
    pub(super) fn at_rate_of(&self, limit: &Limit) -> bool {
        let interval = self.interval.load(Ordering::Acquire);
        interval == 0 || interval == limit.emission_interval_ns()
    }

    /// Stores `gcra` (under the shard's write lock).
    pub(super) fn set(&self, gcra: Gcra) {
        self.tat.store(gcra.tat, Ordering::Release);
        self.interval.store(gcra.interval, Ordering::Release);
    }
}

impl Slot for GcraSlot {
    fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    fn idle_at(&self) -> u64 {
        // The TAT is the instant the key is back to full capacity.
        self.tat.load(Ordering::Relaxed)
    }

    fn heap_bytes(&self) -> usize {
        0
    }
}

/// A key of any other algorithm, with when it becomes idle (computed under the limit of the
/// last admission, since the state alone does not know its limit).
pub(super) struct StateSlot {
    pub(super) fingerprint: u64,
    pub(super) idle_at: u64,
    pub(super) state: State,
}

impl StateSlot {
    pub(super) fn new(fingerprint: u64, state: State, limit: &Limit) -> Self {
        StateSlot { fingerprint, idle_at: state.idle_at(limit), state }
    }
}

impl Slot for StateSlot {
    fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    fn idle_at(&self) -> u64 {
        self.idle_at
    }

    fn heap_bytes(&self) -> usize {
        self.state.heap_bytes()
    }
}

/// One GCRA decision on a shared TAT scheduled in `limit`'s emission interval (see
/// [`GcraSlot::at_rate_of`]): read, decide, and publish the new TAT only if no other thread changed
/// it meanwhile (otherwise decide again on the newer TAT). Denials and peeks write nothing.
#[inline]
pub(super) fn decide_gcra(tat: &AtomicU64, now: u64, limit: &Limit, cost: u64) -> Result<Decision, Error> {
    let mut current = tat.load(Ordering::Acquire);
    loop {
        let (decision, next) = Gcra::step(current, now, limit, cost)?;
        let Some(next) = next else { return Ok(decision) };
        match tat.compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return Ok(decision),
            Err(actual) => current = actual,
        }
    }
}
