//! Adversarial review of the live rate change (issue 40 item 2) on the stores: memory and Redis.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tollgate_store::testkit::redis_server::RedisServer;
use tollgate_store::{Algorithm, Check, Limit, ManualClock, MemoryStore, RedisOptions, RedisStore, Store, TimeSource};

const SEC: u64 = 1_000_000_000;
const DAY: u64 = 86_400 * SEC;
/// 2026-03-02T00:00:00Z.
const T0: u64 = 1_772_409_600 * SEC;

fn redis_options(clock: Arc<ManualClock>) -> RedisOptions {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    RedisOptions {
        prefix: format!("review{}", NEXT.fetch_add(1, Ordering::Relaxed)),
        time: TimeSource::Clock(clock),
        timeout: Duration::from_secs(2),
        clock_skew_margin: Duration::ZERO,
        ..RedisOptions::default()
    }
}

fn bucket(algorithm: Algorithm, count: u64, period_s: u64, burst: u64) -> Limit {
    Limit::builder(count, Duration::from_secs(period_s)).algorithm(algorithm).burst(burst).build().unwrap()
}

/// Per bucket algorithm: 40 days of debt charged under 1/s, one unit charged under 1/min, one
/// under 1/s again; then whether a request under 1/s is admitted 20 hours and 22 hours later.
async fn debt_round_trip<S: Store>(store: &S, clock: &ManualClock) -> Vec<(Algorithm, bool, bool)> {
    let mut seen = Vec::new();
    for algorithm in [Algorithm::Gcra, Algorithm::TokenBucket, Algorithm::LeakyBucket] {
        clock.set(T0);
        let (fast, slow) = (bucket(algorithm, 1, 1, 1), bucket(algorithm, 1, 60, 1));
        let key: &[u8] = b"{indebted}";
        store.charge(&[Check::new(key, &fast, 40 * 86_400)]).await.unwrap();
        store.charge(&[Check::new(key, &slow, 1)]).await.unwrap();
        store.charge(&[Check::new(key, &fast, 1)]).await.unwrap();
        clock.set(T0 + 20 * 3_600 * SEC);
        let early = store.check_one(Check::new(key, &fast, 1)).await.unwrap().allowed;
        clock.set(T0 + 22 * 3_600 * SEC);
        seen.push((algorithm, early, store.check_one(Check::new(key, &fast, 1)).await.unwrap().allowed));
    }
    seen
}

/// The bound SEMANTICS documents for a round trip through a slower rate (the review found it as
/// an over-grant; kept as a bound): a 40-day debt under 1/s, charged once under 1/min, is capped
/// at 52 days *of the slow rate* (74,880 units), which the fast rate pays back in 20.8 hours:
/// refused at 20 hours, admitted at 22, on the memory store and on Redis alike.
#[tokio::test]
async fn a_round_trip_through_a_slower_rate_keeps_what_its_cap_leaves_on_memory_and_redis() {
    let clock = Arc::new(ManualClock::new(T0));
    let memory = MemoryStore::builder().clock(clock.clone()).build();
    let expected: Vec<_> =
        [Algorithm::Gcra, Algorithm::TokenBucket, Algorithm::LeakyBucket].map(|a| (a, false, true)).to_vec();
    let seen = debt_round_trip(&memory, &clock).await;
    let server = RedisServer::start();
    let clock = Arc::new(ManualClock::new(T0));
    let redis = RedisStore::open(&server.url(), redis_options(clock.clone())).unwrap();
    let redis_seen = debt_round_trip(&redis, &clock).await;
    assert_eq!(
        (seen, redis_seen),
        (expected.clone(), expected),
        "(memory, Redis): (algorithm, admitted 20 h, admitted 22 h into a 40-day debt under 1/s after one charge under 1/min)"
    );
}

