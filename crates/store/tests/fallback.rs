//! The failure policy over a remote store whose calls fail on demand (a memory store behind
//! `testkit::faults`), deterministically: the local fallback continues from the state last seen,
//! counts calls still in flight, charges its admissions back, and the breaker stops the waiting.
//! The same properties against a real, paused or killed redis-server are in `tests/redis.rs`.

use std::sync::Arc;
use std::time::Duration;

use tollgate_store::fallback::FallbackOptions;
use tollgate_store::remote::{Charge, Remote, Reply};
use tollgate_store::testkit::faults::{Fault, Faulty};
use tollgate_store::{
    Breaker, Check, FailurePolicy, Fallback, Limit, ManualClock, MemoryStore, Refund, Reserved, Store, StoreError,
    all_allowed,
};

const SEC: u64 = 1_000_000_000;
const T0: u64 = 1_700_000_000 * SEC;

struct Node {
    store: Fallback<Arc<Faulty<MemoryStore>>>,
}

fn backend(clock: &Arc<ManualClock>) -> Arc<Faulty<MemoryStore>> {
    Arc::new(Faulty::new(MemoryStore::builder().clock(clock.clone()).build()))
}

fn node(remote: &Arc<Faulty<MemoryStore>>, clock: &Arc<ManualClock>, policy: FailurePolicy) -> Node {
    let options = FallbackOptions {
        clock: clock.clone(),
        breaker: Breaker::new(3, Duration::from_millis(100)),
        ..FallbackOptions::default()
    };
    Node { store: Fallback::with_options(remote.clone(), policy, options) }
}

impl Node {
    async fn admitted(&self, key: &[u8], limit: &Limit, calls: usize) -> usize {
        let mut admitted = 0;
        for _ in 0..calls {
            admitted += usize::from(self.store.check(key, limit, 1).await.unwrap().allowed);
        }
        admitted
    }
}

