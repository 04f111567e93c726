//! Two of a key's pending charges as one (the ledger keeps a bounded number per key, merging the
//! oldest pair past that: see `pending`), exactly where that composes:
//! - the bucket family, always: charging `c1` at `a1` then `c2` at `a2` ends the schedule at
//!   `max(tat, a1, a2 − c1·T) + (c1 + c2)·T`, which is one charge of `c1 + c2` at
//!   `max(a1, a2 − c1·T)`;
//! - the window family, when both fall where the algorithm counts them together: one window (fixed
//!   and sliding window counters), one slice (sub-window counter), one instant (sliding log).
//!
//! Exact, the merged charge leaves every state exactly as the pair does, so `local` keeps the
//! limit's rate through an outage of any length. Otherwise the pair is merged at the later
//! instant, which frees capacity no earlier (an under-grant, never an over-grant); with the exact
//! merges that takes more than `MAX_CHARGES` windows (slices, instants) of local admissions in one
//! outage. The merged charge carries the later one's running total, so the remote applies of it
//! only what it had not applied of the pair (see `pending`).

use tollgate_core::{Algorithm, Limit};

use super::pending::Pending;

/// `first` then `second` (in sequence order) as one charge, and whether exactly.
pub(crate) fn merge(limit: &Limit, first: Pending, second: Pending) -> (Pending, bool) {
    let cost = first.cost.saturating_add(second.cost);
    // The running total and sequence of the later; sent when either was, first sent when the
    // earlier of them was.
    let (seq, total) = (first.seq.max(second.seq), first.total.max(second.total));
    let sent_at = match (first.sent_at, second.sent_at) {
        (0, at) | (at, 0) => at,
        (a, b) => a.min(b),
    };
    let later = Pending { at: first.at.max(second.at), cost, seq, total, sent_at };
    let same = |len: u64| len > 0 && first.at / len == second.at / len;
    match limit.algorithm() {
        Algorithm::Gcra | Algorithm::TokenBucket | Algorithm::LeakyBucket => {
            let lead = first.cost.saturating_mul(limit.emission_interval_ns());
            (Pending { at: first.at.max(second.at.saturating_sub(lead)), ..later }, true)
        }
        Algorithm::FixedWindow | Algorithm::SlidingWindow => {
            (later, limit.window_at(first.at).0 == limit.window_at(second.at).0)
        }
        Algorithm::SubWindow => (later, same(limit.period_ns() / limit.slices().max(1))),
        Algorithm::SlidingLog => (later, first.at == second.at),
    }
}

/// The last `cost` units of `charge`, a merge whose earlier charges the remote applied (a reply
/// confirmed them after the merge): for the bucket family exactly what the later charges do once
/// the earlier ones are applied (the merge's instant moved by the earlier ones' cost: one charge of
/// `c1 + c2` at `m` is `c1` at `a1` then `c2` at `m + c1·T`); for the window family at the merge's
/// instant, the latest of its charges' (exact within a window, stricter across).
pub(crate) fn later_part(limit: &Limit, charge: Pending, cost: u64) -> Pending {
    let cost = cost.min(charge.cost);
    let at = if limit.algorithm().is_bucket() {
        charge.at.saturating_add((charge.cost - cost).saturating_mul(limit.emission_interval_ns()))
    } else {
        charge.at
    };
    Pending { at, cost, ..charge }
}

#[cfg(test)]
mod tests {
    use tollgate_core::State;

    use super::*;

    const SEC: u64 = 1_000_000_000;
    const T0: u64 = 1_700_000_000 * SEC;

