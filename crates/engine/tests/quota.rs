//! Envoy's `quota_mode` decided by the engine, as envoyproxy/ratelimit decides it: a request is
//! refused when an enforced descriptor is over its limit, or when every quota-mode descriptor of
//! the request is; a quota-mode descriptor over its limit in an admitted request reports itself
//! over. Kept all or nothing: a refused request consumes nothing anywhere, an admitted one
//! consumes on every enforced descriptor and on each quota-mode descriptor within its limit,
//! never on one over it. On the memory store, a Redis server and a Redis Cluster (whose keys
//! lie in several slots).

mod support;

use std::sync::Arc;
use std::time::Duration;

use support::{clock, memory};
use tollgate_core::ManualClock;
use tollgate_engine::{Descriptor, Engine, Verdict, Verdicts};
use tollgate_rules::Rules;
use tollgate_store::testkit::faults::Faulty;
use tollgate_store::testkit::redis_server::RedisServer;
use tollgate_store::testkit::redis_topology::RedisCluster;
use tollgate_store::{RedisOptions, RedisStore, Store, TimeSource};

/// `plan` enforced; `backend` and `tier` quota-mode limits counting each value apart; a
/// quota-mode limit of zero; a quota-mode limit in shadow mode.
const QUOTA: &str = "
domain: quota
descriptors:
  - key: plan
    rate_limit: { unit: hour, requests_per_unit: 5 }
  - key: backend
    quota_mode: true
    rate_limit: { unit: hour, requests_per_unit: 3 }
  - key: tier
    quota_mode: true
    rate_limit: { unit: hour, requests_per_unit: 3 }
  - key: zero
    quota_mode: true
    rate_limit: { unit: hour, requests_per_unit: 0 }
  - key: watch
    quota_mode: true
    shadow_mode: true
    rate_limit: { unit: hour, requests_per_unit: 1 }
";

fn engine<S: Store>(store: S, clock: &Arc<ManualClock>) -> Engine<S> {
    let config = Arc::new(tollgate_envoy::Config::parse(QUOTA, "quota.yaml").unwrap());
    Engine::builder(store, Rules::default()).clock(clock.clone()).envoy(config).build(&mut Default::default())
}

/// A descriptor of one entry.
fn d(key: &'static str, value: &'static str) -> Descriptor<'static> {
    Descriptor { entries: vec![(key, value)], ..Descriptor::default() }
}

