//! Leases on a real `redis-server` against [`LeaseModel`], the memory store's model of them:
//! for every leasable algorithm, across the whole range a `Limit` accepts, random interleavings
//! of leases and ordinary checks on a manual clock get identical answers (decision, units
//! granted, lessees counted, instant, snapshot), and every grant is `min(want, what was left)`.
//! Also: lessees are counted per lifetime and their key expires, a refused lease changes nothing
//! and answers a unit request's retry, and the sliding log and sub-window counter are refused.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tollgate_store::lease::{Grant, LeaseModel, Lessor, leasable};
use tollgate_store::testkit::random::{Rng, random_limit};
use tollgate_store::testkit::redis_server::RedisServer;
use tollgate_store::{
    Algorithm, Check, Clock, Limit, ManualClock, MemoryStore, RedisOptions, RedisStore, Store, StoreError, TimeSource,
};

const MS: u64 = 1_000_000;
const SEC: u64 = 1_000 * MS;
const T0: u64 = 1_700_000_000 * SEC;

/// A fresh key prefix per store; time from `clock`, TTLs with `margin` added.
fn options(clock: &Arc<ManualClock>, margin: Duration) -> RedisOptions {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    RedisOptions {
        prefix: format!("l{}", NEXT.fetch_add(1, Ordering::Relaxed)),
        time: TimeSource::Clock(clock.clone()),
        timeout: Duration::from_secs(2),
        clock_skew_margin: margin,
        module: false,
    }
}

/// The Redis store and the model, on one manual clock.
fn pair(server: &RedisServer, clock: &Arc<ManualClock>, margin: Duration) -> (RedisStore, LeaseModel) {
    let redis = RedisStore::open(&server.url(), options(clock, margin)).unwrap();
    (redis, LeaseModel::new(MemoryStore::builder().clock(clock.clone()).build()))
}

/// What must agree between the store and the model.
fn answer(g: &Grant) -> (tollgate_store::Decision, u64, u64, u64, tollgate_core::Snapshot) {
    (g.decision, g.granted, g.lessees, g.at, g.snapshot)
}

const LESSEES: [u64; 3] = [1, 0xDEAD_BEEF, u64::MAX - 1];

