//! A live rate change keeps what was spent (issue 40 item 2): a key's state written under one
//! limit and read under another of the same algorithm (a rules reload, an ad-hoc call with new
//! parameters, `CL.THROTTLE` with new numbers) counts the units spent under the old limit against
//! the new one, at once: raising a limit grants the difference now, lowering it never refunds.

use proptest::prelude::*;
use tollgate_core::{Algorithm, Limit, State};

/// An instant aligned to every generated period.
const ORIGIN: u64 = 1_700_000_000_000_000_000;

/// Two limits of one algorithm: any count and burst, and for the window family the same period
/// and slices (a window's count is what it spent; another period is another window).
fn two_limits() -> impl Strategy<Value = (Limit, Limit)> {
    let algorithm = proptest::sample::select(Algorithm::ALL.to_vec());
    (algorithm, 1u64..=6, 40u64..=3000, (1u64..=40, 1u64..=40, 1u64..=40, 1u64..=40), 1u64..=4, 1u64..=100).prop_map(
        |(algorithm, slices, unit, (count_a, count_b, burst_a, burst_b), periods_a, periods_b)| {
            let build = |count: u64, burst: u64, periods: u64| {
                let mut builder = Limit::builder(count, std::time::Duration::from_nanos(slices * unit * periods))
                    .algorithm(algorithm);
                if algorithm.is_bucket() {
                    builder = builder.burst(burst);
                } else {
                    // The window family keeps its period: another one is another window.
                    builder =
                        Limit::builder(count, std::time::Duration::from_nanos(slices * unit)).algorithm(algorithm);
                }
                if algorithm == Algorithm::SubWindow {
                    builder = builder.slices(slices);
                }
                builder.build().expect("generated limits are valid")
            };
            (build(count_a, burst_a, periods_a), build(count_b, burst_b, periods_b))
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    /// `k` units spent under `a`, then at the same instant under `b`: `b`'s capacity less `k` is
    /// left (nothing if `k` is more), exactly that much is admitted, and nothing more.
    #[test]
    fn a_rate_change_counts_what_was_spent_against_the_new_limit((a, b) in two_limits(), spent in 1u64..=40, gap in 0u64..1000) {
        let k = spent.min(a.capacity());
        let mut state = State::idle(&a);
        let t = ORIGIN + gap;
        prop_assert!(state.check(t, &a, k).unwrap().allowed);
        let left = b.capacity().saturating_sub(k);
        let peek = state.clone().check(t, &b, 0).unwrap();
        prop_assert_eq!(peek.remaining, left, "{} spent under {}, read under {}", k, a, b);
        if left > 0 {
            let mut taken = state.clone();
            prop_assert!(taken.check(t, &b, left).unwrap().allowed, "{} left under {}", left, b);
            prop_assert!(!taken.check(t, &b, 1).unwrap().allowed, "only {} left under {}", left, b);
        } else {
            prop_assert!(!state.clone().check(t, &b, 1).unwrap().allowed, "lowering {} to {} refunds nothing", a, b);
        }
    }
}

/// redis-cell #54: one request spent under "1 per minute, no burst", then the key raised to
/// 11 at once and 100 a second is admitted at once, not 60 s later.
#[test]
fn a_raised_limit_applies_at_once() {
    for algorithm in [Algorithm::Gcra, Algorithm::TokenBucket, Algorithm::LeakyBucket] {
        let minute =
            Limit::builder(1, std::time::Duration::from_secs(60)).burst(1).algorithm(algorithm).build().unwrap();
        let raised =
            Limit::builder(100, std::time::Duration::from_secs(1)).burst(11).algorithm(algorithm).build().unwrap();
        let mut state = State::idle(&minute);
        assert!(state.check(ORIGIN, &minute, 1).unwrap().allowed);
        assert!(!state.check(ORIGIN, &minute, 1).unwrap().allowed);
        let d = state.check(ORIGIN, &raised, 1).unwrap();
        assert!(d.allowed, "{algorithm}: the raised limit admits at once: {d:?}");
        assert_eq!(d.remaining, 9, "{algorithm}: 11 less the two spent");
    }
}

/// Two bucket limits' counts and bursts (`count_a, count_b, burst_a, burst_b`).
fn two_buckets() -> impl Strategy<Value = (u64, u64, u64, u64)> {
    (1u64..=20, 1u64..=20, 1u64..=25, 1u64..=25)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1_000))]

    /// `retry_after` is "how long until this same request would be admitted if nothing else
    /// happens", also for a refusal under another rate than the key's state was written in: the
    /// refusal rewrites the state in the new rate (it no longer drains at the old one), so the
    /// same request is refused 1 ns before the retry it announced and admitted at it.
    #[test]
    fn a_refusal_under_another_rate_keeps_its_retry_after((count_a, count_b, burst_a, burst_b) in two_buckets(), spent in 1u64..=25, cost in 1u64..=25, gap in 0u64..1000) {
        for algorithm in [Algorithm::Gcra, Algorithm::TokenBucket, Algorithm::LeakyBucket] {
            // One period for both: another count is another rate.
            let build = |count: u64, burst: u64| {
                Limit::builder(count, std::time::Duration::from_nanos(27_720)).algorithm(algorithm).burst(burst).build().unwrap()
            };
            let (a, b) = (build(count_a, burst_a), build(count_b, burst_b));
            let (spent, cost) = (spent.min(a.capacity()), cost.min(b.capacity()));
            let mut state = State::idle(&a);
            prop_assert!(state.check(ORIGIN, &a, spent).unwrap().allowed);
            let at = ORIGIN + gap;
            let refused = state.check(at, &b, cost).unwrap();
            if refused.allowed {
                continue;
            }
            let retry = refused.retry_after_ns;
            let before = state.clone().check(at + retry - 1, &b, cost).unwrap();
            prop_assert!(!before.allowed, "{}: {} spent under {}, {} under {} refused for {} ns, admitted {} ns early", algorithm, spent, a, cost, b, retry, retry - before.retry_after_ns.min(retry));
            prop_assert!(state.check(at + retry, &b, cost).unwrap().allowed, "{}: admitted at its retry", algorithm);
        }
    }
}
