//! Leases for hot keys: a node borrows a slice of a key's capacity with one call and spends it
//! locally, so one key at a million decisions a second costs Redis a few calls a second.
//!
//! - **Debited before spent.** A lease is an ordinary admission of `g` units to the key's real
//!   state (the same algorithm, in the same script as every other decision; see [`Lessor`]), made
//!   before any of them is spent. Leased and unleased nodes share one state, and what the store
//!   debits obeys the limit exactly; a node only ever spends units already debited.
//! - **Short lives.** A slice is spent within `lifetime` (default 100 ms) of the moment its call
//!   was sent, and for the fixed and sliding window counters before the window it was debited in
//!   ends; what is left then is forfeited (an under-grant, counted in
//!   [`LeaseStats::units_forfeited`]). A refund of a local admission goes back to the slice.
//! - **Denials exact.** When a lease is refused, or a grant leaves nothing in the store, the node
//!   refuses the key's requests beyond its slice itself, deciding each with the algorithm on the
//!   state the store answered with (`Grant::snapshot`, unchanged while nothing can be admitted)
//!   at the store's instant estimated from the reply: the store's own figures at most a round
//!   trip ahead, never a denial the store would not make (see `entry::Model`). It does so until
//!   the store frees a unit, and for at most `lifetime`, and asks again a round trip before
//!   that. A refund to the store or a reset on this node ends it at once; a change made elsewhere
//!   (a refund, reset, hold or charge on another node, an admission under another limit of the
//!   key) is seen with the first lease call answered after it: at most `min(retry_after,
//!   lifetime)` later, plus the round trip of a refill in flight (below), never more than a
//!   lifetime after the call answered from. Every leasable algorithm is
//!   rebuilt exactly from its snapshot, so each is answered so.
//! - **Refusals while a refill is in flight.** Once the slice is spent, the requests that the
//!   latest reply's state could admit wait for the refill in flight; a newcomer that this state
//!   refuses after the waiting requests of at most its cost is refused at once: the store's
//!   answer had it received the waiting requests first (it can only have less free capacity
//!   than that state, never more). So a denied hot key costs one waiting request per unit the
//!   store frees, not every request for a round trip. A refund or reset on another node is seen
//!   once the refill in flight (or, if that one reached the store first, the next) is answered.
//! - **Adaptive size.** A slice is the key's measured local rate over a quarter of the lifetime,
//!   at most `g_max = max(1, share × capacity)` divided among the nodes leasing the key (the
//!   script counts them), at most what was left divided among them (so a slice shrinks to 1 near
//!   the limit), and for a window no more than the rest of the window would spend. One refill per
//!   key per node is in flight at a time, sent when half of the slice is spent, and what a node
//!   holds and asks for never exceeds `g_max` together.
//! - **Hot keys only** ([`LeaseMode::Auto`]): a heavy-hitter sketch finds the keys this node
//!   decides more than `hot_rate` times a second (after 55 ms of traffic at 1.5 × `hot_rate`,
//!   120 ms at 1.1 ×; see `hot.rs`); other keys keep one exact call per decision. A leased key whose rate stays under a
//!   quarter of `hot_rate` for a second is exact again.
//!
//! **Which algorithms.** GCRA, token bucket, leaky bucket, fixed window and sliding window counter.
//! The sliding log and the sub-window counter record when each unit was admitted, so a slice
//! debited now and spent later would be logged at the wrong instant: they stay exact.
//!
//! **The bound.** Every unit spent was debited first, so from idle the admitted total never
//! exceeds what the algorithm admits (`burst + rate × elapsed` for the bucket family, `count` per
//! window, exactly). What leases add is burstiness inside a sub-interval: units debited earlier and
//! spent now. Units a node holds were debited within `lifetime` (at most `rate × lifetime` of
//! them beyond the algorithm's own bound) and are at most `g_max` per node, so over any interval
//! the fleet of `N` nodes admits at most the algorithm's bound plus
//! `min(N × g_max, rate × lifetime)` for the bucket family; zero for the windowed algorithms
//! (a slice is spent in the window it was counted in, so each window counts what it admits).
//! `tests/lease_bound.rs` checks this with an oracle and shows it is reached.
//!
//! **Holds.** A check asking for its key's hold ([`Check::hold`]: a rule with a mitigation
//! `timeout`) is decided exactly and never makes its key hot: a slice spent locally would not see
//! a hold another node put on the key.
//!
//! **A request with several limits** always takes the exact path (one call for all, all or
//! nothing in Redis), which stays exact; its keys are still observed, so each can become hot for
//! the single-limit requests that share it.

mod book;
mod entry;
mod hot;
mod leased;
mod model;

