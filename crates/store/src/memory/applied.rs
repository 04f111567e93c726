//! What a memory store acting as a [`Remote`](crate::Remote) remembers of the charges it applied:
//! per key, a marker as the Redis script's (a hash: per sending node the highest running total of
//! its charges applied, and the instants of the key's latest reset and refund), so that a charge
//! delivered twice counts once, and what a node knew of the key from before a reset or refund is
//! not given back to it.
//! A marker lives [`CHARGES_REMEMBERED`](crate::remote::CHARGES_REMEMBERED) after the latest
//! charge it records (longer than a node sends a charge again, whatever the key's state meanwhile:
//! a charge sent again to a key busy again would count again), a stamp as long as a node's view can
//! matter, the whole marker expiring at once as a Redis key does. The map holds at most as many
//! markers as the store holds keys: past that, expired markers go, and if none has, a charge is not
//! remembered (applied again if sent again: an under-grant, never an over-grant).

use std::collections::HashMap;
use std::sync::Mutex;

/// The node ids whose "total" is the instant of the key's latest reset and refund (the Redis
/// marker's `reset` and `refunded` fields).
const RESET: u64 = u64::MAX;
const REFUNDED: u64 = u64::MAX - 1;

/// One key's marker, as the Redis script's hash: what it records, and until when (the whole
/// marker expires at once, as a Redis key does).
struct Marker {
    until: u64,
    /// Node → the highest total applied from it (and the stamps, under their ids).
    fields: Vec<(u64, u64)>,
}

pub(crate) struct Applied {
    /// Key fingerprint → its marker.
    map: Mutex<HashMap<u64, Marker>>,
    cap: usize,
}

impl Applied {
    pub(crate) fn new(cap: usize) -> Self {
        Applied { map: Mutex::new(HashMap::new()), cap }
    }

    /// The highest total applied to `key` from `node` and still remembered at `now` (0: none).
    pub(crate) fn highest(&self, key: u64, node: u64, now: u64) -> u64 {
        let map = self.map.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let marker = map.get(&key).filter(|m| m.until > now);
        marker.and_then(|m| m.fields.iter().find(|(n, _)| *n == node)).map_or(0, |(_, total)| *total)
    }

    /// `node`'s charges to `key` up to `total` were applied; remember the key's marker until `until`
    /// at least (never shortened, as the script's `PEXPIRE` only lengthens it).
    pub(crate) fn remember(&self, key: u64, node: u64, total: u64, until: u64, now: u64) {
        let mut map = self.map.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if map.len() >= self.cap && !map.contains_key(&key) {
            map.retain(|_, m| m.until > now);
            if map.len() >= self.cap {
                return;
            }
        }
        let marker = map.entry(key).or_insert(Marker { until: 0, fields: Vec::new() });
        if marker.until <= now {
            *marker = Marker { until: 0, fields: Vec::new() };
        }
        match marker.fields.iter_mut().find(|(n, _)| *n == node) {
            Some((_, highest)) => *highest = (*highest).max(total),
            None => marker.fields.push((node, total)),
        }
        marker.until = marker.until.max(until);
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
        map.remove(&key);
    }
}
