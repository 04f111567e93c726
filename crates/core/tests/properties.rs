//! Property tests over arbitrary limits and traces:
//! - token bucket and leaky bucket meter make exactly GCRA's decisions;
//! - no algorithm admits more than its bound in any window of its definition;
//! - `remaining`, `retry_after` and `reset_after` mean what `docs/SEMANTICS.md` says;
//! - a peek or a denial never changes state;
//! - a charge that fits is exactly an admission, and one that does not puts the key in debt;
//! - a state rebuilt from a snapshot never admits what the original would not;
//! - a refund right after a reservation undoes it, and a refund never leaves a state looser than
//!   one that never had the reservation;
//! - no input whatsoever makes a decision or a charge panic.

use proptest::prelude::*;
use tollgate_core::algorithm::{Gcra, LeakyBucket, RateState, TokenBucket};
use tollgate_core::{Algorithm, Decision, Limit, Snapshot, State};

/// An instant far from the epoch and from `u64::MAX`, aligned to every generated period.
const ORIGIN: u64 = 1_700_000_000_000_000_000;

/// A valid limit with small numbers, so that rounding (`T = ceil(period/count)`) and seams are hit
/// often. `period = slices * unit` so the sub-window counter's divisibility rule always holds.
fn limit_strategy(algorithms: &'static [Algorithm]) -> impl Strategy<Value = Limit> {
    (proptest::sample::select(algorithms), 1u64..=20, 1u64..=6, 20u64..=3000, 1u64..=25).prop_map(
        |(algorithm, count, slices, unit, burst)| {
            let mut builder =
                Limit::builder(count, std::time::Duration::from_nanos(slices * unit)).algorithm(algorithm);
            if algorithm.is_bucket() {
                builder = builder.burst(burst);
            }
            if algorithm == Algorithm::SubWindow {
                builder = builder.slices(slices);
            }
            builder.build().expect("generated limits are valid")
        },
    )
}

/// Requests as (gap since the previous request in ns, cost), with many simultaneous arrivals and
/// unit costs, and gaps up to three periods.
fn trace_strategy(limit: &Limit) -> impl Strategy<Value = Vec<(u64, u64)>> + use<> {
    let period = limit.period_ns();
    let capacity = limit.capacity();
    let gap = prop_oneof![3 => Just(0u64), 4 => 0..=period / 4 + 1, 1 => 0..=3 * period];
    let cost = prop_oneof![6 => Just(1u64), 1 => Just(0u64), 2 => 0..=capacity];
    proptest::collection::vec((gap, cost), 1..120)
}

fn limit_and_trace(algorithms: &'static [Algorithm]) -> impl Strategy<Value = (Limit, Vec<(u64, u64)>)> {
    limit_strategy(algorithms).prop_flat_map(|limit| {
        let trace = trace_strategy(&limit);
        (Just(limit), trace)
    })
}

/// Replays a trace; returns every (time, cost, decision).
fn run(limit: &Limit, trace: &[(u64, u64)]) -> Vec<(u64, u64, Decision)> {
    let mut state = State::idle(limit);
    let mut now = ORIGIN;
    trace
        .iter()
        .map(|&(gap, cost)| {
            now += gap;
            (now, cost, state.check(now, limit, cost).expect("valid cost"))
        })
        .collect()
}

fn admitted(outcomes: &[(u64, u64, Decision)]) -> Vec<(u64, u64)> {
    outcomes.iter().filter(|(_, cost, d)| d.allowed && *cost > 0).map(|&(t, cost, _)| (t, cost)).collect()
}

