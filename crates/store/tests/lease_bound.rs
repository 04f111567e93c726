//! The lease bound, checked by a deterministic simulation: `N` nodes (each a lease [`Book`]) and
//! a node without leases share one key on a model of Redis ([`LeaseModel`], the memory store on a
//! manual clock), with random demand, random network delays, lost replies, nodes that crash and
//! Redis outages. An oracle records every unit admitted and checks, over every interval:
//!
//! - bucket family: admitted ≤ `burst + elapsed / T + min(N × g_max, lifetime / T)`, and from idle
//!   admitted ≤ `burst + elapsed / T` (every unit spent was debited first);
//! - fixed window: each window admits at most `count`; sliding window counter: at every instant,
//!   `previous × (P − elapsed) / P + current ≤ count`, as the algorithm itself guarantees.
//!
//! Adversarial schedules then show the extra burstiness is reached: ≥ 90% of the bound.

use std::time::Duration;

use tollgate_core::{Algorithm, Clock, Limit, ManualClock};
use tollgate_store::lease::{Book, LeaseMode, LeaseModel, LeaseOptions, Order, Spend};
use tollgate_store::testkit::random::Rng;
use tollgate_store::{Check, MemoryStore, StoreError};

const STEP: u64 = 100_000; // 100 µs

/// A refill on the wire: it reaches Redis at `arrives`, its answer reaches the node at `replies`.
struct Wire {
    node: usize,
    incarnation: u64,
    order: Order,
    arrives: u64,
    reply_delay: u64,
    lost: bool,
    answer: Option<(u64, Result<tollgate_store::lease::Grant, StoreError>)>,
}

struct Sim {
    clock: std::sync::Arc<ManualClock>,
    redis: LeaseModel,
    limit: Limit,
    options: LeaseOptions,
    nodes: Vec<(Book, u64)>,
    wires: Vec<Wire>,
    /// (instant, units) of every admission.
    admitted: Vec<(u64, u64)>,
    redis_down: bool,
    max_delay: u64,
    loss_percent: u64,
}

impl Sim {
    fn new(limit: Limit, options: LeaseOptions, nodes: usize) -> Self {
        let clock = std::sync::Arc::new(ManualClock::new(1_000_000 * 1_000_000_000));
        let store = MemoryStore::builder().clock(clock.clone()).build();
        let books = (0..nodes).map(|i| (Self::book(&options, i), 0)).collect();
        Sim {
            clock,
            redis: LeaseModel::new(store),
            limit,
            options,
            nodes: books,
            wires: Vec::new(),
            admitted: Vec::new(),
            redis_down: false,
            max_delay: 0,
            loss_percent: 0,
        }
    }

    fn book(options: &LeaseOptions, i: usize) -> Book {
        Book::new(LeaseOptions { lessee: i as u64 + 1, ..options.clone() })
    }

    fn now(&self) -> u64 {
        self.clock.now_ns()
    }

