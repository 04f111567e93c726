//! The failure policy over a remote store whose calls fail on demand (a memory store behind
//! `testkit::faults`), deterministically: the local fallback continues from the state last seen,
//! counts calls still in flight, charges its admissions back, and the breaker stops the waiting.
//! The same properties against a real, paused or killed redis-server are in `tests/redis.rs`.

mod support;

use std::sync::Arc;
use std::time::Duration;

use support::{T0, backend, hourly, node, until_settled};
use tollgate_store::fallback::FallbackOptions;
use tollgate_store::remote::{Charge, Remote, Reply};
use tollgate_store::testkit::faults::Fault;
use tollgate_store::{
    Breaker, Check, FailurePolicy, Fallback, Limit, ManualClock, MemoryStore, Refund, Store, StoreError, all_allowed,
};

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

store_by_decide!(Gated);

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

store_by_decide!(Zoned);

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

/// A remote of two servers whose second fails every call that reaches it (may have run): a call
/// of several checks has its first decided by the first server, and fails part way.
struct SecondFails {
    inner: MemoryStore,
}

store_by_decide!(SecondFails);

impl Remote for SecondFails {
    async fn decide(&self, checks: &[Check<'_>], charges: &[Charge<'_>]) -> Result<Reply, StoreError> {
        if checks.len() < 2 {
            return self.inner.decide(checks, charges).await;
        }
        let reply = self.inner.decide(&checks[..1], charges).await?;
        Err(support::failed_after_first(checks, &reply))
    }

    async fn probe(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

/// Before: a request whose second server failed after the first admitted became the policy's
/// whole, the first server's admission kept: `local` charged it again as its own (the first key
/// counted twice), and a request denied (by `closed`, or by `local` for the second key) kept it.
/// Now the first server's admission stands if the policy admits, and is given back if it denies;
/// a first server that denied denies the request.
#[tokio::test(start_paused = true)]
async fn a_request_whose_second_server_fails_keeps_or_gives_back_what_the_first_admitted() {
    let (a, b) = (hourly(3), hourly(1));
    let checks = |cost| [Check::new(b"a", &a, cost), Check::new(b"b", &b, cost)];
    let used_a = |remote: &SecondFails| 3 - remote.inner.check_sync(b"a", &a, 0).unwrap().remaining;
    for policy in [FailurePolicy::Local, FailurePolicy::Closed, FailurePolicy::Open] {
        let clock = Arc::new(ManualClock::new(T0));
        let remote = Arc::new(SecondFails { inner: MemoryStore::builder().clock(clock.clone()).build() });
        let options = FallbackOptions { clock: clock.clone(), ..FallbackOptions::default() };
        let node = Fallback::with_options(remote.clone(), policy, options);
        let first = node.check_all(&checks(1)).await.unwrap();
        let admitted = policy != FailurePolicy::Closed;
        assert_eq!(all_allowed(&first), admitted, "{policy:?}");
        assert_eq!(used_a(&remote), u64::from(admitted), "{policy:?}: the first key counted once, or given back");
        let debts = node.stats().debts;
        assert_eq!(debts, usize::from(policy == FailurePolicy::Local), "{policy:?}: only the second key is owed");
        if policy == FailurePolicy::Local {
            // The second key's one unit is spent locally: denied, and the first's admission given back.
            assert!(!all_allowed(&node.check_all(&checks(1)).await.unwrap()));
            assert_eq!(used_a(&remote), 1, "given back");
            // The first server denies (its key spent): denied, nothing owed for the second key.
            remote.inner.check_sync(b"a", &a, 2).unwrap();
            assert!(!all_allowed(&node.check_all(&checks(1)).await.unwrap()));
            assert_eq!((used_a(&remote), node.stats().debts), (3, 1), "nothing more owed");
        }
    }
}

/// A charge past the limit made while the backend is down (a streamed LLM response said it cost
/// more tokens than its request reserved) is the node's to pay, as its local admissions are: kept
/// with them and charged to the backend once it is back, not dropped.
#[tokio::test(start_paused = true)]
async fn a_charge_made_while_the_backend_is_down_is_charged_back_to_it() {
    let clock = Arc::new(ManualClock::new(T0));
    let remote = backend(&clock);
    let node = node(&remote, &clock, FailurePolicy::Local);
    let limit = hourly(100);
    assert_eq!(node.admitted(b"k", &limit, 5).await, 5);
    remote.set(Fault::Refuse);
    assert_eq!(node.admitted(b"k", &limit, 5).await, 5, "admitted locally");
    let charged = node.store.charge(&[Check::new(b"k", &limit, 50)]).await;
    remote.set(Fault::None);
    until_settled(&node).await;
    let seen = remote.inner().check_sync(b"k", &limit, 0).unwrap();
    assert_eq!(
        seen.remaining, 40,
        "100 - 10 admitted - 50 charged during the outage; the charge answered {charged:?} and the backend has {} left",
        seen.remaining
    );
}
