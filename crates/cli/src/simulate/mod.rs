//! `tollgate simulate`: deterministic replay on a virtual clock.
//!
//! - `tollgate simulate --trace FILE [--check]` decides every request of a JSON-lines trace under
//!   the limit of its params header or of `--algorithm`/`--limit` (not both, unless they agree),
//!   prints one JSON decision per request, and with `--check` compares each with its `expect`
//!   ([`replay`], line formats in `tollgate_core::trace`).
//! - `tollgate simulate over-grant [--plot FILE.svg]` reproduces the over-grant experiments of the
//!   articles tollgate started from ([`over_grant`]).

mod clients;
mod over_grant;
mod plot;
mod replay;

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};

use tollgate_core::LimitSpec;

/// Arguments of `tollgate simulate`.
#[derive(Debug, Args)]
// A trace's params header can give the limit, so the shared flags are optional here; `replay`
// refuses a trace with neither, or with both disagreeing.
#[command(
    subcommand_negates_reqs = true,
    args_conflicts_with_subcommands = true,
    mut_arg("algorithm", |a| a.required(false)),
    mut_arg("limit", |a| a.required(false))
)]
pub(crate) struct SimulateArgs {
    #[command(subcommand)]
    experiment: Option<Experiment>,
    #[command(flatten)]
    limit: LimitSpec,
    /// JSON lines {"t": ns since the epoch, "key": "...", "cost": 1, "expect": {...}}, optionally
    /// after a {"params": {"algorithm": ..., "limit": ...}} header line; `-` reads stdin.
    #[arg(long, value_name = "FILE", required = true)]
    trace: Option<PathBuf>,
    /// Compare every decision with its line's "expect" fields; exit 1 if any differs.
    #[arg(long, requires = "trace")]
    check: bool,
}

#[derive(Debug, Subcommand)]
enum Experiment {
    /// TestOverGrant (64 lockstep clients), the fixed-window boundary attack and the sliding
    /// window counter under synchronized versus Poisson traffic, for every algorithm.
    OverGrant {
        /// Also draw admitted/rejected over time per algorithm into this file (SVG; the name
        /// must end in .svg).
        #[arg(long, value_name = "FILE.svg", value_parser = crate::units::svg_path)]
        plot: Option<PathBuf>,
    },
}

/// Runs `tollgate simulate`.
pub(crate) fn run(args: SimulateArgs) -> anyhow::Result<()> {
    match args.experiment {
        Some(Experiment::OverGrant { plot }) => over_grant::run(plot.as_deref()),
        None => {
            let flags = flags(&args.limit)?;
            let trace = args.trace.expect("clap requires --trace without a subcommand");
            replay::run(&flags, &trace, args.check)
        }
    }
}

/// The limit flags as given, and the limit they build when they name at least an algorithm and
/// a limit (invalid flags are an error at once, header or not).
fn flags(args: &LimitSpec) -> anyhow::Result<replay::Flags> {
    let mut given = Vec::new();
    if let Some(algorithm) = args.algorithm {
        given.push(format!("--algorithm {algorithm}"));
    }
    if let Some(limit) = &args.limit {
        given.push(format!("--limit {limit}"));
    }
    if let Some(burst) = args.burst {
        given.push(format!("--burst {burst}"));
    }
    if let Some(slices) = args.slices {
        given.push(format!("--slices {slices}"));
    }
    if let Some(tz) = &args.tz {
        given.push(format!("--tz {tz}"));
    }
    let limit = match (args.algorithm, &args.limit) {
        (Some(_), Some(_)) => Some(args.build().with_context(|| format!("invalid limit {args}"))?),
        _ => None,
    };
    Ok(replay::Flags { limit, given: (!given.is_empty()).then(|| given.join(" ")) })
}
