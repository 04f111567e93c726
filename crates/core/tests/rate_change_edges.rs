//! Adversarial review of the live rate change (issue 40 item 2) and the bucket family's debt.

use std::time::Duration;

use proptest::prelude::*;
use tollgate_core::{Algorithm, Limit, State};

const ORIGIN: u64 = 1_700_000_000_000_000_000;
const SEC: u64 = 1_000_000_000;

fn bucket(algorithm: Algorithm, count: u64, period: Duration, burst: u64) -> Limit {
    Limit::builder(count, period).algorithm(algorithm).burst(burst).build().unwrap()
}

/// A debt of 40 days under "1 a second" (a charge: LLM tokens counted from the response), one
/// unit charged under "1 a minute", then one under "1 a second" again: the bound SEMANTICS
/// documents (the review found it as an over-grant; kept as a bound). The slow rate caps the
/// debt at 52 days of its own (74,880 units), which 1 a second pays back in 20.8 hours.
#[test]
fn a_round_trip_through_a_slower_rate_keeps_what_its_cap_leaves() {
    for algorithm in [Algorithm::Gcra, Algorithm::TokenBucket, Algorithm::LeakyBucket] {
        let fast = bucket(algorithm, 1, Duration::from_secs(1), 1);
        let slow = bucket(algorithm, 1, Duration::from_secs(60), 1);
        let mut state = State::idle(&fast);
        state.charge(ORIGIN, &fast, 40 * 86_400).unwrap();
        state.charge(ORIGIN, &slow, 1).unwrap();
        state.charge(ORIGIN, &fast, 1).unwrap();
        let hour = 3_600 * SEC;
        let early = state.check(ORIGIN + 20 * hour, &fast, 1).unwrap();
        let late = state.check(ORIGIN + 22 * hour, &fast, 1).unwrap();
        assert_eq!((early.allowed, late.allowed), (false, true), "{algorithm}: {early:?} {late:?}");
        // 74,880 units (and the last one's) ahead of the origin, 72,000 s of them gone.
        let retry_s = early.retry_after_ns / SEC;
        assert!((2_870..=2_890).contains(&retry_s), "{algorithm}: retry {retry_s} s at 20 h");
    }
}

/// Two bucket limits: counts, bursts, and emission-interval factors (equal factors: only the
/// burst or count changes).
type TwoLimits = (u64, u64, u64, u64, u64, u64);
/// (gap in ns, cost, under the second limit, a charge).
type Step = (u64, u64, bool, bool);

fn interval_trace() -> impl Strategy<Value = (TwoLimits, Vec<Step>)> {
    let limits = (1u64..=20, 1u64..=20, 1u64..=25, 1u64..=25, 1u64..=7, 1u64..=7);
    let step = (
        prop_oneof![2 => Just(0u64), 3 => 0u64..=400, 1 => 0u64..=20_000],
        0u64..=20,
        any::<bool>(),
        proptest::bool::weighted(0.1),
    );
    (limits, proptest::collection::vec(step, 1..80))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3_000))]

    /// The token and leaky buckets decide exactly as GCRA when the key's limit changes between
    /// its requests and charges: its rate (emission interval), its burst, or both.
    #[test]
    fn the_buckets_decide_as_gcra_across_interval_changes(((count_a, count_b, burst_a, burst_b, ta, tb), trace) in interval_trace()) {
        let build = |algorithm: Algorithm, count: u64, t: u64, burst: u64| {
            Limit::builder(count, Duration::from_nanos(t * 13 * count)).algorithm(algorithm).burst(burst).build().unwrap()
        };
        let mut states: Vec<(State, Limit, Limit)> = [Algorithm::Gcra, Algorithm::TokenBucket, Algorithm::LeakyBucket]
            .into_iter()
            .map(|a| { let l = build(a, count_a, ta, burst_a); (State::idle(&l), l, build(a, count_b, tb, burst_b)) })
            .collect();
        let mut now = ORIGIN;
        for (gap, cost, second, charge) in trace {
            now += gap;
            let mut seen = Vec::new();
            for (state, a, b) in &mut states {
                let limit = if second { &*b } else { &*a };
                if charge {
                    state.charge(now, limit, cost).unwrap();
                    seen.push(state.check(now, limit, 0).ok());
                } else {
                    seen.push(state.check(now, limit, cost.min(limit.capacity())).ok());
                }
            }
            prop_assert_eq!(&seen[0], &seen[1], "token bucket at {}", now - ORIGIN);
            prop_assert_eq!(&seen[0], &seen[2], "leaky bucket at {}", now - ORIGIN);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3_000))]

    /// However a key alternates between two bucket limits (checks only, no charge), it admits in
    /// `[start, end]` at most the larger burst plus what the faster rate frees over that time:
    /// alternating never mints allowance past the highest limit.
    #[test]
    fn alternating_rates_admit_no_more_than_the_highest_limit(
        ((count_a, count_b, burst_a, burst_b, ta, tb), trace) in interval_trace(),
        algorithm in proptest::sample::select(vec![Algorithm::Gcra, Algorithm::TokenBucket, Algorithm::LeakyBucket]),
    ) {
        let build = |count: u64, t: u64, burst: u64| {
            Limit::builder(count, Duration::from_nanos(t * 13 * count)).algorithm(algorithm).burst(burst).build().unwrap()
        };
        let (a, b) = (build(count_a, ta, burst_a), build(count_b, tb, burst_b));
        let fastest = a.emission_interval_ns().min(b.emission_interval_ns());
        let burst = a.capacity().max(b.capacity());
        let mut state = State::idle(&a);
        let mut now = ORIGIN;
        let mut admitted = 0u64;
        for (gap, cost, second, _) in trace {
            now += gap;
            let limit = if second { &b } else { &a };
            let cost = cost.min(limit.capacity());
            if state.check(now, limit, cost).unwrap().allowed {
                admitted += cost;
            }
            let bound = burst + (now - ORIGIN) / fastest;
            prop_assert!(admitted <= bound, "{} admitted by {} ns, at most {} under the faster of {} and {}", admitted, now - ORIGIN, bound, a, b);
        }
    }
}
