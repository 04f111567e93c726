//! `CL.THROTTLE key max_burst count period [quantity]`, a drop-in for redis-cell.
//!
//! The mapping of `docs/SEMANTICS.md`: a GCRA limit of `count` per `period` seconds with
//! `burst = max_burst + 1`; the reply `[limited, limit, remaining, retry_after, reset_after]` in
//! seconds rounded up, `retry_after = -1` when allowed. As in redis-cell, a quantity above the
//! capacity is answered "limited" with `remaining` unchanged and `retry_after = -1` (it can never
//! pass): one decision, a peek of the key's state (see `edge::throttle_cost`). Unlike
//! redis-cell, bad arguments, overflow and store failures are errors for this call only, never a
//! crash or a wrap. Keys are bytes, as in Redis: any bytes are a key.

use std::time::Duration;

use bytes::BytesMut;
use tollgate_core::{Limit, LimitSpec};
use tollgate_edge as edge;
use tollgate_engine::Source;
use tollgate_resp::reply;

use super::args::{at_least, integer};
use crate::app::App;

const USAGE: &str = "ERR Usage: CL.THROTTLE <key> <max_burst> <count per period> <period> [<quantity>]";

/// A parsed `CL.THROTTLE`.
#[derive(Debug)]
pub struct Throttle<'a> {
    key: &'a [u8],
    /// GCRA, `count` per `period` s, a burst of `max_burst + 1`.
    limit: Limit,
    quantity: u64,
}

impl<'a> Throttle<'a> {
    /// The arguments after the command's name, with redis-cell's messages: every number is
    /// parsed first, then the ranges are checked, then the limit is built by [`LimitSpec`].
    pub(super) fn parse(args: &[&'a [u8]]) -> Result<Self, String> {
        if args.len() != 4 && args.len() != 5 {
            return Err(USAGE.into());
        }
        let key = args[0];
        let (max_burst, per_period, period) = (integer(args[1])?, integer(args[2])?, integer(args[3])?);
        let quantity = args.get(4).map_or(Ok(1), |q| integer(q))?;
        let max_burst = at_least(max_burst, "max_burst", 0)?;
        let per_period = at_least(per_period, "count", 1)?;
        let period = at_least(period, "period", 1)?;
        let quantity = at_least(quantity, "quantity", 0)?;
        let burst = max_burst.checked_add(1).ok_or("ERR max_burst is too large")?;
        let limit = LimitSpec { burst: Some(burst), ..LimitSpec::default() }
            .build_rate(per_period, Duration::from_secs(period))
            .map_err(|e| format!("ERR {e}"))?;
        Ok(Throttle { key, limit, quantity })
    }

    /// Decides it (one decision, a peek for a quantity that can never pass) and replies.
    pub(super) async fn apply(self, app: &App, out: &mut BytesMut) {
        let Throttle { key, limit, quantity } = self;
        let capacity = limit.burst();
        let cost = edge::throttle_cost(quantity, capacity);
        match app.engine.check_adhoc(Source::Throttle, key, &limit, cost).await {
            Ok(decision) => reply::integers(out, &edge::throttle_reply(&decision, capacity, quantity)),
            Err(e) => reply::error(out, &format!("ERR {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// redis-cell's mapping: `max_burst` 15 is a burst of 16; the quantity is 1 unless given.
    #[test]
    fn reads_redis_cells_arguments_into_a_gcra_limit() {
        let throttle = Throttle::parse(&[b"user123", b"15", b"30", b"60"]).unwrap();
        let limit = Limit::builder(30, Duration::from_secs(60)).burst(16).build().unwrap();
        assert_eq!((throttle.key, &throttle.limit, throttle.quantity), (&b"user123"[..], &limit, 1));
        assert_eq!(Throttle::parse(&[b"k", b"0", b"1", b"1", b"17"]).unwrap().quantity, 17);
        assert_eq!(Throttle::parse(&[b"k", b"x", b"1", b"1"]).unwrap_err(), "ERR Couldn't parse as integer: x");
    }
}
