//! Store-level cases, table-driven with explicit instants: what the shared traces cannot say
//! (several keys at once, reset, per-key limits, errors, holds), for every algorithm.

use std::sync::Arc;

use tollgate_core::{Algorithm, Limit, LimitBuilder, ManualClock};

use crate::{Check, Refund, Store, StoreError};

const SEC: u64 = 1_000_000_000;
/// An epoch-aligned instant, so window seams are where the cases expect them.
const T0: u64 = 1_700_000_000 * SEC;

/// One step of a case.
#[derive(Debug, Clone)]
pub enum Step {
    /// Set the clock.
    At(u64),
    /// `check(key, limit, cost)` must answer (allowed, remaining).
    Check(&'static str, Limit, u64, (bool, u64)),
    /// `check(key, limit, cost)` must fail because the cost exceeds the capacity.
    CostError(&'static str, Limit, u64),
    /// `check_all` must answer these (allowed, remaining), in order.
    CheckAll(Vec<(&'static str, Limit, u64)>, Vec<(bool, u64)>),
    /// `reset(key, limit)`.
    Reset(&'static str, Limit),
    /// `reserve` a check of this cost (it must be admitted), then `refund` it: a peek must then
    /// answer what it answered before.
    ReserveThenRefund(&'static str, Limit, u64),
    /// `carry(key, from, to)` must answer this many units carried.
    Carry(&'static str, Limit, Limit, u64),
    /// `hold(key, ns)`.
    Hold(&'static str, u64),
    /// `reserve` of these checks, each asking for its hold or not, must answer these (allowed,
    /// remaining) in order, and the checks a hold denied with the rest of the hold (ns).
    Held(Vec<(&'static str, Limit, u64, bool)>, Vec<(bool, u64)>, Vec<(usize, u64)>),
    /// `held` of these keys (under this limit) must answer the rest of each one's hold.
    HoldLeft(Vec<&'static str>, Limit, Vec<Option<u64>>),
}

/// A named list of steps.
#[derive(Debug, Clone)]
pub struct Case {
    /// What the case shows.
    pub name: String,
    /// The steps, from a fresh store.
    pub steps: Vec<Step>,
}

fn limit(algorithm: Algorithm, text: &str) -> Limit {
    text.parse::<LimitBuilder>().expect("limit text").algorithm(algorithm).build().expect("valid limit")
}

/// Every case, for every algorithm.
#[must_use]
pub fn all() -> Vec<Case> {
    use Step::{At, Carry, Check, CheckAll, CostError, Held, Hold, HoldLeft, ReserveThenRefund, Reset};
    let mut cases = Vec::new();
    for &a in &Algorithm::ALL {
        let three = limit(a, "3/s");
        let fixed_one = limit(Algorithm::FixedWindow, "1/s");
        let other = if a == Algorithm::Gcra { Algorithm::SlidingLog } else { Algorithm::Gcra };
        let mut case = |name: &str, steps: Vec<Step>| cases.push(Case { name: format!("{a}: {name}"), steps });
        case(
            "a peek reports without consuming and creates no state",
            vec![
                At(T0),
                Check("k", three.clone(), 0, (true, 3)),
                Check("k", three.clone(), 3, (true, 0)),
                Check("k", three.clone(), 0, (true, 0)),
                Check("k", three.clone(), 1, (false, 0)),
            ],
        );
        case(
            "reset makes a key idle",
            vec![
                At(T0),
                Check("k", three.clone(), 3, (true, 0)),
                Reset("k", three.clone()),
                Check("k", three.clone(), 1, (true, 2)),
            ],
        );
        case(
            "a cost above the capacity is an error and consumes nothing",
            vec![At(T0), CostError("k", three.clone(), 4), Check("k", three.clone(), 1, (true, 2))],
        );
        case(
            "check_all admits only if every limit does, and then consumes from all",
            vec![
                At(T0),
                CheckAll(vec![("a", three.clone(), 2), ("b", fixed_one.clone(), 1)], vec![(true, 1), (true, 0)]),
                CheckAll(vec![("a", three.clone(), 1), ("b", fixed_one.clone(), 1)], vec![(true, 1), (false, 0)]),
                Check("a", three.clone(), 0, (true, 1)),
            ],
        );
        case(
            "check_all naming a key twice sees its own first check",
            vec![
                At(T0),
                CheckAll(vec![("k", three.clone(), 2), ("k", three.clone(), 1)], vec![(true, 1), (true, 0)]),
                CheckAll(vec![("k", three.clone(), 1), ("j", three.clone(), 1)], vec![(false, 0), (true, 3)]),
                Check("j", three.clone(), 0, (true, 3)),
            ],
        );
        case(
            "each key has its own limit",
            vec![
                At(T0),
                Check("x", limit(a, "1/s"), 1, (true, 0)),
                Check("y", limit(a, "5/s"), 1, (true, 4)),
                Check("x", limit(a, "1/s"), 1, (false, 0)),
            ],
        );
        case(
            "one key under two algorithms has two states",
            vec![At(T0), Check("k", three.clone(), 3, (true, 0)), Check("k", limit(other, "3/s"), 1, (true, 2))],
        );
        case(
            "a reservation refunded at once is given back",
            vec![
                At(T0),
                Check("k", three.clone(), 1, (true, 2)),
                ReserveThenRefund("k", three.clone(), 2),
                Check("k", three.clone(), 2, (true, 0)),
            ],
        );
        for &b in Algorithm::ALL.iter().filter(|&&b| b != a) {
            let to = limit(b, "3/s");
            case(
                &format!("a carry to {b} keeps what was used, once, and leaves no old state"),
                vec![
                    At(T0),
                    Check("k", three.clone(), 2, (true, 1)),
                    Carry("k", three.clone(), to.clone(), 2),
                    Check("k", to.clone(), 1, (true, 0)),
                    Check("k", to.clone(), 1, (false, 0)),
                    Carry("k", three.clone(), to.clone(), 0),
                    Check("k", three.clone(), 0, (true, 3)),
                    Carry("idle", three.clone(), to.clone(), 0),
                    Check("idle", to.clone(), 0, (true, 3)),
                ],
            );
        }
        case(
            "a hold denies the checks asking for it until it ends, charging nothing anywhere",
            vec![
                At(T0),
                Check("k", three.clone(), 1, (true, 2)),
                Hold("k", 2 * SEC),
                Held(vec![("k", three.clone(), 1, true)], vec![(false, 0)], vec![(0, 2 * SEC)]),
                // A check not asking for it is decided by its limit; nothing was consumed.
                Held(vec![("k", three.clone(), 0, false)], vec![(true, 2)], vec![]),
                // A shorter hold leaves the longer one.
                Hold("k", SEC / 2),
                At(T0 + SEC / 4),
                Held(
                    vec![("j", three.clone(), 1, false), ("k", three.clone(), 1, true)],
                    vec![(true, 3), (false, 0)],
                    vec![(1, 2 * SEC - SEC / 4)],
                ),
                Check("j", three.clone(), 0, (true, 3)),
                HoldLeft(vec!["j", "k"], three.clone(), vec![None, Some(2 * SEC - SEC / 4)]),
                Check("other", three.clone(), 0, (true, 3)),
                Held(vec![("other", three.clone(), 1, true)], vec![(true, 2)], vec![]),
                At(T0 + 2 * SEC),
                HoldLeft(vec!["k"], three.clone(), vec![None]),
                Held(vec![("k", three.clone(), 1, true)], vec![(true, 2)], vec![]),
            ],
        );
        case(
            "reset ends a hold",
            vec![
                At(T0),
                Hold("k", 60 * SEC),
                Held(vec![("k", three.clone(), 1, true)], vec![(false, 0)], vec![(0, 60 * SEC)]),
                Reset("k", three.clone()),
                Held(vec![("k", three.clone(), 1, true)], vec![(true, 2)], vec![]),
            ],
        );
        case(
            "a clock going backwards never over-grants",
            vec![
                At(T0 + SEC / 2),
                Check("k", three.clone(), 3, (true, 0)),
                At(T0),
                Check("k", three.clone(), 1, (false, 0)),
            ],
        );
    }
    cases
}

/// Runs every case against a fresh store from `make`.
pub async fn run_all<S: Store>(make: &impl Fn(Arc<ManualClock>) -> S) {
    for case in all() {
        let clock = Arc::new(ManualClock::new(T0));
        let store = make(clock.clone());
        run(&store, &clock, &case, &case.name.replace([' ', ':'], "-")).await;
    }
    let store = make(Arc::new(ManualClock::new(T0)));
    assert_eq!(store.check_all(&[]).await, Err(StoreError::NoChecks), "check_all of nothing");
}

/// Runs one case; keys are prefixed with `namespace` as a hash tag (`{namespace}:k`), so that
/// a case's keys share one Redis Cluster slot and its multi-key checks can be atomic there.
pub async fn run<S: Store>(store: &S, clock: &ManualClock, case: &Case, namespace: &str) {
    let key = |k: &str| format!("{{{namespace}}}:{k}");
    for (i, step) in case.steps.iter().enumerate() {
        let at = format!("{} (step {}: {step:?})", case.name, i + 1);
        match step {
            Step::At(t) => clock.set(*t),
            Step::Check(k, limit, cost, (allowed, remaining)) => {
                let d = store.check(key(k).as_bytes(), limit, *cost).await.unwrap_or_else(|e| panic!("{at}: {e}"));
                assert_eq!((d.allowed, d.remaining), (*allowed, *remaining), "{at}: got {d:?}");
            }
            Step::CostError(k, limit, cost) => {
                let result = store.check(key(k).as_bytes(), limit, *cost).await;
                assert!(
                    matches!(result, Err(StoreError::Limit(tollgate_core::Error::CostExceedsCapacity { .. }))),
                    "{at}: got {result:?}"
                );
            }
            Step::CheckAll(checks, expected) => {
                let keys: Vec<String> = checks.iter().map(|(k, _, _)| key(k)).collect();
                let checks: Vec<Check<'_>> = checks
                    .iter()
                    .zip(&keys)
                    .map(|((_, limit, cost), key)| Check::new(key.as_bytes(), limit, *cost))
                    .collect();
                let got = store.check_all(&checks).await.unwrap_or_else(|e| panic!("{at}: {e}"));
                let got: Vec<(bool, u64)> = got.iter().map(|d| (d.allowed, d.remaining)).collect();
                assert_eq!(&got, expected, "{at}");
            }
            Step::Reset(k, limit) => {
                store.reset("", key(k).as_bytes(), limit).await.unwrap_or_else(|e| panic!("{at}: {e}"))
            }
            Step::Carry(k, from, to, units) => {
                let carried =
                    store.carry("", key(k).as_bytes(), from, to).await.unwrap_or_else(|e| panic!("{at}: {e}"));
                assert_eq!(carried, *units, "{at}");
            }
            Step::Hold(k, ns) => store.hold("", key(k).as_bytes(), *ns).await.unwrap_or_else(|e| panic!("{at}: {e}")),
            Step::Held(checks, expected, held) => {
                let keys: Vec<String> = checks.iter().map(|(k, ..)| key(k)).collect();
                let checks: Vec<Check<'_>> = checks
                    .iter()
                    .zip(&keys)
                    .map(|((_, limit, cost, hold), key)| {
                        let check = Check::new(key.as_bytes(), limit, *cost);
                        if *hold { check.with_hold() } else { check }
                    })
                    .collect();
                let got = store.reserve(&checks).await.unwrap_or_else(|e| panic!("{at}: {e}"));
                let decided: Vec<(bool, u64)> = got.decisions.iter().map(|d| (d.allowed, d.remaining)).collect();
                assert_eq!(&decided, expected, "{at}");
                let rest: Vec<(usize, u64)> = got.held.iter().map(|&i| (i, got.decisions[i].retry_after_ns)).collect();
                assert_eq!(&rest, held, "{at}");
                for &(i, left) in held {
                    assert_eq!(got.decisions[i].reset_after_ns, left, "{at}: the hold's reset");
                }
            }
            Step::HoldLeft(keys, limit, expected) => {
                let keys: Vec<String> = keys.iter().map(|k| key(k)).collect();
                let checks: Vec<Check<'_>> = keys.iter().map(|k| Check::new(k.as_bytes(), limit, 1)).collect();
                let left = store.held(&checks).await.unwrap_or_else(|e| panic!("{at}: {e}"));
                assert_eq!(&left, expected, "{at}");
            }
            Step::ReserveThenRefund(k, limit, cost) => {
                let key = key(k);
                let before = store.check(key.as_bytes(), limit, 0).await.unwrap_or_else(|e| panic!("{at}: {e}"));
                let check = Check::new(key.as_bytes(), limit, *cost);
                let reserved = store.reserve(&[check]).await.unwrap_or_else(|e| panic!("{at}: {e}"));
                assert!(reserved.decisions[0].allowed, "{at}: not admitted");
                let refund = Refund { check, at: reserved.at, decision: reserved.decisions[0] };
                store.refund(&[refund]).await.unwrap_or_else(|e| panic!("{at}: {e}"));
                let after = store.check(key.as_bytes(), limit, 0).await.unwrap_or_else(|e| panic!("{at}: {e}"));
                assert_eq!(after.remaining, before.remaining, "{at}: not given back");
            }
        }
    }
}
