//! Sliding window log: every admitted request's time and cost; the window is `(now - period, now]`.
//!
//! Exact, and memory O(count) per key: requests admitted at the same instant share one entry, and
//! entries that left the window are dropped whenever one is added. Each entry holds the running
//! total of the costs logged up to it, and `base` the total before the first one, so the cost in
//! the window, and when enough of it leaves, are found by binary search: a check is O(log n) and
//! an admission O(expired + 1), on any `count` up to [`MAX_LOG_COUNT`](crate::MAX_LOG_COUNT).
//! The Redis script keeps the same representation in a list.

use std::collections::VecDeque;

use super::{RateState, Snapshot, add, counted};
use crate::{Decision, Error, Limit};

/// Running totals are counted from 0 again once `base` passes this (2^50): with at most
/// [`MAX_COUNTER`](super::MAX_COUNTER) units in the window, every total stays below 2^53.
const REBASE_ABOVE: u64 = 1 << 50;

/// Sliding log state: `(time, running total)` of admitted requests, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct SlidingLog {
    /// `(t, total)`: admitted at `t`, and the total cost logged up to and including this entry.
    entries: VecDeque<(u64, u64)>,
    /// The total cost logged before the first entry.
    base: u64,
}

impl SlidingLog {
    /// The logged `(time, cost)` entries, oldest first (some may have left the window already).
    pub fn entries(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        let before = std::iter::once(self.base).chain(self.entries.iter().map(|&(_, total)| total));
        self.entries.iter().zip(before).map(|(&(t, total), before)| (t, total - before))
    }

    /// Heap bytes held by the log.
    #[must_use]
    pub fn heap_bytes(&self) -> usize {
        self.entries.capacity() * std::mem::size_of::<(u64, u64)>()
    }

    /// Index of the first entry still in the window at `now`: an entry stamped `t` leaves at
    /// `t + period`.
    fn first_live(&self, now: u64, period: u64) -> usize {
        let expired = |i: usize| self.entries[i].0.saturating_add(period) <= now;
        // Entries leave from the front, a few at a time: gallop from there (O(log expired), on
        // the log's first cache lines) before the binary search, instead of probing its middle.
        let len = self.entries.len();
        let mut bound = 1;
        while bound <= len && expired(bound - 1) {
            bound *= 2;
        }
        // Every entry before `bound / 2` has expired; the first live one is at most `bound - 1`.
        let (mut low, mut high) = (bound / 2, bound.min(len));
        while low < high {
            let mid = low + (high - low) / 2;
            if expired(mid) {
                low = mid + 1;
            } else {
                high = mid;
            }
        }
        low
    }

    /// The running total before entry `i`.
    fn total_before(&self, i: usize) -> u64 {
        if i == 0 { self.base } else { self.entries[i - 1].1 }
    }

    /// The cost logged from entry `live` on.
    fn used_from(&self, live: usize) -> u64 {
        self.entries.back().map_or(0, |&(_, total)| total - self.total_before(live))
    }

    /// Drops the entries before `live`, then logs `cost` at `now` (or at the newest entry's time,
    /// if that is later: a clock gone backwards keeps the log sorted). Returns the stamp.
    fn log(&mut self, live: usize, now: u64, cost: u64) -> Result<u64, Error> {
        self.base = self.total_before(live);
        self.entries.drain(..live);
        if self.base > REBASE_ABOVE {
            // Keep every total below 2^53 (the Redis script's exact range): count from 0 again.
            for entry in &mut self.entries {
                entry.1 -= self.base;
            }
            self.base = 0;
        }
        let stamp = self.entries.back().map_or(now, |&(t, _)| t.max(now));
        let total = add(self.entries.back().map_or(self.base, |&(_, total)| total), cost, "log total")?;
        match self.entries.back_mut() {
            Some(last) if last.0 == stamp => last.1 = total,
            _ => self.entries.push_back((stamp, total)),
        }
        if self.entries.capacity() > 4 * self.entries.len().max(4) {
            self.entries.shrink_to_fit();
        }
        Ok(stamp)
    }
}

impl RateState for SlidingLog {
    fn idle(_: &Limit) -> Self {
        SlidingLog::default()
    }

