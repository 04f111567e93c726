//! The `--plot` SVG of `tollgate simulate over-grant`: for each algorithm, requests admitted and
//! rejected per 100 ms of the TestOverGrant run, on a log scale (admissions are tens, rejections
//! thousands).
//!
//! SVG only, and the file name must say so: PNG would need plotters' bitmap backend, whose text
//! needs a font engine (`ttf`: system FreeType and fontconfig; or `ab_glyph` and a font file
//! embedded in the binary) on top of the `image` crate, about twenty more crates and several
//! times the plot's build time, for a picture any SVG converter makes.

use std::path::Path;

use anyhow::Context;
use plotters::prelude::*;

use super::clients::Run;

const BIN_NS: u64 = 100_000_000;
/// Where an empty bin is drawn: below 1 on the log axis, so "none" sits on the floor.
const FLOOR: f64 = 0.7;

/// Draws one panel per run into an SVG file at `path`.
pub(crate) fn draw(path: &Path, runs: &[Run]) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, (1200, 1000)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let root = root
        .titled("TestOverGrant: 64 lockstep clients, 10/s burst 10, requests per 100 ms", ("sans-serif", 22))
        .map_err(plot_error)?;
    let panels = root.split_evenly((4, 2));
    for (run, area) in runs.iter().zip(panels.iter()) {
        draw_panel(area, run)?;
    }
    root.present().with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

fn draw_panel(area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>, run: &Run) -> anyhow::Result<()> {
    let end = run.outcomes.last().map_or(run.start, |o| o.t);
    let bins = usize::try_from((end - run.start) / BIN_NS + 1).context("run too long to plot")?;
    let (mut admitted, mut rejected) = (vec![0u64; bins], vec![0u64; bins]);
    for outcome in &run.outcomes {
        let bin = usize::try_from((outcome.t - run.start) / BIN_NS).context("run too long to plot")?;
        if outcome.allowed { admitted[bin] += 1 } else { rejected[bin] += 1 }
    }
    let total_admitted: u64 = admitted.iter().sum();
    let most = rejected.iter().chain(&admitted).copied().max().unwrap_or(1).max(10) as f64;
    let seconds = bins as f64 * BIN_NS as f64 / 1e9;

    let mut chart = ChartBuilder::on(area)
        .caption(format!("{} ({total_admitted} admitted)", run.algorithm), ("sans-serif", 16))
        .margin(8)
        .x_label_area_size(28)
        .y_label_area_size(48)
        .build_cartesian_2d(0f64..seconds, (FLOOR..most * 2.0).log_scale())
        .map_err(plot_error)?;
    chart.configure_mesh().x_desc("s since the run's start").y_desc("requests").draw().map_err(plot_error)?;
    for (counts, color, label) in [(&admitted, GREEN.mix(0.9), "admitted"), (&rejected, RED.mix(0.6), "rejected")] {
        chart
            .draw_series(LineSeries::new(steps(counts), color.stroke_width(2)))
            .map_err(plot_error)?
            .label(label)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], color.stroke_width(2)));
    }
    chart.configure_series_labels().border_style(BLACK).background_style(WHITE.mix(0.8)).draw().map_err(plot_error)?;
    Ok(())
}

/// A step line through per-bin counts: flat over each bin.
fn steps(counts: &[u64]) -> Vec<(f64, f64)> {
    let width = BIN_NS as f64 / 1e9;
    counts
        .iter()
        .enumerate()
        .flat_map(|(i, &n)| {
            let y = if n == 0 { FLOOR } else { n as f64 };
            [(i as f64 * width, y), ((i + 1) as f64 * width, y)]
        })
        .collect()
}

/// plotters' errors borrow the backend; keep only their message.
fn plot_error<E: std::fmt::Display>(error: E) -> anyhow::Error {
    anyhow::anyhow!("plot: {error}")
}
