//! The sliding log, decided as `sliding_log.lua` decides it, on the same Redis list: element 0
//! is `base` (the running total before the first entry), elements 1..n are "t total" entries,
//! oldest first. The state is a view of the list: entries read one at a time (binary search),
//! pruned ones skipped (from `first` on), entries this call appends kept in `extra`, the newest
//! entry possibly re-totalled (`tail`); nothing is read or rewritten whole. The list is reached
//! through [`List`], and what to write is returned as [`Write`]s, so this file is pure.

use crate::algorithms::{Decision, Params, counter, fields, reply};
use crate::time::{BadState, Now};

/// Totals count from 0 again past 2^50 (as tollgate-core).
const REBASE_ABOVE: i128 = 1 << 50;

/// Why a call stopped: the key holds what tollgate did not write, or Redis answered an error
/// (already given as the reply).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stop {
    /// Not tollgate's state.
    Bad(BadState),
    /// Redis's own error, answered.
    Answered,
}

impl From<BadState> for Stop {
    fn from(bad: BadState) -> Self {
        Stop::Bad(bad)
    }
}

/// The key's list, as Redis holds it before the call writes.
pub trait List {
    /// `LLEN`.
    fn length(&mut self) -> Result<i128, Stop>;
    /// `LINDEX` (`None`: out of range).
    fn index(&mut self, i: i128) -> Result<Option<Vec<u8>>, Stop>;
}

/// A write to the key's list, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    /// `DEL`.
    Del,
    /// `RPUSH value`.
    Rpush(String),
    /// `LSET index value`.
    Lset(i128, String),
    /// `LTRIM start -1`.
    Ltrim(i128),
    /// `PEXPIRE ms`.
    Pexpire(i64),
}

#[derive(Debug, Clone)]
struct View {
    n: i128,
    base: i128,
    first: i128,
    extra: Vec<(i128, i128)>,
    tail: Option<(i128, i128)>,
    fresh: bool,
    shift: i128,
}

struct Log<'a, L: List> {
    list: &'a mut L,
    now: Now,
    /// List entries read during this call, by index, as stored (instant, running total): the
    /// searches of one call meet the same entries again, and the list does not change until the
    /// call writes.
    read: Vec<(i128, (i128, i128))>,
}

