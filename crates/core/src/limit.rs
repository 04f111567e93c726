//! A validated limit: which algorithm, how many per which period, and the burst or slices.
//!
//! Everything that can be wrong with a limit is refused here, once, with a message saying what to
//! change; the algorithms then only check the request's cost.

use std::{fmt, str::FromStr, sync::Arc, time::Duration};

use crate::Error;
use crate::calendar::{Calendar, CalendarUnit};

const NS_PER_SEC: u64 = 1_000_000_000;

/// The longest fixed period, and the longest `burst × T` (a bucket's capacity in time): 50 days.
///
/// One maximum for every store: the Redis script computes instants relative to now in Lua's
/// doubles, exact up to 2^53 ns (104 days), and a sliding window counter looks back two periods
/// (a bucket's schedule runs up to `burst × T` ahead). Longer quotas are calendar periods (up to a
/// year, for the fixed window and the sliding window counter), which the script computes in
/// seconds and nanoseconds apart.
pub const MAX_PERIOD_NS: u64 = 50 * 86_400 * NS_PER_SEC;

/// The most slices a sub-window limit may have: every check sums them, and its state holds one
/// counter per slice.
pub const MAX_SLICES: u64 = 3_600;
const _: () = assert!(MAX_SLICES <= u32::MAX as u64);

/// The highest `count` of a sliding-log limit: its state holds up to one entry per admitted unit.
pub const MAX_LOG_COUNT: u64 = 100_000;

crate::words! {
    /// The seven rate-limit algorithms (see `docs/SEMANTICS.md`), by the names used in configs,
    /// traces and on the command line.
    #[derive(Default)]
    pub enum Algorithm: "algorithm" {
        /// Generic cell rate algorithm: one timestamp (the theoretical arrival time) per key.
        #[default]
        Gcra = "gcra",
        /// Token bucket: tokens and the time of the last refill.
        TokenBucket = "token-bucket",
        /// Leaky bucket as a meter: the level and the time of the last leak.
        LeakyBucket = "leaky-bucket",
        /// Fixed window aligned to the epoch: a counter per window.
        FixedWindow = "fixed-window",
        /// Sliding window log: every admitted request's time and cost, bounded by `count`.
        SlidingLog = "sliding-log",
        /// Sliding window counter (Cloudflare): previous and current window counters, interpolated.
        SlidingWindow = "sliding-window",
        /// Sub-window counter (Figma): the period split into equal slices, summed.
        SubWindow = "sub-window",
    }
}

impl Algorithm {
    /// True for GCRA, token bucket and leaky bucket, whose capacity is `burst`.
    #[must_use]
    pub const fn is_bucket(self) -> bool {
        matches!(self, Algorithm::Gcra | Algorithm::TokenBucket | Algorithm::LeakyBucket)
    }
}

/// A validated rate limit. Build one with [`Limit::builder`], [`Limit::per_second`] and friends,
/// or parse `"10/s"` into a [`LimitBuilder`].
///
/// ```
/// use tollgate_core::{Algorithm, Limit};
/// let api = Limit::per_second(10).burst(20).build()?;
/// assert_eq!(api.emission_interval_ns(), 100_000_000);
/// let login: Limit = "5/m".parse::<tollgate_core::LimitBuilder>()?
///     .algorithm(Algorithm::SlidingLog)
///     .build()?;
/// assert_eq!(login.capacity(), 5);
/// # Ok::<(), tollgate_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Limit {
    algorithm: Algorithm,
    count: u64,
    period_ns: u64,
    burst: u64,
    /// At most [`MAX_SLICES`]: 32 bits keep a limit (moved with every admission) at 56 bytes.
    slices: u32,
    emission_ns: u64,
    tolerance_ns: u64,
    /// Shared: a limit is cloned into every decision's reservation; the calendar is its
    /// zone's rules and the windows last computed.
    calendar: Option<Arc<Calendar>>,
}

