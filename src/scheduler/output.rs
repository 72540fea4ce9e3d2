//! What one step computes, as plain data (no tensors): the model runner turns it into a forward batch.

use std::ops::Range;

use crate::request::FinishReason;
use crate::sequence::SeqId;

/// One sequence's share of a step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScheduledSeq {
    /// Which sequence.
    pub seq_id: SeqId,
    /// Tokens already in the KV cache before this step (the context this step's tokens attend over).
    pub num_computed_tokens: usize,
    /// Tokens computed this step: 1 for a decode, more for a prefill chunk or a verify step.
    pub num_new_tokens: usize,
    /// Of those, the last ones are draft tokens to verify (speculative decoding): the sequence
    /// samples `1 + num_draft_tokens` rows, its last ones.
    pub num_draft_tokens: usize,
    /// Where this sequence's tokens sit in [`SchedulerOutput::token_ids`], `positions` and
    /// `slot_mapping`.
    pub tokens: Range<usize>,
    /// Where this sequence's block table sits in [`SchedulerOutput::block_tables`].
    pub block_table: Range<usize>,
    /// Whether this step reaches the end of the sequence's tokens, so its last row is sampled.
    pub samples: bool,
    /// Leading rows whose logits give prompt logprobs (`SamplingParams::prompt_logprobs`): their
    /// next token is a prompt token.
    pub num_prompt_rows: usize,
}

/// A step: which sequences compute which tokens, and where their KV goes.
#[derive(Clone, Debug, Default)]
pub struct SchedulerOutput {
    /// Scheduled sequences, in the order of the scheduler's running queue.
    pub seqs: Vec<ScheduledSeq>,
    /// Input token ids of every scheduled token, sequence after sequence.
    pub token_ids: Vec<u32>,
    /// Position of each scheduled token in its sequence.
    pub positions: Vec<u32>,
    /// Physical KV slot each scheduled token's K/V is written to.
    pub slot_mapping: Vec<u32>,
    /// Block tables of the scheduled sequences, concatenated (block ids as u32).
    pub block_tables: Vec<u32>,
    /// With a window group: the slot in the sliding-window layers' cache of each scheduled token.
    pub window_slot_mapping: Vec<u32>,
    /// With a window group: the sliding-window layers' block tables, laid out as `block_tables`
    /// (the same ranges; the null block where a block fell out of the window).
    pub window_block_tables: Vec<u32>,
    /// Sequences preempted (blocks freed, back to waiting) while building this step.
    pub preempted: Vec<SeqId>,
}

impl SchedulerOutput {
    /// Tokens computed this step.
    pub fn num_batched_tokens(&self) -> usize {
        self.token_ids.len()
    }

    /// Sequences that sample a token this step.
    pub fn num_sampling(&self) -> usize {
        self.seqs.iter().filter(|s| s.samples).count()
    }

    /// Rows whose logits are sampled: one per sampling sequence, plus one per draft token.
    pub fn num_sample_rows(&self) -> usize {
        self.seqs
            .iter()
            .filter(|s| s.samples)
            .map(|s| 1 + s.num_draft_tokens)
            .sum()
    }

    /// Rows whose logits give prompt logprobs.
    pub fn num_prompt_rows(&self) -> usize {
        self.seqs.iter().map(|s| s.num_prompt_rows).sum()
    }

    /// Draft tokens to verify this step.
    pub fn num_draft_tokens(&self) -> usize {
        self.seqs.iter().map(|s| s.num_draft_tokens).sum()
    }

    /// Whether the step carries a window group's slots and tables.
    pub fn has_window(&self) -> bool {
        !self.window_block_tables.is_empty()
    }

    /// Whether nothing is scheduled.
    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty()
    }

    pub(crate) fn clear(&mut self) {
        self.seqs.clear();
        self.token_ids.clear();
        self.positions.clear();
        self.slot_mapping.clear();
        self.block_tables.clear();
        self.window_slot_mapping.clear();
        self.window_block_tables.clear();
        self.preempted.clear();
    }
}

/// What happened to one sampling sequence in `update`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeqUpdate {
    /// Which sequence.
    pub seq_id: SeqId,
    /// The last token appended.
    pub token_id: u32,
    /// Tokens appended before `token_id` this step: draft tokens the target model accepted.
    pub num_accepted: usize,
    /// Set when this token ended the sequence (its blocks are already freed).
    pub finish: Option<FinishReason>,
    /// Why the sequence failed, when it ended with `Abort` here (its constraint broke).
    pub error: Option<String>,
}
