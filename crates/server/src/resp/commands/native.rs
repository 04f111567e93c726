//! tollgate's own commands: every algorithm, millisecond periods, options, named limits.
//! Replies: `[allowed 1/0, limit, remaining, retry_after_ms, reset_after_ms]`, durations rounded up.

use std::time::Duration;

use bytes::BytesMut;
use tollgate_core::{Algorithm, Decision, Limit};

use super::{ceil_units, count, reply, text};
use tollgate_engine::Source;

use crate::app::App;

const MS: u64 = 1_000_000;
const CHECK_USAGE: &str =
    "ERR Usage: TG.CHECK <key> <algorithm> <count> <period_ms> [BURST <b>] [SLICES <s>] [COST <c>]";

/// `key algorithm count period_ms [BURST b] [SLICES s] [COST c]`; `COST` only if `with_cost`.
fn parse<'a>(args: &[&'a [u8]], with_cost: bool) -> Result<(&'a [u8], Limit, u64), String> {
    if args.len() < 4 || !args.len().is_multiple_of(2) {
        return Err(CHECK_USAGE.into());
    }
    let key = args[0];
    let algorithm: Algorithm = text(args[1], "the algorithm")?.parse().map_err(|e| format!("ERR {e}"))?;
    let per_period = count(args[2], "count", 1)?;
    let period_ms = count(args[3], "period_ms", 1)?;
    let mut builder = Limit::builder(per_period, Duration::from_millis(period_ms)).algorithm(algorithm);
    let mut cost = 1;
    for pair in args[4..].chunks_exact(2) {
        let option = pair[0];
        if option.eq_ignore_ascii_case(b"BURST") {
            builder = builder.burst(count(pair[1], "BURST", 1)?);
        } else if option.eq_ignore_ascii_case(b"SLICES") {
            builder = builder.slices(count(pair[1], "SLICES", 1)?);
        } else if option.eq_ignore_ascii_case(b"COST") && with_cost {
            cost = count(pair[1], "COST", 0)?;
        } else {
            return Err(format!("ERR unknown option {}", String::from_utf8_lossy(option)));
        }
    }
    let limit = builder.build().map_err(|e| format!("ERR {e}"))?;
    Ok((key, limit, cost))
}

fn render(out: &mut BytesMut, d: &Decision) {
    reply::integers(
        out,
        &[
            i64::from(d.allowed),
            i64::try_from(d.limit).unwrap_or(i64::MAX),
            i64::try_from(d.remaining).unwrap_or(i64::MAX),
            ceil_units(d.retry_after_ns, MS),
            ceil_units(d.reset_after_ns, MS),
        ],
    );
}

/// `TG.CHECK` (or `TG.PEEK` when `peek`).
pub(super) async fn check(app: &App, args: &[&[u8]], out: &mut BytesMut, peek: bool) {
    let result = async {
        let (key, limit, cost) = parse(args, !peek)?;
        let cost = if peek { 0 } else { cost };
        app.engine.check_adhoc(Source::Check, key, &limit, cost).await.map_err(|e| format!("ERR {e}"))
    }
    .await;
    match result {
        Ok(d) => render(out, &d),
        Err(message) => reply::error(out, &message),
    }
}

/// `TG.RESET key algorithm count period_ms [BURST b] [SLICES s]`.
pub(super) async fn reset(app: &App, args: &[&[u8]], out: &mut BytesMut) {
    let result = async {
        let (key, limit, _) = parse(args, false)?;
        app.engine.reset("", key, &limit).await.map_err(|e| format!("ERR {e}"))
    }
    .await;
    match result {
        Ok(()) => reply::simple(out, "OK"),
        Err(message) => reply::error(out, &message),
    }
}

/// `TG.LIMIT name key [COST c]`.
pub(super) async fn named(app: &App, args: &[&[u8]], out: &mut BytesMut) {
    let result = async {
        let cost = match args {
            [_, _] => 1,
            [_, _, option, c] if option.eq_ignore_ascii_case(b"COST") => count(c, "COST", 0)?,
            _ => return Err("ERR Usage: TG.LIMIT <name> <key> [COST <c>]".to_string()),
        };
        let (name, key) = (text(args[0], "the limit name")?, args[1]);
        match app.engine.check_named(name, key, cost).await {
            Ok((d, _)) => Ok(d),
            Err(e) => Err(format!("ERR {e}")),
        }
    }
    .await;
    match result {
        Ok(d) => render(out, &d),
        Err(message) => reply::error(out, &message),
    }
}