impl<L: List> Log<'_, L> {
    fn load(&mut self) -> Result<Option<View>, Stop> {
        let n = self.list.length()?;
        if n == 0 {
            return Ok(None);
        }
        let base = self.list.index(0)?.ok_or(BadState("a log shorter than its length"))?;
        let view =
            View { n: n - 1, base: counter(&base)?, first: 1, extra: Vec::new(), tail: None, fresh: false, shift: 0 };
        Ok(Some(view))
    }

    fn entry(&mut self, v: &View, i: i128) -> Result<(i128, i128), Stop> {
        if i > v.n {
            let at = usize::try_from(i - v.n - 1).map_err(|_| BadState("a log shorter than its length"))?;
            return v.extra.get(at).copied().ok_or(Stop::Bad(BadState("a log shorter than its length")));
        }
        if i == v.n
            && let Some(tail) = v.tail
        {
            return Ok(tail);
        }
        if let Some((_, (t, total))) = self.read.iter().find(|(at, _)| *at == i) {
            return Ok((*t, total - v.shift));
        }
        let value = self.list.index(i)?.ok_or(BadState("a log shorter than its length"))?;
        let f = fields(&value, 2)?;
        let (t, total) = (self.now.relative(f[0])?, counter(f[1])?);
        self.read.push((i, (t, total)));
        Ok((t, total - v.shift))
    }

    fn total_before(&mut self, v: &View, i: i128) -> Result<i128, Stop> {
        if i <= v.first { Ok(v.base) } else { Ok(self.entry(v, i - 1)?.1) }
    }

    /// The first index from `first` on whose entry satisfies `pred`, or last + 1.
    fn search(&mut self, v: &View, pred: impl Fn(i128, i128) -> bool) -> Result<i128, Stop> {
        let (mut lo, mut hi) = (v.first, last(v) + 1);
        while lo < hi {
            let mid = (lo + hi).div_euclid(2);
            let (t, total) = self.entry(v, mid)?;
            if pred(t, total) {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        Ok(lo)
    }

    /// The view after pruning what left the window at `at` and logging `cost` at `at` (or at the
    /// newest entry's time if later), and the stamp.
    fn add(&mut self, v: &View, period: i128, at: i128, cost: i128) -> Result<(View, i128), Stop> {
        let live = self.search(v, |t, _| t + period > at)?;
        let mut new = v.clone();
        new.base = self.total_before(v, live)?;
        new.first = live;
        if new.base > REBASE_ABOVE {
            // Count from 0 again: list entries are read shifted, and rewritten when stored.
            let by = new.base;
            new.shift = v.shift + by;
            new.base = 0;
            for e in &mut new.extra {
                e.1 -= by;
            }
            if let Some(tail) = &mut new.tail {
                tail.1 -= by;
            }
        }
        let newest = last(&new);
        if newest < live {
            new.extra.push((at, new.base + cost));
            return Ok((new, at));
        }
        let (t, total) = self.entry(&new, newest)?;
        if t >= at {
            // Same instant, or a clock gone backwards: add to the newest entry.
            if newest > new.n {
                let i = usize::try_from(newest - new.n - 1).unwrap_or(0);
                new.extra[i] = (t, total + cost);
            } else {
                new.tail = Some((t, total + cost));
            }
            return Ok((new, t));
        }
        new.extra.push((at, total + cost));
        Ok((new, at))
    }

    fn store(&mut self, v: &View, idle_ms: i64) -> Result<Vec<Write>, Stop> {
        let base = v.base.to_string();
        let pruned = (v.first - 1).min(v.n);
        let mut entries = Vec::new();
        if v.shift > 0 {
            // A rebase: every kept entry is rewritten, read before anything is written.
            for i in v.first..=v.n {
                entries.push(self.entry(v, i)?);
            }
        }
        let mut writes = Vec::new();
        if v.fresh || pruned == v.n || v.shift > 0 {
            // A fresh view had no list to delete.
            if !v.fresh {
                writes.push(Write::Del);
            }
            writes.push(Write::Rpush(base));
        } else if pruned > 0 {
            writes.push(Write::Lset(pruned, base));
            writes.push(Write::Ltrim(pruned));
        }
        if v.shift == 0
            && let Some((t, total)) = v.tail
            && v.n >= v.first
        {
            writes.push(Write::Lset(-1, format!("{} {total}", self.now.absolute(t))));
        }
        for (i, e) in v.extra.iter().enumerate() {
            if v.n + 1 + i128::try_from(i).unwrap_or(0) >= v.first {
                entries.push(*e);
            }
        }
        writes.extend(entries.iter().map(|(t, total)| Write::Rpush(format!("{} {total}", self.now.absolute(*t)))));
        writes.push(Write::Pexpire(idle_ms));
        Ok(writes)
    }
}

fn last(v: &View) -> i128 {
    v.n + i128::try_from(v.extra.len()).unwrap_or(0)
}

/// Decides one check on the key's list: the reply, and the writes to make, in order.
pub fn decide<L: List>(list: &mut L, p: &Params, now: Now) -> Result<([i64; 9], Vec<Write>), Stop> {
    let mut log = Log { list, now, read: Vec::new() };
    let loaded = log.load()?;
    let view = loaded.clone().unwrap_or(View {
        n: 0,
        base: 0,
        first: 1,
        extra: Vec::new(),
        tail: None,
        fresh: true,
        shift: 0,
    });
    let period = p.period;
    let live = log.search(&view, |t, _| t + period > 0)?;
    let newest_index = last(&view);
    let from = log.total_before(&view, live)?;
    let (mut used, mut newest) = (0, None);
    if newest_index >= live {
        let (t, total) = log.entry(&view, newest_index)?;
        (used, newest) = (total - from, Some(t));
    }
    let allowed = used + p.cost <= p.count;
    if allowed && p.cost > 0 {
        let (new, stamp) = log.add(&view, period, 0, p.cost)?;
        let decision = Decision {
            allowed: true,
            limit: p.count,
            remaining: p.count - used - p.cost,
            retry: 0,
            reset: stamp + period,
        };
        // The snapshot of the state after, read before anything is written.
        let after = snapshot(&mut log, Some(&new), period)?;
        let idle = stamp + period;
        let ttl = crate::algorithms::ttl_ms(idle, p.margin_ms);
        let writes = log.store(&new, ttl)?;
        return Ok((reply(&decision, after, 0, now), writes));
    }
    let mut retry = 0;
    if !allowed {
        // When the oldest entries holding at least the excess have left the window.
        let excess = used + p.cost - p.count;
        let enough = log.search(&view, |_, total| total >= from + excess)?;
        if enough <= newest_index {
            retry = log.entry(&view, enough)?.0 + period;
        }
    }
    let after = if allowed { used + p.cost } else { used };
    let reset = newest.map_or(0, |t| t + period);
    let decision = Decision { allowed, limit: p.count, remaining: p.count - after, retry, reset };
    let after = snapshot(&mut log, loaded.as_ref(), period)?;
    Ok((reply(&decision, after, 0, now), Vec::new()))
}

/// What is used at now of `view` (`snapshot` at now).
fn snapshot<L: List>(log: &mut Log<'_, L>, view: Option<&View>, period: i128) -> Result<i128, Stop> {
    let Some(v) = view else { return Ok(0) };
    let live = log.search(v, |t, _| t + period > 0)?;
    let newest = last(v);
    if newest < live {
        return Ok(0);
    }
    let (_, total) = log.entry(v, newest)?;
    Ok(total - log.total_before(v, live)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Redis list in memory, with the writes applied as Redis would.
    #[derive(Default)]
    struct Memory(Vec<Vec<u8>>);

    impl List for Memory {
        fn length(&mut self) -> Result<i128, Stop> {
            Ok(i128::try_from(self.0.len()).unwrap())
        }

        fn index(&mut self, i: i128) -> Result<Option<Vec<u8>>, Stop> {
            Ok(usize::try_from(i).ok().and_then(|i| self.0.get(i).cloned()))
        }
    }

    impl Memory {
        fn apply(&mut self, writes: &[Write]) {
            for write in writes {
                match write {
                    Write::Del => self.0.clear(),
                    Write::Rpush(v) => self.0.push(v.clone().into_bytes()),
                    Write::Lset(-1, v) => *self.0.last_mut().unwrap() = v.clone().into_bytes(),
                    Write::Lset(i, v) => self.0[usize::try_from(*i).unwrap()] = v.clone().into_bytes(),
                    Write::Ltrim(i) => drop(self.0.drain(..usize::try_from(*i).unwrap())),
                    Write::Pexpire(_) => {}
                }
            }
        }
    }

    use crate::algorithms::TEST_LIMIT as LIMIT;

    fn at(ns: i128) -> Now {
        Now { sec: 1_700_000_000 + ns.div_euclid(1_000_000_000), nsec: ns.rem_euclid(1_000_000_000) }
    }

    #[test]
    fn the_window_admits_its_count_then_its_entries_leave() {
        let mut list = Memory::default();
        let mut allowed = Vec::new();
        for ns in [0, 100_000_000, 200_000_000, 1_050_000_000, 1_150_000_000] {
            let (reply, writes) = decide(&mut list, &LIMIT, at(ns)).unwrap();
            list.apply(&writes);
            allowed.push(reply[0]);
        }
        assert_eq!(allowed, [1, 1, 0, 1, 1]);
        // The first two left as they aged: the header holds their total, two entries follow.
        assert_eq!(list.0.len(), 3, "{:?}", list.0);
        assert_eq!(list.0[0], b"2");
    }

    #[test]
    fn a_list_that_is_not_a_log_is_refused() {
        for list in [vec![b"x".to_vec()], vec![b"0".to_vec(), b"1700000000000000000".to_vec()]] {
            assert!(matches!(decide(&mut Memory(list), &LIMIT, at(0)), Err(Stop::Bad(_))));
        }
    }
}
