//! What the decision script answers, read: its reply as decisions, snapshots and the server's
//! time (a lease's units too), `TIME`'s answer, and the errors as [`StoreError`]s; and the key
//! prefix it accepts. A server's reply is input: every value is checked, and an impossible one
//! is a backend error for that call, never a panic or a number used as it came.

use tollgate_core::{Decision, Snapshot};

use tollgate_redis_client::CallError;

use super::program::{LEASE_REPLY, REPLY_CHECK, REPLY_NOW};
use crate::StoreError;
use crate::remote::Reply;

pub(super) fn check_prefix(prefix: &str) -> Result<(), StoreError> {
    if prefix.contains(['{', '}']) {
        return Err(StoreError::Unsupported(format!(
            "key prefix {prefix:?}: braces would change the keys' Redis Cluster slots"
        )));
    }
    Ok(())
}

/// A failed call as a [`StoreError`]: a key holding what tollgate did not write is the call's own
/// `BadState`; anything else is the backend's, said in tollgate's words with the server's address
/// (whatever the call may have done: the failure policy treats every backend error as a call
/// that may have run). Either says at most [`MAX_MESSAGE`] characters.
pub(super) fn script_error(failure: &CallError, keys: &[Vec<u8>]) -> StoreError {
    let error = failure.error();
    match error.code() {
        Some("WRONGTYPE") => {
            let keys: Vec<String> = keys.iter().map(|k| String::from_utf8_lossy(k).into_owned()).collect();
            StoreError::BadState(format!(
                "one of {keys:?} holds a Redis type tollgate does not write (another program uses the key)"
            ))
        }
        Some("TOLLGATE_BADSTATE") => StoreError::BadState(bounded(error.detail().unwrap_or(""))),
        _ if error.to_string().contains("TOLLGATE_BADSTATE") => StoreError::BadState(bounded(&error.to_string())),
        _ => StoreError::Backend(bounded(&failure.explain())),
    }
}

/// The most characters of a message that carries a server's words (its error line is its own
/// choice of length, and reaches logs and clients).
const MAX_MESSAGE: usize = 1_000;

/// `text`, cut after [`MAX_MESSAGE`] characters (marked `…`).
fn bounded(text: &str) -> String {
    match text.char_indices().nth(MAX_MESSAGE) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}

/// The furthest from now the script reads an instant (`FAR_SEC` of the layout, which the script's
/// constants are generated from: 104 days); a hold's end further is read as this far.
const FAR_NS: u64 = crate::layout::FAR_SEC * 1_000_000_000;

