//! `CL.THROTTLE key max_burst count period [quantity]`, a drop-in for redis-cell.
//!
//! The mapping of `docs/SEMANTICS.md`: a GCRA limit of `count` per `period` seconds with
//! `burst = max_burst + 1`; the reply `[limited, limit, remaining, retry_after, reset_after]` in
//! seconds rounded up, `retry_after = -1` when allowed. As in redis-cell, a quantity above the
//! capacity is answered "limited" with `remaining` unchanged and `retry_after = -1` (it can never
//! pass): one decision, a peek of the key's state (see `render::throttle_cost`). Unlike redis-cell, bad arguments, overflow and store failures are errors for this call
//! only, never a crash or a wrap. Keys are bytes, as in Redis: any bytes are a key.

use std::time::Duration;

use bytes::BytesMut;
use tollgate_core::Limit;

use super::{at_least, integer, reply};
use tollgate_engine::{Source, render};

use crate::app::App;

const USAGE: &str = "ERR Usage: CL.THROTTLE <key> <max_burst> <count per period> <period> [<quantity>]";

pub(super) async fn run(app: &App, args: &[&[u8]], out: &mut BytesMut) {
    match throttle(app, args).await {
        Ok(values) => reply::integers(out, &values),
        Err(message) => reply::error(out, &message),
    }
}

async fn throttle(app: &App, args: &[&[u8]]) -> Result<[i64; 5], String> {
    if args.len() != 4 && args.len() != 5 {
        return Err(USAGE.into());
    }
    let key = args[0];
    // Parse every number first, as redis-cell does, then check ranges.
    let (max_burst, per_period, period) = (integer(args[1])?, integer(args[2])?, integer(args[3])?);
    let quantity = args.get(4).map_or(Ok(1), |q| integer(q))?;
    let max_burst = at_least(max_burst, "max_burst", 0)?;
    let per_period = at_least(per_period, "count", 1)?;
    let period = at_least(period, "period", 1)?;
    let quantity = at_least(quantity, "quantity", 0)?;
    let burst = max_burst.checked_add(1).ok_or("ERR max_burst is too large")?;
    let limit =
        Limit::builder(per_period, Duration::from_secs(period)).burst(burst).build().map_err(|e| format!("ERR {e}"))?;
    // One decision either way: a quantity above the burst can never pass, so it is a peek.
    let cost = render::throttle_cost(quantity, burst);
    let d = app.engine.check_adhoc(Source::Throttle, key, &limit, cost).await.map_err(|e| format!("ERR {e}"))?;
    Ok(render::throttle_reply(&d, burst, quantity))
}
