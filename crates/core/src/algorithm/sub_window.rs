//! Sub-window counter (Figma): the period split into `slices` equal epoch-aligned slices; a
//! request is admitted iff the current slice and the `slices - 1` before it, plus its cost, sum
//! to at most `count`.
//!
//! The counters live in a ring of `slices` entries indexed by slice number modulo `slices`. The
//! state records the newest slice as an instant and the slice length it was counted in, so a key
//! whose limit changes (another slice count or period) is re-laid out rather than misread.

use super::{RateState, Snapshot, add, counted};
use crate::{Decision, Error, Limit};

/// Sub-window counter state.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SubWindow {
    /// Start of the newest slice written, in ns since the epoch (0 for a key with no history).
    newest: u64,
    /// The slice length the counts were taken in.
    slice_ns: u64,
    /// Cost admitted per slice; slot `j % slices` holds slice number `j` (`instant / slice_ns`)
    /// for `j` in `(newest - slices, newest]`.
    counts: Box<[u64]>,
}

impl SubWindow {
    /// Heap bytes held by the ring.
    #[must_use]
    pub fn heap_bytes(&self) -> usize {
        std::mem::size_of_val(&*self.counts)
    }

    /// The state as a store that keeps it elsewhere lays it out (the Redis script's value): the
    /// newest slice's start, the slice length the counts were taken in, and the counts of the
    /// slices up to the newest, oldest first ([`from_slices`](Self::from_slices) reads it back).
    #[must_use]
    pub fn slices(&self) -> (u64, u64, Vec<u64>) {
        let n = self.counts.len() as u64;
        if self.slice_ns == 0 || n == 0 {
            return (self.newest, self.slice_ns, self.counts.to_vec());
        }
        let newest = self.newest_slice();
        // Slices before the epoch's first (a key written in 1970) count nothing.
        let counts = (0..n).map(|back| newest.checked_sub(n - 1 - back).map_or(0, |j| self.counts[slot(j, n)]));
        (self.newest, self.slice_ns, counts.collect())
    }

    /// The state [`slices`](Self::slices) laid out: `counts` oldest first, the last one the newest
    /// slice's, which starts at `newest`. Any values make a state (one counted under another
    /// limit's slices is folded when a step meets it).
    #[must_use]
    pub fn from_slices(newest: u64, slice_ns: u64, counts: &[u64]) -> Self {
        let n = counts.len() as u64;
        let mut ring = counts.to_vec().into_boxed_slice();
        if slice_ns > 0 && n > 0 {
            let newest = newest / slice_ns;
            for (back, count) in counts.iter().enumerate() {
                // Slot of slice `newest - (n - 1 - back)`, counted modulo n from newest's.
                let behind = n - 1 - back as u64;
                ring[slot(newest % n + n - behind, n)] = *count;
            }
        }
        SubWindow { newest, slice_ns, counts: ring }
    }

    /// The newest slice's number.
    fn newest_slice(&self) -> u64 {
        self.newest / self.slice_ns
    }

    /// Slices `j` still in the window at slice `current`, with their counts, oldest first.
    fn live(&self, current: u64) -> impl DoubleEndedIterator<Item = (u64, u64)> + '_ {
        let n = self.counts.len();
        let newest = self.newest_slice();
        let first = (current + 1).saturating_sub(n as u64).max((newest + 1).saturating_sub(n as u64));
        // The live slices are a run of at most `n` slots from `first`'s, wrapping once: one
        // remainder for the run, not one per slice (a division each).
        let from = if n == 0 { 0 } else { slot(first, n as u64) };
        (first..=newest).map(move |j| {
            // `j - first < n` here, so the index is below `2n`.
            let k = from + usize::try_from(j - first).unwrap_or(usize::MAX);
            (j, self.counts[if k >= n { k - n } else { k }])
        })
    }

    /// Whether the counts were taken in `limit`'s slices.
    fn laid_out_for(&self, limit: &Limit) -> bool {
        self.counts.len() as u64 == limit.slices() && self.slice_ns == limit.period_ns() / limit.slices()
    }

    /// This state laid out for `limit`. A changed slice count or length folds every count into
    /// the slice holding the newest one: the same on every store, and never under-counting.
    fn conform(&mut self, limit: &Limit) {
        let (slices, slice_ns) = (limit.slices(), limit.period_ns() / limit.slices());
        if !self.laid_out_for(limit) {
            let total: u64 = self.counts.iter().fold(0, |sum, c| sum.saturating_add(*c));
            let mut counts = vec![0; usize::try_from(slices).unwrap_or(usize::MAX)].into_boxed_slice();
            self.newest -= self.newest % slice_ns;
            counts[slot(self.newest / slice_ns, slices)] = total;
            *self = SubWindow { newest: self.newest, slice_ns, counts };
        }
    }

    /// The slice counting at `now`: now's, or the newest written if later (a clock gone
    /// backwards, or a charge dated before it).
    fn current(&self, now: u64) -> u64 {
        (now / self.slice_ns).max(self.newest_slice())
    }

    /// Adds `cost` to slice `current` (not before the newest), clearing the slots of the slices
    /// that left the window. On an error nothing has changed.
    fn count(&mut self, current: u64, cost: u64) -> Result<(), Error> {
        let n = self.counts.len() as u64;
        let newest = self.newest_slice();
        let start = current.checked_mul(self.slice_ns).ok_or(Error::Overflow("slice start beyond 2^64 ns"))?;
        let at = slot(current, n);
        // A later slice's slot is among those cleared below.
        let counted = add(if current > newest { 0 } else { self.counts[at] }, cost, "slice counter")?;
        for j in (newest + 1)..=current.min(newest + n) {
            self.counts[slot(j, n)] = 0;
        }
        self.newest = start;
        self.counts[at] = counted;
        Ok(())
    }
}

