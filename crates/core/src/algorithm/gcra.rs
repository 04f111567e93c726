//! GCRA, the generic cell rate algorithm: one timestamp, the theoretical arrival time (TAT).
//!
//! ```text
//! tat = max(stored_tat, now);  new = tat + cost*T
//! allowed iff new - now <= burst*T                     -> store new
//! remaining = (now + burst*T - (allowed ? new : tat)) / T
//! retry_after = new - burst*T - now (denied);  reset_after = (allowed ? new : tat) - now
//! ```
//! This is the one correct row of the off-by-one table in "Rate Limiter Algorithm Zoo: GCRA,
//! Sliding Window, and the Off-by-One Tax" (see docs/SEMANTICS.md): tolerance `(burst-1)*T`
//! compared with `>=`, written here as `new - now <= burst*T`. It admits exactly `burst` at once
//! from idle and `burst + floor(L/T)` in any closed interval of length `L`.
//!
//! The state records the emission interval its TAT was scheduled in, so that a key read under
//! another rate (a rules reload, an ad-hoc call with new parameters) keeps what it spent: the
//! units still ahead of now are rescheduled in the new interval ([`rescaled_tat`]).

use super::{MAX_AHEAD_NS, RateState, Snapshot, charged_tat, cost_ns, reserved_tat};
use crate::{Decision, Error, Limit};

/// GCRA state: the theoretical arrival time in ns since the epoch (0 for a key with no history).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct Gcra {
    /// When the schedule is next free; `max(tat, now)` makes any past value mean "idle".
    pub tat: u64,
    /// The emission interval (ns) `tat` was scheduled in; 0 when not recorded (a key with no
    /// history, or written by an earlier version): read as scheduled in the limit's own.
    pub interval: u64,
}

/// A schedule end `tat` scheduled in emission interval `interval`, seen at `now` under `limit`:
/// the units still ahead of `now` (`(tat - now) / interval`) scheduled in `limit`'s interval
/// instead, rounded up to the ns and at most [`MAX_AHEAD_NS`] ahead. What was spent stays spent:
/// a faster rate frees it sooner (a raised limit applies at once), a slower one later (lowering a
/// limit never refunds). `tat` itself when the interval is the limit's, unknown (0), or nothing
/// is ahead. The bucket family's states share it.
#[must_use]
pub fn rescaled_tat(tat: u64, interval: u64, now: u64, limit: &Limit) -> u64 {
    let t = limit.emission_interval_ns();
    if interval == 0 || interval == t || tat <= now {
        return tat;
    }
    let ahead = (u128::from(tat - now) * u128::from(t)).div_ceil(u128::from(interval));
    now.saturating_add(u64::try_from(ahead).unwrap_or(u64::MAX).min(MAX_AHEAD_NS))
}

impl Gcra {
    /// The TAT in `limit`'s emission interval, seen at `now`.
    fn tat_under(&self, now: u64, limit: &Limit) -> u64 {
        rescaled_tat(self.tat, self.interval, now, limit)
    }
}

impl RateState for Gcra {
    fn idle(_: &Limit) -> Self {
        Gcra { tat: 0, interval: 0 }
    }

    #[inline]
    fn check(&mut self, now: u64, limit: &Limit, cost: u64) -> Result<Decision, Error> {
        limit.check_cost(cost)?;
        let t = limit.emission_interval_ns();
        let tat = self.tat_under(now, limit);
        let (decision, next) = decide(tat, now, limit, cost)?;
        if let Some(tat) = next {
            *self = Gcra { tat, interval: t };
        } else if cost > 0 && !(self.interval == 0 || self.interval == t) && self.tat > now {
            // Refused under another rate: the schedule is rewritten in the new one, so it stops
            // draining at the old rate and the retry announced holds (lowering never refunds).
            *self = Gcra { tat, interval: t };
        }
        Ok(decision)
    }

    #[inline]
    fn idle_at(&self, limit: &Limit) -> u64 {
        // Read under a slower rate the schedule ends later, by at most MAX_AHEAD_NS past now.
        if self.interval != 0 && self.interval < limit.emission_interval_ns() {
            self.tat.saturating_add(MAX_AHEAD_NS)
        } else {
            self.tat
        }
    }