const BUCKETS: &[Algorithm] = &[Algorithm::Gcra, Algorithm::TokenBucket, Algorithm::LeakyBucket];

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    /// docs/SEMANTICS.md: token bucket and leaky bucket meter "must make exactly the same decisions as
    /// GCRA for every trace" — every field of every decision.
    #[test]
    fn token_and_leaky_bucket_decide_exactly_like_gcra((limit, trace) in limit_and_trace(&[Algorithm::Gcra])) {
        let token = limit.to_builder().algorithm(Algorithm::TokenBucket).build().unwrap();
        let leaky = limit.to_builder().algorithm(Algorithm::LeakyBucket).build().unwrap();
        let (mut g, mut tb, mut lb) = (Gcra::idle(&limit), TokenBucket::idle(&token), LeakyBucket::idle(&leaky));
        let mut now = ORIGIN;
        for (i, &(gap, cost)) in trace.iter().enumerate() {
            now += gap;
            let want = g.check(now, &limit, cost).unwrap();
            prop_assert_eq!(tb.check(now, &token, cost).unwrap(), want, "token bucket, request {}", i);
            prop_assert_eq!(lb.check(now, &leaky, cost).unwrap(), want, "leaky bucket, request {}", i);
        }
    }

    /// The three buckets stay one schedule in every case: clocks going backwards and charges
    /// (debt) included, every field of every decision.
    #[test]
    fn buckets_agree_under_charges_and_backward_clocks(
        (limit, trace) in limit_and_trace(&[Algorithm::Gcra]),
        ops in proptest::collection::vec((0u64..3, prop_oneof![Just(0u64), 0u64..2_000_000]), 120),
    ) {
        let variants: Vec<Limit> = BUCKETS.iter().map(|&a| limit.to_builder().algorithm(a).build().unwrap()).collect();
        let mut states: Vec<State> = variants.iter().map(State::idle).collect();
        let mut latest = ORIGIN;
        for (i, &(gap, cost)) in trace.iter().enumerate() {
            latest += gap;
            let (op, back) = ops[i];
            let now = latest - back;
            if op == 0 {
                for (state, l) in states.iter_mut().zip(&variants) {
                    state.charge(now, l, cost * 3).unwrap();
                }
            }
            let decisions: Vec<Decision> =
                states.iter_mut().zip(&variants).map(|(s, l)| s.check(now, l, cost).unwrap()).collect();
            prop_assert_eq!(decisions[1], decisions[0], "token bucket, request {}", i);
            prop_assert_eq!(decisions[2], decisions[0], "leaky bucket, request {}", i);
            let snapshots: Vec<Snapshot> = states.iter().zip(&variants).map(|(s, l)| s.snapshot(latest, l)).collect();
            prop_assert_eq!(snapshots[1], snapshots[0]);
            prop_assert_eq!(snapshots[2], snapshots[0]);
        }
    }

    /// A charge that fits is exactly an admission (same state); one that does not fit leaves
    /// nothing for a unit request, whatever the algorithm.
    #[test]
    fn a_charge_is_an_admission_that_ignores_the_limit(
        (limit, trace) in limit_and_trace(&Algorithm::ALL),
        over in 1u64..5,
    ) {
        let mut state = State::idle(&limit);
        let mut now = ORIGIN;
        for &(gap, cost) in &trace {
            now += gap;
            let mut admitted = state.clone();
            let mut charged = state.clone();
            if admitted.check(now, &limit, cost).unwrap().allowed {
                charged.charge(now, &limit, cost).unwrap();
                prop_assert_eq!(&charged, &admitted, "a charge of {} that fits", cost);
            } else {
                let room = state.check(now, &limit, 0).unwrap().remaining;
                charged.charge(now, &limit, room + over).unwrap();
                prop_assert!(!charged.check(now, &limit, 1).unwrap().allowed, "room left after a charge beyond it");
            }
            state = admitted;
        }
    }

    /// A state rebuilt from a snapshot (what a node keeps of a remote store's answers) decides at
    /// least as strictly as the original from then on: exactly like it for the buckets, the fixed
    /// window and the sliding window counter.
    #[test]
    fn rebuilt_states_are_never_looser(
        (limit, trace) in limit_and_trace(&Algorithm::ALL),
        split in 0usize..120,
        debt in prop_oneof![Just(0u64), 0u64..40],
    ) {
        let exact = !matches!(limit.algorithm(), Algorithm::SlidingLog | Algorithm::SubWindow);
        let split = split % trace.len();
        let mut original = State::idle(&limit);
        let mut now = ORIGIN;
        for &(gap, cost) in &trace[..split] {
            now += gap;
            original.check(now, &limit, cost).unwrap();
        }
        original.charge(now, &limit, debt).unwrap();
        let snapshot = original.snapshot(now, &limit);
        let mut rebuilt = State::from_snapshot(&limit, &snapshot);
        prop_assert_eq!(snapshot.idle_at(&limit), rebuilt.idle_at(&limit), "idle_at without rebuilding");
        for (i, &(gap, cost)) in trace[split..].iter().enumerate() {
            now += gap;
            let room = (rebuilt.check(now, &limit, 0).unwrap(), original.check(now, &limit, 0).unwrap());
            let mine = rebuilt.check(now, &limit, cost).unwrap();
            let theirs = original.clone().check(now, &limit, cost).unwrap();
            if exact {
                prop_assert_eq!(mine, theirs, "request {} after the snapshot", i);
            } else {
                prop_assert!(!mine.allowed || theirs.allowed, "rebuilt admitted request {} the original denies", i);
                prop_assert!(room.0.remaining <= room.1.remaining, "more room after request {}", i);
            }
            // Both record what the rebuilt state admitted.
            if mine.allowed {
                original.charge(now, &limit, cost).unwrap();
            }
        }
    }

    /// A reservation refunded at once leaves a state that decides every later request exactly as
    /// if it had never been made.
    #[test]
    fn a_refund_right_after_a_reservation_undoes_it(
        (limit, trace) in limit_and_trace(&Algorithm::ALL),
        split in 0usize..120,
    ) {
        let split = split % trace.len();
        let mut state = State::idle(&limit);
        let mut now = ORIGIN;
        for &(gap, cost) in &trace[..split] {
            now += gap;
            state.check(now, &limit, cost).unwrap();
        }
        let before = state.clone();
        let cost = trace[split].1.max(1);
        let decision = state.check(now, &limit, cost).unwrap();
        state.refund(now, &decision, &limit, cost);
        let (mut refunded, mut never) = (state, before);
        for (i, &(gap, cost)) in trace[split..].iter().enumerate() {
            now += gap;
            prop_assert_eq!(refunded.check(now, &limit, cost).unwrap(), never.check(now, &limit, cost).unwrap(), "request {} after", i);
        }
    }

    /// A reservation refunded after other requests were decided: the state never admits what a
    /// state that never had the reservation (and saw the same admissions) would not.
    #[test]
    fn a_refund_never_leaves_a_state_looser_than_without_the_reservation(
        (limit, trace) in limit_and_trace(&Algorithm::ALL),
        split in 0usize..120,
        refund_after in 0usize..20,
    ) {
        let split = split % trace.len();
        let mut state = State::idle(&limit);
        let mut now = ORIGIN;
        for &(gap, cost) in &trace[..split] {
            now += gap;
            state.check(now, &limit, cost).unwrap();
        }
        let mut never = state.clone();
        let (reserved_at, cost) = (now, trace[split].1.max(1));
        let reservation = state.check(now, &limit, cost).unwrap();
        let rest = &trace[split + 1..];
        let refund_at = refund_after.min(rest.len());
        for (i, &(gap, cost)) in rest.iter().enumerate() {
            if i == refund_at {
                state.refund(reserved_at, &reservation, &limit, trace[split].1.max(1));
            }
            now += gap;
            let mine = state.check(now, &limit, cost).unwrap();
            let theirs = never.clone().check(now, &limit, cost).unwrap();
            prop_assert!(!mine.allowed || theirs.allowed || i < refund_at, "admitted request {} the state without the reservation denies", i);
            if mine.allowed {
                never.charge(now, &limit, cost).unwrap();
            }
        }
    }

    /// Bucket family: at most `burst + floor(L/T)` cost units in any closed interval of length L.
    #[test]
    fn buckets_never_exceed_burst_plus_refill((limit, trace) in limit_and_trace(BUCKETS)) {
        let granted = admitted(&run(&limit, &trace));
        let t = limit.emission_interval_ns();
        for (i, &(start, _)) in granted.iter().enumerate() {
            let mut total = 0;
            for &(end, cost) in &granted[i..] {
                total += cost;
                let bound = limit.burst() + (end - start) / t;
                prop_assert!(total <= bound, "{} units in [{}, {}] > bound {}", total, start, end, bound);
            }
        }
    }

    /// Fixed window: at most `count` per epoch-aligned window.
    #[test]
    fn fixed_window_never_exceeds_count_per_window((limit, trace) in limit_and_trace(&[Algorithm::FixedWindow])) {
        let mut per_window = std::collections::HashMap::<u64, u64>::new();
        for (t, cost) in admitted(&run(&limit, &trace)) {
            let used = per_window.entry(t / limit.period_ns()).or_default();
            *used += cost;
            prop_assert!(*used <= limit.count());
        }
    }

    /// Sliding log: at most `count` in every window `(t - period, t]`.
    #[test]
    fn sliding_log_never_exceeds_count_in_any_window((limit, trace) in limit_and_trace(&[Algorithm::SlidingLog])) {
        let granted = admitted(&run(&limit, &trace));
        for &(end, _) in &granted {
            let total: u64 = granted.iter().filter(|(t, _)| *t <= end && *t + limit.period_ns() > end).map(|(_, c)| c).sum();
            prop_assert!(total <= limit.count(), "{} in the period ending {}", total, end);
        }
    }

    /// Sub-window counter: at most `count` in any `slices` consecutive slices.
    #[test]
    fn sub_window_never_exceeds_count_in_any_slice_run((limit, trace) in limit_and_trace(&[Algorithm::SubWindow])) {
        let slice = limit.period_ns() / limit.slices();
        let granted = admitted(&run(&limit, &trace));
        for &(end, _) in &granted {
            let last = end / slice;
            let total: u64 = granted.iter().filter(|(t, _)| t / slice <= last && t / slice + limit.slices() > last).map(|(_, c)| c).sum();
            prop_assert!(total <= limit.count(), "{} in the {} slices ending at slice {}", total, limit.slices(), last);
        }
    }

    /// Sliding window counter: at every admission, Cloudflare's estimate recomputed from the
    /// admitted requests alone is at most `count` (so also at most `count` per aligned window).
    #[test]
    fn sliding_window_estimate_never_exceeds_count((limit, trace) in limit_and_trace(&[Algorithm::SlidingWindow])) {
        let period = limit.period_ns();
        let granted = admitted(&run(&limit, &trace));
        for (i, &(now, _)) in granted.iter().enumerate() {
            let window = now / period;
            let sum_in = |w: u64| -> u64 { granted[..=i].iter().filter(|(t, _)| t / period == w).map(|(_, c)| c).sum() };
            let curr = sum_in(window);
            let prev = if window == 0 { 0 } else { sum_in(window - 1) };
            let e = now % period;
            prop_assert!(
                u128::from(prev) * u128::from(period - e) + u128::from(curr) * u128::from(period)
                    <= u128::from(limit.count()) * u128::from(period),
                "estimate above {} at {}: prev {}, curr {}, e {}", limit.count(), now, prev, curr, e
            );
        }
    }

    /// `remaining` is exactly how many unit requests would be admitted right now; a denial's
    /// `retry_after` is the exact earliest instant the same request is admitted; a peek or a denial
    /// leaves the state untouched; `reset_after` leads back to the idle state's answers.
    #[test]
    fn decisions_mean_what_they_say((limit, trace) in limit_and_trace(&Algorithm::ALL)) {
        let mut state = State::idle(&limit);
        let mut now = ORIGIN;
        for &(gap, cost) in &trace {
            now += gap;
            let before = state.clone();
            let decision = state.check(now, &limit, cost).unwrap();
            prop_assert_eq!(decision.limit, limit.capacity());
            if !decision.allowed || cost == 0 {
                prop_assert_eq!(&state, &before, "a peek or denial changed the state");
            }
            if decision.allowed {
                prop_assert_eq!(decision.retry_after_ns, 0);
            }

            let mut probe = state.clone();
            for k in 0..decision.remaining {
                prop_assert!(probe.check(now, &limit, 1).unwrap().allowed, "unit request {} of remaining {} denied", k + 1, decision.remaining);
            }
            prop_assert!(!probe.check(now, &limit, 1).unwrap().allowed, "more than remaining = {} admitted", decision.remaining);

            if !decision.allowed {
                let retry = now + decision.retry_after_ns;
                prop_assert!(before.clone().check(retry, &limit, cost).unwrap().allowed, "denied again after retry_after");
                prop_assert!(decision.retry_after_ns > 0);
                prop_assert!(!before.clone().check(retry - 1, &limit, cost).unwrap().allowed, "retry_after is not the earliest instant");
            }

            let reset = now + decision.reset_after_ns;
            let idle = State::idle(&limit);
            for probe_cost in [0, 1, limit.capacity()] {
                prop_assert_eq!(
                    state.clone().check(reset, &limit, probe_cost).unwrap(),
                    idle.clone().check(reset, &limit, probe_cost).unwrap(),
                    "not idle after reset_after (cost {})", probe_cost
                );
            }
        }
    }

    /// A peek (cost 0) reports without changing anything, whatever the state.
    #[test]
    fn peek_never_changes_state((limit, trace) in limit_and_trace(&Algorithm::ALL), extra in 0u64..10_000) {
        let mut state = State::idle(&limit);
        let mut now = ORIGIN;
        for &(gap, cost) in &trace {
            now += gap;
            state.check(now, &limit, cost).unwrap();
            let before = state.clone();
            let peek = state.check(now + extra, &limit, 0).unwrap();
            prop_assert_eq!(&state, &before);
            prop_assert_eq!(peek.retry_after_ns, 0);
        }
    }

    /// Any limit parameters, any instants (also backwards, also near `u64::MAX`), any cost:
    /// a decision or an error, never a panic, and never an admission beyond the capacity at one instant.
    #[test]
    fn decisions_never_panic(
        algorithm in proptest::sample::select(&Algorithm::ALL[..]),
        count in prop_oneof![1u64..100, any::<u64>()],
        period in prop_oneof![1u64..1_000_000, any::<u64>()],
        burst in prop_oneof![Just(None), (1u64..100).prop_map(Some), any::<u64>().prop_map(Some)],
        slices in prop_oneof![Just(None), (1u64..100).prop_map(Some), any::<u64>().prop_map(Some)],
        requests in proptest::collection::vec(
            (prop_oneof![any::<u64>(), u64::MAX - 1000..=u64::MAX, 0u64..1000], prop_oneof![0u64..5, any::<u64>()]),
            1..60,
        ),
    ) {
        let mut builder = Limit::builder(count, std::time::Duration::from_nanos(period)).algorithm(algorithm);
        if let Some(burst) = burst.filter(|_| algorithm.is_bucket()) {
            builder = builder.burst(burst);
        }
        if let Some(slices) = slices.filter(|_| algorithm == Algorithm::SubWindow) {
            builder = builder.slices(slices);
        }
        let Ok(limit) = builder.build() else { return Ok(()) };
        let mut state = State::idle(&limit);
        for (now, cost) in requests {
            match state.check(now, &limit, cost) {
                Ok(d) => prop_assert!(d.remaining <= limit.capacity()),
                Err(e) => prop_assert!(!e.to_string().is_empty()),
            }
            if cost % 3 == 0 && state.charge(now, &limit, cost).is_ok() {
                let snapshot = state.snapshot(now, &limit);
                let _ = State::from_snapshot(&limit, &snapshot).check(now, &limit, 1);
            }
        }
    }

    /// A clock that jumps backwards never over-grants: a request at an instant earlier than the
    /// latest one seen is admitted only if it would also be admitted at that latest instant.
    #[test]
    fn backwards_clock_never_over_grants(
        (limit, trace) in limit_and_trace(&Algorithm::ALL),
        back in proptest::collection::vec(prop_oneof![Just(0u64), 0u64..5_000, 0u64..1_000_000_000], 120),
    ) {
        let mut state = State::idle(&limit);
        let mut latest = ORIGIN;
        for (i, &(gap, cost)) in trace.iter().enumerate() {
            latest += gap;
            let now = latest.saturating_sub(back[i]);
            let at_latest = state.clone().check(latest, &limit, cost).unwrap();
            let peek_latest = state.clone().check(latest, &limit, 0).unwrap();
            let peek_now = state.clone().check(now, &limit, 0).unwrap();
            prop_assert!(peek_now.remaining <= peek_latest.remaining, "more room at {} than at the later {}", now, latest);
            let decision = state.check(now, &limit, cost).unwrap();
            prop_assert!(!decision.allowed || at_latest.allowed, "admitted at {} but not at the later {}", now, latest);
        }
    }
}

