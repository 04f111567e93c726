//! The measured rate of each (rule, key): an exponentially weighted moving average of the cost a
//! key sends per second, kept whether or not the key is limited, so that a dry-run rule, a
//! quarantine or `when_rate_above` can see how fast a client really sends (a bucket's level says
//! only how much of its burst is left).
//!
//! **The estimator.** Arrivals are irregular, so the decay uses the real time elapsed, not a
//! fixed tick: with `λ = ln 2 / half_life`, a key's level `L` decays as `L·e^(−λ·Δt)` and an
//! arrival of cost `c` adds `λ·c`. For a steady rate `r` the level tends to `r` (the sum of
//! `λ·c·e^(−λ·age)` over the arrivals is `r·∫λe^(−λs)ds`); each arrival's weight halves every
//! half-life. A key seen for only `t` has a level of `r·(1 − e^(−λt))`: the estimate divides by
//! that fraction (as Adam corrects its moments), counting at least one half-life, so that a new
//! steady sender reads right after about one half-life rather than 87.5 % of its rate after three,
//! and one request alone reads `2λ`, not infinitely fast.
//!
//! **Bounded memory.** Keys are sharded (no lock shared by every request); a full shard drops the
//! eighth of its keys with the lowest rate now, so the keys that remain are the recently busy
//! ones: a top-k. A dropped key that comes back starts afresh. A key takes one cache line (64
//! bytes), in a table at most half full: 128 to 256 bytes per key held, at most 16 MB at the
//! default bound. An entry keeps at most
//! [`MAX_KEY_BYTES`] of its key, for [`Engine::top`](crate::Engine::top) to show: entries are found by the key's
//! fingerprint, so a long header value costs no more than a short one.
//!
//! Only the rules that ask for it are measured (`tollgate_rules::Rule::measured`): the others
//! pay nothing.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::line_table::LineTable;
use crate::sharded::{SHARDS, Sharded};

/// The default bound on measured (rule, key) pairs.
pub const DEFAULT_MAX_RATED_KEYS: usize = 100_000;

/// The most talkers [`Engine::top`](crate::Engine::top) returns.
pub const MAX_TOP: usize = 100;

/// The most bytes of a key an entry keeps (for [`Engine::top`](crate::Engine::top); longer keys end in `…`).
pub const MAX_KEY_BYTES: usize = 256;

/// A key's measured rate. The rule and key are for [`Engine::top`](crate::Engine::top) only: the hot path reads the
/// numbers, in the entry itself.
///
/// Small (48 bytes, with its label behind a pointer): entries are looked up at random, and one
/// cache line per lookup (the entry and its fingerprint: see [`LineTable`]) is what a measured
/// rule costs.
#[derive(Debug)]
struct Entry {
    /// The decayed sum `Σ λ·c·e^(−λ·age)` at `last_ns`, per second.
    level: f64,
    first_ns: u64,
    last_ns: u64,
    half_life_ns: u64,
    /// Until when the key is limited (denied, mitigated, or would be under dry-run).
    limited_until_ns: u64,
    label: Box<Label>,
}

/// Whose rate an entry is: read by [`Engine::top`](crate::Engine::top) only.
#[derive(Debug)]
struct Label {
    rule: Arc<str>,
    /// The key's first [`MAX_KEY_BYTES`], and whether there was more.
    key: Box<[u8]>,
    cut: bool,
}

/// A key's rate just after an arrival, as [`Rates::record`] returns it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Measured {
    /// The rate, cost per second.
    pub(crate) rate: f64,
    /// What one more unit of cost would add to it now (`λ` over the correction).
    pub(crate) per_unit: f64,
}

/// One key of a rule, as [`Engine::top`](crate::Engine::top) reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct Talker {
    /// The key (lossy UTF-8; several characteristics are framed `LEN:VALUE`).
    pub key: String,
    /// Its measured rate, cost per second.
    pub rate_per_s: f64,
    /// Whether it is limited now: over its limit, mitigated, or over `when_rate_above`.
    pub limited: bool,
}

#[allow(clippy::cast_precision_loss)] // nanoseconds to seconds: 2^53 ns is 104 days
fn seconds(ns: u64) -> f64 {
    ns as f64 / 1e9
}

