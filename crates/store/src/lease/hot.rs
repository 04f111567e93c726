//! Finding hot keys: a Space-Saving sketch of exponentially decayed counts.
//!
//! Each key's count decays with a time constant `TAU` (50 ms), so a key seen at a steady `r`
//! decisions a second approaches `r × TAU`. A key is hot once its count reaches
//! `hot_rate × TAU`: a key below `hot_rate` never gets there (one counted at a steady pace
//! reaches it within a few percent above), and one at `r` above it does
//! after `TAU × ln(r / (r − hot_rate))` of traffic: 120 ms at 1.1 × `hot_rate`, 55 ms at 1.5 ×,
//! 35 ms at 2 ×.
//!
//! The sketch follows `SLOTS` keys (enough for a key with 1/`SLOTS` of the traffic it sees: 500
//! decisions a second among 2M). A key not followed replaces the smallest of a few slots (sampled,
//! so a miss costs O(1)), inheriting its count as Space-Saving does, and that inherited part is
//! kept as the count's possible error: a key is hot only when its count *minus* that error
//! reaches the threshold, so cold keys churning through the slots never make one of them hot.

use foldhash::fast::FixedState;
use hashbrown::HashMap;

/// The counts' time constant.
pub(crate) const TAU_NS: u64 = 50_000_000;
/// Keys followed at once.
const SLOTS: usize = 4096;
/// Slots compared to choose the one a new key replaces.
const SAMPLE: usize = 8;

#[derive(Debug, Clone, Copy)]
struct Counter {
    hash: u64,
    count: f64,
    /// The part of `count` inherited from the key this one replaced.
    error: f64,
    at: u64,
}

impl Counter {
    /// How much `count` (and `error`) have decayed by `now`.
    fn decay(&self, now: u64) -> f64 {
        (-(now.saturating_sub(self.at) as f64) / TAU_NS as f64).exp()
    }
}

/// The sketch (one per node; callers hold it behind a lock).
#[derive(Debug)]
pub(crate) struct HotKeys {
    counters: Vec<Counter>,
    /// Each followed key's slot.
    slots: HashMap<u64, usize, FixedState>,
    threshold: f64,
}

impl HotKeys {
    /// A sketch finding keys above `hot_rate` decisions a second.
    pub(crate) fn new(hot_rate: u64) -> Self {
        let threshold = hot_rate as f64 * TAU_NS as f64 / 1e9;
        HotKeys { counters: Vec::new(), slots: HashMap::default(), threshold: threshold.max(1.0) }
    }

    /// Counts one decision of the key hashed `hash` at `now`; `Some(rate)` (its estimated
    /// decisions a second) when that makes it hot. The key is then forgotten: the caller leases it.
    pub(crate) fn hit(&mut self, hash: u64, now: u64) -> Option<f64> {
        let i = match self.slots.get(&hash) {
            Some(&i) => i,
            None if self.counters.len() < SLOTS => {
                self.counters.push(Counter { hash, count: 0.0, error: 0.0, at: now });
                self.slots.insert(hash, self.counters.len() - 1);
                self.counters.len() - 1
            }
            None => {
                let from = usize::try_from(hash % SLOTS as u64).unwrap_or(0);
                let i = (from..from + SAMPLE)
                    .map(|i| i % SLOTS)
                    .min_by(|&a, &b| {
                        let (a, b) = (&self.counters[a], &self.counters[b]);
                        (a.count * a.decay(now)).total_cmp(&(b.count * b.decay(now)))
                    })
                    .unwrap_or(from);
                let replaced = self.counters[i];
                self.slots.remove(&replaced.hash);
                self.slots.insert(hash, i);
                let inherited = replaced.count * replaced.decay(now);
                self.counters[i] = Counter { hash, count: inherited, error: inherited, at: now };
                i
            }
        };
        let counter = &mut self.counters[i];
        let decay = counter.decay(now);
        counter.count = counter.count * decay + 1.0;
        counter.error *= decay;
        counter.at = now;
        let own = counter.count - counter.error;
        if own < self.threshold {
            return None;
        }
        // Forgotten (its slot starts again from nothing): the caller leases it now.
        *counter = Counter { hash: counter.hash, count: 0.0, error: 0.0, at: now };
        Some(own * 1e9 / TAU_NS as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hits of one key at `rate` a second from 0 until it is hot: the time it took.
    fn time_to_hot(sketch: &mut HotKeys, hash: u64, rate: u64, limit_ns: u64) -> Option<u64> {
        let every = 1_000_000_000 / rate;
        (0..limit_ns / every).map(|i| i * every).find(|&t| sketch.hit(hash, t).is_some())
    }

    #[test]
    fn a_key_above_the_threshold_is_hot_within_about_100_ms() {
        let at = |rate| time_to_hot(&mut HotKeys::new(500), 1, rate, 1_000_000_000);
        let expected = |r: f64| TAU_NS as f64 * (r / (r - 500.0)).ln();
        for rate in [550u64, 750, 1000, 5000] {
            let took = at(rate).unwrap() as f64;
            // Discrete hits count a little more than the continuous rate: slightly earlier.
            let expected = expected(rate as f64);
            assert!(took <= expected && took >= 0.8 * expected, "{rate}/s: {took} ns, expected {expected}");
        }
        assert!(at(1000).unwrap() <= 40_000_000);
        assert_eq!(time_to_hot(&mut HotKeys::new(500), 1, 450, 10_000_000_000), None, "below the threshold");
    }

    #[test]
    fn many_cold_keys_do_not_make_a_cold_key_hot_nor_hide_a_hot_one() {
        let mut sketch = HotKeys::new(500);
        let mut hot_at = None;
        // 10,000 keys at 100/s each (1M/s in all), one key at 1,000/s among them.
        for step in 0..2_000_000u64 {
            let now = step * 1_000; // 1 µs apart
            if step % 1_000 == 0 && sketch.hit(u64::MAX, now).is_some() {
                hot_at.get_or_insert(now);
            }
            assert!(sketch.hit(step % 10_000, now).is_none(), "cold key {} found hot", step % 10_000);
        }
        assert!(hot_at.is_some_and(|t| t <= 50_000_000), "{hot_at:?}");
    }
}
