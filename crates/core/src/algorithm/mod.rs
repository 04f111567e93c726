//! The seven algorithms of `docs/SEMANTICS.md`, each a pure step over its own small state.
//!
//! Every state type implements [`RateState`]: `check(&mut state, now, limit, cost)` decides one
//! request and changes the state only when the request is admitted with `cost > 0`. A denial or a
//! peek (`cost == 0`) leaves the state bit-for-bit unchanged. No step reads a clock: `now` is
//! nanoseconds since the Unix epoch, supplied by the caller.
//!
//! A clock that goes backwards never over-grants: every step treats an earlier `now` as no time
//! having passed since the state was last written (for the bucket family: as a later arrival in
//! the schedule), so an earlier instant is never given more capacity than a later one had.
//!
//! Besides deciding, every state can be *charged* (an admission that ignores the limit, which may
//! put the key in debt: how a store records what was admitted elsewhere, e.g. by a fallback while
//! Redis was unreachable), and summarised as a [`Snapshot`] from which a state deciding at least as
//! strictly can be rebuilt.

pub mod debt;
mod fixed_window;
mod gcra;
mod leaky_bucket;
mod sliding_log;
mod sliding_window;
mod state;
mod sub_window;
mod token_bucket;

pub use fixed_window::FixedWindow;
pub use gcra::{Gcra, rescaled_tat};
pub use leaky_bucket::LeakyBucket;
pub use sliding_log::SlidingLog;
pub use sliding_window::SlidingWindow;
pub use state::State;
pub use sub_window::SubWindow;
pub use token_bucket::TokenBucket;

use crate::{Decision, Error, Limit};

/// The per-key state of one algorithm.
pub trait RateState: Clone + PartialEq + std::fmt::Debug + Send + Sync + 'static {
    /// The state of a key with no history: full capacity.
    fn idle(limit: &Limit) -> Self;

    /// Decides a request of `cost` at `now` (ns since the Unix epoch) under `limit`.
    ///
    /// Changes `self` only when `cost > 0` and the request is admitted, or (the bucket family)
    /// refused on a state measured under another rate: it is then rewritten rescaled into the
    /// limit's (deciding exactly as before), so it no longer drains at the old rate and the
    /// `retry_after` it announced holds. A peek (cost 0) never changes it. Errors when the cost can
    /// never be admitted or an intermediate value overflows; the state is then unchanged.
    fn check(&mut self, now: u64, limit: &Limit, cost: u64) -> Result<Decision, Error>;

    /// The first instant (ns since the epoch) from which this state decides exactly like
    /// [`idle`](Self::idle): a store may forget the key then (eviction, TTL).
    fn idle_at(&self, limit: &Limit) -> u64;

    /// Records an admission of `cost` at `at` whatever the limit says: the state may end up over
    /// its capacity (in debt) and then denies until the debt is paid back. An `at` earlier than
    /// the state's own instants is charged as late as those (never less strictly).
    fn charge(&mut self, at: u64, limit: &Limit, cost: u64) -> Result<(), Error>;

    /// Withdraws an admission of `cost` made at `at` whose decision was `decision` (a reservation
    /// that turned out not to count): exactly where it was counted, if the state still holds it
    /// there. The decision locates it (its `reset_after` says which window, slice, log entry or
    /// schedule end it went to). For the bucket family only while nothing else was admitted since
    /// (the schedule is not a sum that can be taken apart); otherwise, or once it left the window,
    /// nothing changes: the reservation stays counted, an under-grant, never an over-grant.
    fn refund(&mut self, at: u64, decision: &Decision, limit: &Limit, cost: u64);

    /// What this state has consumed, seen at `now`.
    fn snapshot(&self, now: u64, limit: &Limit) -> Snapshot;

    /// A state that decides at least as strictly as the one `snapshot` was taken of, at every
    /// instant from `snapshot.at` on: exactly like it for the bucket family, the fixed window and
    /// the sliding window counter; for the sliding log and the sub-window counter as if every
    /// unit in the window had been admitted at `snapshot.at` (so it frees up no earlier).
    fn from_snapshot(limit: &Limit, snapshot: &Snapshot) -> Self;
}

/// The end of the bucket family's schedule right after the admission `decision` made at `at`, if
/// that admission consumed something a refund can give back.
fn reserved_tat(at: u64, decision: &Decision, cost: u64) -> Option<u64> {
    (decision.allowed && cost > 0).then(|| at.saturating_add(decision.reset_after_ns))
}

/// The furthest a charge may push the bucket family's schedule ahead of the charge's instant:
/// 52 days. A debt beyond it is forgiven, so a key is never denied for longer because of charges,
/// and the Redis script (exact below 2^53 ns, 104 days, around now) adds a period to any instant
/// it holds and stays exact.
pub const MAX_AHEAD_NS: u64 = 52 * 86_400 * 1_000_000_000;

