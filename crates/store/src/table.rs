//! The sharded, bounded hash table under the memory store and the failure policy's ledger.
//!
//! Keys are not stored: a slot holds the key's 64-bit fingerprint (a randomly seeded hash of the
//! scope, the algorithm and the key) next to its state, which keeps a GCRA slot at 24 bytes. Two
//! keys can only share a slot if their fingerprints collide (about 1 in 3.7 * 10^7 for a full
//! million keys, and not predictable without the process's random seed); they would then share
//! one budget, which under-grants them and never over-grants.
//!
//! The table is split in shards, each behind its own lock and padded to its own cache lines.
//! The shard is chosen from bits 32..38 of the fingerprint; the table inside uses the low bits for
//! the bucket and the top 7 for its control bytes, so the three never overlap.
//!
//! **Bounds.** Each shard holds at most `max_keys / shards` slots and `max_bytes / shards`
//! bytes (its table's allocation plus the states' heap memory: sliding logs, sub-window rings).
//! The one exception: the state being written is never evicted for its own sake, so a single
//! state larger than a shard's budget stays (at most one per shard).
//!
//! **Eviction, amortised O(1).** When a shard is full, a sweep drops every idle slot (a state back
//! at full capacity decides exactly like no state: nothing is lost) and, if that freed less than
//! an eighth of the shard, lines up the soonest-idle slots as victims for the next inserts. Each
//! sweep is O(shard) and pays for an eighth of a shard's inserts. Victims are evicted one at a
//! time, only when the bounds force it; a victim still live when evicted is counted as a *live*
//! eviction (its key starts over with full capacity: an over-grant the operator should see).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use hashbrown::HashTable;

/// What the table needs from a slot.
pub(crate) trait Slot {
    /// The key's fingerprint.
    fn fingerprint(&self) -> u64;
    /// The instant from which the state decides exactly like an idle one.
    fn idle_at(&self) -> u64;
    /// Bytes the state holds on the heap.
    fn heap_bytes(&self) -> usize;
}

/// One shard: its slots, the heap bytes their states hold, and the next eviction victims.
pub(crate) struct Shard<S> {
    pub(crate) slots: HashTable<S>,
    pub(crate) heap_bytes: usize,
    /// `(idle_at, fingerprint)`, soonest-idle last: popped one at a time when the shard is full.
    victims: Vec<(u64, u64)>,
}

impl<S: Slot> Shard<S> {
    /// Bytes this shard holds (its table, the states' heap memory and the victim list).
    fn bytes(&self) -> usize {
        self.slots.allocation_size() + self.heap_bytes + self.victims.capacity() * 16
    }

    /// Bytes the table would add to insert one more slot (it doubles when full).
    fn growth(&self) -> usize {
        if self.slots.len() < self.slots.capacity() {
            0
        } else {
            self.slots.allocation_size().max(4 * (std::mem::size_of::<S>() + 1))
        }
    }
}

/// Keeps each shard's lock on its own cache lines (128 bytes: adjacent-line prefetching pairs them).
#[repr(align(128))]
struct Padded<T>(T);

/// How many slots were evicted, by kind.
#[derive(Debug, Default)]
pub(crate) struct Evicted {
    pub(crate) idle: AtomicU64,
    pub(crate) live: AtomicU64,
}

/// A table of slots split into shards.
pub(crate) struct SlotTable<S> {
    shards: Box<[Padded<RwLock<Shard<S>>>]>,
    mask: usize,
    shard_keys: usize,
    shard_bytes: usize,
    keys: AtomicUsize,
    evicted: Evicted,
}

impl<S: Slot> SlotTable<S> {
    /// `shards` (a power of two) shards holding at most `max_keys` slots and about `max_bytes`
    /// bytes in all.
    pub(crate) fn new(shards: usize, max_keys: usize, max_bytes: usize) -> Self {
        debug_assert!(shards.is_power_of_two());
        let shards_vec: Vec<_> = (0..shards)
            .map(|_| Padded(RwLock::new(Shard { slots: HashTable::new(), heap_bytes: 0, victims: Vec::new() })))
            .collect();
        SlotTable {
            shards: shards_vec.into_boxed_slice(),
            mask: shards - 1,
            shard_keys: (max_keys / shards).max(1),
            shard_bytes: (max_bytes / shards).max(1),
            keys: AtomicUsize::new(0),
            evicted: Evicted::default(),
        }
    }

    /// The shard holding `fingerprint`.
    #[inline]
    pub(crate) fn shard_of(&self, fingerprint: u64) -> usize {
        // Truncation intended: bits 32.. of the fingerprint pick the shard.
        #[allow(clippy::cast_possible_truncation)]
        let bits = (fingerprint >> 32) as usize;
        bits & self.mask
    }

