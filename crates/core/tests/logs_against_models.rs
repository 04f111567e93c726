//! Review of issue 41's core changes, against naive models written from the semantics: the
//! sliding log's first live entry (now found by galloping from the front) and the sub-window
//! counting an admission in place and finding its live slices with one remainder. Random traces
//! (times mostly forward, sometimes backwards, costs 0 to 3, peeks included), every decision's
//! fields compared.

use std::collections::HashMap;
use std::time::Duration;

use tollgate_core::{Algorithm, Decision, Limit, State};

const MS: u64 = 1_000_000;
const T0: u64 = 1_700_000_000_000 * MS;

/// xorshift64*: deterministic, no dependency.
struct Random(u64);

impl Random {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A trace: (now, cost), now moving on by 0 to 1.5 periods, one step in 16 going back.
fn trace(random: &mut Random, period: u64, steps: usize, count: u64) -> Vec<(u64, u64)> {
    let mut now = T0 + random.below(period);
    (0..steps)
        .map(|_| {
            if random.below(16) == 0 {
                now -= random.below(period / 2);
            } else {
                now += random.below(period * 3 / 2) / (1 + random.below(8));
            }
            (now, random.below(4.min(count + 1)))
        })
        .collect()
}

/// The sliding log as SEMANTICS defines it: every admission's stamp (never before the previous
/// one) and cost; an entry stamped `t` counts while `t + period > now`.
fn sliding_log_model(limit: &Limit, trace: &[(u64, u64)]) -> Vec<Decision> {
    let (count, period) = (limit.count(), limit.period_ns());
    let mut log: Vec<(u64, u64)> = Vec::new();
    trace
        .iter()
        .map(|&(now, cost)| {
            let live: Vec<(u64, u64)> = log.iter().copied().filter(|&(t, _)| t + period > now).collect();
            let used: u64 = live.iter().map(|&(_, c)| c).sum();
            let allowed = used + cost <= count;
            let leaves_at = |t: u64| (t + period).saturating_sub(now);
            let mut retry_after_ns = 0;
            let mut reset_after_ns = live.last().map_or(0, |&(t, _)| leaves_at(t));
            if allowed && cost > 0 {
                let stamp = log.last().map_or(now, |&(t, _)| t.max(now));
                // An admission drops the entries that left the window (a clock gone back later
                // does not bring them back).
                log.retain(|&(t, _)| t + period > now);
                log.push((stamp, cost));
                reset_after_ns = leaves_at(stamp);
            } else if !allowed {
                let excess = used + cost - count;
                let mut freed = 0;
                for &(t, c) in &live {
                    freed += c;
                    if freed >= excess {
                        retry_after_ns = leaves_at(t);
                        break;
                    }
                }
            }
            let after = if allowed { used + cost } else { used };
            Decision { allowed, limit: count, remaining: count.saturating_sub(after), retry_after_ns, reset_after_ns }
        })
        .collect()
}

/// The sub-window counter: counts per slice index; the slice counting is now's, or the newest
/// counted if later; the window is the `slices` slices up to it.
fn sub_window_model(limit: &Limit, trace: &[(u64, u64)]) -> Vec<Decision> {
    let (count, n) = (limit.count(), limit.slices());
    let slice = limit.period_ns() / n;
    let mut counts: HashMap<u64, u64> = HashMap::new();
    let mut newest = 0u64;
    trace
        .iter()
        .map(|&(now, cost)| {
            let current = (now / slice).max(newest);
            let window: Vec<(u64, u64)> = ((current + 1).saturating_sub(n)..=current)
                .map(|j| (j, counts.get(&j).copied().unwrap_or(0)))
                .collect();
            let leaves_at = |j: u64| ((j + n) * slice).saturating_sub(now);
            let used: u64 = window.iter().map(|&(_, c)| c).sum();
            let allowed = used + cost <= count;
            let mut retry_after_ns = 0;
            if !allowed {
                let excess = used + cost - count;
                let mut freed = 0;
                for &(j, c) in &window {
                    freed += c;
                    if freed >= excess {
                        retry_after_ns = leaves_at(j);
                        break;
                    }
                }
            }
            if allowed && cost > 0 {
                *counts.entry(current).or_default() += cost;
                newest = current;
            }
            let newest_used = (0..n)
                .map(|back| current.checked_sub(back))
                .find_map(|j| j.filter(|j| counts.get(j).copied().unwrap_or(0) > 0 && *j + n > current));
            let after = if allowed { used + cost } else { used };
            Decision {
                allowed,
                limit: count,
                remaining: count.saturating_sub(after),
                retry_after_ns,
                reset_after_ns: newest_used.map_or(0, leaves_at),
            }
        })
        .collect()
}

/// A model: the decisions of a trace of (now, cost) under a limit.
type Model = fn(&Limit, &[(u64, u64)]) -> Vec<Decision>;

fn compare(algorithm: Algorithm, model: Model) {
    let mut random = Random(0x2545_f491_4f6c_dd1d ^ algorithm as u64);
    for round in 0..3000 {
        let slices = [1, 2, 3, 4, 5, 8, 10][usize::try_from(random.below(7)).unwrap()];
        let period_ms = slices * (1 + random.below(20));
        // Long logs too (up to 300 entries): the gallop goes past its first steps.
        let count = if random.below(4) == 0 { 1 + random.below(300) } else { 1 + random.below(12) };
        let mut builder = Limit::builder(count, Duration::from_millis(period_ms)).algorithm(algorithm);
        if algorithm == Algorithm::SubWindow {
            builder = builder.slices(slices);
        }
        let limit = builder.build().unwrap();
        let steps = 1 + usize::try_from(random.below(80 + count * 2)).unwrap();
        let trace = trace(&mut random, period_ms * MS, steps, count);
        let expected = model(&limit, &trace);
        let mut state = State::idle(&limit);
        for (i, (&(now, cost), expected)) in trace.iter().zip(&expected).enumerate() {
            let decided = state.check(now, &limit, cost).unwrap();
            assert_eq!(
                &decided,
                expected,
                "round {round} {algorithm:?} {count}/{period_ms}ms slices {slices}: step {i} (now +{} ns, cost {cost})\ntrace {:?}",
                now - T0,
                trace[..=i].iter().map(|&(t, c)| (t - T0, c)).collect::<Vec<_>>()
            );
        }
    }
}

#[test]
fn the_sliding_log_decides_as_its_model() {
    compare(Algorithm::SlidingLog, sliding_log_model);
}

#[test]
fn the_sub_window_decides_as_its_model() {
    compare(Algorithm::SubWindow, sub_window_model);
}
