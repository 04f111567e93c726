//! Cached denials of leased hot keys, on a real `redis-server`, against Redis deciding the same
//! requests. The store's time is the node's manual clock, so a lease call's round trip takes the
//! time a test sets on it (none, or a random trip):
//!
//! - a denial answered from the cache is exactly what Redis answers to the same request at that
//!   instant (allowed, limit, remaining, retry_after, reset), for every leasable algorithm across
//!   the range a `Limit` accepts, while other nodes spend the same key; with lease calls taking a
//!   round trip, one Redis makes, its figures at most that round trip ahead;
//! - nothing Redis would admit is refused locally: a cached denial ends when Redis frees a unit;
//! - a reset or a refund made on the node is seen at once; one made on another node once the
//!   local denial ends, at most a lease lifetime after the refusal that started it; a lease
//!   answered while a reset on the node was on its way does not outlive the reset.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tollgate_store::lease::{Book, LeaseMode, LeaseOptions, Leased, Lessor, Order, Spend, leasable};
use tollgate_store::testkit::random::{Rng, random_limit};
use tollgate_store::testkit::redis_server::RedisServer;
use tollgate_store::{
    Algorithm, Check, Clock, Decision, Limit, ManualClock, RedisOptions, RedisStore, Refund, Reserved, Store,
    StoreError, TimeSource,
};

const MS: u64 = 1_000_000;
const SEC: u64 = 1_000 * MS;
const T0: u64 = 1_700_000_000 * SEC;
const LIFETIME: Duration = Duration::from_millis(100);

/// A store on `server` under `prefix`, its time from `clock`.
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
    format!("d{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

fn lease_options(lessee: u64) -> LeaseOptions {
    LeaseOptions { mode: LeaseMode::Always, lifetime: LIFETIME, lessee, ..LeaseOptions::default() }
}

/// A node's book driven by hand: every refill is sent and answered before the next request, `trip`
/// after the instant it was ordered (Redis runs it then: the node's estimate of Redis's instant is
/// `trip` ahead after it), as `Leased` does, without the concurrency.
struct Node {
    book: Book,
    redis: RedisStore,
    clock: Arc<ManualClock>,
    trip: u64,
}

impl Node {
    async fn send(&self, order: Option<Order>) {
        let Some(order) = order else { return };
        self.clock.set(self.clock.now_ns() + self.trip);
        let options = self.book.options();
        let result = self.redis.lease(order.check(), order.want, options.lessee, options.lifetime).await;
        self.book.granted(order, result, self.clock.now_ns());
    }

    /// Decides `check` as `Leased` does: `(decision, answered locally)`.
    async fn decide(&self, check: &Check<'_>) -> (Decision, bool) {
        let mut waited = false;
        loop {
            match self.book.spend(check, self.clock.now_ns(), waited) {
                Spend::Local { decision, order, .. } => {
                    self.send(order).await;
                    return (decision, true);
                }
                Spend::Wait { order, .. } if !waited => {
                    self.send(order).await;
                    waited = true;
                }
                Spend::Wait { order, .. } | Spend::Exact { order } => {
                    self.send(order).await;
                    break;
                }
            }
        }
        self.send(self.book.observe_exact(check, self.clock.now_ns())).await;
        (self.redis.reserve(std::slice::from_ref(check)).await.unwrap().decisions[0], false)
    }
}

/// Through the lease layer or directly on Redis (another node without leases), random requests
/// on one key; every denial answered locally is compared with Redis's answer to the same request
/// at the same instant (a denial changes nothing in Redis, so asking it is harmless; an admission
/// there fails the test at once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_denial_is_what_redis_answers_at_that_instant() {
    compare_with_redis(|_, _| 0, 1_000).await;
}

/// The same with lease calls taking a round trip (Redis runs each `trip` after it was sent, up
/// to 2 ms or a few emission intervals): every local denial is one Redis makes at that instant,
/// its figures Redis's at most `trip` ahead (`remaining` as large or larger, `retry_after` and
/// `reset_after` smaller by at most `trip`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_denial_a_round_trip_ahead_is_one_redis_makes() {
    compare_with_redis(
        |rng, limit| match rng.below(3) {
            0 => 1 + rng.below(2 * MS),
            1 => 1 + rng.below(limit.emission_interval_ns().saturating_mul(3).min(50 * MS)),
            _ => 1 + rng.below(20_000),
        },
        500,
    )
    .await;
}