fn lambda(half_life_ns: u64) -> f64 {
    std::f64::consts::LN_2 / seconds(half_life_ns)
}

impl Entry {
    /// `λ = ln 2 / half-life`, per second.
    fn lambda(&self) -> f64 {
        lambda(self.half_life_ns)
    }

    /// The level decayed to `now`.
    fn level_at(&self, now: u64) -> f64 {
        self.level * (-self.lambda() * seconds(now.saturating_sub(self.last_ns))).exp()
    }

    /// The fraction of a steady rate the level holds after the time the key has been seen (at
    /// least one half-life): the estimate is the level over it. After 64 half-lives it is 1 to
    /// within 2⁻⁶⁴.
    fn seen_fraction(&self, now: u64) -> f64 {
        let seen = now.saturating_sub(self.first_ns).max(self.half_life_ns);
        if seen / 64 >= self.half_life_ns {
            return 1.0;
        }
        1.0 - (-self.lambda() * seconds(seen)).exp()
    }

    /// The estimate at `now`.
    fn rate_at(&self, now: u64) -> f64 {
        self.level_at(now) / self.seen_fraction(now)
    }

    fn add(&mut self, cost: u64, now: u64) -> Measured {
        #[allow(clippy::cast_precision_loss)] // costs are far below 2^53
        let cost = cost as f64;
        // An arrival stamped before the last (clocks read on other threads) adds undecayed.
        let now = self.last_ns.max(now);
        let lambda = self.lambda();
        self.level = self.level_at(now) + lambda * cost;
        self.last_ns = now;
        let fraction = self.seen_fraction(self.last_ns);
        Measured { rate: self.level / fraction, per_unit: lambda / fraction }
    }

    fn talker(&self, now: u64, rate_above: Option<f64>) -> Talker {
        let rate_per_s = self.rate_at(now);
        let mut key = String::from_utf8_lossy(&self.label.key).into_owned();
        if self.label.cut {
            key.push('…');
        }
        Talker {
            key,
            rate_per_s,
            limited: self.limited_until_ns > now || rate_above.is_some_and(|above| rate_per_s > above),
        }
    }
}

/// The measured rates of every rule's keys (see the module docs).
#[derive(Debug)]
pub(crate) struct Rates {
    table: Sharded<Entry, LineTable<Entry>>,
    per_shard: usize,
    held: AtomicUsize,
}

impl Rates {
    pub(crate) fn new(max: usize) -> Self {
        Rates { table: Sharded::new(), per_shard: max.div_ceil(SHARDS).max(1), held: AtomicUsize::new(0) }
    }

    /// Counts an arrival of `cost` for `key` under `rule` at `now`; returns the key's rate then.
    ///
    /// An entry is found by the 64-bit fingerprint of (rule, key) alone: comparing the rule's name
    /// and the key as well would cost two more cache misses on every request, against a chance of
    /// about 3·10⁻¹⁰ that two of 100,000 keys share a fingerprint (they would then share a rate).
    pub(crate) fn record(&self, rule: &Arc<str>, half_life_ns: u64, key: &[u8], cost: u64, now: u64) -> Measured {
        let (index, fingerprint) = self.table.locate(rule, key);
        let mut shard = self.table.shard(index);
        if let Some(entry) = shard.get_mut(fingerprint) {
            // A reloaded rule with another half-life keeps its level, decayed at the new pace.
            entry.half_life_ns = half_life_ns;
            return entry.add(cost, now);
        }
        if shard.len() >= self.per_shard {
            let dropped = evict(&mut shard, now);
            self.held.fetch_sub(dropped, Ordering::Relaxed);
        }
        let kept = key.get(..MAX_KEY_BYTES).unwrap_or(key);
        let mut entry = Entry {
            level: 0.0,
            first_ns: now,
            last_ns: now,
            half_life_ns,
            limited_until_ns: 0,
            label: Box::new(Label { rule: rule.clone(), key: kept.into(), cut: kept.len() < key.len() }),
        };
        let measured = entry.add(cost, now);
        shard.insert(fingerprint, entry);
        self.held.fetch_add(1, Ordering::Relaxed);
        measured
    }