    #[inline]
    fn check(&mut self, now: u64, limit: &Limit, cost: u64) -> Result<Decision, Error> {
        limit.check_cost(cost)?;
        let period = limit.period_ns();
        let count = limit.count();
        let live = self.first_live(now, period);
        let used = self.used_from(live);
        let allowed = used.saturating_add(cost) <= count;
        let leaves_at = |t: u64| t.saturating_add(period).saturating_sub(now);
        let newest_live = self.entries.range(live..).next_back().map(|&(t, _)| t);
        let mut retry_after_ns = 0;
        let mut reset_after_ns = newest_live.map_or(0, leaves_at);
        if allowed && cost > 0 {
            reset_after_ns = leaves_at(self.log(live, now, cost)?);
        } else if !allowed {
            // Wait until the oldest entries holding at least the excess have left the window.
            let excess = used.saturating_add(cost) - count;
            let from = self.total_before(live);
            // Totals increase along the log, and those before `live` are at most `from`.
            let enough = self.entries.partition_point(|&(_, total)| total < from.saturating_add(excess));
            retry_after_ns = self.entries.get(enough).map_or(0, |&(t, _)| leaves_at(t));
        }
        let after = if allowed { used + cost } else { used };
        Ok(Decision { allowed, limit: count, remaining: count.saturating_sub(after), retry_after_ns, reset_after_ns })
    }

    #[inline]
    fn idle_at(&self, limit: &Limit) -> u64 {
        self.entries.back().map_or(0, |&(t, _)| t.saturating_add(limit.period_ns()))
    }

    fn charge(&mut self, at: u64, limit: &Limit, cost: u64) -> Result<(), Error> {
        if cost == 0 {
            return Ok(());
        }
        let live = self.first_live(at, limit.period_ns());
        let cost = counted(self.used_from(live), cost);
        if cost > 0 {
            self.log(live, at, cost)?;
        }
        Ok(())
    }

    fn refund(&mut self, at: u64, decision: &Decision, limit: &Limit, cost: u64) {
        // Logged at the entry that leaves the window `reset_after` after the admission.
        let Some(stamp) = at.saturating_add(decision.reset_after_ns).checked_sub(limit.period_ns()) else { return };
        let i = self.entries.partition_point(|&(t, _)| t < stamp);
        if !decision.allowed || cost == 0 || self.entries.get(i).is_none_or(|&(t, _)| t != stamp) {
            return;
        }
        let logged = self.entries[i].1 - self.total_before(i);
        let refunded = cost.min(logged);
        for entry in self.entries.range_mut(i..) {
            entry.1 -= refunded;
        }
        if refunded == logged {
            // An empty entry goes: the log stays at most `count` entries long.
            self.entries.remove(i);
        }
    }

    fn snapshot(&self, now: u64, limit: &Limit) -> Snapshot {
        Snapshot { at: now, used: self.used_from(self.first_live(now, limit.period_ns())), previous: 0 }
    }