impl Limit {
    /// Start a limit of `count` requests per `period` (GCRA, burst = count, until changed).
    pub fn builder(count: u64, period: Duration) -> LimitBuilder {
        LimitBuilder {
            algorithm: Algorithm::Gcra,
            count,
            period_ns: period.as_nanos(),
            burst: None,
            slices: None,
            calendar: None,
            tz: None,
        }
    }

    /// Start a limit of `count` requests per calendar `unit` (in UTC until [`LimitBuilder::tz`]
    /// names a zone; the fixed window until another algorithm is named).
    pub fn per_calendar(count: u64, unit: CalendarUnit) -> LimitBuilder {
        LimitBuilder {
            calendar: Some(unit),
            ..Limit::builder(count, Duration::from_nanos(unit.longest_ns())).algorithm(Algorithm::FixedWindow)
        }
    }

    /// `count` per second.
    pub fn per_second(count: u64) -> LimitBuilder {
        Limit::builder(count, Duration::from_secs(1))
    }

    /// `count` per minute.
    pub fn per_minute(count: u64) -> LimitBuilder {
        Limit::builder(count, Duration::from_secs(60))
    }

    /// `count` per hour.
    pub fn per_hour(count: u64) -> LimitBuilder {
        Limit::builder(count, Duration::from_secs(3600))
    }

    /// `count` per day.
    pub fn per_day(count: u64) -> LimitBuilder {
        Limit::builder(count, Duration::from_secs(86_400))
    }

    /// The algorithm deciding this limit.
    #[must_use]
    #[inline]
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// Requests per period.
    #[must_use]
    #[inline]
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The period in nanoseconds; for a calendar period, the unit's longest length
    /// ([`CalendarUnit::longest_ns`]).
    #[must_use]
    #[inline]
    pub fn period_ns(&self) -> u64 {
        self.period_ns
    }

    /// The period.
    #[must_use]
    pub fn period(&self) -> Duration {
        Duration::from_nanos(self.period_ns)
    }

    /// The calendar unit and zone of a calendar period (`None`: a fixed length).
    #[must_use]
    pub fn calendar(&self) -> Option<&Calendar> {
        self.calendar.as_deref()
    }

    /// The window (fixed window, sliding window counter) holding `now`: `(start, end)` in ns since
    /// the epoch, `start <= now < end` (an end past 2^64 ns is `u64::MAX`). A fixed period's
    /// windows are `[k × period, (k + 1) × period)`; a calendar period's, its civil units.
    #[must_use]
    #[inline]
    pub fn window_at(&self, now: u64) -> (u64, u64) {
        match &self.calendar {
            Some(calendar) => calendar.window_at(now),
            None => {
                let start = now - now % self.period_ns;
                (start, start.saturating_add(self.period_ns))
            }
        }
    }

    /// The start of the window a stored window start stands for: itself for a fixed period (a
    /// state written under another period keeps its own start), the start of the calendar window
    /// holding it for a calendar period (every state is read on this calendar's windows).
    #[must_use]
    pub fn align(&self, start: u64) -> u64 {
        if self.calendar.is_some() { self.window_at(start).0 } else { start }
    }

    /// The end of the window starting at `start` (see [`align`](Self::align)): `start + period`,
    /// or the end of the calendar window holding it (saturated at `u64::MAX`).
    #[must_use]
    #[inline]
    pub fn window_end(&self, start: u64) -> u64 {
        if self.calendar.is_some() { self.window_at(start).1 } else { start.saturating_add(self.period_ns) }
    }

    /// The start of the window before the one starting at `start`: `start - period`, or the
    /// calendar window holding `start - 1 ns` (`None` before the epoch).
    #[must_use]
    pub fn window_before(&self, start: u64) -> Option<u64> {
        if self.calendar.is_some() {
            start.checked_sub(1).map(|t| self.window_at(t).0)
        } else {
            start.checked_sub(self.period_ns)
        }
    }

