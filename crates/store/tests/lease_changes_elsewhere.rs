//! Review of f5e22b8 (refusals while a leased key's refill is in flight), on a real
//! `redis-server`, the node's book driven by hand on a manual clock (as `lease_deny.rs` does).
//! What docs/redis.md ("Denials exact", "Refusals while a refill is in flight") promises of a
//! change made elsewhere, which no node can learn of without a call:
//!
//! - a reset or a refund made on another node is seen once the first lease call sent after it is
//!   answered, and never more than a lifetime after the call the node answers from (the review
//!   found refusals outliving `min(retry_after, lifetime)`, the bound before refusals while a
//!   refill is in flight; the docs now state the longer bound, and these tests hold it);
//! - an admission under another caller's limit of the same key (ad-hoc limits share state per
//!   algorithm and key; a rolling reload) is such a change too: it may free capacity in this
//!   node's terms, and is seen within the same bound;
//! - a waiting request whose future is dropped no longer counts before a newcomer.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tollgate_store::lease::{Book, Grant, LeaseMode, LeaseOptions, Leased, Lessor, Order, Spend, leasable};
use tollgate_store::testkit::redis_server::RedisServer;
use tollgate_store::{
    Algorithm, Check, Clock, Limit, ManualClock, RedisOptions, RedisStore, Refund, Reserved, Store, StoreError,
    TimeSource,
};

const MS: u64 = 1_000_000;
const SEC: u64 = 1_000 * MS;
const T0: u64 = 1_700_000_000 * SEC;
/// The lease lifetime (100 ms, the default).
const LIFETIME: Duration = Duration::from_millis(100);
/// The same in ns.
const LIFETIME_NS: u64 = 100 * MS;

fn redis(server: &RedisServer, clock: &Arc<ManualClock>, prefix: &str) -> RedisStore {
    let options = RedisOptions {
        prefix: prefix.into(),
        time: TimeSource::Clock(clock.clone()),
        timeout: Duration::from_secs(2),
        clock_skew_margin: Duration::from_secs(60),
        module: false,
    };
    RedisStore::open(&server.url(), options).unwrap()
}

