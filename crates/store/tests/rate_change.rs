//! A live rate change keeps what was spent (issue 40 item 2), on the memory store and on Redis
//! alike: a key spent under one limit and checked under another of the same algorithm counts the
//! units spent against the new limit at once; raising grants the difference now, lowering never
//! refunds. State written before the rates were recorded still decides as before.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tollgate_store::testkit::redis_server::RedisServer;
use tollgate_store::{Algorithm, Check, Limit, ManualClock, MemoryStore, RedisOptions, RedisStore, Store, TimeSource};

const SEC: u64 = 1_000_000_000;
/// 2026-03-02T00:00:00Z: a window start for every period used here.
const T0: u64 = 1_772_409_600 * SEC;

fn redis_options(clock: Arc<ManualClock>) -> RedisOptions {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    RedisOptions {
        prefix: format!("rate{}", NEXT.fetch_add(1, Ordering::Relaxed)),
        time: TimeSource::Clock(clock),
        timeout: Duration::from_secs(2),
        clock_skew_margin: Duration::ZERO,
        ..RedisOptions::default()
    }
}

/// `(count, period in s, burst)` as a limit of `algorithm` (the burst for the bucket family).
fn limit(algorithm: Algorithm, count: u64, period_s: u64, burst: u64) -> Limit {
    let builder = Limit::builder(count, Duration::from_secs(period_s)).algorithm(algorithm);
    if algorithm.is_bucket() { builder.burst(burst) } else { builder }.build().unwrap()
}

/// Per algorithm: what is left after spending 1 unit under "1 per minute" and then one more
/// under the raised limit (11 now, 100/s; the window family: 11 a minute), and after lowering
/// from 10 a minute to 2 a minute with 5 spent.
async fn rate_changes<S: Store>(store: &S, clock: &ManualClock) -> Vec<(Algorithm, bool, u64, bool)> {
    let mut seen = Vec::new();
    for algorithm in Algorithm::ALL {
        clock.set(T0);
        let (low, raised) = if algorithm.is_bucket() {
            (limit(algorithm, 1, 60, 1), limit(algorithm, 100, 1, 11))
        } else {
            (limit(algorithm, 1, 60, 1), limit(algorithm, 11, 60, 11))
        };
        let key: &[u8] = b"{upgraded}";
        assert!(store.check_one(Check::new(key, &low, 1)).await.unwrap().allowed, "{algorithm}");
        assert!(!store.check_one(Check::new(key, &low, 1)).await.unwrap().allowed, "{algorithm}");
        let after = store.check_one(Check::new(key, &raised, 1)).await.unwrap();
        // Lowered: 5 spent of 10 a minute, then 2 a minute: nothing is left, and nothing is refunded.
        let (ten, two) = (limit(algorithm, 10, 60, 10), limit(algorithm, 2, 60, 2));
        let lowered: &[u8] = b"{lowered}";
        assert!(store.check_one(Check::new(lowered, &ten, 5)).await.unwrap().allowed, "{algorithm}");
        let refused = !store.check_one(Check::new(lowered, &two, 1)).await.unwrap().allowed;
        seen.push((algorithm, after.allowed, after.remaining, refused));
    }
    seen
}

#[tokio::test]
async fn a_raised_limit_applies_at_once_and_a_lowered_one_refunds_nothing_on_memory_and_redis() {
    let clock = Arc::new(ManualClock::new(T0));
    let memory = MemoryStore::builder().clock(clock.clone()).build();
    let want = rate_changes(&memory, &clock).await;
    let expected: Vec<_> = Algorithm::ALL.iter().map(|&a| (a, true, 9, true)).collect();
    assert_eq!(
        want, expected,
        "(algorithm, admitted under the raised limit, left of 11 with 2 spent, lowered refuses)"
    );
    let server = RedisServer::start();
    let clock = Arc::new(ManualClock::new(T0));
    let redis = RedisStore::open(&server.url(), redis_options(clock.clone())).unwrap();
    assert_eq!(rate_changes(&redis, &clock).await, want, "Redis decides as the memory store");
}

