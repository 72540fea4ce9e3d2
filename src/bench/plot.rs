//! `--plot`: PNG charts of serving benchmarks with plotters. Text is drawn with a TrueType font:
//! `--plot-font FILE`, else DejaVu Sans / Liberation Sans / Arial from the usual system folders.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use plotters::prelude::*;

use super::serve::ServeBenchResult;
use super::stats::Summary;

/// Where fonts usually are on Linux and macOS.
const FONT_CANDIDATES: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/Library/Fonts/Arial.ttf",
    "/System/Library/Fonts/Supplemental/Arial.ttf",
];

/// Registers the chart font (once per process): `explicit`, else the first system candidate.
pub fn load_font(explicit: Option<&Path>) -> Result<(), String> {
    static LOADED: Mutex<bool> = Mutex::new(false);
    let mut loaded = LOADED.lock().unwrap_or_else(|e| e.into_inner());
    if *loaded {
        return Ok(());
    }
    let path = match explicit {
        Some(p) => p.to_path_buf(),
        None => FONT_CANDIDATES
            .iter()
            .map(PathBuf::from)
            .find(|p| p.is_file())
            .ok_or_else(|| {
                "--plot needs a TrueType font and none was found in the usual places; pass one \
                 with --plot-font FILE.ttf (e.g. from fonts-dejavu-core)"
                    .to_string()
            })?,
    };
    let bytes = std::fs::read(&path).map_err(|e| format!("--plot-font {}: {e}", path.display()))?;
    // plotters keeps the font for the whole process.
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
        .map_err(|_| format!("{} is not a TrueType/OpenType font", path.display()))?;
    *loaded = true;
    Ok(())
}

/// A named statistic of a [`Summary`], drawn in a colour.
type Stat = (&'static str, fn(&Summary) -> f64, RGBColor);
/// A named latency metric of a result.
type Metric = (&'static str, fn(&ServeBenchResult) -> &Summary);

fn draw_err<E: std::fmt::Display>(e: E) -> String {
    format!("drawing the chart failed: {e}")
}

/// One run: mean, median, p90 and p99 of TTFT, TPOT, ITL and E2E, as grouped bars (ms).
pub fn percentiles_chart(r: &ServeBenchResult, path: &Path) -> Result<(), String> {
    let metrics: [(&str, &Summary); 4] = [
        ("TTFT", &r.ttft),
        ("TPOT", &r.tpot),
        ("ITL", &r.itl),
        ("E2E", &r.e2e),
    ];
    let stats: [Stat; 4] = [
        ("mean", |s| s.mean_ms, RGBColor(120, 120, 120)),
        ("median", |s| s.median_ms, BLUE),
        ("p90", |s| s.p90_ms, RGBColor(230, 140, 0)),
        ("p99", |s| s.p99_ms, RED),
    ];
    let top = metrics
        .iter()
        .flat_map(|(_, s)| [s.mean_ms, s.median_ms, s.p90_ms, s.p99_ms])
        .fold(1e-3f64, f64::max);
    let rate = match r.request_rate {
        Some(x) => format!("{x} req/s"),
        None => "rate inf".to_string(),
    };
    let root = BitMapBackend::new(path, (1000, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(draw_err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "{} requests, {rate}: {:.2} req/s, {:.0} output tok/s",
                r.completed, r.request_throughput, r.output_throughput
            ),
            ("sans-serif", 22),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..4f64, 0f64..top * 1.15)
        .map_err(draw_err)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .y_desc("milliseconds")
        .draw()
        .map_err(draw_err)?;
    // Metric names under each group of bars, in pixels below the x axis.
    for (i, (name, _)) in metrics.iter().enumerate() {
        let (px, py) = chart.backend_coord(&(i as f64 + 0.45, 0.0));
        root.draw(&Text::new(*name, (px - 15, py + 10), ("sans-serif", 18)))
            .map_err(draw_err)?;
    }
    for (k, (name, get, color)) in stats.iter().enumerate() {
        let bars = metrics.iter().enumerate().map(|(i, (_, s))| {
            let x0 = i as f64 + 0.1 + 0.2 * k as f64;
            Rectangle::new([(x0, 0.0), (x0 + 0.18, get(s))], color.filled())
        });
        chart
            .draw_series(bars)
            .map_err(draw_err)?
            .label(*name)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperMiddle)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(draw_err)?;
    root.present().map_err(draw_err)
}

/// Several runs at different request rates: TTFT and TPOT (median and p99) against the rate, one
/// panel each. A run at rate inf is drawn at 1.25 x the largest finite rate.
pub fn rate_sweep_chart(results: &[ServeBenchResult], path: &Path) -> Result<(), String> {
    if results.is_empty() {
        return Err("nothing to plot: no results".into());
    }
    let max_rate = results
        .iter()
        .filter_map(|r| r.request_rate)
        .fold(0f64, f64::max);
    let inf_at = if max_rate > 0.0 { max_rate * 1.25 } else { 1.0 };
    let mut points: Vec<(f64, &ServeBenchResult)> = results
        .iter()
        .map(|r| (r.request_rate.unwrap_or(inf_at), r))
        .collect();
    points.sort_by(|a, b| a.0.total_cmp(&b.0));
    let x_max = points.last().map(|p| p.0).unwrap_or(1.0) * 1.05;
    let root = BitMapBackend::new(path, (1000, 800)).into_drawing_area();
    root.fill(&WHITE).map_err(draw_err)?;
    let panels = root.split_evenly((2, 1));
    let metrics: [Metric; 2] = [("TTFT", |r| &r.ttft), ("TPOT", |r| &r.tpot)];
    for (panel, (name, get)) in panels.iter().zip(metrics) {
        let top = points
            .iter()
            .map(|(_, r)| get(r).p99_ms)
            .fold(1e-3f64, f64::max);
        let mut chart = ChartBuilder::on(panel)
            .caption(
                format!("{name} (ms) against request rate (rightmost point: inf)"),
                ("sans-serif", 20),
            )
            .margin(15)
            .x_label_area_size(35)
            .y_label_area_size(70)
            .build_cartesian_2d(0f64..x_max, 0f64..top * 1.15)
            .map_err(draw_err)?;
        chart
            .configure_mesh()
            .x_desc("requests per second")
            .draw()
            .map_err(draw_err)?;
        let lines: [Stat; 2] = [
            ("median", |s| s.median_ms, BLUE),
            ("p99", |s| s.p99_ms, RED),
        ];
        for (label, stat, color) in lines {
            let series: Vec<(f64, f64)> = points.iter().map(|(x, r)| (*x, stat(get(r)))).collect();
            chart
                .draw_series(LineSeries::new(series.clone(), color.stroke_width(2)))
                .map_err(draw_err)?
                .label(label)
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 15, y)], color));
            chart
                .draw_series(
                    series
                        .into_iter()
                        .map(|p| Circle::new(p, 4, color.filled())),
                )
                .map_err(draw_err)?;
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(draw_err)?;
    }
    root.present().map_err(draw_err)
}