    /// Unit-cost requests admitted at once from idle (bucket family; equals `count` otherwise).
    #[must_use]
    #[inline]
    pub fn burst(&self) -> u64 {
        self.burst
    }

    /// Slices of the period (sub-window counter; 1 otherwise).
    #[must_use]
    #[inline]
    pub fn slices(&self) -> u64 {
        u64::from(self.slices)
    }

    /// `T = ceil(period / count)`: rounding up never admits more than `count` per period.
    #[must_use]
    #[inline]
    pub fn emission_interval_ns(&self) -> u64 {
        self.emission_ns
    }

    /// `burst * T`: how far ahead of now the bucket family may schedule (its capacity in time).
    #[must_use]
    #[inline]
    pub fn tolerance_ns(&self) -> u64 {
        self.tolerance_ns
    }

    /// The most a single request may cost: `burst` for the bucket family, `count` otherwise.
    /// This is also the `limit` reported in every [`Decision`](crate::Decision).
    #[must_use]
    #[inline]
    pub fn capacity(&self) -> u64 {
        if self.algorithm.is_bucket() { self.burst } else { self.count }
    }

    /// Refuses a cost that can never be admitted.
    #[inline]
    pub(crate) fn check_cost(&self, cost: u64) -> Result<(), Error> {
        let capacity = self.capacity();
        if cost > capacity {
            return Err(Error::CostExceedsCapacity { cost, capacity });
        }
        Ok(())
    }

    /// A builder holding this limit's parameters, to derive a variant of it.
    pub fn to_builder(&self) -> LimitBuilder {
        LimitBuilder {
            algorithm: self.algorithm,
            count: self.count,
            period_ns: u128::from(self.period_ns),
            burst: self.algorithm.is_bucket().then_some(self.burst),
            slices: (self.algorithm == Algorithm::SubWindow).then_some(u64::from(self.slices)),
            calendar: self.calendar.as_deref().map(Calendar::unit),
            tz: self.calendar.as_deref().map(|c| c.zone().to_string()),
        }
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.calendar {
            Some(calendar) => write!(f, "{} {}/{} {}", self.algorithm, self.count, calendar.unit(), calendar.zone())?,
            None => write!(f, "{} {}/{}", self.algorithm, self.count, format_period(self.period_ns))?,
        }
        if self.algorithm.is_bucket() {
            write!(f, " burst {}", self.burst)?;
        }
        if self.algorithm == Algorithm::SubWindow {
            write!(f, " slices {}", self.slices)?;
        }
        Ok(())
    }
}

/// Parameters of a [`Limit`] not yet validated. Setters never fail; [`build`](Self::build) does.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub struct LimitBuilder {
    algorithm: Algorithm,
    count: u64,
    period_ns: u128,
    burst: Option<u64>,
    slices: Option<u64>,
    /// A calendar period (its `period_ns` is then the unit's longest).
    calendar: Option<CalendarUnit>,
    tz: Option<String>,
}

/// Slices of a sub-window limit when none are given (Figma's sixty), for periods it divides.
/// A period it does not divide (e.g. 1 s = 10^9 ns) gets the largest divisor below it instead
/// (50 for 1 s), so that `sub-window 10/s` works without hand-picking slices.
pub const DEFAULT_SLICES: u64 = 60;

/// The default slice count for `period_ns`: the largest divisor of it that is at most 60.
fn default_slices(period_ns: u64) -> u64 {
    (1..=DEFAULT_SLICES).rev().find(|s| period_ns.is_multiple_of(*s)).unwrap_or(1)
}

impl LimitBuilder {
    /// Which algorithm decides the limit (default GCRA).
    pub fn algorithm(mut self, algorithm: Algorithm) -> Self {
        self.algorithm = algorithm;
        self
    }

    /// Capacity of the bucket family (default `count`).
    pub fn burst(mut self, burst: u64) -> Self {
        self.burst = Some(burst);
        self
    }

