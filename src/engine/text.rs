//! The text phase of a step: each sequence's new token is detokenized incrementally and checked
//! against its stop strings. It runs one step late, while the next step's forward pass is on the
//! GPU ([`crate::runner::ModelRunner::execute`]'s `overlap`), so it leaves no gap between forward
//! passes; a sequence that a stop string ends has then already been scheduled for one more token,
//! which is dropped. Sequences are independent, so a step with many of them spreads the work over
//! rayon's thread pool (the engine thread only waits for the slowest share).

use std::time::Instant;

use rayon::prelude::*;
use tokenizers::Tokenizer;

use super::core::SeqEvent;
use super::detokenizer::{DetokenizeError, IncrementalDetokenizer};
use super::stop::StopMatcher;
use crate::request::FinishReason;
use crate::sampler::Logprobs;
use crate::sequence::{SeqId, SeqMap};

/// Below this many sequences a step's text work stays on the engine thread (handing it to the
/// pool costs more than it saves).
const PARALLEL_FROM: usize = 64;

/// Per-sequence text state.
pub(super) struct TextState {
    pub detokenizer: IncrementalDetokenizer,
    pub stop: StopMatcher,
    pub arrival: Instant,
    pub scheduled: bool,
    /// A deliberate failure of this sequence's text phase (tests of the failure paths).
    #[cfg(feature = "fault-injection")]
    pub fail: bool,
}

/// One sequence's share of the phase: its state (taken out of the engine's map until the phase
/// runs), the tokens it appended this step (one, or several when drafts were accepted), with
/// their logprobs, and whether the scheduler finished it.
pub(super) struct TextJob {
    pub state: TextState,
    pub seq_id: SeqId,
    pub tokens: Vec<(u32, Option<Logprobs>)>,
    pub finish: Option<FinishReason>,
    /// Text made final by each token run so far (the tokens after a stop string never run).
    texts: Vec<String>,
    /// The stop string that matched (at the last token run), if one did.
    pub stopped_on: Option<String>,
    /// This sequence failed (its text phase, or its constraint before it): it ends with this
    /// error, the others go on.
    pub error: Option<String>,
    /// The prompt's logprobs, on the sequence's first job when asked for.
    pub prompt_logprobs: Option<Vec<Logprobs>>,
}

impl TextJob {
    /// The job of the tokens that `seq_id` just appended (at least one).
    pub fn new(
        state: TextState,
        seq_id: SeqId,
        tokens: Vec<(u32, Option<Logprobs>)>,
        finish: Option<FinishReason>,
    ) -> Self {
        debug_assert!(!tokens.is_empty());
        TextJob {
            state,
            seq_id,
            tokens,
            finish,
            texts: Vec::new(),
            stopped_on: None,
            error: None,
            prompt_logprobs: None,
        }
    }

    /// Runs this sequence's share, keeping a failure with the sequence.
    fn run_or_record(&mut self, tokenizer: &Tokenizer) {
        if self.error.is_some() {
            return;
        }
        if let Err(e) = self.run(tokenizer) {
            self.error = Some(e.to_string());
        }
    }

    fn run(&mut self, tokenizer: &Tokenizer) -> Result<(), DetokenizeError> {
        #[cfg(feature = "fault-injection")]
        if self.state.fail {
            return Err(DetokenizeError("injected fault".into()));
        }
        for &(token, _) in &self.tokens {
            let delta = self.state.detokenizer.step(tokenizer, token)?;
            let pushed = self.state.stop.push(&delta);
            self.texts.push(pushed.text);
            if pushed.stopped_on.is_some() {
                self.stopped_on = pushed.stopped_on;
                return Ok(());
            }
        }
        if self.finish.is_some() {
            // The last token: release what the detokenizer and the stop matcher held back.
            let tail = self.state.detokenizer.flush(tokenizer)?;
            let last = self.texts.last_mut().expect("at least one token");
            last.push_str(&self.state.stop.push(&tail).text);
            last.push_str(&self.state.stop.flush());
        }
        Ok(())
    }

    /// The last token taken.
    fn last_token(&self) -> u32 {
        self.tokens.last().expect("at least one token").0
    }
}

/// Runs every job: in parallel from [`PARALLEL_FROM`] jobs, else in order on this thread. A
/// job's failure stays with its job.
pub(super) fn run_all(tokenizer: &Tokenizer, jobs: &mut [TextJob]) {
    if jobs.len() >= PARALLEL_FROM {
        jobs.par_iter_mut().for_each(|j| j.run_or_record(tokenizer));
    } else {
        jobs.iter_mut().for_each(|j| j.run_or_record(tokenizer));
    }
}

/// Runs the text phase of `jobs` (emptying it): each sequence's event goes to `sink`, the state of
/// a sequence that goes on returns to `states`. A sequence whose text phase failed gets one last
/// event carrying the error (finish `Abort`). Returns the sequences that a stop string or an error
/// ended, with their reason, which the scheduler may still hold.
pub(super) fn finish_jobs(
    tokenizer: &Tokenizer,
    jobs: &mut Vec<TextJob>,
    states: &mut SeqMap<TextState>,
    sink: &mut dyn FnMut(SeqEvent),
) -> Vec<(SeqId, FinishReason)> {
    run_all(tokenizer, jobs);
    let mut ended = Vec::new();
    // (Drained, not taken: the vector keeps its capacity for the next step.)
    for job in jobs.drain(..) {
        if let Some(e) = job.error.clone() {
            tracing::warn!(seq = ?job.seq_id, "ending one sequence: {e}");
            if job.finish.is_none() {
                ended.push((job.seq_id, FinishReason::Abort));
            }
            sink(SeqEvent {
                seq_id: job.seq_id,
                token_id: job.last_token(),
                text: String::new(),
                logprobs: None,
                finish: Some(FinishReason::Abort),
                stopped_on: None,
                error: Some(e),
                prompt_logprobs: None,
            });
            continue;
        }
        let mut finish = job.finish;
        if job.stopped_on.is_some() {
            if finish.is_none() {
                ended.push((job.seq_id, FinishReason::Stop));
            }
            finish = Some(FinishReason::Stop);
        }
        if finish.is_none() {
            states.insert(job.seq_id, job.state);
        }
        // One event per token run; the last carries the finish.
        let n = job.texts.len();
        let (mut stopped_on, mut prompt_logprobs) = (job.stopped_on, job.prompt_logprobs);
        for (i, ((token_id, logprobs), text)) in job.tokens.into_iter().zip(job.texts).enumerate() {
            let last = i + 1 == n;
            sink(SeqEvent {
                seq_id: job.seq_id,
                token_id,
                text,
                logprobs,
                finish: if last { finish } else { None },
                stopped_on: if last { stopped_on.take() } else { None },
                error: None,
                prompt_logprobs: prompt_logprobs.take(),
            });
        }
    }
    ended
}
