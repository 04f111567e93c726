//! Checks a front end builds itself (Envoy's descriptors), decided by the engine: all or nothing,
//! shadow checks counted only when the request is admitted, peeks for a refused request.

use std::sync::Arc;

use prometheus_client::registry::Registry;
use tollgate_core::{Limit, ManualClock};
use tollgate_engine::{Ask, Engine, Frontend};
use tollgate_rules::Rules;
use tollgate_store::{Check, MemoryStore};

const T0: u64 = 1_700_000_000_000_000_000;

#[tokio::test]
async fn asks_are_all_or_nothing_and_shadow_ones_count_only_admitted_requests() {
    let clock = Arc::new(ManualClock::new(T0));
    let store = Arc::new(MemoryStore::builder().clock(clock.clone()).build());
    let engine = Engine::builder(store.clone(), Rules::default()).clock(clock).build(&mut Registry::default());
    let (two, five) = (Limit::per_hour(2).build().unwrap(), Limit::per_hour(5).build().unwrap());
    let asks = |cost| {
        [
            Ask { check: Check::new(b"a", &two, cost).scoped("envoy"), shadow: false },
            Ask { check: Check::new(b"b", &five, cost).scoped("envoy"), shadow: false },
            Ask { check: Check::new(b"s", &two, cost).scoped("envoy"), shadow: true },
        ]
    };
    let remaining =
        |key: &[u8], limit: &Limit| store.check_one_sync(Check::new(key, limit, 0).scoped("envoy")).unwrap().remaining;
    // Admitted twice: every ask consumed, the shadow one too.
    for _ in 0..2 {
        let asked = engine.admit_asks(Frontend::Grpc, &*store, &asks(1), false).await.unwrap();
        assert!(asked.admitted);
    }
    assert_eq!((remaining(b"a", &two), remaining(b"b", &five), remaining(b"s", &two)), (0, 3, 0));
    // The third: `a` refuses it; `b` and the shadow ask consume nothing (each reported as a peek:
    // the shadow key is spent, and refuses nothing).
    let asked = engine.admit_asks(Frontend::Grpc, &*store, &asks(1), false).await.unwrap();
    assert!(!asked.admitted);
    let allowed: Vec<bool> = asked.decisions.iter().map(|d| d.allowed).collect();
    assert_eq!(allowed, [false, true, true]);
    assert_eq!((asked.decisions[1].remaining, asked.decisions[2].remaining), (3, 0), "peeks");
    // Refused before (a limit of zero elsewhere): nothing consumed, every ask a peek.
    let only_b = [Ask { check: Check::new(b"b", &five, 1).scoped("envoy"), shadow: false }];
    let asked = engine.admit_asks(Frontend::Grpc, &*store, &only_b, true).await.unwrap();
    assert!(!asked.admitted && asked.decisions[0].allowed);
    assert_eq!(remaining(b"b", &five), 3);
}

/// A store error on a front end's asks is the engine's to count, as for a rule (before, Envoy's
/// decisions failed without a trace in `tollgate_store_errors_total`).
#[tokio::test]
async fn a_store_error_on_asks_is_counted() {
    let store = Arc::new(MemoryStore::new());
    let mut registry = Registry::with_prefix("tollgate");
    let engine = Engine::builder(store.clone(), Rules::default()).build(&mut registry);
    let two = Limit::per_hour(2).build().unwrap();
    let asks = [Ask { check: Check::new(b"a", &two, 3).scoped("envoy"), shadow: false }];
    assert!(engine.admit_asks(Frontend::Grpc, &*store, &asks, false).await.is_err());
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(text.contains("tollgate_store_errors_total{kind=\"request\"} 1\n"), "{text}");
}
