//! Fixed window: a counter per window `[k*period, (k+1)*period)`, aligned to the epoch, or per
//! calendar unit of a time zone (a day, week, month or year: [`Limit::window_at`]).
//!
//! The seam between two windows is at a predictable instant, and a burst lined up across it
//! admits `2 * count` in an instant (the boundary attack of "Rate Limiting Demystified - Part 2" and "Rate-limiting algorithms for defense"); `tollgate simulate over-grant` shows it.
//!
//! A window charged past its count carries the excess into the windows after it as already spent
//! ([`debt`](super::debt)): `used` here may exceed the count, and the windows it reaches deny.

use super::debt::{carried, counted_in_window, last_indebted, nth_window_end, windows_between};
use super::{RateState, Snapshot};
use crate::{Decision, Error, Limit};

/// Fixed window state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct FixedWindow {
    /// Start of the window `used` counts, in ns since the epoch.
    pub window_start: u64,
    /// Cost admitted in that window.
    pub used: u64,
}

impl RateState for FixedWindow {
    fn idle(_: &Limit) -> Self {
        FixedWindow { window_start: 0, used: 0 }
    }

    #[inline]
    fn check(&mut self, now: u64, limit: &Limit, cost: u64) -> Result<Decision, Error> {
        limit.check_cost(cost)?;
        let (start, used, end) = self.rolled(now, limit);
        if end == u64::MAX {
            return Err(Error::Overflow("window end beyond 2^64 ns"));
        }
        let count = limit.count();
        let wanted = used.checked_add(cost).ok_or(Error::Overflow("window counter"))?;
        let allowed = wanted <= count;
        let after = if allowed { wanted } else { used };
        if allowed && cost > 0 {
            *self = FixedWindow { window_start: start, used: wanted };
        }
        let retry_after_ns = if allowed {
            0
        } else {
            // The first window whose carried debt leaves room for `cost` (the next one, unless in
            // debt), which starts where the one before it ends.
            let fits = carried(limit, used, 1).saturating_add(cost).saturating_sub(count).div_ceil(count.max(1));
            nth_window_end(limit, start, fits).saturating_sub(now)
        };
        let reset_after_ns =
            if after > 0 { nth_window_end(limit, start, last_indebted(limit, after)).saturating_sub(now) } else { 0 };
        Ok(Decision { allowed, limit: count, remaining: count.saturating_sub(after), retry_after_ns, reset_after_ns })
    }

    #[inline]
    fn idle_at(&self, limit: &Limit) -> u64 {
        if self.used == 0 {
            0
        } else {
            nth_window_end(limit, limit.align(self.window_start), last_indebted(limit, self.used))
        }
    }

    fn charge(&mut self, at: u64, limit: &Limit, cost: u64) -> Result<(), Error> {
        if cost == 0 {
            return Ok(());
        }
        let (start, used, _) = self.rolled(at, limit);
        *self = FixedWindow { window_start: start, used: used + counted_in_window(limit, used, cost) };
        Ok(())
    }

    fn refund(&mut self, at: u64, decision: &Decision, limit: &Limit, cost: u64) {
        // Counted in the window ending `reset_after` after the admission.
        let end = at.saturating_add(decision.reset_after_ns);
        if decision.allowed && self.used > 0 && limit.window_end(limit.align(self.window_start)) == end {
            self.used -= cost.min(self.used);
        }
    }

    fn snapshot(&self, now: u64, limit: &Limit) -> Snapshot {
        Snapshot { at: now, used: self.rolled(now, limit).1, previous: 0 }
    }

    fn from_snapshot(limit: &Limit, snapshot: &Snapshot) -> Self {
        FixedWindow { window_start: limit.window_at(snapshot.at).0, used: snapshot.used }
    }
}

