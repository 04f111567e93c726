//! Sliding window counter (Cloudflare): the previous and current epoch-aligned window counters,
//! the previous one weighted by how much of it the sliding window still overlaps.
//!
//! With `e = now - current_window_start`, the estimate `prev*(period - e)/period + curr` is
//! compared exactly, in 128-bit integers, as `prev*(period - e) + (curr + cost)*period <=
//! count*period`. Over calendar windows (a month in a time zone: [`Limit::window_at`]) `period`
//! is the *current* window's length: the previous window weighs the fraction of the current one
//! still to come (a 31-day month after a 28-day one weighs February by what is left of March). It assumes the previous window's traffic was uniform; synchronized bursts break
//! that assumption (34 admitted where 30 are allowed, in "Rate Limiter Algorithm Zoo"; see
//! docs/SEMANTICS.md), which `tollgate simulate over-grant` shows.
//!
//! A window charged past its count carries the excess into the windows after it as already spent
//! ([`debt`](super::debt)): when the windows roll, at most `count` of the current window becomes
//! the weighted previous one and the rest stays counted in full in the new current one, so the
//! estimate goes on from where it was (`prev*(P - 0)/P + curr` is the old window's count) and
//! falls by `count` per window, as the weighted previous window alone would; nothing is weighted
//! twice and nothing is forgotten.

use super::debt::{carried, counted_in_window, last_indebted, nth_window_end, windows_between};
use super::{RateState, Snapshot};
use crate::{Decision, Error, Limit};

/// Sliding window counter state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SlidingWindow {
    /// Start of the current window, in ns since the epoch.
    pub window_start: u64,
    /// Cost admitted in the window before it.
    pub prev: u64,
    /// Cost admitted in the current window.
    pub curr: u64,
}

impl SlidingWindow {
    /// The counters as seen from the window holding `now`: `(start, prev, curr, end)`. The
    /// `j`-th window after the stored one counts what the stored current window carries into it,
    /// and weighs at most `count` of what it carried into the window before.
    #[inline]
    fn rolled(&self, now: u64, limit: &Limit) -> (u64, u64, u64, u64) {
        let (current, end) = limit.window_at(now);
        let stored = limit.align(self.window_start);
        if stored >= current {
            // Same window, or a clock gone backwards: keep the later window's counters.
            return (stored, self.prev, self.curr, limit.window_end(stored));
        }
        let (prev, curr) = rolled_counts(limit, self.curr, windows_between(limit, stored, current));
        (current, prev, curr, end)
    }
}

/// The previous and current counts `windows` windows after a window that counted `curr`.
fn rolled_counts(limit: &Limit, curr: u64, windows: u64) -> (u64, u64) {
    let before = carried(limit, curr, windows - 1);
    (before.min(limit.count()), carried(limit, curr, windows))
}

impl RateState for SlidingWindow {
    fn idle(_: &Limit) -> Self {
        SlidingWindow::default()
    }

