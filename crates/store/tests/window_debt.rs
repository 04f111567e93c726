//! A window charged past its count (issue 39: LLM tokens counted from the response) carries the
//! excess into the windows after it, on the memory store and on Redis alike, decision for
//! decision, and Redis keeps the key as long as its debt lasts.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tollgate_core::LimitBuilder;
use tollgate_store::testkit::redis_server::RedisServer;
use tollgate_store::{
    Algorithm, Check, Clock, Decision, Limit, ManualClock, MemoryStore, RedisOptions, RedisStore, Store, TimeSource,
};

const SEC: u64 = 1_000_000_000;
const MINUTE: u64 = 60 * SEC;
const DAY: u64 = 86_400 * SEC;
/// 2026-03-02T00:00:00Z, a Monday at midnight UTC: a window start for minutes and days.
const T0: u64 = 1_772_409_600 * SEC;

fn redis_options(clock: Arc<ManualClock>) -> RedisOptions {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    RedisOptions {
        prefix: format!("debt{}", NEXT.fetch_add(1, Ordering::Relaxed)),
        time: TimeSource::Clock(clock),
        timeout: Duration::from_secs(2),
        clock_skew_margin: Duration::ZERO,
        ..RedisOptions::default()
    }
}

fn limit(text: &str, algorithm: Algorithm) -> Limit {
    text.parse::<LimitBuilder>().unwrap().algorithm(algorithm).build().unwrap()
}

/// What a store decides for one unit at each instant of `at` after 5 × `count` was used at `T0`.
async fn decisions_after_a_debt<S: Store>(store: &S, clock: &ManualClock, limit: &Limit, at: &[u64]) -> Vec<Decision> {
    clock.set(T0 + SEC);
    let check = |cost| Check::new(b"{debtor}", limit, cost);
    assert!(store.check_one(check(limit.count() / 10)).await.unwrap().allowed, "{limit}");
    store.charge(&[check(5 * limit.count() - limit.count() / 10)]).await.unwrap();
    let mut seen = Vec::new();
    for &t in at {
        clock.set(t);
        seen.push(store.check_one(check(1)).await.unwrap());
    }
    seen
}

/// 5000 charged under `1000/1m` (fixed window and sliding window counter): the next four
/// minutes admit nothing, the fifth does (the fixed window at once, the sliding window counter
/// once the fourth minute's carried 1000 has weighed down by one unit); Redis answers exactly
/// as the memory store, and keeps the key until the debt is paid.
#[tokio::test]
async fn a_debt_past_the_count_outlives_the_window_on_memory_and_redis() {
    let server = RedisServer::start();
    for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindow] {
        let limit = limit("1000/1m", algorithm);
        let at: Vec<u64> = (1..=5).flat_map(|m| [T0 + m * MINUTE, T0 + m * MINUTE + 59 * SEC]).collect();
        let clock = Arc::new(ManualClock::new(T0));
        let memory = MemoryStore::builder().clock(clock.clone()).build();
        let want = decisions_after_a_debt(&memory, &clock, &limit, &at).await;
        let admitted: Vec<bool> = want.iter().map(|d| d.allowed).collect();
        let fifth = matches!(algorithm, Algorithm::FixedWindow);
        assert_eq!(
            admitted,
            [false, false, false, false, false, false, false, false, fifth, true],
            "{algorithm}: minutes 1 to 4 pay the debt, the fifth is free again"
        );
        let clock = Arc::new(ManualClock::new(T0));
        let redis = RedisStore::open(&server.url(), redis_options(clock.clone())).unwrap();
        let got = decisions_after_a_debt(&redis, &clock, &limit, &at).await;
        assert_eq!(got, want, "{algorithm}: Redis decides as the memory store");
        // The key is written at the last instant; a new debt shows its TTL covers the debt.
        clock.set(T0 + 20 * MINUTE);
        redis.charge(&[Check::new(b"{ttl}", &limit, 5000)]).await.unwrap();
        let name = String::from_utf8(redis.state_key("", b"{ttl}", &limit).unwrap()).unwrap();
        let ttl_ms: u64 = server.cli(&["pttl", &name]).trim().parse().unwrap();
        let lives = if fifth { 5 * MINUTE } else { 6 * MINUTE } / 1_000_000;
        assert!(ttl_ms + 1_000 >= lives && ttl_ms <= lives + 1_000, "{algorithm}: PTTL {ttl_ms} ms, debt {lives} ms");
    }
}

/// On calendar days, a debt is carried into the next day only (the script sees a few windows
/// around now): 50 charged under `10/day` counts 20 (a day's count and the next day's), which
/// leaves the next day full and the one after free; both stores agree.
#[tokio::test]
async fn a_calendar_days_debt_reaches_the_next_day_only_on_memory_and_redis() {
    let server = RedisServer::start();
    for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindow] {
        let limit = limit("10/day", algorithm);
        let at = [T0 + DAY, T0 + DAY + 23 * 3_600 * SEC, T0 + 2 * DAY + 12 * 3_600 * SEC, T0 + 3 * DAY];
        let clock = Arc::new(ManualClock::new(T0));
        let memory = MemoryStore::builder().clock(clock.clone()).build();
        let want = decisions_after_a_debt(&memory, &clock, &limit, &at).await;
        let admitted: Vec<bool> = want.iter().map(|d| d.allowed).collect();
        assert_eq!(admitted, [false, false, true, true], "{algorithm}: the next day owes 10, the rest is forgiven");
        let clock = Arc::new(ManualClock::new(T0));
        let redis = RedisStore::open(&server.url(), redis_options(clock.clone())).unwrap();
        let got = decisions_after_a_debt(&redis, &clock, &limit, &at).await;
        assert_eq!(got, want, "{algorithm}: Redis decides as the memory store");
        assert_eq!(clock.now_ns(), T0 + 3 * DAY);
    }
}
