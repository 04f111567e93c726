//! Every charge applied exactly once (ARCHITECTURE.md, principle 11), on the memory remote and on
//! real Redis: pending charges compacted after a lost reply or while a call carrying some of them
//! is in flight, a charge sent again long after its key was idle, and a request across Redis
//! Cluster servers one of which fails part way (what it admitted, and the charges it carried), a
//! lease or another call answering with charges applied that the node still owes, and a key whose
//! state Redis lost while keeping its marker.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tollgate_store::fallback::FallbackOptions;
use tollgate_store::lease::{Grant, Lessor};
use tollgate_store::remote::{Charge, Origin, Remote, Reply};
use tollgate_store::testkit::faults::{Fault, Faulty};
use tollgate_store::testkit::redis_server::RedisServer;
use tollgate_store::testkit::redis_topology::{ClusterConfig, RedisCluster};
use tollgate_store::{
    Algorithm, Breaker, Check, FailurePolicy, Fallback, Limit, ManualClock, MemoryStore, RedisOptions, RedisStore,
    Store, StoreError, TimeSource, all_allowed,
};

const SEC: u64 = 1_000_000_000;
const T0: u64 = 1_700_000_000 * SEC;

/// A fresh key prefix per store, so that stores sharing a server never meet.
fn options(time: TimeSource, timeout: Duration) -> RedisOptions {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    RedisOptions {
        prefix: format!("x{}", NEXT.fetch_add(1, Ordering::Relaxed)),
        time,
        timeout,
        ..RedisOptions::default()
    }
}

/// A `local` node whose breaker never opens (every call tries the remote: the faults decide).
fn patient<R: Remote>(remote: &Arc<Faulty<R>>, clock: &Arc<ManualClock>) -> Fallback<Arc<Faulty<R>>> {
    let breaker = Breaker::new(u32::MAX, Duration::from_millis(100));
    let options = FallbackOptions { clock: clock.clone(), breaker, ..FallbackOptions::default() };
    Fallback::with_options(remote.clone(), FailurePolicy::Local, options)
}