    /// Slices of the sub-window counter (default 60; must divide the period in nanoseconds).
    pub fn slices(mut self, slices: u64) -> Self {
        self.slices = Some(slices);
        self
    }

    /// The IANA time zone of a calendar period (default UTC); refused with a fixed period.
    pub fn tz(mut self, zone: impl Into<String>) -> Self {
        self.tz = Some(zone.into());
        self
    }

    /// Validate and build the limit.
    pub fn build(self) -> Result<Limit, Error> {
        let LimitBuilder { algorithm, count, period_ns, burst, slices, calendar, tz } = self;
        let calendar = match (calendar, tz) {
            (Some(unit), tz) => {
                if !matches!(algorithm, Algorithm::FixedWindow | Algorithm::SlidingWindow) {
                    return Err(Error::CalendarNotApplicable { algorithm });
                }
                Some(Arc::new(Calendar::new(unit, tz.as_deref())?))
            }
            (None, Some(_)) => {
                let period = u64::try_from(period_ns).map_or_else(|_| format!("{period_ns}ns"), format_period);
                return Err(Error::TimeZoneWithoutCalendar { period });
            }
            (None, None) => None,
        };
        // A calendar period's bound is its own (a year is longer than a fixed period may be).
        let max_period = calendar.as_ref().map_or(MAX_PERIOD_NS, |c| c.unit().longest_ns());
        if count == 0 {
            return Err(Error::ZeroCount);
        }
        if period_ns == 0 {
            return Err(Error::ZeroPeriod);
        }
        if period_ns > u128::from(max_period) {
            return Err(Error::TooLarge { parameter: "period", value: period_ns, max: u128::from(MAX_PERIOD_NS) });
        }
        let period_ns = u64::try_from(period_ns).unwrap_or(max_period);
        if algorithm == Algorithm::SlidingLog && count > MAX_LOG_COUNT {
            return Err(Error::TooLarge {
                parameter: "count",
                value: u128::from(count),
                max: u128::from(MAX_LOG_COUNT),
            });
        }
        if count > period_ns {
            return Err(Error::EmissionIntervalZero { count, period_ns });
        }
        let emission_ns = period_ns.div_ceil(count);
        let burst = match burst {
            Some(_) if !algorithm.is_bucket() => return Err(Error::BurstNotApplicable { algorithm }),
            Some(0) => return Err(Error::ZeroBurst),
            Some(b) => b,
            None => count,
        };
        let tolerance_ns = u128::from(burst) * u128::from(emission_ns);
        // A calendar period is for the window family, whose capacity is not a time.
        if tolerance_ns > u128::from(MAX_PERIOD_NS) && calendar.is_none() {
            return Err(Error::TooLarge {
                parameter: "burst × emission interval",
                value: tolerance_ns,
                max: u128::from(MAX_PERIOD_NS),
            });
        }
        let tolerance_ns = u64::try_from(tolerance_ns).unwrap_or(u64::MAX);
        let slices = match (algorithm, slices) {
            (Algorithm::SubWindow, s) => {
                let s = s.unwrap_or_else(|| default_slices(period_ns));
                if s == 0 {
                    return Err(Error::ZeroSlices);
                }
                if s > MAX_SLICES {
                    return Err(Error::TooLarge {
                        parameter: "slices",
                        value: u128::from(s),
                        max: u128::from(MAX_SLICES),
                    });
                }
                if period_ns % s != 0 {
                    return Err(Error::SlicesNotDivisor { period_ns, slices: s });
                }
                s
            }
            (_, Some(_)) => return Err(Error::SlicesNotApplicable { algorithm }),
            (_, None) => 1,
        };
        // MAX_SLICES fits 32 bits.
        let slices = u32::try_from(slices).unwrap_or(u32::MAX);
        Ok(Limit { algorithm, count, period_ns, burst, slices, emission_ns, tolerance_ns, calendar })
    }
}

