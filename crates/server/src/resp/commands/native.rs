//! tollgate's own commands: every algorithm, millisecond periods, options, named limits.
//! Replies: `[allowed 1/0, limit, remaining, retry_after_ms, reset_after_ms]`, durations rounded up.

use std::time::Duration;

use bytes::BytesMut;
use tollgate_core::{Algorithm, Decision, Limit};
use tollgate_engine::{EngineError, Frontend, Source};

use super::options::{self, Opt, Syntax};
use super::{integer_arg, reply, text};
use crate::app::App;

/// `key algorithm count period_ms [options]` under `syntax`: the key, the limit and the cost (1
/// unless given).
fn parse<'a>(syntax: &Syntax, args: &[&'a [u8]]) -> Result<(&'a [u8], Limit, u64), String> {
    let (positional, rest) = syntax.split(args)?;
    let &[key, algorithm, per_period, period_ms] = positional else { return Err(syntax.usage.into()) };
    let algorithm: Algorithm = text(algorithm, "the algorithm")?.parse().map_err(|e| format!("ERR {e}"))?;
    let per_period = integer_arg(per_period, "count", 1)?;
    let period_ms = integer_arg(period_ms, "period_ms", 1)?;
    let options = syntax.options(rest)?;
    let mut builder = Limit::builder(per_period, Duration::from_millis(period_ms)).algorithm(algorithm);
    if let Some(burst) = options.get(Opt::Burst) {
        builder = builder.burst(burst);
    }
    if let Some(slices) = options.get(Opt::Slices) {
        builder = builder.slices(slices);
    }
    let limit = builder.build().map_err(|e| format!("ERR {e}"))?;
    Ok((key, limit, options.get(Opt::Cost).unwrap_or(1)))
}

fn render(out: &mut BytesMut, d: &Decision) {
    reply::integers(out, &tollgate_engine::render::check_reply(d));
}

/// `TG.CHECK` (or `TG.PEEK` when `peek`).
pub(super) async fn check(app: &App, args: &[&[u8]], out: &mut BytesMut, peek: bool) {
    let result = async {
        let (key, limit, cost) = if peek {
            let (key, limit, _) = parse(&options::PEEK, args)?;
            (key, limit, 0)
        } else {
            parse(&options::CHECK, args)?
        };
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
        let (key, limit, _) = parse(&options::RESET, args)?;
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
        let (positional, rest) = options::LIMIT.split(args)?;
        let &[name, key] = positional else { return Err(options::LIMIT.usage.to_string()) };
        let name = text(name, "the limit name")?;
        let cost = options::LIMIT.options(rest)?.get(Opt::Cost).unwrap_or(1);
        match app.engine.check_named(Frontend::Resp, name, key, cost).await {
            Ok((d, _)) => Ok(d),
            Err(EngineError::UnknownRule(_)) => Err(format!("ERR {}", app.unknown_limit(name))),
            Err(e) => Err(format!("ERR {e}")),
        }
    }
    .await;
    match result {
        Ok(d) => render(out, &d),
        Err(message) => reply::error(out, &message),
    }
}
