//! `tollgate simulate over-grant`: the over-grant experiments of the articles tollgate's
//! specification started from, replayed exactly on a virtual clock.
//!
//! 1. TestOverGrant, from "Rate Limiter Algorithm Zoo: GCRA, Sliding Window, and the Off-by-One
//!    Tax" (author not named): 64 clients hammer one key for 3 s at 10/s with burst 10.
//! 2. The fixed-window boundary attack of "Rate Limiting Demystified - Part 2: Algorithms Deep
//!    Dive" (by Admin) and "Rate-limiting algorithms for defense: token bucket, sliding window,
//!    and GCRA" (author not named): 100 requests just before a minute's seam and 100 just after,
//!    under 100/min.
//! 3. The first article's sliding window counter surprise: synchronized traffic against Poisson
//!    traffic (Cloudflare's near-exact estimate).
//!
//! Every signed figure follows one convention, printed as the report's legend: `(admitted -
//! allowed) / allowed`, `+` an over-grant, `-` an under-grant, where `allowed` is what the exact
//! form of the limit admits of the same requests (see [`exact_form`]).

use std::fmt::Write as _;
use std::path::Path;

use tollgate_core::{Algorithm, Limit};

use super::clients::{self, Outcome, Run};
use super::plot;

const MS: u64 = 1_000_000;
const SEC: u64 = 1_000 * MS;
const MINUTE: u64 = 60 * SEC;
/// 2023-11-15T00:00:00Z: a day-aligned instant, so that windows and seams fall where a clock says.
const MIDNIGHT: u64 = 1_700_006_400 * SEC;

const LEGEND: &str = "\
Every \"vs allowed\" figure is (admitted - allowed) / allowed: + is an over-grant, - an under-grant.
\"allowed\" is what the exact form of the limit admits of the same requests: GCRA for the bucket family (burst at
once, then one per emission interval), the sliding log for the window family (count in any window of one period).
Next to a busiest window, \"allowed\" is the most that exact form admits within one period.
";

const SOURCES: &str = "\
Sources (the articles tollgate's specification started from):
[1] \"Rate Limiter Algorithm Zoo: GCRA, Sliding Window, and the Off-by-One Tax\", author not named (part 3 of a series
    on building a distributed rate limiter)
[2] \"Rate Limiting Demystified - Part 2: Algorithms Deep Dive\", by Admin
[3] \"Rate-limiting algorithms for defense: token bucket, sliding window, and GCRA\", author not named
";

