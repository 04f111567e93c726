//! Leases on one hot key against the memory store, measured in the same run: decisions/s on ONE
//! key with a limit that denies nothing (1,000,000,000 a second, burst as much), 2 tasks on a
//! 2-worker tokio runtime each looping `check(b"hot", &limit, 1)`, for GCRA and the token bucket:
//!
//! - `MemoryStore`, the in-process ceiling;
//! - `Leased<Fallback<RedisStore>>` with `LeaseMode::Auto` (the default options) and with
//!   `LeaseMode::Always`;
//! - the unleased `Fallback<RedisStore>`, one script call per decision.
//!
//! Each row gives decisions/s, its ratio to the memory store, Redis script calls per decision
//! (`RedisStore::script_calls` over the decisions) and the lease counters; every case is warmed up
//! first (so the key is found hot and the slices have grown) and then measured for a fixed time.
//! The goal of leasing: at least 1.7M decisions/s and at most 0.01 Redis calls per decision,
//! reported (not asserted) for the leased rows.
//!
//! `cargo bench -p tollgate-store --bench lease` (starts its own redis-server).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tollgate_store::testkit::redis_server::RedisServer;
use tollgate_store::{
    Algorithm, FailurePolicy, Fallback, LeaseMode, LeaseOptions, LeaseStats, Leased, Limit, MemoryStore, RedisOptions,
    RedisStore, Store, SystemClock,
};

/// Tasks checking the key at once (on as many worker threads).
const TASKS: usize = 2;
const WARM_UP: Duration = Duration::from_millis(200);
const MEASURE: Duration = Duration::from_millis(2_000);
/// The goal of leasing on one hot key.
const GOAL_RATE: f64 = 1_700_000.0;
const GOAL_CALLS: f64 = 0.01;

fn limit(algorithm: Algorithm) -> Limit {
    Limit::per_second(1_000_000_000).burst(1_000_000_000).algorithm(algorithm).build().expect("valid")
}

/// `TASKS` tasks checking `b"hot"` under `limit` for `time`: (decisions, seconds).
async fn run<S: Store + Clone + 'static>(store: &S, limit: &Limit, time: Duration) -> (u64, f64) {
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let (store, limit, stop) = (store.clone(), limit.clone(), stop.clone());
            tokio::spawn(async move {
                let mut decisions = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let decision = store.check(b"hot", &limit, 1).await.expect("check");
                    assert!(decision.allowed, "a limit of a billion a second denied");
                    decisions += 1;
                }
                decisions
            })
        })
        .collect();
    // The tasks may never yield (a ready `check`), so the timer is this (non-worker) thread's sleep.
    std::thread::sleep(time);
    stop.store(true, Ordering::Relaxed);
    let mut decisions = 0;
    for task in tasks {
        decisions += task.await.expect("task");
    }
    (decisions, started.elapsed().as_secs_f64())
}

/// One measured case.
struct Row {
    name: &'static str,
    algorithm: Algorithm,
    rate: f64,
    /// Script calls per decision (None for the memory store).
    calls: Option<f64>,
    /// The lease counters over the measurement (None without leases).
    stats: Option<LeaseStats>,
}

fn delta(after: LeaseStats, before: LeaseStats) -> LeaseStats {
    LeaseStats {
        grants: after.grants - before.grants,
        units_granted: after.units_granted - before.units_granted,
        units_forfeited: after.units_forfeited - before.units_forfeited,
        failures: after.failures - before.failures,
        local_decisions: after.local_decisions - before.local_decisions,
        exact_decisions: after.exact_decisions - before.exact_decisions,
        hot_keys_detected: after.hot_keys_detected - before.hot_keys_detected,
        leased_keys: after.leased_keys,
    }
}

async fn memory(algorithm: Algorithm) -> Row {
    let (store, limit) = (Arc::new(MemoryStore::new()), limit(algorithm));
    run(&store, &limit, WARM_UP).await;
    let (decisions, secs) = run(&store, &limit, MEASURE).await;
    Row { name: "memory", algorithm, rate: decisions as f64 / secs, calls: None, stats: None }
}

