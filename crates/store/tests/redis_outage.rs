//! The failure policy over a real redis-server that dies, pauses or freezes mid-run: every call
//! answered within the timeout (and at once once the breaker is open), never more than the limit
//! admitted by one node, and Redis used again once it answers.
//!
//! Wall-clock bounds here are generous (several times the expected figure): they catch a call
//! waiting on a dead backend, not a slow machine. The measured figures are printed.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tollgate_store::testkit::redis_server::RedisServer;
use tollgate_store::{FailurePolicy, Fallback, Limit, RedisOptions, RedisStore, Store};

const TIMEOUT: Duration = Duration::from_millis(50);

fn fallback(server: &RedisServer, policy: FailurePolicy) -> Arc<Fallback<RedisStore>> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let options = RedisOptions {
        prefix: format!("o{}", NEXT.fetch_add(1, Ordering::Relaxed)),
        timeout: TIMEOUT,
        ..RedisOptions::default()
    };
    Arc::new(Fallback::new(RedisStore::open(&server.url(), options).unwrap(), policy))
}

/// 64 tasks × 200 calls on one key; `interrupt` runs once the calls have started. Returns how
/// many were admitted and how long the run took.
async fn hammer(store: &Arc<Fallback<RedisStore>>, limit: &Limit, interrupt: impl FnOnce()) -> (u64, Duration) {
    let admitted = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let (store, limit, admitted) = (store.clone(), limit.clone(), admitted.clone());
            tokio::spawn(async move {
                for _ in 0..200 {
                    if store.check(b"hot", &limit, 1).await.unwrap().allowed {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(30)).await;
    interrupt();
    for task in tasks {
        task.await.unwrap();
    }
    (admitted.load(Ordering::Relaxed), started.elapsed())
}

/// Waits until the breaker is closed and the node's local admissions are charged to Redis.
async fn settled(store: &Fallback<RedisStore>) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while store.stats().breaker_open || store.stats().debts > 0 {
        assert!(Instant::now() < deadline, "not settled: {:?}", store.stats());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A way to interrupt a running redis-server.
type Interruption = Box<dyn Fn(&RedisServer)>;

/// Before: with Redis paused for 400 ms mid-run, the local fallback started every key from a full
/// bucket and this admitted 1,000 under a burst of 500 (and 501 in one run of four unpaused,
/// from a single timed-out call).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_or_frozen_redis_never_makes_one_node_over_grant() {
    let server = RedisServer::start();
    let interruptions: [(&str, Interruption); 3] = [
        ("CLIENT PAUSE 400 ALL", Box::new(|s: &RedisServer| drop(s.cli(&["client", "pause", "400", "all"])))),
        (
            "DEBUG SLEEP 0.4",
            Box::new(|s: &RedisServer| {
                let port = s.port().to_string();
                std::thread::spawn(move || {
                    let _ =
                        std::process::Command::new("redis-cli").args(["-p", &port, "debug", "sleep", "0.4"]).output();
                });
            }),
        ),
        (
            "SIGSTOP for 400 ms",
            Box::new(|s: &RedisServer| {
                s.freeze();
                std::thread::sleep(Duration::from_millis(400));
                s.thaw();
            }),
        ),
    ];
    // Per hour: a refill every 7.2 s (or 0.72 s), so over a run of a second the bound is the
    // burst (+1). With 500 the key is exhausted before the interruption (the old fallback then
    // admitted 500 more from a full bucket); with 5,000 the interruption comes mid-way and the
    // local fallback admits the rest, charged to Redis afterwards.
    for burst in [500, 5_000] {
        let limit = Limit::per_hour(burst).burst(burst).build().unwrap();
        for (how, interrupt) in &interruptions {
            let store = fallback(&server, FailurePolicy::Local);
            let (admitted, took) = hammer(&store, &limit, || interrupt(&server)).await;
            settled(&store).await;
            let bound = burst + u64::try_from(took.as_nanos()).unwrap() / limit.emission_interval_ns() + 1;
            let stats = store.stats();
            println!("burst {burst}, {how}: {admitted} admitted of 12,800 in {took:?} (bound {bound}); {stats:?}");
            assert!(admitted <= bound, "{how}: {admitted} admitted, more than {bound}");
            assert!(admitted + 64 >= burst, "{how}: {admitted}: the limit should have been (nearly) reached");
            assert!(stats.fallbacks > 0, "{how}: the interruption was felt");
            let left = store.inner().peek(b"hot", &limit).await.unwrap();
            assert_eq!(left.remaining, 0, "{how}: Redis counts every admission, the local ones included");
        }
    }
}

/// Killed mid-run: every call answered within the timeout, at once once the breaker is open
/// (no round trip), each by the policy; Redis used again soon after it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_redis_costs_at_most_a_few_timeouts_and_is_used_again_once_back() {
    let mut server = RedisServer::start();
    let limit = Limit::per_second(3).build().unwrap();
    for (name, policy, expected) in
        [("open", FailurePolicy::Open, 20), ("closed", FailurePolicy::Closed, 0), ("local", FailurePolicy::Local, 6)]
    {
        let store = fallback(&server, policy);
        assert!(store.check(b"before", &limit, 1).await.unwrap().allowed, "{name}: healthy");
        server.kill();
        let mut slowest = Duration::ZERO;
        let mut admitted = 0;
        for i in 0..20 {
            let started = Instant::now();
            let decision = store.check(format!("during:{}", i / 10).as_bytes(), &limit, 1).await.unwrap();
            slowest = slowest.max(started.elapsed());
            admitted += u32::from(decision.allowed);
        }
        assert_eq!(admitted, expected, "{name}: the policy decided every call");
        assert!(store.breakers().any_open(), "{name}");
        let started = Instant::now();
        for _ in 0..1_000 {
            store.check(b"open breaker", &limit, 1).await.unwrap();
        }
        let open_breaker = started.elapsed();
        assert!(slowest < Duration::from_secs(1), "{name}: a call took {slowest:?}");
        assert!(
            open_breaker < Duration::from_secs(2),
            "{name}: 1,000 calls with the breaker open took {open_breaker:?}"
        );
        server.restart();
        let back = Instant::now();
        settled(&store).await;
        let fallbacks = store.fallbacks();
        store.check(b"after", &limit, 0).await.unwrap();
        assert_eq!(store.fallbacks(), fallbacks, "{name}: Redis decides again");
        println!(
            "{name}: slowest call while Redis died {slowest:?}; 1,000 calls with the breaker open {open_breaker:?}; \
             Redis used again {:?} after restart",
            back.elapsed()
        );
    }
}

/// A frozen Redis (SIGSTOP: connections open, nothing answers): the first calls wait the timeout,
/// then the breaker opens and no call waits; after SIGCONT the breaker closes by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_redis_opens_the_breaker_and_thawing_closes_it() {
    let server = RedisServer::start();
    let store = fallback(&server, FailurePolicy::Local);
    let limit = Limit::per_minute(100).build().unwrap();
    assert!(store.check(b"k", &limit, 1).await.unwrap().allowed);
    server.freeze();
    let mut waits = Vec::new();
    for _ in 0..10 {
        let started = Instant::now();
        store.check(b"k", &limit, 1).await.unwrap();
        waits.push(started.elapsed());
    }
    server.thaw();
    assert!(waits.iter().all(|w| *w < Duration::from_secs(1)), "{waits:?}");
    let waited = waits.iter().filter(|w| **w >= TIMEOUT).count();
    assert!(waited <= 3, "only the calls before the breaker opened waited the timeout: {waits:?}");
    settled(&store).await;
    // 11 admitted. Redis counts them all, and may count twice the calls (and charges) that were
    // sent while it was frozen and ran after SIGCONT: an under-grant, never an over-grant.
    let used = 100 - store.inner().peek(b"k", &limit).await.unwrap().remaining;
    assert!((11..=11 + 10).contains(&used), "{used} used in Redis for 11 admitted");
    println!("frozen Redis, 10 calls: {waits:?}; Redis counts {used} for 11 admitted");
}

/// A server closes idle connections (`timeout`, a proxy's idle timeout, `CLIENT KILL`): the call
/// after is not failed for it (it was never sent), but goes on a connection made again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_closed_while_idle_costs_the_next_call_nothing() {
    let server = RedisServer::start();
    let options = RedisOptions { prefix: "idle".into(), timeout: Duration::from_secs(2), ..RedisOptions::default() };
    let store = RedisStore::open(&server.url(), options).unwrap();
    let limit = Limit::per_hour(100).build().unwrap();
    assert!(store.check(b"k", &limit, 1).await.unwrap().allowed);
    for round in 0..3 {
        let killed = server.cli(&["CLIENT", "KILL", "TYPE", "normal"]);
        assert!(killed.trim().parse::<u64>().is_ok_and(|n| n >= 1), "{killed}");
        // The connection's end is read before the next call.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let decision = store.check(b"k", &limit, 1).await;
        assert!(decision.as_ref().is_ok_and(|d| d.allowed), "round {round}: {decision:?}");
    }
}

/// A store dropped closes its connections (the tasks driving them end with it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_dropped_closes_its_connection() {
    let server = RedisServer::start();
    let clients = || server.cli(&["CLIENT", "LIST", "TYPE", "normal"]).lines().count();
    let options = RedisOptions { prefix: "drop".into(), timeout: Duration::from_secs(2), ..RedisOptions::default() };
    let store = RedisStore::open(&server.url(), options).unwrap();
    let limit = Limit::per_hour(100).build().unwrap();
    assert!(store.check(b"k", &limit, 1).await.unwrap().allowed);
    // Its connection, and redis-cli's own.
    assert_eq!(clients(), 2, "{}", server.cli(&["CLIENT", "LIST"]));
    drop(store);
    let deadline = Instant::now() + Duration::from_secs(10);
    while clients() > 1 {
        assert!(Instant::now() < deadline, "still open: {}", server.cli(&["CLIENT", "LIST"]));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
