//! A configured `rate_limit`, its time unit, and the tollgate [`Limit`] that decides it.
//!
//! envoyproxy/ratelimit counts requests in fixed windows aligned to the Unix epoch, one window
//! per unit (`(now / unit) * unit`); tollgate's fixed window is `[k * period, (k + 1) * period)`
//! on the same epoch, so the default algorithm starts and ends every window at the same second.
//! The tollgate extensions `algorithm`, `burst` and `slices` inside `rate_limit` choose another.

use tollgate_core::{Algorithm, CalendarUnit, Limit, LimitSpec, MAX_PERIOD_NS};

tollgate_core::words! {
    /// The unit of a `rate_limit`, with envoyproxy/ratelimit's lengths (a week is 7 days, a month
    /// 30, a year 365, each window aligned to the Unix epoch; with the tollgate extension `tz`, a
    /// day, week, month or year of the calendar instead) and the numbers of `RateLimitResponse.RateLimit.Unit` in Envoy's `rls.proto`, by its
    /// name in configurations, lower case (see [`Unit::parse`] for the case envoyproxy accepts).
    pub enum Unit: "unit" {
        /// One second (proto `SECOND = 1`).
        Second = "second",
        /// 60 seconds (`MINUTE = 2`).
        Minute = "minute",
        /// 3,600 seconds (`HOUR = 3`).
        Hour = "hour",
        /// 86,400 seconds (`DAY = 4`).
        Day = "day",
        /// 7 days (`WEEK = 7`).
        Week = "week",
        /// 30 days (`MONTH = 5`).
        Month = "month",
        /// 365 days (`YEAR = 6`): longer than a fixed tollgate period (50 days), so a limit in
        /// years is a calendar year, with a `tz` (see [`limit_for`]).
        Year = "year",
    }
}

impl Unit {
    /// The unit's length in seconds.
    #[must_use]
    pub const fn seconds(self) -> u64 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Week => 7 * 86_400,
            Unit::Month => 30 * 86_400,
            Unit::Year => 365 * 86_400,
        }
    }

    /// The calendar unit of the same name (day, week, month, year), which a `rate_limit` with a
    /// `tz` counts in instead of the fixed length.
    #[must_use]
    pub const fn calendar(self) -> Option<CalendarUnit> {
        match self {
            Unit::Day => Some(CalendarUnit::Day),
            Unit::Week => Some(CalendarUnit::Week),
            Unit::Month => Some(CalendarUnit::Month),
            Unit::Year => Some(CalendarUnit::Year),
            Unit::Second | Unit::Minute | Unit::Hour => None,
        }
    }

    /// The `RateLimitResponse.RateLimit.Unit` number (`UNKNOWN` is 0 and has no [`Unit`]).
    #[must_use]
    pub const fn proto(self) -> i32 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 2,
            Unit::Hour => 3,
            Unit::Day => 4,
            Unit::Month => 5,
            Unit::Year => 6,
            Unit::Week => 7,
        }
    }

    /// The unit of a proto number: `None` for `UNKNOWN` (0) and numbers Envoy does not define.
    #[must_use]
    pub fn from_proto(number: i32) -> Option<Unit> {
        Unit::ALL.into_iter().find(|u| u.proto() == number)
    }

    /// A configuration's `unit`, in any case (`second`, `SECOND`, `Second`), as
    /// envoyproxy/ratelimit upper-cases it and looks it up among the proto names; `unknown` is
    /// not a unit.
    #[must_use]
    pub fn parse(text: &str) -> Option<Unit> {
        let upper = text.to_uppercase();
        Unit::ALL.into_iter().find(|u| u.as_str().eq_ignore_ascii_case(&upper))
    }
}

/// The algorithm of a `rate_limit` that names none: envoyproxy/ratelimit's fixed window.
pub const DEFAULT_ALGORITHM: Algorithm = Algorithm::FixedWindow;

/// The tollgate limit for `requests_per_unit` per `unit`: `None` when `requests_per_unit` is 0
/// (every request is over the limit, as envoyproxy/ratelimit answers it). With a `tz` in
/// `tuning`, a day, week, month or year is that calendar unit of the zone. Errors are tollgate's
/// bounds: a year of 365 days is longer than a fixed tollgate period (50 days); a second holds at
/// most 10^9 requests (one per nanosecond); a sliding log at most 100,000; a burst or slices
/// where the algorithm takes none.
///
/// `tuning` is the `rate_limit`'s tollgate extensions, a [`LimitSpec`] without its `limit` (the
/// unit and `requests_per_unit` give it); its algorithm defaults to [`DEFAULT_ALGORITHM`].
pub fn limit_for(
    requests_per_unit: u32,
    unit: Unit,
    tuning: &LimitSpec,
) -> Result<Option<Limit>, tollgate_core::Error> {
    if requests_per_unit == 0 {
        return Ok(None);
    }
    // With a time zone, a day, week, month or year is a calendar unit of it.
    let period = match (unit.calendar(), &tuning.tz) {
        (Some(calendar), Some(_)) => calendar.to_string(),
        _ => format!("{}s", unit.seconds()),
    };
    let spec = LimitSpec {
        algorithm: Some(tuning.algorithm.unwrap_or(DEFAULT_ALGORITHM)),
        limit: Some(format!("{requests_per_unit}/{period}")),
        ..tuning.clone()
    };
    spec.build().map(Some)
}

/// Whether `unit` is longer than tollgate keeps state for (only [`Unit::Year`]).
pub(crate) fn too_long(unit: Unit) -> bool {
    unit.seconds() * 1_000_000_000 > MAX_PERIOD_NS
}

