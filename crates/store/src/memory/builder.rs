//! [`MemoryStoreBuilder`]: a [`MemoryStore`]'s bounds, shards and clock, and how the bounds are
//! shared among its tables.

use std::sync::Arc;

use tollgate_core::{Clock, SystemClock};

use super::{DEFAULT_MAX_KEYS, DEFAULT_MAX_MEMORY, MemoryStore, applied, reservations};
use crate::table::SlotTable;

/// Options of a [`MemoryStore`].
#[derive(Debug, Clone)]
pub struct MemoryStoreBuilder {
    max_keys: usize,
    max_memory: usize,
    shards: Option<usize>,
    clock: Arc<dyn Clock>,
}

impl MemoryStoreBuilder {
    /// The defaults: [`DEFAULT_MAX_KEYS`], [`DEFAULT_MAX_MEMORY`], shards by the bounds, the
    /// system clock.
    pub(super) fn new() -> Self {
        MemoryStoreBuilder {
            max_keys: DEFAULT_MAX_KEYS,
            max_memory: DEFAULT_MAX_MEMORY,
            shards: None,
            clock: Arc::new(SystemClock::new()),
        }
    }

    /// At most this many GCRA keys, at most this many keys of the other algorithms, and at most
    /// this many holds (default 1,000,000; at least 1). Idle keys (ended holds) are evicted first.
    #[must_use]
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys.max(1);
        self
    }

    /// At most about this many bytes in all: the tables and every state's heap memory (default
    /// [`DEFAULT_MAX_MEMORY`]). Idle keys are evicted first. A single state larger than a shard's
    /// share of the budget (a sliding log holds up to 16 bytes per admitted request) is kept.
    #[must_use]
    pub fn max_memory(mut self, bytes: usize) -> Self {
        self.max_memory = bytes.max(1);
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
        // Enough shards for two threads not to meet, few enough that each holds a useful share of
        // the bounds (at least 1,024 keys and 4 MiB: a full sliding log fits in one).
        let by_keys = (self.max_keys / 1024).next_power_of_two();
        let by_memory = (self.max_memory / (8 << 20)).next_power_of_two();
        let shards = self.shards.unwrap_or_else(|| by_keys.min(by_memory).clamp(1, 64));
        // No more shards than keys, so that the per-shard bounds add up to at most the total.
        let shards = shards.min(self.max_keys.next_power_of_two() / 2).max(1);
        // The holds get a sixteenth of the byte budget (a hold is 16 bytes), the reservations'
        // records another, each other table half of the rest.
        let for_holds = self.max_memory / 16;
        let for_reservations = self.max_memory / 16;
        let bytes = (self.max_memory - for_holds - for_reservations) / 2;
        MemoryStore {
            gcra: SlotTable::new(shards, self.max_keys, bytes),
            states: SlotTable::new(shards, self.max_keys, bytes),
            holds: Box::new(SlotTable::new(shards, self.max_keys, for_holds)),
            clock: self.clock,
            hasher: foldhash::quality::RandomState::default(),
            max_keys: self.max_keys,
            max_memory: self.max_memory,
            applied: applied::Applied::new(self.max_keys),
            as_remote: std::sync::atomic::AtomicBool::new(false),
            reservations: reservations::Reservations::new(for_reservations),
        }
    }
}
