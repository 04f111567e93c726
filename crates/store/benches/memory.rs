//! Keyed checks on the memory store against governor (the best Rust in-process limiter), measured
//! in the same run: every algorithm over 1 key and over 100,000 keys, on 1 and 2 threads.
//!
//! `cargo bench -p tollgate-store` runs the criterion benches, then prints a summary table of
//! ns/op with ratios to governor and the 2-thread scaling, each pair measured back to back so
//! that a noisy machine slows both sides alike (`SUMMARY_ONLY=1` prints only the summary).

use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use tollgate_store::{Algorithm, Limit, MemoryStore};

const KEYS: usize = 100_000;
/// A prime stride through the keys: every key visited, in an order the prefetcher cannot guess.
const STRIDE: usize = 7_919;

/// One side of a comparison: something that checks the key at an index.
trait Keyed: Sync {
    // `&String`, not `&str`: governor's keyed API takes `&K`, and a `&str` would make it allocate.
    #[allow(clippy::ptr_arg)]
    fn check(&self, key: &String) -> bool;
}

struct Tollgate {
    store: MemoryStore,
    limit: Limit,
}

impl Keyed for Tollgate {
    fn check(&self, key: &String) -> bool {
        self.store.check_sync(key.as_bytes(), &self.limit, 1).expect("unit cost").allowed
    }
}

struct Governor(DefaultKeyedRateLimiter<String>);

impl Keyed for Governor {
    fn check(&self, key: &String) -> bool {
        self.0.check_key(key).is_ok()
    }
}

fn tollgate(algorithm: Algorithm) -> Tollgate {
    let limit = Limit::per_second(100).algorithm(algorithm).build().expect("valid");
    Tollgate { store: MemoryStore::new(), limit }
}

fn governor() -> Governor {
    Governor(RateLimiter::keyed(Quota::per_second(NonZeroU32::new(100).expect("non-zero"))))
}

/// The keys a thread uses: its own hot key, or its own share of the 100,000.
fn keys_for(thread: usize, threads: usize, spread: bool) -> Vec<String> {
    if spread {
        let share = KEYS / threads;
        (thread * share..(thread + 1) * share).map(|i| format!("user:{i}")).collect()
    } else {
        vec![format!("hot:{thread}")]
    }
}

/// Runs `iters` checks on each of `threads` threads; returns the wall time and how many checks
/// were admitted (every decision is counted, on both sides alike).
fn run(side: &dyn Keyed, keys: &[Vec<String>], iters: u64) -> (Duration, u64) {
    let start = Instant::now();
    let admitted = std::thread::scope(|scope| {
        let threads: Vec<_> = keys
            .iter()
            .map(|thread_keys| {
                scope.spawn(move || {
                    let (mut i, mut admitted) = (0, 0u64);
                    for _ in 0..iters {
                        admitted += u64::from(black_box(side.check(&thread_keys[i])));
                        i = (i + STRIDE) % thread_keys.len();
                    }
                    admitted
                })
            })
            .collect();
        threads.into_iter().map(|thread| thread.join().expect("bench thread")).sum()
    });
    (start.elapsed(), admitted)
}

struct Case {
    spread: bool,
    threads: usize,
}

impl Case {
    fn name(&self) -> String {
        format!(
            "{} key{}, {} thread{}",
            if self.spread { "100k" } else { "1" },
            if self.spread { "s" } else { "" },
            self.threads,
            if self.threads > 1 { "s" } else { "" }
        )
    }

    fn keys(&self) -> Vec<Vec<String>> {
        (0..self.threads).map(|t| keys_for(t, self.threads, self.spread)).collect()
    }
}

const CASES: [Case; 4] = [
    Case { spread: false, threads: 1 },
    Case { spread: true, threads: 1 },
    Case { spread: false, threads: 2 },
    Case { spread: true, threads: 2 },
];

fn criterion_benches(c: &mut Criterion) {
    for case in &CASES {
        let keys = case.keys();
        let mut group = c.benchmark_group(case.name());
        group.throughput(Throughput::Elements(case.threads as u64));
        group.warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2)).sample_size(20);
        let gov = governor();
        group
            .bench_function(BenchmarkId::new("governor", "gcra"), |b| b.iter_custom(|iters| run(&gov, &keys, iters).0));
        for algorithm in Algorithm::ALL {
            let side = tollgate(algorithm);
            group.bench_function(BenchmarkId::new("tollgate", algorithm.as_str()), |b| {
                b.iter_custom(|iters| run(&side, &keys, iters).0)
            });
        }
        group.finish();
    }
}

/// How many iterations of `case` take about 50 ms for `side` (this also creates every key).
fn calibrate(side: &dyn Keyed, keys: &[Vec<String>]) -> u64 {
    let mut iters = 10_000u64;
    while run(side, keys, iters).0 < Duration::from_millis(50) {
        iters *= 2;
    }
    iters
}

