//! Leases over a real redis-server that freezes or dies mid-run: a leased hot key keeps being
//! answered (from its slice, then by the failure policy once the lease calls fail), no call
//! waits on the dead server beyond the store's timeout, one node never admits more than the limit,
//! and once Redis answers again the key is leased again.
//!
//! Wall-clock bounds are generous (they catch a call waiting on a dead backend, not a slow
//! machine).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tollgate_core::SystemClock;
use tollgate_store::lease::{LeaseMode, LeaseOptions, Leased};
use tollgate_store::testkit::redis_server::RedisServer;
use tollgate_store::{FailurePolicy, Fallback, Limit, RedisOptions, RedisStore, Store};

type Store_ = Arc<Leased<Fallback<RedisStore>>>;

fn leased(server: &RedisServer, policy: FailurePolicy) -> Store_ {
    let options = RedisOptions { timeout: Duration::from_millis(50), ..RedisOptions::default() };
    let fallback = Fallback::new(RedisStore::open(&server.url(), options).unwrap(), policy);
    let lease = LeaseOptions { mode: LeaseMode::Auto, ..LeaseOptions::default() };
    Arc::new(Leased::new(fallback, lease, Arc::new(SystemClock::new())))
}

/// 16 tasks calling `check` on one key for `run`; `interrupt` runs after `after`. Returns the
/// admissions, the calls, and the slowest call.
async fn hammer(
    store: &Store_,
    limit: &Limit,
    run: Duration,
    after: Duration,
    interrupt: impl FnOnce(),
) -> (u64, u64, Duration) {
    let (admitted, calls, slowest) =
        (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let deadline = Instant::now() + run;
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let (store, limit) = (store.clone(), limit.clone());
            let (admitted, calls, slowest) = (admitted.clone(), calls.clone(), slowest.clone());
            tokio::spawn(async move {
                while Instant::now() < deadline {
                    let started = Instant::now();
                    let decision =
                        store.check(b"hot", &limit, 1).await.expect("answered by the policy, never an error");
                    slowest.fetch_max(u64::try_from(started.elapsed().as_micros()).unwrap(), Ordering::Relaxed);
                    calls.fetch_add(1, Ordering::Relaxed);
                    if decision.allowed {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    tokio::time::sleep(after).await;
    interrupt();
    for task in tasks {
        task.await.unwrap();
    }
    let slowest = Duration::from_micros(slowest.load(Ordering::Relaxed));
    (admitted.load(Ordering::Relaxed), calls.load(Ordering::Relaxed), slowest)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_then_dead_redis_keeps_a_leased_key_answered_within_the_limit() {
    let mut server = RedisServer::start();
    let store = leased(&server, FailurePolicy::Local);
    // 2,000 a second, burst 200: over the run a single node may admit 200 + 2,000 × elapsed.
    let limit = Limit::per_second(2_000).burst(200).build().unwrap();
    let started = Instant::now();
    let (admitted, calls, slowest) =
        hammer(&store, &limit, Duration::from_millis(1_500), Duration::from_millis(500), || {
            server.freeze();
        })
        .await;
    let elapsed = started.elapsed().as_secs_f64();
    let stats = store.stats();
    eprintln!("frozen: {calls} calls, {admitted} admitted, slowest {slowest:?}, {stats:?}");
    assert!(stats.hot_keys_detected >= 1 && stats.local_decisions > 0, "the key was leased: {stats:?}");
    assert!(stats.failures > 0, "lease calls failed while frozen: {stats:?}");
    assert!(admitted as f64 <= 200.0 + 2_000.0 * elapsed, "{admitted} admitted in {elapsed:.2} s");
    assert!(slowest < Duration::from_secs(1), "a call waited {slowest:?} on a frozen Redis");
    server.thaw();
    server.kill();
    let (_, calls, slowest) = hammer(&store, &limit, Duration::from_millis(500), Duration::ZERO, || {}).await;
    eprintln!("dead: {calls} calls, slowest {slowest:?}");
    assert!(calls > 0 && slowest < Duration::from_secs(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_redis_answers_again_the_key_is_leased_again() {
    let mut server = RedisServer::start();
    let store = leased(&server, FailurePolicy::Local);
    let limit = Limit::per_second(1_000_000).burst(1_000_000).build().unwrap();
    hammer(&store, &limit, Duration::from_millis(300), Duration::from_millis(300), || server.restart()).await;
    let before = store.stats();
    // The breaker closes within its probe interval; leases resume after a lifetime's backoff.
    tokio::time::sleep(Duration::from_millis(500)).await;
    hammer(&store, &limit, Duration::from_millis(500), Duration::ZERO, || {}).await;
    let after = store.stats();
    eprintln!("before {before:?}\nafter {after:?}");
    assert!(after.grants > before.grants, "no lease granted after Redis came back: {after:?}");
    assert!(after.local_decisions > before.local_decisions);
}
