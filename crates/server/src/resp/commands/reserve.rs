//! `TG.RESERVE` and `TG.SETTLE`: reservations for work whose cost is known only after it is done
//! (see `tollgate_engine`'s `reserve`), under the configuration's named limits.
//!
//! - `TG.RESERVE key estimate ttl_ms name [name ...]` charges `estimate` under every named limit,
//!   all or nothing, for `ttl_ms` (1 to 3,600,000). Reply: `[allowed 1/0, limit, remaining,
//!   retry_after_ms, reset_after_ms, id, deadline_ms]` for the tightest limit; a denial has a
//!   null id and a deadline of 0 (nothing charged).
//! - `TG.SETTLE id actual`: `[estimate, actual]` once; then the error `SETTLED …` (settled
//!   already), `EXPIRED …` (past the deadline: charged at the estimate), `NORESERVATION …` (no
//!   such reservation), or `ERR …` (not an id, a bad actual, the store failing: a settle that
//!   failed may be sent again, it applies once).

use std::time::Duration;

use bytes::BytesMut;
use tollgate_edge as edge;
use tollgate_engine::{EngineError, Frontend, Reserving};
use tollgate_resp::reply;
use tollgate_store::{Refusal, StoreError};

use super::args::{integer_arg, text};
use crate::app::App;

/// The most limits one `TG.RESERVE` names.
const MAX_NAMES: usize = tollgate_engine::MAX_RESERVED_LIMITS;

/// `TG.RESERVE key estimate ttl_ms name [name ...]`.
#[derive(Debug)]
pub struct Reserve<'a> {
    key: &'a [u8],
    estimate: u64,
    ttl_ms: u64,
    names: Vec<&'a str>,
}

/// `TG.SETTLE id actual`.
#[derive(Debug)]
pub struct Settle<'a> {
    id: &'a str,
    actual: u64,
}

const RESERVE_USAGE: &str = "ERR Usage: TG.RESERVE <key> <estimate> <ttl_ms> <name> [<name> ...]";
const SETTLE_USAGE: &str = "ERR Usage: TG.SETTLE <id> <actual>";

impl<'a> Reserve<'a> {
    pub(super) fn parse(args: &[&'a [u8]]) -> Result<Self, String> {
        let [key, estimate, ttl_ms, names @ ..] = args else { return Err(RESERVE_USAGE.into()) };
        if names.is_empty() {
            return Err(RESERVE_USAGE.into());
        }
        if names.len() > MAX_NAMES {
            return Err(format!("ERR TG.RESERVE names at most {MAX_NAMES} limits, got {}", names.len()));
        }
        let estimate = integer_arg(estimate, "estimate", 0)?;
        let ttl_ms = integer_arg(ttl_ms, "ttl_ms", 1)?;
        if ttl_ms > 3_600_000 {
            return Err(format!("ERR ttl_ms must be at most 3600000 (an hour), got {ttl_ms}"));
        }
        let names = names.iter().map(|n| text(n, "a limit name")).collect::<Result<Vec<_>, _>>()?;
        Ok(Reserve { key, estimate, ttl_ms, names })
    }

    pub(super) async fn apply(self, app: &App, out: &mut BytesMut) {
        let limits: Vec<Reserving> = self.names.iter().map(|n| Reserving::Named((*n).to_string())).collect();
        let ttl = Duration::from_millis(self.ttl_ms);
        match app.engine.reserve(Frontend::Resp, &limits, self.key, self.estimate, ttl).await {
            Ok(reserved) => {
                reply::array(out, 7);
                for n in edge::check_reply(&reserved.decision) {
                    reply::integer(out, n);
                }
                match &reserved.reservation {
                    Some(r) => {
                        reply::bulk(out, r.id.as_bytes());
                        reply::integer(out, i64::try_from(r.deadline_ns / 1_000_000).unwrap_or(i64::MAX));
                    }
                    None => {
                        reply::null(out);
                        reply::integer(out, 0);
                    }
                }
            }
            Err(EngineError::UnknownRule(name)) => reply::error(out, &format!("ERR {}", app.unknown_limit(&name))),
            Err(e) => reply::error(out, &error_of(&e)),
        }
    }
}

impl<'a> Settle<'a> {
    pub(super) fn parse(args: &[&'a [u8]]) -> Result<Self, String> {
        let &[id, actual] = args else { return Err(SETTLE_USAGE.into()) };
        Ok(Settle { id: text(id, "the reservation id")?, actual: integer_arg(actual, "actual", 0)? })
    }

    pub(super) async fn apply(self, app: &App, out: &mut BytesMut) {
        match app.engine.settle_reservation(Frontend::Resp, self.id, self.actual).await {
            Ok(settled) => {
                let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
                reply::integers(out, &[n(settled.estimate), n(settled.actual)]);
            }
            Err(e) => reply::error(out, &error_of(&e)),
        }
    }
}

/// An engine error as a RESP error, a refused settle under its own code.
fn error_of(e: &EngineError) -> String {
    match e {
        EngineError::Store(StoreError::Refused(refusal)) => {
            let code = match refusal {
                Refusal::AlreadySettled(_) => "SETTLED",
                Refusal::Expired(_) => "EXPIRED",
                Refusal::Unknown(_) => "NORESERVATION",
                _ => "ERR",
            };
            format!("{code} {refusal}")
        }
        e => format!("ERR {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_are_read_or_refused_precisely() {
        let r = Reserve::parse(&[b"k", b"10", b"1000", b"a", b"b"]).unwrap();
        assert_eq!((r.key, r.estimate, r.ttl_ms, r.names), (&b"k"[..], 10, 1000, vec!["a", "b"]));
        assert_eq!(Reserve::parse(&[b"k", b"10", b"1000"]).unwrap_err(), RESERVE_USAGE);
        assert_eq!(Reserve::parse(&[b"k", b"-1", b"1000", b"a"]).unwrap_err(), "ERR estimate must be >= 0, got -1");
        assert_eq!(
            Reserve::parse(&[b"k", b"1", b"3600001", b"a"]).unwrap_err(),
            "ERR ttl_ms must be at most 3600000 (an hour), got 3600001"
        );
        let many: Vec<&[u8]> = [&b"k"[..], b"1", b"1"].into_iter().chain(std::iter::repeat_n(&b"a"[..], 17)).collect();
        assert_eq!(Reserve::parse(&many).unwrap_err(), "ERR TG.RESERVE names at most 16 limits, got 17");
        assert_eq!(Settle::parse(&[b"id"]).unwrap_err(), SETTLE_USAGE);
        assert_eq!(Settle::parse(&[b"id", b"x"]).unwrap_err(), "ERR actual must be an integer, got x");
    }
}