    fn check(&self) -> Check<'_> {
        Check { scope: "sim", key: b"hot", limit: &self.limit, cost: 1, hold: false, reporting: false }
    }

    fn send(&mut self, node: usize, order: Option<Order>, rng: &mut Rng) {
        let Some(order) = order else { return };
        let now = self.now();
        let arrives = now + rng.below(self.max_delay + 1);
        let wire = Wire {
            node,
            incarnation: self.nodes[node].1,
            order,
            arrives,
            reply_delay: rng.below(self.max_delay + 1),
            lost: rng.chance(self.loss_percent),
            answer: None,
        };
        self.wires.push(wire);
    }

    /// One unit request at `node`: answered from its book, or exactly by Redis.
    fn request(&mut self, node: usize, rng: &mut Rng) -> bool {
        let now = self.now();
        let spend = self.nodes[node].0.spend(&self.check(), now, false);
        let order = match spend {
            Spend::Local { decision, order, .. } => {
                self.send(node, order, rng);
                if decision.allowed {
                    self.admitted.push((now, 1));
                }
                return decision.allowed;
            }
            Spend::Wait { order, .. } => {
                // Asked again as if after the refill it waited for (a stale denial may answer).
                self.send(node, order, rng);
                match self.nodes[node].0.spend(&self.check(), now, true) {
                    Spend::Local { decision, order, .. } => {
                        self.send(node, order, rng);
                        if decision.allowed {
                            self.admitted.push((now, 1));
                        }
                        return decision.allowed;
                    }
                    Spend::Wait { order, .. } | Spend::Exact { order } => order,
                }
            }
            Spend::Exact { order } => order,
        };
        self.send(node, order, rng);
        let observed = self.nodes[node].0.observe_exact(&self.check(), now);
        self.send(node, observed, rng);
        self.exact()
    }

    /// One unit decided by Redis itself (a node without leases, or the exact path).
    fn exact(&mut self) -> bool {
        if self.redis_down {
            return false;
        }
        let allowed = self.redis.store().check_one_sync(self.check()).unwrap().allowed;
        if allowed {
            self.admitted.push((self.now(), 1));
        }
        allowed
    }

    /// Moves the clock one step and delivers what is due.
    fn step(&mut self) {
        self.clock.advance(Duration::from_nanos(STEP));
        let now = self.now();
        let lifetime = self.options.lifetime;
        for wire in &mut self.wires {
            if wire.answer.is_none() && wire.arrives <= now {
                let node = wire.node as u64 + 1;
                let check =
                    Check { scope: "sim", key: b"hot", limit: &self.limit, cost: 0, hold: false, reporting: false };
                let result = if self.redis_down {
                    Err(StoreError::Backend("down".into()))
                } else {
                    self.redis.lease_sync(check, wire.order.want, node, lifetime)
                };
                // A lost reply is a timeout for the node (the debit, if any, stands: an under-grant).
                let delay = if wire.lost { 50_000_000 } else { wire.reply_delay };
                let result = if wire.lost { Err(StoreError::Timeout(Duration::from_millis(50))) } else { result };
                wire.answer = Some((now + delay, result));
            }
        }
        let (due, waiting): (Vec<Wire>, Vec<Wire>) =
            self.wires.drain(..).partition(|w| w.answer.as_ref().is_some_and(|(at, _)| *at <= now));
        self.wires = waiting;
        for mut wire in due {
            let (_, result) = wire.answer.take().unwrap();
            // A node that crashed meanwhile never hears of it.
            if self.nodes[wire.node].1 == wire.incarnation {
                self.nodes[wire.node].0.granted(wire.order, result, now);
            }
        }
    }

    fn crash(&mut self, node: usize) {
        self.nodes[node] = (Self::book(&self.options, node), self.nodes[node].1 + 1);
    }

    fn held(&self, node: usize) -> u64 {
        self.nodes[node].0.held(&self.check(), self.now())
    }

    fn leasing_nodes(&self) -> u64 {
        self.nodes.len() as u64
    }

    fn g_max(&self) -> u64 {
        self.nodes[0].0.max_held(&self.limit)
    }

    /// The bucket family's extra burstiness bound: `min(N × g_max, lifetime / T)`.
    fn extra_bound(&self) -> f64 {
        let per_lifetime = self.options.lifetime.as_nanos() as f64 / self.limit.emission_interval_ns() as f64;
        ((self.leasing_nodes() * self.g_max()) as f64).min(per_lifetime)
    }

    /// The largest `admitted − (burst + elapsed / T)` over every interval, and the same from the
    /// start (idle).
    fn bucket_excess(&self, from_idle: u64) -> (f64, f64) {
        let t = self.limit.emission_interval_ns() as f64;
        let burst = self.limit.burst() as f64;
        let (mut best, mut from_start) = (f64::MIN, f64::MIN);
        let (mut total, mut lowest) = (0.0, f64::MAX);
        for &(at, units) in &self.admitted {
            // max over i ≤ j of (S_j − at_j / T) − (S_{i−1} − at_i / T)
            lowest = lowest.min(total - at as f64 / t);
            total += units as f64;
            best = best.max(total - at as f64 / t - lowest - burst);
            from_start = from_start.max(total - (at - from_idle) as f64 / t - burst);
        }
        (best, from_start)
    }

    fn check_windows(&self) {
        let p = self.limit.period_ns();
        let count = self.limit.count();
        let mut per_window = std::collections::BTreeMap::<u64, u64>::new();
        for &(at, units) in &self.admitted {
            let window = at / p;
            *per_window.entry(window).or_default() += units;
            let current = per_window[&window];
            assert!(current <= count, "window {window} admitted {current} > {count}");
            if self.limit.algorithm() == Algorithm::SlidingWindow {
                let previous = per_window.get(&(window.wrapping_sub(1))).copied().unwrap_or(0);
                let elapsed = at % p;
                let estimate = u128::from(previous) * u128::from(p - elapsed) + u128::from(current) * u128::from(p);
                assert!(
                    estimate <= u128::from(count) * u128::from(p),
                    "at {at}: {previous} then {current} over {count}"
                );
            }
        }
    }
}

fn options(mode: LeaseMode, lifetime_ms: u64, share_percent: u64) -> LeaseOptions {
    LeaseOptions {
        mode,
        lifetime: Duration::from_millis(lifetime_ms),
        hot_rate: 200,
        share_percent,
        ..LeaseOptions::default()
    }
}

