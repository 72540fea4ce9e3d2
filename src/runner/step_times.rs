//! Where an engine step's time goes: schedule, prepare (inputs to the device), forward (launched,
//! then waited for on a GPU), sample, update (scheduler bookkeeping), text (detokenize + stop
//! strings of the previous step, during the forward pass) and guide (constrained rows' token
//! masks, also during the forward pass). The engine accumulates them;
//! `pagewise bench` reports the mean per step.

use std::time::{Duration, Instant};

use serde::Serialize;

/// One phase of a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// The scheduler builds the step.
    Schedule,
    /// The step's inputs are built and copied to the device.
    Prepare,
    /// The model runs: the launch, and the wait for the GPU that the text phase (running
    /// meanwhile) did not cover.
    Forward,
    /// Tokens are picked.
    Sample,
    /// The scheduler appends tokens, finishes and frees.
    Update,
    /// Detokenization and stop strings of the previous step's tokens, run while this step's
    /// forward pass is on the GPU.
    Text,
    /// The token masks of constrained rows (`crate::guided`), computed while the forward pass
    /// is on the GPU (on the CPU, within sampling).
    Guide,
    /// A draft model guesses the next step's tokens (speculative decoding).
    Draft,
}

impl Phase {
    /// Every phase in accounting order, with its name (the `phase` label on /metrics).
    pub const ALL: [(Phase, &'static str); Phase::COUNT] = [
        (Phase::Schedule, "schedule"),
        (Phase::Prepare, "prepare"),
        (Phase::Forward, "forward"),
        (Phase::Sample, "sample"),
        (Phase::Update, "update"),
        (Phase::Text, "text"),
        (Phase::Guide, "guide"),
        (Phase::Draft, "draft"),
    ];

    /// How many phases there are.
    pub const COUNT: usize = 8;
}

/// Accumulated step time since the last reset.
#[derive(Clone, Debug, Default)]
pub struct StepTimes {
    steps: u64,
    graph_steps: u64,
    phases: [Duration; Phase::COUNT],
    /// The forward phase of graph-replay steps (also in `phases`).
    graph_forward: Duration,
    /// Whether the step under way replays a graph.
    in_graph_step: bool,
}

impl StepTimes {
    /// Adds the time since `since` to `phase`; returns now, the start of the next phase.
    pub fn lap(&mut self, phase: Phase, since: Instant) -> Instant {
        let now = Instant::now();
        self.phases[phase as usize] += now - since;
        if phase == Phase::Forward && self.in_graph_step {
            self.graph_forward += now - since;
        }
        now
    }

    /// Counts one finished step.
    pub fn end_step(&mut self) {
        self.steps += 1;
        self.in_graph_step = false;
    }

    /// Counts the step under way as one whose forward pass replays a CUDA graph.
    pub fn count_graph_step(&mut self) {
        self.graph_steps += 1;
        self.in_graph_step = true;
    }

    /// Steps counted.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Steps counted whose forward pass replayed a CUDA graph.
    pub fn graph_steps(&self) -> u64 {
        self.graph_steps
    }

    /// Time spent in `phase` so far.
    pub fn total(&self, phase: Phase) -> Duration {
        self.phases[phase as usize]
    }

    /// Forward time of the graph-replay steps so far.
    pub fn graph_forward(&self) -> Duration {
        self.graph_forward
    }

