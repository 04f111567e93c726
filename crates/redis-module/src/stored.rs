//! The adapter between the script's stored values and tollgate-core's states: a key's value is
//! read into the core's state of its algorithm, the core's own step decides at the call's now,
//! and the state after is written back exactly as the script writes it (`tollgate-store`'s
//! `lua/`), so that the module and the script may serve the same keys in turn. No algorithm is
//! written here: only the stored format.
//!
//! The format: instants as decimal ns since the epoch, counters as decimal integers, fields
//! separated by spaces (GCRA `tat interval`, the emission interval its TAT is scheduled in, or `tat` alone as
//! written before it was recorded; token bucket `tokens last interval capacity`; leaky bucket
//! `level last interval`, each without its last fields as written before they were; fixed
//! window `start used`; sliding window `start prev curr`; sub-window `newest slice counts…`,
//! oldest first). The script computes in ns relative to now and clamps an instant further than
//! `FAR_SEC` from now; instants are clamped here the same way, so that both read any value alike.
//! Counters above 2^63 are refused (tollgate never counts more), as the script's exact range
//! would not hold them.

use std::fmt::Write as _;

use tollgate_core::algorithm::{FixedWindow, Gcra, LeakyBucket, SlidingWindow, SubWindow, TokenBucket};
use tollgate_core::{Algorithm, Decision, Limit, State};
use tollgate_store::layout::{FAR_SEC, REPLY_CHECK, REPLY_NOW};

const BILLION: i128 = 1_000_000_000;

/// The call's now: seconds and nanoseconds since the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Now {
    /// Seconds.
    pub sec: i128,
    /// Nanoseconds within the second.
    pub nsec: i128,
}

impl Now {
    /// ns since the epoch (the caller's bounds keep it within `u64`).
    pub(crate) fn ns(self) -> u64 {
        u64::try_from(self.sec * BILLION + self.nsec).unwrap_or(u64::MAX)
    }
}

/// Why a stored value cannot be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadState(pub &'static str);

/// Why a call is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// The key holds what tollgate did not write (what, in words).
    BadState(&'static str),
    /// The core refused the check (a cost above the capacity): its error, as the reply says it.
    Limit(String),
}

/// What a call answers and writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The reply: allowed (1/0), limit, remaining, retry_after_ns, reset_after_ns, used,
    /// previous, now's seconds and nanoseconds.
    pub reply: [i64; REPLY_CHECK + REPLY_NOW],
    /// The value to write and its TTL in ms, when the call consumed.
    pub write: Option<(String, i64)>,
}

/// A counter, instant or argument: decimal digits only, at most 38 of them (beyond, `None`: no
/// value tollgate writes or sends is that long, and i128 holds every 38-digit number).
pub(crate) fn number(text: &[u8]) -> Option<i128> {
    if text.is_empty() || text.len() > 38 || !text.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(text.iter().fold(0_i128, |n, d| n.saturating_mul(10).saturating_add(i128::from(d - b'0'))))
}

/// A stored counter: at most 2^63.
fn counter(text: &[u8]) -> Result<u64, BadState> {
    number(text).filter(|n| *n <= 1 << 63).and_then(|n| u64::try_from(n).ok()).ok_or(BadState("a malformed counter"))
}

/// A stored instant as ns since the epoch, no further than `FAR_SEC` from `now` (the script's
/// `rel`: the seconds compared first, so that any length of digits reads).
fn instant(text: &[u8], now: Now) -> Result<u64, BadState> {
    number(text).ok_or(BadState("a malformed instant"))?;
    let split = text.len().saturating_sub(9);
    let (sec, nsec) = (number(&text[..split]).unwrap_or(0), number(&text[split..]).unwrap_or(0));
    let far = i128::from(FAR_SEC);
    let relative = match sec - now.sec {
        ds if ds < -far => -far * BILLION,
        ds if ds > far => far * BILLION,
        ds => ds * BILLION + (nsec - now.nsec),
    };
    Ok(u64::try_from((i128::from(now.ns()) + relative).max(0)).unwrap_or(u64::MAX))
}

/// An instant as stored (the script's `abs`: seconds, then nine digits of nanoseconds).
fn stored_instant(ns: u64) -> String {
    format!("{}{:09}", ns / 1_000_000_000, ns % 1_000_000_000)
}