fn fresh_prefix() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("r{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

fn book() -> Book {
    Book::new(LeaseOptions { mode: LeaseMode::Always, lifetime: LIFETIME, lessee: 1, ..LeaseOptions::default() })
}

/// Sends `order` on the node's connection and records the reply at the same instant (a lease
/// call without a round trip).
async fn answer(book: &Book, node: &RedisStore, clock: &ManualClock, order: Order) {
    let options = book.options();
    let grant = node.lease(order.check(), order.want, options.lessee, options.lifetime).await;
    book.granted(order, grant, clock.now_ns());
}

/// The node's first request of the key, drained by another node: exact (refused), and the lease
/// it starts is refused too. Returns the node's instant of that refusal.
async fn lease_refused(book: &Book, node: &RedisStore, clock: &ManualClock, check: &Check<'_>) -> u64 {
    let now = clock.now_ns();
    assert!(matches!(book.spend(check, now, false), Spend::Exact { order: None }));
    let order = book.observe_exact(check, now).expect("leased at once");
    assert!(!node.reserve(std::slice::from_ref(check)).await.unwrap().decisions[0].allowed);
    answer(book, node, clock, order).await;
    assert_eq!(book.stats().grants, 1);
    now
}

/// A reset or a refund made on another node after the node's lease was refused: once the refusal's
/// `retry_after` has passed, the node's next request starts a refill and waits for it (a slow
/// lease call); newcomers meanwhile may be refused from the state before the reset (no node can
/// know of it before a call returns), but none is refused where Redis admits it once that refill
/// is answered, nor more than a lifetime after the refused lease call when it never is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_or_refund_on_another_node_is_seen_when_the_refill_after_it_is_answered() {
    let server = RedisServer::start();
    let mut failures = Vec::new();
    for algorithm in [Algorithm::Gcra, Algorithm::TokenBucket, Algorithm::LeakyBucket] {
        for (refund, answered_after) in [(false, Some(10 * MS)), (true, Some(30 * MS)), (false, None), (true, None)] {
            let limit = Limit::per_second(1_000).algorithm(algorithm).build().unwrap();
            let clock = Arc::new(ManualClock::new(T0 + 1_234 * MS));
            let prefix = fresh_prefix();
            let (node, other) = (redis(&server, &clock, &prefix), redis(&server, &clock, &prefix));
            let book = book();
            let drain = Check::new(b"hot", &limit, limit.capacity());
            let drained = other.reserve(&[drain]).await.unwrap();
            assert!(drained.decisions[0].allowed);
            let unit = Check::new(b"hot", &limit, 1);
            let refused_at = lease_refused(&book, &node, &clock, &unit).await;
            // The other node frees the key.
            if refund {
                let refund = Refund { check: drain, at: drained.at, decision: drained.decisions[0] };
                other.refund(&[refund]).await.unwrap();
            } else {
                other.reset("", b"hot", &limit).await.unwrap();
            }
            let peek = other.check(b"hot", &limit, 0).await.unwrap();
            assert!(peek.remaining >= 2, "{algorithm}: the key was freed: {peek:?}");
            // Until the local refusal ends (the state before the reset frees a unit), and a
            // quarter of an interval past it: the node's request starts a refill and waits.
            let (order, first) = loop {
                clock.advance(Duration::from_nanos(limit.emission_interval_ns() / 4));
                match book.spend(&unit, clock.now_ns(), false) {
                    Spend::Local { decision, .. } if !decision.allowed => {}
                    Spend::Wait { order: Some(order), refill } => break (order, refill),
                    other => panic!("{algorithm}: {other:?}"),
                }
            };
            // Newcomers every third of an interval, to past the lifetime; the refill (sent after
            // the change) answered at `answered_after`, or never (a lease call that hangs).
            let mut order = Some(order);
            let mut waiting = vec![first];
            let (mut stale_in_flight, mut broken) = (0u64, Vec::new());
            while clock.now_ns() - refused_at < LIFETIME_NS + 50 * MS {
                clock.advance(Duration::from_nanos(limit.emission_interval_ns() / 3));
                let since = clock.now_ns() - refused_at;
                if answered_after.is_some_and(|after| since >= after)
                    && let Some(order) = order.take()
                {
                    answer(&book, &node, &clock, order).await;
                    waiting.clear();
                }
                let decision = match book.spend(&unit, clock.now_ns(), false) {
                    Spend::Local { decision, .. } => decision,
                    // Waits for the refill in flight, counted until it ends.
                    Spend::Wait { order: None, refill } => {
                        waiting.push(refill);
                        continue;
                    }
                    // A call of its own (not sent here: the node is driven by hand).
                    Spend::Wait { .. } | Spend::Exact { .. } => continue,
                };
                if decision.allowed {
                    continue;
                }
                // A peek (cost 0) changes nothing: Redis admits the waiting requests and this one
                // at this instant if it has that many units left.
                let redis_says = other.check(b"hot", &limit, 0).await.unwrap();
                if redis_says.remaining < waiting.len() as u64 + 1 {
                    continue;
                }
                if order.is_some() && since <= LIFETIME_NS {
                    stale_in_flight += 1;
                } else {
                    broken.push(format!(
                        "at {:.2} ms ({}): {decision:?}, where Redis has {} left",
                        since as f64 / MS as f64,
                        if order.is_some() {
                            "the refill unanswered, past the lifetime"
                        } else {
                            "the refill answered"
                        },
                        redis_says.remaining
                    ));
                }
            }
            if !broken.is_empty() {
                failures.push(format!(
                    "{algorithm}, {}, refill answered after {answered_after:?} ns: {} refused locally where Redis \
                     admits them ({stale_in_flight} more while the refill was in flight, as documented); first {}",
                    if refund { "refund" } else { "reset" },
                    broken.len(),
                    broken[0],
                ));
            }
            drop(waiting);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The key drained under a slow limit; the node's lease of it refused; then another caller of the
/// same key under a faster limit (an ad-hoc `CL.THROTTLE` with other parameters, or a node that
/// already reloaded a raised limit) is admitted, which rewrites the key in its rate: read under the
/// slow limit it frees sooner. The node's next request, a few ms later, may be refused locally
/// where Redis admits it (a change made elsewhere, seen with the next lease call: docs/redis.md),
/// but never once the lifetime of the refused lease call has passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admission_under_a_faster_limit_elsewhere_is_seen_within_the_lifetime() {
    let server = RedisServer::start();
    let mut failures = Vec::new();
    let mut compared = 0;
    for algorithm in Algorithm::ALL.into_iter().filter(|&a| leasable(a)) {
        let slow = Limit::per_minute(10).algorithm(algorithm).build().unwrap();
        let fast = Limit::per_second(1_000).algorithm(algorithm).build().unwrap();
        let clock = Arc::new(ManualClock::new(T0 + 1_234 * MS));
        let prefix = fresh_prefix();
        let (node, other) = (redis(&server, &clock, &prefix), redis(&server, &clock, &prefix));
        let book = book();
        assert!(other.reserve(&[Check::new(b"hot", &slow, slow.capacity())]).await.unwrap().decisions[0].allowed);
        let unit = Check::new(b"hot", &slow, 1);
        lease_refused(&book, &node, &clock, &unit).await;
        let admitted = other.reserve(&[Check::new(b"hot", &fast, 1)]).await.unwrap().decisions[0];
        if !admitted.allowed {
            failures.push(format!("{algorithm}: the fast limit refused ({admitted:?}): nothing to compare"));
            continue;
        }
        clock.advance(LIFETIME + Duration::from_millis(1));
        let local = book.spend(&unit, clock.now_ns(), false);
        let Spend::Local { decision, .. } = local else { continue };
        if decision.allowed {
            continue;
        }
        compared += 1;
        let redis_says = other.check(b"hot", &slow, 1).await.unwrap();
        if redis_says.allowed {
            failures.push(format!("{algorithm}: refused locally {decision:?}; Redis admits it: {redis_says:?}"));
        }
    }
    assert!(failures.is_empty(), "{compared} local refusals compared:\n{}", failures.join("\n"));
}

/// A request waiting for the refill in flight, dropped (its client went away): a newcomer that
/// the state admits once the dropped one no longer counts waits for the refill, it is not refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_waiting_request_no_longer_counts_before_a_newcomer() {
    let server = RedisServer::start();
    for algorithm in Algorithm::ALL.into_iter().filter(|&a| leasable(a) && a.is_bucket()) {
        let limit = Limit::per_second(1_000).algorithm(algorithm).build().unwrap();
        let clock = Arc::new(ManualClock::new(T0 + 1_234 * MS));
        let prefix = fresh_prefix();
        let (node, other) = (redis(&server, &clock, &prefix), redis(&server, &clock, &prefix));
        let book = book();
        assert!(other.reserve(&[Check::new(b"hot", &limit, limit.capacity())]).await.unwrap().decisions[0].allowed);
        let unit = Check::new(b"hot", &limit, 1);
        lease_refused(&book, &node, &clock, &unit).await;
        let (_order, waiting) = loop {
            clock.advance(Duration::from_nanos(limit.emission_interval_ns() / 4));
            match book.spend(&unit, clock.now_ns(), false) {
                Spend::Local { decision, .. } if !decision.allowed => {}
                Spend::Wait { order: Some(order), refill } => break (order, refill),
                other => panic!("{algorithm}: {other:?}"),
            }
        };
        // With it waiting, a newcomer is refused (the state frees one unit, which it takes).
        let before = book.spend(&unit, clock.now_ns(), false);
        assert!(matches!(&before, Spend::Local { decision, .. } if !decision.allowed), "{algorithm}: {before:?}");
        drop(waiting);
        let after = book.spend(&unit, clock.now_ns(), false);
        assert!(
            matches!(after, Spend::Wait { order: None, .. }),
            "{algorithm}, the waiting request dropped: {after:?}"
        );
    }
}

/// Redis whose lease calls, once `slow` is set, wait for a permit of `gate` (a lease call that takes
/// long: a slow or distant Redis); `leases` counts the calls begun.
#[derive(Clone)]
struct SlowLease {
    redis: RedisStore,
    slow: Arc<std::sync::atomic::AtomicBool>,
    gate: Arc<tokio::sync::Semaphore>,
    leases: Arc<AtomicU64>,
}

impl Store for SlowLease {
    async fn reserve(&self, checks: &[Check<'_>]) -> Result<Reserved, StoreError> {
        self.redis.reserve(checks).await
    }

    async fn refund(&self, refunds: &[Refund<'_>]) -> Result<(), StoreError> {
        self.redis.refund(refunds).await
    }

    async fn reset(&self, scope: &str, key: &[u8], limit: &Limit) -> Result<(), StoreError> {
        self.redis.reset(scope, key, limit).await
    }
}

impl Lessor for SlowLease {
    async fn lease(&self, check: Check<'_>, want: u64, lessee: u64, lifetime: Duration) -> Result<Grant, StoreError> {
        self.leases.fetch_add(1, Ordering::SeqCst);
        if self.slow.load(Ordering::SeqCst) {
            let _permit = self.gate.acquire().await.expect("the gate stays open");
        }
        self.redis.lease(check, want, lessee, lifetime).await
    }
}

/// The same through `Leased`, requests as tasks: the node's lease refused (the key drained by
/// another node), then the other node resets the key, and the node's next lease call is slow.
/// Past the refusal's `retry_after` a request waits for that call, and a newcomer meanwhile may be
/// refused from the state before the reset; once the call is answered, the reset is seen: the next
/// request is admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_leased_a_reset_on_another_node_is_seen_once_the_slow_refill_is_answered() {
    let server = RedisServer::start();
    let limit = Limit::per_second(1_000).build().unwrap();
    let clock = Arc::new(ManualClock::new(T0 + 1_234 * MS));
    let prefix = fresh_prefix();
    let store = SlowLease {
        redis: redis(&server, &clock, &prefix),
        slow: Arc::default(),
        gate: Arc::new(tokio::sync::Semaphore::new(0)),
        leases: Arc::default(),
    };
    let options = LeaseOptions { mode: LeaseMode::Always, lifetime: LIFETIME, lessee: 1, ..LeaseOptions::default() };
    let node = Leased::new(store.clone(), options, clock.clone());
    let other = redis(&server, &clock, &prefix);
    assert!(other.check(b"hot", &limit, limit.capacity()).await.unwrap().allowed);
    // Exact, refused; the lease it starts is refused too.
    assert!(!node.check(b"hot", &limit, 1).await.unwrap().allowed);
    tokio::time::timeout(Duration::from_secs(10), async {
        while node.stats().grants == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("the lease is answered");
    let refusal = node.check(b"hot", &limit, 1).await.unwrap();
    assert!(!refusal.allowed && node.stats().local_decisions == 1, "{refusal:?}");
    store.slow.store(true, Ordering::SeqCst);
    other.reset("", b"hot", &limit).await.unwrap();
    // Past the refusal's retry_after (and far within the lifetime): a request starts the next
    // lease call, slow, and waits for it.
    clock.advance(Duration::from_nanos(refusal.retry_after_ns + limit.emission_interval_ns() / 2));
    let waiting = tokio::spawn({
        let (node, limit) = (node.clone(), limit.clone());
        async move { node.check(b"hot", &limit, 1).await }
    });
    tokio::time::timeout(Duration::from_secs(10), async {
        while store.leases.load(Ordering::SeqCst) < 2 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("the next lease call is sent");
    let newcomer = node.check(b"hot", &limit, 1).await.unwrap();
    store.gate.add_permits(10);
    let waited = waiting.await.unwrap().unwrap();
    let next = node.check(b"hot", &limit, 1).await.unwrap();
    assert!(
        waited.allowed && next.allowed,
        "after another node's reset and the slow lease call answered: the waiting request {waited:?}, the next \
         {next:?} (a newcomer while the call was in flight: {newcomer:?})",
    );
}