/// Parses `N/PERIOD`, e.g. `10/s`, `100/1m`, `30/60s`, `5/500ms` (no number means 1), or a
/// calendar period spelled out, `N/day`, `N/week`, `N/month`, `N/year` (the fixed window until
/// another algorithm is named; `1d` is 86,400 s from any instant's epoch-aligned day, `day` the
/// civil day of a time zone).
impl FromStr for LimitBuilder {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        let (count, period) = s.split_once('/').ok_or_else(|| {
            Error::Syntax(format!("invalid limit {s:?}: expected COUNT/PERIOD, e.g. 10/s, 100/1m, 5/500ms"))
        })?;
        let count: u64 = count.trim().parse().map_err(|_| {
            Error::Syntax(format!("invalid limit {s:?}: count {count:?} is not a non-negative integer"))
        })?;
        if let Ok(unit) = period.trim().parse::<CalendarUnit>() {
            return Ok(Limit::per_calendar(count, unit));
        }
        let period_ns = parse_period_ns(period)?;
        Ok(Limit::builder(count, Duration::from_nanos(period_ns)))
    }
}

/// Parses a period such as `500ms`, `1s`, `60s`, `1m`, `1h`, `1d`, `s` (no number means 1) into
/// nanoseconds. Units: `ns`, `us`, `ms`, `s`, `m`, `h`, `d`.
pub fn parse_period_ns(text: &str) -> Result<u64, Error> {
    let t = text.trim();
    let digits_end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, unit) = t.split_at(digits_end);
    let number: u64 = if number.is_empty() {
        1
    } else {
        number.parse().map_err(|_| Error::Syntax(format!("invalid period {text:?}: number too large")))?
    };
    let unit_ns: u64 = match unit {
        "ns" => 1,
        "us" | "µs" => 1_000,
        "ms" => 1_000_000,
        "s" => NS_PER_SEC,
        "m" => 60 * NS_PER_SEC,
        "h" => 3_600 * NS_PER_SEC,
        "d" => 86_400 * NS_PER_SEC,
        "" => {
            return Err(Error::Syntax(format!(
                "invalid period {text:?}: missing unit (ns, us, ms, s, m, h or d), e.g. 1s or 500ms"
            )));
        }
        other => {
            return Err(Error::Syntax(format!(
                "invalid period {text:?}: unknown unit {other:?} (use ns, us, ms, s, m, h or d; or day, week, \
                 month or year alone for a calendar period)"
            )));
        }
    };
    number.checked_mul(unit_ns).ok_or_else(|| Error::Syntax(format!("invalid period {text:?}: longer than 584 years")))
}