    fn charge(&mut self, at: u64, limit: &Limit, cost: u64) -> Result<(), Error> {
        if cost == 0 {
            return Ok(());
        }
        let cost_ns = cost.saturating_mul(limit.emission_interval_ns());
        let tat = charged_tat(self.tat_under(at, limit), at, cost_ns);
        *self = Gcra { tat, interval: limit.emission_interval_ns() };
        Ok(())
    }

    fn refund(&mut self, at: u64, decision: &Decision, limit: &Limit, cost: u64) {
        let t = limit.emission_interval_ns();
        // Admitted under another rate: not where it was counted (an under-grant, never an over-grant).
        if (self.interval == 0 || self.interval == t) && reserved_tat(at, decision, cost) == Some(self.tat) {
            let tat = self.tat - cost.saturating_mul(t).min(self.tat);
            *self = Gcra { tat, interval: t };
        }
    }

    fn snapshot(&self, now: u64, limit: &Limit) -> Snapshot {
        Snapshot { at: now, used: self.tat_under(now, limit).saturating_sub(now), previous: 0 }
    }

    fn from_snapshot(limit: &Limit, snapshot: &Snapshot) -> Self {
        Gcra { tat: snapshot.at.saturating_add(snapshot.used), interval: limit.emission_interval_ns() }
    }
}

impl Gcra {
    /// The GCRA step on a bare TAT, for stores that keep it in an atomic and write it back with a
    /// compare-and-swap: the decision, and the TAT to store when the request consumed capacity
    /// (`None` for a denial or a peek). `tat` is 0 for a key with no history.
    #[inline]
    pub fn step(tat: u64, now: u64, limit: &Limit, cost: u64) -> Result<(Decision, Option<u64>), Error> {
        limit.check_cost(cost)?;
        decide(tat, now, limit, cost)
    }
}

