//! Calendar periods: a day, a week, a month or a year of the civil calendar in an IANA time zone
//! (`1000000/month` in `Europe/Berlin`: reset at midnight on the 1st, Berlin time), for the fixed
//! window and the sliding window counter.
//!
//! A calendar window is `[start, next start)` where each start is midnight (local time) of the
//! first day of its unit: every day; Monday (ISO 8601 weeks); the 1st of the month; 1 January. Its
//! length in nanoseconds varies: a day across a DST change lasts 23 or 25 hours, a month 28 to 31
//! days, a year 365 or 366. Where midnight does not exist (a DST gap at midnight) the window starts
//! at the first instant of that day; where it occurs twice, at the first.
//!
//! The time zone database is bundled into the binary (jiff's `tzdb-bundle-always`): every node of
//! one build computes the same boundaries, whatever `/usr/share/zoneinfo` a machine has (or lacks).

use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use jiff::civil::{Date, Time};
use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan};

use crate::Error;

const NS_PER_DAY: u64 = 86_400 * 1_000_000_000;

crate::words! {
    /// The calendar units a window may span, by the names written in a limit (`1000/day`).
    pub enum CalendarUnit: "calendar period" {
        /// Midnight to midnight, local time.
        Day = "day",
        /// Monday midnight to Monday midnight (ISO 8601 weeks).
        Week = "week",
        /// Midnight on the 1st to midnight on the 1st of the next month.
        Month = "month",
        /// Midnight on 1 January to midnight on the next 1 January.
        Year = "year",
    }
}

impl CalendarUnit {
    /// An upper bound of the unit's length in any zone, which stands for the limit's period where
    /// one length is needed (a key's time to live, a bound on a lease): a day of 2 days, a week of
    /// 8, a month of 32, a year of 367 (a DST change moves a boundary by at most a few hours; a
    /// zone that changes its offset by a whole day, as Samoa did in 2011, shortens a window). A
    /// computed window is never longer (see [`Calendar::window_at`]).
    #[must_use]
    pub const fn longest_ns(self) -> u64 {
        NS_PER_DAY
            * match self {
                CalendarUnit::Day => 2,
                CalendarUnit::Week => 8,
                CalendarUnit::Month => 32,
                CalendarUnit::Year => 367,
            }
    }
}

/// A calendar unit in a time zone: the period of a calendar window.
#[derive(Debug, Clone)]
pub struct Calendar {
    unit: CalendarUnit,
    zone: TimeZone,
    /// The zone's name as given (`Europe/Berlin`, `UTC`): what the limit shows and compares.
    name: String,
    /// The two windows last computed (a sliding window counter asks about the current one and
    /// the next), shared by the limit's clones (see [`Calendar::window_at`]).
    last: Arc<[AtomicU64; 2]>,
}

const NS_PER_SEC: u64 = 1_000_000_000;
/// A cached window: its start in seconds (39 bits hold every u64 of ns) above its length in
/// seconds (25 bits: 388 days). 0: none.
const LENGTH_BITS: u32 = 25;

impl PartialEq for Calendar {
    fn eq(&self, other: &Calendar) -> bool {
        self.unit == other.unit && self.name == other.name
    }
}

impl Eq for Calendar {}

impl Hash for Calendar {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.unit.hash(state);
        self.name.hash(state);
    }
}

/// The zone when none is named.
pub const DEFAULT_TIME_ZONE: &str = "UTC";

/// The longest zone name accepted (IANA names are at most 30 characters or so).
const MAX_ZONE_NAME: usize = 64;

impl Calendar {
    /// `unit` in the IANA zone `zone` (`UTC` when `None`); an unknown zone is refused, naming it.
    pub fn new(unit: CalendarUnit, zone: Option<&str>) -> Result<Calendar, Error> {
        let name = zone.unwrap_or(DEFAULT_TIME_ZONE);
        if name.is_empty() || name.len() > MAX_ZONE_NAME {
            return Err(Error::UnknownTimeZone(name.chars().take(MAX_ZONE_NAME).collect()));
        }
        let zone = jiff::tz::db().get(name).map_err(|_| Error::UnknownTimeZone(name.to_string()))?;
        Ok(Calendar { unit, zone, name: name.to_string(), last: Arc::new([AtomicU64::new(0), AtomicU64::new(0)]) })
    }

