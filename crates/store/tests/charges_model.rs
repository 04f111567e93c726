//! A model check of "every charge applied exactly once" (ARCHITECTURE.md, principle 11): random
//! interleavings, from seeds, of requests and leases against a remote (the memory store, and a
//! real redis-server for a few seeds) whose calls are
//! refused, run and lose their reply, wait and answer late (out of order), or fail part way across
//! two servers, while a `local` node decides what the remote does not answer, merges its pending
//! charges and sends them with every call. Once every call is answered and every debt paid, the
//! remote counts each admission exactly once: each it decided itself, each the node decided
//! locally (a call whose reply was lost counts at both: the documented cost of a lost reply).

mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tollgate_store::fallback::FallbackOptions;
use tollgate_store::lease::{Grant, Lessor};
use tollgate_store::remote::{Charge, Remote, Reply};
use tollgate_store::testkit::random::Rng;
use tollgate_store::testkit::redis_server::RedisServer;
use tollgate_store::{
    Algorithm, Breaker, Check, Clock, FailurePolicy, Fallback, Limit, ManualClock, MemoryStore, RedisOptions,
    RedisStore, Store, StoreError, TimeSource, all_allowed,
};

const SEC: u64 = 1_000_000_000;
const T0: u64 = 1_700_000_000 * SEC;
/// A minute into a day (UTC), a day's window from its start.
const DAY_START: u64 = (1_700_000_000 / 86_400 * 86_400 + 60) * SEC;

/// What happens to a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    Pass,
    Refuse,
    /// Runs, and its reply is lost.
    Lose,
    /// Waits until released, then runs; its reply lost if `true`.
    Wait(bool),
    /// A call of several checks: the first check's server answers, the others' fails (not run).
    Split,
}

/// The memory remote, with a fate per call drawn from a seed while chaos lasts (in storms, every
/// call fails).
struct Chaos<R> {
    inner: R,
    rng: Mutex<Rng>,
    chaos: AtomicBool,
    /// Every call fails (some run).
    storm: AtomicBool,
    waiting: Mutex<Vec<tokio::sync::oneshot::Sender<()>>>,
    /// Units the remote admitted itself, those of them whose reply reached the node, and those
    /// of them leased.
    admitted: AtomicU64,
    delivered: AtomicU64,
    leased: AtomicU64,
}

store_by_decide!(Chaos<MemoryStore>);
store_by_decide!(Chaos<RedisStore>);

impl<R> Chaos<R> {
    fn fate(&self, checks: usize) -> Fate {
        if !self.chaos.load(Ordering::SeqCst) {
            return Fate::Pass;
        }
        let mut rng = self.rng.lock().unwrap();
        if self.storm.load(Ordering::SeqCst) {
            return if rng.chance(40) { Fate::Lose } else { Fate::Refuse };
        }
        match rng.below(100) {
            0..30 => Fate::Refuse,
            30..45 => Fate::Lose,
            45..60 => Fate::Wait(rng.chance(30)),
            60..75 if checks > 1 => Fate::Split,
            _ => Fate::Pass,
        }
    }

    /// Releases every call waiting, in an order drawn from the seed.
    fn release_some(&self, all: bool) {
        let mut waiting = self.waiting.lock().unwrap();
        let mut rng = self.rng.lock().unwrap();
        while !waiting.is_empty() && (all || rng.chance(50)) {
            let i = usize::try_from(rng.below(waiting.len() as u64)).unwrap();
            let _ = waiting.swap_remove(i).send(());
        }
    }
}

impl<R: Remote> Chaos<R> {
    /// Runs the call on the inner store, counting what it admitted.
    async fn run(&self, checks: &[Check<'_>], charges: &[Charge<'_>]) -> Result<Reply, StoreError> {
        let reply = self.inner.decide(checks, charges).await?;
        if all_allowed(&reply.decisions) {
            self.admitted.fetch_add(checks.iter().map(|c| c.cost).sum(), Ordering::SeqCst);
        }
        Ok(reply)
    }