/// [`REPLY_CHECK`] values per check (the decision and the snapshot), then the server's seconds and
/// nanoseconds ([`REPLY_NOW`]). Every value is checked: a decision admitted (1) or denied (0; 2
/// by a hold, with nothing remaining and the rest of the hold, at most [`FAR_NS`], as its retry
/// and reset: the caller checks that the check asked for it),
/// never more remaining than its limit, no negative field, a time within range.
pub(super) fn parse_reply(reply: &[i64], n: usize) -> Result<Reply, StoreError> {
    let expected = n.checked_mul(REPLY_CHECK).and_then(|v| v.checked_add(REPLY_NOW));
    if Some(reply.len()) != expected {
        return Err(StoreError::Backend(format!("the script answered {} values for {n} checks", reply.len())));
    }
    let field = |v: i64| u64::try_from(v).map_err(|_| StoreError::Backend(format!("negative value {v} in a reply")));
    let (seconds, nanoseconds) = (field(reply[REPLY_CHECK * n])?, field(reply[REPLY_CHECK * n + 1])?);
    if nanoseconds >= 1_000_000_000 {
        return Err(StoreError::Backend(format!("the script answered {nanoseconds} nanoseconds of a second")));
    }
    let now_ns = seconds
        .checked_mul(1_000_000_000)
        .and_then(|s| s.checked_add(nanoseconds))
        .ok_or_else(|| StoreError::Backend("the server's time is out of range".into()))?;
    let mut decisions = Vec::with_capacity(n);
    let mut snapshots = Vec::with_capacity(n);
    let mut held = Vec::new();
    for (i, d) in reply[..REPLY_CHECK * n].chunks_exact(REPLY_CHECK).enumerate() {
        let allowed = match d[0] {
            0 => false,
            1 => true,
            2 => {
                held.push(i);
                false
            }
            other => return Err(StoreError::Backend(format!("the script answered allowed = {other}"))),
        };
        let (limit, remaining) = (field(d[1])?, field(d[2])?);
        let (retry_after_ns, reset_after_ns) = (field(d[3])?, field(d[4])?);
        if held.last() == Some(&i) {
            if remaining > 0 {
                return Err(StoreError::Backend(format!("the script answered a hold with {remaining} remaining")));
            }
            // The rest of the hold, as both: some, and no further than the script reads an end.
            if retry_after_ns != reset_after_ns || !(1..=FAR_NS).contains(&retry_after_ns) {
                return Err(StoreError::Backend(format!(
                    "the script answered a hold ending in {retry_after_ns} ns, reset in {reset_after_ns} ns"
                )));
            }
        }
        if remaining > limit {
            return Err(StoreError::Backend(format!(
                "the script answered {remaining} remaining of a limit of {limit}"
            )));
        }
        decisions.push(Decision { allowed, limit, remaining, retry_after_ns, reset_after_ns });
        snapshots.push(Snapshot { at: now_ns, used: field(d[5])?, previous: field(d[6])? });
    }
    Ok(Reply { decisions, snapshots, now_ns, held })
}

/// A lease's reply ([`parse_reply`] of its one check, then [`LEASE_REPLY`] values: the units
/// granted and the lessees counted), for a lease of `want` units: never more granted than asked,
/// none with a denial, and at least this lessee counted.
pub(super) fn parse_lease_reply(reply: &[i64], want: u64) -> Result<(Reply, u64, u64), StoreError> {
    let Some(split) = reply.len().checked_sub(LEASE_REPLY) else {
        return Err(StoreError::Backend("the script answered no lease".into()));
    };
    let (reply, lease) = reply.split_at(split);
    let reply = parse_reply(reply, 1)?;
    let field = |v: i64| u64::try_from(v).map_err(|_| StoreError::Backend(format!("bad lease reply {v}")));
    let (granted, lessees) = (field(lease[0])?, field(lease[1])?);
    let allowed = reply.decisions.first().is_some_and(|d| d.allowed);
    if granted > want || (granted > 0 && !allowed) {
        return Err(StoreError::Backend(format!(
            "the script granted {granted} units of the {want} asked (allowed: {allowed})"
        )));
    }
    if lessees == 0 {
        return Err(StoreError::Backend("the script counted 0 lessees for a lease".into()));
    }
    Ok((reply, granted, lessees))
}