    /// The unit.
    #[must_use]
    pub fn unit(&self) -> CalendarUnit {
        self.unit
    }

    /// The time zone's name.
    #[must_use]
    pub fn zone(&self) -> &str {
        &self.name
    }

    /// The window holding `now` (ns since the epoch): `(start, end)`, `start <= now < end`, an
    /// `end` past 2^64 ns saturated to `u64::MAX`.
    #[must_use]
    pub fn window_at(&self, now: u64) -> (u64, u64) {
        // The time zone conversions cost ~150 ns; most calls ask about a window of the last two.
        // One word holds a window whole (whole seconds), so a racing store is never read torn.
        let cached = [self.last[0].load(Ordering::Relaxed), self.last[1].load(Ordering::Relaxed)];
        for packed in cached {
            let start = (packed >> LENGTH_BITS) * NS_PER_SEC;
            let end = start + (packed & ((1 << LENGTH_BITS) - 1)) * NS_PER_SEC;
            if packed != 0 && start <= now && now < end {
                return (start, end);
            }
        }
        let (start, end) = self.computed(now);
        let length = (end - start) / NS_PER_SEC;
        if start.is_multiple_of(NS_PER_SEC) && end.is_multiple_of(NS_PER_SEC) && length < 1 << LENGTH_BITS {
            // In place of the earlier of the two.
            let slot = usize::from(cached[1] < cached[0]);
            self.last[slot].store((start / NS_PER_SEC) << LENGTH_BITS | length, Ordering::Relaxed);
        }
        (start, end)
    }

    /// [`window_at`](Self::window_at), computed.
    fn computed(&self, now: u64) -> (u64, u64) {
        let longest = self.unit.longest_ns();
        let Some((start, end)) = self.civil_window(now) else {
            // Outside the calendar's range (past year 9999): never for a u64 of ns (year 2554).
            let start = now - now % longest;
            return (start, start.saturating_add(longest));
        };
        // Kept around `now` and never longer than the unit's bound, whatever a zone's history
        // holds, so that every caller may rely on both.
        let start = start.min(now);
        let end = end.max(now.saturating_add(1)).min(start.saturating_add(longest));
        (start, end)
    }

    /// The civil window holding `now`, as instants.
    fn civil_window(&self, now: u64) -> Option<(u64, u64)> {
        let timestamp = Timestamp::from_nanosecond(i128::from(now)).ok()?;
        let date = self.zone.to_datetime(timestamp).date();
        let first = match self.unit {
            CalendarUnit::Day => date,
            CalendarUnit::Week => date.checked_sub(i64::from(date.weekday().to_monday_zero_offset()).days()).ok()?,
            CalendarUnit::Month => date.first_of_month(),
            CalendarUnit::Year => date.first_of_year(),
        };
        let next = match self.unit {
            CalendarUnit::Day => first.checked_add(1.day()),
            CalendarUnit::Week => first.checked_add(1.week()),
            CalendarUnit::Month => first.checked_add(1.month()),
            CalendarUnit::Year => first.checked_add(1.year()),
        }
        .ok()?;
        Some((self.midnight(first)?, self.midnight(next)?))
    }

    /// The first instant of `date` in the zone, in ns since the epoch: 0 before the epoch (the
    /// first window starts there), `u64::MAX` past 2^64 ns.
    fn midnight(&self, date: Date) -> Option<u64> {
        // `compatible`: a midnight in a gap is the gap's end, a midnight in a fold its first time.
        let at = self.zone.to_ambiguous_timestamp(date.to_datetime(Time::midnight())).compatible().ok()?;
        Some(u64::try_from(at.as_nanosecond().max(0)).unwrap_or(u64::MAX))
    }
}

#[cfg(test)]
#[path = "calendar_tests.rs"]
mod tests;