    fn delivered(&self, checks: &[Check<'_>], reply: &Reply) {
        if all_allowed(&reply.decisions) {
            self.delivered.fetch_add(checks.iter().map(|c| c.cost).sum(), Ordering::SeqCst);
        }
    }
}

impl<R: Remote> Remote for Chaos<R>
where
    Chaos<R>: Store,
{
    async fn decide(&self, checks: &[Check<'_>], charges: &[Charge<'_>]) -> Result<Reply, StoreError> {
        let lost = || Err(StoreError::Timeout(Duration::from_millis(50)));
        match self.fate(checks.len()) {
            Fate::Pass => {
                let reply = self.run(checks, charges).await?;
                self.delivered(checks, &reply);
                Ok(reply)
            }
            Fate::Refuse => Err(StoreError::Backend("refused".into())),
            Fate::Lose => {
                self.run(checks, charges).await?;
                lost()
            }
            Fate::Wait(lose) => {
                let (tx, rx) = tokio::sync::oneshot::channel();
                self.waiting.lock().unwrap().push(tx);
                let _ = rx.await;
                let reply = self.run(checks, charges).await?;
                if lose {
                    return lost();
                }
                self.delivered(checks, &reply);
                Ok(reply)
            }
            Fate::Split => {
                let first: Vec<Charge<'_>> = charges.iter().filter(|c| c.check.key == checks[0].key).copied().collect();
                let reply = self.run(&checks[..1], &first).await?;
                self.delivered(&checks[..1], &reply);
                Err(support::failed_after_first(checks, &reply))
            }
        }
    }

    async fn probe(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

/// A lease is a call of its own, without the charges (as on Redis).
impl<R: Remote> Lessor for Chaos<R>
where
    Chaos<R>: Store,
{
    async fn lease(&self, check: Check<'_>, want: u64, _lessee: u64, _lifetime: Duration) -> Result<Grant, StoreError> {
        let reply = self.decide(&[Check { cost: want, ..check }], &[]).await?;
        let decision = reply.decisions[0];
        let granted = if decision.allowed { want } else { 0 };
        self.leased.fetch_add(granted, Ordering::SeqCst);
        Ok(Grant { decision, granted, lessees: 1, snapshot: reply.snapshots[0], at: reply.now_ns })
    }
}

/// One seed's run under a limit of `algorithm`: what the remote counts of each key, and what it
/// should. With `minutes`, the clock moves on by up to that many minutes now and then, `until`
/// minutes at most (under a limit of a day's window, from the start of one): past the resend
/// horizon (10 minutes), a charge a lost reply's call applied may be sent anew and count twice
/// (documented), never lost.
async fn run<R: Remote>(
    inner: impl FnOnce(&Arc<ManualClock>) -> R,
    algorithm: Algorithm,
    seed: u64,
    minutes: u64,
    until: u64,
) where
    Chaos<R>: Store,
{
    let clock = Arc::new(ManualClock::new(if minutes > 0 { DAY_START } else { T0 }));
    let remote = Arc::new(Chaos {
        inner: inner(&clock),
        rng: Mutex::new(Rng(seed)),
        chaos: true.into(),
        storm: false.into(),
        waiting: Mutex::new(Vec::new()),
        admitted: AtomicU64::new(0),
        delivered: AtomicU64::new(0),
        leased: AtomicU64::new(0),
    });
    // Every other seed, a breaker that opens after 3 failures (its calls then answered by the
    // policy at once, nothing sent) and probes every millisecond.
    let breaker = Breaker::new(if seed.is_multiple_of(2) { u32::MAX } else { 3 }, Duration::from_millis(1));
    let options = FallbackOptions { clock: clock.clone(), breaker, ..FallbackOptions::default() };
    let node = Fallback::with_options(remote.clone(), FailurePolicy::Local, options);
    // Never binding (the clock stands still, or within one window): every request is admitted,
    // wherever decided.
    let capacity = 100_000;
    let limit = if minutes > 0 { Limit::per_day(capacity) } else { Limit::per_hour(capacity) };
    let limit = limit.algorithm(algorithm).build().unwrap();
    let (k, j) = (b"k".as_slice(), b"j".as_slice());
    let mut rng = Rng(seed ^ 0x5851_f42d_4c95_7f2d);
    let mut requests = Vec::new();
    let mut leases = Vec::new();
    for _ in 0..400 {
        match rng.below(10) {
            0..5 => {
                let (node, limit) = (node.clone(), limit.clone());
                requests.push(tokio::spawn(async move { node.check_all(&[Check::new(k, &limit, 1)]).await }));
            }
            5..7 => {
                let (node, limit) = (node.clone(), limit.clone());
                let first = if rng.chance(50) { [k, j] } else { [j, k] };
                requests.push(tokio::spawn(async move {
                    node.check_all(&[Check::new(first[0], &limit, 1), Check::new(first[1], &limit, 1)]).await
                }));
            }
            7 => {
                let (node, limit, want) = (node.clone(), limit.clone(), 1 + rng.below(5));
                leases.push(tokio::spawn(async move {
                    node.lease(Check::new(k, &limit, 1), want, 7, Duration::from_millis(100)).await
                }));
            }
            8 if minutes > 0 && rng.chance(30) => {
                let to = (clock.now_ns() + rng.below(minutes * 60) * SEC).min(DAY_START + until * 60 * SEC);
                clock.set(to);
            }
            9 if rng.chance(20) => {
                remote.storm.fetch_xor(true, Ordering::SeqCst);
            }
            _ => remote.release_some(false),
        }
        for _ in 0..rng.below(4) {
            tokio::task::yield_now().await;
        }
    }
    // Calm: every call waiting answers, every debt is paid.
    remote.chaos.store(false, Ordering::SeqCst);
    remote.storm.store(false, Ordering::SeqCst);
    let mut admitted = 0;
    for request in requests {
        while !request.is_finished() {
            remote.release_some(true);
            tokio::task::yield_now().await;
        }
        let decisions = request.await.unwrap().unwrap();
        assert!(all_allowed(&decisions), "{algorithm} seed {seed}: a request denied under a limit that never binds");
        admitted += decisions.len() as u64;
    }
    for lease in leases {
        while !lease.is_finished() {
            remote.release_some(true);
            tokio::task::yield_now().await;
        }
        let _ = lease.await.unwrap();
    }
    for _ in 0..500 {
        node.check_all(&[Check::new(k, &limit, 0), Check::new(j, &limit, 0)]).await.unwrap();
        if node.stats().debts == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(node.stats().debts, 0, "{algorithm} seed {seed}: debts not paid");
    let mut used = 0;
    for key in [k, j] {
        used += capacity - remote.inner.check(key, &limit, 0).await.unwrap().remaining;
    }
    // The remote's own admissions, and the node's local ones (those it answered that the remote's
    // replies did not bring).
    let by_remote = remote.admitted.load(Ordering::SeqCst);
    let delivered = remote.delivered.load(Ordering::SeqCst) - remote.leased.load(Ordering::SeqCst);
    let local = admitted - delivered;
    let why = format!("{algorithm} seed {seed}: {by_remote} admitted by the remote, {local} locally");
    if until < 10 {
        assert_eq!(used, by_remote + local, "{why}");
    } else {
        assert!(used >= by_remote + local, "{why}: {used} counted");
    }
}

fn memory(clock: &Arc<ManualClock>) -> MemoryStore {
    MemoryStore::builder().clock(clock.clone()).build()
}

#[tokio::test]
async fn every_admission_counts_once_across_random_interleavings_of_faults() {
    for algorithm in Algorithm::ALL {
        for seed in 1..=40u64 {
            run(memory, algorithm, seed.wrapping_mul(0x9e37_79b9_7f4a_7c15), 0, 0).await;
        }
    }
}

/// The same on a real redis-server (the script's charges, markers and lowering), fewer seeds.
#[tokio::test]
async fn every_admission_counts_once_across_random_interleavings_of_faults_on_redis() {
    let server = RedisServer::start();
    for algorithm in Algorithm::ALL {
        for seed in 1..=3u64 {
            let redis = |clock: &Arc<ManualClock>| {
                let options = RedisOptions {
                    prefix: format!("m{}{seed}", algorithm.as_str()),
                    time: TimeSource::Clock(clock.clone()),
                    timeout: Duration::from_secs(5),
                    ..RedisOptions::default()
                };
                RedisStore::open(&server.url(), options).unwrap()
            };
            run(redis, algorithm, seed.wrapping_mul(0x9e37_79b9_7f4a_7c15), 0, 0).await;
        }
    }
}

/// The clock moving on within the resend horizon (markers, stamps and charges' ages with it):
/// still each admission once; past it, never one lost.
#[tokio::test]
async fn no_admission_is_lost_across_random_interleavings_of_faults_and_time() {
    for seed in 1..=40u64 {
        let seed = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        run(memory, Algorithm::FixedWindow, seed, 2, 9).await;
        run(memory, Algorithm::FixedWindow, seed, 4, 120).await;
    }
}
