//! The Redis store against the raw ceiling of the same script, measured in the same run:
//! decisions/s at concurrency 64 for every algorithm, on one hot key and over 100,000 keys, next
//! to `redis-benchmark` running `FCALL` of the same script (no pipelining, and `-P 16`), and the
//! Redis calls per decision counted from `INFO commandstats`; then what a refund costs Redis next
//! to the reservation it withdraws.
//!
//! `cargo bench -p tollgate-store --bench redis` (starts its own redis-server; needs
//! `redis-benchmark`, which comes with it).

use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use tollgate_store::redis::program;
use tollgate_store::testkit::redis_server::RedisServer;
use tollgate_store::{Algorithm, Check, Limit, RedisOptions, RedisStore, Refund, Store};

const TASKS: usize = 64;
const DECISIONS: usize = 64_000;
const KEYS: usize = 100_000;

fn limit(algorithm: Algorithm) -> Limit {
    let mut builder = Limit::per_second(100).algorithm(algorithm);
    if algorithm == Algorithm::SubWindow {
        builder = builder.slices(10);
    }
    builder.build().expect("valid")
}

/// `calls` of FCALL, EVALSHA and EVAL since the last `CONFIG RESETSTAT`.
fn script_calls(server: &RedisServer) -> u64 {
    let stats = server.cli(&["info", "commandstats"]);
    let calls = |name: &str| {
        stats
            .lines()
            .find(|l| l.starts_with(&format!("cmdstat_{name}:")))
            .and_then(|l| l.split("calls=").nth(1))
            .and_then(|v| v.split(',').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    calls("fcall") + calls("evalsha") + calls("eval")
}

/// tollgate: `TASKS` tasks sharing one connection (calls batched), `DECISIONS` checks in all.
async fn tollgate(store: Arc<RedisStore>, limit: &Limit, spread: bool) -> f64 {
    let started = Instant::now();
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let (store, limit) = (store.clone(), limit.clone());
            tokio::spawn(async move {
                for i in 0..DECISIONS / TASKS {
                    let key =
                        if spread { format!("user:{}", (t * 7_919 + i * 104_729) % KEYS) } else { "hot".to_string() };
                    store.check(key.as_bytes(), &limit, 1).await.expect("check");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("task");
    }
    DECISIONS as f64 / started.elapsed().as_secs_f64()
}

/// redis-benchmark running FCALL of the same script with the same arguments.
fn raw(server: &RedisServer, function: &str, key: &str, limit: &Limit, spread: bool, pipeline: u32) -> f64 {
    let mut command = Command::new("redis-benchmark");
    command.args(["-p", &server.port().to_string(), "-c", &TASKS.to_string(), "-n", &DECISIONS.to_string()]);
    command.args(["-P", &pipeline.to_string(), "--csv"]);
    if spread {
        command.args(["-r", &KEYS.to_string()]);
    }
    let numbers = [
        limit.count(),
        limit.period_ns(),
        limit.burst(),
        limit.slices(),
        limit.emission_interval_ns(),
        limit.tolerance_ns(),
        1,
        0,
    ]
    .map(|n| n.to_string());
    // The layout's version, now from TIME, no TTL margin, one check, no charges, no refunds; the
    // check's limit, its cost, and no hold (see the store's `program.rs`).
    command.args([
        "FCALL",
        function,
        "1",
        key,
        program::VERSION,
        "",
        "",
        "0",
        "1",
        "0",
        "0",
        limit.algorithm().as_str(),
    ]);
    command.args(&numbers);
    let output = command.output().expect("redis-benchmark runs (it comes with redis-server)");
    let text = String::from_utf8_lossy(&output.stdout);
    text.lines()
        .filter_map(|l| l.split(',').nth(1))
        .filter_map(|v| v.trim_matches('"').parse::<f64>().ok())
        .next_back()
        .unwrap_or_else(|| panic!("no figure from redis-benchmark: {text}"))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let server = RedisServer::start();
    let (library, function) = program::library_source();
    let loaded = server.cli(&["function", "load", &library]);
    assert!(function.starts_with(loaded.trim()), "FUNCTION LOAD answered {loaded}");
    let store = Arc::new(RedisStore::open(&server.url(), RedisOptions::default()).expect("store"));
    println!("decisions/s at concurrency {TASKS}, {DECISIONS} decisions per run, server time");
    println!(
        "{:<16}{:>10}{:>12}{:>12}{:>12}{:>9}{:>9}{:>14}",
        "algorithm", "keys", "tollgate", "raw -P 1", "raw -P 16", "vs P1", "vs P16", "calls/decision"
    );
    for algorithm in Algorithm::ALL {
        let limit = limit(algorithm);
        for spread in [false, true] {
            let _ = server.cli(&["config", "resetstat"]);
            let ours = tollgate(store.clone(), &limit, spread).await;
            let calls = script_calls(&server);
            let key = if spread {
                format!("raw:{}:{{__rand_int__}}", algorithm.as_str())
            } else {
                format!("raw:{}:{{hot}}", algorithm.as_str())
            };
            let p1 = raw(&server, &function, &key, &limit, spread, 1);
            let p16 = raw(&server, &function, &key, &limit, spread, 16);
            println!(
                "{:<16}{:>10}{:>12.0}{:>12.0}{:>12.0}{:>8.2}x{:>8.2}x{:>14.3}",
                algorithm.as_str(),
                if spread { "100k" } else { "1" },
                ours,
                p1,
                p16,
                ours / p1,
                ours / p16,
                calls as f64 / DECISIONS as f64,
            );
        }
    }
    refunds(&server, &store).await;
}

/// Microseconds Redis spends per call (`usec_per_call` of FCALL since the last reset).
fn usec_per_call(server: &RedisServer) -> f64 {
    let stats = server.cli(&["info", "commandstats"]);
    stats
        .lines()
        .find(|l| l.starts_with("cmdstat_fcall:"))
        .and_then(|l| l.split("usec_per_call=").nth(1))
        .and_then(|v| v.split(',').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// What a refund costs Redis (a `count_status` rule's reservation given back: the state edited
/// where the admission was counted, and the key's marker stamped), next to the reservation it
/// withdraws: `REFUNDS` reservations on distinct keys, then their refunds, one call each.
async fn refunds(server: &RedisServer, store: &RedisStore) {
    const REFUNDS: usize = 20_000;
    println!();
    println!("time inside Redis per call (usec_per_call of FCALL), {REFUNDS} calls each, one task");
    println!("{:<16}{:>14}{:>14}", "algorithm", "reservation", "its refund");
    for algorithm in Algorithm::ALL {
        let limit = limit(algorithm);
        let keys: Vec<String> = (0..REFUNDS).map(|i| format!("refund:{}:{i}", algorithm.as_str())).collect();
        let _ = server.cli(&["config", "resetstat"]);
        let mut reserved = Vec::with_capacity(REFUNDS);
        for key in &keys {
            let check = Check::new(key.as_bytes(), &limit, 1);
            reserved.push(store.reserve(&[check]).await.expect("reserve"));
        }
        let reserve = usec_per_call(server);
        let _ = server.cli(&["config", "resetstat"]);
        for (key, reserved) in keys.iter().zip(&reserved) {
            let check = Check::new(key.as_bytes(), &limit, 1);
            store.refund(&[Refund { check, at: reserved.at, decision: reserved.decisions[0] }]).await.expect("refund");
        }
        println!("{:<16}{:>11.2} us{:>11.2} us", algorithm.as_str(), reserve, usec_per_call(server));
    }
}
