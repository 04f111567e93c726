//! One limit, said to tollgate and to each peer so that both decide the same thing: the
//! translations `scripts/bench-peers.sh` uses (the binary prints the RESP commands from here),
//! and the tests that prove them on small traces, decision by decision.
//!
//! - limitador has one algorithm, a fixed window of `max_value` per `seconds` per counter (a
//!   counter per value of the limit's variables): tollgate's fixed window of `count` per `period`
//!   with the key as that value. limitador's window opens at a counter's first hit, tollgate's on
//!   the epoch's multiples of the period: within one window both admit exactly `count`.
//! - throttlecrab's `THROTTLE key max_burst count period [quantity]` is GCRA whose `max_burst` is
//!   the burst itself; tollgate's `CL.THROTTLE` (redis-cell's) reads `max_burst` as one less than
//!   the burst. The same burst is `CL.THROTTLE key B-1 …` on one side and `THROTTLE key B …` on
//!   the other.

use std::collections::HashMap;
use std::time::Duration;

use limitador::limit::{Context, Expression, Predicate};
use tollgate_store::{Algorithm, Limit};

/// The namespace every limitador limit here lives in.
pub const NAMESPACE: &str = "bench";
/// The variable limitador keys its counters by (the descriptor entry `user=…` in Envoy's terms).
pub const VARIABLE: &str = "user";

/// tollgate's fixed window of `count` per `seconds`.
pub fn tollgate_fixed_window(count: u64, seconds: u64) -> Limit {
    Limit::builder(count, Duration::from_secs(seconds))
        .algorithm(Algorithm::FixedWindow)
        .build()
        .expect("a positive count and period")
}

/// limitador's limit deciding what [`tollgate_fixed_window`] decides: `count` per `seconds`, one
/// counter per value of [`VARIABLE`].
pub fn limitador_fixed_window(count: u64, seconds: u64) -> limitador::limit::Limit {
    let variable = Expression::parse(VARIABLE).expect("a variable name");
    limitador::limit::Limit::new(NAMESPACE, count, seconds, Vec::<Predicate>::new(), [variable])
}

/// The context limitador reads a request's key from (what limitador-server builds per call).
pub fn limitador_context(key: &str) -> Context<'static> {
    HashMap::from([(VARIABLE.to_string(), key.to_string())]).into()
}

/// tollgate's GCRA with `burst`, `count` per `seconds`.
pub fn tollgate_gcra(burst: u64, count: u64, seconds: u64) -> Limit {
    Limit::builder(count, Duration::from_secs(seconds))
        .algorithm(Algorithm::Gcra)
        .burst(burst)
        .build()
        .expect("a positive burst, count and period")
}

/// The RESP commands (key as `{key}`, as `tollgate bench resp` takes them) for GCRA with `burst`,
/// `count` per `seconds`: tollgate's `CL.THROTTLE` and throttlecrab-server's `THROTTLE`.
pub fn throttle_commands(burst: u64, count: u64, seconds: u64) -> (String, String) {
    assert!(burst >= 1, "a burst admits at least one request");
    (
        format!("CL.THROTTLE {{key}} {} {count} {seconds} 1", burst - 1),
        format!("THROTTLE {{key}} {burst} {count} {seconds} 1"),
    )
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::UNIX_EPOCH;

    use limitador::RateLimiter;
    use limitador::storage::in_memory::InMemoryStorage;
    use tollgate_store::{ManualClock, MemoryStore};

    use super::*;

    /// A memory store whose clock stands at `now_ns`.
    fn store_at(now_ns: u64) -> (MemoryStore, Arc<ManualClock>) {
        let clock = Arc::new(ManualClock::new(now_ns));
        (MemoryStore::builder().clock(clock.clone()).build(), clock)
    }

    #[test]
    fn limitador_and_tollgate_decide_alike_within_a_window() {
        // A day's window: limitador's opens at the first hit (real time), tollgate's at the
        // clock's day boundary (standing still), so no window closes during the trace on
        // either side and both must admit the first 3 hits of every key and nothing more.
        let (count, seconds) = (3, 86_400);
        let (ours, _) = store_at(20_000 * 86_400 * 1_000_000_000);
        let limit = tollgate_fixed_window(count, seconds);
        let theirs = RateLimiter::new_with_storage(Box::new(InMemoryStorage::new(1_000)));
        assert!(theirs.add_limit(limitador_fixed_window(count, seconds)));
        let namespace = NAMESPACE.into();
        let trace = ["a", "b", "a", "a", "c", "a", "b", "b", "b", "b", "a", "c", "c", "c", "d"];
        let mut decisions = Vec::new();
        for key in trace {
            let tollgate = ours.check_sync(key.as_bytes(), &limit, 1).expect("unit cost").allowed;
            let limited = theirs
                .check_rate_limited_and_update(&namespace, &limitador_context(key), 1)
                .expect("memory storage")
                .limited;
            assert_eq!(tollgate, !limited, "key {key} after {decisions:?}");
            decisions.push(tollgate);
        }
        let admitted = decisions.iter().filter(|&&d| d).count();
        assert_eq!(admitted, 3 + 3 + 3 + 1, "{decisions:?}");
    }

    /// Parses the `max_burst` and `count` of a `THROTTLE`/`CL.THROTTLE` command line.
    fn numbers(command: &str) -> Vec<i64> {
        command.split(' ').skip(2).map(|w| w.parse().expect("a number")).collect()
    }

    #[test]
    fn throttlecrab_decides_as_tollgate_with_the_translated_burst() {
        let (burst, count, seconds) = (4, 10, 1);
        let (cl_throttle, throttle) = throttle_commands(burst, count, seconds);
        assert_eq!(cl_throttle, "CL.THROTTLE {key} 3 10 1 1");
        assert_eq!(throttle, "THROTTLE {key} 4 10 1 1");
        let peer = numbers(&throttle);

        let start_ns = 1_800_000_000 * 1_000_000_000;
        let (ours, clock) = store_at(start_ns);
        let limit = tollgate_gcra(burst, count, seconds);
        let mut theirs = throttlecrab::RateLimiter::new(throttlecrab::PeriodicStore::new());
        // Bursts, pauses shorter and longer than the emission interval (100 ms), two keys.
        let steps_ms = [0, 0, 0, 0, 0, 0, 30, 70, 0, 100, 100, 0, 0, 250, 0, 0, 0, 1_000, 0, 0, 0, 0, 0, 10, 90];
        let mut now_ns = start_ns;
        let (mut admitted, mut checks) = (0, 0);
        for (i, step) in steps_ms.iter().enumerate() {
            now_ns += step * 1_000_000;
            clock.set(now_ns);
            let now = UNIX_EPOCH + Duration::from_nanos(now_ns);
            for key in ["x", "y"] {
                if key == "y" && i % 3 != 0 {
                    continue;
                }
                let tollgate = ours.check_sync(key.as_bytes(), &limit, 1).expect("unit cost").allowed;
                let (allowed, _) =
                    theirs.rate_limit(key, peer[0], peer[1], peer[2], peer[3], now).expect("valid limits");
                assert_eq!(tollgate, allowed, "key {key}, step {i} ({now_ns} ns)");
                admitted += usize::from(allowed);
                checks += 1;
            }
        }
        assert!(admitted > burst as usize && admitted < checks, "the trace admits some and denies some: {admitted}");
    }
}