/// The rounds of the two tests above, each round's lease calls taking `trip(rng, limit)`; more
/// than `local_at_least` denials answered locally.
async fn compare_with_redis(trip: impl Fn(&mut Rng, &Limit) -> u64, local_at_least: u64) {
    let server = RedisServer::start();
    let seed = std::env::var("TOLLGATE_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x9E37_79B9_7F4A_7C15);
    let mut rng = Rng(seed);
    let algorithms: Vec<Algorithm> = Algorithm::ALL.into_iter().filter(|&a| leasable(a)).collect();
    let (mut local_denials, mut redis_denials) = (0u64, 0u64);
    for round in 0..60 {
        let algorithm = algorithms[round % algorithms.len()];
        // Half the rounds a hot key's realistic limit (the bench's: burst 1,000 at 1,000/s, in
        // the algorithm's terms), half anything a `Limit` accepts.
        let limit = if round % 2 == 0 {
            Limit::per_second(1_000).algorithm(algorithm).build().unwrap()
        } else {
            random_limit(&mut rng, algorithm)
        };
        let (capacity, interval) = (limit.capacity(), limit.emission_interval_ns());
        let clock = Arc::new(ManualClock::new(T0 + rng.below(limit.period_ns())));
        let prefix = fresh_prefix();
        let trip = trip(&mut rng, &limit);
        let book = Book::new(lease_options(1));
        let node = Node { book, redis: redis(&server, &clock, &prefix), clock: clock.clone(), trip };
        let direct = redis(&server, &clock, &prefix);
        let mut ops = Vec::new();
        for step in 0..150 {
            let gap = match rng.below(8) {
                0 => rng.below(interval + 1),
                1 => rng.below(interval / 8 + 1),
                2 => rng.below(5 * MS),
                3 => rng.below(limit.period_ns() / 16 + 1),
                _ => 0,
            };
            clock.set(clock.now_ns() + gap);
            let cost = match rng.below(8) {
                0 => 1 + rng.below(capacity),
                1 => 1 + rng.below(capacity.min(4)),
                _ => 1,
            };
            let check = Check::new(b"hot", &limit, cost);
            if rng.below(6) == 0 {
                ops.push(format!("+{gap}ns direct cost {cost}"));
                direct.reserve(&[check]).await.unwrap();
                continue;
            }
            let (decision, local) = node.decide(&check).await;
            ops.push(format!("+{gap}ns leased cost {cost}: local {local} {decision:?}"));
            if decision.allowed || !local {
                redis_denials += u64::from(!decision.allowed);
                continue;
            }
            local_denials += 1;
            let redis_says = direct.check(b"hot", &limit, cost).await.unwrap();
            let ahead = |local: u64, redis: u64| local <= redis && local + trip >= redis;
            let within = !redis_says.allowed
                && decision.limit == redis_says.limit
                && decision.remaining >= redis_says.remaining
                && ahead(decision.retry_after_ns, redis_says.retry_after_ns)
                && ahead(decision.reset_after_ns, redis_says.reset_after_ns);
            assert!(
                within && (trip > 0 || decision == redis_says),
                "{limit} round {round} step {step}, trip {trip} ns: local {decision:?}, Redis {redis_says:?}, ops:\n{}",
                ops.join("\n")
            );
        }
    }
    // Both paths were taken, often.
    assert!(
        local_denials > local_at_least && redis_denials > 0,
        "{local_denials} local denials, {redis_denials} from Redis"
    );
}

/// A hot key drained by another node: `node` is refused a lease and answers locally.
async fn refused<S: Store + Lessor + Clone + 'static>(
    node: &Leased<S>,
    direct: &RedisStore,
    limit: &Limit,
) -> Reserved {
    let drained = direct.reserve(&[Check::new(b"hot", limit, limit.capacity())]).await.unwrap();
    assert!(drained.decisions[0].allowed);
    // The first request is exact and starts the key's first lease (refused: nothing is left).
    assert!(!node.check(b"hot", limit, 1).await.unwrap().allowed);
    tokio::time::timeout(Duration::from_secs(10), async {
        while node.stats().grants == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("the lease is answered");
    let local = node.stats().local_decisions;
    assert!(!node.check(b"hot", limit, 1).await.unwrap().allowed);
    assert_eq!(node.stats().local_decisions, local + 1, "the denial was answered locally");
    drained
}

fn leased(server: &RedisServer, clock: &Arc<ManualClock>, prefix: &str, lessee: u64) -> Leased<RedisStore> {
    Leased::new(redis(server, clock, prefix), lease_options(lessee), clock.clone())
}

/// A reset or a refund on the node ends its cached denial at once: the next request, at the same
/// instant, is Redis's admission.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_or_a_refund_on_the_node_is_seen_at_once() {
    let server = RedisServer::start();
    let limit = Limit::per_minute(10).algorithm(Algorithm::FixedWindow).build().unwrap();
    for refund in [false, true] {
        let clock = Arc::new(ManualClock::new(T0 + 1_234 * MS));
        let prefix = fresh_prefix();
        let (node, direct) = (leased(&server, &clock, &prefix, 1), redis(&server, &clock, &prefix));
        let drained = refused(&node, &direct, &limit).await;
        if refund {
            let check = Check::new(b"hot", &limit, limit.capacity());
            node.refund(&[Refund { check, at: drained.at, decision: drained.decisions[0] }]).await.unwrap();
        } else {
            node.reset("", b"hot", &limit).await.unwrap();
        }
        let decision = node.check(b"hot", &limit, 1).await.unwrap();
        assert!(decision.allowed, "refund {refund}: {decision:?}");
    }
}

/// A reset on another node is seen once the local denial ends: at most a lease lifetime after the
/// refusal, though the refusal's window (a minute) runs much longer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_on_another_node_is_seen_within_a_lifetime() {
    let server = RedisServer::start();
    let limit = Limit::per_minute(10).algorithm(Algorithm::FixedWindow).build().unwrap();
    let clock = Arc::new(ManualClock::new(T0 + 1_234 * MS));
    let prefix = fresh_prefix();
    let (node, other, direct) =
        (leased(&server, &clock, &prefix, 1), leased(&server, &clock, &prefix, 2), redis(&server, &clock, &prefix));
    refused(&node, &direct, &limit).await;
    other.reset("", b"hot", &limit).await.unwrap();
    clock.advance(LIFETIME);
    let decision = node.check(b"hot", &limit, 1).await.unwrap();
    assert!(decision.allowed, "{decision:?}");
}

