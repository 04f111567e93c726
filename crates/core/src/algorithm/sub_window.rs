//! Sub-window counter (Figma): the period split into `slices` equal epoch-aligned slices; a
//! request is admitted iff the current slice and the `slices - 1` before it, plus its cost, sum
//! to at most `count`.
//!
//! The counters live in a ring of `slices` entries indexed by slice number modulo `slices`.

use super::RateState;
use crate::{Decision, Error, Limit};

/// Sub-window counter state.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SubWindow {
    /// Slice number (`now / slice_length`) of the newest slice written.
    newest: u64,
    /// Cost admitted per slice; slot `j % slices` holds slice `j` for `j` in
    /// `(newest - slices, newest]`.
    counts: Box<[u64]>,
}

impl SubWindow {
    /// Heap bytes held by the ring.
    #[must_use]
    pub fn heap_bytes(&self) -> usize {
        std::mem::size_of_val(&*self.counts)
    }

    /// Slices `j` still in the window at slice `current`, with their counts, oldest first.
    fn live(&self, current: u64) -> impl DoubleEndedIterator<Item = (u64, u64)> + '_ {
        let n = self.counts.len() as u64;
        let first = (current + 1).saturating_sub(n).max((self.newest + 1).saturating_sub(n));
        (first..=self.newest).map(move |j| (j, self.counts[slot(j, n)]))
    }

    /// This state laid out for `slices` slices. A changed limit folds every count into the
    /// newest slice: over-counting briefly, never under-counting.
    fn conform(&mut self, slices: u64) {
        if self.counts.len() as u64 != slices {
            let total: u64 = self.counts.iter().sum();
            let mut counts = vec![0; usize::try_from(slices).unwrap_or(usize::MAX)].into_boxed_slice();
            counts[slot(self.newest, slices)] = total;
            self.counts = counts;
        }
    }
}

fn slot(slice: u64, slices: u64) -> usize {
    // The remainder is below `slices`, which is the ring's length, so it fits in usize.
    usize::try_from(slice % slices).unwrap_or(0)
}

impl RateState for SubWindow {
    fn idle(limit: &Limit) -> Self {
        let slices = usize::try_from(limit.slices()).unwrap_or(usize::MAX);
        SubWindow { newest: 0, counts: vec![0; slices].into_boxed_slice() }
    }

    fn check(&mut self, now: u64, limit: &Limit, cost: u64) -> Result<Decision, Error> {
        limit.check_cost(cost)?;
        let n = limit.slices();
        let count = limit.count();
        let slice_len = limit.period_ns() / n;
        self.conform(n);
        // A clock gone backwards counts from the newest slice written.
        let current = (now / slice_len).max(self.newest);
        let leaves_at = |j: u64| (j + n).saturating_mul(slice_len).saturating_sub(now);
        let used: u64 = self.live(current).map(|(_, c)| c).sum();
        let allowed = used.saturating_add(cost) <= count;
        let mut retry_after_ns = 0;
        if allowed && cost > 0 {
            // Clear the slots of slices that left the window, then count into the current one.
            for j in (self.newest + 1)..=current.min(self.newest + n) {
                self.counts[slot(j, n)] = 0;
            }
            self.newest = current;
            self.counts[slot(current, n)] += cost;
        } else if !allowed {
            let excess = used + cost - count;
            let mut freed = 0;
            for (j, c) in self.live(current) {
                freed += c;
                if freed >= excess {
                    retry_after_ns = leaves_at(j);
                    break;
                }
            }
        }
        let after = if allowed { used + cost } else { used };
        let newest_used = self.live(current).rev().find(|&(_, c)| c > 0);
        Ok(Decision {
            allowed,
            limit: count,
            remaining: count.saturating_sub(after),
            retry_after_ns,
            reset_after_ns: newest_used.map_or(0, |(j, _)| leaves_at(j)),
        })
    }

    fn idle_at(&self, limit: &Limit) -> u64 {
        let n = self.counts.len() as u64;
        let slice_len = limit.period_ns() / limit.slices();
        (0..n.min(self.newest + 1))
            .map(|back| self.newest - back)
            .find(|&j| self.counts[slot(j, n)] > 0)
            .map_or(0, |j| (j + n).saturating_mul(slice_len))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Algorithm;
    use crate::algorithm::test_util::{MS, SEC, T0};

    fn ten_per_second(slices: u64) -> Limit {
        Limit::per_second(10).algorithm(Algorithm::SubWindow).slices(slices).build().unwrap()
    }

    #[test]
    fn slices_leave_the_window_one_by_one() {
        let l = ten_per_second(10);
        let mut s = SubWindow::idle(&l);
        let d = s.check(T0 + 50 * MS, &l, 4).unwrap();
        assert_eq!((d.allowed, d.remaining, d.reset_after_ns), (true, 6, 950 * MS));
        s.check(T0 + 350 * MS, &l, 6).unwrap();
        let d = s.check(T0 + 900 * MS, &l, 5).unwrap();
        // The 4 in slice [0, 100ms) leave at 1.0 s: not enough; the 6 leave at 1.3 s.
        assert_eq!((d.allowed, d.retry_after_ns, d.reset_after_ns), (false, 400 * MS, 400 * MS));
        let d = s.check(T0 + SEC, &l, 4).unwrap();
        assert_eq!((d.allowed, d.remaining), (true, 0));
        assert!(!s.check(T0 + 1300 * MS - 1, &l, 1).unwrap().allowed);
        assert_eq!(s.check(T0 + 1300 * MS, &l, 6).unwrap().remaining, 0);
        assert_eq!(s.idle_at(&l), T0 + 2300 * MS);
    }

    #[test]
    fn a_long_gap_clears_every_slice() {
        let l = ten_per_second(10);
        let mut s = SubWindow::idle(&l);
        s.check(T0, &l, 10).unwrap();
        let d = s.check(T0 + 3600 * SEC, &l, 10).unwrap();
        assert_eq!((d.allowed, d.remaining), (true, 0));
        assert_eq!(s.counts.iter().sum::<u64>(), 10);
    }

    #[test]
    fn a_changed_slice_count_folds_counts_conservatively() {
        let l10 = ten_per_second(10);
        let l5 = ten_per_second(5);
        let mut s = SubWindow::idle(&l10);
        s.check(T0, &l10, 6).unwrap();
        s.check(T0 + 500 * MS, &l10, 3).unwrap();
        assert!(!s.check(T0 + 500 * MS, &l5, 2).unwrap().allowed);
        assert!(s.check(T0 + 500 * MS, &l5, 1).unwrap().allowed);
    }

    #[test]
    fn denial_and_peek_leave_state_unchanged() {
        let l = ten_per_second(10);
        let mut s = SubWindow::idle(&l);
        assert_eq!(s.check(T0, &l, 0).unwrap().reset_after_ns, 0);
        s.check(T0, &l, 9).unwrap();
        let before = s.clone();
        assert!(!s.check(T0 + 950 * MS, &l, 2).unwrap().allowed);
        assert!(s.check(T0 + 950 * MS, &l, 0).unwrap().allowed);
        assert_eq!(s, before);
    }
}