/// Prints every experiment; draws TestOverGrant into `plot_path` when given.
pub(crate) fn run(plot_path: Option<&Path>) -> anyhow::Result<()> {
    let runs = test_over_grant_runs();
    let mut report = String::from(LEGEND);
    test_over_grant_report(&runs, &mut report);
    boundary_attack_report(&mut report);
    sliding_window_report(&runs, &mut report);
    report.push('\n');
    report.push_str(SOURCES);
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

/// The exact form of `algorithm`, whose admissions are "allowed": GCRA for the bucket family (the
/// token and leaky buckets make its decisions by design), the sliding log for the window family
/// (the only one holding exactly `count` in every window of one period).
fn exact_form(algorithm: Algorithm) -> Algorithm {
    if algorithm.is_bucket() { Algorithm::Gcra } else { Algorithm::SlidingLog }
}

/// The most the exact form of `limit` admits within one period (half-open): `count`, or for the
/// bucket family the burst plus the refills that fit in the rest of the period.
fn per_period_allowed(limit: &Limit) -> u64 {
    if limit.algorithm().is_bucket() {
        limit.burst() + (limit.period_ns() - 1) / limit.emission_interval_ns()
    } else {
        limit.count()
    }
}

/// The report's one convention: `(admitted - allowed) / allowed`, signed, one decimal.
fn versus(admitted: u64, allowed: u64) -> String {
    if allowed == 0 {
        return "n/a".into();
    }
    format!("{:+.1}%", (admitted as f64 - allowed as f64) * 100.0 / allowed as f64)
}

/// Admissions of the run of `algorithm` among `runs`.
fn admitted_by(runs: &[Run], algorithm: Algorithm) -> Vec<u64> {
    let run = runs.iter().find(|r| r.algorithm == algorithm).expect("every algorithm ran");
    clients::admitted(&run.outcomes)
}

fn test_over_grant_report(runs: &[Run], out: &mut String) {
    let _ = writeln!(
        out,
        "\nTestOverGrant [1]: 64 clients in lockstep, one request each per ms, one key, 10/s with burst 10\n\
         (sub-window: 10 slices), for 3 s from 0.6 s into a second, both ends included.\n"
    );
    let _ = writeln!(
        out,
        "{:<16}{:>9}{:>9}{:>12}{:>13}{:>9}{:>12}",
        "algorithm", "admitted", "allowed", "vs allowed", "busiest 1 s", "allowed", "vs allowed"
    );
    let mut seams = Vec::new();
    for run in runs {
        let limit = over_grant_limit(run.algorithm);
        let admitted = clients::admitted(&run.outcomes).len() as u64;
        let allowed = admitted_by(runs, exact_form(run.algorithm)).len() as u64;
        let busiest = clients::busiest_window(&clients::admitted(&run.outcomes), limit.period_ns());
        let busiest_allowed = per_period_allowed(&limit);
        if busiest > busiest_allowed {
            seams.push(format!("{} admits {busiest} ({})", run.algorithm, versus(busiest, busiest_allowed)));
        }
        let _ = writeln!(
            out,
            "{:<16}{admitted:>9}{allowed:>9}{:>12}{busiest:>13}{busiest_allowed:>9}{:>12}",
            run.algorithm.as_str(),
            versus(admitted, allowed),
            versus(busiest, busiest_allowed),
        );
    }
    let _ = writeln!(
        out,
        "-> Over the whole run no algorithm admits more than allowed (40: burst 10 + 30 refills, or 10 at each of 0.6, 1.6,\n   \
         2.6 and 3.6 s). Within one second the seams show: {}\n   \
         (see the sliding window counter's section).",
        seams.join(" and ")
    );
}

fn boundary_attack_report(out: &mut String) {
    let noon = MIDNIGHT + 12 * 60 * MINUTE;
    let (before, after) = (noon - 10 * SEC, noon + 10 * SEC);
    let mut arrivals = vec![before; 100];
    arrivals.extend(std::iter::repeat_n(after, 100));
    let _ = writeln!(
        out,
        "\nFixed-window boundary attack [2][3]: 100/min (burst 100; sub-window: 60 slices), 100 requests at 11:59:50\n\
         and 100 at 12:00:10, one key.\n"
    );
    let _ = writeln!(
        out,
        "{:<16}{:>12}{:>12}{:>13}{:>9}{:>12}",
        "algorithm", "11:59:50", "12:00:10", "within 20 s", "allowed", "vs allowed"
    );
    let decide = |algorithm| clients::replay(&limit(algorithm, 100, MINUTE, 60), &arrivals);
    let admitted = |outcomes: &[Outcome]| outcomes.iter().filter(|o| o.allowed).count() as u64;
    for &algorithm in Algorithm::ALL.iter() {
        let outcomes = decide(algorithm);
        let (first, second) = (admitted(&outcomes[..100]), admitted(&outcomes[100..]));
        let allowed = admitted(&decide(exact_form(algorithm)));
        let _ = writeln!(
            out,
            "{:<16}{first:>12}{second:>12}{:>13}{allowed:>9}{:>12}",
            algorithm.as_str(),
            first + second,
            versus(first + second, allowed)
        );
    }
    let _ = writeln!(
        out,
        "-> Fixed window admits twice what is allowed because its count resets at 12:00:00, and the sliding window counter\n   \
         lets some through on its estimate; the buckets' 133 is what they allow (burst 100 + 33 refills in 20 s)."
    );
}

fn sliding_window_report(runs: &[Run], out: &mut String) {
    let _ = writeln!(
        out,
        "\nSliding window counter against the exact sliding log on the same requests: [1] found it over-granting on\n\
         TestOverGrant, Cloudflare nearly exact on real traffic. \"wrongly admitted\": admitted although the period\n\
         before it already held `count` admissions.\n"
    );
    let _ = writeln!(
        out,
        "{:<39}{:>9}{:>9}{:>12}{:>18}{:>16}{:>9}{:>12}",
        "traffic", "admitted", "allowed", "vs allowed", "wrongly admitted", "busiest window", "allowed", "vs allowed"
    );
    let row = |out: &mut String, traffic: &str, swc: &[Outcome], allowed: u64, count: u64, period: u64| {
        let admitted = clients::admitted(swc);
        let (wrongly_admitted, _) = clients::wrong_decisions(swc, count, period);
        let busiest = clients::busiest_window(&admitted, period);
        let admitted = admitted.len() as u64;
        let _ = writeln!(
            out,
            "{traffic:<39}{admitted:>9}{allowed:>9}{:>12}{wrongly_admitted:>18}{busiest:>16}{count:>9}{:>12}",
            versus(admitted, allowed),
            versus(busiest, count),
        );
    };
    let swc = &runs.iter().find(|r| r.algorithm == Algorithm::SlidingWindow).expect("every algorithm ran").outcomes;
    let exact = admitted_by(runs, Algorithm::SlidingLog).len() as u64;
    row(out, "synchronized: TestOverGrant, 10/s, 3 s", swc, exact, 10, SEC);
    for per_second in [1.5, 2.0] {
        let arrivals = clients::poisson(42, per_second, MIDNIGHT, 60 * MINUTE);
        let estimated = clients::replay(&limit(Algorithm::SlidingWindow, 100, MINUTE, 1), &arrivals);
        let exact = clients::replay(&limit(Algorithm::SlidingLog, 100, MINUTE, 1), &arrivals);
        let exact = clients::admitted(&exact).len() as u64;
        row(out, &format!("Poisson {per_second}/s, 100/min, 1 h (seed 42)"), &estimated, exact, 100, MINUTE);
    }
    let admitted = clients::admitted(swc);
    let busiest = clients::busiest_window(&admitted, SEC);
    let admitted = admitted.len() as u64;
    let _ = writeln!(
        out,
        "-> Synchronized: {admitted} admitted, {} against the {exact} allowed over the run, but {busiest} within one second, {}:\n   \
         the counter weights the previous window as if its hits were spread evenly, but lockstep clients hit at its start.\n   \
         [1] counts the same {admitted} against 30 (10/s times 3 s), hence its over-grant; this run includes both ends of its\n   \
         3 s, which lets the exact log admit {exact}. Poisson traffic fits the counter's assumption better, yet at the limit\n   \
         the estimate still errs by whole requests; Cloudflare's three errors in 100,000 are over all traffic, most of\n   \
         it far below its limits.",
        versus(admitted, exact),
        versus(busiest, 10),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The figures the issue and the first article name: every bucket admits exactly burst + 30 =
    /// 40, as does the exact log (10 at each of four instants a second apart), and the sliding
    /// window counter admits the article's 34.
    #[test]
    fn test_over_grant_reproduces_the_articles_figures() {
        let runs = test_over_grant_runs();
        for run in &runs {
            let admitted = clients::admitted(&run.outcomes).len() as u64;
            let expected = if run.algorithm == Algorithm::SlidingWindow { 34 } else { 40 };
            assert_eq!(admitted, expected, "{}", run.algorithm);
        }
        assert_eq!(per_period_allowed(&over_grant_limit(Algorithm::Gcra)), 19);
        assert_eq!(per_period_allowed(&over_grant_limit(Algorithm::SubWindow)), 10);
    }

    #[test]
    fn one_signed_convention() {
        assert_eq!(versus(34, 40), "-15.0%");
        assert_eq!(versus(15, 10), "+50.0%");
        assert_eq!(versus(40, 40), "+0.0%");
        assert_eq!(versus(1, 0), "n/a");
    }
}