/// A fresh Redis store on `server` (its own connection and script-call counter).
fn redis(server: &RedisServer) -> RedisStore {
    RedisStore::open(&server.url(), RedisOptions::default()).expect("store")
}

async fn leased(server: &RedisServer, algorithm: Algorithm, mode: LeaseMode, name: &'static str) -> Row {
    let redis = redis(server);
    let options = LeaseOptions { mode, ..LeaseOptions::default() };
    let store = Leased::new(Fallback::new(redis.clone(), FailurePolicy::Local), options, Arc::new(SystemClock::new()));
    let limit = limit(algorithm);
    run(&store, &limit, WARM_UP).await;
    let (calls, stats) = (redis.script_calls(), store.stats());
    let (decisions, secs) = run(&store, &limit, MEASURE).await;
    let calls = (redis.script_calls() - calls) as f64 / decisions as f64;
    Row { name, algorithm, rate: decisions as f64 / secs, calls: Some(calls), stats: Some(delta(store.stats(), stats)) }
}

async fn unleased(server: &RedisServer, algorithm: Algorithm) -> Row {
    let redis = redis(server);
    let store = Fallback::new(redis.clone(), FailurePolicy::Local);
    let limit = limit(algorithm);
    run(&store, &limit, WARM_UP).await;
    let calls = redis.script_calls();
    let (decisions, secs) = run(&store, &limit, MEASURE).await;
    let calls = (redis.script_calls() - calls) as f64 / decisions as f64;
    Row { name: "unleased redis", algorithm, rate: decisions as f64 / secs, calls: Some(calls), stats: None }
}

fn print(row: &Row, ceiling: f64) {
    let or_dash = |v: Option<String>| v.unwrap_or_else(|| "-".to_string());
    let stats = row.stats;
    println!(
        "{:<16}{:<14}{:>14.0}{:>9.3}x{:>12}{:>12}{:>10}{:>8}{:>13}{:>11}",
        row.name,
        row.algorithm.as_str(),
        row.rate,
        row.rate / ceiling,
        or_dash(row.calls.map(|c| format!("{c:.6}"))),
        or_dash(stats.map(|s| s.local_decisions.to_string())),
        or_dash(stats.map(|s| s.exact_decisions.to_string())),
        or_dash(stats.map(|s| s.grants.to_string())),
        or_dash(stats.map(|s| s.units_granted.to_string())),
        or_dash(stats.map(|s| s.units_forfeited.to_string())),
    );
}

fn main() {
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(TASKS).enable_all().build().expect("runtime");
    let server = RedisServer::start();
    println!(
        "decisions/s on one hot key, {TASKS} tasks on {TASKS} worker threads, {} ms warm-up then {} ms measured",
        WARM_UP.as_millis(),
        MEASURE.as_millis()
    );
    println!(
        "{:<16}{:<14}{:>14}{:>10}{:>12}{:>12}{:>10}{:>8}{:>13}{:>11}",
        "store",
        "algorithm",
        "decisions/s",
        "vs memory",
        "calls/dec",
        "local",
        "exact",
        "grants",
        "granted",
        "forfeited"
    );
    let mut goals = Vec::new();
    runtime.block_on(async {
        for algorithm in [Algorithm::Gcra, Algorithm::TokenBucket] {
            let ceiling = memory(algorithm).await;
            print(&ceiling, ceiling.rate);
            for (mode, name) in [(LeaseMode::Auto, "leased auto"), (LeaseMode::Always, "leased always")] {
                let row = leased(&server, algorithm, mode, name).await;
                print(&row, ceiling.rate);
                goals.push(row);
            }
            print(&unleased(&server, algorithm).await, ceiling.rate);
        }
    });
    println!("\ngoal: leased >= {GOAL_RATE:.0} decisions/s and <= {GOAL_CALLS} Redis calls per decision");
    for row in &goals {
        let calls = row.calls.unwrap_or(f64::INFINITY);
        let met = row.rate >= GOAL_RATE && calls <= GOAL_CALLS;
        println!(
            "  {:<14}{:<14}{:>12.0}/s {:>10.6} calls/decision: {}",
            row.name,
            row.algorithm.as_str(),
            row.rate,
            calls,
            if met { "met" } else { "NOT met" }
        );
    }
}