/// A bucket's value written before the rate was recorded (`tat`; `tokens last`; `level last`) is
/// read as scheduled at the limit's own rate: the same decisions as before, and written back
/// with its rate.
#[tokio::test]
async fn state_written_before_the_rate_was_recorded_decides_as_before() {
    let server = RedisServer::start();
    let clock = Arc::new(ManualClock::new(T0));
    let redis = RedisStore::open(&server.url(), redis_options(clock.clone())).unwrap();
    // 10 a minute (T = 6 s), burst 10: 4 units spent at T0, in each algorithm's old format.
    let old_values = [
        (Algorithm::Gcra, format!("{}", T0 + 4 * 6 * SEC)),
        (Algorithm::TokenBucket, format!("{} {}", 6 * 6 * SEC, T0)),
        (Algorithm::LeakyBucket, format!("{} {}", 4 * 6 * SEC, T0)),
    ];
    for (algorithm, value) in old_values {
        let limit = limit(algorithm, 10, 60, 10);
        let name = String::from_utf8(redis.state_key("", b"old", &limit).unwrap()).unwrap();
        assert_eq!(server.cli(&["set", &name, &value, "px", "600000"]).trim(), "OK");
        let peek = redis.check_one(Check::new(b"old", &limit, 0)).await.unwrap();
        assert_eq!(peek.remaining, 6, "{algorithm}: 4 of 10 spent, read at the limit's own rate");
        assert!(redis.check_one(Check::new(b"old", &limit, 6)).await.unwrap().allowed, "{algorithm}");
        assert!(!redis.check_one(Check::new(b"old", &limit, 1)).await.unwrap().allowed, "{algorithm}");
        let written = server.cli(&["get", &name]);
        let fields: Vec<&str> = written.split_whitespace().collect();
        let interval = if algorithm == Algorithm::Gcra { 1 } else { 2 };
        assert_eq!(fields.get(interval).copied(), Some("6000000000"), "{algorithm}: written with its rate: {written}");
    }
}

/// Per bucket algorithm: 11 spent under "100 a minute, burst 11", then the key checked with
/// another (idle) key in one all-or-nothing call under "1 a minute, burst 1" (refused: the call
/// admits nothing), then the same call again halfway through the `retry_after` it announced.
/// Returns (refused, its retry_after in s, admitted halfway).
async fn lowered_in_a_call_of_two<S: Store>(store: &S, clock: &ManualClock) -> Vec<(Algorithm, bool, u64, bool)> {
    let mut seen = Vec::new();
    for algorithm in [Algorithm::Gcra, Algorithm::TokenBucket, Algorithm::LeakyBucket] {
        clock.set(T0);
        let (fast, slow) = (limit(algorithm, 100, 60, 11), limit(algorithm, 1, 60, 1));
        let (key, other): (&[u8], &[u8]) = (b"{pair}:lowered", b"{pair}:other");
        assert!(store.check_one(Check::new(key, &fast, 11)).await.unwrap().allowed, "{algorithm}");
        clock.set(T0 + 1_000_000);
        let call = [Check::new(other, &slow, 1), Check::new(key, &slow, 1)];
        let refused = store.check_all(&call).await.unwrap()[1];
        clock.set(T0 + 1_000_000 + refused.retry_after_ns / 2);
        let later = store.check_all(&call).await.unwrap()[1];
        seen.push((algorithm, !refused.allowed, refused.retry_after_ns / SEC, later.allowed));
    }
    seen
}

/// A refusal under a lowered limit within a call of several checks writes the key rescaled too
/// (the call's other checks admit nothing), so the `retry_after` it announced holds.
#[tokio::test]
async fn a_lowered_limit_keeps_its_refusal_within_a_call_of_several_checks_on_memory_and_redis() {
    let clock = Arc::new(ManualClock::new(T0));
    let memory = MemoryStore::builder().clock(clock.clone()).build();
    let on_memory = lowered_in_a_call_of_two(&memory, &clock).await;
    let server = RedisServer::start();
    let clock = Arc::new(ManualClock::new(T0));
    let redis = RedisStore::open(&server.url(), redis_options(clock.clone())).unwrap();
    let on_redis = lowered_in_a_call_of_two(&redis, &clock).await;
    let expected: Vec<_> =
        [Algorithm::Gcra, Algorithm::TokenBucket, Algorithm::LeakyBucket].map(|a| (a, true, 659, false)).to_vec();
    assert_eq!(
        (on_memory, on_redis),
        (expected.clone(), expected),
        "(memory, Redis): (algorithm, refused in the call, its retry_after in s, admitted halfway through it)"
    );
}