/// A configured `rate_limit` (or a request's `limit` override, see [`RateLimit::from_override`]).
#[derive(Debug, Clone, PartialEq)]
pub struct RateLimit {
    /// `name`, which other limits' `replaces` refer to (an empty name is none).
    pub name: Option<String>,
    /// `unit`; [`Unit::Second`] and unused when `unlimited`, which takes no unit.
    pub unit: Unit,
    /// `requests_per_unit` (0 when absent: every request is over the limit).
    pub requests_per_unit: u32,
    /// `unlimited: true`: never limited; answered OK with `limit_remaining` `u32::MAX`.
    pub unlimited: bool,
    /// The descriptor's `shadow_mode`: decided and counted, but answered OK.
    pub shadow_mode: bool,
    /// The descriptor's `quota_mode`: an over-limit answer for this descriptor makes the overall
    /// answer OVER_LIMIT only when every quota-mode descriptor of the request is over (a
    /// descriptor not in quota mode over its limit refuses the request in any case; the engine
    /// decides it: `tollgate_engine::Engine::admit_descriptors`).
    pub quota_mode: bool,
    /// The descriptor's `detailed_metric`: the metric key holds the request's values.
    pub detailed_metric: bool,
    /// The names of the limits this one replaces when both match one request.
    pub replaces: Vec<String>,
    /// The descriptor's `metadata`, a mapping, checked and kept (envoyproxy/ratelimit sends the
    /// metadata of the descriptors within their limit in its dynamic metadata; tollgate does not
    /// send it).
    pub metadata: Option<serde_json::Map<String, serde_json::Value>>,
    /// The tollgate limit deciding it: `None` when `unlimited` or `requests_per_unit` is 0
    /// (every request is over the limit).
    pub limit: Option<Limit>,
}

impl RateLimit {
    /// A request descriptor's `limit {requests_per_unit, unit}` override, decided with
    /// `tuning`: as envoyproxy/ratelimit builds it, without name, `replaces`, shadow or quota mode.
    /// Pass it to [`Config::limits_for_request`](crate::Config::limits_for_request).
    pub fn from_override(
        requests_per_unit: u32,
        unit: Unit,
        tuning: &LimitSpec,
    ) -> Result<RateLimit, tollgate_core::Error> {
        Ok(RateLimit {
            name: None,
            unit,
            requests_per_unit,
            unlimited: false,
            shadow_mode: false,
            quota_mode: false,
            detailed_metric: false,
            replaces: Vec::new(),
            metadata: None,
            limit: limit_for(requests_per_unit, unit, tuning)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proto_numbers_are_rls_protos() {
        let numbers: Vec<_> = Unit::ALL.iter().map(|u| (u.as_str(), u.proto())).collect();
        assert_eq!(
            numbers,
            [("second", 1), ("minute", 2), ("hour", 3), ("day", 4), ("week", 7), ("month", 5), ("year", 6)]
        );
        for unit in Unit::ALL {
            assert_eq!(Unit::from_proto(unit.proto()), Some(unit));
        }
        assert_eq!(Unit::from_proto(0), None);
        assert_eq!(Unit::from_proto(8), None);
    }

    #[test]
    fn units_parse_in_any_case_and_unknown_is_none() {
        assert_eq!(Unit::parse("second"), Some(Unit::Second));
        assert_eq!(Unit::parse("WEEK"), Some(Unit::Week));
        assert_eq!(Unit::parse("Month"), Some(Unit::Month));
        assert_eq!(Unit::parse("unknown"), None);
        assert_eq!(Unit::parse("seconds"), None);
        assert_eq!(Unit::parse(""), None);
    }

    #[test]
    fn default_is_an_epoch_aligned_fixed_window_of_the_unit() {
        let limit = limit_for(5, Unit::Day, &LimitSpec::default()).unwrap().unwrap();
        assert_eq!(limit.algorithm(), Algorithm::FixedWindow);
        assert_eq!(limit.count(), 5);
        assert_eq!(limit.period_ns(), 86_400_000_000_000);
        assert_eq!(limit_for(0, Unit::Second, &LimitSpec::default()), Ok(None));
        assert!(limit_for(1, Unit::Year, &LimitSpec::default()).is_err());
        assert!(too_long(Unit::Year) && !too_long(Unit::Month));
        let gcra = LimitSpec { algorithm: Some(Algorithm::Gcra), burst: Some(20), ..LimitSpec::default() };
        assert_eq!(limit_for(10, Unit::Second, &gcra).unwrap().unwrap().burst(), 20);
        let bad = LimitSpec { burst: Some(2), ..LimitSpec::default() };
        assert!(limit_for(10, Unit::Second, &bad).is_err());
    }

    /// Before: `unit: year` was refused, a month was 30 days from the epoch whatever was asked.
    /// After: with `tz`, the calendar unit of the zone; without it, envoyproxy/ratelimit's lengths.
    #[test]
    fn a_time_zone_makes_days_to_years_calendar_units() {
        let berlin = LimitSpec { tz: Some("Europe/Berlin".into()), ..LimitSpec::default() };
        let month = limit_for(1_000_000, Unit::Month, &berlin).unwrap().unwrap();
        assert_eq!(month.to_string(), "fixed-window 1000000/month Europe/Berlin");
        let utc = LimitSpec { tz: Some("UTC".into()), ..LimitSpec::default() };
        assert_eq!(limit_for(5, Unit::Year, &utc).unwrap().unwrap().to_string(), "fixed-window 5/year UTC");
        assert_eq!(
            limit_for(5, Unit::Month, &LimitSpec::default()).unwrap().unwrap().period_ns(),
            30 * 86_400_000_000_000
        );
        let err = limit_for(5, Unit::Hour, &berlin).unwrap_err().to_string();
        assert!(err.starts_with("tz applies to calendar periods"), "{err}");
    }
}