/// The theoretical arrival time after charging `cost_ns` at `at`: `max(tat, at) + cost_ns`, but
/// no further than [`MAX_AHEAD_NS`] past `at` (and never earlier than `tat`).
fn charged_tat(tat: u64, at: u64, cost_ns: u64) -> u64 {
    let from = tat.max(at);
    from.saturating_add(cost_ns).min(at.saturating_add(MAX_AHEAD_NS)).max(from)
}

/// The most a window may count after charges: 2^52 units, above every `count` a limit accepts.
/// Charges beyond it are forgiven, for the same reason as [`MAX_AHEAD_NS`].
pub const MAX_COUNTER: u64 = 1 << 52;

/// How much of a charge of `cost` a window already counting `used` records (up to
/// [`MAX_COUNTER`]).
fn counted(used: u64, cost: u64) -> u64 {
    cost.min(MAX_COUNTER.saturating_sub(used))
}

/// What a state has consumed at one instant ([`RateState::snapshot`]): what a node keeps of a
/// remote store's answers, so that deciding locally when the store cannot be reached continues
/// from the state it last saw instead of from a full bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Snapshot {
    /// The instant seen, in ns since the epoch.
    pub at: u64,
    /// Bucket family: capacity in use, in ns (how far the schedule runs ahead of `at`; above
    /// `burst * T` while in debt). Window family: the cost counted in the window holding `at`
    /// (the sliding window counter: in its current window).
    pub used: u64,
    /// The sliding window counter's previous window; 0 for the other algorithms.
    pub previous: u64,
}

impl Snapshot {
    /// When the state rebuilt from this snapshot ([`RateState::from_snapshot`]) is idle, without
    /// building it.
    #[must_use]
    pub fn idle_at(&self, limit: &Limit) -> u64 {
        let (at, period) = (self.at, limit.period_ns());
        match limit.algorithm() {
            crate::Algorithm::Gcra | crate::Algorithm::TokenBucket | crate::Algorithm::LeakyBucket => {
                at.saturating_add(self.used)
            }
            _ if self.used == 0 && self.previous == 0 => 0,
            crate::Algorithm::FixedWindow => {
                debt::nth_window_end(limit, limit.window_at(at).0, debt::last_indebted(limit, self.used))
            }
            crate::Algorithm::SlidingWindow => {
                let (start, end) = limit.window_at(at);
                if self.used > 0 {
                    debt::nth_window_end(limit, start, debt::last_indebted(limit, self.used) + 1)
                } else {
                    end
                }
            }
            crate::Algorithm::SlidingLog => at.saturating_add(period),
            crate::Algorithm::SubWindow => {
                let slice = period / limit.slices();
                window_start(at, slice).saturating_add(period)
            }
        }
    }
}

/// `cost * T`, the time (bucket family) a request of `cost` occupies.
#[inline]
fn cost_ns(limit: &Limit, cost: u64) -> Result<u64, Error> {
    // cost <= burst was checked and burst * T fits, so this cannot fail; stay checked anyway.
    cost.checked_mul(limit.emission_interval_ns()).ok_or(Error::Overflow("cost × emission interval"))
}

/// `x + y`, or an overflow error naming `what`.
fn add(x: u64, y: u64, what: &'static str) -> Result<u64, Error> {
    x.checked_add(y).ok_or(Error::Overflow(what))
}

/// The start of the epoch-aligned window of `len` ns holding `now`.
fn window_start(now: u64, len: u64) -> u64 {
    now - now % len
}

#[cfg(test)]
pub(crate) mod test_util {
    use crate::{Algorithm, Decision, Limit};

    pub(crate) const SEC: u64 = 1_000_000_000;
    pub(crate) const MS: u64 = 1_000_000;
    /// An epoch-aligned instant: 2023-11-14T22:13:20Z, the conformance traces' origin.
    pub(crate) const T0: u64 = 1_700_000_000 * SEC;

    pub(crate) fn limit(algorithm: Algorithm, text: &str) -> Limit {
        text.parse::<crate::LimitBuilder>().unwrap().algorithm(algorithm).build().unwrap()
    }

    pub(crate) fn allowed(limit: u64, remaining: u64, reset_after_ns: u64) -> Decision {
        Decision { allowed: true, limit, remaining, retry_after_ns: 0, reset_after_ns }
    }

    pub(crate) fn denied(limit: u64, remaining: u64, retry_after_ns: u64, reset_after_ns: u64) -> Decision {
        Decision { allowed: false, limit, remaining, retry_after_ns, reset_after_ns }
    }
}
