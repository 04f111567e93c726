//! Sliding window log: every admitted request's time and cost; the window is `(now - period, now]`.
//!
//! Exact, and memory O(count) per key: entries are pruned whenever one is added, so the log never
//! holds more than `count` entries (each costs at least 1), and requests admitted at the same
//! instant share one entry.

use std::collections::VecDeque;

use super::RateState;
use crate::{Decision, Error, Limit};

/// Sliding log state: `(time, cost)` of admitted requests, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct SlidingLog {
    entries: VecDeque<(u64, u64)>,
}

impl SlidingLog {
    /// The logged `(time, cost)` entries, oldest first (some may have left the window already).
    pub fn entries(&self) -> impl ExactSizeIterator<Item = (u64, u64)> + '_ {
        self.entries.iter().copied()
    }

    /// Heap bytes held by the log.
    #[must_use]
    pub fn heap_bytes(&self) -> usize {
        self.entries.capacity() * std::mem::size_of::<(u64, u64)>()
    }

    /// Index of the first entry still in the window at `now`: an entry stamped `t` leaves at
    /// `t + period`.
    fn first_live(&self, now: u64, period: u64) -> usize {
        self.entries.partition_point(|&(t, _)| t.saturating_add(period) <= now)
    }
}

impl RateState for SlidingLog {
    fn idle(_: &Limit) -> Self {
        SlidingLog { entries: VecDeque::new() }
    }

    fn check(&mut self, now: u64, limit: &Limit, cost: u64) -> Result<Decision, Error> {
        limit.check_cost(cost)?;
        let period = limit.period_ns();
        let count = limit.count();
        let live = self.first_live(now, period);
        let used: u64 = self.entries.range(live..).map(|&(_, c)| c).sum();
        let allowed = used.saturating_add(cost) <= count;
        let leaves_at = |t: u64| t.saturating_add(period).saturating_sub(now);
        let newest_live = self.entries.range(live..).next_back().map(|&(t, _)| t);
        let mut retry_after_ns = 0;
        let mut reset_after_ns = newest_live.map_or(0, leaves_at);
        if allowed && cost > 0 {
            self.entries.drain(..live);
            // A clock gone backwards stamps at the newest entry's time, keeping the log sorted.
            let stamp = newest_live.map_or(now, |t| t.max(now));
            match self.entries.back_mut() {
                Some((t, c)) if *t == stamp => *c += cost,
                _ => self.entries.push_back((stamp, cost)),
            }
            reset_after_ns = leaves_at(stamp);
        } else if !allowed {
            // Wait until enough of the oldest entries have left the window.
            let excess = used + cost - count;
            let mut freed = 0;
            for &(t, c) in self.entries.range(live..) {
                freed += c;
                if freed >= excess {
                    retry_after_ns = leaves_at(t);
                    break;
                }
            }
        }
        let after = if allowed { used + cost } else { used };
        Ok(Decision { allowed, limit: count, remaining: count.saturating_sub(after), retry_after_ns, reset_after_ns })
    }

    fn idle_at(&self, limit: &Limit) -> u64 {
        self.entries.back().map_or(0, |&(t, _)| t.saturating_add(limit.period_ns()))
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
        assert_eq!(s.entries().count(), 2, "the expired entry was pruned");
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
    fn clock_going_backwards_keeps_entries_counted() {
        let l = limit(Algorithm::SlidingLog, "2/s");
        let mut s = SlidingLog::idle(&l);
        s.check(T0 + SEC, &l, 2).unwrap();
        assert!(!s.check(T0, &l, 1).unwrap().allowed);
        assert!(s.check(T0 + 2 * SEC, &l, 1).unwrap().allowed);
    }
}
