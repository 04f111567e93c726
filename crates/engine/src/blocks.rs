//! Keys under mitigation until an instant (a rule's `timeout`, or the end of a denial for a rule
//! mitigating more than it counts): bounded in entries, sharded so that no lock is shared by every
//! request, and skipped entirely until a first key is blocked.
//!
//! A full shard drops its expired entries, then the eighth of its entries that expire soonest
//! (counted: their mitigation ends early; the limit itself still applies to them).

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::sharded::{SHARDS, Sharded};

/// The default bound on blocked keys.
pub const DEFAULT_MAX_BLOCKS: usize = 100_000;

/// Blocked (rule, key) pairs and when their mitigation ends.
#[derive(Debug)]
pub(crate) struct Blocks {
    table: Sharded<u64>,
    per_shard: usize,
    /// Entries held (an upper bound while entries expire): 0 lets requests skip every lookup.
    held: AtomicUsize,
}

impl Blocks {
    pub(crate) fn new(max: usize) -> Self {
        Blocks { table: Sharded::new(), per_shard: max.div_ceil(SHARDS).max(1), held: AtomicUsize::new(0) }
    }

    /// Whether any key may be blocked (false: no lookup is needed).
    pub(crate) fn any(&self) -> bool {
        self.held.load(Ordering::Acquire) > 0
    }

    /// Until when `key` is mitigated under `rule`, if it is at `now`.
    pub(crate) fn until(&self, rule: &str, key: &[u8], now: u64) -> Option<u64> {
        let (index, fingerprint) = self.table.locate(rule, key);
        self.table.shard(index).get(&fingerprint).copied().filter(|&until| until > now)
    }

    /// Mitigates `key` under `rule` until `until` (or later, if it already is). Returns how many
    /// other entries were dropped before they expired to make room.
    pub(crate) fn block(&self, rule: &str, key: &[u8], until: u64, now: u64) -> u64 {
        let mut dropped = 0;
        let (index, fingerprint) = self.table.locate(rule, key);
        let mut shard = self.table.shard(index);
        if !shard.contains_key(&fingerprint) && shard.len() >= self.per_shard {
            let before = shard.len();
            shard.retain(|_, until| *until > now);
            if shard.len() >= self.per_shard {
                let mut ends: Vec<u64> = shard.values().copied().collect();
                let victims = ends.len().div_ceil(8);
                let (_, &mut threshold, _) = ends.select_nth_unstable(victims - 1);
                let mut left = victims;
                shard.retain(|_, until| {
                    let drop = *until <= threshold && left > 0;
                    left -= usize::from(drop);
                    !drop
                });
                dropped = victims as u64;
            }
            self.held.fetch_sub(before - shard.len(), Ordering::AcqRel);
        }
        let entry = shard.entry(fingerprint).or_insert_with(|| {
            self.held.fetch_add(1, Ordering::AcqRel);
            0
        });
        *entry = (*entry).max(until);
        dropped
    }

    /// Blocked keys now (entries held; some may have expired).
    pub(crate) fn len(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_expire_and_stay_bounded() {
        let blocks = Blocks::new(160);
        assert!(!blocks.any());
        blocks.block("r", b"k", 100, 0);
        assert!(blocks.any());
        assert_eq!(blocks.until("r", b"k", 50), Some(100));
        assert_eq!(blocks.until("r", b"k", 100), None, "expired");
        assert_eq!(blocks.until("other", b"k", 50), None, "per rule");
        let dropped: u64 = (0..10_000u32).map(|i| blocks.block("r", &i.to_le_bytes(), 1_000 + u64::from(i), 10)).sum();
        assert!(blocks.len() <= 160, "{}", blocks.len());
        assert!(dropped > 9_000, "{dropped}");
        assert_eq!(blocks.until("r", &9_999u32.to_le_bytes(), 500), Some(10_999), "the latest block is kept");
    }
}