    #[inline]
    fn check(&mut self, now: u64, limit: &Limit, cost: u64) -> Result<Decision, Error> {
        limit.check_cost(cost)?;
        let count = limit.count();
        let (start, prev, curr, end) = self.rolled(now, limit);
        if end == u64::MAX {
            return Err(Error::Overflow("window end beyond 2^64 ns"));
        }
        // The current window's length (a calendar month's own).
        let period = end - start;
        let next_end = limit.window_end(end);
        if next_end == u64::MAX {
            return Err(Error::Overflow("next window end beyond 2^64 ns"));
        }
        let elapsed = now.saturating_sub(start);
        let (p, c) = (u128::from(period), u128::from(count));
        let weighted_prev = u128::from(prev) * u128::from(period - elapsed);
        let wanted = curr.checked_add(cost).ok_or(Error::Overflow("window counter"))?;
        let allowed = weighted_prev + u128::from(wanted) * p <= c * p;
        let after = if allowed { wanted } else { curr };
        if allowed && cost > 0 {
            *self = SlidingWindow { window_start: start, prev, curr: wanted };
        }
        // remaining = max n with weighted_prev + (after + n)*period <= count*period
        let remaining = (c * p)
            .checked_sub(weighted_prev)
            .map_or(0, |room| u64::try_from(room / p).unwrap_or(u64::MAX).saturating_sub(after));
        let retry_after_ns = if allowed {
            0
        } else if wanted <= count {
            // Within this window, once prev*(period - e') <= (count - wanted)*period.
            let fits = (u128::from(count - wanted) * p) / u128::from(prev);
            let at = start + period - u64::try_from(fits).unwrap_or(period).min(period);
            at - now
        } else {
            // Only in a later window: the first whose carried count leaves room for `cost` (the
            // next, unless in debt), once its weighted previous one does too:
            // prev_j*(len_j - e) <= (count - curr_j - cost)*len_j.
            let j = carried(limit, curr, 1).saturating_add(cost).saturating_sub(count).div_ceil(count.max(1)) + 1;
            let (prev_j, curr_j) = rolled_counts(limit, curr, j);
            let (j_start, j_end) = (nth_window_end(limit, start, j - 1), nth_window_end(limit, start, j));
            if j_end == u64::MAX {
                return Err(Error::Overflow("window end beyond 2^64 ns"));
            }
            let len = j_end - j_start;
            let fits = (u128::from(count - curr_j - cost) * u128::from(len)) / u128::from(prev_j.max(1));
            j_end - u64::try_from(fits).unwrap_or(len).min(len) - now
        };
        let reset_after_ns = if after > 0 {
            nth_window_end(limit, start, last_indebted(limit, after) + 1).saturating_sub(now)
        } else if prev > 0 {
            end - now
        } else {
            0
        };
        Ok(Decision { allowed, limit: count, remaining, retry_after_ns, reset_after_ns })
    }

    #[inline]
    fn idle_at(&self, limit: &Limit) -> u64 {
        let start = limit.align(self.window_start);
        let end = limit.window_end(start);
        match (self.prev, self.curr) {
            (_, c) if c > 0 => nth_window_end(limit, start, last_indebted(limit, c) + 1),
            (p, _) if p > 0 => end,
            _ => 0,
        }
    }

    fn charge(&mut self, at: u64, limit: &Limit, cost: u64) -> Result<(), Error> {
        if cost == 0 {
            return Ok(());
        }
        let (start, prev, curr, _) = self.rolled(at, limit);
        *self = SlidingWindow { window_start: start, prev, curr: curr + counted_in_window(limit, curr, cost) };
        Ok(())
    }

    fn refund(&mut self, at: u64, decision: &Decision, limit: &Limit, cost: u64) {
        // Counted in the window starting two windows before its state's reset.
        let reset = at.saturating_add(decision.reset_after_ns);
        let Some(start) = limit.window_before(reset).and_then(|last| limit.window_before(last)) else { return };
        if !decision.allowed || cost == 0 {
            return;
        }
        let stored = limit.align(self.window_start);
        if stored == start {
            self.curr -= cost.min(self.curr);
        } else if limit.window_before(stored) == Some(start) {
            self.prev -= cost.min(self.prev);
        }
    }

    fn snapshot(&self, now: u64, limit: &Limit) -> Snapshot {
        let (_, prev, curr, _) = self.rolled(now, limit);
        Snapshot { at: now, used: curr, previous: prev }
    }