    /// Mean milliseconds per step of each phase.
    pub fn per_step(&self) -> StepBreakdown {
        StepBreakdown::from_totals(
            self.steps,
            self.graph_steps,
            self.phases.map(|d| d.as_secs_f64()),
            self.graph_forward.as_secs_f64(),
        )
    }
}

/// Mean time per step of each phase, in milliseconds.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct StepBreakdown {
    /// Steps measured.
    pub steps: u64,
    /// Of those, steps whose forward pass replayed a CUDA graph.
    pub graph_steps: u64,
    /// Scheduling.
    pub schedule_ms: f64,
    /// Building inputs and copying them to the device.
    pub prepare_ms: f64,
    /// The model's forward pass.
    pub forward_ms: f64,
    /// Sampling.
    pub sample_ms: f64,
    /// Scheduler update.
    pub update_ms: f64,
    /// Detokenization and stop strings.
    pub text_ms: f64,
    /// Token masks of constrained rows.
    #[serde(default)]
    pub guide_ms: f64,
    /// A draft model's guesses (speculative decoding).
    #[serde(default)]
    pub draft_ms: f64,
    /// The forward phase of a graph-replay step (decode only), on average.
    #[serde(default)]
    pub graph_forward_ms: f64,
    /// The forward phase of an eager step (prefill chunks, or past the graphs), on average.
    #[serde(default)]
    pub eager_forward_ms: f64,
}

impl StepBreakdown {
    /// The means of `steps` steps that spent `seconds` in each phase (in [`Phase::ALL`] order),
    /// `graph_steps` of them replaying graphs with `graph_forward_s` of forward time.
    pub fn from_totals(
        steps: u64,
        graph_steps: u64,
        seconds: [f64; Phase::COUNT],
        graph_forward_s: f64,
    ) -> Self {
        let ms = |p: Phase| seconds[p as usize] * 1e3 / steps.max(1) as f64;
        let eager_steps = steps.saturating_sub(graph_steps);
        let eager_forward_s = (seconds[Phase::Forward as usize] - graph_forward_s).max(0.0);
        StepBreakdown {
            steps,
            graph_steps,
            schedule_ms: ms(Phase::Schedule),
            prepare_ms: ms(Phase::Prepare),
            forward_ms: ms(Phase::Forward),
            sample_ms: ms(Phase::Sample),
            update_ms: ms(Phase::Update),
            text_ms: ms(Phase::Text),
            guide_ms: ms(Phase::Guide),
            draft_ms: ms(Phase::Draft),
            graph_forward_ms: graph_forward_s * 1e3 / graph_steps.max(1) as f64,
            eager_forward_ms: eager_forward_s * 1e3 / eager_steps.max(1) as f64,
        }
    }

    /// All phases together.
    pub fn total_ms(&self) -> f64 {
        self.schedule_ms
            + self.prepare_ms
            + self.forward_ms
            + self.sample_ms
            + self.update_ms
            + self.text_ms
            + self.guide_ms
            + self.draft_ms
    }

    /// One line for a terminal.
    pub fn row(&self) -> String {
        format!(
            "per step over {} steps ({} CUDA graph replays) (ms): schedule {:.3}, prepare {:.3}, \
             forward {:.3} (graph replays {:.3}, eager steps {:.3}), sample {:.3}, update {:.3}, \
             text {:.3}, guide {:.3}, draft {:.3}; total {:.3}",
            self.steps,
            self.graph_steps,
            self.schedule_ms,
            self.prepare_ms,
            self.forward_ms,
            self.graph_forward_ms,
            self.eager_forward_ms,
            self.sample_ms,
            self.update_ms,
            self.text_ms,
            self.guide_ms,
            self.draft_ms,
            self.total_ms()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn graph_replays_forward_time_is_kept_apart() {
        let ago = |ms: u64| Instant::now() - Duration::from_millis(ms);
        let mut t = StepTimes::default();
        t.count_graph_step();
        t.lap(Phase::Forward, ago(5));
        t.end_step();
        t.lap(Phase::Forward, ago(20));
        t.end_step();
        let graph = t.graph_forward();
        assert!(graph >= Duration::from_millis(5) && graph < Duration::from_millis(20));
        let b = t.per_step();
        assert_eq!((b.steps, b.graph_steps), (2, 1));
        assert!(
            b.graph_forward_ms >= 5.0 && b.graph_forward_ms < 20.0,
            "{b:?}"
        );
        assert!(b.eager_forward_ms >= 20.0, "{b:?}");
        assert!((b.forward_ms * 2.0 - b.graph_forward_ms - b.eager_forward_ms).abs() < 1e-6);
    }
}