/// Redis grants exactly what the model grants, op by op, and every grant is `min(want, left)`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_and_checks_agree_with_the_model_across_the_whole_range() {
    let server = RedisServer::start();
    // TOLLGATE_SEED=n explores another sequence (the suite runs the fixed one).
    let seed = std::env::var("TOLLGATE_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x2545_F491_4F6C_DD1D);
    let mut rng = Rng(seed);
    let algorithms: Vec<Algorithm> = Algorithm::ALL.into_iter().filter(|&a| leasable(a)).collect();
    assert_eq!(algorithms.len(), 5);
    let keys: [&[u8]; 2] = [b"hot", b"{tag}:hot"];
    let (mut leases, mut granted_some, mut denied) = (0, 0, 0);
    for round in 0..500 {
        let algorithm = algorithms[round % algorithms.len()];
        let limit = random_limit(&mut rng, algorithm);
        let (period, capacity) = (limit.period_ns(), limit.capacity());
        let clock = Arc::new(ManualClock::new(T0 + rng.below(period)));
        // The default 60 s margin: no key expires on the server's real clock during the test.
        let (redis, model) = pair(&server, &clock, Duration::from_secs(60));
        let mut ops = Vec::new();
        for step in 0..40 {
            let gap = match rng.below(6) {
                0 => 0,
                1 => rng.below(limit.emission_interval_ns() + 1),
                2 => rng.below(period + 1),
                3 => period + rng.below(2 * period + 1),
                4 => rng.below(30 * MS),
                _ => rng.below(period / 64 + 2),
            };
            clock.set(clock.now_ns() + gap);
            let key = rng.pick(&keys);
            if rng.below(3) > 0 {
                let want = match rng.below(4) {
                    0 => capacity,
                    1 => 1 + rng.below(capacity),
                    _ => 1 + rng.below(capacity.min(4)),
                };
                let lessee = rng.pick(&LESSEES);
                let longest = rng.pick(&[3, 50, 20_000]);
                let lifetime = Duration::from_millis(1 + rng.below(longest));
                ops.push(format!("+{gap}ns lease {key:?} want {want} by {lessee} for {lifetime:?}"));
                let ctx = || format!("{limit} round {round} step {step}, ops:\n{}", ops.join("\n"));
                let left = model.peek(key, &limit).await.unwrap().remaining;
                let check = Check::new(key, &limit, 0);
                let want_grant = model.lease(check, want, lessee, lifetime).await.unwrap();
                let got = redis.lease(check, want, lessee, lifetime).await.unwrap();
                assert_eq!(answer(&got), answer(&want_grant), "{}", ctx());
                // granted = min(want, left): an admission of that cost, or a denial of one unit.
                assert_eq!(got.granted, want.min(left), "{}", ctx());
                assert_eq!(got.granted == 0, !got.decision.allowed, "{}", ctx());
                if got.granted > 0 {
                    assert_eq!(got.decision.remaining, left - got.granted, "{}", ctx());
                    granted_some += 1;
                } else {
                    denied += 1;
                }
                assert!((1..=3).contains(&got.lessees), "{}", ctx());
                leases += 1;
            } else {
                let cost = match rng.below(4) {
                    0 => 1 + rng.below(capacity),
                    1 => 0,
                    _ => 1,
                };
                ops.push(format!("+{gap}ns check {key:?} cost {cost}"));
                let ctx = || format!("{limit} round {round} step {step}, ops:\n{}", ops.join("\n"));
                if rng.below(2) == 0 {
                    let (want, got) = (model.check(key, &limit, cost).await, redis.check(key, &limit, cost).await);
                    assert_eq!(got.unwrap(), want.unwrap(), "{}", ctx());
                } else {
                    let check = [Check::new(key, &limit, cost)];
                    let (want, got) = (model.reserve(&check).await, redis.reserve(&check).await);
                    assert_eq!(got.unwrap(), want.unwrap(), "{}", ctx());
                }
            }
        }
    }
    // The sequence reached both outcomes, often.
    assert!(granted_some > leases / 4 && denied > leases / 20, "{granted_some} granted, {denied} denied of {leases}");
}

