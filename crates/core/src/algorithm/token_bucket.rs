//! Token bucket: capacity `burst` tokens, refilled continuously at one token per `T`, lazily.
//!
//! Tokens are kept in fixed point with `T` sub-units per token (one sub-unit accrues per
//! nanosecond), so refills are exact integers. The bucket is GCRA's schedule seen from the other
//! side (a full bucket at `last + capacity - tokens`), and makes exactly GCRA's decisions in every
//! case, debt and clocks going backwards included (a property test holds it to that), while
//! storing its own two fields, and the emission interval and capacity they were counted in, so a
//! key read under another limit keeps what it spent (the units missing from a full bucket, at
//! the new rate: [`rescaled_tat`]).

use super::{MAX_AHEAD_NS, RateState, Snapshot, charged_tat, cost_ns, rescaled_tat, reserved_tat};
use crate::{Decision, Error, Limit};

/// Token bucket state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TokenBucket {
    /// Tokens in the bucket at `last`, in units of 1/T token (a full bucket holds `burst * T`).
    pub tokens: u64,
    /// When `tokens` was counted, in ns since the epoch. Later than now while the bucket is in
    /// debt (after a charge): refilling starts again only then.
    pub last: u64,
    /// The emission interval (ns) `tokens` were counted in; 0 when not recorded (written by an
    /// earlier version): the limit's own.
    pub interval: u64,
    /// The capacity (`burst * T`, ns) `tokens` were counted in; 0 when not recorded.
    pub capacity: u64,
}

impl TokenBucket {
    /// `tokens` at `last`, counted in `limit`'s interval and capacity.
    #[must_use]
    #[inline]
    pub fn new(tokens: u64, last: u64, limit: &Limit) -> Self {
        TokenBucket { tokens, last, interval: limit.emission_interval_ns(), capacity: limit.tolerance_ns() }
    }

    /// This bucket seen at `now` counted in `limit`'s interval and capacity: the same instant of
    /// being full again (GCRA's TAT), rescaled to `limit`'s rate when its interval differs.
    #[inline]
    fn under(&self, now: u64, limit: &Limit) -> TokenBucket {
        let (t, cap) = (limit.emission_interval_ns(), limit.tolerance_ns());
        if recorded_as(self.interval, t) && recorded_as(self.capacity, cap) {
            return TokenBucket::new(self.tokens, self.last, limit);
        }
        let old_capacity = if self.capacity == 0 { cap } else { self.capacity };
        let full_at = self.last.saturating_add(old_capacity.saturating_sub(self.tokens));
        let tat = rescaled_tat(full_at, self.interval, now, limit);
        let last = now.max(tat.saturating_sub(cap));
        TokenBucket::new(cap - tat.saturating_sub(last).min(cap), last, limit)
    }

    /// Tokens (in 1/T units) at `now`, capped at the capacity: negative while in debt, or when
    /// `now` is before `last` (a clock gone backwards refills nothing and borrows from the future).
    #[inline]
    fn available(&self, now: u64, capacity: u64) -> i128 {
        let level = i128::from(self.tokens) + i128::from(now) - i128::from(self.last);
        level.min(i128::from(capacity))
    }
}

/// Whether a recorded interval or capacity is `own` (0: not recorded, read as the limit's own).
fn recorded_as(recorded: u64, own: u64) -> bool {
    recorded == 0 || recorded == own
}

/// An `i128` known to be in `0..2^64` (differences of capacities and instants), as `u64`.
#[inline]
fn ns(value: i128) -> u64 {
    u64::try_from(value.max(0)).unwrap_or(u64::MAX)
}

impl TokenBucket {
    /// The steps of `RateState` on a bucket counted in `limit`'s interval and capacity.
    #[inline]
    fn check_own(&mut self, now: u64, limit: &Limit, cost: u64) -> Result<Decision, Error> {
        limit.check_cost(cost)?;
        let capacity = i128::from(limit.tolerance_ns());
        let need = i128::from(cost_ns(limit, cost)?);
        let available = self.available(now, limit.tolerance_ns());
        let allowed = available >= need;
        let left = if allowed { available - need } else { available };
        if allowed && cost > 0 {
            // `left >= 0` here: the bucket is counted afresh from now.
            *self = TokenBucket::new(ns(left), now, limit);
        }
        Ok(Decision {
            allowed,
            limit: limit.burst(),
            remaining: ns(left) / limit.emission_interval_ns(),
            retry_after_ns: if allowed { 0 } else { ns(need - available) },
            reset_after_ns: ns(capacity - left),
        })
    }