/// The GCRA step on a bare TAT (see [`Gcra::step`]); the cost must already have been checked
/// against the limit's capacity.
#[inline]
fn decide(tat: u64, now: u64, limit: &Limit, cost: u64) -> Result<(Decision, Option<u64>), Error> {
    let t = limit.emission_interval_ns();
    let tolerance = limit.tolerance_ns();
    let tat = tat.max(now);
    let new =
        tat.checked_add(cost_ns(limit, cost)?).ok_or(Error::Overflow("theoretical arrival time beyond 2^64 ns"))?;
    let allowed = new - now <= tolerance;
    let ahead = if allowed { new } else { tat } - now;
    let decision = Decision {
        allowed,
        limit: limit.burst(),
        remaining: tolerance.saturating_sub(ahead) / t,
        retry_after_ns: if allowed { 0 } else { new - now - tolerance },
        reset_after_ns: ahead,
    };
    Ok((decision, (allowed && cost > 0).then_some(new)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Algorithm;
    use crate::algorithm::test_util::{MS, SEC, T0, allowed, denied, limit};

    #[test]
    fn burst_from_idle_then_one_per_emission_interval() {
        let l = limit(Algorithm::Gcra, "10/s");
        let mut s = Gcra::idle(&l);
        for i in 0..10 {
            assert_eq!(s.check(T0, &l, 1).unwrap(), allowed(10, 9 - i, (i + 1) * 100 * MS));
        }
        assert_eq!(s.check(T0, &l, 1).unwrap(), denied(10, 0, 100 * MS, SEC));
        assert_eq!(s.check(T0 + 100 * MS - 1, &l, 1).unwrap(), denied(10, 0, 1, SEC - 100 * MS + 1));
        assert_eq!(s.check(T0 + 100 * MS, &l, 1).unwrap(), allowed(10, 0, SEC));
    }

    /// The walk-through of "Rate Limiting Demystified - Part 2": 10/s with a 500 ms tolerance, i.e. burst 5 in our convention
    /// (`new_tat <= now + 500ms`). Five pass at t=0, the sixth is refused, and after 600 ms a
    /// request passes with TAT 700 ms.
    #[test]
    fn seed_002_walkthrough() {
        let l = Limit::per_second(10).burst(5).build().unwrap();
        assert_eq!(l.tolerance_ns(), 500 * MS);
        let mut s = Gcra::idle(&l);
        for i in 1..=5 {
            let d = s.check(T0, &l, 1).unwrap();
            assert!(d.allowed);
            assert_eq!(s.tat, T0 + i * 100 * MS, "request {i}: TAT = {i}00ms");
        }
        let sixth = s.check(T0, &l, 1).unwrap();
        assert_eq!(sixth, denied(5, 0, 100 * MS, 500 * MS));
        assert_eq!(s.tat, T0 + 500 * MS, "a denial leaves the TAT alone");
        let later = s.check(T0 + 600 * MS, &l, 1).unwrap();
        assert!(later.allowed);
        assert_eq!(s.tat, T0 + 700 * MS);
    }

    #[test]
    fn peek_reports_without_consuming() {
        let l = limit(Algorithm::Gcra, "10/s");
        let mut s = Gcra::idle(&l);
        assert_eq!(s.check(T0, &l, 0).unwrap(), allowed(10, 10, 0));
        assert_eq!(s, Gcra::idle(&l), "a peek creates no state");
        s.check(T0, &l, 4).unwrap();
        let before = s;
        assert_eq!(s.check(T0 + 50 * MS, &l, 0).unwrap(), allowed(10, 6, 350 * MS));
        assert_eq!(s, before);
    }

    #[test]
    fn cost_above_burst_is_an_error_not_an_eternal_denial() {
        let l = limit(Algorithm::Gcra, "10/s");
        let mut s = Gcra::idle(&l);
        assert_eq!(s.check(T0, &l, 11), Err(Error::CostExceedsCapacity { cost: 11, capacity: 10 }));
        assert!(s.check(T0, &l, 10).unwrap().allowed);
    }

    #[test]
    fn denied_cost_reports_when_it_would_fit() {
        let l = limit(Algorithm::Gcra, "10/s");
        let mut s = Gcra::idle(&l);
        s.check(T0, &l, 8).unwrap();
        // 2 left; a cost of 5 needs 3 more emission intervals.
        assert_eq!(s.check(T0, &l, 5).unwrap(), denied(10, 2, 300 * MS, 800 * MS));
        assert!(s.check(T0 + 300 * MS, &l, 5).unwrap().allowed);
    }

    #[test]
    fn overflow_is_an_error_never_a_wrap() {
        let l = limit(Algorithm::Gcra, "1/1d");
        let mut s = Gcra::idle(&l);
        assert!(matches!(s.check(u64::MAX - 5, &l, 1), Err(Error::Overflow(_))));
        assert_eq!(s, Gcra::idle(&l));
    }

    #[test]
    fn a_charge_may_put_the_key_in_debt() {
        let l = limit(Algorithm::Gcra, "10/s");
        let mut s = Gcra::idle(&l);
        s.charge(T0, &l, 15).unwrap();
        assert_eq!(s.check(T0, &l, 1).unwrap(), denied(10, 0, 600 * MS, 1500 * MS));
        // A charge dated before the schedule's end counts from its end.
        s.charge(T0 - SEC, &l, 1).unwrap();
        assert_eq!(s.tat, T0 + 1600 * MS);
        // A debt beyond 52 days is forgiven.
        s.charge(T0, &l, u64::MAX).unwrap();
        assert_eq!(s.tat, T0 + crate::algorithm::MAX_AHEAD_NS);
        assert_eq!(Gcra::from_snapshot(&l, &s.snapshot(T0 + MS, &l)), s);
    }

    #[test]
    fn clock_going_backwards_is_stricter_not_looser() {
        let l = limit(Algorithm::Gcra, "10/s");
        let mut s = Gcra::idle(&l);
        for _ in 0..10 {
            s.check(T0 + SEC, &l, 1).unwrap();
        }
        let d = s.check(T0, &l, 1).unwrap();
        assert!(!d.allowed);
        assert_eq!(d.retry_after_ns, SEC + 100 * MS);
    }
}