/// Random demand, delays, losses, crashes and outages; the oracle after every run.
fn random_run(seed: u64, limit: Limit, mode: LeaseMode) -> (Sim, f64) {
    let mut rng = Rng(seed | 1);
    let lifetime = rng.pick(&[20, 100, 250]);
    let share = rng.pick(&[1, 10, 50]);
    let n = rng.pick(&[2, 3, 4, 5]);
    let mut sim = Sim::new(limit.clone(), options(mode, lifetime, share), n);
    sim.max_delay = rng.pick(&[0, 1, 5, 20]) * 1_000_000;
    sim.loss_percent = rng.below(10);
    let start = sim.now();
    // Per node, requests per step in thousandths, changed every phase.
    let mut rates = vec![0u64; n + 1];
    let mut credit = vec![0u64; n + 1];
    for step in 0..15_000u64 {
        if step % 500 == 0 {
            for r in &mut rates {
                *r = rng.pick(&[0, 20, 100, 500, 2_000, 10_000]);
            }
            sim.redis_down = rng.chance(10);
        }
        if rng.chance(1) && rng.chance(5) {
            let node = rng.pick(&(0..n).collect::<Vec<_>>());
            sim.crash(node);
        }
        for node in 0..=n {
            credit[node] += rates[node];
            while credit[node] >= 1_000 {
                credit[node] -= 1_000;
                if node == n {
                    sim.exact();
                } else {
                    sim.request(node, &mut rng);
                }
            }
        }
        sim.step();
    }
    if limit.algorithm().is_bucket() {
        let (excess, from_idle) = sim.bucket_excess(start);
        let bound = sim.extra_bound();
        assert!(excess <= bound + 1e-6, "seed {seed}: excess {excess} > bound {bound}");
        assert!(from_idle <= 1e-6, "seed {seed}: {from_idle} over the algorithm's bound from idle");
        (sim, excess)
    } else {
        sim.check_windows();
        (sim, 0.0)
    }
}

#[test]
fn random_schedules_never_exceed_the_bound() {
    let mut worst: f64 = 0.0;
    for seed in 1..=6u64 {
        for algorithm in [Algorithm::Gcra, Algorithm::TokenBucket, Algorithm::LeakyBucket] {
            let limit = Limit::per_second(1_000).burst(100).algorithm(algorithm).build().unwrap();
            let (sim, excess) = random_run(seed * 7919, limit.clone(), LeaseMode::Always);
            worst = worst.max(excess / sim.extra_bound());
            let (_, _) = random_run(seed * 104_729, limit_of(algorithm, 200, 500), LeaseMode::Auto);
        }
        for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindow] {
            let limit = Limit::builder(300, Duration::from_millis(200)).algorithm(algorithm).build().unwrap();
            random_run(seed * 31, limit.clone(), LeaseMode::Always);
            random_run(seed * 37, limit, LeaseMode::Auto);
        }
    }
    eprintln!("worst excess over random schedules: {:.0}% of the bound", worst * 100.0);
}

fn limit_of(algorithm: Algorithm, per_second: u64, burst: u64) -> Limit {
    Limit::per_second(per_second).burst(burst).algorithm(algorithm).build().unwrap()
}

/// The adversary: every node demands far above the limit for 40 ms (the bucket empties, the
/// rest is denied: the nodes learn a high rate), then waits until the bucket is full again and
/// the nodes' lessee counts are a lifetime old; then each node asks for a slice with one request,
/// and just before the slices expire (the bucket refilled meanwhile) the nodes spend what they
/// hold while another client takes the whole bucket. Answers the excess reached and the bound.
fn adversary(limit: Limit, options: LeaseOptions, n: usize) -> (f64, f64) {
    let mut sim = Sim::new(limit.clone(), options, n);
    let mut rng = Rng(7);
    let lifetime = u64::try_from(sim.options.lifetime.as_nanos()).unwrap();
    for _ in 0..400 {
        for node in 0..n {
            sim.request(node, &mut rng);
        }
        sim.step();
    }
    let quiet = (limit.tolerance_ns() + lifetime) / STEP + 1;
    for _ in 0..quiet {
        sim.step();
    }
    let began = sim.now();
    for node in 0..n {
        sim.request(node, &mut rng);
    }
    while !sim.wires.is_empty() {
        sim.step();
    }
    let held: u64 = (0..n).map(|node| sim.held(node)).sum();
    while sim.now() + 2 * STEP < began + lifetime {
        sim.step();
    }
    for node in 0..n {
        while sim.held(node) > 0 {
            assert!(sim.request(node, &mut rng));
        }
    }
    while sim.exact() {}
    let (excess, from_idle) = sim.bucket_excess(0);
    let bound = sim.extra_bound();
    eprintln!("held {held}, excess {excess:.1}, bound {bound:.1}, from idle {from_idle:.1}");
    assert!(excess <= bound + 1e-6);
    (excess, bound)
}

#[test]
fn an_adversary_reaches_the_bound_where_n_times_g_max_binds() {
    // 1000/s, burst 100: g_max = 10% of 100 = 10; 4 nodes → 40 < lifetime / T = 400.
    let limit = Limit::per_second(1_000).burst(100).build().unwrap();
    let (excess, bound) = adversary(limit, options(LeaseMode::Always, 400, 10), 4);
    assert_eq!(bound, 40.0);
    assert!(excess >= 0.9 * bound, "{excess} of {bound}");
}

#[test]
fn an_adversary_reaches_the_bound_where_the_lifetime_binds() {
    // 1000/s, burst 100, lifetime 40 ms: lifetime / T = 40 < g_max (50) with one node (with more,
    // each one's request that asks for its slice is decided exactly and costs the adversary a unit).
    let limit = Limit::per_second(1_000).burst(100).build().unwrap();
    let (excess, bound) = adversary(limit, options(LeaseMode::Always, 40, 50), 1);
    assert_eq!(bound, 40.0);
    assert!(excess >= 0.9 * bound, "{excess} of {bound}");
}
