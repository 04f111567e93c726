//! The outcome of one request: admitted or not, and what a client should be told.

use std::time::Duration;

/// What a limiter answers for one request. A rejection is a normal value, not an error.
///
/// All durations are whole nanoseconds, relative to the request's `now`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Decision {
    /// Whether the request is admitted (and, for `cost > 0`, consumed capacity).
    pub allowed: bool,
    /// `burst` for the bucket family, `count` for the window family.
    pub limit: u64,
    /// How many more unit-cost requests would be admitted right now, after this decision.
    pub remaining: u64,
    /// 0 when allowed; otherwise the time until this same request would be admitted if nothing
    /// else happens.
    pub retry_after_ns: u64,
    /// The time until the state is back to idle (full capacity).
    pub reset_after_ns: u64,
}

impl Decision {
    /// [`retry_after_ns`](Self::retry_after_ns) as a [`Duration`].
    #[must_use]
    pub fn retry_after(&self) -> Duration {
        Duration::from_nanos(self.retry_after_ns)
    }

    /// [`reset_after_ns`](Self::reset_after_ns) as a [`Duration`].
    #[must_use]
    pub fn reset_after(&self) -> Duration {
        Duration::from_nanos(self.reset_after_ns)
    }
}