    /// Marks `key` limited under `rule` until `until`.
    pub(crate) fn limited(&self, rule: &str, key: &[u8], until: u64) {
        let (index, fingerprint) = self.table.locate(rule, key);
        if let Some(entry) = self.table.shard(index).get_mut(fingerprint) {
            entry.limited_until_ns = entry.limited_until_ns.max(until);
        }
    }

    /// The keys of `rule` with the highest rates at `now`, highest first (at most `n`, and at
    /// most [`MAX_TOP`]); a key is limited if it was marked so until after `now`, or its rate is
    /// above `rate_above`.
    pub(crate) fn top(&self, rule: &str, n: usize, rate_above: Option<f64>, now: u64) -> Vec<Talker> {
        let n = n.min(MAX_TOP);
        // Under each lock, only what ranks an entry (its rate and where it is); the n kept are
        // then looked up again, so no lock is held while keys are copied or everything sorted.
        let mut ranked: Vec<(f64, usize, u64)> = Vec::new();
        for index in 0..SHARDS {
            let shard = self.table.shard(index);
            ranked
                .extend(shard.iter().filter(|(_, e)| *e.label.rule == *rule).map(|(f, e)| (e.rate_at(now), index, f)));
        }
        if ranked.len() > n && n > 0 {
            ranked.select_nth_unstable_by(n - 1, |a, b| b.0.total_cmp(&a.0));
        }
        ranked.truncate(n);
        let mut talkers: Vec<Talker> = ranked
            .into_iter()
            .filter_map(|(_, index, fingerprint)| {
                self.table.shard(index).get(fingerprint).map(|e| e.talker(now, rate_above))
            })
            .collect();
        talkers.sort_by(|a, b| b.rate_per_s.total_cmp(&a.rate_per_s).then_with(|| a.key.cmp(&b.key)));
        talkers
    }

    /// Measured keys held now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }
}

