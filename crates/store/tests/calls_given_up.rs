//! Review of issue 37's merged ledger bookkeeping (`Ledger::send`, `Ledger::answered`): calls
//! given up while in flight (their futures dropped: a client gone, a deadline) leave no cost
//! counted in flight, and a call in flight while the node decides locally is counted once, by a
//! `local` node over a remote that can be held at its door.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tollgate_store::remote::{Charge, Remote, Reply};
use tollgate_store::testkit::faults::{Fault, Faulty};
use tollgate_store::{
    Breaker, Check, FailurePolicy, Fallback, Limit, ManualClock, MemoryStore, Refund, Reserved, Store, StoreError,
    fallback::FallbackOptions,
};

const SEC: u64 = 1_000_000_000;
const T0: u64 = 1_700_000_000 * SEC;

/// A remote whose decisions of a check costing `held_cost` wait at its door while `closed`.
#[derive(Debug)]
struct Door {
    inner: Faulty<MemoryStore>,
    closed: AtomicBool,
    held_cost: AtomicU64,
}

impl Door {
    async fn pass(&self, checks: &[Check<'_>]) {
        let held = self.held_cost.load(Ordering::SeqCst);
        while self.closed.load(Ordering::SeqCst) && checks.iter().any(|c| c.cost == held) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

impl Store for Door {
    async fn reserve(&self, checks: &[Check<'_>]) -> Result<Reserved, StoreError> {
        self.inner.reserve(checks).await
    }
    async fn refund(&self, refunds: &[Refund<'_>]) -> Result<(), StoreError> {
        self.inner.refund(refunds).await
    }
    async fn reset(&self, scope: &str, key: &[u8], limit: &Limit) -> Result<(), StoreError> {
        self.inner.reset(scope, key, limit).await
    }
    async fn carry(&self, scope: &str, key: &[u8], from: &Limit, to: &Limit) -> Result<u64, StoreError> {
        self.inner.carry(scope, key, from, to).await
    }
}

impl Remote for Door {
    async fn decide(&self, checks: &[Check<'_>], charges: &[Charge<'_>]) -> Result<Reply, StoreError> {
        self.pass(checks).await;
        self.inner.decide(checks, charges).await
    }
    async fn probe(&self) -> Result<(), StoreError> {
        self.inner.probe().await
    }
}

fn node() -> (Arc<Door>, Fallback<Arc<Door>>) {
    let clock = Arc::new(ManualClock::new(T0));
    let door = Arc::new(Door {
        inner: Faulty::new(MemoryStore::builder().clock(clock.clone()).build()),
        closed: AtomicBool::new(false),
        held_cost: AtomicU64::new(u64::MAX),
    });
    let breaker = Breaker::new(u32::MAX, Duration::from_millis(100));
    let options = FallbackOptions { clock, breaker, ..FallbackOptions::default() };
    (door.clone(), Fallback::with_options(door, FailurePolicy::Local, options))
}

/// Admissions of `checks` (all or nothing) until one is refused, at most `bound`.
async fn admitted(node: &Fallback<Arc<Door>>, checks: &[Check<'_>], bound: usize) -> usize {
    for n in 0..bound {
        let reserved = node.reserve(checks).await.unwrap();
        if !reserved.decisions.iter().all(|d| d.allowed) {
            return n;
        }
    }
    bound
}

/// Calls given up at the remote's door (single checks, a key twice in one call, two keys): once
/// the remote is unreachable, the node admits locally exactly the limit, as though they were never
/// made: none of their costs stays counted in flight.
#[tokio::test]
async fn calls_given_up_in_flight_leave_nothing_in_flight() {
    let limit = Limit::per_hour(10).build().unwrap();
    let (door, node) = node();
    door.held_cost.store(2, Ordering::SeqCst);
    door.closed.store(true, Ordering::SeqCst);
    let calls: [&[Check<'_>]; 3] = [
        &[Check::new(b"a", &limit, 2)],
        &[Check::new(b"a", &limit, 2), Check::new(b"a", &limit, 2)],
        &[Check::new(b"a", &limit, 2), Check::new(b"b", &limit, 2)],
    ];
    for checks in calls {
        for _ in 0..3 {
            let given_up = tokio::time::timeout(Duration::from_millis(5), node.reserve(checks)).await;
            assert!(given_up.is_err(), "the call waited at the door: {given_up:?}");
        }
    }
    door.closed.store(false, Ordering::SeqCst);
    door.inner.set(Fault::Refuse);
    let a = admitted(&node, &[Check::new(b"a", &limit, 1)], 20).await;
    let b = admitted(&node, &[Check::new(b"b", &limit, 1)], 20).await;
    assert_eq!((a, b), (10, 10), "local admissions after calls given up in flight (a, b)");
}

/// A call in flight (cost 3) while the remote refuses the others: the node admits 7 locally, and
/// once the call is answered and the debts paid, the remote counts the 10 exactly (an 11th is
/// refused there).
#[tokio::test]
async fn a_call_in_flight_during_local_decisions_counts_once() {
    let limit = Limit::per_hour(10).build().unwrap();
    let (door, node) = node();
    let node = Arc::new(node);
    door.held_cost.store(3, Ordering::SeqCst);
    door.closed.store(true, Ordering::SeqCst);
    let slow = {
        let (node, limit) = (node.clone(), limit.clone());
        tokio::spawn(async move { node.check(b"k", &limit, 3).await })
    };
    // The slow call reaches the door before the remote starts refusing.
    tokio::time::sleep(Duration::from_millis(20)).await;
    door.inner.set(Fault::Refuse);
    let local = admitted(&node, &[Check::new(b"k", &limit, 1)], 20).await;
    door.inner.set(Fault::None);
    door.closed.store(false, Ordering::SeqCst);
    let slow = tokio::time::timeout(Duration::from_secs(10), slow).await.unwrap().unwrap().unwrap();
    assert!(slow.allowed);
    assert_eq!(local, 7, "admitted locally while 3 were in flight");
    for _ in 0..500 {
        node.check(b"k", &limit, 0).await.unwrap();
        if node.stats().debts == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(node.stats().debts, 0);
    let remote = door.inner.inner().check(b"k", &limit, 0).await.unwrap();
    assert_eq!(remote.remaining, 0, "the remote counts 3 + 7: {remote:?}");
}

/// Script calls Redis ran since its stats were reset (`FCALL`, `EVALSHA`, `EVAL`).
fn script_calls(server: &tollgate_store::testkit::redis_server::RedisServer) -> u64 {
    let stats = server.cli(&["INFO", "commandstats"]);
    stats
        .lines()
        .filter(|l| ["cmdstat_fcall:", "cmdstat_evalsha:", "cmdstat_eval:"].iter().any(|p| l.starts_with(p)))
        .filter_map(|l| l.split("calls=").nth(1)?.split(',').next()?.parse::<u64>().ok())
        .sum()
}

/// Against a real Redis, frozen: five calls (cost 2 each) given up by their callers while Redis
/// is stopped, then Redis thawed. Each call Redis ran counts once (none is sent again), no reply
/// reaches another call (a key no call touched reads full), and the key admits exactly what is
/// left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_given_up_on_a_frozen_redis_count_once_and_shift_no_reply() {
    use tollgate_store::testkit::redis_server::RedisServer;
    use tollgate_store::{RedisOptions, RedisStore};
    let server = RedisServer::start();
    let limit = Limit::per_hour(20).build().unwrap();
    let options = RedisOptions { timeout: Duration::from_secs(5), ..RedisOptions::default() };
    let breaker = Breaker::new(u32::MAX, Duration::from_millis(100));
    let node = Fallback::with_options(
        RedisStore::open(&server.url(), options).unwrap(),
        FailurePolicy::Local,
        FallbackOptions { breaker, ..FallbackOptions::default() },
    );
    // Connected, the script loaded.
    assert!(node.check(b"warm", &limit, 1).await.unwrap().allowed);
    let _ = server.cli(&["CONFIG", "RESETSTAT"]);
    server.freeze();
    for _ in 0..5 {
        let given_up = tokio::time::timeout(Duration::from_millis(30), node.check(b"k", &limit, 2)).await;
        assert!(given_up.is_err(), "Redis is frozen: {given_up:?}");
    }
    server.thaw();
    let other = tokio::time::timeout(Duration::from_secs(10), node.check(b"other", &limit, 1)).await.unwrap().unwrap();
    assert_eq!((other.allowed, other.remaining), (true, 19), "a key no other call touched: {other:?}");
    // The calls given up that Redis ran (the one just made excluded).
    let ran = script_calls(&server) - 1;
    assert!(ran <= 5, "{ran} script calls for 5 calls given up");
    let mut admitted = 0;
    for _ in 0..40 {
        if !node.check(b"k", &limit, 1).await.unwrap().allowed {
            break;
        }
        admitted += 1;
    }
    assert_eq!(admitted, 20 - 2 * ran, "admitted after {ran} calls of cost 2 given up ran once each");
    assert_eq!(node.stats().fallbacks, 0, "{:?}", node.stats());
}
