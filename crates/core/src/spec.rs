//! A limit as people write it (`algorithm`, `limit = "10/s"`, `burst`, `slices`), the one form
//! every front end reads: the rules file's `[limits.NAME]`, the HTTP API's `POST /v1/check`, the
//! command line's `--algorithm --limit --burst --slices`, a conformance trace's params header.
//! [`LimitSpec::build`] validates it into a [`Limit`] with the same messages everywhere; a
//! protocol that takes the count and period as numbers (RESP) gives them to
//! [`LimitSpec::build_rate`], the same validation.
//!
//! With the `serde` feature it deserializes (unknown fields refused, the algorithm by its
//! name); with `clap` it is a group of flags. A format that keeps other fields beside these (a
//! rule, an HTTP check) spells the four fields itself and fills a `LimitSpec`: serde cannot
//! flatten a struct into one that refuses unknown fields.

use std::fmt;
use std::time::Duration;

use crate::{Algorithm, Error, Limit, LimitBuilder};

/// A limit's parameters, not yet validated.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize), serde(deny_unknown_fields))]
#[cfg_attr(feature = "clap", derive(clap::Args))]
pub struct LimitSpec {
    /// gcra, token-bucket, leaky-bucket, fixed-window, sliding-log, sliding-window or sub-window.
    #[cfg_attr(feature = "serde", serde(default))]
    #[cfg_attr(feature = "clap", arg(long, value_name = "ALG", required = true))]
    pub algorithm: Option<Algorithm>,
    /// COUNT/PERIOD, e.g. 10/s, 100/1m, 5/500ms (units ns, us, ms, s, m, h, d), or COUNT/day,
    /// /week, /month, /year: a calendar period (fixed-window, sliding-window).
    #[cfg_attr(feature = "clap", arg(long, value_name = "N/PERIOD", required = true))]
    pub limit: Option<String>,
    /// Requests admitted at once from idle (gcra, token-bucket, leaky-bucket; default: the count).
    #[cfg_attr(feature = "clap", arg(long, value_name = "B"))]
    pub burst: Option<u64>,
    /// Equal slices of the period (sub-window; default 60, or the largest divisor below 60).
    #[cfg_attr(feature = "clap", arg(long, value_name = "S"))]
    pub slices: Option<u64>,
    /// The IANA time zone of a calendar period, e.g. Europe/Berlin (default UTC).
    #[cfg_attr(feature = "clap", arg(long, value_name = "ZONE"))]
    pub tz: Option<String>,
}

impl LimitSpec {
    /// The validated limit (GCRA when no algorithm is named).
    pub fn build(&self) -> Result<Limit, Error> {
        let text = self
            .limit
            .as_deref()
            .ok_or_else(|| Error::Syntax("no limit: give COUNT/PERIOD, e.g. 10/s, 100/1m, 5/500ms".into()))?;
        self.tuned(text.parse()?).build()
    }

    /// The validated limit of `count` per `period`, for a protocol that takes the rate as numbers
    /// rather than as the `limit` text (RESP's `CL.THROTTLE` and `TG.*`): the spec's algorithm,
    /// burst and slices applied and validated as [`build`](Self::build) does. The `limit` field
    /// is not read (a spec without it is the rate's tuning). A period too long for nanoseconds in
    /// 64 bits is refused as above the maximum period, like any other too long.
    pub fn build_rate(&self, count: u64, period: Duration) -> Result<Limit, Error> {
        self.tuned(Limit::builder(count, period)).build()
    }

    /// `builder` with this spec's algorithm (when none is named, the builder's: GCRA, or the fixed
    /// window for a calendar period), burst, slices and time zone.
    fn tuned(&self, mut builder: LimitBuilder) -> LimitBuilder {
        if let Some(algorithm) = self.algorithm {
            builder = builder.algorithm(algorithm);
        }
        if let Some(tz) = &self.tz {
            builder = builder.tz(tz.clone());
        }
        if let Some(burst) = self.burst {
            builder = builder.burst(burst);
        }
        if let Some(slices) = self.slices {
            builder = builder.slices(slices);
        }
        builder
    }
}

/// How people name it: `gcra 10/s`, `sub-window 10/s slices 10` (what [`Limit`]'s `Display` writes
/// for the limit it builds).
impl fmt::Display for LimitSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.algorithm.unwrap_or_default(), self.limit.as_deref().unwrap_or("?"))?;
        if let Some(burst) = self.burst {
            write!(f, " burst {burst}")?;
        }
        if let Some(slices) = self.slices {
            write!(f, " slices {slices}")?;
        }
        if let Some(tz) = &self.tz {
            write!(f, " tz {tz}")?;
        }
        Ok(())
    }
}

/// An algorithm by its name, with [`Algorithm`]'s message for an unknown one.
#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for Algorithm {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Algorithm, D::Error> {
        let name = <String as serde::Deserialize>::deserialize(deserializer)?;
        name.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(limit: &str, algorithm: Option<Algorithm>, burst: Option<u64>, slices: Option<u64>) -> LimitSpec {
        LimitSpec { algorithm, limit: Some(limit.into()), burst, slices, tz: None }
    }

    #[test]
    fn builds_what_it_says_with_one_message_per_mistake() {
        let limit = spec("10/s", Some(Algorithm::SubWindow), None, Some(10)).build().unwrap();
        assert_eq!(limit.to_string(), "sub-window 10/1s slices 10");
        assert_eq!(spec("10/s", None, Some(20), None).build().unwrap().burst(), 20);
        assert_eq!(
            LimitSpec::default().build().unwrap_err().to_string(),
            "no limit: give COUNT/PERIOD, e.g. 10/s, 100/1m, 5/500ms"
        );
        let burst = spec("10/s", Some(Algorithm::FixedWindow), Some(3), None).build().unwrap_err();
        assert_eq!(burst, Error::BurstNotApplicable { algorithm: Algorithm::FixedWindow });
        let slices = spec("10/s", Some(Algorithm::FixedWindow), None, Some(5)).build().unwrap_err();
        assert_eq!(slices, Error::SlicesNotApplicable { algorithm: Algorithm::FixedWindow });
        assert_eq!(spec("10/s", None, Some(3), Some(2)).to_string(), "gcra 10/s burst 3 slices 2");
    }

    #[test]
    fn a_rate_given_as_numbers_is_tuned_and_validated_alike() {
        let tuning = |algorithm, burst, slices| LimitSpec { algorithm, limit: None, burst, slices, tz: None };
        let second = Duration::from_secs(1);
        let built = tuning(Some(Algorithm::SubWindow), None, Some(10)).build_rate(10, second).unwrap();
        assert_eq!(built, spec("10/s", Some(Algorithm::SubWindow), None, Some(10)).build().unwrap());
        assert_eq!(tuning(None, Some(20), None).build_rate(10, second).unwrap().burst(), 20);
        let burst = tuning(Some(Algorithm::FixedWindow), Some(3), None).build_rate(10, second).unwrap_err();
        assert_eq!(burst, Error::BurstNotApplicable { algorithm: Algorithm::FixedWindow });
        // Longer than 2^64 ns: above the maximum period, with its length (not a parse error).
        let long = LimitSpec::default().build_rate(2, Duration::from_secs(u64::MAX)).unwrap_err();
        assert!(
            long.to_string().starts_with("period is 18446744073709551615000000000 ns, above its maximum"),
            "{long}"
        );
    }
}
