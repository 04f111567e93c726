//! `SystemClock` across real threads (so across cores), and against the system time.
//!
//! An adversarial review (issue 41) found readings ordered by a lock across threads going back
//! 11–39 ns (every run at 1,000,000 readings a thread), with the formula before issue 41 as well
//! (`timer.now().duration_since(anchor)`, the same raw `rdtsc`): the counters of two cores are not
//! perfectly in step. The clock module now says so: monotonic within a thread, across threads out
//! of order by at most that skew, which the algorithms tolerate (a clock going backwards never
//! over-grants: `properties.rs::backwards_clock_never_over_grants`). This test holds the skew to
//! far under a millisecond (a broken calibration or an anchor per thread would be far over it).

use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use tollgate_core::{Clock, SystemClock};

/// A bound far above the skew measured (tens of ns), far below any limit's resolution that matters.
const MAX_BACKWARDS_NS: u64 = 1_000_000;

#[test]
fn readings_ordered_across_threads_go_back_at_most_the_cores_skew() {
    let clock = Arc::new(SystemClock::new());
    // The latest reading any thread made, and by whom: each reading is taken under the lock, so
    // it happens after the one stored.
    let latest = Arc::new(Mutex::new((0u64, usize::MAX)));
    std::thread::scope(|scope| {
        for thread in 0..4 {
            let (clock, latest) = (clock.clone(), latest.clone());
            scope.spawn(move || {
                for _ in 0..200_000 {
                    let mut latest = latest.lock().unwrap();
                    let now = clock.now_ns();
                    assert!(
                        now.saturating_add(MAX_BACKWARDS_NS) >= latest.0,
                        "thread {thread} read {now}, {} ns before thread {}'s earlier reading",
                        latest.0 - now,
                        latest.1
                    );
                    *latest = (now.max(latest.0), thread);
                }
            });
        }
    });
}

#[test]
fn the_clock_reads_the_system_time() {
    let clock = SystemClock::new();
    std::thread::sleep(std::time::Duration::from_millis(50));
    let read = clock.now_ns();
    let system = u64::try_from(SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos()).unwrap();
    // A generous bound (a shared machine): the scaled ticks do not drift from the system time.
    assert!(read.abs_diff(system) < 1_000_000_000, "clock {read} vs system {system}");
}
