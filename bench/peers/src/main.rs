//! tollgate's stores against limitador's library, in this process, in alternating rounds; and the
//! RESP commands the script gives tollgate and throttlecrab-server (see the library).
//!
//! ```text
//! tollgate-bench-peers commands BURST COUNT SECONDS   two lines: tollgate's, throttlecrab's command
//! tollgate-bench-peers memory [--quick]               memory store vs limitador's InMemoryStorage
//! tollgate-bench-peers redis URL REDIS_PID [--quick]  Redis store vs limitador's AsyncRedisStorage
//! ```
//!
//! `memory` and `redis` print one row per case, tab-separated: label, tollgate's figure, the
//! peer's, an empty ratio (the script divides), the goal (`<=0.5`: the highest ratio tollgate ÷
//! peer the issue accepts) and a note. Every decision is counted: a side that admits more than its
//! limit allows in the time the run took is said to over-grant, and a side that errs says how
//! often.

#[cfg(feature = "limitador-redis")]
use std::cell::Cell;
#[cfg(feature = "limitador-redis")]
use std::rc::Rc;
use std::time::{Duration, Instant};

#[cfg(feature = "limitador-redis")]
use limitador::AsyncRateLimiter;
use limitador::RateLimiter;
use limitador::limit::Context;
use limitador::storage::in_memory::InMemoryStorage;
#[cfg(feature = "limitador-redis")]
use limitador::storage::redis::AsyncRedisStorage;
use tollgate_bench_peers::*;
use tollgate_store::{Limit, MemoryStore};
#[cfg(feature = "limitador-redis")]
use tollgate_store::{RedisOptions, RedisStore, Store};

/// A prime stride through the keys: every key visited, in an order the prefetcher cannot guess.
const STRIDE: usize = 7_919;
/// Each key's limit: 100 per second (as the governor comparison's).
const COUNT: u64 = 100;
const SECONDS: u64 = 1;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let words: Vec<&str> = args.iter().filter(|a| *a != "--quick").map(String::as_str).collect();
    match words.as_slice() {
        ["commands", burst, count, seconds] => {
            let number = |w: &str| w.parse::<u64>().unwrap_or_else(|_| fail(&format!("not a number: {w}")));
            let (ours, theirs) = throttle_commands(number(burst), number(count), number(seconds));
            println!("{ours}\n{theirs}");
        }
        ["memory"] => memory(quick),
        ["redis", url, pid] => redis(url, pid.parse().unwrap_or_else(|_| fail("REDIS_PID: not a number")), quick),
        _ => fail(
            "usage: tollgate-bench-peers commands BURST COUNT SECONDS | memory [--quick] | redis URL REDIS_PID [--quick]",
        ),
    }
}

