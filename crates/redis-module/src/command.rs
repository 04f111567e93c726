//! `TOLLGATE.CHECK key ARGV...`: the script's call of one check (its ARGV as [`layout`] lays it
//! out, after the key), decided natively for the algorithms of [`algorithms`]; anything else is
//! refused, for the script.

use crate::algorithms::{self, Algorithm, Params};
use crate::ffi::{Call, Read};
use crate::layout::*;
use crate::time::Now;

/// Arguments: the command's name and the key, then the call's ARGV (1-based in the layout).
const ARGS: usize = 2 + HEADER_ARGS + CHECK_ARGS;

/// ARGV value `offset` (the layout's 1-based offsets).
fn argv(call: &Call, offset: usize) -> &[u8] {
    call.arg(offset + 1)
}

fn number(bytes: &[u8]) -> Option<i128> {
    std::str::from_utf8(bytes).ok()?.parse().ok()
}

pub(crate) fn check(call: &Call) {
    match decide(call) {
        Ok(Some(reply)) => call.reply_integers(&reply),
        Ok(None) => {}
        Err(message) => call.reply_error(&message),
    }
}

/// The reply, `None` when Redis's own error was answered already.
fn decide(call: &Call) -> Result<Option<[i64; 9]>, String> {
    if call.argc() != ARGS {
        return Err(format!("TOLLGATE_ARGS tollgate.check takes a key and {} values", ARGS - 2));
    }
    if argv(call, ARG_VERSION) != VERSION.as_bytes() {
        let call_version = String::from_utf8_lossy(argv(call, ARG_VERSION)).into_owned();
        return Err(format!("TOLLGATE_VERSION the module reads layout {VERSION}, the call is {call_version}"));
    }
    if argv(call, ARG_CHECKS) != b"1" || argv(call, ARG_CHARGES) != b"0" || argv(call, ARG_REFUNDS) != b"0" {
        return Err("TOLLGATE_ARGS tollgate.check decides one check, no charges or refunds".into());
    }
    let limit = HEADER_ARGS;
    let Some(algorithm) = Algorithm::from_name(argv(call, limit + LIMIT_ALGORITHM)) else {
        return Err("TOLLGATE_UNSUPPORTED tollgate.check does not decide this algorithm: use the script".into());
    };
    let value =
        |offset: usize, what: &str| number(argv(call, offset)).ok_or_else(|| format!("TOLLGATE_ARGS bad {what}"));
    let now = match argv(call, ARG_NOW_SEC) {
        // The server's clock, to the microsecond, as the script reads TIME.
        b"" => {
            let since =
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_err(|e| e.to_string())?;
            Now { sec: i128::from(since.as_secs()), nsec: i128::from(since.subsec_micros()) * 1000 }
        }
        _ => Now { sec: value(ARG_NOW_SEC, "now")?, nsec: value(ARG_NOW_NSEC, "now")? },
    };
    let params = Params {
        count: value(limit + LIMIT_COUNT, "count")?,
        period: value(limit + LIMIT_PERIOD, "period")?,
        burst: value(limit + LIMIT_BURST, "burst")?,
        emission: value(limit + LIMIT_EMISSION, "emission interval")?,
        tolerance: value(limit + LIMIT_TOLERANCE, "tolerance")?,
        cost: value(limit + LIMIT_COST, "cost")?,
        margin_ms: value(ARG_MARGIN, "margin")?,
    };
    let stored = match call.get() {
        Read::Missing => None,
        Read::Value(bytes) => Some(bytes),
        Read::Answered => return Ok(None),
    };
    let key = String::from_utf8_lossy(call.arg(1)).into_owned();
    let outcome = algorithms::decide(algorithm, stored.as_deref(), params, now)
        .map_err(|bad| format!("TOLLGATE_BADSTATE key {key} holds {}, not state written by tollgate", bad.0))?;
    if let Some((state, ttl_ms)) = &outcome.write
        && !call.set(state, *ttl_ms)
    {
        return Err(format!("ERR tollgate.check could not write {key}"));
    }
    Ok(Some(outcome.reply))
}