/// Peeks at `keys` until the node owes nothing (within 10 s): each call carries its key's debt,
/// and its reply confirms it.
async fn pay<R: Remote>(node: &Fallback<R>, keys: &[&[u8]], limit: &Limit) {
    for _ in 0..500 {
        for key in keys {
            node.check(key, limit, 0).await.unwrap();
        }
        if node.stats().debts == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("debts not paid: {:?}", node.stats());
}

/// Ten local admissions ride on a call that reaches the remote and loses its reply (the remote
/// applied them: its marker says 10), then 64 more admissions overflow the ledger's 64 charges per
/// key. Before: the oldest pairs merged, the ten with the 11th, whose sequence (11) is above the
/// marker: the remote applied all eleven again once it answered, 85 counted for 75 admissions.
async fn compacted_charges_after_a_lost_reply_count_once<R: Remote>(remote: Arc<Faulty<R>>, clock: &Arc<ManualClock>) {
    let node = patient(&remote, clock);
    let limit = Limit::per_hour(1_000).build().unwrap();
    let admit = async |n: usize| {
        for _ in 0..n {
            assert!(node.check(b"k", &limit, 1).await.unwrap().allowed);
        }
    };
    remote.set(Fault::Refuse);
    admit(10).await;
    // The remote applies the ten charges and admits the call itself; the node never hears of it
    // and admits the call locally (that one call counts twice: the documented cost of a lost reply).
    remote.set(Fault::LoseReply);
    admit(1).await;
    remote.set(Fault::Refuse);
    admit(63).await;
    remote.set(Fault::None);
    pay(&node, &[b"k"], &limit).await;
    let used = 1_000 - remote.inner().check(b"k", &limit, 0).await.unwrap().remaining;
    assert_eq!(used, 74 + 1, "74 local admissions and the lost reply's own admission, each once");
}

#[tokio::test]
async fn compacted_charges_after_a_lost_reply_count_once_on_the_memory_remote() {
    let clock = Arc::new(ManualClock::new(T0));
    let remote = Arc::new(Faulty::new(MemoryStore::builder().clock(clock.clone()).build()));
    compacted_charges_after_a_lost_reply_count_once(remote, &clock).await;
}

#[tokio::test]
async fn compacted_charges_after_a_lost_reply_count_once_on_redis() {
    let server = RedisServer::start();
    let clock = Arc::new(ManualClock::new(T0));
    let redis = RedisStore::open(&server.url(), options(TimeSource::Clock(clock.clone()), Duration::from_secs(2)));
    compacted_charges_after_a_lost_reply_count_once(Arc::new(Faulty::new(redis.unwrap())), &clock).await;
}

/// The bound of exactly-once: a node sends a charge under its identity for at most the resend
/// horizon (10 minutes) after it first sent it, which the remote outlives (it remembers 11
/// minutes). Charges applied by a call whose reply was lost, then unconfirmed 9 minutes on (every
/// call failing), count once when sent again; 10.5 minutes on, they are sent anew and count again
/// (an under-grant of those charges, never an over-grant), though the remote still remembers them.
#[tokio::test]
async fn charges_unconfirmed_past_the_resend_horizon_are_sent_anew() {
    for (minutes, counted) in [(9.0, 3 + 1 + 1), (10.5, 3 + 3 + 1 + 1)] {
        let clock = Arc::new(ManualClock::new(T0));
        let remote = Arc::new(Faulty::new(MemoryStore::builder().clock(clock.clone()).build()));
        let node = patient(&remote, &clock);
        // Counted in one window (a day's, hours from its end) whatever the minutes.
        let limit = Limit::per_day(1_000).algorithm(Algorithm::FixedWindow).build().unwrap();
        remote.set(Fault::Refuse);
        for _ in 0..3 {
            assert!(node.check(b"k", &limit, 1).await.unwrap().allowed);
        }
        // The three applied, and the call itself: the node admits it locally too (a fourth charge).
        remote.set(Fault::LoseReply);
        assert!(node.check(b"k", &limit, 1).await.unwrap().allowed);
        remote.set(Fault::Refuse);
        clock.advance(Duration::from_secs_f64(minutes * 60.0));
        remote.set(Fault::None);
        pay(&node, &[b"k"], &limit).await;
        let used = 1_000 - remote.inner().check(b"k", &limit, 0).await.unwrap().remaining;
        assert_eq!(used, counted, "{minutes} minutes on");
    }
}

/// Every algorithm: a node's charge applied, its key idle again (a second limit, the longest state
/// two windows), then busy again; the charge sent again (a lost reply's resend, dated as sent) is
/// recognised. Before: its marker lived only until the key was idle, and the charge, dated in a
/// window long over, landed in the live one: counted twice (remaining 6 where 9 is right).
async fn a_charge_sent_again_after_its_key_was_idle_counts_once<R: Remote>(store: &R, wait: impl AsyncFn(Duration)) {
    let limits: Vec<Limit> =
        Algorithm::ALL.iter().map(|&a| Limit::per_second(10).algorithm(a).build().unwrap()).collect();
    let charge =
        |limit| Charge { origin: Some(Origin { node: 5, total: 3 }), ..Charge::new(Check::new(b"late", limit, 3), 0) };
    let mut applied_at = Vec::new();
    for limit in &limits {
        let reply = store.decide(&[Check::new(b"late", limit, 0)], &[charge(limit)]).await.unwrap();
        assert_eq!(reply.decisions[0].remaining, 7, "{limit}");
        applied_at.push(reply.now_ns);
    }
    wait(Duration::from_millis(2_100)).await;
    for (limit, at) in limits.iter().zip(applied_at) {
        let admitted = store.decide(&[Check::new(b"late", limit, 1)], &[]).await.unwrap();
        assert_eq!(admitted.decisions[0].remaining, 9, "{limit}: idle again, then one admitted");
        let again = Charge { age_ns: admitted.now_ns - at, ..charge(limit) };
        let reply = store.decide(&[Check::new(b"late", limit, 0)], &[again]).await.unwrap();
        assert_eq!(reply.decisions[0].remaining, 9, "{limit}: the charge sent again was applied already");
    }
}

#[tokio::test]
async fn a_charge_sent_again_after_its_key_was_idle_counts_once_on_redis_and_memory() {
    let server = RedisServer::start();
    let redis = RedisStore::open(&server.url(), options(TimeSource::Server, Duration::from_secs(2))).unwrap();
    a_charge_sent_again_after_its_key_was_idle_counts_once(&redis, async |d| tokio::time::sleep(d).await).await;
    let clock = Arc::new(ManualClock::new(T0));
    let memory = MemoryStore::builder().clock(clock.clone()).build();
    a_charge_sent_again_after_its_key_was_idle_counts_once(&memory, async |d| clock.advance(d)).await;
}

/// Two keys on two primaries of a real cluster, checked together (one request): the first's
/// server admits, the second's is frozen (its call times out; the server is then killed, so the
/// call never runs) and restarted. Before: the first key's admission stayed on Redis whatever
/// the outcome, so a plain store's error and `closed`'s denial consumed it (9 left of 10), and
/// `local` charged it again as debt (8 left). Now: all or nothing, each key counted once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_across_servers_one_of_which_fails_is_all_or_nothing() {
    // A node frozen for seconds is not declared failed meanwhile (the cluster stays up).
    let config = ClusterConfig { node_timeout_ms: 20_000, ..ClusterConfig::default() };
    let mut cluster = tokio::task::spawn_blocking(move || RedisCluster::start_with(config)).await.unwrap();
    let base = RedisStore::open_cluster(&cluster.urls(), options(TimeSource::Server, Duration::from_millis(500)))
        .await
        .unwrap();
    let limit = Limit::per_hour(10).build().unwrap();
    let node_of = |key: &[u8]| {
        let state = base.state_key("", key, &limit).unwrap();
        cluster.primary_of(cluster.slot_of(&state)).unwrap()
    };
    // The first key's server answers, the second's freezes.
    let first = b"first".as_slice();
    let second = (0..100).map(|i| format!("second{i}")).find(|k| node_of(k.as_bytes()) != node_of(first)).unwrap();
    let second = second.as_bytes();
    let frozen = node_of(second);
    let checks = [Check::new(first, &limit, 1), Check::new(second, &limit, 1)];
    let fallback = |policy| {
        let store = base.with_options(options(TimeSource::Server, Duration::from_millis(500))).unwrap();
        let breaker = Breaker::new(u32::MAX, Duration::from_millis(100));
        let options = FallbackOptions { breaker, ..FallbackOptions::default() };
        Fallback::with_options(store, policy, options)
    };
    let (plain, closed, local) = (
        base.with_options(options(TimeSource::Server, Duration::from_millis(500))).unwrap(),
        fallback(FailurePolicy::Closed),
        fallback(FailurePolicy::Local),
    );
    // Every server known and connected before the freeze.
    for store in [&plain, closed.inner(), local.inner()] {
        store.check_all(&[Check::new(first, &limit, 0), Check::new(second, &limit, 0)]).await.unwrap();
    }

    cluster.nodes()[frozen].freeze();
    let (plain_result, closed_result, local_result) =
        tokio::join!(plain.check_all(&checks), closed.check_all(&checks), local.check_all(&checks));
    cluster.nodes_mut()[frozen].kill();
    cluster.nodes_mut()[frozen].restart();
    let cluster = tokio::task::spawn_blocking(move || {
        cluster.wait_healthy(Duration::from_secs(30));
        cluster
    })
    .await
    .unwrap();

    assert!(plain_result.is_err(), "{plain_result:?}");
    assert!(closed_result.unwrap().iter().all(|d| !d.allowed), "closed denies");
    assert!(local_result.unwrap().iter().all(|d| d.allowed), "local admits");
    pay(&local, &[first, second], &limit).await;
    let left = async |store: &RedisStore| {
        let mut left = Vec::new();
        for key in [first, second] {
            left.push(store.check(key, &limit, 0).await.unwrap().remaining);
        }
        left
    };
    assert_eq!(left(&plain).await, [10, 10], "a plain store's failed request consumed nothing");
    assert_eq!(left(closed.inner()).await, [10, 10], "closed's denied request consumed nothing");
    assert_eq!(left(local.inner()).await, [9, 9], "local's admitted request counted once on each key");
    drop(cluster);
}

