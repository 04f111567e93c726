//! The Redis store against real `redis-server` processes and a real 3-node Redis Cluster:
//! the conformance suite, decisions identical to the memory store on random traces, zero
//! over-grant under 64 concurrent tasks, a TTL on every key, and bad keys failing alone.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tollgate_store::testkit::{
    self,
    redis_server::{RedisCluster, RedisServer},
};
use tollgate_store::{
    Algorithm, Check, Limit, ManualClock, MemoryStore, RedisOptions, RedisStore, Store, StoreError, TimeSource,
};

const SEC: u64 = 1_000_000_000;
const T0: u64 = 1_700_000_000 * SEC;

/// A fresh key prefix per store, so that tests and traces share one server without meeting.
fn options(clock: Option<Arc<ManualClock>>) -> RedisOptions {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    RedisOptions {
        prefix: format!("t{}", NEXT.fetch_add(1, Ordering::Relaxed)),
        time: clock.map_or(TimeSource::Server, |c| TimeSource::Clock(c)),
        // Generous for loaded CI machines; the outage test sets its own.
        timeout: std::time::Duration::from_secs(2),
        ..RedisOptions::default()
    }
}

#[tokio::test]
async fn single_server_passes_the_conformance_suite() {
    let server = RedisServer::start();
    let url = server.url();
    testkit::conformance(|clock| RedisStore::open(&url, options(Some(clock))).unwrap()).await;
}

#[tokio::test]
async fn cluster_passes_the_conformance_suite_and_refuses_cross_slot_checks() {
    let cluster = RedisCluster::start();
    let base = RedisStore::open_cluster(&cluster.urls(), options(None)).await.unwrap();
    testkit::conformance(|clock| base.with_options(options(Some(clock)))).await;

    let limit = Limit::per_second(5).build().unwrap();
    let same_tag = [Check { key: "{u1}:a", limit: &limit, cost: 1 }, Check { key: "{u1}:b", limit: &limit, cost: 1 }];
    assert!(base.check_all(&same_tag).await.unwrap().iter().all(|d| d.allowed));
    // "a" and "b" hash to different slots (15495 and 3300).
    let different = [Check { key: "a", limit: &limit, cost: 1 }, Check { key: "b", limit: &limit, cost: 1 }];
    assert_eq!(base.check_all(&different).await, Err(StoreError::CrossSlot));
}

/// A small deterministic generator for the random traces.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[usize::try_from(self.below(items.len() as u64)).expect("small")]
    }
}

#[tokio::test]
async fn decides_exactly_like_the_memory_store_on_random_traces() {
    let server = RedisServer::start();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for round in 0..60 {
        let algorithm = Algorithm::ALL[round % Algorithm::ALL.len()];
        let count = 1 + rng.below(12);
        let slices = 1 + rng.below(6);
        // Periods from microseconds to an hour, odd ones included, so T rounds and seams move.
        let unit = rng.pick(&[1_000, 7_777, 1_000_000, 333_333_333, 600 * SEC]);
        let period = slices * unit * (1 + rng.below(3));
        let mut builder = Limit::builder(count, std::time::Duration::from_nanos(period)).algorithm(algorithm);
        if algorithm.is_bucket() {
            builder = builder.burst(1 + rng.below(15));
        }
        if algorithm == Algorithm::SubWindow {
            builder = builder.slices(slices);
        }
        let Ok(limit) = builder.build() else { continue };
        let clock = Arc::new(ManualClock::new(T0 + rng.below(period)));
        let redis = RedisStore::open(&server.url(), options(Some(clock.clone()))).unwrap();
        let memory = MemoryStore::builder().clock(clock.clone()).build();
        for step in 0..80 {
            let gap = match rng.below(4) {
                0 => 0,
                1 => rng.below(limit.emission_interval_ns() + 1),
                2 => rng.below(period + 1),
                _ => rng.below(3 * period + 1),
            };
            clock.advance(std::time::Duration::from_nanos(gap));
            let key = rng.pick(&["a", "b", "{tag}:c"]);
            let cost = if rng.below(5) == 0 { rng.below(limit.capacity() + 1) } else { 1 };
            let want = memory.check(key, &limit, cost).await.unwrap();
            let got = redis.check(key, &limit, cost).await.unwrap();
            assert_eq!(got, want, "{limit} step {step}: key {key} cost {cost} at {}", clock_now(&clock));
        }
    }
}

