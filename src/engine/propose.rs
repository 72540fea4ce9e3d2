//! The engine's speculation between steps: which proposer guesses, how many drafts the next
//! step verifies (the configured number, turned down by [`SpecTuner`] where it does not pay),
//! and each decoding sequence's guess.

use super::args::EngineError;
use crate::runner::draft::DraftRunner;
use crate::runner::eagle::{EagleRunner, TargetStep};
use crate::scheduler::Scheduler;
use crate::spec::tuner::SpecTuner;
use crate::spec::{MAX_SPECULATIVE_TOKENS, Proposer, Speculation};

/// Speculative decoding as the engine runs it.
pub(super) struct Speculator {
    spec: Speculation,
    drafter: Drafter,
    /// `None` when the configuration pins the draft length.
    tuner: Option<SpecTuner>,
}

/// The model behind a proposer, if any.
enum Drafter {
    None,
    Model(Box<DraftRunner>),
    Eagle(Box<EagleRunner>),
}

impl Speculator {
    /// `spec` with its draft model or EAGLE-3 head (rank 0's), if it has one.
    pub fn new(spec: Speculation, draft: Option<DraftRunner>, eagle: Option<EagleRunner>) -> Self {
        let drafter = match (draft, eagle) {
            (Some(d), _) => Drafter::Model(Box::new(d)),
            (None, Some(e)) => Drafter::Eagle(Box::new(e)),
            (None, None) => Drafter::None,
        };
        Speculator {
            tuner: spec
                .adaptive
                .then(|| SpecTuner::new(spec.num_speculative_tokens)),
            spec,
            drafter,
        }
    }

    /// The checked configuration.
    pub fn speculation(&self) -> &Speculation {
        &self.spec
    }

    /// Whether a model guesses (its passes are the step's draft phase).
    pub fn has_model(&self) -> bool {
        !matches!(self.drafter, Drafter::None)
    }

    /// The draft model's (or head's) KV blocks: free, and all of them.
    pub fn block_usage(&self) -> Option<(usize, usize)> {
        match &self.drafter {
            Drafter::Model(d) => Some(d.block_usage()),
            Drafter::Eagle(e) => Some(e.block_usage()),
            Drafter::None => None,
        }
    }

    /// A target step of `tokens` tokens took `seconds`.
    pub fn record_step(&mut self, tokens: usize, seconds: f64) {
        if let Some(t) = self.tuner.as_mut() {
            t.record_step(tokens, seconds);
        }
    }

    /// A sequence verified `drafted` drafts, of which the first `accepted` held.
    pub fn record_verify(&mut self, drafted: usize, accepted: usize) {
        if let Some(t) = self.tuner.as_mut() {
            t.record_verify(drafted, accepted);
        }
    }

    /// Gives each decoding sequence its proposer's draft for the next step (none while more
    /// sequences run than `disable_by_batch_size`), never past its `max_tokens` or the context.
    /// `step` is the target step just run, for an EAGLE-3 head.
    pub fn propose(
        &mut self,
        scheduler: &mut Scheduler,
        step: Option<TargetStep<'_>>,
    ) -> Result<(), EngineError> {
        let spec = &self.spec;
        let max_model_len = scheduler.config().max_model_len;
        let running = scheduler.running_mut();
        let off = spec
            .disable_by_batch_size
            .is_some_and(|n| running.len() > n);
        let decoding = running
            .iter()
            .filter(|s| s.num_pending_tokens() == 1)
            .count();
        let k = match (off, self.tuner.as_mut()) {
            (true, _) => 0,
            (false, Some(t)) => t.choose(decoding),
            (false, None) => spec.num_speculative_tokens,
        };
        // How many tokens each sequence may be guessed: the target adds a token of its own
        // after the accepted drafts.
        let limits: Vec<usize> = running
            .iter()
            .map(|seq| {
                if seq.num_pending_tokens() != 1 {
                    return 0;
                }
                let left = (seq
                    .params
                    .max_tokens
                    .saturating_sub(seq.num_output_tokens()))
                .min(max_model_len.saturating_sub(seq.num_tokens()));
                left.saturating_sub(1).min(k)
            })
            .collect();
        let started = std::time::Instant::now();
        match (&spec.proposer, &mut self.drafter) {
            (Proposer::DraftModel(_), Drafter::Model(draft)) => {
                draft.propose(running, &limits, k > 0)?
            }
            (Proposer::Eagle3(_), Drafter::Eagle(head)) => head.propose(running, &limits, step)?,
            (Proposer::Ngram(ngram), _) => {
                let mut guess = Vec::with_capacity(MAX_SPECULATIVE_TOKENS);
                for (seq, &limit) in running.iter_mut().zip(&limits) {
                    guess.clear();
                    if limit > 0 {
                        ngram.propose(seq.token_ids(), limit, &mut guess);
                    }
                    seq.set_spec_tokens(&guess);
                }
            }
            (Proposer::DraftModel(_) | Proposer::Eagle3(_), _) => {}
        }
        if let Some(t) = self.tuner.as_mut()
            && limits.iter().any(|&l| l > 0)
        {
            t.record_draft(k, started.elapsed().as_secs_f64());
        }
        Ok(())
    }
}
