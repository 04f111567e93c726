//! `TOLLGATE.CHECK key ARGV...`: the script's call of one check (its ARGV as
//! `tollgate_store::layout` lays it out, after the key), decided natively by tollgate-core's step
//! for the algorithms the layout gives the module (`MODULE_ALGORITHMS`); anything else is
//! refused, for the script.

use std::time::Duration;

use tollgate_core::{Algorithm, Limit};
use tollgate_store::layout::*;

use crate::stored::{self, Now, number};

/// The bounds of a call's values: what `tollgate-core` accepts in a limit, with room for the
/// tolerance (`burst · T`) and a cost; none may exceed 2^63, so that each fits a `u64` and every
/// product of two an `i128`.
const MAX_VALUE: i128 = 1 << 63;

/// What the command sees of Redis (the module's FFI gives it): its arguments, the key's value,
/// the write, the reply.
pub(crate) trait Host {
    /// Argument `i` (0: the command's name).
    fn arg(&self, i: usize) -> &[u8];
    /// How many arguments.
    fn argc(&self) -> usize;
    /// `GET` of the key (argument 1).
    fn get(&self) -> Read;
    /// The key set to `value` for `px_ms`, replicated as `SET key value PX ms`.
    fn set(&self, value: &str, px_ms: i64) -> bool;
    /// Replies with an array of integers.
    fn reply_integers(&self, values: &[i64]);
    /// Replies with an error.
    fn reply_error(&self, message: &str);
}

/// A value read from the key.
pub(crate) enum Read {
    /// No key.
    Missing,
    /// Its bytes.
    Value(Vec<u8>),
    /// An error Redis answered (a key of another type): already given as the reply.
    Answered,
}

/// A limit as the call carries it (the layout's `LIMIT_*`), and the TTL margin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Params {
    pub(crate) count: i128,
    pub(crate) period: i128,
    pub(crate) burst: i128,
    pub(crate) slices: i128,
    pub(crate) emission: i128,
    pub(crate) tolerance: i128,
    pub(crate) cost: i128,
    pub(crate) margin_ms: i128,
}

/// A parsed call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Parsed {
    pub(crate) algorithm: Algorithm,
    pub(crate) params: Params,
    /// The limit the call's values describe, as tollgate-core builds it.
    pub(crate) limit: Limit,
    /// `None`: the server's clock.
    pub(crate) now: Option<Now>,
}

/// A bounded value as `u64` (the bounds keep every one within it).
fn unsigned(value: i128) -> u64 {
    u64::try_from(value).unwrap_or(u64::MAX)
}

/// The limit of the call's values: one tollgate-core builds from its algorithm, count, period,
/// burst and slices, whose emission interval and tolerance are the call's too.
fn limit_of(algorithm: Algorithm, p: &Params) -> Result<Limit, String> {
    let mut builder = Limit::builder(unsigned(p.count), Duration::from_nanos(unsigned(p.period))).algorithm(algorithm);
    if algorithm.is_bucket() {
        builder = builder.burst(unsigned(p.burst));
    }
    if algorithm == Algorithm::SubWindow {
        builder = builder.slices(unsigned(p.slices));
    }
    let limit = builder.build().map_err(|e| format!("TOLLGATE_ARGS not a limit tollgate builds: {e}"))?;
    let derived = [limit.burst(), limit.slices(), limit.emission_interval_ns(), limit.tolerance_ns()];
    if derived != [p.burst, p.slices, p.emission, p.tolerance].map(unsigned) {
        return Err("TOLLGATE_ARGS burst, slices, emission interval or tolerance disagree with the limit".into());
    }
    Ok(limit)
}

/// Parses the call's arguments after the command's name and the key (its ARGV), refusing any
/// value out of bounds: the module never panics or allocates on a caller's word.
pub(crate) fn parse(argv: &[&[u8]]) -> Result<Parsed, String> {
    if argv.len() != HEADER_ARGS + CHECK_ARGS {
        return Err(format!("TOLLGATE_ARGS tollgate.check takes a key and {} values", HEADER_ARGS + CHECK_ARGS));
    }
    // The layout's offsets are 1-based, as Lua reads ARGV.
    let at = |offset: usize| argv[offset - 1];
    if at(ARG_VERSION) != VERSION.as_bytes() {
        let call_version = String::from_utf8_lossy(at(ARG_VERSION)).into_owned();
        return Err(format!("TOLLGATE_VERSION the module reads layout {VERSION}, the call is {call_version}"));
    }
    if at(ARG_CHECKS) != b"1" || at(ARG_CHARGES) != b"0" || at(ARG_REFUNDS) != b"0" {
        return Err("TOLLGATE_ARGS tollgate.check decides one check, no charges or refunds".into());
    }
    let limit = HEADER_ARGS;
    if at(limit + CHECK_HOLD) != b"0" {
        return Err("TOLLGATE_ARGS tollgate.check reads no holds: use the script".into());
    }
    let algorithm = std::str::from_utf8(at(limit + LIMIT_ALGORITHM))
        .ok()
        .and_then(|name| name.parse::<Algorithm>().ok())
        .filter(|algorithm| module_decides(*algorithm))
        .ok_or("TOLLGATE_UNSUPPORTED tollgate.check does not decide this algorithm: use the script")?;
    let value = |offset: usize, what: &str, least: i128, most: i128| {
        number(at(offset))
            .filter(|v| (least..=most).contains(v))
            .ok_or_else(|| format!("TOLLGATE_ARGS {what} must be a number from {least} to {most}"))
    };
    let period_ns = i128::from(tollgate_core::MAX_PERIOD_NS);
    let params = Params {
        count: value(limit + LIMIT_COUNT, "count", 1, MAX_VALUE)?,
        period: value(limit + LIMIT_PERIOD, "period", 1, period_ns)?,
        burst: value(limit + LIMIT_BURST, "burst", 0, MAX_VALUE)?,
        slices: value(limit + LIMIT_SLICES, "slices", 1, i128::from(tollgate_core::MAX_SLICES))?,
        emission: value(limit + LIMIT_EMISSION, "emission interval", 1, MAX_VALUE)?,
        tolerance: value(limit + LIMIT_TOLERANCE, "tolerance", 0, MAX_VALUE)?,
        cost: value(limit + LIMIT_COST, "cost", 0, MAX_VALUE)?,
        margin_ms: value(ARG_MARGIN, "margin", 0, MAX_VALUE)?,
    };
    let now = match at(ARG_NOW_SEC) {
        b"" => None,
        _ => Some(Now {
            sec: value(ARG_NOW_SEC, "now's seconds", 0, MAX_VALUE / 1_000_000_000)?,
            nsec: value(ARG_NOW_NSEC, "now's nanoseconds", 0, 999_999_999)?,
        }),
    };
    let limit = limit_of(algorithm, &params)?;
    Ok(Parsed { algorithm, params, limit, now })
}