fn slot(slice: u64, slices: u64) -> usize {
    // The remainder is below `slices`, which is the ring's length, so it fits in usize.
    usize::try_from(slice % slices).unwrap_or(0)
}

impl RateState for SubWindow {
    fn idle(limit: &Limit) -> Self {
        let slices = usize::try_from(limit.slices()).unwrap_or(usize::MAX);
        SubWindow {
            newest: 0,
            slice_ns: limit.period_ns() / limit.slices(),
            counts: vec![0; slices].into_boxed_slice(),
        }
    }

    #[inline]
    fn check(&mut self, now: u64, limit: &Limit, cost: u64) -> Result<Decision, Error> {
        limit.check_cost(cost)?;
        let count = limit.count();
        let mut state = std::borrow::Cow::Borrowed(&*self);
        if !state.laid_out_for(limit) {
            state.to_mut().conform(limit);
        }
        let (n, slice_len) = (limit.slices(), state.slice_ns);
        let current = state.current(now);
        let leaves_at = |j: u64| (j + n).saturating_mul(slice_len).saturating_sub(now);
        let used: u64 = state.live(current).fold(0, |sum, (_, c)| sum.saturating_add(c));
        let allowed = used.saturating_add(cost) <= count;
        let mut retry_after_ns = 0;
        if !allowed {
            let excess = used.saturating_add(cost) - count;
            let mut freed = 0u64;
            for (j, c) in state.live(current) {
                freed = freed.saturating_add(c);
                if freed >= excess {
                    retry_after_ns = leaves_at(j);
                    break;
                }
            }
        }
        if allowed && cost > 0 {
            match state {
                // Counted in place: no copy of the ring for each admission.
                std::borrow::Cow::Borrowed(_) => self.count(current, cost)?,
                std::borrow::Cow::Owned(mut next) => {
                    next.count(current, cost)?;
                    *self = next;
                }
            }
            state = std::borrow::Cow::Borrowed(&*self);
        }
        let after = if allowed { used + cost } else { used };
        let newest_used = state.live(current).rev().find(|&(_, c)| c > 0);
        Ok(Decision {
            allowed,
            limit: count,
            remaining: count.saturating_sub(after),
            retry_after_ns,
            reset_after_ns: newest_used.map_or(0, |(j, _)| leaves_at(j)),
        })
    }

    fn idle_at(&self, _: &Limit) -> u64 {
        let n = self.counts.len() as u64;
        let newest = self.newest_slice();
        (0..n.min(newest + 1))
            .map(|back| newest - back)
            .find(|&j| self.counts[slot(j, n)] > 0)
            .map_or(0, |j| (j + n).saturating_mul(self.slice_ns))
    }

    fn charge(&mut self, at: u64, limit: &Limit, cost: u64) -> Result<(), Error> {
        if cost == 0 {
            return Ok(());
        }
        self.conform(limit);
        let current = self.current(at);
        let used = self.live(current).fold(0, |sum: u64, (_, c)| sum.saturating_add(c));
        match counted(used, cost) {
            0 => Ok(()),
            cost => self.count(current, cost),
        }
    }

