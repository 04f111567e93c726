//! Token bucket: capacity `burst` tokens, refilled continuously at one token per `T`, lazily.
//!
//! Tokens are kept in fixed point with `T` sub-units per token (one sub-unit accrues per
//! nanosecond), so refills are exact integers and the bucket makes exactly GCRA's decisions
//! (a property test holds it to that) while storing its own two fields.

use super::{RateState, cost_ns};
use crate::{Decision, Error, Limit};

/// Token bucket state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TokenBucket {
    /// Tokens in the bucket at `last`, in units of 1/T token (a full bucket holds `burst * T`).
    pub tokens: u64,
    /// When `tokens` was last written, in ns since the epoch.
    pub last: u64,
}

impl TokenBucket {
    /// Tokens (in 1/T units) available at `now`: refilled since `last`, capped at the capacity.
    /// A `now` before `last` refills nothing.
    fn available(&self, now: u64, capacity: u64) -> u64 {
        let refill = now.saturating_sub(self.last);
        self.tokens.saturating_add(refill).min(capacity)
    }
}

impl RateState for TokenBucket {
    fn idle(limit: &Limit) -> Self {
        TokenBucket { tokens: limit.tolerance_ns(), last: 0 }
    }

    fn check(&mut self, now: u64, limit: &Limit, cost: u64) -> Result<Decision, Error> {
        limit.check_cost(cost)?;
        let capacity = limit.tolerance_ns();
        let need = cost_ns(limit, cost)?;
        let available = self.available(now, capacity);
        let allowed = available >= need;
        let left = if allowed { available - need } else { available };
        if allowed && cost > 0 {
            *self = TokenBucket { tokens: left, last: now.max(self.last) };
        }
        Ok(Decision {
            allowed,
            limit: limit.burst(),
            remaining: left / limit.emission_interval_ns(),
            retry_after_ns: if allowed { 0 } else { need - available },
            reset_after_ns: capacity - left,
        })
    }

    fn idle_at(&self, limit: &Limit) -> u64 {
        let missing = limit.tolerance_ns().saturating_sub(self.tokens);
        self.last.saturating_add(missing)
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
    fn clock_going_backwards_refills_nothing() {
        let l = limit(Algorithm::TokenBucket, "10/s");
        let mut s = TokenBucket::idle(&l);
        s.check(T0 + SEC, &l, 10).unwrap();
        assert!(!s.check(T0, &l, 1).unwrap().allowed);
        assert!(!s.check(T0 + SEC + 99 * MS, &l, 1).unwrap().allowed);
        assert!(s.check(T0 + SEC + 100 * MS, &l, 1).unwrap().allowed);
    }
}