use std::future::Future;
use std::time::Duration;

use tollgate_core::{Algorithm, Decision, Snapshot};

pub use book::{Book, Order, Refill, Spend};
pub use leased::Leased;
pub use model::LeaseModel;

use crate::{Check, StoreError};

tollgate_core::words! {
    /// Which keys are leased (`--lease`).
    pub enum LeaseMode: "lease mode" {
        /// None: every decision is one exact call.
        Off = "off",
        /// The keys this node finds hot (the default on Redis).
        Auto = "auto",
        /// Every key of a leasable algorithm, from its first decision.
        Always = "always",
    }
}

/// Settings of the lease layer.
#[derive(Debug, Clone)]
pub struct LeaseOptions {
    /// Which keys are leased.
    pub mode: LeaseMode,
    /// How long a slice may be spent after its call was sent (default 100 ms).
    pub lifetime: Duration,
    /// Decisions per second on this node above which a key is hot (default 500).
    pub hot_rate: u64,
    /// The percentage of a key's capacity the fleet's slices may hold at once (default 10).
    pub share_percent: u64,
    /// Keys this node leases at most (default 10,000); more hot keys stay exact.
    pub max_keys: usize,
    /// This node's id in the script's count of lessees (default: random).
    pub lessee: u64,
}

impl Default for LeaseOptions {
    fn default() -> Self {
        LeaseOptions {
            mode: LeaseMode::Auto,
            lifetime: Duration::from_millis(100),
            hot_rate: 500,
            share_percent: 10,
            max_keys: 10_000,
            lessee: random_id(),
        }
    }
}

/// A node id unlikely to be another's: the process id and the time, mixed.
fn random_id() -> u64 {
    use std::hash::BuildHasher;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    foldhash::fast::RandomState::default().hash_one((std::process::id(), now))
}

/// Whether slices of `algorithm`'s capacity can be leased exactly (see the module docs).
#[must_use]
pub fn leasable(algorithm: Algorithm) -> bool {
    !matches!(algorithm, Algorithm::SlidingLog | Algorithm::SubWindow)
}

/// What a [`Lessor`] answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// The admission of the units granted (`allowed`), or the denial of one unit when nothing was
    /// left (its `retry_after` says when to ask again).
    pub decision: Decision,
    /// Units debited for the lessee: at most what it wanted, 0 when denied.
    pub granted: u64,
    /// Nodes that asked for a lease of this key within a lifetime, this one included.
    pub lessees: u64,
    /// The key after the call.
    pub snapshot: Snapshot,
    /// The store's now, in ns since the epoch.
    pub at: u64,
}

/// A store that lends slices of a key's capacity.
pub trait Lessor: Send + Sync {
    /// Debits up to `want` units of `check`'s key (its `cost` is ignored) as one admission of
    /// `min(want, what is left)`, records `lessee` as leasing the key for `lifetime`, and answers
    /// what was granted. `want` is at most the limit's capacity.
    fn lease(
        &self,
        check: Check<'_>,
        want: u64,
        lessee: u64,
        lifetime: Duration,
    ) -> impl Future<Output = Result<Grant, StoreError>> + Send;

    /// The answer of the store's failure policy to `checks`, without calling the backend, if it
    /// has one: a request that waited on a lease call that failed is answered so, rather than
    /// waiting on the failing backend a second time.
    fn fall_back(&self, _checks: &[Check<'_>]) -> Option<Result<crate::Reserved, StoreError>> {
        None
    }
}

impl<L: Lessor> Lessor for std::sync::Arc<L> {
    fn fall_back(&self, checks: &[Check<'_>]) -> Option<Result<crate::Reserved, StoreError>> {
        (**self).fall_back(checks)
    }

    fn lease(
        &self,
        check: Check<'_>,
        want: u64,
        lessee: u64,
        lifetime: Duration,
    ) -> impl Future<Output = Result<Grant, StoreError>> + Send {
        (**self).lease(check, want, lessee, lifetime)
    }
}

/// Counters of the lease layer, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LeaseStats {
    /// Lease calls answered (granted or refused).
    pub grants: u64,
    /// Units debited for this node's slices.
    pub units_granted: u64,
    /// Units of slices that expired unspent (an under-grant).
    pub units_forfeited: u64,
    /// Lease calls that failed (the key is decided exactly for a lifetime after).
    pub failures: u64,
    /// Decisions made from a slice or refused as the store would (see the module docs).
    pub local_decisions: u64,
    /// Decisions sent to the store.
    pub exact_decisions: u64,
    /// Keys found hot.
    pub hot_keys_detected: u64,
    /// Keys leased now.
    pub leased_keys: u64,
}
