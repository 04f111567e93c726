//! Calendar windows (a day, week, month or year of a time zone) on the memory store and on a real
//! Redis, decided alike to the nanosecond: across DST changes, 29 February, months of every length
//! and year ends; the reset at the calendar boundary; on the server's clock too; and a client
//! whose clock is more than a window away from the server's refused, not guessed.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tollgate_store::redis::program::{VERSION, eval_source, period_arg};
use tollgate_store::remote::Remote;
use tollgate_store::testkit::redis_server::RedisServer;
use tollgate_store::{
    Algorithm, Check, Limit, ManualClock, MemoryStore, RedisOptions, RedisStore, Refund, Store, TimeSource,
};

const SEC: u64 = 1_000_000_000;
const HOUR: u64 = 3_600 * SEC;
const DAY: u64 = 24 * HOUR;

fn options(clock: Option<Arc<ManualClock>>) -> RedisOptions {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    RedisOptions {
        prefix: format!("c{}", NEXT.fetch_add(1, Ordering::Relaxed)),
        time: clock.map_or(TimeSource::Server, |c| TimeSource::Clock(c)),
        timeout: Duration::from_secs(2),
        ..RedisOptions::default()
    }
}

fn calendar(text: &str, zone: &str, algorithm: Algorithm) -> Limit {
    text.parse::<tollgate_core::LimitBuilder>().unwrap().tz(zone).algorithm(algorithm).build().unwrap()
}

/// Seconds since the epoch of some civil instants (checked against the core's boundary tests).
const BERLIN_2026_03_29: u64 = 1_774_738_800; // 2026-03-29T00:00:00+01:00, a 23-hour day
const BERLIN_2026_10_25: u64 = 1_792_879_200; // 2026-10-25T00:00:00+02:00, a 25-hour day
const NEW_YORK_2026_03_08: u64 = 1_772_946_000; // 2026-03-08T00:00:00-05:00, a 23-hour day
const UTC_2028_02_29: u64 = 1_835_395_200; // 2028-02-29T00:00:00Z
const UTC_2027_12_31: u64 = 1_830_211_200; // 2027-12-31T00:00:00Z

/// Each scenario: a limit, where its window starts and how long it lasts, instants to decide at
/// (offsets from that start, some past the window's end) and the cost of each.
fn scenarios() -> Vec<(Limit, u64, u64)> {
    let mut out = Vec::new();
    for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindow] {
        out.push((calendar("5/day", "Europe/Berlin", algorithm), BERLIN_2026_03_29 * SEC, 23 * HOUR));
        out.push((calendar("5/day", "Europe/Berlin", algorithm), BERLIN_2026_10_25 * SEC, 25 * HOUR));
        out.push((calendar("5/day", "America/New_York", algorithm), NEW_YORK_2026_03_08 * SEC, 23 * HOUR));
        out.push((calendar("5/day", "UTC", algorithm), UTC_2028_02_29 * SEC, DAY));
        out.push((calendar("7/month", "UTC", algorithm), (UTC_2028_02_29 - 28 * 86_400) * SEC, 29 * DAY));
        out.push((calendar("7/month", "UTC", algorithm), (UTC_2028_02_29 + 86_400) * SEC, 31 * DAY));
        // Berlin's March 2026: from 23:00Z on 28 February, 31 days less an hour.
        out.push((calendar("7/month", "Europe/Berlin", algorithm), 1_772_319_600 * SEC, 31 * DAY - HOUR));
        out.push((
            calendar("9/week", "Europe/Berlin", algorithm),
            (BERLIN_2026_10_25 - 6 * 86_400) * SEC,
            7 * DAY + HOUR,
        ));
        out.push((calendar("1000000/year", "UTC", algorithm), (UTC_2027_12_31 - 364 * 86_400) * SEC, 365 * DAY));
        out.push((calendar("11/year", "UTC", algorithm), (UTC_2027_12_31 + 86_400) * SEC, 366 * DAY));
    }
    out
}

