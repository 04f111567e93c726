//! The memory store's holds ([`Store::hold`](crate::Store::hold)): per (scope, key), the instant
//! its hold ends, in a table of 16-byte slots bounded as the states' (see `table`: an expired hold
//! is idle, dropped first when room is needed; a full shard of live holds drops those ending
//! soonest, counted as live evictions). An empty table costs a check one atomic read.

use super::MemoryStore;
use crate::Check;
use crate::table::Slot;

/// One hold: whose (the fingerprint of its scope and key), and until when.
pub(super) struct HoldSlot {
    fingerprint: u64,
    until: u64,
}

impl Slot for HoldSlot {
    fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    fn idle_at(&self) -> u64 {
        self.until
    }

    fn heap_bytes(&self) -> usize {
        0
    }
}

impl MemoryStore {
    /// The fingerprint of the hold of `key` in `scope` (any algorithm).
    fn hold_fingerprint(&self, scope: &str, key: &[u8]) -> u64 {
        use std::hash::BuildHasher;
        self.hasher.hash_one((scope, key))
    }

    /// [`Store::hold`](crate::Store::hold) without a future: `key` in `scope` held until now +
    /// `hold_ns` (at most [`MAX_HOLD_NS`](crate::MAX_HOLD_NS)), or later if it already is.
    pub fn hold_sync(&self, scope: &str, key: &[u8], hold_ns: u64) {
        let now = self.clock.now_ns();
        let until = now.saturating_add(hold_ns.min(crate::MAX_HOLD_NS));
        let fingerprint = self.hold_fingerprint(scope, key);
        let mut shard = self.holds.write(self.holds.shard_of(fingerprint));
        match shard.slots.find_mut(fingerprint, |s| s.fingerprint == fingerprint) {
            Some(slot) => slot.until = slot.until.max(until),
            None => self.holds.insert(&mut shard, HoldSlot { fingerprint, until }, now, &[]),
        }
    }

    /// The ns left of the live hold on `check`'s scope and key at `now`, if it asks for holds
    /// and one is in force.
    #[inline]
    pub(super) fn hold_left(&self, check: &Check<'_>, now: u64) -> Option<u64> {
        if !check.hold || self.holds.len() == 0 {
            return None;
        }
        self.hold_left_in_table(check, now)
    }

    /// [`hold_left`](Self::hold_left) once the table may hold one.
    #[inline(never)]
    fn hold_left_in_table(&self, check: &Check<'_>, now: u64) -> Option<u64> {
        let fingerprint = self.hold_fingerprint(check.scope, check.key);
        let shard = self.holds.read(self.holds.shard_of(fingerprint));
        let until = shard.slots.find(fingerprint, |s| s.fingerprint == fingerprint)?.until;
        until.checked_sub(now).filter(|&left| left > 0)
    }

    /// [`Store::held`](crate::Store::held) without a future: the table read, no state.
    pub fn held_sync(&self, checks: &[Check<'_>]) -> Vec<Option<u64>> {
        let now = self.clock.now_ns();
        checks.iter().map(|c| self.hold_left(&Check { hold: true, ..*c }, now)).collect()
    }

    /// Drops the hold of `key` in `scope`, if any.
    pub(super) fn unhold(&self, scope: &str, key: &[u8]) {
        self.holds.remove(self.hold_fingerprint(scope, key));
    }

    /// Holds in the table (some may have ended).
    #[must_use]
    pub fn holds(&self) -> usize {
        self.holds.len()
    }
}
