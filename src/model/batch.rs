//! The tensors and metadata of one forward pass, built from a [`SchedulerOutput`].

use std::ops::Range;

use candle_core::{Device, Tensor};

use crate::scheduler::SchedulerOutput;

/// One sequence's slice of a packed batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeqSpan {
    /// First row of this sequence's tokens in the packed batch.
    pub query_start: usize,
    /// Tokens computed this step.
    pub query_len: usize,
    /// Tokens in the cache after this step (cached prefix + this step's tokens).
    pub context_len: usize,
    /// This sequence's block table in [`AttentionMeta::block_tables`].
    pub block_table: Range<usize>,
}

/// What paged attention needs: where to write this step's K/V and what each query may read.
#[derive(Clone, Debug)]
pub struct AttentionMeta<'a> {
    /// Physical KV slot per token.
    pub slot_mapping: &'a [u32],
    /// Concatenated block tables.
    pub block_tables: &'a [u32],
    /// Per-sequence spans.
    pub seqs: Vec<SeqSpan>,
}

/// A packed (varlen) batch: tokens of all scheduled sequences back to back.
pub struct ForwardBatch<'a> {
    /// Input token ids, `[tokens]` u32.
    pub input_ids: Tensor,
    /// Position of each token, `[tokens]` u32.
    pub positions: Tensor,
    /// Paged-attention metadata.
    pub attention: AttentionMeta<'a>,
    /// Rows whose logits are needed (each sampling sequence's last token), `[rows]` u32.
    pub sample_rows: Tensor,
    /// Number of sampled rows.
    pub num_sample_rows: usize,
}

impl<'a> ForwardBatch<'a> {
    /// The batch for a scheduled step.
    pub fn new(out: &'a SchedulerOutput, device: &Device) -> candle_core::Result<Self> {
        let n = out.num_batched_tokens();
        let seqs: Vec<SeqSpan> = out
            .seqs
            .iter()
            .map(|s| SeqSpan {
                query_start: s.tokens.start,
                query_len: s.num_new_tokens,
                context_len: s.num_computed_tokens + s.num_new_tokens,
                block_table: s.block_table.clone(),
            })
            .collect();
        let rows: Vec<u32> = out
            .seqs
            .iter()
            .filter(|s| s.samples)
            .map(|s| (s.tokens.end - 1) as u32)
            .collect();
        Ok(ForwardBatch {
            input_ids: Tensor::from_slice(&out.token_ids, n, device)?,
            positions: Tensor::from_slice(&out.positions, n, device)?,
            num_sample_rows: rows.len(),
            sample_rows: Tensor::from_vec(rows.clone(), rows.len(), device)?,
            attention: AttentionMeta {
                slot_mapping: &out.slot_mapping,
                block_tables: &out.block_tables,
                seqs,
            },
        })
    }
}
