//! Lock-free counters and histograms, rendered in the Prometheus text format under vLLM's metric
//! names (so dashboards and routers built for vLLM work unchanged).

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Latency bucket bounds in seconds (vLLM-like spread from 1 ms to 80 s).
const BUCKETS: [f64; 20] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 60.0, 80.0,
];

/// A histogram of durations with fixed buckets; `observe` is two atomic adds.
#[derive(Debug, Default)]
pub struct Histogram {
    counts: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl Histogram {
    /// Records one observation.
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        if let Some(i) = BUCKETS.iter().position(|&b| secs <= b) {
            self.counts[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_micros
            .fetch_add(d.as_micros() as u64, Ordering::Relaxed);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Appends this histogram as `name` with `labels` (e.g. `model_name="x"`).
    pub fn render(&self, out: &mut String, name: &str, help: &str, labels: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        self.render_series(out, name, labels);
    }

    /// Appends the histogram's buckets, sum and count with `labels`, without the HELP/TYPE
    /// header (one series of a family with several).
    pub fn render_series(&self, out: &mut String, name: &str, labels: &str) {
        let mut cumulative = 0;
        for (bound, c) in BUCKETS.iter().zip(&self.counts) {
            cumulative += c.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{bound}\"}} {cumulative}");
        }
        let count = self.count();
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {count}");
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(
            out,
            "{name}_sum{{{labels}}} {sum}\n{name}_count{{{labels}}} {count}"
        );
    }
}

/// Appends one counter or gauge sample with its HELP/TYPE header.
pub fn render_sample(
    out: &mut String,
    name: &str,
    kind: &str,
    help: &str,
    labels: &str,
    value: f64,
) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} {kind}\n{name}{{{labels}}} {value}"
    );
}

/// Appends one counter or gauge family: its HELP/TYPE header and a sample for each of
/// `samples`' (labels, value).
pub fn render_samples(
    out: &mut String,
    name: &str,
    kind: &str,
    help: &str,
    samples: impl IntoIterator<Item = (String, f64)>,
) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    for (labels, value) in samples {
        let _ = writeln!(out, "{name}{{{labels}}} {value}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_renders_cumulative_buckets() {
        let h = Histogram::default();
        h.observe(Duration::from_millis(3));
        h.observe(Duration::from_millis(30));
        h.observe(Duration::from_secs(100));
        let mut out = String::new();
        h.render(&mut out, "x_seconds", "test", "m=\"a\"");
        assert!(out.contains("x_seconds_bucket{m=\"a\",le=\"0.005\"} 1\n"));
        assert!(out.contains("x_seconds_bucket{m=\"a\",le=\"0.04\"} 2\n"));
        assert!(out.contains("x_seconds_bucket{m=\"a\",le=\"80\"} 2\n"));
        assert!(out.contains("x_seconds_bucket{m=\"a\",le=\"+Inf\"} 3\n"));
        assert!(out.contains("x_seconds_count{m=\"a\"} 3\n"));
        assert!(out.contains("x_seconds_sum{m=\"a\"} 100.033\n"));
    }
}
