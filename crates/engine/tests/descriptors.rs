//! Envoy's descriptors decided by the engine under the policy's Envoy configuration: all or
//! nothing, shadow-mode limits counted only when the request is admitted, peeks for what a
//! refused request did not consume, `requests_per_unit: 0` and costs above a limit refusing
//! without the store, envoyproxy/ratelimit's per-limit counters, store errors counted, and the
//! store Envoy's descriptors are decided on.

mod support;

use std::sync::Arc;

use prometheus_client::registry::Registry;
use support::{clock, memory};
use tollgate_engine::{Descriptor, Engine, Verdict, Verdicts};
use tollgate_envoy::{RateLimit, Unit};
use tollgate_rules::Rules;
use tollgate_store::testkit::faults::{Fault, Faulty};
use tollgate_store::{MemoryStore, Store};

const SHOP: &str = "
domain: shop
descriptors:
  - key: a
    rate_limit: { unit: hour, requests_per_unit: 2 }
  - key: b
    rate_limit: { unit: hour, requests_per_unit: 5 }
  - key: s
    shadow_mode: true
    rate_limit: { unit: hour, requests_per_unit: 2 }
  - key: zero
    rate_limit: { unit: hour, requests_per_unit: 0 }
  - key: zero_shadow
    shadow_mode: true
    rate_limit: { unit: hour, requests_per_unit: 0 }
  - key: internal
    rate_limit: { unlimited: true }
";

/// An engine deciding [`SHOP`] on `store` (and `envoy_store`, if any), and its root registry
/// (tollgate's metrics under their prefix, envoyproxy/ratelimit's without).
struct Envoy<S> {
    engine: Engine<S>,
    registry: Registry,
}

fn envoy<S: Store>(store: S, envoy_store: Option<S>) -> Envoy<S> {
    let config = Arc::new(tollgate_envoy::Config::parse(SHOP, "shop.yaml").unwrap());
    let mut registry = Registry::default();
    let mut builder = Engine::builder(store, Rules::default()).clock(clock()).envoy(config);
    if let Some(store) = envoy_store {
        builder = builder.envoy_store(store);
    }
    let engine = builder.build(registry.sub_registry_with_prefix("tollgate"));
    engine.metrics().descriptors().register(&mut registry);
    Envoy { engine, registry }
}

fn on_memory() -> Envoy<MemoryStore> {
    envoy(memory(&clock()), None)
}

