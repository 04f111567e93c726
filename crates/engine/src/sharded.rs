//! The engine's per-(rule, key) tables (mitigations in force, measured rates): 16 shards, each a
//! map behind its own lock on its own cache line, so that no lock is shared by every request;
//! entries found by a seeded 64-bit fingerprint of (rule, key). The map is a `HashMap` by
//! default; the measured rates' is a [`LineTable`](crate::line_table::LineTable).

use std::hash::BuildHasher;
use std::sync::{Mutex, MutexGuard, PoisonError};

/// How many shards.
pub(crate) const SHARDS: usize = 16;

/// Entries by the (rule, key) fingerprint, itself a quality hash: the map's hasher need not be one.
pub(crate) type Map<V> = std::collections::HashMap<u64, V, foldhash::fast::RandomState>;

/// A shard on a cache line of its own: neighbouring shards' locks do not contend.
#[derive(Debug, Default)]
#[repr(align(64))]
struct Shard<M>(Mutex<M>);

/// A table of `V` per (rule, key), sharded, each shard an `M` by fingerprint.
#[derive(Debug)]
pub(crate) struct Sharded<V, M = Map<V>> {
    shards: [Shard<M>; SHARDS],
    hasher: foldhash::quality::RandomState,
    values: std::marker::PhantomData<V>,
}

impl<V, M: Default> Sharded<V, M> {
    pub(crate) fn new() -> Self {
        Sharded {
            shards: std::array::from_fn(|_| Shard(Mutex::default())),
            hasher: Default::default(),
            values: std::marker::PhantomData,
        }
    }

    /// The shard of (rule, key) and its fingerprint.
    pub(crate) fn locate(&self, rule: &str, key: &[u8]) -> (usize, u64) {
        let fingerprint = self.hasher.hash_one((rule, key));
        // The low bits pick the shard; the map hashes the whole fingerprint again.
        (usize::try_from(fingerprint % SHARDS as u64).unwrap_or(0), fingerprint)
    }

    /// A fingerprint of `rule` alone (the same for every key of it).
    pub(crate) fn hash(&self, rule: &str) -> u64 {
        self.hasher.hash_one(rule)
    }

    /// Shard `index`, locked (a panic elsewhere while it was held leaves plain data: used as is).
    pub(crate) fn shard(&self, index: usize) -> MutexGuard<'_, M> {
        self.shards[index].0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