fn clock_now(clock: &ManualClock) -> u64 {
    tollgate_store::Clock::now_ns(clock)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_tasks_on_one_key_admit_exactly_the_bound_on_redis_and_cluster() {
    let server = RedisServer::start();
    let cluster = RedisCluster::start();
    let cluster_store = RedisStore::open_cluster(&cluster.urls(), options(None)).await.unwrap();
    for limit in testkit::hammer::limits() {
        let clock = Arc::new(ManualClock::new(T0));
        let single = Arc::new(RedisStore::open(&server.url(), options(Some(clock.clone()))).unwrap());
        assert_eq!(testkit::hammer::tasks(single, "hot", &limit, 64, 20).await, 1000, "{limit} on one server");
        let clustered = Arc::new(cluster_store.with_options(options(Some(clock))));
        assert_eq!(testkit::hammer::tasks(clustered, "hot", &limit, 64, 20).await, 1000, "{limit} on the cluster");
    }
}

#[tokio::test]
async fn every_key_written_has_a_ttl_no_longer_than_needed() {
    let server = RedisServer::start();
    let store = RedisStore::open(&server.url(), options(None)).unwrap();
    for (i, &algorithm) in Algorithm::ALL.iter().enumerate() {
        // Per minute, so that no key expires before the scan even on a slow machine.
        let limit = Limit::per_minute(5).algorithm(algorithm).build().unwrap();
        for k in 0..50 {
            store.check(&format!("k{k}"), &limit, 1 + (k % 3)).await.unwrap();
            store.check(&format!("k{k}"), &limit, 0).await.unwrap();
        }
        let checks: Vec<String> = (0..3).map(|k| format!("{{m{i}}}:{k}")).collect();
        let checks: Vec<Check<'_>> = checks.iter().map(|key| Check { key, limit: &limit, cost: 1 }).collect();
        store.check_all(&checks).await.unwrap();
    }
    let keys = server.cli(&["--scan"]);
    let keys: Vec<&str> = keys.lines().filter(|k| !k.is_empty()).collect();
    assert!(keys.len() >= 7 * 50, "{} keys", keys.len());
    for key in keys {
        let ttl: i64 = server.cli(&["pttl", key]).trim().parse().unwrap();
        // Every state here is idle within one minute (5/min, at most 5 admitted), a sliding window
        // counter within two; -1 would be a key without TTL.
        assert!(ttl > 0 && ttl <= 120_000, "{key} has PTTL {ttl}");
    }
}

#[tokio::test]
async fn a_key_holding_something_else_fails_alone() {
    let server = RedisServer::start();
    let store = RedisStore::open(&server.url(), options(None)).unwrap();
    let gcra = Limit::per_second(5).build().unwrap();
    let window = Limit::per_second(5).algorithm(Algorithm::FixedWindow).build().unwrap();
    let log = Limit::per_second(5).algorithm(Algorithm::SlidingLog).build().unwrap();
    let _ = server.cli(&["lpush", &store.state_key("list", &gcra), "x"]);
    let _ = server.cli(&["set", &store.state_key("text", &window), "hello world"]);
    let _ = server.cli(&["set", &store.state_key("str", &log), "x"]);
    for (key, limit) in [("list", &gcra), ("text", &window), ("str", &log)] {
        let result = store.check(key, limit, 1).await;
        assert!(matches!(result, Err(StoreError::BadState(_))), "{key}: {result:?}");
    }
    // The connection and every other key keep working.
    assert!(store.check("fine", &gcra, 1).await.unwrap().allowed);
    assert!(store.check("fine", &window, 1).await.unwrap().allowed);
}

#[tokio::test]
async fn server_time_decisions_and_limits_the_script_cannot_hold() {
    let server = RedisServer::start();
    let store = RedisStore::open(&server.url(), options(None)).unwrap();
    let limit = Limit::per_minute(3).build().unwrap();
    let mut allowed = 0;
    for _ in 0..5 {
        allowed += u32::from(store.check("user", &limit, 1).await.unwrap().allowed);
    }
    assert_eq!(allowed, 3);
    let denied = store.check("user", &limit, 1).await.unwrap();
    assert!(denied.retry_after_ns > 0 && denied.retry_after_ns <= 20 * SEC, "{denied:?}");
    store.reset("user", &limit).await.unwrap();
    assert!(store.check("user", &limit, 3).await.unwrap().allowed);
    let long = Limit::builder(1, std::time::Duration::from_secs(60 * 86_400)).build().unwrap();
    assert!(matches!(store.check("user", &long, 1).await, Err(StoreError::Unsupported(_))));
    assert!(matches!(store.check("user", &limit, 4).await, Err(StoreError::Limit(_))));
}

/// Kills redis-server in the middle of a run, under each failure policy: every call returns
/// within the timeout and follows the policy, and calls reach Redis again soon after it is back.
#[tokio::test]
async fn outage_follows_the_failure_policy_and_recovers() {
    use std::time::{Duration, Instant};
    use tollgate_store::{FailurePolicy, Fallback};

    let mut server = RedisServer::start();
    let limit = Limit::per_second(3).build().unwrap();
    let timeout = Duration::from_millis(50);
    for (name, policy) in [
        ("open", FailurePolicy::Open),
        ("closed", FailurePolicy::Closed),
        ("local", FailurePolicy::Local(MemoryStore::new())),
    ] {
        let redis = RedisStore::open(&server.url(), RedisOptions { timeout, ..options(None) }).unwrap();
        let store = Fallback::new(redis, policy);
        assert!(store.check("before", &limit, 1).await.unwrap().allowed, "{name}: healthy");
        assert_eq!(store.backend_errors(), 0, "{name}");

        server.kill();
        let mut slowest = Duration::ZERO;
        let mut admitted = 0;
        for i in 0..20 {
            let started = Instant::now();
            let decision = store.check(&format!("during:{}", i / 10), &limit, 1).await.unwrap();
            slowest = slowest.max(started.elapsed());
            admitted += u32::from(decision.allowed);
        }
        assert_eq!(store.backend_errors(), 20, "{name}: every call during the outage fell back");
        let expected = match name {
            "open" => 20,
            "closed" => 0,
            _ => 6, // the local store: 3 per key, two keys
        };
        assert_eq!(admitted, expected, "{name}: the policy decided every call");
        // A bound, not a benchmark: the 50 ms timeout holds up to scheduler noise.
        assert!(slowest < Duration::from_secs(1), "{name}: a call took {slowest:?} during the outage");

        server.restart();
        let back = Instant::now();
        loop {
            let errors = store.backend_errors();
            store.check("after", &limit, 0).await.unwrap();
            if store.backend_errors() == errors {
                break;
            }
            assert!(back.elapsed() < Duration::from_secs(10), "{name}: Redis not used again after 10 s");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        println!(
            "{name}: slowest call during the outage {slowest:?}, back on Redis {:?} after restart",
            back.elapsed()
        );
    }
}
