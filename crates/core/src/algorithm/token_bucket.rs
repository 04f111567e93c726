//! Token bucket: capacity `burst` tokens, refilled continuously at one token per `T`, lazily.
//!
//! Tokens are kept in fixed point with `T` sub-units per token (one sub-unit accrues per
//! nanosecond), so refills are exact integers. The bucket is GCRA's schedule seen from the other
//! side (a full bucket at `last + capacity - tokens`), and makes exactly GCRA's decisions in every
//! case, debt and clocks going backwards included (a property test holds it to that), while
//! storing its own two fields.

use super::{RateState, Snapshot, charged_tat, cost_ns, reserved_tat};
use crate::{Decision, Error, Limit};

/// Token bucket state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TokenBucket {
    /// Tokens in the bucket at `last`, in units of 1/T token (a full bucket holds `burst * T`).
    pub tokens: u64,
    /// When `tokens` was counted, in ns since the epoch. Later than now while the bucket is in
    /// debt (after a charge): refilling starts again only then.
    pub last: u64,
}

impl TokenBucket {
    /// Tokens (in 1/T units) at `now`, capped at the capacity: negative while in debt, or when
    /// `now` is before `last` (a clock gone backwards refills nothing and borrows from the future).
    fn available(&self, now: u64, capacity: u64) -> i128 {
        let level = i128::from(self.tokens) + i128::from(now) - i128::from(self.last);
        level.min(i128::from(capacity))
    }
}

/// An `i128` known to be in `0..2^64` (differences of capacities and instants), as `u64`.
fn ns(value: i128) -> u64 {
    u64::try_from(value.max(0)).unwrap_or(u64::MAX)
}

impl RateState for TokenBucket {
    fn idle(limit: &Limit) -> Self {
        TokenBucket { tokens: limit.tolerance_ns(), last: 0 }
    }

    fn check(&mut self, now: u64, limit: &Limit, cost: u64) -> Result<Decision, Error> {
        limit.check_cost(cost)?;
        let capacity = i128::from(limit.tolerance_ns());
        let need = i128::from(cost_ns(limit, cost)?);
        let available = self.available(now, limit.tolerance_ns());
        let allowed = available >= need;
        let left = if allowed { available - need } else { available };
        if allowed && cost > 0 {
            // `left >= 0` here: the bucket is counted afresh from now.
            *self = TokenBucket { tokens: ns(left), last: now };
        }
        Ok(Decision {
            allowed,
            limit: limit.burst(),
            remaining: ns(left) / limit.emission_interval_ns(),
            retry_after_ns: if allowed { 0 } else { ns(need - available) },
            reset_after_ns: ns(capacity - left),
        })
    }

    fn idle_at(&self, limit: &Limit) -> u64 {
        let missing = limit.tolerance_ns().saturating_sub(self.tokens);
        self.last.saturating_add(missing)
    }

    fn charge(&mut self, at: u64, limit: &Limit, cost: u64) -> Result<(), Error> {
        if cost == 0 {
            return Ok(());
        }
        let capacity = limit.tolerance_ns();
        let need = cost.saturating_mul(limit.emission_interval_ns());
        // In GCRA's terms the bucket is full again at `tat`; the charge moves that to
        // max(tat, at) + need. Counted from `at`, or later while that is more than a full bucket away.
        let tat = charged_tat(self.idle_at(limit), at, need);
        let last = at.max(tat.saturating_sub(capacity));
        *self = TokenBucket { tokens: capacity - (tat - last), last };
        Ok(())
    }

    fn refund(&mut self, at: u64, decision: &Decision, limit: &Limit, cost: u64) {
        if reserved_tat(at, decision, cost) == Some(self.idle_at(limit)) {
            // Full again `cost * T` sooner, counted from the admission.
            let capacity = limit.tolerance_ns();
            let tat = self.idle_at(limit).saturating_sub(cost.saturating_mul(limit.emission_interval_ns()));
            *self = TokenBucket { tokens: capacity - tat.saturating_sub(at).min(capacity), last: at };
        }
    }