/// `TIME`'s answer (seconds, microseconds) in nanoseconds since the epoch.
pub(super) fn server_time_ns(value: redis::Value) -> Result<u64, StoreError> {
    let (seconds, micros): (u64, u64) = redis::from_redis_value(value)
        .map_err(|e| StoreError::Backend(format!("TIME answered something else: {e}")))?;
    if micros >= 1_000_000 {
        return Err(StoreError::Backend(format!("TIME answered {micros} microseconds of a second")));
    }
    seconds
        .checked_mul(1_000_000_000)
        .and_then(|ns| ns.checked_add(micros * 1_000))
        .ok_or_else(|| StoreError::Backend(format!("TIME answered {seconds} seconds: out of range")))
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: [i64; 2] = [1_700_000_000, 5];

    fn reply(checks: &[[i64; REPLY_CHECK]]) -> Vec<i64> {
        checks.iter().flatten().copied().chain(NOW).collect()
    }

    #[test]
    fn reads_the_scripts_reply_and_refuses_impossible_values() {
        let admitted = [1, 10, 9, 0, 0, 1, 0];
        let read = parse_reply(&reply(&[admitted, [0, 10, 0, 5, 6, 10, 2]]), 2).unwrap();
        assert_eq!(read.now_ns, 1_700_000_000_000_000_005);
        assert!(read.decisions[0].allowed && !read.decisions[1].allowed);
        assert_eq!(read.snapshots[1], Snapshot { at: read.now_ns, used: 10, previous: 2 });
        assert!(read.held.is_empty());
        let held = parse_reply(&reply(&[admitted, [2, 10, 0, 7, 7, 3, 0]]), 2).unwrap();
        assert_eq!((held.held, held.decisions[1].allowed, held.decisions[1].retry_after_ns), (vec![1], false, 7));
        for (bad, n) in [
            (reply(&[[3, 10, 9, 0, 0, 1, 0]]), 1),
            (reply(&[[2, 10, 1, 7, 7, 1, 0]]), 1),
            (reply(&[[1, 10, 11, 0, 0, 1, 0]]), 1),
            (reply(&[[1, 10, -1, 0, 0, 1, 0]]), 1),
            (reply(&[admitted]), 2),
            (reply(&[admitted]), usize::MAX),
            (vec![1, 10, 9, 0, 0, 1, 0, i64::MAX, 0], 1),
            (vec![1, 10, 9, 0, 0, 1, 0, 1, 1_000_000_000], 1),
            (vec![], 0),
        ] {
            assert!(parse_reply(&bad, n).is_err(), "{bad:?} for {n}");
        }
        assert!(parse_reply(&NOW, 0).unwrap().decisions.is_empty());
        // The bound on a hold is the script's own (its FAR_SEC, generated from the layout).
        assert!(crate::layout::lua_constants().contains(&format!("\nlocal FAR_SEC = {}\n", FAR_NS / 1_000_000_000)));
    }

    #[test]
    fn reads_a_lease_and_refuses_more_than_asked() {
        let with = |tail: [i64; 2]| [1, 10, 9, 0, 0, 1, 0, 1, 0, tail[0], tail[1]];
        let (_, granted, lessees) = parse_lease_reply(&with([5, 2]), 5).unwrap();
        assert_eq!((granted, lessees), (5, 2));
        for bad in [with([6, 1]), with([-1, 1]), with([5, 0]), with([5, -1])] {
            assert!(parse_lease_reply(&bad, 5).is_err(), "{bad:?}");
        }
        let denied = [0, 10, 0, 5, 5, 10, 0, 1, 0, 1, 1];
        assert!(parse_lease_reply(&denied, 5).is_err(), "a grant with a denial");
        assert!(parse_lease_reply(&[1], 5).is_err());
        assert!(parse_lease_reply(&[], 5).is_err());
    }

    #[test]
    fn messages_are_bounded_on_a_character_boundary() {
        assert_eq!(bounded("short"), "short");
        let long = "é".repeat(MAX_MESSAGE + 1);
        assert_eq!(bounded(&long), format!("{}…", "é".repeat(MAX_MESSAGE)));
    }

    #[test]
    fn reads_time_within_range() {
        let time = |s: &str, us: &str| {
            redis::Value::Array(vec![
                redis::Value::BulkString(s.as_bytes().to_vec()),
                redis::Value::BulkString(us.as_bytes().to_vec()),
            ])
        };
        assert_eq!(server_time_ns(time("1700000000", "250")).unwrap(), 1_700_000_000_000_250_000);
        for (s, us) in [("18446744073709551615", "0"), ("1", "1000000"), ("1", "18446744073709551615"), ("-1", "0")] {
            assert!(server_time_ns(time(s, us)).is_err(), "{s} {us}");
        }
        assert!(server_time_ns(redis::Value::Int(1)).is_err());
    }
}
