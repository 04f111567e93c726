//! Leaky bucket as a meter: a level that leaks one unit per `T`, lazily; a request pours in
//! `cost` units and is admitted only if the bucket (capacity `burst`) does not overflow.
//!
//! The level is kept in nanoseconds (one unit is `T` ns), which makes the leak exact. The bucket
//! is empty again at `last + level`, GCRA's theoretical arrival time: the meter makes exactly
//! GCRA's decisions in every case (a property test holds it to that) with its own two fields.

use super::{RateState, Snapshot, add, charged_tat, cost_ns, reserved_tat};
use crate::{Decision, Error, Limit};

/// Leaky bucket (meter) state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct LeakyBucket {
    /// Water in the bucket at `last`, in ns of drain time (a full bucket holds `burst * T`; more
    /// while in debt after a charge).
    pub level: u64,
    /// When `level` was measured, in ns since the epoch.
    pub last: u64,
}

impl LeakyBucket {
    /// The level at `now`: what is left after leaking since `last`. A `now` before `last` (a clock
    /// gone backwards) leaks nothing and counts the gap as water still to drain.
    fn level_at(&self, now: u64) -> u64 {
        self.last.saturating_add(self.level).saturating_sub(now)
    }
}

impl RateState for LeakyBucket {
    fn idle(_: &Limit) -> Self {
        LeakyBucket { level: 0, last: 0 }
    }

    fn check(&mut self, now: u64, limit: &Limit, cost: u64) -> Result<Decision, Error> {
        limit.check_cost(cost)?;
        let capacity = limit.tolerance_ns();
        let level = self.level_at(now);
        let filled = add(level, cost_ns(limit, cost)?, "leaky bucket level")?;
        let allowed = filled <= capacity;
        let after = if allowed { filled } else { level };
        if allowed && cost > 0 {
            *self = LeakyBucket { level: filled, last: now };
        }
        Ok(Decision {
            allowed,
            limit: limit.burst(),
            remaining: capacity.saturating_sub(after) / limit.emission_interval_ns(),
            retry_after_ns: if allowed { 0 } else { filled - capacity },
            reset_after_ns: after,
        })
    }

    fn idle_at(&self, _: &Limit) -> u64 {
        self.last.saturating_add(self.level)
    }

    fn charge(&mut self, at: u64, limit: &Limit, cost: u64) -> Result<(), Error> {
        if cost == 0 {
            return Ok(());
        }
        let pour = cost.saturating_mul(limit.emission_interval_ns());
        let empty_at = charged_tat(self.idle_at(limit), at, pour);
        // Measured from the later of the two instants, so the level stays within what it counts.
        let last = self.last.max(at);
        *self = LeakyBucket { level: empty_at - last, last };
        Ok(())
    }

    fn refund(&mut self, at: u64, decision: &Decision, limit: &Limit, cost: u64) {
        if reserved_tat(at, decision, cost) == Some(self.idle_at(limit)) {
            let empty_at = self.idle_at(limit).saturating_sub(cost.saturating_mul(limit.emission_interval_ns()));
            *self = LeakyBucket { level: empty_at.saturating_sub(at), last: at };
        }
    }

    fn snapshot(&self, now: u64, _: &Limit) -> Snapshot {
        Snapshot { at: now, used: self.level_at(now), previous: 0 }
    }

    fn from_snapshot(_: &Limit, snapshot: &Snapshot) -> Self {
        LeakyBucket { level: snapshot.used, last: snapshot.at }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Algorithm;
    use crate::algorithm::test_util::{MS, T0, allowed, denied, limit};

    #[test]
    fn fills_then_leaks() {
        let l = Limit::per_second(10).burst(4).algorithm(Algorithm::LeakyBucket).build().unwrap();
        let mut s = LeakyBucket::idle(&l);
        for i in 0..4 {
            assert_eq!(s.check(T0, &l, 1).unwrap(), allowed(4, 3 - i, (i + 1) * 100 * MS));
        }
        assert_eq!(s.check(T0 + 30 * MS, &l, 1).unwrap(), denied(4, 0, 70 * MS, 370 * MS));
        assert_eq!(s.check(T0 + 100 * MS, &l, 1).unwrap(), allowed(4, 0, 400 * MS));
        assert_eq!(s.idle_at(&l), T0 + 500 * MS);
        assert_eq!(s.check(T0 + 500 * MS, &l, 0).unwrap(), allowed(4, 4, 0));
    }

    #[test]
    fn denial_and_peek_leave_state_unchanged() {
        let l = limit(Algorithm::LeakyBucket, "10/s");
        let mut s = LeakyBucket::idle(&l);
        s.check(T0, &l, 9).unwrap();
        let before = s;
        assert!(!s.check(T0 + MS, &l, 2).unwrap().allowed);
        assert!(s.check(T0 + MS, &l, 0).unwrap().allowed);
        assert_eq!(s, before);
    }

    #[test]
    fn a_charge_overflows_the_bucket_until_it_leaks() {
        let l = limit(Algorithm::LeakyBucket, "10/s");
        let mut s = LeakyBucket::idle(&l);
        s.charge(T0, &l, 13).unwrap();
        assert_eq!(s.check(T0, &l, 1).unwrap(), denied(10, 0, 400 * MS, 1300 * MS));
        assert!(s.check(T0 + 400 * MS, &l, 1).unwrap().allowed);
        assert_eq!(LeakyBucket::from_snapshot(&l, &s.snapshot(T0 + 400 * MS, &l)), s);
    }

    #[test]
    fn clock_going_backwards_leaks_nothing() {
        let l = limit(Algorithm::LeakyBucket, "10/s");
        let mut s = LeakyBucket::idle(&l);
        s.check(T0 + 500 * MS, &l, 10).unwrap();
        assert!(!s.check(T0, &l, 1).unwrap().allowed);
        assert!(s.check(T0 + 600 * MS, &l, 1).unwrap().allowed);
    }
}
