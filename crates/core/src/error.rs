//! Errors of the core: invalid limits, impossible costs and arithmetic overflow.
//!
//! A rejected request is not an error (see [`Decision`](crate::Decision)); these are for input
//! that no decision can honour, and each message says what to change.

use crate::Algorithm;

/// Why a limit could not be built or a request could not be decided.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// `count` was 0.
    #[error("count must be at least 1, got 0 (a limit that admits nothing is a block rule, not a rate)")]
    ZeroCount,
    /// `period` was 0.
    #[error("period must be longer than 0 ns")]
    ZeroPeriod,
    /// `burst` was 0: the "(N-1) tax" that silently halves the rate in naive GCRA.
    #[error(
        "burst must be at least 1, got 0 (burst is how many requests are admitted at once from idle; \
         0 would silently halve the rate)"
    )]
    ZeroBurst,
    /// The emission interval `T = ceil(period / count)` would be below one nanosecond.
    #[error(
        "count {count} per {period_ns} ns is more than one request per nanosecond: the emission \
         interval would round to 0; use a longer period or a smaller count"
    )]
    EmissionIntervalZero {
        /// The requested count.
        count: u64,
        /// The requested period in nanoseconds.
        period_ns: u64,
    },
    /// `burst` was given for an algorithm of the window family, which has no burst.
    #[error("burst applies to gcra, token-bucket and leaky-bucket only; {algorithm} admits `count` per period")]
    BurstNotApplicable {
        /// The algorithm the limit is for.
        algorithm: Algorithm,
    },
    /// `slices` was given for an algorithm other than the sub-window counter.
    #[error("slices apply to sub-window only, not to {algorithm}")]
    SlicesNotApplicable {
        /// The algorithm the limit is for.
        algorithm: Algorithm,
    },
    /// `slices` was 0.
    #[error("slices must be at least 1, got 0")]
    ZeroSlices,
    /// The period does not split into `slices` equal slices of whole nanoseconds.
    #[error(
        "period of {period_ns} ns does not split into {slices} equal slices of whole nanoseconds; \
         choose slices that divide it (for a 1 s period: 10, 20, 50, 100, ...)"
    )]
    SlicesNotDivisor {
        /// The period in nanoseconds.
        period_ns: u64,
        /// The requested number of slices.
        slices: u64,
    },
    /// The request costs more than the limit can ever hold, so it could never be admitted.
    #[error("cost {cost} exceeds the capacity {capacity} of this limit: such a request can never be admitted")]
    CostExceedsCapacity {
        /// The request's cost.
        cost: u64,
        /// The limit's capacity (`burst` for the bucket family, `count` for the window family).
        capacity: u64,
    },
    /// A parameter above its documented maximum (see [`MAX_PERIOD_NS`](crate::MAX_PERIOD_NS),
    /// [`MAX_SLICES`](crate::MAX_SLICES), [`MAX_LOG_COUNT`](crate::MAX_LOG_COUNT)).
    #[error("{parameter} is {value}{}, above its maximum of {max}{}", unit(parameter), max_hint(parameter, *max))]
    TooLarge {
        /// Which parameter.
        parameter: &'static str,
        /// Its value.
        value: u128,
        /// Its maximum.
        max: u128,
    },
    /// A time zone the bundled IANA database does not know.
    #[error("unknown time zone {0:?}: use an IANA name such as UTC, Europe/Berlin or America/New_York")]
    UnknownTimeZone(String),
    /// A calendar period (`/day`, `/week`, `/month`, `/year`) for an algorithm that takes a fixed
    /// length.
    #[error(
        "calendar periods (day, week, month, year) apply to fixed-window and sliding-window only; \
         {algorithm} takes a fixed length such as 1d or 24h"
    )]
    CalendarNotApplicable {
        /// The algorithm the limit is for.
        algorithm: Algorithm,
    },
    /// A time zone for a period that is a fixed length.
    #[error("tz applies to calendar periods (COUNT/day, /week, /month, /year), not to a fixed length such as {period}")]
    TimeZoneWithoutCalendar {
        /// The fixed period, as written by [`format_period`](crate::format_period).
        period: String,
    },
    /// Text that should describe a limit, period or algorithm does not.
    #[error("{0}")]
    Syntax(String),
    /// An intermediate value does not fit in 64 bits.
    #[error("arithmetic overflow: {0}")]
    Overflow(&'static str),
}

/// The unit of a [`Error::TooLarge`] parameter, for its message.
fn unit(parameter: &str) -> &'static str {
    if parameter == "period" || parameter.contains("interval") { " ns" } else { "" }
}

/// The maximum in words, for durations.
fn max_hint(parameter: &str, max: u128) -> String {
    if unit(parameter).is_empty() { String::new() } else { format!(" ns ({} days)", max / 86_400_000_000_000) }
}

impl From<crate::UnknownWord> for Error {
    fn from(e: crate::UnknownWord) -> Error {
        Error::Syntax(e.to_string())
    }
}