/// The stored value's fields (separated by what Lua's `%s` matches).
fn fields(value: &[u8]) -> Vec<&[u8]> {
    let space = |b: &u8| b.is_ascii_whitespace() || *b == 0x0B;
    value.split(space).filter(|f| !f.is_empty()).collect()
}

/// Exactly `n` fields.
fn exactly(value: &[u8], n: usize) -> Result<Vec<&[u8]>, BadState> {
    let f = fields(value);
    if f.len() == n { Ok(f) } else { Err(BadState("a value of another number of fields")) }
}

/// The core's state of `limit`'s algorithm from the key's value (`None`: no history).
fn read(limit: &Limit, stored: Option<&[u8]>, now: Now) -> Result<State, BadState> {
    let Some(value) = stored else { return Ok(State::idle(limit)) };
    Ok(match limit.algorithm() {
        Algorithm::Gcra => {
            // `tat interval`, or `tat` alone as written before the interval was recorded.
            let f = fields(value);
            match f.as_slice() {
                [tat] => State::Gcra(Gcra { tat: instant(tat, now)?, interval: 0 }),
                [tat, interval] => State::Gcra(Gcra { tat: instant(tat, now)?, interval: counter(interval)? }),
                _ => return Err(BadState("a value of another number of fields")),
            }
        }
        // `tokens last interval capacity`, or the first two as written before the others were.
        Algorithm::TokenBucket => {
            let f = fields(value);
            let (interval, capacity) = match f.len() {
                2 => (0, 0),
                4 => (counter(f[2])?, counter(f[3])?),
                _ => return Err(BadState("a value of another number of fields")),
            };
            State::TokenBucket(TokenBucket { tokens: counter(f[0])?, last: instant(f[1], now)?, interval, capacity })
        }
        // `level last interval`, or the first two as written before the interval was.
        Algorithm::LeakyBucket => {
            let f = fields(value);
            let interval = match f.len() {
                2 => 0,
                3 => counter(f[2])?,
                _ => return Err(BadState("a value of another number of fields")),
            };
            State::LeakyBucket(LeakyBucket { level: counter(f[0])?, last: instant(f[1], now)?, interval })
        }
        Algorithm::FixedWindow => {
            let f = exactly(value, 2)?;
            State::FixedWindow(FixedWindow { window_start: instant(f[0], now)?, used: counter(f[1])? })
        }
        Algorithm::SlidingWindow => {
            let f = exactly(value, 3)?;
            State::SlidingWindow(SlidingWindow {
                window_start: instant(f[0], now)?,
                prev: counter(f[1])?,
                curr: counter(f[2])?,
            })
        }
        Algorithm::SubWindow => {
            let f = fields(value);
            if f.len() < 3 {
                return Err(BadState("a value of too few fields"));
            }
            let counts = f[2..].iter().map(|c| counter(c)).collect::<Result<Vec<_>, _>>()?;
            State::SubWindow(SubWindow::from_slices(instant(f[0], now)?, counter(f[1])?, &counts))
        }
        // The sliding log is a Redis list, the script's alone (see `layout::MODULE_ALGORITHMS`).
        Algorithm::SlidingLog => return Err(BadState("a sliding log, which only the script reads")),
    })
}

/// The value the script writes for `state`.
fn write(state: &State) -> Option<String> {
    Some(match state {
        State::Gcra(s) => format!("{} {}", stored_instant(s.tat), s.interval),
        State::TokenBucket(s) => format!("{} {} {} {}", s.tokens, stored_instant(s.last), s.interval, s.capacity),
        State::LeakyBucket(s) => format!("{} {} {}", s.level, stored_instant(s.last), s.interval),
        State::FixedWindow(s) => format!("{} {}", stored_instant(s.window_start), s.used),
        State::SlidingWindow(s) => format!("{} {} {}", stored_instant(s.window_start), s.prev, s.curr),
        State::SubWindow(s) => {
            let (newest, slice, counts) = s.slices();
            let mut value = format!("{} {slice}", stored_instant(newest));
            for count in counts {
                let _ = write!(value, " {count}");
            }
            value
        }
        State::SlidingLog(_) => return None,
    })
}

