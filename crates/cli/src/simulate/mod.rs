//! `tollgate simulate`: deterministic replay on a virtual clock.
//!
//! - `tollgate simulate --algorithm ALG --limit N/PERIOD --trace FILE` decides every request of a
//!   JSON-lines trace and prints one JSON decision per request ([`replay`]).
//! - `tollgate simulate over-grant` reproduces the seeds' over-grant experiments ([`over_grant`]).

mod clients;
mod over_grant;
mod plot;
mod replay;

use std::path::PathBuf;

use clap::{Args, Subcommand};

use crate::limit_args::LimitArgs;

/// Arguments of `tollgate simulate`.
#[derive(Debug, Args)]
#[command(subcommand_negates_reqs = true, args_conflicts_with_subcommands = true)]
pub(crate) struct SimulateArgs {
    #[command(subcommand)]
    experiment: Option<Experiment>,
    #[command(flatten)]
    limit: LimitArgs,
    /// JSON lines {"t": ns since the epoch, "key": "...", "cost": 1}; `-` reads stdin.
    #[arg(long, value_name = "FILE", required = true)]
    trace: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
enum Experiment {
    /// Seed 000's TestOverGrant, the fixed-window boundary attack and the sliding window
    /// counter under synchronized versus Poisson traffic, for every algorithm.
    OverGrant {
        /// Also draw admitted/rejected over time per algorithm into this SVG file.
        #[arg(long, value_name = "FILE.svg")]
        plot: Option<PathBuf>,
    },
}

/// Runs `tollgate simulate`.
pub(crate) fn run(args: SimulateArgs) -> anyhow::Result<()> {
    match args.experiment {
        Some(Experiment::OverGrant { plot }) => over_grant::run(plot.as_deref()),
        None => {
            let limit = args.limit.build()?;
            let trace = args.trace.expect("clap requires --trace without a subcommand");
            replay::run(&limit, &trace)
        }
    }
}
