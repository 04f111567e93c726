//! The sharded, bounded hash table under the memory store.
//!
//! Keys are not stored: a slot holds the key's 64-bit fingerprint (a randomly seeded hash of the
//! algorithm and the key) next to its state, which keeps a GCRA slot at 16 bytes. Two keys can
//! only share a slot if their fingerprints collide (about 1 in 3.7 * 10^7 for a full million keys,
//! and not predictable without the process's random seed); they would then share one budget,
//! which under-grants them and never over-grants.
//!
//! The table is split in shards, each behind its own lock and padded to its own cache lines.
//! The shard is chosen from bits 32..38 of the fingerprint; the table inside uses the low bits for
//! the bucket and the top 7 for its control bytes, so the three never overlap.
//!
//! Each shard holds at most `ceil(max_keys / shards)` slots, so the table never holds more than
//! `max_keys` (in practice about 15/16 of it, as shards fill unevenly) and each shard's allocation
//! is bounded. A full shard first drops every idle slot (a state back at full capacity decides
//! exactly like no state: nothing is lost); only if none is idle does it drop the eighth of its
//! slots that will become idle soonest, and counts them.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use hashbrown::HashTable;

/// What the table needs from a slot.
pub(super) trait Slot {
    /// The key's fingerprint.
    fn fingerprint(&self) -> u64;
    /// The instant from which the state decides exactly like an idle one.
    fn idle_at(&self) -> u64;
    /// Bytes the state holds on the heap.
    fn heap_bytes(&self) -> usize;
}

/// One shard: its slots and the heap bytes their states hold.
pub(super) struct Shard<S> {
    pub(super) slots: HashTable<S>,
    pub(super) heap_bytes: usize,
}

/// Keeps each shard's lock on its own cache lines (128 bytes: adjacent-line prefetching pairs them).
#[repr(align(128))]
struct Padded<T>(T);

/// A table of slots split into shards.
pub(super) struct Sharded<S> {
    shards: Box<[Padded<RwLock<Shard<S>>>]>,
    mask: usize,
    shard_capacity: usize,
    keys: AtomicUsize,
    evicted_idle: AtomicU64,
    evicted_active: AtomicU64,
}

impl<S: Slot> Sharded<S> {
    /// `shards` (a power of two) shards holding at most `max_keys` slots in all.
    pub(super) fn new(shards: usize, max_keys: usize) -> Self {
        debug_assert!(shards.is_power_of_two());
        let shards_vec: Vec<_> =
            (0..shards).map(|_| Padded(RwLock::new(Shard { slots: HashTable::new(), heap_bytes: 0 }))).collect();
        Sharded {
            shards: shards_vec.into_boxed_slice(),
            mask: shards - 1,
            shard_capacity: max_keys.div_ceil(shards).max(1),
            keys: AtomicUsize::new(0),
            evicted_idle: AtomicU64::new(0),
            evicted_active: AtomicU64::new(0),
        }
    }

    /// The shard holding `fingerprint`.
    pub(super) fn shard_of(&self, fingerprint: u64) -> usize {
        // Truncation intended: bits 32.. of the fingerprint pick the shard.
        #[allow(clippy::cast_possible_truncation)]
        let bits = (fingerprint >> 32) as usize;
        bits & self.mask
    }

    pub(super) fn read(&self, shard: usize) -> RwLockReadGuard<'_, Shard<S>> {
        // A panic never happens while a shard is locked; if one did, its data is still consistent.
        self.shards[shard].0.read().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn write(&self, shard: usize) -> RwLockWriteGuard<'_, Shard<S>> {
        self.shards[shard].0.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// Inserts a new slot into `shard` (locked for write), making room first if it is full.
    pub(super) fn insert(&self, shard: &mut Shard<S>, slot: S, now: u64) {
        if shard.slots.len() >= self.shard_capacity {
            self.make_room(shard, now);
        }
        self.keys.fetch_add(1, Ordering::Relaxed);
        shard.heap_bytes += slot.heap_bytes();
        shard.slots.insert_unique(slot.fingerprint(), slot, S::fingerprint);
    }

    /// Drops idle slots; if none was idle, the soonest-idle eighth of the shard.
    fn make_room(&self, shard: &mut Shard<S>, now: u64) {
        let idle = self.drop_idle_by(shard, now);
        self.evicted_idle.fetch_add(idle as u64, Ordering::Relaxed);
        if shard.slots.len() < self.shard_capacity {
            return;
        }
        let mut idle_ats: Vec<u64> = shard.slots.iter().map(S::idle_at).collect();
        let victims = idle_ats.len().div_ceil(8);
        let (_, &mut threshold, _) = idle_ats.select_nth_unstable(victims - 1);
        let active = self.drop_idle_by(shard, threshold);
        self.evicted_active.fetch_add(active as u64, Ordering::Relaxed);
    }

    /// Drops every slot idle by `instant`, keeping the accounting right; returns how many.
    fn drop_idle_by(&self, shard: &mut Shard<S>, instant: u64) -> usize {
        let before = shard.slots.len();
        let mut freed = 0;
        shard.slots.retain(|slot| {
            let keep = slot.idle_at() > instant;
            if !keep {
                freed += slot.heap_bytes();
            }
            keep
        });
        shard.heap_bytes -= freed;
        let dropped = before - shard.slots.len();
        self.keys.fetch_sub(dropped, Ordering::Relaxed);
        dropped
    }

    /// Removes the slot of `fingerprint`, if any.
    pub(super) fn remove(&self, fingerprint: u64) {
        let mut shard = self.write(self.shard_of(fingerprint));
        if let Ok(entry) = shard.slots.find_entry(fingerprint, |s| s.fingerprint() == fingerprint) {
            let (slot, _) = entry.remove();
            shard.heap_bytes -= slot.heap_bytes();
            self.keys.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// The number of slots.
    pub(super) fn len(&self) -> usize {
        self.keys.load(Ordering::Relaxed)
    }

    /// Bytes held: the shards themselves, their tables' allocations and the states' heap bytes.
    pub(super) fn bytes(&self) -> usize {
        let own = std::mem::size_of_val(&*self.shards);
        own + (0..self.shards.len())
            .map(|i| {
                let shard = self.read(i);
                shard.slots.allocation_size() + shard.heap_bytes
            })
            .sum::<usize>()
    }

    /// Slots dropped while idle (lossless) and while active (their keys start over).
    pub(super) fn evictions(&self) -> (u64, u64) {
        (self.evicted_idle.load(Ordering::Relaxed), self.evicted_active.load(Ordering::Relaxed))
    }

    /// The number of shards.
    pub(super) fn shard_count(&self) -> usize {
        self.shards.len()
    }
}
