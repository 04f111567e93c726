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

use tollgate_store::lease::{Book, Grant, LeaseMode, LeaseOptions, Leased, Lessor, Order, Refill, Spend, leasable};
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
    async fn lease(&self, check: Check<'_>, want: u64, lessee: u64, lifetime: Duration) -> Result<Grant, StoreError> {
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

/// A lease call in flight: sent by the node, run by Redis once `reply` is set, answered later.
struct Flight {
    order: Order,
    reply: Option<Result<Grant, StoreError>>,
    /// Nothing changed the key since Redis ran it.
    fresh: bool,
}

/// One node whose lease calls stay in flight for a while (sent at one step, run by Redis at a
/// later one, answered at a later one still), with requests waiting for them, and another node
/// spending the same key directly; every local refusal is compared with Redis.
struct Flights {
    book: Book,
    node: RedisStore,
    direct: RedisStore,
    clock: Arc<ManualClock>,
    limit: Limit,
    /// A copy of the key, where Redis answers what it would with the node's waiting requests sent
    /// first, at the instant `copy_clock` gives.
    copy: RedisStore,
    copy_clock: Arc<ManualClock>,
    connection: redis::aio::MultiplexedConnection,
    flight: Option<Flight>,
    /// The node's requests waiting for the refill in flight, in the order they came.
    waiting: Vec<(u64, Refill)>,
    /// Nothing changed the key since Redis ran the call whose reply the node answers from.
    unchanged: bool,
    /// Local refusals compared: while a refill was in flight, with requests waiting, and whose
    /// figures were compared with Redis's own.
    in_flight: u64,
    with_waiting: u64,
    figures: u64,
    ops: Vec<String>,
}

impl Flights {
    fn start(&mut self, order: Option<Order>) {
        if let Some(order) = order {
            assert!(self.flight.is_none(), "one refill in flight at a time");
            self.flight = Some(Flight { order, reply: None, fresh: false });
        }
    }

    /// An admission changed the key.
    fn touched(&mut self) {
        self.unchanged = false;
        if let Some(flight) = &mut self.flight {
            flight.fresh = false;
        }
    }

    /// A request of the node, decided as `Leased` does.
    async fn request(&mut self, cost: u64) {
        let limit = self.limit.clone();
        let check = Check::new(b"hot", &limit, cost);
        let now = self.clock.now_ns();
        match self.book.spend(&check, now, false) {
            Spend::Local { decision, at, order } => {
                self.start(order);
                self.ops.push(format!("cost {cost}: local {decision:?}"));
                if !decision.allowed {
                    self.compare(cost, decision, at).await;
                }
            }
            Spend::Wait { order, refill } => {
                self.start(order);
                self.ops.push(format!("cost {cost}: waits"));
                self.waiting.push((cost, refill));
            }
            Spend::Exact { order } => {
                self.start(order);
                let observed = self.book.observe_exact(&check, now);
                self.start(observed);
                let decision = self.node.reserve(&[check]).await.unwrap().decisions[0];
                self.ops.push(format!("cost {cost}: exact {decision:?}"));
                if decision.allowed {
                    self.touched();
                }
            }
        }
    }

    /// Redis runs the refill in flight, or its reply reaches the node (and the requests waiting
    /// for it are decided again).
    async fn advance(&mut self) {
        let Some(flight) = &mut self.flight else { return };
        if flight.reply.is_none() {
            let options = self.book.options();
            let grant =
                self.node.lease(flight.order.check(), flight.order.want, options.lessee, options.lifetime).await;
            let granted = grant.as_ref().map_or(0, |g| g.granted);
            self.ops.push(format!("refill of {} runs: {grant:?}", flight.order.want));
            flight.reply = Some(grant);
            flight.fresh = true;
            if granted > 0 {
                self.unchanged = false;
            }
            return;
        }
        let Flight { order, reply, fresh } = self.flight.take().expect("a refill in flight");
        self.unchanged = fresh;
        self.ops.push("refill answered".into());
        self.book.granted(order, reply.expect("run"), self.clock.now_ns());
        for (cost, refill) in std::mem::take(&mut self.waiting) {
            drop(refill);
            Box::pin(self.request(cost)).await;
        }
    }

    /// What Redis answers at `instant` to `cost` after the node's waiting requests, on a copy of
    /// the key.
    async fn redis_after_waiting(&mut self, cost: u64, instant: u64) -> Decision {
        let key = self.direct.state_key("", b"hot", &self.limit).unwrap();
        let copy = self.copy.state_key("", b"hot", &self.limit).unwrap();
        let _: () = redis::cmd("DEL").arg(&copy).query_async(&mut self.connection).await.unwrap();
        let _: i64 = redis::cmd("COPY").arg(&key).arg(&copy).query_async(&mut self.connection).await.unwrap();
        self.copy_clock.set(instant);
        for &(waiting, _) in &self.waiting {
            self.copy.reserve(&[Check::new(b"hot", &self.limit, waiting)]).await.unwrap();
        }
        self.copy.check(b"hot", &self.limit, cost).await.unwrap()
    }

    /// A local refusal of `cost` (at the node's estimate `at` of Redis's instant) against Redis.
    async fn compare(&mut self, cost: u64, decision: Decision, at: u64) {
        let in_flight = self.flight.is_some();
        self.in_flight += u64::from(in_flight);
        self.with_waiting += u64::from(!self.waiting.is_empty());
        let now = self.clock.now_ns();
        let redis_now = self.redis_after_waiting(cost, now).await;
        let waiting: Vec<u64> = self.waiting.iter().map(|w| w.0).collect();
        let context = format!(
            "{}: local {decision:?} in flight {in_flight}, waiting {waiting:?}, ops:\n{}",
            self.limit,
            self.ops.join("\n")
        );
        assert!(!redis_now.allowed, "Redis admits it now, after the waiting requests: {redis_now:?}; {context}");
        // Figures: Redis's own at the node's estimate of its instant, when nothing else changed the
        // key (the model counts every waiting request then).
        if self.unchanged && waiting.iter().all(|&w| w <= cost) {
            self.figures += 1;
            let redis_then = self.redis_after_waiting(cost, at).await;
            assert_eq!(decision, redis_then, "Redis at {} ns ahead; {context}", at - now);
        }
    }
}

/// Refusals made while a refill is in flight, requests waiting for it: each is a refusal Redis
/// makes at that instant to the same request had it received the node's waiting requests first,
/// in order (never a request Redis would admit), and when nothing else changed the key since
/// the reply the node answers from, its figures are Redis's at the node's estimate of its
/// instant, at most the call's round trip ahead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_while_a_refill_is_in_flight_is_what_redis_answers_after_the_waiting_requests() {
    let server = RedisServer::start();
    let seed = std::env::var("TOLLGATE_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x2545_F491_4F6C_DD1D);
    let mut rng = Rng(seed);
    let connection = redis::Client::open(server.url()).unwrap().get_multiplexed_async_connection().await.unwrap();
    let algorithms: Vec<Algorithm> = Algorithm::ALL.into_iter().filter(|&a| leasable(a)).collect();
    let (mut in_flight, mut with_waiting, mut figures) = (0, 0, 0);
    let mut connection = Some(connection);
    for round in 0..60 {
        let algorithm = algorithms[round % algorithms.len()];
        let limit = if round % 2 == 0 {
            Limit::per_second(1_000).algorithm(algorithm).build().unwrap()
        } else {
            random_limit(&mut rng, algorithm)
        };
        let (capacity, interval) = (limit.capacity(), limit.emission_interval_ns());
        let clock = Arc::new(ManualClock::new(T0 + rng.below(limit.period_ns())));
        let copy_clock = Arc::new(ManualClock::new(T0));
        let prefix = fresh_prefix();
        let mut sim = Flights {
            book: Book::new(lease_options(1)),
            node: redis(&server, &clock, &prefix),
            direct: redis(&server, &clock, &prefix),
            copy: redis(&server, &copy_clock, &format!("{prefix}c")),
            copy_clock,
            clock: clock.clone(),
            limit: limit.clone(),
            connection: connection.take().expect("the connection"),
            flight: None,
            waiting: Vec::new(),
            unchanged: false,
            in_flight: 0,
            with_waiting: 0,
            figures: 0,
            ops: Vec::new(),
        };
        for _ in 0..200 {
            let gap = match rng.below(8) {
                0 => rng.below(interval + 1),
                1 => rng.below(interval / 8 + 1),
                2 => rng.below(2 * MS),
                3 => rng.below(limit.period_ns() / 64 + 1),
                _ => 0,
            };
            clock.set(clock.now_ns() + gap);
            sim.ops.push(format!("+{gap}ns"));
            let cost = match rng.below(8) {
                0 => 1 + rng.below(capacity),
                1 => 1 + rng.below(capacity.min(4)),
                _ => 1,
            };
            match rng.below(8) {
                0 | 1 => sim.advance().await,
                2 => {
                    let decision = sim.direct.check(b"hot", &limit, cost).await.unwrap();
                    sim.ops.push(format!("direct cost {cost}: {decision:?}"));
                    if decision.allowed {
                        sim.touched();
                    }
                }
                _ => sim.request(cost).await,
            }
        }
        in_flight += sim.in_flight;
        with_waiting += sim.with_waiting;
        figures += sim.figures;
        connection = Some(sim.connection);
    }
    // The refusals this test is for were made, often.
    assert!(
        in_flight > 300 && with_waiting > 200 && figures > 300,
        "{in_flight} refusals with a refill in flight, {with_waiting} with requests waiting, {figures} figures compared"
    );
}