impl FixedWindow {
    /// The window counting at `now`, its use and its end: now's window (with what the stored
    /// window's debt leaves spent in it), or the stored one if that is later (a clock gone
    /// backwards, or a charge dated in an earlier window), which still counts.
    #[inline]
    fn rolled(&self, now: u64, limit: &Limit) -> (u64, u64, u64) {
        let (current, end) = limit.window_at(now);
        if self.used == 0 {
            return (current, 0, end);
        }
        let start = limit.align(self.window_start);
        if self.window_start >= current {
            (start, self.used, limit.window_end(start))
        } else {
            (current, carried(limit, self.used, windows_between(limit, start, current)), end)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Algorithm;
    use crate::algorithm::test_util::{MS, SEC, T0, allowed, denied, limit};

    #[test]
    fn counts_per_epoch_aligned_window() {
        let l = limit(Algorithm::FixedWindow, "10/s");
        let mut s = FixedWindow::idle(&l);
        assert_eq!(s.check(T0 + 300 * MS, &l, 10).unwrap(), allowed(10, 0, 700 * MS));
        assert_eq!(s.check(T0 + 999 * MS, &l, 1).unwrap(), denied(10, 0, MS, MS));
        assert_eq!(s.check(T0 + SEC, &l, 1).unwrap(), allowed(10, 9, SEC));
        assert_eq!(s.check(T0 + 3 * SEC, &l, 0).unwrap(), allowed(10, 10, 0));
    }

    /// The boundary attack of "Rate Limiting Demystified - Part 2" and "Rate-limiting algorithms for defense": 100 per minute, 100 requests at 11:59:50 and 100 at 12:00:10 are all
    /// admitted: 200 requests within 20 seconds.
    #[test]
    fn the_seam_admits_two_windows_in_twenty_seconds() {
        let l = limit(Algorithm::FixedWindow, "100/1m");
        let noon = T0 - T0 % (60 * SEC) + 60 * SEC;
        let mut s = FixedWindow::idle(&l);
        let mut admitted = 0;
        for at in [noon - 10 * SEC, noon + 10 * SEC] {
            admitted += (0..100).filter(|_| s.check(at, &l, 1).unwrap().allowed).count();
        }
        assert_eq!(admitted, 200);
    }

    #[test]
    fn denial_and_peek_leave_state_unchanged() {
        let l = limit(Algorithm::FixedWindow, "10/s");
        let mut s = FixedWindow::idle(&l);
        assert_eq!(s.check(T0, &l, 0).unwrap(), allowed(10, 10, 0));
        assert_eq!(s, FixedWindow::idle(&l));
        s.check(T0, &l, 9).unwrap();
        let before = s;
        assert!(!s.check(T0 + MS, &l, 2).unwrap().allowed);
        assert_eq!(s, before);
        assert_eq!(s.check(T0, &l, 11), Err(Error::CostExceedsCapacity { cost: 11, capacity: 10 }));
    }

    #[test]
    fn a_charge_counts_in_its_window_and_may_exceed_the_count() {
        let l = limit(Algorithm::FixedWindow, "10/s");
        let mut s = FixedWindow::idle(&l);
        s.charge(T0 + 200 * MS, &l, 12).unwrap();
        assert_eq!(
            s.check(T0 + 300 * MS, &l, 1).unwrap(),
            denied(10, 0, 700 * MS, 1700 * MS),
            "its debt lasts into the next window"
        );
        assert_eq!(FixedWindow::from_snapshot(&l, &s.snapshot(T0 + 300 * MS, &l)), s);
        assert_eq!(s.check(T0 + SEC, &l, 9).unwrap(), denied(10, 8, SEC, SEC), "the next window owes the 2 past 10");
        assert!(s.check(T0 + SEC, &l, 8).unwrap().allowed, "and has 8 left");
    }

    /// 5000 charged under 1000 a minute: the next four minutes owe 4000, 3000, 2000 and 1000 of
    /// it, so nothing is admitted until the fifth, however the windows roll (issue 39: "its next
    /// requests pay for it").
    #[test]
    fn a_debt_past_the_count_is_carried_into_the_next_windows() {
        let l = limit(Algorithm::FixedWindow, "1000/1m");
        let minute = 60 * SEC;
        let t0 = T0 - T0 % (60 * SEC);
        let mut s = FixedWindow::idle(&l);
        s.charge(t0 + SEC, &l, 5000).unwrap();
        assert_eq!(s.idle_at(&l), t0 + 5 * minute, "the key lives as long as its debt");
        let d = s.check(t0 + 2 * SEC, &l, 1).unwrap();
        assert_eq!(d, denied(1000, 0, 5 * minute - 2 * SEC, 5 * minute - 2 * SEC), "room again in the fifth minute");
        for m in 1..5 {
            let d = s.check(t0 + m * minute, &l, 1).unwrap();
            assert_eq!(d, denied(1000, 0, (5 - m) * minute, (5 - m) * minute), "minute {m}");
            assert_eq!(s.snapshot(t0 + m * minute, &l).used, (5 - m) * 1000);
        }
        assert_eq!(s.check(t0 + 4 * minute + 59 * SEC, &l, 0).unwrap().remaining, 0, "the fourth minute owes 1000");
        assert!(s.check(t0 + 5 * minute, &l, 1000).unwrap().allowed, "the fifth starts afresh");
        let mut skipped = FixedWindow::idle(&l);
        skipped.charge(t0, &l, 2500).unwrap();
        assert_eq!(skipped.check(t0 + 2 * minute, &l, 501).unwrap().retry_after_ns, minute, "1500 then 500 owed");
        assert!(skipped.check(t0 + 2 * minute, &l, 500).unwrap().allowed);
    }

    /// A debt is carried as far as 52 days reach (the bucket family's bound): a charge of 2^52
    /// under 1 a minute is forgiven after 52 days, and the key's state lives that long.
    #[test]
    fn a_debt_is_forgiven_past_52_days() {
        let l = limit(Algorithm::FixedWindow, "1/1m");
        let t0 = T0 - T0 % (60 * SEC);
        let mut s = FixedWindow::idle(&l);
        s.charge(t0, &l, 1 << 52).unwrap();
        let days = 52 * 86_400 * SEC;
        assert_eq!(s.idle_at(&l), t0 + days);
        assert!(!s.check(t0 + days - 1, &l, 1).unwrap().allowed);
        assert!(s.check(t0 + days, &l, 1).unwrap().allowed);
    }

    /// 3 per calendar day in Europe/Berlin across the spring change (a 23-hour day): the reset
    /// is Berlin's next midnight, and a charge there is refunded in its own day.
    #[test]
    fn a_calendar_day_resets_at_the_zones_midnight() {
        let l = "3/day".parse::<crate::LimitBuilder>().unwrap().tz("Europe/Berlin").build().unwrap();
        let midnight = 1_774_738_800 * SEC; // 2026-03-29T00:00:00+01:00
        let next = midnight + 23 * 3_600 * SEC; // 2026-03-30T00:00:00+02:00
        let mut s = FixedWindow::idle(&l);
        let d = s.check(midnight + 10 * 3_600 * SEC, &l, 3).unwrap();
        assert_eq!(d, allowed(3, 0, next - midnight - 10 * 3_600 * SEC));
        assert_eq!(s.check(next - 1, &l, 1).unwrap(), denied(3, 0, 1, 1));
        assert_eq!(s.idle_at(&l), next);
        s.refund(midnight + 10 * 3_600 * SEC, &d, &l, 1);
        assert!(s.check(next - 1, &l, 1).unwrap().allowed, "the refund went back to its own day");
        assert!(s.check(next, &l, 3).unwrap().allowed, "the next day starts afresh");
    }

    #[test]
    fn clock_going_backwards_keeps_the_later_window() {
        let l = limit(Algorithm::FixedWindow, "10/s");
        let mut s = FixedWindow::idle(&l);
        s.check(T0 + SEC, &l, 10).unwrap();
        assert_eq!(s.check(T0 + 500 * MS, &l, 1).unwrap(), denied(10, 0, 1500 * MS, 1500 * MS));
    }
}
