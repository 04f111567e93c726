//! What a memory store acting as a [`Remote`](crate::Remote) remembers of the charges it applied:
//! per key and sending node, the highest sequence, so that a charge delivered twice is applied
//! once (as the Redis script's marker key). An entry lives until the key's state is idle again
//! (after that, applying the charge again changes no decision), and the map holds at most as many
//! entries as the store holds keys: past that, expired entries go, and if none has, a charge is
//! not remembered (applied again if sent again: an under-grant, never an over-grant). The instants
//! of the key's latest reset and refund are remembered too, so that what a node knew of the key
//! from before them is not given back to it.

use std::collections::HashMap;
use std::sync::Mutex;

/// The node ids whose "sequence" is the instant of the key's latest reset and refund (the Redis
/// marker's `reset` and `refunded` fields).
const RESET: u64 = u64::MAX;
const REFUNDED: u64 = u64::MAX - 1;

pub(crate) struct Applied {
    /// (key fingerprint, node) → (highest sequence applied, expiry in ns).
    map: Mutex<HashMap<(u64, u64), (u64, u64)>>,
    cap: usize,
}

impl Applied {
    pub(crate) fn new(cap: usize) -> Self {
        Applied { map: Mutex::new(HashMap::new()), cap }
    }

    /// The highest sequence applied to `key` from `node` and still remembered at `now` (0: none).
    pub(crate) fn highest(&self, key: u64, node: u64, now: u64) -> u64 {
        let map = self.map.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        map.get(&(key, node)).filter(|(_, until)| *until > now).map_or(0, |(seq, _)| *seq)
    }

    /// `seq` from `node` was applied to `key`; remember it until `until`.
    pub(crate) fn remember(&self, key: u64, node: u64, seq: u64, until: u64, now: u64) {
        let mut map = self.map.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if map.len() >= self.cap && !map.contains_key(&(key, node)) {
            map.retain(|_, (_, expiry)| *expiry > now);
            if map.len() >= self.cap {
                return;
            }
        }
        let entry = map.entry((key, node)).or_insert((0, 0));
        if entry.1 <= now {
            *entry = (0, 0);
        }
        *entry = (entry.0.max(seq), entry.1.max(until));
    }

    /// `key` was reset at `now`: until `until`, what a node knew of it from before is not given
    /// back to it.
    pub(crate) fn reset(&self, key: u64, until: u64, now: u64) {
        self.remember(key, RESET, now, until, now);
    }

    /// `key` was refunded at `now` (as [`reset`](Self::reset)).
    pub(crate) fn refunded(&self, key: u64, until: u64, now: u64) {
        self.remember(key, REFUNDED, now, until, now);
    }

    /// Whether `key` was reset or refunded at or after `since`: what a node knew of it at `since`
    /// is out of date.
    pub(crate) fn changed_since(&self, key: u64, since: u64, now: u64) -> bool {
        let since = since.max(1);
        self.highest(key, RESET, now) >= since || self.highest(key, REFUNDED, now) >= since
    }

    /// Forgets `key` entirely (a store that lost it).
    pub(crate) fn forget(&self, key: u64) {
        let mut map = self.map.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        map.retain(|(k, _), _| *k != key);
    }
}
