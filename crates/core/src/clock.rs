//! Clocks for the stores: the algorithms never read one, the stores take one.
//!
//! [`SystemClock`] is the wall clock made monotonic: it reads the system time once, then advances
//! with a monotonic timer, so an NTP step never moves a running limiter's time backwards. The
//! timer is `quanta`'s calibrated TSC where the CPU has an invariant one (about 12 ns a read here,
//! against 33 ns for `std::time::Instant`; a limiter reads it on every decision), and the
//! operating system's monotonic clock otherwise. Monotonic within a thread; across threads two
//! readings ordered by a lock may be out of order by the cores' counters' skew (11–39 ns measured
//! here, `tests/clock_across_threads.rs`), which the algorithms tolerate: a clock going backwards
//! never over-grants.
//! [`ManualClock`] is set by hand, for tests and simulations.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of "now" in nanoseconds since the Unix epoch.
pub trait Clock: Send + Sync + std::fmt::Debug + 'static {
    /// The current instant, in ns since the Unix epoch.
    fn now_ns(&self) -> u64;
}

/// The system clock, anchored to the epoch once and advanced by a monotonic timer.
#[derive(Debug, Clone)]
pub struct SystemClock {
    anchor_ns: u64,
    /// The timer's raw reading (TSC ticks, or ns) at `anchor_ns`.
    anchor_raw: u64,
    timer: quanta::Clock,
}

impl SystemClock {
    /// Anchors a new clock at the current system time.
    #[must_use]
    pub fn new() -> Self {
        // A system clock set before 1970 reads as the epoch: later instants still advance.
        let since_epoch = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
        let timer = quanta::Clock::new();
        let anchor_raw = timer.raw();
        SystemClock { anchor_ns: u64::try_from(since_epoch.as_nanos()).unwrap_or(u64::MAX), anchor_raw, timer }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        SystemClock::new()
    }
}

impl Clock for SystemClock {
    fn now_ns(&self) -> u64 {
        // Raw ticks since the anchor scaled to ns in one multiply and shift (0 if the counter
        // reads earlier): what `Instant::duration_since` computes, without a `Duration` between.
        let elapsed = self.timer.delta_as_nanos(self.anchor_raw, self.timer.raw());
        self.anchor_ns.saturating_add(elapsed)
    }
}

/// A clock that only moves when told to: for tests, replays and simulations.
#[derive(Debug, Default)]
pub struct ManualClock {
    now_ns: AtomicU64,
}

impl ManualClock {
    /// A clock reading `now_ns`.
    #[must_use]
    pub fn new(now_ns: u64) -> Self {
        ManualClock { now_ns: AtomicU64::new(now_ns) }
    }

    /// Sets the time; going backwards is allowed (the algorithms never over-grant on it).
    pub fn set(&self, now_ns: u64) {
        self.now_ns.store(now_ns, Ordering::SeqCst);
    }

    /// Moves the time forward by `by` (saturating at `u64::MAX`).
    pub fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        let _ = self.now_ns.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |now| Some(now.saturating_add(by)));
    }
}

impl Clock for ManualClock {
    fn now_ns(&self) -> u64 {
        self.now_ns.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_clock_is_near_the_system_time_and_monotonic() {
        let clock = SystemClock::new();
        let a = clock.now_ns();
        let b = clock.now_ns();
        assert!(b >= a);
        let system = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos();
        assert!(system.abs_diff(u128::from(b)) < 1_000_000_000, "within a second of the system time");
    }

    #[test]
    fn manual_clock_moves_only_when_told() {
        let clock = ManualClock::new(5);
        assert_eq!(clock.now_ns(), 5);
        clock.advance(Duration::from_nanos(10));
        assert_eq!(clock.now_ns(), 15);
        clock.set(3);
        assert_eq!(clock.now_ns(), 3);
        clock.advance(Duration::MAX);
        assert_eq!(clock.now_ns(), u64::MAX);
    }
}