    fn from_snapshot(limit: &Limit, snapshot: &Snapshot) -> Self {
        SlidingWindow { window_start: limit.window_at(snapshot.at).0, prev: snapshot.previous, curr: snapshot.used }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Algorithm;
    use crate::algorithm::test_util::{SEC, T0, limit};

    /// Cloudflare's example: 42 in the previous minute, 18 in the current one, 15 s into it:
    /// 42 * 45/60 + 18 = 49.5. Under a limit of 50 one more request fits (50.5 > 50 refuses the
    /// second); under 49 none does.
    #[test]
    fn cloudflare_example_estimates_49_5() {
        let minute = 60 * SEC;
        let start = T0 - T0 % minute;
        let state = SlidingWindow { window_start: start - minute, prev: 0, curr: 42 };
        let now = start + 15 * SEC;
        let mut s = state;
        s.check(now, &limit(Algorithm::SlidingWindow, "100/1m"), 18).unwrap();
        assert_eq!(s, SlidingWindow { window_start: start, prev: 42, curr: 18 });

        let l50 = limit(Algorithm::SlidingWindow, "50/1m");
        let mut at50 = s;
        // 49.5 + 1 = 50.5 > 50: refused. The estimate itself (49.5) fits under 50 with no room.
        let d = at50.check(now, &l50, 1).unwrap();
        assert!(!d.allowed);
        assert_eq!(d.remaining, 0);
        // 42 * (60 - e)/60 + 19 <= 50 once 60 - e <= 44.28 s, i.e. e >= 15.714.. s: rounded up
        // to the nanosecond the request fits at e = 60 - floor(31 * 60e9 / 42) ns.
        let fits_at = start + minute - (31 * minute) / 42;
        assert_eq!(d.retry_after_ns, fits_at - now);
        assert!(at50.check(fits_at, &l50, 1).unwrap().allowed);

        let l52 = limit(Algorithm::SlidingWindow, "52/1m");
        let d = s.check(now, &l52, 0).unwrap();
        assert_eq!(d.remaining, 2, "floor(52 - 31.5) - 18 = 2");
    }

    #[test]
    fn previous_window_weighs_down_linearly() {
        let l = limit(Algorithm::SlidingWindow, "10/s");
        let start = T0;
        let mut s = SlidingWindow::idle(&l);
        assert!(s.check(start, &l, 10).unwrap().allowed);
        // Next window, e = 0: prev 10 fully weighted.
        let d = s.check(start + SEC, &l, 1).unwrap();
        assert!(!d.allowed);
        assert_eq!(d.retry_after_ns, SEC / 10);
        // e = 0.5 s: 10 * 0.5 + 5 = 10.
        assert_eq!(s.check(start + SEC + SEC / 2, &l, 5).unwrap().remaining, 0);
        assert!(!s.check(start + SEC + SEC / 2, &l, 1).unwrap().allowed);
        assert_eq!(s.idle_at(&l), start + 3 * SEC);
    }

    #[test]
    fn denial_waits_for_the_next_window_when_current_is_full() {
        let l = limit(Algorithm::SlidingWindow, "10/s");
        let mut s = SlidingWindow::idle(&l);
        s.check(T0 + SEC / 2, &l, 10).unwrap();
        let d = s.check(T0 + SEC / 2, &l, 4).unwrap();
        // Next window: 10*(1 - e) + 4 <= 10 once e >= 0.4 s.
        assert_eq!(d.retry_after_ns, SEC / 2 + 4 * SEC / 10);
        assert_eq!(d.reset_after_ns, SEC / 2 + SEC);
        assert!(!s.check(T0 + SEC + 4 * SEC / 10 - 1, &l, 4).unwrap().allowed);
        assert!(s.check(T0 + SEC + 4 * SEC / 10, &l, 4).unwrap().allowed);
    }

    #[test]
    fn a_charge_counts_in_the_current_window_and_weighs_on_the_next() {
        let l = limit(Algorithm::SlidingWindow, "10/s");
        let mut s = SlidingWindow::idle(&l);
        s.charge(T0, &l, 20).unwrap();
        assert_eq!(s.idle_at(&l), T0 + 3 * SEC);
        let d = s.check(T0 + SEC / 2, &l, 1).unwrap();
        assert!(!d.allowed);
        // The next window weighs 10 and owes the other 10 in full: nothing fits in it; the one
        // after weighs those 10 (10 * (1 - e) + 1 <= 10 once e >= 0.1 s).
        assert_eq!((d.retry_after_ns, d.reset_after_ns), (2 * SEC + SEC / 10 - SEC / 2, 3 * SEC - SEC / 2));
        assert_eq!(s.snapshot(T0 + SEC, &l), Snapshot { at: T0 + SEC, used: 10, previous: 10 });
        assert!(!s.check(T0 + 2 * SEC - 1, &l, 1).unwrap().allowed);
        assert!(!s.check(T0 + 2 * SEC + SEC / 10 - 1, &l, 1).unwrap().allowed);
        assert!(s.check(T0 + 2 * SEC + SEC / 10, &l, 1).unwrap().allowed);
        let now = T0 + 2 * SEC + 6 * SEC / 10;
        assert_eq!(SlidingWindow::from_snapshot(&l, &s.snapshot(now, &l)), s);
    }

    /// The estimate goes on across the roll from where the charged window left it, and falls by
    /// `count` per window: 5000 under 1000 a minute, the estimate 30 s into each next minute is
    /// 4500, 3500, 2500, 1500, then 500 (room for 500) in the fifth.
    #[test]
    fn a_debt_falls_by_the_count_per_window() {
        let l = limit(Algorithm::SlidingWindow, "1000/1m");
        let minute = 60 * SEC;
        let t0 = T0 - T0 % minute;
        let mut s = SlidingWindow::idle(&l);
        s.charge(t0, &l, 5000).unwrap();
        for m in 1..5 {
            assert_eq!(s.check(t0 + m * minute + 30 * SEC, &l, 0).unwrap().remaining, 0, "minute {m}");
        }
        assert_eq!(s.check(t0 + 5 * minute + 30 * SEC, &l, 0).unwrap().remaining, 500);
        assert_eq!(s.idle_at(&l), t0 + 6 * minute);
    }

    /// 100 per calendar month in UTC, 90 admitted in February 2028 (29 days): a quarter into
    /// March (31 days), February weighs `90 * (1 - 7.75/31)` = 67.5, so 32 more fit; a month with
    /// no February use starts afresh. Denied, a request waits until March's own fraction frees it.
    #[test]
    fn calendar_months_weigh_the_previous_month_by_the_current_months_length() {
        let l: Limit =
            "100/month".parse::<crate::LimitBuilder>().unwrap().algorithm(Algorithm::SlidingWindow).build().unwrap();
        let march = 1_835_481_600 * SEC; // 2028-03-01T00:00:00Z
        let february = march - 29 * 86_400 * SEC;
        let mut s = SlidingWindow::idle(&l);
        assert!(s.check(february + 5 * SEC, &l, 90).unwrap().allowed);
        let quarter = march + 31 * 86_400 * SEC / 4;
        let d = s.check(quarter, &l, 0).unwrap();
        assert_eq!(d.remaining, 32, "floor(100 - 67.5) = 32");
        assert_eq!(d.reset_after_ns, march + 31 * 86_400 * SEC - quarter, "February's use leaves at April");
        assert!(s.check(quarter, &l, 32).unwrap().allowed);
        let denied = s.check(quarter, &l, 1).unwrap();
        // 90*(31d - e) + 33*31d <= 100*31d once 31d - e <= 67*31d/90.
        let april = march + 31 * 86_400 * SEC;
        assert_eq!(denied.retry_after_ns, april - (67 * 31 * 86_400 * SEC) / 90 - quarter);
        assert_eq!(denied.reset_after_ns, april + 30 * 86_400 * SEC - quarter, "March's use leaves at May");
        assert_eq!(s.idle_at(&l), april + 30 * 86_400 * SEC);
        assert_eq!(SlidingWindow::from_snapshot(&l, &s.snapshot(quarter, &l)), s);
    }

    #[test]
    fn denial_and_peek_leave_state_unchanged() {
        let l = limit(Algorithm::SlidingWindow, "10/s");
        let mut s = SlidingWindow::idle(&l);
        assert_eq!(s.check(T0, &l, 0).unwrap().remaining, 10);
        assert_eq!(s, SlidingWindow::idle(&l));
        s.check(T0, &l, 9).unwrap();
        let before = s;
        assert!(!s.check(T0 + SEC, &l, 2).unwrap().allowed);
        assert_eq!(s, before);
    }
}
