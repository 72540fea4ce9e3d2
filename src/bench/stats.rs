//! Summaries of latency samples: mean, median, p90, p99 (nearest-rank), in milliseconds.

use serde::Serialize;

/// Mean and percentiles of one metric, in milliseconds.
#[derive(Clone, Debug, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct Summary {
    /// Arithmetic mean.
    pub mean_ms: f64,
    /// 50th percentile.
    pub median_ms: f64,
    /// 90th percentile.
    pub p90_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
}

/// The nearest-rank percentile `p` (0..=100) of sorted `v`.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

impl Summary {
    /// Summarizes samples given in seconds.
    pub fn of_seconds(samples: &[f64]) -> Self {
        let mut v: Vec<f64> = samples.iter().map(|s| s * 1e3).collect();
        v.sort_by(f64::total_cmp);
        let mean = if v.is_empty() {
            0.0
        } else {
            v.iter().sum::<f64>() / v.len() as f64
        };
        Summary {
            mean_ms: mean,
            median_ms: percentile(&v, 50.0),
            p90_ms: percentile(&v, 90.0),
            p99_ms: percentile(&v, 99.0),
        }
    }

    /// One table row: `name  mean  median  p90  p99`.
    pub fn row(&self, name: &str) -> String {
        format!(
            "{name:<6} {:>10.2} {:>10.2} {:>10.2} {:>10.2}",
            self.mean_ms, self.median_ms, self.p90_ms, self.p99_ms
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let s: Vec<f64> = (1..=100).map(|i| i as f64 / 1000.0).collect();
        let sum = Summary::of_seconds(&s);
        assert_eq!(sum.median_ms, 50.0);
        assert_eq!(sum.p90_ms, 90.0);
        assert_eq!(sum.p99_ms, 99.0);
        assert!((sum.mean_ms - 50.5).abs() < 1e-9);
        assert_eq!(Summary::of_seconds(&[]), Summary::default());
    }
}
