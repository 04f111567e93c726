//! `tollgate simulate over-grant`: the seeds' experiments, replayed exactly on a virtual clock.
//!
//! 1. Seed 000's TestOverGrant: 64 clients hammer one key for 3 s at 10/s with burst 10.
//! 2. Seeds 002/003's fixed-window boundary attack: 100 requests just before a minute's seam and
//!    100 just after, under 100/min.
//! 3. Seed 000's sliding window counter surprise: synchronized traffic (34 admitted where 10/s
//!    allows 30) against Poisson traffic (Cloudflare's near-exact estimate).

use std::fmt::Write as _;
use std::path::Path;

use tollgate_core::{Algorithm, Limit};

use super::clients::{self, Outcome};
use super::plot;

const MS: u64 = 1_000_000;
const SEC: u64 = 1_000 * MS;
const MINUTE: u64 = 60 * SEC;
/// 2023-11-15T00:00:00Z: a day-aligned instant, so that windows and seams fall where a clock says.
const MIDNIGHT: u64 = 1_700_006_400 * SEC;

/// One algorithm's run of TestOverGrant, kept for the table and the plot.
pub(crate) struct Run {
    pub(crate) algorithm: Algorithm,
    pub(crate) start: u64,
    pub(crate) outcomes: Vec<Outcome>,
}

/// Prints every experiment; draws TestOverGrant into `plot_path` when given.
pub(crate) fn run(plot_path: Option<&Path>) -> anyhow::Result<()> {
    let runs = test_over_grant_runs();
    let mut report = String::new();
    test_over_grant_report(&runs, &mut report);
    boundary_attack_report(&mut report);
    sliding_window_report(&runs, &mut report);
    print!("{report}");
    if let Some(path) = plot_path {
        plot::draw(path, &runs)?;
        println!("\nplot: {}", path.display());
    }
    Ok(())
}

/// `count`/`period` for `algorithm`: burst = count for the buckets, `slices` for the sub-window.
fn limit(algorithm: Algorithm, count: u64, period: u64, slices: u64) -> Limit {
    let mut builder = Limit::builder(count, std::time::Duration::from_nanos(period)).algorithm(algorithm);
    if algorithm == Algorithm::SubWindow {
        builder = builder.slices(slices);
    }
    builder.build().expect("the experiments' limits are valid")
}

/// TestOverGrant's limit: 10/s, burst 10, and 10 slices of 100 ms for the sub-window counter.
fn over_grant_limit(algorithm: Algorithm) -> Limit {
    limit(algorithm, 10, SEC, 10)
}

/// The run starts 0.6 s into a second, as a real run starts wherever the wall clock is.
const RUN_START: u64 = MIDNIGHT + 600 * MS;
const RUN_LENGTH: u64 = 3 * SEC;

fn test_over_grant_runs() -> Vec<Run> {
    let arrivals = clients::lockstep(64, RUN_START, MS, RUN_LENGTH);
    Algorithm::ALL
        .iter()
        .map(|&algorithm| Run {
            algorithm,
            start: RUN_START,
            outcomes: clients::replay(&over_grant_limit(algorithm), &arrivals),
        })
        .collect()
}

/// The most `limit` may admit in the closed interval `[start, start + length]`, by its own
/// definition, and the most in any half-open window of one period.
fn bounds(limit: &Limit, start: u64, length: u64) -> (u64, u64) {
    let (count, period) = (limit.count(), limit.period_ns());
    let end = start + length;
    match limit.algorithm() {
        // Burst, plus one per emission interval elapsed.
        a if a.is_bucket() => {
            let t = limit.emission_interval_ns();
            (limit.burst() + length / t, limit.burst() + (period - 1) / t)
        }
        // `count` per window of `period` ending anywhere.
        Algorithm::SlidingLog => (count * (length / period + 1), count),
        // `count` per run of `slices` consecutive slices.
        Algorithm::SubWindow => {
            let slice = period / limit.slices();
            let touched = end / slice - start / slice + 1;
            (count * touched.div_ceil(limit.slices()), count)
        }
        // Fixed window and the sliding window counter: at most `count` per aligned window.
        _ => (count * (end / period - start / period + 1), count),
    }
}

fn percent(actual: u64, expected: u64) -> f64 {
    (actual as f64 - expected as f64) * 100.0 / expected as f64
}

fn test_over_grant_report(runs: &[Run], out: &mut String) {
    let _ = writeln!(
        out,
        "TestOverGrant (seed 000): 64 clients in lockstep, one request each per ms, one key, 10/s with \
         burst 10\n(sub-window: 10 slices), for 3 s from 0.6 s into a second, both ends included.\n"
    );
    let _ = writeln!(
        out,
        "{:<16}{:>9}{:>17}{:>12}{:>14}{:>14}",
        "algorithm", "admitted", "theoretical max", "over-grant", "busiest 1 s", "1 s bound"
    );
    for run in runs {
        let limit = over_grant_limit(run.algorithm);
        let admitted = clients::admitted(&run.outcomes);
        let (max, second_bound) = bounds(&limit, run.start, RUN_LENGTH);
        let busiest = clients::busiest_window(&admitted, limit.period_ns());
        let flag = if busiest > second_bound { " !" } else { "  " };
        let _ = writeln!(
            out,
            "{:<16}{:>9}{:>17}{:>+11.2}%{:>12}{flag}{:>14}",
            run.algorithm.name(),
            admitted.len(),
            max,
            percent(admitted.len() as u64, max),
            busiest,
            second_bound,
        );
    }
    let _ = writeln!(
        out,
        "-> No algorithm admits more than its theoretical max (burst + 30 refills, or 10 per window touched); \
         the busiest second shows\n   the seams: fixed window lets 20 through within one second, the sliding \
         window counter 15 (see its section below).\n"
    );
}

