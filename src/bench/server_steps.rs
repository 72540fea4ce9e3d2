//! The engine-step counters a pagewise server publishes on /metrics
//! (`pagewise:engine_steps_total`, `pagewise:engine_step_phase_seconds_total{phase=...}`), read
//! before and after a serving run so the report says where the server's steps spent their time.
//! Other servers do not publish them; the report then leaves the breakdown out.

use crate::runner::step_times::{Phase, StepBreakdown};

/// Counter values at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepCounters {
    /// Engine steps run.
    pub steps: u64,
    /// Of those, CUDA-graph replays.
    pub graph_steps: u64,
    /// Seconds per phase, in [`Phase::ALL`] order.
    pub seconds: [f64; Phase::COUNT],
    /// Forward seconds of the CUDA-graph replays.
    pub graph_forward_seconds: f64,
}

impl StepCounters {
    /// The counters in a Prometheus text page, summed over its engine replicas, or `None` when
    /// it has no `engine_steps_total`.
    pub fn parse(text: &str) -> Option<Self> {
        let mut c = StepCounters::default();
        let mut seen = false;
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let Some((series, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let Ok(value) = value.parse::<f64>() else {
                continue;
            };
            let name = series.split('{').next().unwrap_or(series);
            match name {
                "pagewise:engine_steps_total" => {
                    c.steps += value as u64;
                    seen = true;
                }
                "pagewise:engine_cuda_graph_steps_total" => c.graph_steps += value as u64,
                "pagewise:engine_cuda_graph_forward_seconds_total" => {
                    c.graph_forward_seconds += value
                }
                "pagewise:engine_step_phase_seconds_total" => {
                    for (i, (_, phase)) in Phase::ALL.iter().enumerate() {
                        if series.contains(&format!("phase=\"{phase}\"")) {
                            c.seconds[i] += value;
                        }
                    }
                }
                _ => {}
            }
        }
        seen.then_some(c)
    }

    /// Mean time per step of each phase between `before` and `self`; `None` without steps.
    pub fn since(&self, before: &StepCounters) -> Option<StepBreakdown> {
        let steps = self.steps.checked_sub(before.steps).filter(|&n| n > 0)?;
        let mut seconds = [0.0; Phase::COUNT];
        for (i, s) in seconds.iter_mut().enumerate() {
            *s = (self.seconds[i] - before.seconds[i]).max(0.0);
        }
        Some(StepBreakdown::from_totals(
            steps,
            self.graph_steps.saturating_sub(before.graph_steps),
            seconds,
            (self.graph_forward_seconds - before.graph_forward_seconds).max(0.0),
        ))
    }
}

/// The server's counters at `base_url`/metrics, if it publishes them.
pub async fn scrape(client: &reqwest::Client, base_url: &str) -> Option<StepCounters> {
    let url = format!("{}/metrics", base_url.trim_end_matches('/'));
    let text = client.get(url).send().await.ok()?.text().await.ok()?;
    StepCounters::parse(&text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_parse_and_difference_into_means_per_step() {
        let page = |steps: u64, schedule: f64, forward: f64| {
            format!(
                "# HELP pagewise:engine_steps_total Engine steps run.\n\
                 pagewise:engine_steps_total{{model_name=\"m\"}} {steps}\n\
                 pagewise:engine_cuda_graph_steps_total{{model_name=\"m\"}} {}\n\
                 pagewise:engine_cuda_graph_forward_seconds_total{{model_name=\"m\"}} {}\n\
                 pagewise:engine_step_phase_seconds_total{{model_name=\"m\",phase=\"schedule\"}} {schedule}\n\
                 pagewise:engine_step_phase_seconds_total{{model_name=\"m\",phase=\"forward\"}} {forward}\n\
                 vllm:num_requests_running{{model_name=\"m\"}} 2\n",
                steps / 2,
                forward / 5.0,
            )
        };
        let before = StepCounters::parse(&page(10, 0.001, 0.5)).unwrap();
        assert_eq!(before.steps, 10);
        assert_eq!(before.seconds[Phase::Forward as usize], 0.5);
        let after = StepCounters::parse(&page(20, 0.003, 1.5)).unwrap();
        let b = after.since(&before).unwrap();
        assert_eq!(b.steps, 10);
        assert!((b.schedule_ms - 0.2).abs() < 1e-9 && (b.forward_ms - 100.0).abs() < 1e-9);
        // 5 graph steps of 0.2 s forward, 5 eager ones of 0.8 s.
        assert_eq!(b.graph_steps, 5);
        assert!((b.graph_forward_ms - 40.0).abs() < 1e-9, "{b:?}");
        assert!((b.eager_forward_ms - 160.0).abs() < 1e-9, "{b:?}");
        assert_eq!(after.since(&after), None, "no steps in between");
        assert_eq!(StepCounters::parse("vllm:num_requests_running 1\n"), None);
        // Data-parallel replicas' samples add up.
        let two = "pagewise:engine_steps_total{engine=\"0\"} 3\n\
                   pagewise:engine_steps_total{engine=\"1\"} 4\n";
        assert_eq!(StepCounters::parse(two).unwrap().steps, 7);
    }
}