/// A reply value: negative or huge ones read 0 or `i64::MAX`.
fn int(value: impl TryInto<i64>) -> i64 {
    value.try_into().unwrap_or(i64::MAX)
}

/// Decides a check of `cost` under `limit` at `now` on the key's value: the core's step on the
/// state read, the reply and, when it consumed, the value to write with its TTL (until the state
/// is idle, at least 1 ms, plus `margin_ms`: the script's `px`).
pub fn decide(limit: &Limit, cost: u64, stored: Option<&[u8]>, margin_ms: i64, now: Now) -> Result<Outcome, Refused> {
    let at = now.ns();
    let mut state = read(limit, stored, now).map_err(|bad| Refused::BadState(bad.0))?;
    // A bucket's state (no heap) as read: a refusal under another rate rewrites it (see the
    // core's `check`), and the rewritten state is stored as an admission's would be.
    let bucket = matches!(state, State::Gcra(_) | State::TokenBucket(_) | State::LeakyBucket(_)).then(|| state.clone());
    let decision: Decision = state.check(at, limit, cost).map_err(|e| Refused::Limit(format!("TOLLGATE_ARGS {e}")))?;
    let snapshot = state.snapshot(at, limit);
    let reply = [
        i64::from(decision.allowed),
        int(decision.limit),
        int(decision.remaining),
        int(decision.retry_after_ns),
        int(decision.reset_after_ns),
        int(snapshot.used),
        int(snapshot.previous),
        int(now.sec.max(0)),
        int(now.nsec.max(0)),
    ];
    let consumed = decision.allowed && cost > 0 || bucket.is_some_and(|read| read != state);
    let write = match consumed {
        true => write(&state).map(|value| {
            let idle_ns = i128::from(state.idle_at(limit)) - i128::from(at);
            let idle_ms = -(-idle_ns).div_euclid(1_000_000);
            (value, int(idle_ms.max(1) + i128::from(margin_ms)))
        }),
        false => None,
    };
    Ok(Outcome { reply, write })
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: Now = Now { sec: 1_700_000_000, nsec: 250_000_000 };

    /// 2 a second, a burst of 2.
    fn limit(algorithm: Algorithm) -> Limit {
        Limit::per_second(2).algorithm(algorithm).build().unwrap()
    }

    #[test]
    fn instants_round_trip_and_far_ones_clamp() {
        let now = NOW.ns();
        for at in [now, now + 1, now - 1, now + 749_999_999, now - 250_000_001] {
            assert_eq!(instant(stored_instant(at).as_bytes(), NOW), Ok(at));
        }
        let far = FAR_SEC * 1_000_000_000;
        assert_eq!(instant(b"1", NOW), Ok(now - far));
        assert_eq!(instant(b"99999999999999999999999", NOW), Ok(now + far));
        assert!(instant(b"12x", NOW).is_err() && instant(b"", NOW).is_err());
    }

    #[test]
    fn gcra_admits_its_burst_then_denies_with_the_retry() {
        let gcra = limit(Algorithm::Gcra);
        let first = decide(&gcra, 1, None, 0, NOW).unwrap();
        assert_eq!(first.reply, [1, 2, 1, 0, 500_000_000, 500_000_000, 0, 1_700_000_000, 250_000_000]);
        let (tat, ttl) = first.write.unwrap();
        assert_eq!((tat.as_str(), ttl), ("1700000000750000000 500000000", 500), "the TAT and its interval");
        let second = decide(&gcra, 1, Some(tat.as_bytes()), 0, NOW).unwrap();
        let (tat, _) = second.write.unwrap();
        let third = decide(&gcra, 1, Some(tat.as_bytes()), 0, NOW).unwrap();
        assert_eq!(third.reply[..6], [0, 2, 0, 500_000_000, 1_000_000_000, 1_000_000_000]);
        assert_eq!(third.write, None);
    }

    #[test]
    fn a_fixed_window_counts_in_the_window_holding_now() {
        let first = decide(&limit(Algorithm::FixedWindow), 1, None, 0, NOW).unwrap();
        // The window started 250 ms ago and ends in 750 ms.
        assert_eq!(first.reply[..6], [1, 2, 1, 0, 750_000_000, 1]);
        assert_eq!(first.write, Some(("1700000000000000000 1".into(), 750)));
    }

    /// Every algorithm's value is written as the script writes it and read back to the same
    /// state, the sub-window's slices oldest first.
    #[test]
    fn values_are_written_in_the_scripts_format() {
        let slices = Limit::per_second(4).algorithm(Algorithm::SubWindow).slices(4).build().unwrap();
        let mut value = None;
        for (ns, want) in
            [(0, "1700000000250000000 250000000 0 0 0 1"), (300_000_000, "1700000000500000000 250000000 0 0 1 1")]
        {
            let now = Now { sec: NOW.sec, nsec: NOW.nsec + ns };
            let outcome = decide(&slices, 1, value.as_deref().map(str::as_bytes), 0, now).unwrap();
            let (written, _) = outcome.write.unwrap();
            assert_eq!(written, want);
            value = Some(written);
        }
        let window = limit(Algorithm::SlidingWindow);
        let (written, ttl) = decide(&window, 2, None, 7, NOW).unwrap().write.unwrap();
        assert_eq!((written.as_str(), ttl), ("1700000000000000000 0 2", 1_757));
        let bucket = limit(Algorithm::TokenBucket);
        let (written, _) = decide(&bucket, 1, None, 0, NOW).unwrap().write.unwrap();
        assert_eq!(written, "500000000 1700000000250000000 500000000 1000000000");
        // Written before the rates were recorded: read as counted at the limit's own.
        let leaky = limit(Algorithm::LeakyBucket);
        for (algorithm, old) in
            [(Algorithm::Gcra, "1700000000750000000"), (Algorithm::LeakyBucket, "500000000 1700000000250000000")]
        {
            let limit = if algorithm == Algorithm::Gcra { limit(algorithm) } else { leaky.clone() };
            let reply = decide(&limit, 0, Some(old.as_bytes()), 0, NOW).unwrap().reply;
            assert_eq!(reply[2], 1, "{algorithm}: one of two left");
        }
    }

    #[test]
    fn huge_stored_counters_are_refused_not_summed() {
        let huge = format!("1700000000000000000 {} 99999999999999999999999999999999999999", i128::MAX);
        let slices = Limit::per_second(2).algorithm(Algorithm::SubWindow).slices(2).build().unwrap();
        assert!(decide(&slices, 1, Some(huge.as_bytes()), 0, NOW).is_err());
        let huge = "1700000000000000000 99999999999999999999999999999999999999 1";
        assert!(decide(&limit(Algorithm::SlidingWindow), 1, Some(huge.as_bytes()), 0, NOW).is_err());
    }

    /// Values no step would write (a zero or huge slice length, counters at the bound, far
    /// instants) are decided, never a panic.
    #[test]
    fn hostile_values_are_decided_without_a_panic() {
        let slices = Limit::per_second(2).algorithm(Algorithm::SubWindow).slices(2).build().unwrap();
        let max = 1_u64 << 63;
        // Folded into the newest slice: full now, long gone, full far ahead.
        for (value, allowed) in [
            (format!("1700000000000000000 0 {max} {max}"), 0),
            (format!("1 {max} 5 5"), 1),
            (format!("99999999999999999999 9 {max}"), 0),
        ] {
            let outcome = decide(&slices, 1, Some(value.as_bytes()), 0, NOW).unwrap();
            assert_eq!(outcome.reply[0], allowed, "{value}");
        }
        for algorithm in [Algorithm::TokenBucket, Algorithm::LeakyBucket, Algorithm::FixedWindow] {
            let value = format!("{max} {max}");
            assert!(decide(&limit(algorithm), 1, Some(value.as_bytes()), 0, NOW).is_ok(), "{algorithm:?}");
        }
    }

    #[test]
    fn a_peek_writes_nothing_and_bad_values_are_refused() {
        for algorithm in [Algorithm::Gcra, Algorithm::TokenBucket, Algorithm::LeakyBucket, Algorithm::FixedWindow] {
            let peek = decide(&limit(algorithm), 0, None, 0, NOW).unwrap();
            assert_eq!((peek.reply[0], peek.reply[2], peek.write), (1, 2, None), "{algorithm:?}");
            assert!(decide(&limit(algorithm), 1, Some(b"x y z"), 0, NOW).is_err(), "{algorithm:?}");
        }
    }
}