fn fail(message: &str) -> ! {
    eprintln!("tollgate-bench-peers: {message}");
    std::process::exit(2)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// What one side did over a run: checks, admissions, errors, the time they took.
#[derive(Default, Clone, Copy)]
struct Tally {
    checks: u64,
    allowed: u64,
    errors: u64,
}

impl Tally {
    fn add(&mut self, other: Tally) {
        self.checks += other.checks;
        self.allowed += other.allowed;
        self.errors += other.errors;
    }
}

/// The most a side may admit: each key's `COUNT` per window, over the windows the run spanned
/// (a window opened before the run and one still open after it included).
fn bound(keys: usize, elapsed: Duration) -> u64 {
    keys as u64 * COUNT * (elapsed.as_secs() / SECONDS + 2)
}

/// The note on a row: over-grants and errors of either side, else how much each admitted.
fn note(sides: [(&str, Tally); 2], keys: usize, elapsed: Duration) -> String {
    let mut faults = Vec::new();
    for (name, tally) in sides {
        if tally.allowed > bound(keys, elapsed) {
            faults.push(format!("{name} OVER-GRANTS: {} admitted, at most {}", tally.allowed, bound(keys, elapsed)));
        }
        if tally.errors > 0 {
            faults.push(format!("{name} ERRORS: {} of {} checks", tally.errors, tally.checks));
        }
    }
    if faults.is_empty() {
        let share = |t: Tally| 100.0 * t.allowed as f64 / t.checks.max(1) as f64;
        format!(
            "admitted {:.1}% / {:.1}% of {} / {} checks",
            share(sides[0].1),
            share(sides[1].1),
            sides[0].1.checks,
            sides[1].1.checks
        )
    } else {
        faults.join("; ")
    }
}

fn row(label: &str, ours: f64, theirs: f64, goal: &str, note: &str) {
    // The ratio column left empty: the script divides.
    println!("{label}\t{ours:.1}\t{theirs:.1}\t\t{goal}\t{note}");
}

/// One in-memory side: checks the key at an index, says whether it was admitted.
trait Side {
    fn check(&self, index: usize) -> bool;
}

struct OursInMemory {
    store: MemoryStore,
    limit: Limit,
    keys: Vec<String>,
}

impl Side for OursInMemory {
    fn check(&self, index: usize) -> bool {
        self.store.check_sync(self.keys[index].as_bytes(), &self.limit, 1).expect("unit cost").allowed
    }
}

struct TheirsInMemory {
    limiter: RateLimiter,
    namespace: limitador::limit::Namespace,
    /// Built once, not per check: limitador's most favourable use (its server builds one per call).
    contexts: Vec<Context<'static>>,
}

impl Side for TheirsInMemory {
    fn check(&self, index: usize) -> bool {
        !self
            .limiter
            .check_rate_limited_and_update(&self.namespace, &self.contexts[index], 1)
            .expect("memory storage")
            .limited
    }
}

/// `iters` checks striding through `keys` keys: the wall time and the tally.
fn run_memory(side: &dyn Side, keys: usize, iters: u64) -> (Duration, Tally) {
    let mut tally = Tally::default();
    let mut index = 0;
    let start = Instant::now();
    for _ in 0..iters {
        tally.allowed += u64::from(std::hint::black_box(side.check(index)));
        index = (index + STRIDE) % keys;
    }
    tally.checks = iters;
    (start.elapsed(), tally)
}

fn memory(quick: bool) {
    let rounds = if quick { 3 } else { 9 };
    let target = Duration::from_millis(if quick { 20 } else { 50 });
    for keys in [1, 100_000] {
        let names: Vec<String> = (0..keys).map(|i| format!("user:{i}")).collect();
        let ours = OursInMemory {
            store: MemoryStore::new(),
            limit: tollgate_fixed_window(COUNT, SECONDS),
            keys: names.clone(),
        };
        let limiter = RateLimiter::new_with_storage(Box::new(InMemoryStorage::new(2 * keys as u64)));
        limiter.add_limit(limitador_fixed_window(COUNT, SECONDS));
        let theirs = TheirsInMemory {
            limiter,
            namespace: NAMESPACE.into(),
            contexts: names.iter().map(|k| limitador_context(k)).collect(),
        };
        let start = Instant::now();
        // Iterations for about `target` each (this also creates every key).
        let calibrate = |side: &dyn Side| {
            let mut iters = 10_000;
            while run_memory(side, keys, iters).0 < target {
                iters *= 2;
            }
            iters
        };
        let (our_iters, their_iters) = (calibrate(&ours), calibrate(&theirs));
        let (mut our_tally, mut their_tally) = (Tally::default(), Tally::default());
        let mut samples = Vec::new();
        for _ in 0..rounds {
            let (a, ta) = run_memory(&ours, keys, our_iters);
            let (b, tb) = run_memory(&theirs, keys, their_iters);
            our_tally.add(ta);
            their_tally.add(tb);
            samples.push((a.as_nanos() as f64 / our_iters as f64, b.as_nanos() as f64 / their_iters as f64));
        }
        let (a, b) = (median(samples.iter().map(|s| s.0).collect()), median(samples.iter().map(|s| s.1).collect()));
        let note = note([("tollgate", our_tally), ("limitador", their_tally)], keys, start.elapsed());
        let label = if keys == 1 { "1 key" } else { "100k keys" };
        row(&format!("in-process vs limitador (memory), fixed window, {label}: ns per check"), a, b, "<=0.5", &note);
    }
}

/// Without limitador's Redis storage built, the rows say so.
#[cfg(not(feature = "limitador-redis"))]
fn redis(_url: &str, _redis_pid: u32, _quick: bool) {
    fail("built without the `limitador-redis` feature (limitador's Redis storage, which needs RocksDB)")
}

/// CPU seconds (user + system) process `pid` has used so far (`self` for this one).
#[cfg(feature = "limitador-redis")]
fn cpu_seconds(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The command name (field 2) may hold spaces: count fields after its closing parenthesis.
    let fields: Vec<&str> =
        stat.rsplit_once(')').map(|(_, rest)| rest.split_whitespace().collect()).unwrap_or_default();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15, the 12th and 13th after the name.
    (ticks(11) + ticks(12)) / 100.0
}

/// One Redis side's run: `tasks` concurrent callers, `per_task` checks each.
#[cfg(feature = "limitador-redis")]
async fn run_redis<F, Fut>(check: Rc<F>, keys: usize, tasks: usize, per_task: usize) -> Tally
where
    F: Fn(usize) -> Fut + 'static,
    Fut: std::future::Future<Output = Option<bool>> + 'static,
{
    let tally = Rc::new(Cell::new(Tally::default()));
    let local = tokio::task::LocalSet::new();
    for task in 0..tasks {
        let (check, tally) = (check.clone(), tally.clone());
        local.spawn_local(async move {
            let mut index = (task * 104_729) % keys;
            for _ in 0..per_task {
                let answer = check(index).await;
                let mut t = tally.get();
                t.checks += 1;
                match answer {
                    Some(allowed) => t.allowed += u64::from(allowed),
                    None => t.errors += 1,
                }
                tally.set(t);
                index = (index + STRIDE) % keys;
            }
        });
    }
    local.await;
    tally.get()
}

#[cfg(feature = "limitador-redis")]
fn redis(url: &str, redis_pid: u32, quick: bool) {
    let (keys, tasks) = (10_000, 64);
    let rounds = if quick { 3 } else { 5 };
    let per_task = if quick { 200 } else { 1_000 };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let names: Rc<Vec<String>> = Rc::new((0..keys).map(|i| format!("user:{i}")).collect());
    let store =
        Rc::new(RedisStore::open(url, RedisOptions::default()).unwrap_or_else(|e| fail(&format!("{url}: {e}"))));
    let limit = Rc::new(tollgate_fixed_window(COUNT, SECONDS));
    let ours = {
        let (names, store, limit) = (names.clone(), store.clone(), limit.clone());
        Rc::new(move |i: usize| {
            let (names, store, limit) = (names.clone(), store.clone(), limit.clone());
            async move { store.check(names[i].as_bytes(), &limit, 1).await.ok().map(|d| d.allowed) }
        })
    };
    let storage = runtime
        .block_on(AsyncRedisStorage::new(url))
        .unwrap_or_else(|e| fail(&format!("limitador's Redis storage at {url}: {e}")));
    let limiter = Rc::new(AsyncRateLimiter::new_with_storage(Box::new(storage)));
    limiter.add_limit(limitador_fixed_window(COUNT, SECONDS));
    let contexts: Rc<Vec<Context<'static>>> = Rc::new(names.iter().map(|k| limitador_context(k)).collect());
    let theirs = {
        let namespace: limitador::limit::Namespace = NAMESPACE.into();
        Rc::new(move |i: usize| {
            let (limiter, contexts, namespace) = (limiter.clone(), contexts.clone(), namespace.clone());
            async move { limiter.check_rate_limited_and_update(&namespace, &contexts[i], 1).await.ok().map(|r| !r.limited) }
        })
    };
    let redis_pid = redis_pid.to_string();
    // Per check: wall µs (at `tasks` in flight), this process's CPU µs, Redis's CPU µs.
    let measure = |tally: Tally, wall: Duration, own: f64, redis: f64| {
        let n = tally.checks.max(1) as f64;
        (wall.as_secs_f64() * 1e6 / n, own * 1e6 / n, redis * 1e6 / n)
    };
    // Warm-up: connections made, scripts loaded.
    runtime.block_on(run_redis(ours.clone(), keys, tasks, 20));
    runtime.block_on(run_redis(theirs.clone(), keys, tasks, 20));
    let start = Instant::now();
    let (mut our_tally, mut their_tally) = (Tally::default(), Tally::default());
    let mut samples = Vec::new();
    for _ in 0..rounds {
        let mut figures = Vec::new();
        for side in 0..2 {
            let (own0, redis0, t0) = (cpu_seconds("self"), cpu_seconds(&redis_pid), Instant::now());
            let tally = if side == 0 {
                runtime.block_on(run_redis(ours.clone(), keys, tasks, per_task))
            } else {
                runtime.block_on(run_redis(theirs.clone(), keys, tasks, per_task))
            };
            let wall = t0.elapsed();
            figures.push(measure(tally, wall, cpu_seconds("self") - own0, cpu_seconds(&redis_pid) - redis0));
            if side == 0 { our_tally.add(tally) } else { their_tally.add(tally) }
        }
        samples.push((figures[0], figures[1]));
    }
    let note = note([("tollgate", our_tally), ("limitador", their_tally)], keys, start.elapsed());
    let pick = |f: fn(&(f64, f64, f64)) -> f64| {
        (median(samples.iter().map(|s| f(&s.0)).collect()), median(samples.iter().map(|s| f(&s.1)).collect()))
    };
    let (wall, own, redis) = (pick(|f| f.0), pick(|f| f.1), pick(|f| f.2));
    let what = format!("in-process vs limitador (Redis), fixed window, {keys} keys, {tasks} in flight");
    row(&format!("{what}: wall ns per check"), wall.0 * 1e3, wall.1 * 1e3, "-", &note);
    row(&format!("{what}: client CPU ns per check"), own.0 * 1e3, own.1 * 1e3, "<=0.5", "");
    row(&format!("{what}: Redis CPU ns per check"), redis.0 * 1e3, redis.1 * 1e3, "<=1.0", "");
}