    fn idle_at_own(&self, limit: &Limit) -> u64 {
        let missing = limit.tolerance_ns().saturating_sub(self.tokens);
        self.last.saturating_add(missing)
    }

    fn charge_own(&mut self, at: u64, limit: &Limit, cost: u64) -> Result<(), Error> {
        if cost == 0 {
            return Ok(());
        }
        let capacity = limit.tolerance_ns();
        let need = cost.saturating_mul(limit.emission_interval_ns());
        // In GCRA's terms the bucket is full again at `tat`; the charge moves that to
        // max(tat, at) + need. Counted from `at`, or later while that is more than a full bucket away.
        let tat = charged_tat(self.idle_at_own(limit), at, need);
        let last = at.max(tat.saturating_sub(capacity));
        *self = TokenBucket::new(capacity - (tat - last), last, limit);
        Ok(())
    }

    fn refund_own(&mut self, at: u64, decision: &Decision, limit: &Limit, cost: u64) {
        if reserved_tat(at, decision, cost) == Some(self.idle_at_own(limit)) {
            // Full again `cost * T` sooner, counted from the admission.
            let capacity = limit.tolerance_ns();
            let tat = self.idle_at_own(limit).saturating_sub(cost.saturating_mul(limit.emission_interval_ns()));
            *self = TokenBucket::new(capacity - tat.saturating_sub(at).min(capacity), at, limit);
        }
    }

    fn snapshot_own(&self, now: u64, limit: &Limit) -> Snapshot {
        Snapshot { at: now, used: self.idle_at_own(limit).saturating_sub(now), previous: 0 }
    }
}

impl RateState for TokenBucket {
    fn idle(limit: &Limit) -> Self {
        TokenBucket::new(limit.tolerance_ns(), 0, limit)
    }

    #[inline]
    fn check(&mut self, now: u64, limit: &Limit, cost: u64) -> Result<Decision, Error> {
        let mut bucket = self.under(now, limit);
        let decision = bucket.check_own(now, limit, cost)?;
        // Refused under another interval or capacity, the bucket is rewritten in the new ones
        // too, so it stops refilling at the old rate and the retry announced holds.
        let rescaled = !(recorded_as(self.interval, limit.emission_interval_ns())
            && recorded_as(self.capacity, limit.tolerance_ns()));
        if cost > 0 && (decision.allowed || rescaled) {
            *self = bucket;
        }
        Ok(decision)
    }

    #[inline]
    fn idle_at(&self, limit: &Limit) -> u64 {
        let capacity = if self.capacity == 0 { limit.tolerance_ns() } else { self.capacity };
        let full_at = self.last.saturating_add(capacity.saturating_sub(self.tokens));
        // Read under a slower rate the bucket is full later, by at most MAX_AHEAD_NS past now.
        if self.interval != 0 && self.interval < limit.emission_interval_ns() {
            full_at.saturating_add(MAX_AHEAD_NS)
        } else {
            full_at
        }
    }

    fn charge(&mut self, at: u64, limit: &Limit, cost: u64) -> Result<(), Error> {
        if cost == 0 {
            return Ok(());
        }
        let mut bucket = self.under(at, limit);
        bucket.charge_own(at, limit, cost)?;
        *self = bucket;
        Ok(())
    }

    fn refund(&mut self, at: u64, decision: &Decision, limit: &Limit, cost: u64) {
        // Counted under another interval or capacity: not where it was counted (an under-grant).
        if recorded_as(self.interval, limit.emission_interval_ns()) && recorded_as(self.capacity, limit.tolerance_ns())
        {
            let own = TokenBucket::new(self.tokens, self.last, limit);
            let mut bucket = own;
            bucket.refund_own(at, decision, limit, cost);
            if bucket != own {
                *self = bucket;
            }
        }
    }

    fn snapshot(&self, now: u64, limit: &Limit) -> Snapshot {
        self.under(now, limit).snapshot_own(now, limit)
    }

    fn from_snapshot(limit: &Limit, snapshot: &Snapshot) -> Self {
        let capacity = limit.tolerance_ns();
        if snapshot.used <= capacity {
            TokenBucket::new(capacity - snapshot.used, snapshot.at, limit)
        } else {
            TokenBucket::new(0, snapshot.at.saturating_add(snapshot.used - capacity), limit)
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
        assert_eq!(s, TokenBucket::new(0, T0 + 200 * MS, &l));
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