/// Before: a calendar period did not parse ("unknown unit \"day\""). After: memory and Redis decide
/// every request alike, a fixed window resets at the zone's boundary, and a refund lands in its
/// own window.
#[tokio::test]
async fn calendar_windows_decide_alike_on_memory_and_redis_at_the_zones_boundaries() {
    let server = RedisServer::start();
    for (limit, start, length) in scenarios() {
        let clock = Arc::new(ManualClock::new(start));
        let redis = RedisStore::open(&server.url(), options(Some(clock.clone()))).unwrap();
        let memory = MemoryStore::builder().clock(clock.clone()).build();
        let end = start + length;
        assert_eq!(limit.window_at(start), (start, end), "{limit}");
        let count = limit.count();
        // Instants through the window, its last nanosecond, the next window and the one after.
        let steps = [
            (start, 1),
            (start + length / 3, count / 2),
            (start + length / 2 + 7, count),
            (end - 1, 1),
            (end, 1),
            (end + 1, count / 3 + 1),
            (end + length / 4 + 12_345, count),
            (end + length - 1, 1),
            (end + 2 * length + HOUR, count),
        ];
        for (i, (at, cost)) in steps.into_iter().enumerate() {
            clock.set(at);
            let check = [Check::new(b"k", &limit, cost)];
            let want = memory.decide(&check, &[]).await.unwrap();
            let got = redis.decide(&check, &[]).await.unwrap();
            assert_eq!(got, want, "{limit}: step {i} at {at}");
            let decision = got.decisions[0];
            if limit.algorithm() == Algorithm::FixedWindow && at < end && decision.reset_after_ns > 0 {
                assert_eq!(at + decision.reset_after_ns, end, "{limit}: the reset is the calendar boundary");
            }
            if decision.allowed && i % 3 == 1 {
                let refund = [Refund { check: check[0], at, decision }];
                memory.refund(&refund).await.unwrap();
                redis.refund(&refund).await.unwrap();
                let peek = [Check::new(b"k", &limit, 0)];
                assert_eq!(redis.decide(&peek, &[]).await.unwrap(), memory.decide(&peek, &[]).await.unwrap());
            }
        }
    }
}

/// On the server's clock (the default): the client sends the windows around its own now and the
/// script picks the server's; a fixed window's reset is the next UTC midnight, and its key lives
/// until then.
#[tokio::test]
async fn on_the_servers_clock_the_reset_is_the_next_midnight() {
    let server = RedisServer::start();
    let store = RedisStore::open(&server.url(), options(None)).unwrap();
    let limit = calendar("2/day", "UTC", Algorithm::FixedWindow);
    let checks = [Check::new(b"day", &limit, 1)];
    let first = store.decide(&checks, &[]).await.unwrap();
    let midnight = first.now_ns - first.now_ns % DAY + DAY;
    assert_eq!(first.decisions[0].remaining, 1);
    assert_eq!(first.now_ns + first.decisions[0].reset_after_ns, midnight);
    // The key lives until the calendar boundary, no longer.
    let key = String::from_utf8(store.state_key("", b"day", &limit).unwrap()).unwrap();
    let ttl_ms: u64 = server.cli(&["pttl", &key]).trim().parse().unwrap();
    let until_ms = (midnight - first.now_ns).div_ceil(1_000_000);
    assert!(ttl_ms <= until_ms && ttl_ms + 5_000 > until_ms, "a TTL of {ttl_ms} ms, {until_ms} ms to midnight");
    store.decide(&checks, &[]).await.unwrap();
    let denied = store.decide(&checks, &[]).await.unwrap();
    assert!(!denied.decisions[0].allowed);
    assert_eq!(denied.now_ns + denied.decisions[0].retry_after_ns, midnight);
}