/// Waits (on tokio's paused clock) until the breaker has closed and the debts are paid.
async fn until_settled(node: &Node) {
    for _ in 0..1_000 {
        let stats = node.store.stats();
        if !stats.breaker_open && stats.debts == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("not settled: {:?}", node.store.stats());
}

fn hourly(burst: u64) -> Limit {
    Limit::per_hour(burst).burst(burst).build().unwrap()
}

#[tokio::test(start_paused = true)]
async fn the_local_fallback_continues_from_the_state_last_seen_and_charges_it_back() {
    let clock = Arc::new(ManualClock::new(T0));
    let remote = backend(&clock);
    let node = node(&remote, &clock, FailurePolicy::Local);
    let limit = hourly(10);
    assert_eq!(node.admitted(b"k", &limit, 7).await, 7);

    remote.set(Fault::Refuse);
    // The old fallback started from a full bucket here and admitted 10 more.
    assert_eq!(node.admitted(b"k", &limit, 10).await, 3, "only what the backend had left");
    assert!(node.store.stats().breaker_open);
    assert_eq!(node.store.stats().debts, 1);

    remote.set(Fault::None);
    until_settled(&node).await;
    let seen = remote.inner().check_sync(b"k", &limit, 0).unwrap();
    assert_eq!(seen.remaining, 0, "the 3 local admissions were charged to the backend");
    assert!(!node.store.check(b"k", &limit, 1).await.unwrap().allowed);
    assert_eq!(node.store.stats().charges_paid, 3);
}

/// Replies lost after the backend decided (a slow or paused backend) never add admissions: each
/// call is decided once, locally, and the backend's own admission of it only under-grants.
#[tokio::test(start_paused = true)]
async fn lost_replies_never_over_grant() {
    let clock = Arc::new(ManualClock::new(T0));
    let remote = backend(&clock);
    let node = node(&remote, &clock, FailurePolicy::Local);
    let limit = hourly(20);
    let mut admitted = 0;
    for i in 0..60u64 {
        // A deterministic mix: lost replies, refused calls, healthy calls.
        remote.set(match i * 7 % 5 {
            0 | 1 => Fault::LoseReply,
            2 => Fault::Refuse,
            _ => Fault::None,
        });
        if node.store.breakers().any_open() && i % 9 == 0 {
            remote.set(Fault::None);
            until_settled(&node).await;
        }
        admitted += usize::from(node.store.check(b"k", &limit, 1).await.unwrap().allowed);
    }
    remote.set(Fault::None);
    until_settled(&node).await;
    assert!(admitted <= 20, "{admitted} admitted under a limit of 20");
    let used = 20 - remote.inner().check_sync(b"k", &limit, 0).unwrap().remaining;
    assert_eq!(used, 20, "the backend counts at least what was admitted");
}

/// A remote whose calls wait at a gate until released: calls in flight.
struct Gated {
    inner: MemoryStore,
    gate: tokio::sync::Semaphore,
    fail: std::sync::atomic::AtomicBool,
}

impl Store for Gated {
    async fn reserve(&self, checks: &[Check<'_>]) -> Result<Reserved, StoreError> {
        let reply = self.decide(checks, &[]).await?;
        Ok(Reserved::at(reply.decisions, reply.now_ns))
    }

    async fn refund(&self, refunds: &[Refund<'_>]) -> Result<(), StoreError> {
        self.inner.refund(refunds).await
    }

    async fn reset(&self, scope: &str, key: &[u8], limit: &Limit) -> Result<(), StoreError> {
        self.inner.reset(scope, key, limit).await
    }
}

impl Remote for Gated {
    async fn decide(&self, checks: &[Check<'_>], charges: &[Charge<'_>]) -> Result<Reply, StoreError> {
        if self.fail.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(StoreError::Backend("down".into()));
        }
        // Each call uses up a permit: the test lets calls through one by one.
        self.gate.acquire().await.map_err(|e| StoreError::Backend(e.to_string()))?.forget();
        self.inner.decide(checks, charges).await
    }

    async fn probe(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

/// Calls still in flight may all be admitted by the backend: a local decision counts them.
#[tokio::test(start_paused = true)]
async fn calls_in_flight_count_against_local_decisions() {
    let clock = Arc::new(ManualClock::new(T0));
    let remote = Arc::new(Gated {
        inner: MemoryStore::builder().clock(clock.clone()).build(),
        gate: tokio::sync::Semaphore::new(0),
        fail: false.into(),
    });
    let options = FallbackOptions { clock: clock.clone(), ..FallbackOptions::default() };
    let store = Arc::new(Fallback::with_options(remote.clone(), FailurePolicy::Local, options));
    let limit = hourly(10);
    remote.gate.add_permits(5);
    for _ in 0..5 {
        assert!(store.check(b"k", &limit, 1).await.unwrap().allowed);
    }
    // Five calls in flight, stuck at the gate.
    let stuck: Vec<_> = (0..5)
        .map(|_| {
            let (store, limit) = (store.clone(), limit.clone());
            tokio::spawn(async move { store.check(b"k", &limit, 1).await.unwrap().allowed })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(remote.gate.available_permits(), 0);
    remote.fail.store(true, std::sync::atomic::Ordering::SeqCst);
    let local = (0..5).filter(|_| futures_ready(store.check_sync_local(&limit))).count();
    assert_eq!(local, 0, "the 5 left may all go to the calls in flight");
    remote.fail.store(false, std::sync::atomic::Ordering::SeqCst);
    remote.gate.add_permits(100);
    let mut admitted = 5;
    for task in stuck {
        admitted += usize::from(task.await.unwrap());
    }
    assert_eq!(admitted, 10);
}

trait LocalCheck {
    fn check_sync_local(&self, limit: &Limit) -> Result<bool, StoreError>;
}

impl LocalCheck for Arc<Fallback<Arc<Gated>>> {
    /// One call while the backend refuses: answered locally without waiting.
    fn check_sync_local(&self, limit: &Limit) -> Result<bool, StoreError> {
        let future = self.check(b"k", limit, 1);
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        match std::pin::pin!(future).poll(&mut cx) {
            std::task::Poll::Ready(decision) => Ok(decision?.allowed),
            std::task::Poll::Pending => Err(StoreError::Backend("the call waited".into())),
        }
    }
}

fn futures_ready(result: Result<bool, StoreError>) -> bool {
    result.expect("answered at once")
}

/// After the threshold, calls are answered without reaching the backend, and the backend is
/// used again once a probe gets through.
#[tokio::test(start_paused = true)]
async fn the_breaker_stops_calls_reaching_a_dead_backend_and_closes_when_it_answers() {
    let clock = Arc::new(ManualClock::new(T0));
    let remote = backend(&clock);
    let node = node(&remote, &clock, FailurePolicy::Closed);
    let limit = hourly(100);
    assert!(node.store.check(b"k", &limit, 1).await.unwrap().allowed);
    remote.set(Fault::LoseReply);
    for _ in 0..3 {
        assert!(!node.store.check(b"k", &limit, 1).await.unwrap().allowed, "closed: denied");
    }
    let reached = remote.reached();
    assert!(node.store.breakers().any_open());
    for _ in 0..100 {
        assert!(!node.store.check(b"k", &limit, 1).await.unwrap().allowed);
    }
    assert_eq!(remote.reached(), reached, "no call reached the backend while the breaker was open");
    assert_eq!(node.store.stats().fallbacks, 103);
    remote.set(Fault::None);
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(!node.store.breakers().any_open(), "a probe got through");
    assert!(node.store.check(b"k", &limit, 1).await.unwrap().allowed);
    assert_eq!(node.store.breakers().times_opened(), 1);
}

#[tokio::test(start_paused = true)]
async fn open_and_closed_policies_answer_every_call() {
    let clock = Arc::new(ManualClock::new(T0));
    for (policy, expected) in [(FailurePolicy::Open, 20), (FailurePolicy::Closed, 0)] {
        let remote = backend(&clock);
        let node = node(&remote, &clock, policy);
        remote.set(Fault::Refuse);
        assert_eq!(node.admitted(b"k", &hourly(5), 20).await, expected, "{policy:?}");
        assert_eq!(node.store.stats().debts, 0, "{policy:?} owes nothing");
    }
}

/// Two nodes, one backend, an outage: each node admits only what it last saw left, and once the
/// backend is back both debts are charged, so the key is denied until they are paid back.
#[tokio::test(start_paused = true)]
async fn two_nodes_over_an_outage_stay_within_twice_the_capacity_and_pay_it_back() {
    let clock = Arc::new(ManualClock::new(T0));
    let remote = backend(&clock);
    let (a, b) = (node(&remote, &clock, FailurePolicy::Local), node(&remote, &clock, FailurePolicy::Local));
    let limit = Limit::per_minute(10).build().unwrap();
    assert_eq!(a.admitted(b"k", &limit, 4).await, 4);
    assert_eq!(b.admitted(b"k", &limit, 2).await, 2, "b last saw 4 left");
    remote.set(Fault::Refuse);
    let during = a.admitted(b"k", &limit, 10).await + b.admitted(b"k", &limit, 10).await;
    assert_eq!(during, 6 + 4, "a saw 6 left, b saw 4 left");
    remote.set(Fault::None);
    until_settled(&a).await;
    until_settled(&b).await;
    let after = remote.inner().check_sync(b"k", &limit, 0).unwrap();
    assert_eq!(after.remaining, 0);
    // 16 admitted against a burst of 10: 6 in debt, paid back at one per 6 s.
    clock.advance(Duration::from_secs(6 * 6));
    assert!(!a.store.check(b"k", &limit, 1).await.unwrap().allowed, "still paying back");
    clock.advance(Duration::from_secs(6));
    assert!(a.store.check(b"k", &limit, 1).await.unwrap().allowed);
}

#[tokio::test(start_paused = true)]
async fn several_keys_fall_back_all_or_nothing() {
    let clock = Arc::new(ManualClock::new(T0));
    let remote = backend(&clock);
    let node = node(&remote, &clock, FailurePolicy::Local);
    let (small, large) = (hourly(2), hourly(100));
    let checks = [Check::new(b"{u}:a", &small, 1), Check::new(b"{u}:b", &large, 1)];
    assert!(all_allowed(&node.store.check_all(&checks).await.unwrap()));
    remote.set(Fault::Refuse);
    assert!(all_allowed(&node.store.check_all(&checks).await.unwrap()));
    assert!(!all_allowed(&node.store.check_all(&checks).await.unwrap()));
    remote.set(Fault::None);
    until_settled(&node).await;
    let b = remote.inner().check_sync(b"{u}:b", &large, 0).unwrap();
    assert_eq!(b.remaining, 98, "the denied call charged nothing to b");
}

/// A reservation decided locally is taken back from the debt; one decided by the backend is
/// refunded there.
#[tokio::test(start_paused = true)]
async fn refunds_reach_the_debt_or_the_backend() {
    let clock = Arc::new(ManualClock::new(T0));
    let remote = backend(&clock);
    let node = node(&remote, &clock, FailurePolicy::Local);
    let limit = hourly(10);
    let check = Check::new(b"k", &limit, 2);
    let reserved = node.store.reserve(&[check]).await.unwrap();
    node.store.refund(&[Refund { check, at: reserved.at, decision: reserved.decisions[0] }]).await.unwrap();
    assert_eq!(remote.inner().check_sync(b"k", &limit, 0).unwrap().remaining, 10, "refunded on the backend");

    remote.set(Fault::Refuse);
    let reserved = node.store.reserve(&[check]).await.unwrap();
    assert!(reserved.decisions[0].allowed);
    assert_eq!(node.store.stats().debts, 1);
    node.store.refund(&[Refund { check, at: reserved.at, decision: reserved.decisions[0] }]).await.unwrap();
    assert_eq!(node.store.stats().debts, 0, "taken back from the debt, nothing to charge");
}

/// A remote of several servers (a key's server: its first byte, or where `moved` sends that byte)
/// that fail, come back, or leave the topology on demand.
struct Zoned {
    inner: MemoryStore,
    failing: std::sync::Mutex<Vec<String>>,
    moved: std::sync::Mutex<Vec<(String, String)>>,
}

impl Zoned {
    fn zone(&self, key: &[u8]) -> String {
        let zone = String::from_utf8_lossy(&key[..1]).into_owned();
        let moved = self.moved.lock().unwrap();
        moved.iter().find(|(from, _)| *from == zone).map_or(zone, |(_, to)| to.clone())
    }

    fn fail(&self, zone: &str, failing: bool) {
        let mut zones = self.failing.lock().unwrap();
        zones.retain(|z| z != zone);
        if failing {
            zones.push(zone.to_string());
        }
    }
}

impl Store for Zoned {
    async fn reserve(&self, checks: &[Check<'_>]) -> Result<Reserved, StoreError> {
        let reply = self.decide(checks, &[]).await?;
        Ok(Reserved::at(reply.decisions, reply.now_ns))
    }

    async fn refund(&self, refunds: &[Refund<'_>]) -> Result<(), StoreError> {
        self.inner.refund(refunds).await
    }

    async fn reset(&self, scope: &str, key: &[u8], limit: &Limit) -> Result<(), StoreError> {
        self.inner.reset(scope, key, limit).await
    }
}

impl Remote for Zoned {
    async fn decide(&self, checks: &[Check<'_>], charges: &[Charge<'_>]) -> Result<Reply, StoreError> {
        let failing = self.failing.lock().unwrap().clone();
        if checks.iter().chain(charges.iter().map(|c| &c.check)).any(|c| failing.contains(&self.zone(c.key))) {
            return Err(StoreError::Backend("down".into()));
        }
        self.inner.decide(checks, charges).await
    }

    async fn probe(&self) -> Result<(), StoreError> {
        Ok(())
    }

    fn domain(&self, check: &Check<'_>) -> tollgate_store::Domain {
        self.zone(check.key).into()
    }

    async fn probe_domain(&self, domain: &tollgate_store::Domain) -> Result<bool, StoreError> {
        if self.moved.lock().unwrap().iter().any(|(from, _)| **from == **domain) {
            return Ok(false);
        }
        if self.failing.lock().unwrap().iter().any(|z| **z == **domain) {
            return Err(StoreError::Backend("down".into()));
        }
        Ok(true)
    }
}

/// Before: one breaker for the whole remote, so one failing server sent every server's keys to
/// the policy while it was open (under `closed`, denied).
#[tokio::test(start_paused = true)]
async fn one_failing_server_sends_only_its_own_keys_to_the_policy() {
    let clock = Arc::new(ManualClock::new(T0));
    let remote = Arc::new(Zoned {
        inner: MemoryStore::builder().clock(clock.clone()).build(),
        failing: Default::default(),
        moved: Default::default(),
    });
    let options = FallbackOptions {
        clock: clock.clone(),
        breaker: Breaker::new(3, Duration::from_millis(100)),
        ..FallbackOptions::default()
    };
    let store = Fallback::with_options(remote.clone(), FailurePolicy::Closed, options);
    let roomy = Limit::per_second(1_000_000).build().unwrap();
    let allowed = |key: &'static [u8]| {
        let (store, roomy) = (&store, &roomy);
        async move { store.check(key, roomy, 1).await.unwrap().allowed }
    };

    remote.fail("a", true);
    for round in 0..20 {
        assert!(!allowed(b"a1").await, "round {round}: server a is down (closed denies)");
        assert!(allowed(b"b1").await, "round {round}: server b's keys never meet a's breaker");
    }
    let states = store.breakers().states();
    assert_eq!(
        states.iter().map(|s| (&*s.domain, s.open, s.opened)).collect::<Vec<_>>(),
        [("a", true, 1), ("b", false, 0)]
    );
    assert_eq!(store.stats().fallbacks, 20, "only a's calls were the policy's");

    // a answers again: its probe closes its breaker.
    remote.fail("a", false);
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert!(allowed(b"a1").await && !store.breakers().any_open());

    // a fails, then a failover moves its keys to c: they are decided there at once, and a's
    // breaker is dropped once its probe finds a gone from the topology.
    remote.fail("a", true);
    for _ in 0..3 {
        assert!(!allowed(b"a1").await);
    }
    assert!(store.breakers().any_open());
    remote.moved.lock().unwrap().push(("a".into(), "c".into()));
    assert!(allowed(b"a1").await, "the keys moved to c, whose breaker is closed");
    tokio::time::sleep(Duration::from_millis(250)).await;
    let states = store.breakers().states();
    assert!(states.iter().all(|s| &*s.domain != "a" && !s.open), "{states:?}");
    assert_eq!(store.breakers().times_opened(), 2, "a's openings are still counted");
}

/// Gated's leases: a refill waits at the gate like any call, then debits all it wants or nothing.
impl tollgate_store::lease::Lessor for Gated {
    async fn lease(
        &self,
        check: Check<'_>,
        want: u64,
        _lessee: u64,
        _lifetime: Duration,
    ) -> Result<tollgate_store::lease::Grant, StoreError> {
        let want = want.clamp(1, check.limit.capacity());
        let reply = self.decide(&[Check { cost: want, ..check }], &[]).await?;
        let decision = reply.decisions[0];
        Ok(tollgate_store::lease::Grant {
            decision,
            granted: if decision.allowed { want } else { 0 },
            lessees: 1,
            snapshot: reply.snapshots[0],
            at: reply.now_ns,
        })
    }
}

/// Before: a lease refill in flight was not counted by the failure policy's ledger, so a request
/// decided locally meanwhile (Redis slow for it) could spend what the refill was about to take:
/// here 10 admitted locally, then the refill's 5 granted: 15 under a limit of 10.
#[tokio::test(start_paused = true)]
async fn a_lease_refill_in_flight_counts_against_local_decisions() {
    use tollgate_store::lease::Lessor;
    let clock = Arc::new(ManualClock::new(T0));
    let remote = Arc::new(Gated {
        inner: MemoryStore::builder().clock(clock.clone()).build(),
        gate: tokio::sync::Semaphore::new(0),
        fail: false.into(),
    });
    let options = FallbackOptions { clock: clock.clone(), ..FallbackOptions::default() };
    let store = Arc::new(Fallback::with_options(remote.clone(), FailurePolicy::Local, options));
    let limit = hourly(10);
    // Learn the key's state (nothing used yet).
    remote.gate.add_permits(1);
    assert!(store.check(b"k", &limit, 0).await.unwrap().allowed);
    // A refill of 5 units, stuck at the gate.
    let refill = {
        let (store, limit) = (store.clone(), limit.clone());
        tokio::spawn(async move { store.lease(Check::new(b"k", &limit, 1), 5, 7, Duration::from_millis(100)).await })
    };
    tokio::time::sleep(Duration::from_millis(1)).await;
    // Meanwhile Redis refuses the exact path: decided locally.
    remote.fail.store(true, std::sync::atomic::Ordering::SeqCst);
    let local = (0..10).filter(|_| futures_ready(store.check_sync_local(&limit))).count();
    remote.fail.store(false, std::sync::atomic::Ordering::SeqCst);
    remote.gate.add_permits(100);
    let granted = refill.await.unwrap().unwrap().granted;
    assert_eq!(granted, 5);
    assert!(local as u64 + granted <= 10, "{local} admitted locally + {granted} leased under a limit of 10");
    assert_eq!(local, 5, "the 5 the refill does not take");
}

/// A node whose breaker never opens: every call tries the backend (the faults decide).
fn patient_node(remote: &Arc<Faulty<MemoryStore>>, clock: &Arc<ManualClock>) -> Node {
    let options = FallbackOptions {
        clock: clock.clone(),
        breaker: Breaker::new(u32::MAX, Duration::from_millis(100)),
        ..FallbackOptions::default()
    };
    Node { store: Fallback::with_options(remote.clone(), FailurePolicy::Local, options) }
}

/// Before: a node's local admissions rode on every call for the key until one reply confirmed
/// them, so a call whose reply was lost after the backend applied them left them to be applied
/// again by the next: here 3 local admissions charged twice, the key denied 3 units too soon.
/// Now the backend applies each charge once (it keeps the node's highest sequence per key).
#[tokio::test(start_paused = true)]
async fn a_charge_sent_again_after_a_lost_reply_is_applied_once() {
    let clock = Arc::new(ManualClock::new(T0));
    let remote = backend(&clock);
    let node = patient_node(&remote, &clock);
    let limit = hourly(20);
    assert_eq!(node.admitted(b"k", &limit, 7).await, 7);
    remote.set(Fault::Refuse);
    assert_eq!(node.admitted(b"k", &limit, 3).await, 3, "decided locally: 3 owed");
    // The next call carries the 3 charges; the backend applies them and admits, the reply is lost
    // (and the call is decided locally again: a 4th charge).
    remote.set(Fault::LoseReply);
    assert_eq!(node.admitted(b"k", &limit, 1).await, 1);
    remote.set(Fault::None);
    assert_eq!(node.admitted(b"k", &limit, 1).await, 1, "carries the 4 charges again");
    until_settled(&node).await;
    // The node admitted 12; the backend also admitted the call whose reply was lost (an
    // under-grant of that one call, which no protocol can avoid): 13 counted, not 16.
    let used = 20 - remote.inner().check_sync(b"k", &limit, 0).unwrap().remaining;
    assert_eq!(used, 13, "each charge applied once");
}

/// Before: a backend that lost a key (restarted empty, a replica promoted without the last writes)
/// received the node's local admissions on a fresh key, and the node went on admitting from it:
/// 15 + 5 + 15 = 35 admitted under a limit of 20. Now the node's charges carry what it knew of the
/// key, and the backend is lowered to it first: 20 at most, for every algorithm.
#[tokio::test(start_paused = true)]
async fn a_backend_that_lost_the_key_is_given_back_what_the_node_knew() {
    for algorithm in tollgate_store::Algorithm::ALL {
        let clock = Arc::new(ManualClock::new(T0));
        let remote = backend(&clock);
        let node = patient_node(&remote, &clock);
        let limit = Limit::per_hour(20).algorithm(algorithm).build().unwrap();
        let mut admitted = node.admitted(b"k", &limit, 15).await;
        remote.set(Fault::Refuse);
        admitted += node.admitted(b"k", &limit, 10).await;
        assert_eq!(admitted, 20, "{algorithm}: 5 left, decided locally");
        remote.inner().lose_sync("", b"k", &limit);
        remote.set(Fault::None);
        admitted += node.admitted(b"k", &limit, 20).await;
        assert_eq!(admitted, 20, "{algorithm}: nothing more once the backend is back");
        until_settled(&node).await;
        assert_eq!(remote.inner().check_sync(b"k", &limit, 0).unwrap().remaining, 0, "{algorithm}");
    }
}

/// Before: past 64 local admissions of a key the oldest charges were merged at the later instant,
/// and a bucket's local rate halved in a long outage (GCRA: 255 admitted in a minute at 10/s where
/// the limit admits 609). Now pairs merge exactly where the algorithm allows: through a one-minute
/// outage at twice the rate, `local` admits exactly what the limit admits, for every algorithm.
#[tokio::test(start_paused = true)]
async fn a_long_outage_keeps_the_limits_rate() {
    for algorithm in tollgate_store::Algorithm::ALL {
        let clock = Arc::new(ManualClock::new(T0));
        let remote = backend(&clock);
        let node = node(&remote, &clock, FailurePolicy::Local);
        let reference = MemoryStore::builder().clock(clock.clone()).build();
        let limit = Limit::per_second(10).algorithm(algorithm).build().unwrap();
        remote.set(Fault::Refuse);
        let (mut local, mut exact) = (0, 0);
        for _ in 0..1_200 {
            local += node.admitted(b"k", &limit, 1).await;
            exact += usize::from(reference.check_sync(b"k", &limit, 1).unwrap().allowed);
            clock.advance(Duration::from_millis(50));
        }
        assert_eq!(local, exact, "{algorithm}: admitted locally through a minute's outage");
        assert!(node.store.fallbacks() >= 1_200);
    }
}

/// Found by the failure injection (a Redis Cluster primary killed, its replica promoted 2.4 s
/// later): a key at its limit, decided locally through the outage, had expired on Redis meanwhile
/// (its state was idle there, Redis knowing nothing of the local admissions); the node's charges,
/// replayed onto a fresh key at their dates, left it a near-full bucket, and it admitted a burst
/// (8 units over per key, every key of the killed primary). Now the charges carry what the node
/// knows of the key, charges included, and Redis is lowered to it: exactly the limit.
#[tokio::test(start_paused = true)]
async fn a_key_that_expired_during_the_outage_is_given_back_what_the_node_knew() {
    for algorithm in tollgate_store::Algorithm::ALL {
        let clock = Arc::new(ManualClock::new(T0));
        let remote = backend(&clock);
        let node = patient_node(&remote, &clock);
        let reference = MemoryStore::builder().clock(clock.clone()).build();
        let limit = Limit::per_second(10).algorithm(algorithm).build().unwrap();
        let (mut admitted, mut due) = (0, 0);
        for i in 0..80 {
            match i {
                20 => remote.set(Fault::Refuse),
                // Redis forgets the key (its state expired: idle as far as Redis knew), then answers.
                48 => {
                    remote.inner().lose_sync("", b"k", &limit);
                    remote.set(Fault::None);
                }
                _ => {}
            }
            for _ in 0..5 {
                admitted += node.admitted(b"k", &limit, 1).await;
                due += usize::from(reference.check_sync(b"k", &limit, 1).unwrap().allowed);
            }
            clock.advance(Duration::from_millis(100));
        }
        assert!(admitted <= due, "{algorithm}: {admitted} admitted where the limit admits {due}");
        // Stricter only where the window family cannot be given back exactly (the difference is
        // charged at now: it leaves later than the admissions it stands for).
        assert!(admitted * 10 >= due * 9, "{algorithm}: {admitted} admitted where the limit admits {due}");
    }
}

/// A random mix over every algorithm: calls refused, replies lost after Redis decided, Redis
/// restarted empty (the key lost, the call failing), time passing, with and without a breaker. Whatever
/// happens, the decisions a client got conform to the limit: replayed into an exact limiter at
/// the same instants, every admission is admitted again (the node never over-grants). And once
/// Redis is healthy and the debts are paid, the node decides exactly again.
#[tokio::test(start_paused = true)]
async fn random_faults_never_let_one_node_over_grant() {
    use tollgate_store::testkit::random::Rng;
    let mut rng = Rng(0x005e_ed0f_fa17);
    for round in 0..28 {
        let algorithm = tollgate_store::Algorithm::ALL[round % 7];
        let clock = Arc::new(ManualClock::new(T0));
        let remote = backend(&clock);
        let node =
            if round % 2 == 0 { patient_node(&remote, &clock) } else { node(&remote, &clock, FailurePolicy::Local) };
        let limit = Limit::per_second(10).algorithm(algorithm).build().unwrap();
        let mut admitted: Vec<(u64, u64)> = Vec::new();
        for _ in 0..300 {
            remote.set(match rng.below(10) {
                0..=1 => Fault::Refuse,
                2 => Fault::LoseReply,
                _ => Fault::None,
            });
            if rng.below(40) == 0 {
                // Redis restarts empty: the call in progress fails, the key is gone.
                remote.inner().lose_sync("", b"k", &limit);
                remote.set(Fault::Refuse);
            }
            let cost = if rng.below(5) == 0 { 1 + rng.below(3) } else { 1 };
            let decision = node.store.check(b"k", &limit, cost).await.unwrap();
            if decision.allowed {
                admitted.push((tollgate_store::Clock::now_ns(&*clock), cost));
            }
            clock.advance(Duration::from_nanos(rng.below(limit.emission_interval_ns() / 2)));
        }
        let replay_clock = Arc::new(ManualClock::new(T0));
        let exact = MemoryStore::builder().clock(replay_clock.clone()).build();
        for (i, &(at, cost)) in admitted.iter().enumerate() {
            replay_clock.set(at);
            let again = exact.check_sync(b"k", &limit, cost).unwrap();
            assert!(
                again.allowed,
                "{algorithm} round {round}: admission {i} of {} at +{} ms over the limit",
                admitted.len(),
                (at - T0) / 1_000_000
            );
        }
        // Healthy again, debts paid, the key idle: the node decides exactly, from a full limit.
        remote.set(Fault::None);
        until_settled(&node).await;
        clock.advance(Duration::from_secs(3));
        assert_eq!(node.admitted(b"k", &limit, 15).await, 10, "{algorithm} round {round}: after recovery");
    }
}

/// A window-family key after a twelve-second outage that Redis did not outlive (restarted without
/// the key): its charges and the node's view restore it, and the node decides after the outage
/// exactly as a limiter that saw every admission it made. (Written after the failure injection
/// showed `local` sub-window keys 15% under their rate for one second after recovery; this does
/// not reproduce it, which remains unexplained: see the issue note.)
#[tokio::test(start_paused = true)]
async fn after_an_outage_a_window_key_decides_as_an_exact_limiter() {
    for algorithm in [tollgate_store::Algorithm::SubWindow, tollgate_store::Algorithm::SlidingLog] {
        let clock = Arc::new(ManualClock::new(T0));
        let remote = backend(&clock);
        let node = patient_node(&remote, &clock);
        let mut builder = Limit::per_second(10).algorithm(algorithm);
        if algorithm == tollgate_store::Algorithm::SubWindow {
            builder = builder.slices(10);
        }
        let limit = builder.build().unwrap();
        // Charged with every admission the node made, at its instant.
        let exact = MemoryStore::builder().clock(clock.clone()).build();
        let (mut after, mut due) = (0, 0);
        for i in 0..320 {
            remote.set(if (20..260).contains(&i) { Fault::Refuse } else { Fault::None });
            if i == 259 {
                // Twelve seconds: Redis restarted without the key (expired meanwhile).
                remote.inner().lose_sync("", b"k", &limit);
            }
            for _ in 0..4 {
                let check = Check::new(b"k", &limit, 1);
                if i < 262 {
                    if node.store.check(b"k", &limit, 1).await.unwrap().allowed {
                        exact.decide(&[], &[Charge::new(check, 0)]).await.unwrap();
                    }
                } else {
                    after += usize::from(node.store.check(b"k", &limit, 1).await.unwrap().allowed);
                    due += usize::from(exact.check_sync(b"k", &limit, 1).unwrap().allowed);
                }
            }
            clock.advance(Duration::from_millis(50));
        }
        assert_eq!(after, due, "{algorithm}: admitted after the outage");
    }
}
