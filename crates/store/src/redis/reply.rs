//! What the decision script answers, read: its reply as decisions, snapshots and the server's
//! time, and its errors as [`StoreError`]s; and the key prefix it accepts.

use tollgate_core::{Decision, Snapshot};

use super::connection::Failure;
use super::program::{REPLY_CHECK, REPLY_NOW};
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
/// `BadState`; anything else is the backend's, said in tollgate's words with the server's address.
pub(super) fn script_error(failure: &Failure, keys: &[Vec<u8>]) -> StoreError {
    let (error, node) = failure;
    match error.code() {
        Some("WRONGTYPE") => {
            let keys: Vec<String> = keys.iter().map(|k| String::from_utf8_lossy(k).into_owned()).collect();
            StoreError::BadState(format!(
                "one of {keys:?} holds a Redis type tollgate does not write (another program uses the key)"
            ))
        }
        Some("TOLLGATE_BADSTATE") => StoreError::BadState(error.detail().unwrap_or("").to_string()),
        _ if error.to_string().contains("TOLLGATE_BADSTATE") => StoreError::BadState(error.to_string()),
        _ => StoreError::Backend(node.as_ref().map_or_else(|| error.to_string(), |node| node.explain(error))),
    }
}

/// [`REPLY_CHECK`] values per check (the decision and the snapshot), then the server's seconds and
/// nanoseconds ([`REPLY_NOW`]).
pub(super) fn parse_reply(reply: &[i64], n: usize) -> Result<Reply, StoreError> {
    if reply.len() != REPLY_CHECK * n + REPLY_NOW {
        return Err(StoreError::Backend(format!("the script answered {} values for {n} checks", reply.len())));
    }
    let field = |v: i64| u64::try_from(v).map_err(|_| StoreError::Backend(format!("negative value {v} in a reply")));
    let now_ns = field(reply[REPLY_CHECK * n])?
        .checked_mul(1_000_000_000)
        .and_then(|s| s.checked_add(field(reply[REPLY_CHECK * n + 1]).ok()?))
        .ok_or_else(|| StoreError::Backend("the server's time is out of range".into()))?;
    let mut decisions = Vec::with_capacity(n);
    let mut snapshots = Vec::with_capacity(n);
    for d in reply[..REPLY_CHECK * n].chunks_exact(REPLY_CHECK) {
        decisions.push(Decision {
            allowed: d[0] == 1,
            limit: field(d[1])?,
            remaining: field(d[2])?,
            retry_after_ns: field(d[3])?,
            reset_after_ns: field(d[4])?,
        });
        snapshots.push(Snapshot { at: now_ns, used: field(d[5])?, previous: field(d[6])? });
    }
    Ok(Reply { decisions, snapshots, now_ns })
}