    /// A small deterministic generator (xorshift).
    struct Rng(u64);
    impl Rng {
        fn pick<T: Copy>(&mut self, of: &[T]) -> T {
            of[usize::try_from(self.below(of.len() as u64)).unwrap_or(0)]
        }

        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n.max(1)
        }
    }

    /// Two charges in two calendar months (Berlin's February and March, an hour apart) are not
    /// one window's, though one 32-day span from the epoch holds both: merged, not exactly.
    #[test]
    fn calendar_charges_merge_exactly_only_within_one_calendar_window() {
        let limit = "5/month".parse::<tollgate_core::LimitBuilder>().unwrap().tz("Europe/Berlin").build().unwrap();
        let february = 1_772_317_800 * SEC; // 2026-02-28T22:30:00Z, 23:30 in Berlin
        let march = february + 3_600 * SEC; // 00:30 on 1 March in Berlin
        let at = |at| Pending { at, cost: 1, seq: 1, total: 1, sent_at: 0 };
        assert!(!merge(&limit, at(february), at(march)).1, "February's and March's charges");
        assert!(merge(&limit, at(march), at(march + 86_400 * SEC)).1, "two of March's");
    }

    fn remaining(state: &State, limit: &Limit, at: u64) -> u64 {
        state.clone().check(at, limit, 0).unwrap().remaining
    }

    /// A random limit of `algorithm`, a state it has charged, and two charges after it (`first`
    /// then `second`, numbered 1 and 2), with the state both leave.
    struct Case {
        limit: Limit,
        base: State,
        first: Pending,
        second: Pending,
        pair: State,
    }

    impl Case {
        fn random(rng: &mut Rng, algorithm: Algorithm) -> Case {
            let count = 1 + rng.below(30);
            let period = SEC * (1 + rng.below(60));
            let mut builder = Limit::builder(count, std::time::Duration::from_nanos(period)).algorithm(algorithm);
            if algorithm.is_bucket() {
                builder = builder.burst(1 + rng.below(count + 5));
            }
            if algorithm == Algorithm::SubWindow {
                builder = builder.slices(rng.pick(&[1, 2, 4, 5, 8, 10]));
            }
            let limit = builder.build().unwrap();
            let mut base = State::idle(&limit);
            let mut at = T0 + rng.below(period);
            for _ in 0..rng.below(6) {
                at += rng.below(period);
                base.charge(at, &limit, 1 + rng.below(count)).unwrap();
            }
            let spread = rng.pick(&[0, 1, limit.emission_interval_ns(), period / 3, 2 * period]);
            let a1 = at + rng.below(period);
            let a2 = a1 + rng.below(spread + 1);
            let (c1, c2) = (1 + rng.below(count), 1 + rng.below(count));
            let first = Pending { at: a1, cost: c1, seq: 1, total: c1, sent_at: 0 };
            let second = Pending { at: a2, cost: c2, seq: 2, total: c1 + c2, sent_at: 0 };
            let mut pair = base.clone();
            pair.charge(first.at, &limit, first.cost).unwrap();
            pair.charge(second.at, &limit, second.cost).unwrap();
            Case { limit, base, first, second, pair }
        }

        /// Holds `other` to the pair's decisions at instants after both charges: the same where
        /// `exact`, never more capacity otherwise.
        fn compare(&self, other: &State, exact: bool, round: usize) {
            let (limit, a2) = (&self.limit, self.second.at);
            for step in 0..12 {
                let t = a2 + step * (limit.period_ns() / 4 + limit.emission_interval_ns() / 3);
                let (want, got) = (remaining(&self.pair, limit, t), remaining(other, limit, t));
                let (first, second) = (self.first, self.second);
                if exact {
                    assert_eq!(got, want, "{limit} round {round} at +{}: {first:?} {second:?}", t - a2);
                } else {
                    assert!(got <= want, "{limit} round {round} at +{}: {got} > {want}", t - a2);
                }
            }
        }
    }

    /// Against the pair applied one after the other, on random states: the same decisions at every
    /// later instant where the merge says exact, never more capacity where it does not.
    #[test]
    fn a_merged_pair_decides_as_the_pair_or_stricter() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for algorithm in Algorithm::ALL {
            let mut exact = 0;
            for round in 0..400 {
                let case = Case::random(&mut rng, algorithm);
                let (first, second) = (case.first, case.second);
                let (merged, is_exact) = merge(&case.limit, first, second);
                assert_eq!((merged.cost, merged.seq, merged.total), (first.cost + second.cost, 2, second.total));
                let mut one = case.base.clone();
                one.charge(merged.at, &case.limit, merged.cost).unwrap();
                exact += usize::from(is_exact);
                case.compare(&one, is_exact, round);
            }
            assert!(exact > 50, "{algorithm}: {exact} exact merges tried");
        }
    }

    /// A merged pair whose first charge the remote applied (at its instant), then the merge's later
    /// part: the same decisions as the pair for the bucket family, never more capacity for the
    /// window family.
    #[test]
    fn the_later_part_of_a_merge_decides_as_the_pair_or_stricter() {
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        for algorithm in Algorithm::ALL {
            for round in 0..400 {
                let case = Case::random(&mut rng, algorithm);
                let (first, second) = (case.first, case.second);
                let later = later_part(&case.limit, merge(&case.limit, first, second).0, second.cost);
                assert_eq!((later.cost, later.seq, later.total), (second.cost, 2, second.total));
                let mut split = case.base.clone();
                split.charge(first.at, &case.limit, first.cost).unwrap();
                split.charge(later.at, &case.limit, later.cost).unwrap();
                case.compare(&split, algorithm.is_bucket(), round);
            }
        }
    }
}