/// Redis whose resets wait for a permit of `gate` before they are sent: the time a reset takes to
/// reach Redis, made as long as a test needs.
#[derive(Clone)]
struct SlowReset {
    redis: RedisStore,
    gate: Arc<tokio::sync::Semaphore>,
}

impl Store for SlowReset {
    async fn reserve(&self, checks: &[Check<'_>]) -> Result<Reserved, StoreError> {
        self.redis.reserve(checks).await
    }

    async fn refund(&self, refunds: &[Refund<'_>]) -> Result<(), StoreError> {
        self.redis.refund(refunds).await
    }

    async fn reset(&self, scope: &str, key: &[u8], limit: &Limit) -> Result<(), StoreError> {
        let _permit = self.gate.acquire().await.expect("the gate stays open");
        self.redis.reset(scope, key, limit).await
    }
}

impl Lessor for SlowReset {
    async fn lease(
        &self,
        check: Check<'_>,
        want: u64,
        lessee: u64,
        lifetime: Duration,
    ) -> Result<tollgate_store::lease::Grant, StoreError> {
        self.redis.lease(check, want, lessee, lifetime).await
    }
}

/// A lease call answered while a reset on the node is on its way to Redis carries the state before
/// the reset: once the reset is done, the node's next request at the same instant is still Redis's
/// admission, not a refusal cached from that reply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_answered_during_a_reset_on_the_node_does_not_outlive_it() {
    let server = RedisServer::start();
    let limit = Limit::per_minute(10).algorithm(Algorithm::FixedWindow).build().unwrap();
    let clock = Arc::new(ManualClock::new(T0 + 1_234 * MS));
    let prefix = fresh_prefix();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let store = SlowReset { redis: redis(&server, &clock, &prefix), gate: gate.clone() };
    let node = Leased::new(store, lease_options(1), clock.clone());
    let direct = redis(&server, &clock, &prefix);
    refused(&node, &direct, &limit).await;
    let resetting = tokio::spawn({
        let (node, limit) = (node.clone(), limit.clone());
        async move { node.reset("", b"hot", &limit).await }
    });
    // Meanwhile a request: Redis, not reset yet, refuses it, and the lease it starts is refused.
    let grants = node.stats().grants;
    tokio::time::timeout(Duration::from_secs(10), async {
        while node.stats().leased_keys > 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("the reset began");
    assert!(!node.check(b"hot", &limit, 1).await.unwrap().allowed);
    tokio::time::timeout(Duration::from_secs(10), async {
        while node.stats().grants == grants {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("the lease sent during the reset is answered");
    gate.add_permits(1);
    resetting.await.unwrap().unwrap();
    let decision = node.check(b"hot", &limit, 1).await.unwrap();
    assert!(decision.allowed, "after the reset: {decision:?}");
}
