//! The circuit breaker: after a few consecutive backend failures, stop waiting on the backend.
//!
//! Closed (the default), calls go to the backend; each success resets the count of consecutive
//! failures. The failure that reaches the threshold opens the breaker: calls are answered by the
//! failure policy at once, without a round trip, and one background task probes the backend every
//! `probe_every` until it answers, then closes the breaker. Callers never wait for a probe.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

/// The breaker's settings and state.
#[derive(Debug)]
pub struct Breaker {
    threshold: u32,
    probe_every: Duration,
    failures: AtomicU32,
    open: AtomicBool,
    opened: AtomicU64,
}

/// Consecutive failures that open the breaker by default.
pub const DEFAULT_THRESHOLD: u32 = 3;

/// How often an open breaker probes the backend by default.
pub const DEFAULT_PROBE_EVERY: Duration = Duration::from_millis(100);

impl Default for Breaker {
    fn default() -> Self {
        Breaker::new(DEFAULT_THRESHOLD, DEFAULT_PROBE_EVERY)
    }
}

impl Breaker {
    /// Opens after `threshold` consecutive failures (at least 1); probes every `probe_every`.
    #[must_use]
    pub fn new(threshold: u32, probe_every: Duration) -> Self {
        Breaker {
            threshold: threshold.max(1),
            probe_every,
            failures: AtomicU32::new(0),
            open: AtomicBool::new(false),
            opened: AtomicU64::new(0),
        }
    }

    /// Whether calls skip the backend now.
    #[must_use]
    pub fn is_open(&self) -> bool {
        self.open.load(Ordering::Acquire)
    }

    /// How many times the breaker opened.
    #[must_use]
    pub fn times_opened(&self) -> u64 {
        self.opened.load(Ordering::Relaxed)
    }

    /// How often an open breaker probes.
    #[must_use]
    pub fn probe_every(&self) -> Duration {
        self.probe_every
    }

    pub(super) fn success(&self) {
        if self.failures.load(Ordering::Relaxed) != 0 {
            self.failures.store(0, Ordering::Relaxed);
        }
    }

    /// Records a failure; true if this one opened the breaker (its caller starts the probe).
    pub(super) fn failure(&self) -> bool {
        let failures = self.failures.fetch_add(1, Ordering::AcqRel) + 1;
        if failures >= self.threshold && !self.open.swap(true, Ordering::AcqRel) {
            self.opened.fetch_add(1, Ordering::Relaxed);
            return true;
        }
        false
    }

    /// The backend answered a probe.
    pub(super) fn close(&self) {
        self.failures.store(0, Ordering::Relaxed);
        self.open.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_once_at_the_threshold_and_closes_on_request() {
        let breaker = Breaker::new(3, Duration::from_millis(1));
        assert!(!breaker.failure() && !breaker.failure());
        breaker.success();
        assert!(!breaker.failure() && !breaker.failure() && !breaker.is_open());
        assert!(breaker.failure(), "the third consecutive failure opens it");
        assert!(breaker.is_open() && !breaker.failure(), "only once");
        breaker.close();
        assert!(!breaker.is_open());
        assert_eq!(breaker.times_opened(), 1);
    }
}