/// ns per check, aggregated over the case's threads, and the share of checks admitted.
fn ns_per_check(side: &dyn Keyed, keys: &[Vec<String>], iters: u64) -> (f64, f64) {
    let (elapsed, admitted) = run(side, keys, iters);
    let checks = iters as f64 * keys.len() as f64;
    (elapsed.as_nanos() as f64 / checks, admitted as f64 / checks)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

const ROUNDS: usize = 9;

/// Two sides measured back to back.
struct Compared {
    /// Median ns per check of each side.
    a_ns: f64,
    b_ns: f64,
    /// Median of the per-round ratios b / a.
    ratio: f64,
    /// The share of checks each side admitted, over every round.
    a_admitted: f64,
    b_admitted: f64,
}

/// `a` and `b` measured back to back, `ROUNDS` times. Adjacent runs share the machine's
/// momentary load.
fn compare(a: &dyn Keyed, a_case: &Case, b: &dyn Keyed, b_case: &Case) -> Compared {
    let (a_keys, b_keys) = (a_case.keys(), b_case.keys());
    let (a_iters, b_iters) = (calibrate(a, &a_keys), calibrate(b, &b_keys));
    let rounds: Vec<((f64, f64), (f64, f64))> =
        (0..ROUNDS).map(|_| (ns_per_check(a, &a_keys, a_iters), ns_per_check(b, &b_keys, b_iters))).collect();
    let mean = |values: Vec<f64>| values.iter().sum::<f64>() / values.len() as f64;
    Compared {
        a_ns: median(rounds.iter().map(|r| r.0.0).collect()),
        b_ns: median(rounds.iter().map(|r| r.1.0).collect()),
        ratio: median(rounds.iter().map(|r| r.1.0 / r.0.0).collect()),
        a_admitted: mean(rounds.iter().map(|r| r.0.1).collect()),
        b_admitted: mean(rounds.iter().map(|r| r.1.1).collect()),
    }
}

/// The algorithms the summary measures: `ALGORITHMS=gcra,token-bucket` names some, all by default.
fn summary_algorithms() -> Vec<Algorithm> {
    match std::env::var("ALGORITHMS") {
        Ok(names) => names.split(',').map(|name| name.trim().parse().expect("an algorithm's name")).collect(),
        Err(_) => Algorithm::ALL.to_vec(),
    }
}

fn summary() {
    println!("\nSummary: ns per check, tollgate (ratio to governor measured back to back, median of {ROUNDS} rounds)");
    // Not starting with "governor": scripts/bench-peers.sh reads the figures of the row named so.
    println!(
        "(governor's keyed limiter, DefaultKeyedRateLimiter<String>: a DashMap lookup per check as tollgate looks up a key; 100/s, burst 100 on both sides)"
    );
    println!("{:<16}{:>22}{:>22}{:>22}{:>22}", "", CASES[0].name(), CASES[1].name(), CASES[2].name(), CASES[3].name());
    let gov = governor();
    let mut governor_ns = Vec::new();
    let mut first = true;
    let mut admitted = Vec::new();
    for algorithm in summary_algorithms() {
        let side = tollgate(algorithm);
        let mut cells = Vec::new();
        let mut shares = Vec::new();
        for case in &CASES {
            let pair = compare(&gov, case, &side, case);
            if first {
                governor_ns.push(format!("{:.1}", pair.a_ns));
            }
            cells.push(format!("{:.1} ({:.2}x)", pair.b_ns, pair.ratio));
            shares.push(format!("{:.4}% / {:.4}%", 100.0 * pair.a_admitted, 100.0 * pair.b_admitted));
        }
        admitted.push((algorithm, shares));
        if first {
            println!(
                "{:<16}{:>22}{:>22}{:>22}{:>22}",
                "governor", governor_ns[0], governor_ns[1], governor_ns[2], governor_ns[3]
            );
            first = false;
        }
        println!("{:<16}{:>22}{:>22}{:>22}{:>22}", algorithm.as_str(), cells[0], cells[1], cells[2], cells[3]);
    }
    println!("(ns per check; 2-thread figures are wall time / all checks; ratio below 1 = faster than governor)");
    println!("\nChecks admitted, governor / tollgate (both sides decide 100/s with a burst of 100):");
    for (algorithm, shares) in admitted {
        println!("{:<16}{:>22}{:>22}{:>22}{:>22}", algorithm.as_str(), shares[0], shares[1], shares[2], shares[3]);
    }

    // Scaling: 2 threads on distinct keys against 1 thread, back to back.
    let gcra = tollgate(Algorithm::Gcra);
    for spread in [false, true] {
        let one = Case { spread, threads: 1 };
        let two = Case { spread, threads: 2 };
        let ours = compare(&gcra, &one, &gcra, &two).ratio;
        let theirs = compare(&gov, &one, &gov, &two).ratio;
        println!(
            "gcra 2-thread throughput / 1-thread, {}: {:.2}x (governor {:.2}x)",
            if spread { "100k keys" } else { "1 key per thread" },
            1.0 / ours,
            1.0 / theirs
        );
    }
}

fn main() {
    // `SUMMARY_ONLY=1 cargo bench -p tollgate-store` skips criterion's detailed runs.
    if std::env::var_os("SUMMARY_ONLY").is_none() {
        let mut criterion = Criterion::default().configure_from_args();
        criterion_benches(&mut criterion);
        criterion.final_summary();
    }
    // `--profile-time` (a profiler attached) measures one criterion bench alone.
    if !std::env::args().any(|arg| arg == "--profile-time") {
        summary();
    }
}