/// A calendar limit (the fixed window or the sliding window counter; a day, week, month or year of
/// a zone with DST or without), a start between 2026 and 2029 (DST changes, 29 February 2028), and
/// a trace with gaps scaled to the unit's length.
fn calendar_limit_and_trace() -> impl Strategy<Value = (Limit, u64, Vec<(u64, u64)>)> {
    const ZONES: [&str; 4] = ["UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe"];
    let algorithms = proptest::sample::select(&[Algorithm::FixedWindow, Algorithm::SlidingWindow][..]);
    (
        algorithms,
        proptest::sample::select(&tollgate_core::CalendarUnit::ALL[..]),
        proptest::sample::select(&ZONES[..]),
        1u64..=20,
    )
        .prop_flat_map(|(algorithm, unit, zone, count)| {
            let limit =
                Limit::per_calendar(count, unit).algorithm(algorithm).tz(zone).build().expect("a calendar limit");
            let length = unit.longest_ns() / 2;
            let gap = prop_oneof![3 => Just(0u64), 4 => 0..=length / 4 + 1, 1 => 0..=3 * length];
            let cost = prop_oneof![6 => Just(1u64), 1 => Just(0u64), 2 => 0..=count];
            let start = 1_767_225_600_000_000_000u64..1_861_920_000_000_000_000;
            (Just(limit), start, proptest::collection::vec((gap, cost), 1..80))
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Calendar windows: a fixed window admits at most `count` per calendar window; the sliding
    /// window counter's estimate, over the current window's own length, stays at most `count`;
    /// a denial's `retry_after` is the exact earliest instant the request is admitted; after
    /// `reset_after` the key answers as an idle one.
    #[test]
    fn calendar_windows_hold_their_bounds_and_their_answers((limit, start, trace) in calendar_limit_and_trace()) {
        let mut state = State::idle(&limit);
        let mut now = start;
        let mut granted: Vec<(u64, u64)> = Vec::new();
        for &(gap, cost) in &trace {
            now += gap;
            let before = state.clone();
            let d = state.check(now, &limit, cost).unwrap();
            if !d.allowed {
                prop_assert_eq!(&state, &before);
                let mut later = before.clone();
                prop_assert!(later.check(now + d.retry_after_ns, &limit, cost).unwrap().allowed, "{} at {}", limit, now);
                let mut earlier = before.clone();
                prop_assert!(!earlier.check(now + d.retry_after_ns - 1, &limit, cost).unwrap().allowed, "{} at {}", limit, now);
            } else if cost > 0 {
                granted.push((now, cost));
            }
            let idle = State::idle(&limit).check(now + d.reset_after_ns, &limit, 0).unwrap();
            prop_assert_eq!(state.clone().check(now + d.reset_after_ns, &limit, 0).unwrap(), idle);
            let (window, end) = limit.window_at(now);
            let sum = |from: u64, to: u64| -> u64 { granted.iter().filter(|(t, _)| *t >= from && *t < to).map(|(_, c)| c).sum() };
            let curr = sum(window, end);
            if limit.algorithm() == Algorithm::FixedWindow {
                prop_assert!(curr <= limit.count(), "{} in the window from {}", curr, window);
            } else {
                let previous = limit.window_before(window).unwrap();
                let (prev, length, e) = (sum(previous, window), end - window, now - window);
                prop_assert!(
                    u128::from(prev) * u128::from(length - e) + u128::from(curr) * u128::from(length)
                        <= u128::from(limit.count()) * u128::from(length),
                    "{}: estimate above the count at {}: prev {}, curr {}", limit, now, prev, curr
                );
            }
        }
    }
}
