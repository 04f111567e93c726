//! `--plot FILE.svg`: the run over time, one point per second — throughput and errors,
//! latency percentiles (log scale), and allowed/denied when replies are decisions.

use std::path::Path;

use anyhow::Context;
use plotters::prelude::*;

use super::record::Tally;
use super::report::Summary;

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

pub(crate) fn draw(path: &Path, title: &str, summary: &Summary) -> anyhow::Result<()> {
    let panels = if summary.decisions { 3 } else { 2 };
    let root = SVGBackend::new(path, (1100, 330 * panels)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let root = root.titled(title, ("sans-serif", 18)).map_err(plot_error)?;
    let areas = root.split_evenly((panels as usize, 1));
    let seconds = &summary.seconds;
    let count = |f: fn(&Tally) -> u64| seconds.iter().map(|s| f(s) as f64).collect::<Vec<_>>();
    counts_panel(
        &areas[0],
        "requests per second",
        &[("requests", count(|s| s.requests), BLUE), ("errors", count(Tally::errors), RED)],
    )?;
    latency_panel(&areas[1], seconds)?;
    if summary.decisions {
        counts_panel(
            &areas[2],
            "decisions per second",
            &[("allowed", count(|s| s.allowed), GREEN), ("denied", count(|s| s.denied), RED)],
        )?;
    }
    root.present().with_context(|| format!("cannot write {}", path.display()))
}

fn counts_panel(area: &Area<'_>, caption: &str, series: &[(&str, Vec<f64>, RGBColor)]) -> anyhow::Result<()> {
    let len = series.first().map_or(0, |(_, v, _)| v.len()).max(1);
    let most = series.iter().flat_map(|(_, v, _)| v.iter().copied()).fold(1.0, f64::max);
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 15))
        .margin(8)
        .x_label_area_size(28)
        .y_label_area_size(64)
        .build_cartesian_2d(0f64..len as f64, 0f64..most * 1.1)
        .map_err(plot_error)?;
    chart.configure_mesh().x_desc("second").draw().map_err(plot_error)?;
    for (label, values, color) in series {
        let color = *color;
        chart
            .draw_series(LineSeries::new(points(values), color.stroke_width(2)))
            .map_err(plot_error)?
            .label(*label)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], color.stroke_width(2)));
    }
    chart.configure_series_labels().border_style(BLACK).background_style(WHITE.mix(0.8)).draw().map_err(plot_error)
}

fn latency_panel(area: &Area<'_>, seconds: &[Tally]) -> anyhow::Result<()> {
    let quantile = |q: f64| -> Vec<Option<f64>> {
        seconds
            .iter()
            .map(|s| (!s.latency_us.is_empty()).then(|| s.latency_us.value_at_quantile(q).max(1) as f64 / 1000.0))
            .collect()
    };
    let series = [("p50", quantile(0.5), BLUE), ("p99", quantile(0.99), MAGENTA), ("max", quantile(1.0), RED)];
    let values = || series.iter().flat_map(|(_, v, _)| v.iter().flatten().copied());
    let low = values().fold(f64::INFINITY, f64::min).min(1.0) / 2.0;
    let high = values().fold(0.001, f64::max) * 2.0;
    let mut chart = ChartBuilder::on(area)
        .caption("latency (ms, log scale; seconds with no reply are gaps)", ("sans-serif", 15))
        .margin(8)
        .x_label_area_size(28)
        .y_label_area_size(64)
        .build_cartesian_2d(0f64..seconds.len().max(1) as f64, (low..high).log_scale())
        .map_err(plot_error)?;
    chart.configure_mesh().x_desc("second").draw().map_err(plot_error)?;
    for (label, values, color) in series {
        let points: Vec<_> = values.iter().enumerate().filter_map(|(i, v)| v.map(|v| (i as f64 + 0.5, v))).collect();
        chart
            .draw_series(PointSeries::of_element(points, 3, color.filled(), &|c, s, st| Circle::new(c, s, st)))
            .map_err(plot_error)?
            .label(label)
            .legend(move |(x, y)| Circle::new((x + 8, y), 3, color.filled()));
    }
    chart.configure_series_labels().border_style(BLACK).background_style(WHITE.mix(0.8)).draw().map_err(plot_error)
}

/// A value per second, drawn at the middle of its second.
fn points(values: &[f64]) -> Vec<(f64, f64)> {
    values.iter().enumerate().map(|(i, &v)| (i as f64 + 0.5, v)).collect()
}

/// plotters' errors borrow the backend; keep only their message.
fn plot_error<E: std::fmt::Display>(error: E) -> anyhow::Error {
    anyhow::anyhow!("plot: {error}")
}