/// A descriptor of one entry, `key` with a value of its own.
fn d(key: &'static str) -> Descriptor<'static> {
    Descriptor { entries: vec![(key, "x")], ..Descriptor::default() }
}

/// [`d`], checked without counting.
fn peek(key: &'static str) -> Descriptor<'static> {
    Descriptor { hits_addend: Some(0), ..d(key) }
}

impl<S: Store> Envoy<S> {
    async fn admit(&self, descriptors: &[Descriptor<'_>], hits: u32) -> Verdicts {
        self.engine.admit_descriptors("shop", descriptors, hits).await.unwrap()
    }

    /// What `key`'s limit has left, peeked.
    async fn left(&self, key: &'static str) -> u64 {
        remaining(&self.admit(&[peek(key)], 0).await.verdicts[0])
    }

    fn metrics(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry).unwrap();
        text
    }
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

#[tokio::test]
async fn descriptors_are_all_or_nothing_and_shadow_ones_count_only_admitted_requests() {
    let e = on_memory();
    // Admitted twice: every limit consumed, the shadow one too.
    for _ in 0..2 {
        assert!(e.admit(&[d("a"), d("b"), d("s")], 0).await.admitted);
    }
    assert_eq!((e.left("a").await, e.left("b").await, e.left("s").await), (0, 3, 0));
    // The third: `a` refuses it; `b` and the shadow limit consume nothing (each reported as a
    // peek: the shadow limit is spent, and refuses nothing).
    let third = e.admit(&[d("a"), d("b"), d("s")], 0).await;
    assert!(!third.admitted);
    assert_eq!(over(&third), [true, false, false]);
    assert_eq!((remaining(&third.verdicts[1]), remaining(&third.verdicts[2])), (3, 0), "peeks");
    assert_eq!(e.left("b").await, 3);
}

#[tokio::test]
async fn a_limit_of_zero_or_a_cost_above_the_limit_refuses_without_consuming_the_others() {
    let e = on_memory();
    // `requests_per_unit: 0`: over, never asked of the store; `b` reported as a peek.
    let zero = e.admit(&[d("b"), d("zero")], 0).await;
    assert!(!zero.admitted);
    assert_eq!(over(&zero), [false, true]);
    assert!(matches!(zero.verdicts[1], Verdict::Limited { decision: None, .. }));
    assert_eq!(remaining(&zero.verdicts[0]), 5);
    // More hits than `a` can ever admit (2 an hour): over, not a store error.
    let huge = e.admit(&[d("a"), d("b")], 3).await;
    assert_eq!((huge.admitted, over(&huge)), (false, vec![true, false]));
    assert_eq!((e.left("a").await, e.left("b").await), (2, 5), "nothing consumed");
    // In shadow mode a limit of zero refuses nothing.
    let shadow = e.admit(&[d("b"), d("zero_shadow")], 0).await;
    assert_eq!((shadow.admitted, over(&shadow)), (true, vec![false, false]));
    assert_eq!(e.left("b").await, 4);
}

#[tokio::test]
async fn unlimited_unmatched_and_overridden_descriptors() {
    let e = on_memory();
    let verdicts = e.admit(&[d("internal"), d("nothing")], 0).await;
    assert_eq!(verdicts.verdicts, [Verdict::Unlimited, Verdict::Free]);
    let other = e.engine.admit_descriptors("other", &[d("a")], 0).await.unwrap();
    assert_eq!((other.admitted, &other.verdicts[..]), (true, &[Verdict::Free][..]), "an unknown domain");
    // An override is decided instead of the configured limit, under the same key.
    let limit = Some(RateLimit::from_override(10, Unit::Second, &tollgate_core::LimitSpec::default()).unwrap());
    let custom = e.admit(&[Descriptor { limit, ..d("a") }], 0).await;
    let Verdict::Limited { limit, over: false, decision: Some(decision) } = &custom.verdicts[0] else {
        panic!("{custom:?}")
    };
    assert_eq!((limit.requests_per_unit, limit.unit, decision.remaining), (10, Unit::Second, 9));
}

/// envoyproxy/ratelimit's counters count hits per limit (a refused request's other descriptors
/// only in `total_hits`), and every request is timed as gRPC's.
#[tokio::test]
async fn per_limit_counters_and_latency() {
    let e = on_memory();
    for _ in 0..3 {
        e.admit(&[d("a"), d("b")], 0).await;
    }
    e.admit(&[d("zero")], 0).await;
    let text = e.metrics();
    let series = |name: &str, descriptor: &str, value: u32| {
        format!("ratelimit_service_rate_limit_{name}_total{{domain=\"shop\",descriptor=\"{descriptor}\"}} {value}\n")
    };
    for wanted in [
        series("total_hits", "a", 3),
        series("within_limit", "a", 2),
        series("near_limit", "a", 1),
        series("over_limit", "a", 1),
        series("total_hits", "b", 3),
        series("within_limit", "b", 2),
        series("over_limit", "zero", 1),
        "tollgate_decision_duration_seconds_count{frontend=\"grpc\"} 4\n".to_string(),
    ] {
        assert!(text.contains(&wanted), "{wanted}: {text}");
    }
    assert!(!text.contains("over_limit_total{domain=\"shop\",descriptor=\"b\"}"), "{text}");
}

/// A store error on descriptors is the engine's to count, as for a rule; Envoy's descriptors are
/// decided on the store given for them, the engine's own store untouched.
#[tokio::test]
async fn descriptors_are_decided_on_their_own_store_and_its_errors_are_counted() {
    let clock = clock();
    let (main, own) = (Arc::new(Faulty::new(memory(&clock))), Arc::new(Faulty::new(memory(&clock))));
    let e = envoy(main.clone(), Some(own.clone()));
    main.set(Fault::Refuse);
    assert!(e.admit(&[d("a")], 0).await.admitted, "the engine's store is not asked");
    own.set(Fault::Refuse);
    assert!(e.engine.admit_descriptors("shop", &[d("a")], 0).await.is_err());
    assert!(e.metrics().contains("tollgate_store_errors_total{kind=\"backend\"} 1\n"), "{}", e.metrics());
    own.set(Fault::None);
    assert_eq!(e.left("a").await, 1, "the failed request consumed nothing");
}