    fn from_snapshot(_: &Limit, snapshot: &Snapshot) -> Self {
        let entries = if snapshot.used > 0 { VecDeque::from([(snapshot.at, snapshot.used)]) } else { VecDeque::new() };
        SlidingLog { entries, base: 0 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Algorithm;
    use crate::algorithm::test_util::{MS, SEC, T0, allowed, denied, limit};

    #[test]
    fn window_is_open_at_the_old_end_and_closed_at_now() {
        let l = limit(Algorithm::SlidingLog, "2/s");
        let mut s = SlidingLog::idle(&l);
        assert_eq!(s.check(T0, &l, 1).unwrap(), allowed(2, 1, SEC));
        assert_eq!(s.check(T0 + 400 * MS, &l, 1).unwrap(), allowed(2, 0, SEC));
        assert_eq!(s.check(T0 + SEC - 1, &l, 1).unwrap(), denied(2, 0, 1, 400 * MS + 1));
        // The entry stamped T0 leaves at exactly T0 + 1s.
        assert_eq!(s.check(T0 + SEC, &l, 1).unwrap(), allowed(2, 0, SEC));
        assert_eq!(
            s.entries().collect::<Vec<_>>(),
            [(T0 + 400 * MS, 1), (T0 + SEC, 1)],
            "the expired entry was pruned"
        );
    }

    #[test]
    fn retry_after_waits_for_enough_entries_to_leave() {
        let l = limit(Algorithm::SlidingLog, "10/s");
        let mut s = SlidingLog::idle(&l);
        for i in 0..10 {
            s.check(T0 + i * MS, &l, 1).unwrap();
        }
        assert_eq!(s.check(T0 + 990 * MS, &l, 2).unwrap(), denied(10, 0, 11 * MS, 19 * MS));
    }

    #[test]
    fn memory_is_bounded_by_count() {
        let l = limit(Algorithm::SlidingLog, "100/s");
        let mut s = SlidingLog::idle(&l);
        for i in 0..100_000 {
            s.check(T0 + i * 100_000, &l, 1).unwrap();
            assert!(s.entries.len() <= 100);
        }
        for _ in 0..1000 {
            s.check(T0 + 20 * SEC, &l, 1).unwrap();
        }
        assert_eq!(s.entries.len(), 1, "same-instant admissions share one entry");
        assert!(s.heap_bytes() <= 16 * 16, "the deque shrinks back: {} bytes", s.heap_bytes());
    }

    #[test]
    fn a_log_at_its_maximum_count_decides_exactly() {
        let l = Limit::per_hour(crate::MAX_LOG_COUNT).algorithm(Algorithm::SlidingLog).build().unwrap();
        let mut s = SlidingLog::idle(&l);
        for i in 0..crate::MAX_LOG_COUNT {
            assert!(s.check(T0 + i, &l, 1).unwrap().allowed);
        }
        let d = s.check(T0 + SEC, &l, 3).unwrap();
        assert_eq!((d.allowed, d.remaining, d.retry_after_ns), (false, 0, 3600 * SEC + 2 - SEC));
        assert!(s.check(T0 + 3600 * SEC + 2, &l, 3).unwrap().allowed);
        assert_eq!(s.entries.len() as u64, crate::MAX_LOG_COUNT - 2, "three left, one joined");
    }

    #[test]
    fn denial_and_peek_leave_state_unchanged() {
        let l = limit(Algorithm::SlidingLog, "10/s");
        let mut s = SlidingLog::idle(&l);
        assert_eq!(s.check(T0, &l, 0).unwrap(), allowed(10, 10, 0));
        s.check(T0, &l, 9).unwrap();
        let before = s.clone();
        assert!(s.check(T0 + 5 * SEC - 1, &l, 11).is_err());
        assert!(!s.check(T0 + MS, &l, 2).unwrap().allowed);
        assert_eq!(s.check(T0 + 5 * SEC, &l, 0).unwrap(), allowed(10, 10, 0));
        assert_eq!(s, before);
    }

    #[test]
    fn a_charge_is_logged_even_over_the_count() {
        let l = limit(Algorithm::SlidingLog, "10/s");
        let mut s = SlidingLog::idle(&l);
        s.check(T0 + 500 * MS, &l, 4).unwrap();
        // Dated before the newest entry: logged at the newest entry's time.
        s.charge(T0, &l, 9).unwrap();
        assert_eq!(s.entries().collect::<Vec<_>>(), [(T0 + 500 * MS, 13)]);
        assert_eq!(s.check(T0 + SEC, &l, 1).unwrap(), denied(10, 0, 500 * MS, 500 * MS));
        let snapshot = s.snapshot(T0 + SEC, &l);
        assert_eq!(snapshot.used, 13);
        assert!(!SlidingLog::from_snapshot(&l, &snapshot).check(T0 + 1500 * MS, &l, 1).unwrap().allowed);
    }

    #[test]
    fn clock_going_backwards_keeps_entries_counted() {
        let l = limit(Algorithm::SlidingLog, "2/s");
        let mut s = SlidingLog::idle(&l);
        s.check(T0 + SEC, &l, 2).unwrap();
        assert!(!s.check(T0, &l, 1).unwrap().allowed);
        assert!(s.check(T0 + 2 * SEC, &l, 1).unwrap().allowed);
    }
}