pub(crate) fn check(call: &impl Host) {
    match decide(call) {
        Ok(Some(reply)) => call.reply_integers(&reply),
        Ok(None) => {}
        Err(message) => call.reply_error(&message),
    }
}

/// The reply, `None` when Redis's own error was answered already.
fn decide(call: &impl Host) -> Result<Option<[i64; REPLY_CHECK + REPLY_NOW]>, String> {
    let argv: Vec<&[u8]> = (2..call.argc()).map(|i| call.arg(i)).collect();
    let Parsed { params, limit, now, .. } = parse(&argv)?;
    let now = match now {
        Some(now) => now,
        // The server's clock, to the microsecond, as the script reads TIME.
        None => {
            let since =
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_err(|e| e.to_string())?;
            Now { sec: i128::from(since.as_secs()), nsec: i128::from(since.subsec_micros()) * 1000 }
        }
    };
    let key = String::from_utf8_lossy(call.arg(1)).into_owned();
    let stored = match call.get() {
        Read::Missing => None,
        Read::Value(bytes) => Some(bytes),
        Read::Answered => return Ok(None),
    };
    let margin_ms = i64::try_from(params.margin_ms).unwrap_or(i64::MAX);
    let outcome =
        stored::decide(&limit, unsigned(params.cost), stored.as_deref(), margin_ms, now).map_err(|e| match e {
            stored::Refused::BadState(what) => {
                format!("TOLLGATE_BADSTATE key {key} holds {what}, not state written by tollgate")
            }
            stored::Refused::Limit(message) => message,
        })?;
    if let Some((state, ttl_ms)) = &outcome.write
        && !call.set(state, *ttl_ms)
    {
        return Err(format!("ERR tollgate.check could not write {key}"));
    }
    Ok(Some(outcome.reply))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(values: &[&str]) -> Vec<Vec<u8>> {
        values.iter().map(|v| v.as_bytes().to_vec()).collect()
    }

    fn parsed(values: &[&str]) -> Result<Parsed, String> {
        let owned = call(values);
        parse(&owned.iter().map(Vec::as_slice).collect::<Vec<_>>())
    }

    const GOOD: [&str; 16] = [
        VERSION,
        "",
        "",
        "0",
        "1",
        "0",
        "0",
        "sub-window",
        "30",
        "60000000000",
        "30",
        "10",
        "2000000000",
        "60000000000",
        "1",
        "0",
    ];

    #[test]
    fn a_call_is_parsed_as_the_layout_says() {
        let call = parsed(&GOOD).unwrap();
        assert_eq!(
            (call.algorithm, call.params.slices, call.params.cost, call.now),
            (Algorithm::SubWindow, 10, 1, None)
        );
    }

    /// Any value a caller may send: out of bounds, signs, overflow, garbage, another algorithm,
    /// another arity: an error naming what is wrong, never a panic or a huge allocation.
    #[test]
    fn hostile_values_are_refused() {
        let cases: [(usize, &str, &str); 11] = [
            (11, "1000000000000", "slices"),
            (11, "0", "slices"),
            (9, "999999999999999999999999999999", "period"),
            (12, "-5", "emission"),
            (14, "+", "cost"),
            (14, "99999999999999999999", "cost"),
            (2, "99999999999999999999", "now"),
            (0, "2", "TOLLGATE_VERSION"),
            (7, "leaky-meter", "TOLLGATE_UNSUPPORTED"),
            (4, "2", "one check"),
            (15, "1", "no holds"),
        ];
        for (index, value, says) in cases {
            let mut values = GOOD;
            values[index] = value;
            if index == 2 {
                values[1] = "1";
            }
            let error = parsed(&values).unwrap_err();
            assert!(error.contains(says), "{value} at {index}: {error}");
        }
        assert!(parsed(&GOOD[..15]).unwrap_err().contains("takes a key and 16 values"));
    }
}