/// Drops the eighth of a full shard's keys with the lowest rate at `now`; returns how many.
fn evict(shard: &mut LineTable<Entry>, now: u64) -> usize {
    let mut rates: Vec<(f64, u64)> = shard.iter().map(|(f, e)| (e.rate_at(now), f)).collect();
    let victims = rates.len().div_ceil(8);
    if victims == 0 {
        return 0;
    }
    rates.select_nth_unstable_by(victims - 1, |a, b| a.0.total_cmp(&b.0));
    let mut dropped: Vec<u64> = rates[..victims].iter().map(|&(_, fingerprint)| fingerprint).collect();
    dropped.sort_unstable();
    let before = shard.len();
    shard.retain(|fingerprint, _| dropped.binary_search(&fingerprint).is_err());
    before - shard.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: u64 = 1_000_000_000;

    fn rule(name: &str) -> Arc<str> {
        Arc::from(name)
    }

    /// Sends `rate` per second for `duration_ns` from `start`, at even intervals.
    fn steady(rates: &Rates, name: &Arc<str>, key: &[u8], half_life: u64, rate: u64, start: u64, duration: u64) -> u64 {
        let interval = SECOND / rate;
        let mut now = start;
        while now < start + duration {
            rates.record(name, half_life, key, 1, now);
            now += interval;
        }
        now
    }

    #[test]
    fn a_steady_rate_is_measured_within_ten_percent_after_three_half_lives_then_decays() {
        let rates = Rates::new(1_000);
        let name = rule("api");
        let half_life = 2 * SECOND;
        let end = steady(&rates, &name, b"k", half_life, 50, 0, 3 * half_life);
        let top = rates.top("api", 10, None, end);
        let measured = top[0].rate_per_s;
        assert!((measured - 50.0).abs() <= 5.0, "{measured}");
        // Stopped: halves every half-life (a little faster while the time seen still corrects the
        // estimate: here from 1/(1 - 1/8) to 1/(1 - 1/16)).
        let later = rates.top("api", 10, None, end + half_life)[0].rate_per_s;
        let expected = measured / 2.0 * (1.0 - 1.0 / 8.0) / (1.0 - 1.0 / 16.0);
        assert!((later - expected).abs() <= 0.01, "{measured} then {later}, not {expected}");
        let much_later = rates.top("api", 10, None, end + 10 * half_life)[0].rate_per_s;
        assert!(much_later < 0.1, "{much_later}");
    }

    #[test]
    fn irregular_arrivals_decay_by_the_real_elapsed_time() {
        // 100 requests in bursts of 10 every 200 ms is 50/s; so is one request every 20 ms.
        let (bursty, even) = (Rates::new(100), Rates::new(100));
        let name = rule("r");
        let half_life = SECOND;
        let mut now = 0;
        for _ in 0..50 {
            for _ in 0..10 {
                bursty.record(&name, half_life, b"k", 1, now);
            }
            now += 200_000_000;
        }
        steady(&even, &name, b"k", half_life, 50, 0, now);
        let (b, e) = (bursty.top("r", 1, None, now)[0].rate_per_s, even.top("r", 1, None, now)[0].rate_per_s);
        assert!((e - 50.0).abs() < 2.5, "even {e}");
        assert!((b - 50.0).abs() < 10.0, "bursty {b}");
    }

    #[test]
    fn cost_counts_and_keys_and_rules_are_apart() {
        let rates = Rates::new(1_000);
        let (a, b) = (rule("a"), rule("b"));
        for i in 0..100 {
            rates.record(&a, SECOND, b"x", 2, i * SECOND / 10);
            rates.record(&a, SECOND, b"y", 1, i * SECOND / 10);
        }
        rates.record(&b, SECOND, b"x", 1, 0);
        let top = rates.top("a", 10, None, 10 * SECOND);
        assert_eq!(top.len(), 2);
        assert_eq!((top[0].key.as_str(), top[1].key.as_str()), ("x", "y"));
        assert!((top[0].rate_per_s - 20.0).abs() < 2.0 && (top[1].rate_per_s - 10.0).abs() < 1.0, "{top:?}");
        assert_eq!(rates.top("b", 10, None, 10 * SECOND).len(), 1);
    }

    #[test]
    fn a_single_request_is_not_infinitely_fast() {
        let rates = Rates::new(10);
        let measured = rates.record(&rule("r"), 2 * SECOND, b"k", 1, 5);
        assert!((measured.rate - 2.0 * std::f64::consts::LN_2 / 2.0).abs() < 1e-9, "{measured:?}");
        assert!((measured.per_unit - measured.rate).abs() < 1e-9, "one unit reads its own weight");
    }

    #[test]
    fn limited_keys_and_rates_above_a_threshold_are_reported() {
        let rates = Rates::new(100);
        let name = rule("r");
        let end = steady(&rates, &name, b"fast", SECOND, 100, 0, 3 * SECOND);
        steady(&rates, &name, b"slow", SECOND, 5, 0, 3 * SECOND);
        rates.limited("r", b"slow", end + SECOND);
        let top = rates.top("r", 10, Some(50.0), end);
        assert_eq!(
            top.iter().map(|t| (t.key.as_str(), t.limited)).collect::<Vec<_>>(),
            [("fast", true), ("slow", true)]
        );
        let top = rates.top("r", 10, None, end + 2 * SECOND);
        assert!(top.iter().all(|t| !t.limited), "{top:?}");
    }

    #[test]
    fn memory_is_bounded_and_the_busiest_keys_stay() {
        let rates = Rates::new(160);
        let name = rule("r");
        let mut now = 0;
        for i in 0..20_000u32 {
            rates.record(&name, SECOND, b"heavy", 1, now);
            rates.record(&name, SECOND, &i.to_le_bytes(), 1, now);
            now += 1_000_000;
        }
        assert!(rates.len() <= 160, "{}", rates.len());
        let top = rates.top("r", 5, None, now);
        assert_eq!(top[0].key, "heavy");
        assert!((top[0].rate_per_s - 1_000.0).abs() < 100.0, "{top:?}");
        assert_eq!(rates.top("r", 1_000, None, now).len(), MAX_TOP.min(rates.len()));
    }

    #[test]
    fn long_keys_are_kept_cut() {
        let rates = Rates::new(100);
        let long = vec![b'a'; 10_000];
        rates.record(&rule("r"), SECOND, &long, 1, 0);
        rates.record(&rule("r"), SECOND, &long, 1, 1);
        let top = rates.top("r", 10, None, 1);
        assert_eq!(top.len(), 1, "one key, found again by its fingerprint");
        assert_eq!(top[0].key, format!("{}…", "a".repeat(MAX_KEY_BYTES)));
    }
}