fn boundary_attack_report(out: &mut String) {
    let noon = MIDNIGHT + 12 * 60 * MINUTE;
    let (before, after) = (noon - 10 * SEC, noon + 10 * SEC);
    let mut arrivals = vec![before; 100];
    arrivals.extend(std::iter::repeat_n(after, 100));
    let _ = writeln!(
        out,
        "Fixed-window boundary attack (seeds 002/003): 100/min (burst 100; sub-window: 60 slices), 100 requests \
         at 11:59:50\nand 100 at 12:00:10, one key.\n"
    );
    let _ = writeln!(out, "{:<16}{:>12}{:>12}{:>16}", "algorithm", "11:59:50", "12:00:10", "within 20 s");
    for &algorithm in Algorithm::ALL.iter() {
        let outcomes = clients::replay(&limit(algorithm, 100, MINUTE, 60), &arrivals);
        let first = outcomes[..100].iter().filter(|o| o.allowed).count();
        let second = outcomes[100..].iter().filter(|o| o.allowed).count();
        let _ = writeln!(out, "{:<16}{first:>12}{second:>12}{:>16}", algorithm.name(), first + second);
    }
    let _ = writeln!(
        out,
        "-> Fixed window admits 200 within 20 s because the count resets at 12:00:00; the sliding log and \
         sub-window hold 100,\n   the sliding window counter lets 16 more through on its estimate, and the \
         buckets' 133 is by design (burst 100 + 20 s of refill).\n"
    );
}

fn sliding_window_report(runs: &[Run], out: &mut String) {
    let _ = writeln!(
        out,
        "Sliding window counter against an exact sliding window on the same arrivals (seed 000's 13% versus \
         Cloudflare's 0.003%).\n\"wrongly admitted\": admitted although the period before it already held \
         `count` admissions.\n"
    );
    let _ = writeln!(
        out,
        "{:<40}{:>10}{:>11}{:>18}{:>16}",
        "traffic", "admitted", "exact log", "wrongly admitted", "busiest window"
    );
    let swc = runs.iter().find(|r| r.algorithm == Algorithm::SlidingWindow).expect("every algorithm ran");
    let log = runs.iter().find(|r| r.algorithm == Algorithm::SlidingLog).expect("every algorithm ran");
    let row = |out: &mut String, traffic: &str, swc: &[Outcome], log: &[Outcome], count: u64, period: u64| {
        let admitted = clients::admitted(swc);
        let (wrongly_admitted, _) = clients::wrong_decisions(swc, count, period);
        let busiest = clients::busiest_window(&admitted, period);
        let _ = writeln!(
            out,
            "{traffic:<40}{:>10}{:>11}{wrongly_admitted:>18}{:>16}",
            admitted.len(),
            clients::admitted(log).len(),
            format!("{busiest} of {count}"),
        );
    };
    row(out, "synchronized: TestOverGrant, 10/s, 3 s", &swc.outcomes, &log.outcomes, 10, SEC);
    for per_second in [1.5, 2.0] {
        let arrivals = clients::poisson(42, per_second, MIDNIGHT, 60 * MINUTE);
        let estimated = clients::replay(&limit(Algorithm::SlidingWindow, 100, MINUTE, 1), &arrivals);
        let exact = clients::replay(&limit(Algorithm::SlidingLog, 100, MINUTE, 1), &arrivals);
        row(out, &format!("Poisson {per_second}/s, 100/min, 1 h (seed 42)"), &estimated, &exact, 100, MINUTE);
    }
    let synchronized = clients::admitted(&swc.outcomes).len() as u64;
    let average = 10 * RUN_LENGTH / SEC;
    let _ = writeln!(
        out,
        "-> Synchronized: {synchronized} admitted where 10/s over 3 s allows {average} ({:+.1}%): the counter weights \
         the previous window as if\n   its hits were spread evenly, but lockstep clients hit at its start. Poisson \
         traffic fits that assumption better, yet at the limit\n   the estimate still errs by whole requests; \
         Cloudflare's 0.003% is over all traffic, most of it far below its limits.",
        percent(synchronized, average)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The figures the issue and the seeds name: every bucket admits exactly burst + 30 = 40, and the
    /// sliding window counter admits seed 000's 34.
    #[test]
    fn test_over_grant_reproduces_the_seeds_figures() {
        for run in test_over_grant_runs() {
            let admitted = clients::admitted(&run.outcomes).len() as u64;
            let limit = over_grant_limit(run.algorithm);
            let (max, _) = bounds(&limit, run.start, RUN_LENGTH);
            assert!(admitted <= max, "{}: {admitted} > {max}", run.algorithm);
            let expected = if run.algorithm == Algorithm::SlidingWindow { 34 } else { 40 };
            assert_eq!(admitted, expected, "{}", run.algorithm);
        }
    }
}