/// The name of the sorted set counting `key`'s lessees (see `redis/keys.rs`).
fn lessees_key(redis: &RedisStore, key: &[u8], limit: &Limit) -> String {
    let state = String::from_utf8(redis.state_key("", key, limit).unwrap()).unwrap();
    let prefix = &redis.options().prefix;
    format!("{prefix}:lessees:{}", &state[prefix.len() + 1..])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lessees_are_counted_within_their_lifetime_and_their_key_expires() {
    let server = RedisServer::start();
    let clock = Arc::new(ManualClock::new(T0));
    // No margin: the lessees key lives exactly a lifetime. Per hour: the state key (whose TTL
    // runs on the server's real clock too) lives tens of seconds.
    let (redis, model) = pair(&server, &clock, Duration::ZERO);
    let limit = Limit::per_hour(1_000).build().unwrap();
    let check = Check::new(b"hot", &limit, 0);
    let lifetime = Duration::from_secs(10);
    // (seconds after T0, lessee, lessees counted): 1, 2 and 3 within a lifetime (2 twice); at
    // T0 + 10 s lessee 1's lifetime is just over; at T0 + 30 s every one's, so a 4th counts alone.
    let asks = [(0, 1, 1), (1, 2, 2), (1, 2, 2), (2, 3, 3), (10, 2, 2), (30, 4, 1)];
    for (at, lessee, count) in asks {
        clock.set(T0 + at * SEC);
        let want = model.lease(check, 5, lessee, lifetime).await.unwrap();
        let got = redis.lease(check, 5, lessee, lifetime).await.unwrap();
        assert_eq!(answer(&got), answer(&want), "lessee {lessee} at +{at} s");
        assert_eq!((got.granted, got.lessees), (5, count), "lessee {lessee} at +{at} s");
        let name = lessees_key(&redis, b"hot", &limit);
        let ttl: i64 = server.cli(&["pttl", &name]).trim().parse().unwrap();
        assert!(ttl > 0 && ttl <= 10_000, "{name} has PTTL {ttl}");
    }
}

/// Each lessee counts for its own lifetime, as in the model: the set lives as long as its
/// longest-lived lessee (it once expired after the latest ask's lifetime, forgetting a lessee with
/// a longer one). Server time (the lessees key expires on the server's real clock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lessee_is_counted_for_its_own_lifetime_whatever_the_others_ask() {
    let server = RedisServer::start();
    let options = RedisOptions { prefix: "mixed".into(), ..RedisOptions::default() };
    let redis = RedisStore::open(&server.url(), options).unwrap();
    let model = LeaseModel::new(MemoryStore::new());
    let limit = Limit::per_second(1_000).build().unwrap();
    let check = Check::new(b"hot", &limit, 0);
    let asks = [(1, Duration::from_secs(60)), (2, Duration::from_millis(1)), (3, Duration::from_secs(60))];
    for (i, (lessee, lifetime)) in asks.into_iter().enumerate() {
        if i == 2 {
            // Lessee 2's lifetime is over, lessee 1's is not.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let want = model.lease(check, 1, lessee, lifetime).await.unwrap().lessees;
        let got = redis.lease(check, 1, lessee, lifetime).await.unwrap().lessees;
        assert_eq!((got, want), ([1, 2, 2][i], [1, 2, 2][i]), "lessee {lessee}");
    }
}

/// A lease of a key with nothing left is a unit request's denial: same retry, nothing written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_lease_answers_a_unit_requests_denial_and_changes_nothing() {
    let server = RedisServer::start();
    for algorithm in Algorithm::ALL.into_iter().filter(|&a| leasable(a)) {
        let clock = Arc::new(ManualClock::new(T0 + 1_234_567));
        let (redis, model) = pair(&server, &clock, Duration::from_secs(60));
        let limit = Limit::per_minute(10).algorithm(algorithm).build().unwrap();
        let check = Check::new(b"spent", &limit, 0);
        // 7 granted, then the 3 left though 5 were wanted, then nothing.
        for (want, granted, left) in [(7, 7, 3), (5, 3, 0)] {
            let got = redis.lease(check, want, 9, Duration::from_millis(100)).await.unwrap();
            let model_grant = model.lease(check, want, 9, Duration::from_millis(100)).await.unwrap();
            assert_eq!(answer(&got), answer(&model_grant), "{algorithm}");
            assert_eq!((got.granted, got.decision.allowed, got.decision.remaining), (granted, true, left));
        }
        clock.advance(Duration::from_millis(1_500));
        let before = redis.peek(b"spent", &limit).await.unwrap();
        assert_eq!(before.remaining, 0, "{algorithm}: nothing left");
        let got = redis.lease(check, 4, 9, Duration::from_millis(100)).await.unwrap();
        let unit = model.check(b"spent", &limit, 1).await.unwrap();
        assert_eq!((got.granted, got.decision.allowed), (0, false), "{algorithm}");
        assert_eq!(got.decision, unit, "{algorithm}: the denial of one unit");
        assert!(got.decision.retry_after_ns > 0, "{algorithm}: {:?}", got.decision);
        assert_eq!(redis.peek(b"spent", &limit).await.unwrap(), before, "{algorithm}: nothing written");
        assert_eq!(redis.check(b"spent", &limit, 1).await.unwrap(), unit, "{algorithm}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sliding_log_and_the_sub_window_counter_are_not_leased() {
    let server = RedisServer::start();
    let clock = Arc::new(ManualClock::new(T0));
    let (redis, _) = pair(&server, &clock, Duration::from_secs(60));
    for algorithm in [Algorithm::SlidingLog, Algorithm::SubWindow] {
        assert!(!leasable(algorithm));
        let limit = Limit::per_minute(10).algorithm(algorithm).build().unwrap();
        let result = redis.lease(Check::new(b"k", &limit, 0), 1, 1, Duration::from_millis(100)).await;
        assert!(matches!(result, Err(StoreError::Unsupported(_))), "{algorithm}: {result:?}");
        // Nothing was written: the key is untouched.
        assert_eq!(redis.peek(b"k", &limit).await.unwrap().remaining, 10, "{algorithm}");
    }
    assert_eq!(server.cli(&["dbsize"]).trim(), "0");
}
