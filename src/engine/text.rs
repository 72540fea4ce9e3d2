//! The text phase of a step: each sequence's new token is detokenized incrementally and checked
//! against its stop strings. Sequences are independent, so a step with many of them spreads the
//! work over rayon's thread pool (the engine thread only waits for the slowest share).

use std::time::Instant;

use rayon::prelude::*;
use tokenizers::Tokenizer;

use super::detokenizer::{DetokenizeError, IncrementalDetokenizer};
use super::stop::StopMatcher;

/// Below this many sequences a step's text work stays on the engine thread (handing it to the
/// pool costs more than it saves).
const PARALLEL_FROM: usize = 64;

/// Per-sequence text state.
pub(super) struct TextState {
    pub detokenizer: IncrementalDetokenizer,
    pub stop: StopMatcher,
    pub arrival: Instant,
    pub scheduled: bool,
}

/// One sequence's share of the phase: its state (taken out of the engine's map while the phase
/// runs), the token it appended and whether the scheduler already finished it.
pub(super) struct TextJob {
    pub state: TextState,
    pub token: u32,
    pub finished: bool,
    /// Text made final by this token.
    pub text: String,
    /// A stop string matched.
    pub stopped: bool,
}

impl TextJob {
    fn run(&mut self, tokenizer: &Tokenizer) -> Result<(), DetokenizeError> {
        let delta = self.state.detokenizer.step(tokenizer, self.token)?;
        let pushed = self.state.stop.push(&delta);
        self.text = pushed.text;
        self.stopped = pushed.stopped_on.is_some();
        if !self.stopped && self.finished {
            // The last token: release what the detokenizer and the stop matcher held back.
            let tail = self.state.detokenizer.flush(tokenizer)?;
            self.text.push_str(&self.state.stop.push(&tail).text);
            self.text.push_str(&self.state.stop.flush());
        }
        Ok(())
    }
}

/// Runs every job: in parallel from [`PARALLEL_FROM`] jobs, else in order on this thread.
pub(super) fn run_all(tokenizer: &Tokenizer, jobs: &mut [TextJob]) -> Result<(), DetokenizeError> {
    if jobs.len() >= PARALLEL_FROM {
        jobs.par_iter_mut().try_for_each(|j| j.run(tokenizer))
    } else {
        jobs.iter_mut().try_for_each(|j| j.run(tokenizer))
    }
}