    fn refund(&mut self, at: u64, decision: &Decision, limit: &Limit, cost: u64) {
        // Counted in the slice that leaves the window `reset_after` after the admission.
        if !decision.allowed || cost == 0 || !self.laid_out_for(limit) {
            return;
        }
        let n = limit.slices();
        let Some(slice) = (at.saturating_add(decision.reset_after_ns) / self.slice_ns).checked_sub(n) else { return };
        let newest = self.newest_slice();
        if slice <= newest && slice + n > newest {
            let at = slot(slice, n);
            self.counts[at] -= cost.min(self.counts[at]);
        }
    }

    fn snapshot(&self, now: u64, limit: &Limit) -> Snapshot {
        let mut state = std::borrow::Cow::Borrowed(self);
        if !state.laid_out_for(limit) {
            state.to_mut().conform(limit);
        }
        let used = state.live(state.current(now)).fold(0, |sum: u64, (_, c)| sum.saturating_add(c));
        Snapshot { at: now, used, previous: 0 }
    }

    fn from_snapshot(limit: &Limit, snapshot: &Snapshot) -> Self {
        let mut state = SubWindow::idle(limit);
        if snapshot.used > 0 {
            let slice = snapshot.at / state.slice_ns;
            state.newest = slice * state.slice_ns;
            state.counts[slot(slice, limit.slices())] = snapshot.used;
        }
        state
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

    /// The layout a store keeps (newest slice, slice length, counts oldest first) reads back to
    /// the same state, and what its step does next is the same.
    #[test]
    fn the_slices_read_back_to_the_same_state() {
        let l = ten_per_second(10);
        let mut s = SubWindow::idle(&l);
        for (at, cost) in [(50, 4), (350, 2), (1_020, 1), (1_730, 3)] {
            s.check(T0 + at * MS, &l, cost).unwrap();
            let (newest, slice_ns, counts) = s.slices();
            assert_eq!((newest, slice_ns, counts.len()), (s.newest, 100 * MS, 10));
            assert_eq!(counts.last(), Some(&cost), "the newest slice's count comes last");
            assert_eq!(SubWindow::from_slices(newest, slice_ns, &counts), s);
        }
        let (newest, slice_ns, counts) = s.slices();
        assert_eq!(counts, [0, 0, 1, 0, 0, 0, 0, 0, 0, 3], "slices 0.8 s to 1.7 s");
        let mut read = SubWindow::from_slices(newest, slice_ns, &counts);
        assert_eq!(read.check(T0 + 1_800 * MS, &l, 7).unwrap(), s.check(T0 + 1_800 * MS, &l, 7).unwrap());
        // Values no step writes make a state too: folded when a step meets them.
        for (slice_ns, counts) in [(0, &[5, 5][..]), (7, &[][..]), (u64::MAX, &[1][..])] {
            let mut odd = SubWindow::from_slices(T0, slice_ns, counts);
            assert!(odd.check(T0, &l, 1).is_ok());
        }
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

    /// A key checked under two slice lengths is re-laid out, never pinned: under the old layout
    /// a slice *number* of one length read under another was centuries in the future.
    #[test]
    fn a_changed_slice_length_never_pins_the_key() {
        let per_second = ten_per_second(10);
        let per_hour = Limit::per_hour(10).algorithm(Algorithm::SubWindow).slices(10).build().unwrap();
        let mut s = SubWindow::idle(&per_second);
        s.check(T0, &per_second, 10).unwrap();
        assert!(!s.check(T0 + MS, &per_hour, 1).unwrap().allowed, "the 10 still count");
        let d = s.check(T0 + 2 * SEC, &per_second, 10).unwrap();
        assert!(d.allowed, "{d:?}");
        let now = T0 + 3 * SEC;
        let d = s.check(now, &per_hour, 1).unwrap();
        let hour_slice = now - now % (360 * SEC);
        assert_eq!(d.retry_after_ns, hour_slice + 3600 * SEC - now, "the counts stay until their slice leaves");
    }

    #[test]
    fn a_charge_counts_in_the_newest_slice() {
        let l = ten_per_second(10);
        let mut s = SubWindow::idle(&l);
        s.check(T0 + 500 * MS, &l, 2).unwrap();
        s.charge(T0, &l, 12).unwrap();
        assert_eq!(s.check(T0 + 500 * MS, &l, 0).unwrap().remaining, 0);
        assert!(s.check(T0 + 1500 * MS, &l, 10).unwrap().allowed);
        let snapshot = s.snapshot(T0 + 1500 * MS, &l);
        assert_eq!(snapshot.used, 10);
        assert_eq!(SubWindow::from_snapshot(&l, &snapshot), s);
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