async fn admit<S: Store>(e: &Engine<S>, descriptors: &[Descriptor<'_>], hits: u32) -> Verdicts {
    e.admit_descriptors("quota", descriptors, hits).await.unwrap()
}

/// What `descriptor`'s limit has left, peeked.
async fn left<S: Store>(e: &Engine<S>, descriptor: Descriptor<'static>) -> u64 {
    remaining(&admit(e, &[Descriptor { hits_addend: Some(0), ..descriptor }], 0).await.verdicts[0])
}

fn remaining(verdict: &Verdict) -> u64 {
    match verdict {
        Verdict::Limited { decision: Some(decision), .. } => decision.remaining,
        other => panic!("no decision: {other:?}"),
    }
}

fn over(verdicts: &Verdicts) -> Vec<bool> {
    verdicts.verdicts.iter().map(|v| matches!(v, Verdict::Limited { over: true, .. })).collect()
}

/// One quota-mode descriptor over its limit and another within: admitted. The enforced one and
/// the quota one within are consumed; the one over is not, and reports itself over with its
/// state.
async fn one_quota_over_and_another_within_admits<S: Store>(e: &Engine<S>) {
    // `backend=a` keeps 1 of its 3; a request of 2 is over it.
    assert!(admit(e, &[d("backend", "a")], 2).await.admitted);
    let verdicts = admit(e, &[d("plan", "p"), d("backend", "a"), d("backend", "b")], 2).await;
    assert!(verdicts.admitted, "{verdicts:?}");
    assert_eq!((over(&verdicts), &verdicts.quota[..]), (vec![false, true, false], &[1, 2][..]));
    assert_eq!(remaining(&verdicts.verdicts[1]), 1, "the quota over its limit reports what it has left");
    assert_eq!(
        (left(e, d("plan", "p")).await, left(e, d("backend", "a")).await, left(e, d("backend", "b")).await),
        (3, 1, 1),
        "the enforced and the quota within consumed 2; the quota over its limit nothing"
    );
}

/// Every quota-mode descriptor over its limit: refused, nothing consumed anywhere (a single
/// quota-mode descriptor over refuses too: all of the request's are over).
async fn every_quota_over_refuses_and_consumes_nothing<S: Store>(e: &Engine<S>) {
    assert!(admit(e, &[d("backend", "c"), d("tier", "c")], 3).await.admitted);
    let verdicts = admit(e, &[d("plan", "q"), d("backend", "c"), d("tier", "c")], 0).await;
    assert!(!verdicts.admitted, "{verdicts:?}");
    assert_eq!((over(&verdicts), &verdicts.quota[..]), (vec![false, true, true], &[1, 2][..]));
    let alone = admit(e, &[d("plan", "q"), d("backend", "c")], 0).await;
    assert_eq!((alone.admitted, over(&alone)), (false, vec![false, true]));
    assert_eq!(left(e, d("plan", "q")).await, 5, "nothing consumed on the enforced one");
    // A second quota within its limit admits it; a limit of zero is a quota over its limit.
    let within = admit(e, &[d("plan", "q"), d("backend", "c"), d("tier", "d")], 0).await;
    assert_eq!((within.admitted, over(&within)), (true, vec![false, true, false]));
    let zero = admit(e, &[d("plan", "q"), d("zero", "z")], 0).await;
    assert_eq!((zero.admitted, over(&zero)), (false, vec![false, true]));
    let zero_and_within = admit(e, &[d("zero", "z"), d("tier", "d")], 0).await;
    assert_eq!((zero_and_within.admitted, over(&zero_and_within)), (true, vec![true, false]));
    assert_eq!((left(e, d("plan", "q")).await, left(e, d("tier", "d")).await), (4, 1));
}

/// An enforced descriptor over its limit refuses the request whatever its quota-mode
/// descriptors say; the quota within its limit consumes nothing.
async fn an_enforced_over_refuses_and_the_quota_consumes_nothing<S: Store>(e: &Engine<S>) {
    assert!(admit(e, &[d("plan", "r")], 5).await.admitted);
    let verdicts = admit(e, &[d("plan", "r"), d("backend", "r")], 0).await;
    assert!(!verdicts.admitted, "{verdicts:?}");
    assert_eq!((over(&verdicts), &verdicts.quota[..]), (vec![true, false], &[1][..]));
    assert_eq!(left(e, d("backend", "r")).await, 3, "the quota consumed nothing");
}

/// A quota-mode limit in shadow mode is never over (envoyproxy/ratelimit answers a shadow limit
/// OK): its request always has a quota within, and it is counted only when admitted.
async fn a_shadow_quota_is_never_over<S: Store>(e: &Engine<S>) {
    assert!(admit(e, &[d("backend", "s")], 3).await.admitted);
    assert!(admit(e, &[d("watch", "s")], 0).await.admitted);
    let verdicts = admit(e, &[d("backend", "s"), d("watch", "s")], 0).await;
    assert_eq!((verdicts.admitted, over(&verdicts)), (true, vec![true, false]), "{verdicts:?}");
    assert_eq!(left(e, d("backend", "s")).await, 0);
}

async fn all<S: Store>(e: &Engine<S>) {
    one_quota_over_and_another_within_admits(e).await;
    every_quota_over_refuses_and_consumes_nothing(e).await;
    an_enforced_over_refuses_and_the_quota_consumes_nothing(e).await;
    a_shadow_quota_is_never_over(e).await;
}

fn on_memory() -> Engine<tollgate_store::MemoryStore> {
    let clock = clock();
    engine(memory(&clock), &clock)
}

#[tokio::test]
async fn one_quota_over_and_another_within_admits_on_memory() {
    one_quota_over_and_another_within_admits(&on_memory()).await;
}

#[tokio::test]
async fn every_quota_over_refuses_and_consumes_nothing_on_memory() {
    every_quota_over_refuses_and_consumes_nothing(&on_memory()).await;
}

#[tokio::test]
async fn an_enforced_over_refuses_and_the_quota_consumes_nothing_on_memory() {
    an_enforced_over_refuses_and_the_quota_consumes_nothing(&on_memory()).await;
}

#[tokio::test]
async fn a_shadow_quota_is_never_over_on_memory() {
    a_shadow_quota_is_never_over(&on_memory()).await;
}

/// The rounds of quota mode, counted: a request with a quota-mode descriptor over its limit
/// makes one call more (the quota over found by the first, every one of them, as the memory
/// store reports every check that denies), never one per descriptor, and undoes nothing.
#[tokio::test]
async fn a_quota_over_its_limit_costs_one_more_store_call() {
    let clock = clock();
    let store = Arc::new(Faulty::new(memory(&clock)));
    let e = engine(store.clone(), &clock);
    assert!(admit(&e, &[d("backend", "a"), d("tier", "a")], 3).await.admitted);
    let calls = |before: u64| store.reached() - before;
    let before = store.reached();
    let within = admit(&e, &[d("plan", "p"), d("backend", "b"), d("tier", "b")], 0).await;
    assert_eq!((within.admitted, calls(before)), (true, 1), "all within: one call");
    let before = store.reached();
    let two_over = admit(&e, &[d("plan", "p"), d("backend", "a"), d("tier", "a"), d("backend", "c")], 0).await;
    assert_eq!((two_over.admitted, calls(before)), (true, 2), "two quotas over: found by one call");
    let before = store.reached();
    let all_over = admit(&e, &[d("plan", "p"), d("backend", "a"), d("tier", "a")], 0).await;
    assert_eq!((all_over.admitted, calls(before)), (false, 1), "every quota over: refused by one call");
    assert_eq!(left(&e, d("plan", "p")).await, 3);
}

fn redis(url: &str, clock: &Arc<ManualClock>) -> RedisStore {
    let options = RedisOptions {
        prefix: "quota".into(),
        time: TimeSource::Clock(clock.clone()),
        timeout: Duration::from_secs(2),
        ..RedisOptions::default()
    };
    RedisStore::open(url, options).unwrap()
}

#[tokio::test]
async fn quota_mode_on_redis() {
    let server = RedisServer::start();
    let clock = clock();
    all(&engine(redis(&server.url(), &clock), &clock)).await;
}

/// On a cluster a request's keys lie in several slots, decided slot by slot (after a denial the
/// later slots only peek).
#[tokio::test]
async fn quota_mode_on_a_redis_cluster() {
    let cluster = RedisCluster::start();
    let url = format!("redis+cluster://{}", cluster.urls().join(",").replace("redis://", ""));
    let clock = clock();
    all(&engine(redis(&url, &clock), &clock)).await;
}
