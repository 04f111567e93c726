//! Leaky bucket as a meter: a level that leaks one unit per `T`, lazily; a request pours in
//! `cost` units and is admitted only if the bucket (capacity `burst`) does not overflow.
//!
//! The level is kept in nanoseconds (one unit is `T` ns), which makes the leak exact. The bucket
//! is empty again at `last + level`, GCRA's theoretical arrival time: the meter makes exactly
//! GCRA's decisions in every case (a property test holds it to that) with its own two fields,
//! and the emission interval its level was measured in, so a key read under another rate keeps
//! what it spent (the units still in the bucket, drained at the new rate: [`rescaled_tat`]).

use super::{MAX_AHEAD_NS, RateState, Snapshot, add, charged_tat, cost_ns, rescaled_tat, reserved_tat};
use crate::{Decision, Error, Limit};

/// Leaky bucket (meter) state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct LeakyBucket {
    /// Water in the bucket at `last`, in ns of drain time (a full bucket holds `burst * T`; more
    /// while in debt after a charge).
    pub level: u64,
    /// When `level` was measured, in ns since the epoch.
    pub last: u64,
    /// The emission interval (ns) `level` was measured in; 0 when not recorded (a key with no
    /// history, or written by an earlier version): the limit's own.
    pub interval: u64,
}

impl LeakyBucket {
    /// `level` at `last`, measured in `limit`'s interval.
    #[must_use]
    #[inline]
    pub fn new(level: u64, last: u64, limit: &Limit) -> Self {
        LeakyBucket { level, last, interval: limit.emission_interval_ns() }
    }

    /// This bucket seen at `now` measured in `limit`'s interval: the same instant of being empty
    /// again (GCRA's TAT), rescaled to `limit`'s rate when its interval differs.
    #[inline]
    fn under(&self, now: u64, limit: &Limit) -> LeakyBucket {
        let t = limit.emission_interval_ns();
        let empty_at = self.last.saturating_add(self.level);
        if self.interval == 0 || self.interval == t || empty_at <= now {
            return LeakyBucket::new(self.level, self.last, limit);
        }
        let last = self.last.max(now);
        LeakyBucket::new(rescaled_tat(empty_at, self.interval, now, limit).saturating_sub(last), last, limit)
    }

    /// The level at `now`: what is left after leaking since `last`. A `now` before `last` (a clock
    /// gone backwards) leaks nothing and counts the gap as water still to drain.
    #[inline]
    fn level_at(&self, now: u64) -> u64 {
        self.last.saturating_add(self.level).saturating_sub(now)
    }
}

impl RateState for LeakyBucket {
    fn idle(_: &Limit) -> Self {
        LeakyBucket { level: 0, last: 0, interval: 0 }
    }

    #[inline]
    fn check(&mut self, now: u64, limit: &Limit, cost: u64) -> Result<Decision, Error> {
        limit.check_cost(cost)?;
        let capacity = limit.tolerance_ns();
        let own = self.under(now, limit);
        let level = own.level_at(now);
        let filled = add(level, cost_ns(limit, cost)?, "leaky bucket level")?;
        let allowed = filled <= capacity;
        let after = if allowed { filled } else { level };
        let t = limit.emission_interval_ns();
        if allowed && cost > 0 {
            *self = LeakyBucket::new(filled, now, limit);
        } else if cost > 0 && !(self.interval == 0 || self.interval == t) && self.last.saturating_add(self.level) > now
        {
            // Refused under another rate: the level is rewritten in the new one, so it stops
            // draining at the old rate and the retry announced holds (lowering never refunds).
            *self = own;
        }
        Ok(Decision {
            allowed,
            limit: limit.burst(),
            remaining: capacity.saturating_sub(after) / limit.emission_interval_ns(),
            retry_after_ns: if allowed { 0 } else { filled - capacity },
            reset_after_ns: after,
        })
    }

    #[inline]
    fn idle_at(&self, limit: &Limit) -> u64 {
        let empty_at = self.last.saturating_add(self.level);
        // Read under a slower rate the bucket empties later, by at most MAX_AHEAD_NS past now.
        if self.interval != 0 && self.interval < limit.emission_interval_ns() {
            empty_at.saturating_add(MAX_AHEAD_NS)
        } else {
            empty_at
        }
    }

    fn charge(&mut self, at: u64, limit: &Limit, cost: u64) -> Result<(), Error> {
        if cost == 0 {
            return Ok(());
        }
        let own = self.under(at, limit);
        let pour = cost.saturating_mul(limit.emission_interval_ns());
        let empty_at = charged_tat(own.last.saturating_add(own.level), at, pour);
        // Measured from the later of the two instants, so the level stays within what it counts.
        let last = own.last.max(at);
        *self = LeakyBucket::new(empty_at - last, last, limit);
        Ok(())
    }

    fn refund(&mut self, at: u64, decision: &Decision, limit: &Limit, cost: u64) {
        // Poured under another rate: not where it was counted (an under-grant, never an over-grant).
        if self.interval != 0 && self.interval != limit.emission_interval_ns() {
            return;
        }
        let empty_at = self.last.saturating_add(self.level);
        if reserved_tat(at, decision, cost) == Some(empty_at) {
            let empty_at = empty_at.saturating_sub(cost.saturating_mul(limit.emission_interval_ns()));
            *self = LeakyBucket::new(empty_at.saturating_sub(at), at, limit);
        }
    }

    fn snapshot(&self, now: u64, limit: &Limit) -> Snapshot {
        Snapshot { at: now, used: self.under(now, limit).level_at(now), previous: 0 }
    }

    fn from_snapshot(limit: &Limit, snapshot: &Snapshot) -> Self {
        LeakyBucket::new(snapshot.used, snapshot.at, limit)
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