/// Threads hammering one GCRA key at one instant (a manual clock), half under "10 a second, burst
/// 10", half under "40 a second, burst 10" (another emission interval: the slow path under the
/// shard's write lock, rescheduling every time the rate flips): nothing frees anything at a
/// fixed instant and rescheduling keeps the units spent, so no more than 10 are admitted in all.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn threads_flipping_a_key_between_rates_admit_no_more_than_its_burst() {
    for round in 0..20u64 {
        let clock = Arc::new(ManualClock::new(T0 + round * DAY));
        let store = Arc::new(MemoryStore::builder().clock(clock.clone()).build());
        let admitted = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for thread in 0..8u64 {
            let (store, admitted) = (store.clone(), admitted.clone());
            tasks.push(tokio::spawn(async move {
                let limit = if thread % 2 == 0 {
                    bucket(Algorithm::Gcra, 10, 1, 10)
                } else {
                    bucket(Algorithm::Gcra, 40, 1, 10)
                };
                for _ in 0..200 {
                    if store.check_one(Check::new(b"hot", &limit, 1)).await.unwrap().allowed {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                    tokio::task::yield_now().await;
                }
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        let admitted = admitted.load(Ordering::Relaxed);
        assert!(admitted <= 10, "round {round}: {admitted} admitted at one instant under two limits of burst 10");
    }
}

/// A sliding window key spent under "10 a minute", then read under "10 an hour" (a rules reload
/// lengthening the period: the same Redis key): 10 admitted at 00:19:10, 1 at 00:20:59, then 1
/// asked at 00:20:59.5 under the hour. Returns (admitted, remaining, retry_after) of that ask.
async fn lengthened_period<S: Store>(store: &S, clock: &ManualClock) -> (bool, u64, u64) {
    let minute = Limit::builder(10, Duration::from_secs(60)).algorithm(Algorithm::SlidingWindow).build().unwrap();
    let hour = Limit::builder(10, Duration::from_secs(3600)).algorithm(Algorithm::SlidingWindow).build().unwrap();
    clock.set(T0 + 19 * 60 * SEC + 10 * SEC);
    assert!(store.check_one(Check::new(b"lengthened", &minute, 10)).await.unwrap().allowed);
    clock.set(T0 + 20 * 60 * SEC + 59 * SEC);
    assert!(store.check_one(Check::new(b"lengthened", &minute, 1)).await.unwrap().allowed);
    clock.set(T0 + 20 * 60 * SEC + 59 * SEC + SEC / 2);
    let d = store.check_one(Check::new(b"lengthened", &hour, 1)).await.unwrap();
    (d.allowed, d.remaining, d.retry_after_ns)
}

/// The same key and calls decide alike on the memory store and on Redis ("Redis decides as the
/// memory store"), a period change included (both keep the stored window's own start).
#[tokio::test]
async fn a_lengthened_sliding_window_decides_alike_on_memory_and_redis() {
    let clock = Arc::new(ManualClock::new(T0));
    let memory = MemoryStore::builder().clock(clock.clone()).build();
    let on_memory = lengthened_period(&memory, &clock).await;
    let server = RedisServer::start();
    let clock = Arc::new(ManualClock::new(T0));
    let redis = RedisStore::open(&server.url(), redis_options(clock.clone())).unwrap();
    let on_redis = lengthened_period(&redis, &clock).await;
    assert_eq!(on_redis, on_memory, "(admitted, remaining, retry_after) under 10/h after 10/min: Redis vs memory");
}

/// Per bucket algorithm: 11 spent at T0 under "100 a minute, burst 11" (0.6 s each), then the
/// key's limit lowered to "1 a minute, burst 1" and asked at T0 + 1 ms (refused: its 11 units
/// are 11 minutes at the new rate), and asked again halfway through the `retry_after` that
/// refusal announced, nothing else having happened. Returns (first refused, its retry_after,
/// admitted halfway).
async fn lowered_then_waited<S: Store>(store: &S, clock: &ManualClock) -> Vec<(Algorithm, bool, u64, bool)> {
    let mut seen = Vec::new();
    for algorithm in [Algorithm::Gcra, Algorithm::TokenBucket, Algorithm::LeakyBucket] {
        clock.set(T0);
        let (fast, slow) = (bucket(algorithm, 100, 60, 11), bucket(algorithm, 1, 60, 1));
        let key: &[u8] = b"{lowered}";
        assert!(store.check_one(Check::new(key, &fast, 11)).await.unwrap().allowed, "{algorithm}");
        clock.set(T0 + 1_000_000);
        let refused = store.check_one(Check::new(key, &slow, 1)).await.unwrap();
        clock.set(T0 + 1_000_000 + refused.retry_after_ns / 2);
        let later = store.check_one(Check::new(key, &slow, 1)).await.unwrap();
        seen.push((algorithm, !refused.allowed, refused.retry_after_ns / SEC, later.allowed));
    }
    seen
}

/// SEMANTICS: `retry_after` is "how long until this same request would be admitted if nothing
/// else happens", and lowering a limit never refunds. Lowered from 100/min to 1/min with 11
/// spent, a request is refused with retry_after ≈ 11 minutes (its units rescheduled at the new
/// rate), yet the same request 5.5 minutes later, nothing else having happened, is admitted:
/// the refusal wrote nothing, so the stored schedule went on draining at the old rate and was
/// empty after 6.6 s (the 11 units spent are refunded 100 times faster than the new limit says).
#[tokio::test]
async fn a_lowered_limit_keeps_its_refusal_for_the_retry_after_it_announced_on_memory_and_redis() {
    let clock = Arc::new(ManualClock::new(T0));
    let memory = MemoryStore::builder().clock(clock.clone()).build();
    let on_memory = lowered_then_waited(&memory, &clock).await;
    let server = RedisServer::start();
    let clock = Arc::new(ManualClock::new(T0));
    let redis = RedisStore::open(&server.url(), redis_options(clock.clone())).unwrap();
    let on_redis = lowered_then_waited(&redis, &clock).await;
    let expected: Vec<_> =
        [Algorithm::Gcra, Algorithm::TokenBucket, Algorithm::LeakyBucket].map(|a| (a, true, 659, false)).to_vec();
    assert_eq!(
        (on_memory, on_redis),
        (expected.clone(), expected),
        "(memory, Redis): (algorithm, refused under the lowered limit, its retry_after in s, admitted halfway through it)"
    );
}

/// A fixed window debt written under "1000 a minute" (5000 charged: 5 minutes, the key's TTL)
/// and read under "10 a minute" (a lowered limit; windows read their count against the new count,
/// so the 5000 are 500 minutes of it): the memory store keeps refusing at minute 6 (its slot
/// stays), and Redis announces the same reset (500 minutes) — but its key lives only the 5 minutes
/// computed under the old count, so on Redis the debt is forgotten after 5 minutes while the
/// memory store keeps it ("a key in debt must not expire before its debt is paid"; Redis decides
/// as the memory store).
#[tokio::test]
async fn a_window_debt_read_under_a_lowered_count_outlives_its_redis_key() {
    let high = Limit::builder(1000, Duration::from_secs(60)).algorithm(Algorithm::FixedWindow).build().unwrap();
    let low = Limit::builder(10, Duration::from_secs(60)).algorithm(Algorithm::FixedWindow).build().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let memory = MemoryStore::builder().clock(clock.clone()).build();
    memory.charge(&[Check::new(b"debt", &high, 5000)]).await.unwrap();
    clock.set(T0 + 6 * 60 * SEC);
    let memory_later = memory.check_one(Check::new(b"debt", &low, 1)).await.unwrap();
    let server = RedisServer::start();
    let clock = Arc::new(ManualClock::new(T0));
    let redis = RedisStore::open(&server.url(), redis_options(clock.clone())).unwrap();
    redis.charge(&[Check::new(b"debt", &high, 5000)]).await.unwrap();
    let refused = redis.check_one(Check::new(b"debt", &low, 1)).await.unwrap();
    let name = String::from_utf8(redis.state_key("", b"debt", &low).unwrap()).unwrap();
    let ttl_ms: u64 = server.cli(&["pttl", &name]).trim().parse().unwrap();
    let reset_ms = refused.reset_after_ns / 1_000_000;
    assert_eq!(
        (memory_later.allowed, !refused.allowed, ttl_ms + 1_000 >= reset_ms),
        (false, true, true),
        "(memory admits at minute 6 under 10/min, Redis refuses at once, the Redis key lives as long as the \
         reset it announces): key TTL {ttl_ms} ms, announced reset {reset_ms} ms"
    );
}

/// Berlin's spring change: 2026-03-29 is a 23-hour day (00:00 CET = 2026-03-28T23:00Z).
const BERLIN_2026_03_29: u64 = 1_774_738_800 * SEC;
const HOUR: u64 = 3_600 * SEC;

/// A calendar day's debt across the spring change, its count changed between calls (10 a day,
/// then 4, then 30), asked at instants from the day before the change to a week after it, with
/// charges and checks: every decision the same on the memory store and on Redis (and no error).
async fn calendar_debt_with_changes<S: Store>(
    store: &S,
    clock: &ManualClock,
    unit: &str,
    gap: u64,
) -> Vec<Result<(bool, u64, u64, u64), String>> {
    let day = |count: u64, algorithm: Algorithm| {
        format!("{count}/{unit}")
            .parse::<tollgate_core::LimitBuilder>()
            .unwrap()
            .tz("Europe/Berlin")
            .algorithm(algorithm)
            .build()
            .unwrap()
    };
    let mut seen = Vec::new();
    for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindow] {
        let limits = [day(10, algorithm), day(4, algorithm), day(30, algorithm)];
        let key: &[u8] = if algorithm == Algorithm::FixedWindow { b"{cal-fixed}" } else { b"{cal-sliding}" };
        let start = BERLIN_2026_03_29 - DAY + 20 * HOUR;
        let mut at = start;
        for step in 0..40u64 {
            at += (step % 7 + 1) * gap + step * 1_000_000;
            clock.set(at);
            let limit = &limits[(step % 3) as usize];
            if step % 5 == 0 {
                let charged = store.charge(&[Check::new(key, limit, 3 * limit.count())]).await;
                seen.push(charged.map(|()| (true, 0, 0, 0)).map_err(|e| format!("charge at {}: {e}", at - start)));
            }
            let d = store.check_one(Check::new(key, limit, 1 + step % 3)).await;
            seen.push(
                d.map(|d| (d.allowed, d.remaining, d.retry_after_ns, d.reset_after_ns))
                    .map_err(|e| format!("check at {}: {e}", at - start)),
            );
        }
    }
    seen
}

#[tokio::test]
async fn a_calendar_debt_with_count_changes_across_dst_decides_alike_on_memory_and_redis() {
    let server = RedisServer::start();
    for (unit, gap) in [("day", 5 * HOUR), ("week", 31 * HOUR), ("week", 3 * DAY + HOUR)] {
        let clock = Arc::new(ManualClock::new(T0));
        let memory = MemoryStore::builder().clock(clock.clone()).build();
        let on_memory = calendar_debt_with_changes(&memory, &clock, unit, gap).await;
        let clock = Arc::new(ManualClock::new(T0));
        let redis = RedisStore::open(&server.url(), redis_options(clock.clone())).unwrap();
        let on_redis = calendar_debt_with_changes(&redis, &clock, unit, gap).await;
        assert!(on_memory.iter().all(Result::is_ok), "memory: {on_memory:?}");
        for (i, (m, r)) in on_memory.iter().zip(&on_redis).enumerate() {
            assert_eq!(
                r, m,
                "{unit} every {gap} ns, call {i}: Redis vs memory (allowed, remaining, retry_after, reset_after)"
            );
        }
    }
}

/// The same for the sliding window counter and for calendar days (fixed and sliding): a window
/// that counted up to the old count carries nothing and lives to its window's end, but read under
/// a lowered count it is in debt into the next window(s); a refusal then lengthens the key's TTL
/// to the reset it announces, and the memory store and Redis decide alike one window later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_window_algorithm_keeps_a_debt_read_under_a_lowered_count_on_redis() {
    let server = RedisServer::start();
    let clock = Arc::new(ManualClock::new(T0));
    let redis = RedisStore::open(&server.url(), redis_options(clock.clone())).unwrap();
    let memory = MemoryStore::builder().clock(clock.clone()).build();
    let minute = |count: u64, algorithm: Algorithm| {
        Limit::builder(count, Duration::from_secs(60)).algorithm(algorithm).build().unwrap()
    };
    let day = |count: u64, algorithm: Algorithm| Limit::per_day(count).algorithm(algorithm).build().unwrap();
    let mut seen = Vec::new();
    for (name, high, low, window) in [
        ("sliding 1m", minute(1000, Algorithm::SlidingWindow), minute(10, Algorithm::SlidingWindow), 60 * SEC),
        ("fixed day", day(1000, Algorithm::FixedWindow), day(10, Algorithm::FixedWindow), DAY),
        ("sliding day", day(1000, Algorithm::SlidingWindow), day(10, Algorithm::SlidingWindow), DAY),
    ] {
        clock.set(T0);
        let key = name.as_bytes();
        assert!(redis.check_one(Check::new(key, &high, 1000)).await.unwrap().allowed, "{name}");
        assert!(memory.check_one(Check::new(key, &high, 1000)).await.unwrap().allowed, "{name}");
        let refused = redis.check_one(Check::new(key, &low, 1)).await.unwrap();
        let state = String::from_utf8(redis.state_key("", key, &low).unwrap()).unwrap();
        let ttl_ms: u64 = server.cli(&["pttl", &state]).trim().parse().unwrap();
        clock.set(T0 + window + window / 2);
        let later = (
            redis.check_one(Check::new(key, &low, 1)).await.unwrap().allowed,
            memory.check_one(Check::new(key, &low, 1)).await.unwrap().allowed,
        );
        seen.push((name, refused.allowed, ttl_ms + 1_000 >= refused.reset_after_ns / 1_000_000, later));
    }
    assert_eq!(
        seen,
        [
            ("sliding 1m", false, true, (false, false)),
            ("fixed day", false, true, (false, false)),
            ("sliding day", false, true, (false, false)),
        ],
        "(name, admitted under the lowered count, the key lives as long as the reset announced, (Redis, memory) \
         admit a window and a half later)"
    );
}