/// Formats nanoseconds in the largest unit that divides them exactly, e.g. `1s`, `500ms`, `1m`.
#[must_use]
pub fn format_period(ns: u64) -> String {
    const UNITS: [(&str, u64); 6] = [
        ("d", 86_400 * NS_PER_SEC),
        ("h", 3_600 * NS_PER_SEC),
        ("m", 60 * NS_PER_SEC),
        ("s", NS_PER_SEC),
        ("ms", 1_000_000),
        ("us", 1_000),
    ];
    for (unit, size) in UNITS {
        if ns != 0 && ns.is_multiple_of(size) {
            return format!("{}{unit}", ns / size);
        }
    }
    format!("{ns}ns")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Limit, Error> {
        s.parse::<LimitBuilder>()?.build()
    }

    #[test]
    fn parses_periods() {
        assert_eq!(parse("10/s").unwrap().period_ns(), NS_PER_SEC);
        assert_eq!(parse("10/1s").unwrap().period_ns(), NS_PER_SEC);
        assert_eq!(parse("10/500ms").unwrap().period_ns(), 500_000_000);
        assert_eq!(parse("100/1m").unwrap().period_ns(), 60 * NS_PER_SEC);
        assert_eq!(parse("30/60s").unwrap().period_ns(), 60 * NS_PER_SEC);
        assert_eq!(parse("1/h").unwrap().period_ns(), 3_600 * NS_PER_SEC);
        assert_eq!(parse("1/1d").unwrap().period_ns(), 86_400 * NS_PER_SEC);
        assert_eq!(parse("7/s").unwrap().emission_interval_ns(), 142_857_143);
    }

    #[test]
    fn refuses_bad_text_with_a_reason() {
        for (text, needle) in [
            ("10", "expected COUNT/PERIOD"),
            ("x/s", "not a non-negative integer"),
            ("-1/s", "not a non-negative integer"),
            ("10/5", "missing unit"),
            ("10/5w", "unknown unit"),
            ("10/99999999999999999999s", "number too large"),
            ("10/999999999999d", "longer than 584 years"),
            ("10/51d", "above its maximum"),
        ] {
            let err = parse(text).unwrap_err().to_string();
            assert!(err.contains(needle), "{text}: {err}");
        }
    }

    #[test]
    fn refuses_invalid_limits() {
        assert_eq!(parse("0/s"), Err(Error::ZeroCount));
        assert_eq!(Limit::builder(1, Duration::ZERO).build(), Err(Error::ZeroPeriod));
        assert_eq!(Limit::per_second(10).burst(0).build(), Err(Error::ZeroBurst));
        assert_eq!(parse("2/1ns"), Err(Error::EmissionIntervalZero { count: 2, period_ns: 1 }));
        assert_eq!(
            Limit::per_second(10).algorithm(Algorithm::FixedWindow).burst(3).build(),
            Err(Error::BurstNotApplicable { algorithm: Algorithm::FixedWindow })
        );
        assert_eq!(
            Limit::per_second(10).slices(10).build(),
            Err(Error::SlicesNotApplicable { algorithm: Algorithm::Gcra })
        );
        assert_eq!(
            Limit::per_second(10).algorithm(Algorithm::SubWindow).slices(60).build(),
            Err(Error::SlicesNotDivisor { period_ns: NS_PER_SEC, slices: 60 })
        );
        assert_eq!(Limit::per_second(10).algorithm(Algorithm::SubWindow).slices(0).build(), Err(Error::ZeroSlices));
        assert!(matches!(Limit::builder(1, Duration::from_secs(u64::MAX)).build(), Err(Error::TooLarge { .. })));
        assert!(matches!(Limit::per_day(1).burst(u64::MAX).build(), Err(Error::TooLarge { .. })));
    }

    #[test]
    fn refuses_parameters_above_their_maximum_naming_it() {
        let fifty_days = Duration::from_nanos(MAX_PERIOD_NS);
        assert!(Limit::builder(1, fifty_days).build().is_ok());
        let err = Limit::builder(1, fifty_days + Duration::from_nanos(1)).build().unwrap_err();
        assert_eq!(
            err.to_string(),
            "period is 4320000000000001 ns, above its maximum of 4320000000000000 ns (50 days)"
        );
        let err = Limit::per_day(1).burst(51).build().unwrap_err().to_string();
        assert!(err.starts_with("burst × emission interval is 4406400000000000 ns, above its maximum"), "{err}");
        assert!(Limit::per_day(1).burst(50).build().is_ok());
        let sub = |slices| Limit::per_hour(10).algorithm(Algorithm::SubWindow).slices(slices).build();
        assert!(sub(3600).is_ok());
        assert_eq!(sub(7200).unwrap_err().to_string(), "slices is 7200, above its maximum of 3600");
        let log = |count| Limit::per_hour(count).algorithm(Algorithm::SlidingLog).build();
        assert!(log(MAX_LOG_COUNT).is_ok());
        assert_eq!(log(MAX_LOG_COUNT + 1).unwrap_err().to_string(), "count is 100001, above its maximum of 100000");
        assert!(Limit::per_hour(1_000_000).algorithm(Algorithm::FixedWindow).build().is_ok(), "only the log is capped");
    }

    #[test]
    fn defaults_and_capacity() {
        let gcra = Limit::per_second(10).build().unwrap();
        assert_eq!((gcra.burst(), gcra.capacity(), gcra.tolerance_ns()), (10, 10, NS_PER_SEC));
        let sub = Limit::per_minute(100).algorithm(Algorithm::SubWindow).build().unwrap();
        assert_eq!((sub.slices(), sub.capacity()), (60, 100));
        let per_second = Limit::per_second(10).algorithm(Algorithm::SubWindow).build().unwrap();
        assert_eq!(per_second.slices(), 50, "60 does not divide 10^9 ns; 50 is the largest divisor below it");
        let odd = Limit::builder(1, Duration::from_nanos(7)).algorithm(Algorithm::SubWindow).build().unwrap();
        assert_eq!(odd.slices(), 7);
        let bursty = Limit::per_second(10).burst(25).build().unwrap();
        assert_eq!(bursty.capacity(), 25);
        assert_eq!(bursty.to_string(), "gcra 10/1s burst 25");
        assert_eq!(bursty.to_builder().build().unwrap(), bursty);
        assert_eq!(Limit::per_second(3).algorithm(Algorithm::FixedWindow).build().unwrap().capacity(), 3);
    }

    #[test]
    fn algorithm_names_round_trip() {
        for a in Algorithm::ALL {
            assert_eq!(a.as_str().parse::<Algorithm>().unwrap(), a);
        }
        assert!("gcra2".parse::<Algorithm>().unwrap_err().to_string().contains("token-bucket"));
    }

    #[test]
    fn calendar_periods_parse_with_their_zone_for_the_window_family_only() {
        let month: Limit = "1000000/month".parse::<LimitBuilder>().unwrap().tz("Europe/Berlin").build().unwrap();
        assert_eq!(month.algorithm(), Algorithm::FixedWindow, "a calendar period's default algorithm");
        assert_eq!(month.to_string(), "fixed-window 1000000/month Europe/Berlin");
        assert_eq!(month.calendar().map(|c| (c.unit(), c.zone())), Some((CalendarUnit::Month, "Europe/Berlin")));
        assert_eq!(month.period_ns(), 32 * 86_400 * NS_PER_SEC);
        assert_eq!(month.to_builder().build().unwrap(), month);
        let year = "5/year".parse::<LimitBuilder>().unwrap().algorithm(Algorithm::SlidingWindow).build().unwrap();
        assert_eq!(year.to_string(), "sliding-window 5/year UTC");
        assert_eq!(
            "5/day".parse::<LimitBuilder>().unwrap().algorithm(Algorithm::Gcra).build(),
            Err(Error::CalendarNotApplicable { algorithm: Algorithm::Gcra })
        );
        assert_eq!(
            Limit::per_day(5).tz("Europe/Berlin").build(),
            Err(Error::TimeZoneWithoutCalendar { period: "1d".into() })
        );
        assert!(matches!(
            "5/week".parse::<LimitBuilder>().unwrap().tz("Mars/Olympus").build(),
            Err(Error::UnknownTimeZone(z)) if z == "Mars/Olympus"
        ));
        let err = parse("5/2month").unwrap_err().to_string();
        assert!(err.contains("or day, week, month or year alone for a calendar period"), "{err}");
        // 1d is a fixed length: 86,400 s windows aligned to the epoch, whatever the zone.
        assert!(parse("5/1d").unwrap().calendar().is_none());
    }

    #[test]
    fn a_limit_stays_small() {
        // Moved with every admission (the engine's `Admission` holds one): a calendar costs a
        // pointer, which 32-bit slices pay for.
        assert_eq!(std::mem::size_of::<Limit>(), 56);
    }

    #[test]
    fn formats_periods() {
        assert_eq!(format_period(NS_PER_SEC), "1s");
        assert_eq!(format_period(90 * NS_PER_SEC), "90s");
        assert_eq!(format_period(60 * NS_PER_SEC), "1m");
        assert_eq!(format_period(1_500_000), "1500us");
        assert_eq!(format_period(7), "7ns");
    }
}