    #[inline]
    pub(crate) fn read(&self, shard: usize) -> RwLockReadGuard<'_, Shard<S>> {
        // A panic never happens while a shard is locked; if one did, its data is still consistent.
        self.shards[shard].0.read().unwrap_or_else(PoisonError::into_inner)
    }

    #[inline]
    pub(crate) fn write(&self, shard: usize) -> RwLockWriteGuard<'_, Shard<S>> {
        self.shards[shard].0.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// Inserts a new slot into `shard` (locked for write), evicting first if the bounds require
    /// it; the slots in `keep` (the ones this call is writing) are never evicted.
    pub(crate) fn insert(&self, shard: &mut Shard<S>, slot: S, now: u64, keep: &[u64]) {
        let heap = slot.heap_bytes();
        while shard.slots.len() >= self.shard_keys || shard.bytes() + shard.growth() + heap > self.shard_bytes {
            if !self.evict_one(shard, now, keep) {
                break;
            }
        }
        self.keys.fetch_add(1, Ordering::Relaxed);
        shard.heap_bytes += heap;
        shard.slots.insert_unique(slot.fingerprint(), slot, S::fingerprint);
    }

    /// After a state in `shard` grew by `grown` heap bytes: evicts other slots while the shard is
    /// over its byte budget.
    pub(crate) fn grew(&self, shard: &mut Shard<S>, grown: usize, now: u64, keep: &[u64]) {
        shard.heap_bytes += grown;
        while shard.bytes() > self.shard_bytes {
            if !self.evict_one(shard, now, keep) {
                break;
            }
        }
    }

    /// Evicts one slot (or, by a sweep, every idle one); false if nothing could be evicted.
    fn evict_one(&self, shard: &mut Shard<S>, now: u64, keep: &[u64]) -> bool {
        if shard.victims.is_empty() && self.sweep(shard, now, keep) {
            return true;
        }
        while let Some((_, fingerprint)) = shard.victims.pop() {
            if keep.contains(&fingerprint) {
                continue;
            }
            if let Ok(entry) = shard.slots.find_entry(fingerprint, |s| s.fingerprint() == fingerprint) {
                let (slot, _) = entry.remove();
                self.forget(shard, &slot, now);
                return true;
            }
        }
        false
    }

    /// Drops every idle slot (true if any) and, unless that freed an eighth of the shard, lines up
    /// the soonest-idle of the others as victims. O(shard).
    fn sweep(&self, shard: &mut Shard<S>, now: u64, keep: &[u64]) -> bool {
        let before = shard.slots.len();
        let mut freed = 0;
        shard.slots.retain(|slot| {
            let drop = slot.idle_at() <= now && !keep.contains(&slot.fingerprint());
            if drop {
                freed += slot.heap_bytes();
            }
            !drop
        });
        shard.heap_bytes -= freed;
        let dropped = before - shard.slots.len();
        self.keys.fetch_sub(dropped, Ordering::Relaxed);
        self.evicted.idle.fetch_add(dropped as u64, Ordering::Relaxed);
        let wanted = before.div_ceil(8).max(1).saturating_sub(dropped);
        if wanted > 0 {
            let mut candidates: Vec<(u64, u64)> = shard
                .slots
                .iter()
                .filter(|s| !keep.contains(&s.fingerprint()))
                .map(|s| (s.idle_at(), s.fingerprint()))
                .collect();
            let wanted = wanted.min(candidates.len());
            if wanted > 0 {
                candidates.select_nth_unstable(wanted - 1);
                candidates.truncate(wanted);
                candidates.sort_unstable_by(|a, b| b.cmp(a));
            }
            candidates.shrink_to_fit();
            shard.victims = candidates;
        }
        dropped > 0
    }

    /// Accounts for a slot that left `shard`.
    fn forget(&self, shard: &mut Shard<S>, slot: &S, now: u64) {
        shard.heap_bytes -= slot.heap_bytes();
        self.keys.fetch_sub(1, Ordering::Relaxed);
        let kind = if slot.idle_at() <= now { &self.evicted.idle } else { &self.evicted.live };
        kind.fetch_add(1, Ordering::Relaxed);
    }

    /// Removes the slot of `fingerprint`, if any.
    pub(crate) fn remove(&self, fingerprint: u64) {
        let mut shard = self.write(self.shard_of(fingerprint));
        if let Ok(entry) = shard.slots.find_entry(fingerprint, |s| s.fingerprint() == fingerprint) {
            let (slot, _) = entry.remove();
            shard.heap_bytes -= slot.heap_bytes();
            self.keys.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Removes the slot of `fingerprint` from `shard` (locked for write, its own), if any.
    pub(crate) fn take(&self, shard: &mut Shard<S>, fingerprint: u64) -> Option<S> {
        let entry = shard.slots.find_entry(fingerprint, |s| s.fingerprint() == fingerprint).ok()?;
        let (slot, _) = entry.remove();
        shard.heap_bytes -= slot.heap_bytes();
        self.keys.fetch_sub(1, Ordering::Relaxed);
        Some(slot)
    }

    /// The number of slots.
    pub(crate) fn len(&self) -> usize {
        self.keys.load(Ordering::Relaxed)
    }

    /// Bytes held: the shards themselves, their tables' allocations and the states' heap bytes.
    pub(crate) fn bytes(&self) -> usize {
        let own = std::mem::size_of_val(&*self.shards);
        own + (0..self.shards.len()).map(|i| self.read(i).bytes()).sum::<usize>()
    }

    /// Slots evicted while idle (lossless) and while live (their keys started over).
    pub(crate) fn evictions(&self) -> (u64, u64) {
        (self.evicted.idle.load(Ordering::Relaxed), self.evicted.live.load(Ordering::Relaxed))
    }

    /// The number of shards.
    pub(crate) fn shard_count(&self) -> usize {
        self.shards.len()
    }
}
