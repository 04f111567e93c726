//! tollgate's own commands: every algorithm, millisecond or calendar periods, options, named limits.
//! Replies: `[allowed 1/0, limit, remaining, retry_after_ms, reset_after_ms]`, durations rounded up.

use std::time::Duration;

use bytes::BytesMut;
use tollgate_core::{Algorithm, Decision, Limit, LimitSpec};
use tollgate_edge as edge;
use tollgate_engine::{EngineError, Frontend, Source};
use tollgate_resp::reply;

use super::args::{integer_arg, text};
use super::options::{self, Opt, Syntax};
use crate::app::App;

/// An ad-hoc limit and the key it is checked for (`TG.PEEK`, `TG.RESET`).
#[derive(Debug)]
pub struct Keyed<'a> {
    key: &'a [u8],
    limit: Limit,
}

/// `TG.CHECK`: a [`Keyed`] limit and the cost of the request.
#[derive(Debug)]
pub struct AdHoc<'a> {
    keyed: Keyed<'a>,
    cost: u64,
}

/// `TG.LIMIT name key [COST c]`: a rule or named limit of the configuration.
#[derive(Debug)]
pub struct Named<'a> {
    name: &'a str,
    key: &'a [u8],
    cost: u64,
}

/// The calendar periods a `TG.*` command takes in place of milliseconds.
const CALENDAR_UNITS: [&str; 4] = ["day", "week", "month", "year"];

/// `key algorithm count period [options]` under `syntax`: the key, the limit (built by
/// [`LimitSpec`]) and the cost (1 unless given). The period is milliseconds, or a calendar unit
/// (`day`, `week`, `month`, `year`) in the `TZ` option's zone (UTC by default).
fn parse<'a>(syntax: &Syntax, args: &[&'a [u8]]) -> Result<(Keyed<'a>, u64), String> {
    let (positional, rest) = syntax.split(args)?;
    let &[key, algorithm, per_period, period] = positional else { return Err(syntax.usage.into()) };
    let algorithm: Algorithm = text(algorithm, "the algorithm")?.parse().map_err(|e| format!("ERR {e}"))?;
    let per_period = integer_arg(per_period, "count", 1)?;
    let unit = CALENDAR_UNITS.into_iter().find(|unit| period.eq_ignore_ascii_case(unit.as_bytes()));
    let period_ms = match unit {
        Some(_) => None,
        None => Some(integer_arg(period, "period_ms", 1).map_err(|e| format!("{e} (or day, week, month, year)"))?),
    };
    let options = syntax.options(rest)?;
    let spec = LimitSpec {
        algorithm: Some(algorithm),
        limit: unit.map(|unit| format!("{per_period}/{unit}")),
        burst: options.get(Opt::Burst),
        slices: options.get(Opt::Slices),
        tz: options.tz().map(str::to_string),
    };
    let limit = match period_ms {
        Some(ms) => spec.build_rate(per_period, Duration::from_millis(ms)),
        None => spec.build(),
    };
    let limit = limit.map_err(|e| format!("ERR {e}"))?;
    Ok((Keyed { key, limit }, options.get(Opt::Cost).unwrap_or(1)))
}

fn decided(out: &mut BytesMut, decided: Result<Decision, String>) {
    match decided {
        Ok(decision) => reply::integers(out, &edge::check_reply(&decision)),
        Err(message) => reply::error(out, &message),
    }
}

impl<'a> AdHoc<'a> {
    /// `TG.CHECK key algorithm count period [BURST b] [SLICES s] [COST c] [TZ zone]`.
    pub(super) fn parse(args: &[&'a [u8]]) -> Result<Self, String> {
        let (keyed, cost) = parse(&options::CHECK, args)?;
        Ok(AdHoc { keyed, cost })
    }

    pub(super) async fn apply(self, app: &App, out: &mut BytesMut) {
        let AdHoc { keyed: Keyed { key, limit }, cost } = self;
        let decision = app.engine.check_adhoc(Source::Check, key, &limit, cost).await;
        decided(out, decision.map_err(|e| format!("ERR {e}")));
    }
}

impl<'a> Keyed<'a> {
    /// `TG.PEEK key algorithm count period [BURST b] [SLICES s] [TZ zone]`.
    pub(super) fn parse_peek(args: &[&'a [u8]]) -> Result<Self, String> {
        Ok(parse(&options::PEEK, args)?.0)
    }

    /// `TG.RESET key algorithm count period [BURST b] [SLICES s] [TZ zone]`.
    pub(super) fn parse_reset(args: &[&'a [u8]]) -> Result<Self, String> {
        Ok(parse(&options::RESET, args)?.0)
    }

    /// `TG.PEEK`: the check of cost 0.
    pub(super) async fn peek(self, app: &App, out: &mut BytesMut) {
        AdHoc { keyed: self, cost: 0 }.apply(app, out).await;
    }

    /// `TG.RESET`: `+OK` once the key's state under the limit's algorithm is forgotten.
    pub(super) async fn reset(self, app: &App, out: &mut BytesMut) {
        match app.engine.reset("", self.key, &self.limit).await {
            Ok(()) => reply::simple(out, "OK"),
            Err(e) => reply::error(out, &format!("ERR {e}")),
        }
    }
}

impl<'a> Named<'a> {
    /// `TG.LIMIT name key [COST c]`.
    pub(super) fn parse(args: &[&'a [u8]]) -> Result<Self, String> {
        let (positional, rest) = options::LIMIT.split(args)?;
        let &[name, key] = positional else { return Err(options::LIMIT.usage.to_string()) };
        let name = text(name, "the limit name")?;
        let cost = options::LIMIT.options(rest)?.get(Opt::Cost).unwrap_or(1);
        Ok(Named { name, key, cost })
    }

    pub(super) async fn apply(self, app: &App, out: &mut BytesMut) {
        let Named { name, key, cost } = self;
        let decision = match app.engine.check_named(Frontend::Resp, name, key, cost).await {
            Ok((decision, _)) => Ok(decision),
            Err(EngineError::UnknownRule(_)) => Err(format!("ERR {}", app.unknown_limit(name))),
            Err(e) => Err(format!("ERR {e}")),
        };
        decided(out, decision);
    }
}