/// A remote of two servers: the first check's key on the first, every other on the second, which
/// fails every call of several checks that reaches it (the first server's answer stands: its
/// key's charges were applied).
struct FirstAnswers {
    inner: MemoryStore,
}

store_by_decide!(FirstAnswers);

impl Remote for FirstAnswers {
    async fn decide(&self, checks: &[Check<'_>], charges: &[Charge<'_>]) -> Result<Reply, StoreError> {
        if checks.len() < 2 {
            return self.inner.decide(checks, charges).await;
        }
        let first: Vec<Charge<'_>> = charges.iter().filter(|c| c.check.key == checks[0].key).copied().collect();
        let reply = self.inner.decide(&checks[..1], &first).await?;
        Err(support::failed_after_first(checks, &reply))
    }

    async fn probe(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

/// A request across two servers, the second failing: the first server's key `b` owes one local
/// admission, which rides on the call and is applied there with the request's own unit (2 used).
/// Before: the node kept that server's snapshot (2 used) but not that the charge was paid, so the
/// next call told the remote the key had 3 used (the snapshot and the charge again), and the remote
/// lowered it to that: the local admission counted twice.
#[tokio::test]
async fn charges_applied_by_a_server_that_answered_a_request_failing_elsewhere_count_once() {
    let clock = Arc::new(ManualClock::new(T0));
    let remote = Arc::new(FirstAnswers { inner: MemoryStore::builder().clock(clock.clone()).build() });
    let breaker = Breaker::new(u32::MAX, Duration::from_millis(100));
    let options = FallbackOptions { clock: clock.clone(), breaker, ..FallbackOptions::default() };
    let node = Fallback::with_options(remote.clone(), FailurePolicy::Local, options);
    let limit = Limit::per_hour(10).build().unwrap();
    let (a, b) = (b"a".as_slice(), b"b".as_slice());
    // `a` on the server that answers, `b` admitted locally: one unit owed.
    assert!(all_allowed(&node.check_all(&[Check::new(a, &limit, 1), Check::new(b, &limit, 1)]).await.unwrap()));
    // `b`'s server answers (its charge and its unit applied), `a`'s fails (admitted locally).
    assert!(all_allowed(&node.check_all(&[Check::new(b, &limit, 1), Check::new(a, &limit, 1)]).await.unwrap()));
    pay(&node, &[a, b], &limit).await;
    for key in [a, b] {
        let used = 10 - remote.inner.check(key, &limit, 0).await.unwrap().remaining;
        assert_eq!(used, 2, "{}: one unit decided there, one locally", String::from_utf8_lossy(key));
    }
}

/// A memory remote whose calls of one check (the background flush's, the test's own) are refused
/// on demand, whose calls run and lose their reply on demand, and whose next call of several checks
/// can be held at its door until released (a slow call, which then runs and answers). It lends as
/// Redis does: a lease is a call of its own, with no charges.
struct Held {
    inner: MemoryStore,
    refuse: AtomicBool,
    lose: AtomicBool,
    hold: AtomicBool,
    arrived: tokio::sync::Notify,
    release: tokio::sync::Notify,
}

impl Held {
    fn new(clock: &Arc<ManualClock>) -> Self {
        Held {
            inner: MemoryStore::builder().clock(clock.clone()).build(),
            refuse: AtomicBool::new(false),
            lose: AtomicBool::new(false),
            hold: AtomicBool::new(false),
            arrived: tokio::sync::Notify::new(),
            release: tokio::sync::Notify::new(),
        }
    }
}

store_by_decide!(Held);

impl Remote for Held {
    async fn decide(&self, checks: &[Check<'_>], charges: &[Charge<'_>]) -> Result<Reply, StoreError> {
        if checks.len() > 1 && self.hold.swap(false, Ordering::SeqCst) {
            self.arrived.notify_one();
            self.release.notified().await;
        } else if checks.len() == 1 && self.refuse.load(Ordering::SeqCst) {
            return Err(StoreError::Backend("refused".into()));
        }
        let reply = self.inner.decide(checks, charges).await;
        if self.lose.load(Ordering::SeqCst) {
            return Err(StoreError::Timeout(Duration::from_millis(50)));
        }
        reply
    }

    async fn probe(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

impl Lessor for Held {
    async fn lease(&self, check: Check<'_>, want: u64, _lessee: u64, _lifetime: Duration) -> Result<Grant, StoreError> {
        let reply = self.decide(&[Check { cost: want, ..check }], &[]).await?;
        let decision = reply.decisions[0];
        let granted = if decision.allowed { want } else { 0 };
        Ok(Grant { decision, granted, lessees: 1, snapshot: reply.snapshots[0], at: reply.now_ns })
    }
}

/// Five local admissions ride on a slow call; meanwhile 64 more overflow the ledger's 64 charges
/// per key, and the oldest pairs merge: the five with the sixth. The slow call then answers (the
/// five applied). Before: the merged charge survived the reply whole (its sequence is the sixth's),
/// so the node's view of the key counted the five twice (the snapshot, and the merged charge), and
/// the next call lowered the remote's key to that view: 74 counted for 69 admissions.
#[tokio::test]
async fn charges_merged_while_a_call_carrying_some_of_them_is_in_flight_count_once() {
    let clock = Arc::new(ManualClock::new(T0));
    let remote = Arc::new(Held::new(&clock));
    remote.refuse.store(true, Ordering::SeqCst);
    let breaker = Breaker::new(u32::MAX, Duration::from_millis(100));
    let options = FallbackOptions { clock: clock.clone(), breaker, ..FallbackOptions::default() };
    let node = Fallback::with_options(remote.clone(), FailurePolicy::Local, options);
    let limit = Limit::per_hour(1_000).build().unwrap();
    let admit = async |n: usize| {
        for _ in 0..n {
            assert!(node.check(b"k", &limit, 1).await.unwrap().allowed);
        }
    };
    admit(5).await;
    remote.hold.store(true, Ordering::SeqCst);
    let slow = {
        let (node, limit) = (node.clone(), limit.clone());
        tokio::spawn(async move { node.check_all(&[Check::new(b"k", &limit, 0), Check::new(b"j", &limit, 0)]).await })
    };
    remote.arrived.notified().await;
    admit(64).await;
    remote.release.notify_one();
    assert!(all_allowed(&slow.await.unwrap().unwrap()));
    assert_eq!(1_000 - remote.inner.check(b"k", &limit, 0).await.unwrap().remaining, 5, "the slow call's five");
    remote.refuse.store(false, Ordering::SeqCst);
    pay(&node, &[b"k"], &limit).await;
    let used = 1_000 - remote.inner.check(b"k", &limit, 0).await.unwrap().remaining;
    assert_eq!(used, 69, "69 local admissions, each once");
}

/// Five local admissions ride on a call that runs and loses its reply; then a lease (a call of its
/// own, without the charges) debits three and answers the key's state, which holds the five.
/// Before: the node kept that state and the five as still owed, and the next call told the remote
/// the key had 13 used (the state and the five again), and the remote lowered it to that.
#[tokio::test]
async fn charges_a_lease_finds_applied_count_once() {
    let clock = Arc::new(ManualClock::new(T0));
    let remote = Arc::new(Held::new(&clock));
    let breaker = Breaker::new(u32::MAX, Duration::from_millis(100));
    let options = FallbackOptions { clock: clock.clone(), breaker, ..FallbackOptions::default() };
    let node = Fallback::with_options(remote.clone(), FailurePolicy::Local, options);
    let limit = Limit::per_hour(100).build().unwrap();
    remote.refuse.store(true, Ordering::SeqCst);
    for _ in 0..5 {
        assert!(node.check(b"k", &limit, 1).await.unwrap().allowed);
    }
    remote.refuse.store(false, Ordering::SeqCst);
    remote.lose.store(true, Ordering::SeqCst);
    assert!(node.check(b"k", &limit, 0).await.unwrap().allowed);
    remote.lose.store(false, Ordering::SeqCst);
    let grant = node.lease(Check::new(b"k", &limit, 1), 3, 7, Duration::from_millis(100)).await.unwrap();
    assert_eq!(grant.granted, 3);
    pay(&node, &[b"k"], &limit).await;
    let used = 100 - remote.inner.check(b"k", &limit, 0).await.unwrap().remaining;
    assert_eq!(used, 5 + 3, "five local admissions and the lease's three, each once");
}

/// A slow call carries five local admissions; two more follow, and a second call carries all seven,
/// overtakes the slow one (it runs first, and loses its reply); the slow one then answers with the
/// key's state, which holds the seven, and confirms its five. Before: the node kept that state and
/// the two as still owed, and the next call lowered the remote's key by the two once more (9 used).
#[tokio::test]
async fn charges_of_a_call_overtaken_by_another_count_once() {
    let clock = Arc::new(ManualClock::new(T0));
    let remote = Arc::new(Held::new(&clock));
    let breaker = Breaker::new(u32::MAX, Duration::from_millis(100));
    let options = FallbackOptions { clock: clock.clone(), breaker, ..FallbackOptions::default() };
    let node = Fallback::with_options(remote.clone(), FailurePolicy::Local, options);
    let limit = Limit::per_hour(100).build().unwrap();
    let admit = async |n: usize| {
        for _ in 0..n {
            assert!(node.check(b"k", &limit, 1).await.unwrap().allowed);
        }
    };
    remote.refuse.store(true, Ordering::SeqCst);
    admit(5).await;
    remote.hold.store(true, Ordering::SeqCst);
    let slow = {
        let (node, limit) = (node.clone(), limit.clone());
        tokio::spawn(async move { node.check_all(&[Check::new(b"k", &limit, 0), Check::new(b"j", &limit, 0)]).await })
    };
    remote.arrived.notified().await;
    admit(2).await;
    remote.lose.store(true, Ordering::SeqCst);
    assert!(all_allowed(&node.check_all(&[Check::new(b"k", &limit, 0), Check::new(b"i", &limit, 0)]).await.unwrap()));
    remote.lose.store(false, Ordering::SeqCst);
    assert_eq!(100 - remote.inner.check(b"k", &limit, 0).await.unwrap().remaining, 7, "the second call's seven");
    remote.release.notify_one();
    assert!(all_allowed(&slow.await.unwrap().unwrap()));
    remote.refuse.store(false, Ordering::SeqCst);
    pay(&node, &[b"k"], &limit).await;
    let used = 100 - remote.inner.check(b"k", &limit, 0).await.unwrap().remaining;
    assert_eq!(used, 7, "seven local admissions, each once");
}

/// Redis loses a key's state but keeps its marker (the state evicted alone): the node's charges,
/// which a call whose reply was lost applied, are recognised when sent again (not applied twice),
/// and what the node knew of the key is given back: the key is as the node left it (3 decided by
/// Redis, 5 locally).
#[tokio::test]
async fn a_key_lost_without_its_marker_gets_back_what_the_node_knew_once() {
    let server = RedisServer::start();
    let clock = Arc::new(ManualClock::new(T0));
    let redis = RedisStore::open(&server.url(), options(TimeSource::Clock(clock.clone()), Duration::from_secs(2)));
    let redis = redis.unwrap();
    let limit = Limit::per_hour(100).build().unwrap();
    let state = String::from_utf8(redis.state_key("", b"k", &limit).unwrap()).unwrap();
    let remote = Arc::new(Faulty::new(redis));
    let node = patient(&remote, &clock);
    remote.set(Fault::None);
    for _ in 0..3 {
        assert!(node.check(b"k", &limit, 1).await.unwrap().allowed);
    }
    remote.set(Fault::Refuse);
    for _ in 0..5 {
        assert!(node.check(b"k", &limit, 1).await.unwrap().allowed);
    }
    remote.set(Fault::LoseReply);
    assert!(node.check(b"k", &limit, 0).await.unwrap().allowed);
    assert_eq!(server.cli(&["DEL", &state]).trim(), "1", "the state, not its marker");
    remote.set(Fault::None);
    pay(&node, &[b"k"], &limit).await;
    assert_eq!(100 - remote.inner().check(b"k", &limit, 0).await.unwrap().remaining, 8);
}
