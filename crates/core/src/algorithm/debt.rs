//! A window's debt (fixed window, sliding window counter): what a window counted past its limit
//! (a charge: [`RateState::charge`](super::RateState::charge), e.g. LLM tokens counted from the
//! response) is carried into the windows after it as already spent, `count` of it paid back per
//! window, so a key's next requests pay for it however the windows roll.
//!
//! A window that counted `used` leaves `max(0, used - j × count)` spent in the `j`-th window after
//! it. The debt is bounded, as the bucket family's ([`MAX_AHEAD_NS`]): it is carried only into
//! the windows that end within 52 days of the start of the window that counted it (at least none:
//! a period of 50 days carries nothing), and over calendar windows into the next window at most
//! (the Redis script sees a few windows around now only). A window therefore counts at most
//! [`window_cap`] (more is forgiven when charged), and a key's state lives at most 52 days plus a
//! window.

use super::{MAX_AHEAD_NS, MAX_COUNTER};
use crate::Limit;

/// How many windows after its own a window's excess is carried into (see the module docs).
#[must_use]
pub fn debt_windows(limit: &Limit) -> u64 {
    // `period_ns` is at least 1 ns and, for a calendar period, its unit's longest length.
    let within = (MAX_AHEAD_NS / limit.period_ns().max(1)).saturating_sub(1);
    if limit.calendar().is_some() { within.min(1) } else { within }
}

/// The most a window counts: its count and [`debt_windows`] more windows' worth, at most
/// [`MAX_COUNTER`]. A charge past it is forgiven.
#[must_use]
pub fn window_cap(limit: &Limit) -> u64 {
    limit.count().saturating_mul(debt_windows(limit).saturating_add(1)).min(MAX_COUNTER)
}

/// What a window that counted `used` leaves spent in the `windows`-th window after it.
#[must_use]
pub fn carried(limit: &Limit, used: u64, windows: u64) -> u64 {
    if windows == 0 {
        return used;
    }
    used.min(window_cap(limit)).saturating_sub(windows.saturating_mul(limit.count()))
}

/// The last window after the one counting `used` (0: that one) that `used` leaves anything spent
/// in.
#[must_use]
pub fn last_indebted(limit: &Limit, used: u64) -> u64 {
    if used <= limit.count() { 0 } else { (used.min(window_cap(limit)) - 1) / limit.count().max(1) }
}

/// How many windows from the one starting at `from` to the one starting at `to` (window starts
/// of `limit`; `from < to`), at least 1. Over a fixed period, the periods between them rounded up
/// (a start written under another period is its own); over calendar windows counted one by one,
/// up to `debt_windows + 2` (further is as far as nothing is carried).
#[must_use]
pub fn windows_between(limit: &Limit, from: u64, to: u64) -> u64 {
    if limit.calendar().is_none() {
        return (to.saturating_sub(from)).div_ceil(limit.period_ns().max(1)).max(1);
    }
    let mut at = from;
    for j in 0..debt_windows(limit) + 3 {
        if at >= to {
            return j.max(1);
        }
        at = limit.window_end(at);
    }
    u64::MAX
}

/// The end of the `n`-th window after the one starting at `start` (0: its own end), saturated at
/// `u64::MAX`.
#[must_use]
pub fn nth_window_end(limit: &Limit, start: u64, n: u64) -> u64 {
    if limit.calendar().is_none() {
        return start.saturating_add(limit.period_ns().saturating_mul(n.saturating_add(1)));
    }
    let mut end = limit.window_end(start);
    for _ in 0..n {
        if end == u64::MAX {
            break;
        }
        end = limit.window_end(end);
    }
    end
}

/// How much of a charge of `cost` a window already counting `used` records: up to
/// [`window_cap`].
#[must_use]
pub fn counted_in_window(limit: &Limit, used: u64, cost: u64) -> u64 {
    cost.min(window_cap(limit).saturating_sub(used))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Algorithm;
    use crate::algorithm::test_util::{SEC, limit};

    #[test]
    fn a_debt_is_carried_as_far_as_52_days_reach() {
        let minute = limit(Algorithm::FixedWindow, "1000/1m");
        assert_eq!(debt_windows(&minute), 52 * 24 * 60 - 1);
        assert_eq!(window_cap(&minute), 1000 * 52 * 24 * 60);
        assert_eq!(carried(&minute, 5000, 1), 4000);
        assert_eq!(carried(&minute, 5000, 4), 1000);
        assert_eq!(carried(&minute, 5000, 5), 0);
        assert_eq!(last_indebted(&minute, 5000), 4);
        assert_eq!(last_indebted(&minute, 1000), 0);
        let fifty_days = limit(Algorithm::FixedWindow, "10/50d");
        assert_eq!((debt_windows(&fifty_days), window_cap(&fifty_days)), (0, 10), "a 50-day window carries nothing");
        let day = "10/day".parse::<crate::LimitBuilder>().unwrap().build().unwrap();
        assert_eq!((debt_windows(&day), window_cap(&day)), (1, 20), "a calendar window carries into the next one only");
        assert_eq!(windows_between(&minute, 0, 180 * SEC), 3);
    }
}