    fn snapshot(&self, now: u64, limit: &Limit) -> Snapshot {
        Snapshot { at: now, used: self.idle_at(limit).saturating_sub(now), previous: 0 }
    }

    fn from_snapshot(limit: &Limit, snapshot: &Snapshot) -> Self {
        let capacity = limit.tolerance_ns();
        if snapshot.used <= capacity {
            TokenBucket { tokens: capacity - snapshot.used, last: snapshot.at }
        } else {
            TokenBucket { tokens: 0, last: snapshot.at.saturating_add(snapshot.used - capacity) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Algorithm;
    use crate::algorithm::test_util::{MS, SEC, T0, allowed, denied, limit};

    #[test]
    fn drains_then_refills_continuously() {
        let l = limit(Algorithm::TokenBucket, "10/s");
        let mut s = TokenBucket::idle(&l);
        assert_eq!(s.check(T0, &l, 10).unwrap(), allowed(10, 0, SEC));
        assert_eq!(s.check(T0 + 50 * MS, &l, 1).unwrap(), denied(10, 0, 50 * MS, 950 * MS));
        assert_eq!(s.check(T0 + 100 * MS, &l, 1).unwrap(), allowed(10, 0, SEC));
        // Half a token refilled is not a token.
        assert_eq!(s.check(T0 + 250 * MS, &l, 0).unwrap(), allowed(10, 1, 850 * MS));
    }

    #[test]
    fn refill_caps_at_capacity() {
        let l = Limit::per_second(10).burst(3).algorithm(Algorithm::TokenBucket).build().unwrap();
        let mut s = TokenBucket::idle(&l);
        s.check(T0, &l, 3).unwrap();
        assert_eq!(s.check(T0 + 3600 * SEC, &l, 1).unwrap(), allowed(3, 2, 100 * MS));
        assert_eq!(s.idle_at(&l), T0 + 3600 * SEC + 100 * MS);
    }

    #[test]
    fn denial_and_peek_leave_state_unchanged() {
        let l = limit(Algorithm::TokenBucket, "10/s");
        let mut s = TokenBucket::idle(&l);
        s.check(T0, &l, 9).unwrap();
        let before = s;
        assert!(!s.check(T0 + MS, &l, 2).unwrap().allowed);
        assert!(s.check(T0 + MS, &l, 0).unwrap().allowed);
        assert_eq!(s, before);
        assert_eq!(s.check(T0, &l, 11), Err(Error::CostExceedsCapacity { cost: 11, capacity: 10 }));
    }

    #[test]
    fn a_charge_puts_the_bucket_in_debt_until_refilled() {
        let l = limit(Algorithm::TokenBucket, "10/s");
        let mut s = TokenBucket::idle(&l);
        s.charge(T0, &l, 12).unwrap();
        assert_eq!(s, TokenBucket { tokens: 0, last: T0 + 200 * MS });
        assert_eq!(s.check(T0, &l, 1).unwrap(), denied(10, 0, 300 * MS, 1200 * MS));
        assert!(s.check(T0 + 300 * MS, &l, 1).unwrap().allowed);
        assert_eq!(TokenBucket::from_snapshot(&l, &s.snapshot(T0 + 300 * MS, &l)), s);
    }

    #[test]
    fn clock_going_backwards_refills_nothing() {
        let l = limit(Algorithm::TokenBucket, "10/s");
        let mut s = TokenBucket::idle(&l);
        s.check(T0 + SEC, &l, 10).unwrap();
        assert!(!s.check(T0, &l, 1).unwrap().allowed);
        assert!(!s.check(T0 + SEC + 99 * MS, &l, 1).unwrap().allowed);
        assert!(s.check(T0 + SEC + 100 * MS, &l, 1).unwrap().allowed);
    }
}
