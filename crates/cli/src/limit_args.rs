//! The command-line description of a limit: `--algorithm`, `--limit N/PERIOD`, `--burst`,
//! `--slices`, shared by every subcommand that takes one.

use anyhow::Context;
use clap::Args;
use tollgate_core::{Algorithm, Limit, LimitBuilder};

/// A limit as given on the command line.
#[derive(Debug, Clone, Args)]
pub(crate) struct LimitArgs {
    /// gcra, token-bucket, leaky-bucket, fixed-window, sliding-log, sliding-window or sub-window.
    #[arg(long, value_name = "ALG", required = true)]
    pub(crate) algorithm: Option<Algorithm>,
    /// COUNT/PERIOD, e.g. 10/s, 100/1m, 5/500ms (units ns, us, ms, s, m, h, d).
    #[arg(long, value_name = "N/PERIOD", required = true)]
    pub(crate) limit: Option<String>,
    /// Requests admitted at once from idle (gcra, token-bucket, leaky-bucket; default: the count).
    #[arg(long, value_name = "B")]
    pub(crate) burst: Option<u64>,
    /// Equal slices of the period (sub-window; default 60, or the largest divisor below 60).
    #[arg(long, value_name = "S")]
    pub(crate) slices: Option<u64>,
}

impl LimitArgs {
    /// The validated limit, or an error naming the flag at fault.
    pub(crate) fn build(&self) -> anyhow::Result<Limit> {
        let algorithm = self.algorithm.context("--algorithm is required")?;
        let text = self.limit.as_deref().context("--limit is required")?;
        let mut builder: LimitBuilder = text.parse().with_context(|| format!("invalid --limit {text:?}"))?;
        builder = builder.algorithm(algorithm);
        if let Some(burst) = self.burst {
            builder = builder.burst(burst);
        }
        if let Some(slices) = self.slices {
            builder = builder.slices(slices);
        }
        builder.build().with_context(|| format!("invalid limit {algorithm} {text}"))
    }
}