/// A client whose windows do not hold the server's now (its clock more than a window away) is
/// refused with what happened, and nothing is written.
#[tokio::test]
async fn windows_that_miss_the_servers_now_are_refused() {
    let server = RedisServer::start();
    let limit = calendar("2/day", "UTC", Algorithm::SlidingWindow);
    let stale = period_arg(&limit, 1_700_000_000 * SEC);
    let (source, _) = eval_source();
    let client = redis::Client::open(server.url()).unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    let reply: Result<redis::Value, _> = redis::cmd("EVAL")
        .arg(&source)
        .arg(1)
        .arg("skewed")
        .arg(VERSION)
        .arg("")
        .arg("")
        .arg(0)
        .arg(1)
        .arg(0)
        .arg(0)
        .arg("sliding-window")
        .arg(2)
        .arg(&stale)
        .arg(2)
        .arg(1)
        .arg(1)
        .arg(1)
        .arg(1)
        .arg(0)
        .query_async(&mut connection)
        .await;
    let message = reply.unwrap_err().to_string();
    assert!(message.contains("TOLLGATE_CLOCK"), "{message}");
    assert!(message.contains("the server's now lies outside the calendar windows the client sent"), "{message}");
    assert_eq!(server.cli(&["exists", "skewed"]).trim(), "0");
    // The store says so as a backend error.
    let clock = Arc::new(ManualClock::new(1_700_000_000 * SEC));
    let store = RedisStore::open(&server.url(), options(Some(clock))).unwrap();
    assert!(store.check(b"fine", &limit, 1).await.unwrap().allowed, "a clock the client sends agrees with itself");
}

/// A reservation settled on a calendar limit corrects the key on the limit's calendar windows: a
/// difference above the estimate charged in the settle's window, one below refunded where the
/// estimate was counted, on Redis as on the memory store. Lord Howe's months (a 30-minute DST
/// shift) from the differential test's round 12, where it showed first: Redis's reservation record
/// kept the limit as its 32-day bound, so the settle charged on 32-day windows from the epoch
/// (the key's December count dropped for a fresh one), and a refund found no window to take from.
#[tokio::test]
async fn a_reservation_settles_on_the_calendar_windows_on_memory_and_redis() {
    let server = RedisServer::start();
    let december = 1_734_241_211 * SEC; // 2024-12-15T05:40:11Z, 16:40 (UTC+11) at Lord Howe
    let january = 1_736_794_302 * SEC; // 2025-01-13T18:51:42Z
    for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindow] {
        let limit = calendar("12/month", "Australia/Lord_Howe", algorithm);
        // Settled above the estimate (4 more charged) and below it (the estimate given back).
        for (actual, december_use) in [(5, 2 + 5), (0, 2)] {
            let clock = Arc::new(ManualClock::new(december));
            let redis = RedisStore::open(&server.url(), options(Some(clock.clone()))).unwrap();
            let memory = MemoryStore::builder().clock(clock.clone()).build();
            let peek = [Check::new(b"k", &limit, 0)];
            let used = async |at: u64| {
                clock.set(at);
                let want = memory.decide(&peek, &[]).await.unwrap();
                let got = redis.decide(&peek, &[]).await.unwrap();
                assert_eq!(got, want, "{limit}: settled at {actual}, peeked at {at}");
                (got.snapshots[0].used, got.snapshots[0].previous)
            };
            let admitted = [Check::new(b"k", &limit, 2)];
            assert!(memory.decide(&admitted, &[]).await.unwrap().decisions[0].allowed);
            assert!(redis.decide(&admitted, &[]).await.unwrap().decisions[0].allowed);
            let reserved = [Check::new(b"k", &limit, 1)];
            let on_memory = memory.reserve_until(&reserved, HOUR).await.unwrap().1.unwrap();
            let on_redis = redis.reserve_until(&reserved, HOUR).await.unwrap().1.unwrap();
            clock.set(december + HOUR / 2);
            assert_eq!(memory.settle(&on_memory.id, actual).await.unwrap().actual, actual);
            assert_eq!(redis.settle(&on_redis.id, actual).await.unwrap().actual, actual);
            assert_eq!(used(december + HOUR).await, (december_use, 0), "{limit}: December's use");
            let in_january = if algorithm == Algorithm::SlidingWindow { (0, december_use) } else { (0, 0) };
            assert_eq!(used(january).await, in_january, "{limit}: January after December's");
        }
    }
}
