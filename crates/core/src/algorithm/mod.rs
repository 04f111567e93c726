//! The seven algorithms of `SEMANTICS.md`, each a pure step over its own small state.
//!
//! Every state type implements [`RateState`]: `check(&mut state, now, limit, cost)` decides one
//! request and changes the state only when the request is admitted with `cost > 0`. A denial or a
//! peek (`cost == 0`) leaves the state bit-for-bit unchanged. No step reads a clock: `now` is
//! nanoseconds since the Unix epoch, supplied by the caller.
//!
//! A clock that goes backwards never over-grants: every step treats an earlier `now` as no time
//! having passed since the state was last written (or, for GCRA, as a later arrival in the
//! schedule), so an earlier instant is never given more capacity than a later one had.

mod fixed_window;
mod gcra;
mod leaky_bucket;
mod sliding_log;
mod sliding_window;
mod state;
mod sub_window;
mod token_bucket;

pub use fixed_window::FixedWindow;
pub use gcra::Gcra;
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
    /// Changes `self` only when the request is admitted and `cost > 0`. Errors when the cost can
    /// never be admitted or an intermediate value overflows; the state is then unchanged.
    fn check(&mut self, now: u64, limit: &Limit, cost: u64) -> Result<Decision, Error>;

    /// The first instant (ns since the epoch) from which this state decides exactly like
    /// [`idle`](Self::idle): a store may forget the key then (eviction, TTL).
    fn idle_at(&self, limit: &Limit) -> u64;
}

/// `cost * T`, the time (bucket family) a request of `cost` occupies.
fn cost_ns(limit: &Limit, cost: u64) -> Result<u64, Error> {
    // cost <= burst was checked and burst * T fits, so this cannot fail; stay checked anyway.
    cost.checked_mul(limit.emission_interval_ns()).ok_or(Error::Overflow("cost × emission interval"))
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
