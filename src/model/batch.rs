//! The tensors and metadata of one forward pass: all a model sees of a step. The runner builds
//! them from the scheduler's plan (`crate::runner::batch`); the model layer knows nothing of the
//! scheduler.

use std::ops::Range;

use candle_core::Tensor;

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
    /// With a window group (see `crate::kv::WindowConfig`): the sliding-window layers' slots and
    /// block tables.
    pub window: Option<WindowTables<'a>>,
    /// The same metadata as device tensors, for models on a GPU (built once per step).
    pub device: Option<DeviceAttentionMeta>,
}

/// The sliding-window layers' own slots and block tables (their cache has blocks of its own).
#[derive(Clone, Copy, Debug)]
pub struct WindowTables<'a> {
    /// Physical KV slot per token in those layers' cache.
    pub slot_mapping: &'a [u32],
    /// Concatenated block tables, at the same ranges as [`AttentionMeta::block_tables`].
    pub block_tables: &'a [u32],
}

impl<'a> AttentionMeta<'a> {
    /// The slot mapping and block tables a layer reads: the window group's for a sliding-window
    /// layer when the step has one, else the full layers'.
    pub fn tables(&self, windowed: bool) -> (&'a [u32], &'a [u32]) {
        match (&self.window, windowed) {
            (Some(w), true) => (w.slot_mapping, w.block_tables),
            _ => (self.slot_mapping, self.block_tables),
        }
    }
}

/// Paged-attention metadata on the model's device, one row per query token: the form the CUDA
/// kernels read. Row `r` attends over `context_lens[r]` = its position + 1 positions of the
/// sequence whose block table is `block_tables[row_seq[r]]`.
#[derive(Clone, Debug)]
pub struct DeviceAttentionMeta {
    /// Physical KV slot per token, `[tokens]` i64.
    pub slot_mapping: Tensor,
    /// Block tables padded with the null block, `[seqs, max_blocks]` i32.
    pub block_tables: Tensor,
    /// Each token's row in `block_tables`, `[tokens]` i32.
    pub row_seq: Tensor,
    /// Positions each token attends over, `[tokens]` i32.
    pub context_lens: Tensor,
    /// The largest entry of `context_lens`.
    pub max_context_len: usize,
    /// A fixed split-KV plan `(splits, chunk)` for the decode kernel (a CUDA graph's, captured
    /// once for every context up to `max_context_len`); `None` plans from `max_context_len`.
    pub split: Option<(usize, usize)>,
    /// The sequences computing more than one token (prefill chunks), for a tensor-core kernel.
    pub prefill: Option<PrefillMeta>,
    /// When prefill chunks and decode tokens share the step: just the decode rows.
    pub decode: Option<DecodeRows>,
    /// With a window group: the sliding-window layers' slot mapping (i64 `[tokens]`) and padded
    /// block tables (i32 `[seqs, max_blocks]`, the same shape as `block_tables`).
    pub window: Option<(Tensor, Tensor)>,
}

impl DeviceAttentionMeta {
    /// The slot mapping and block tables a layer reads: the window group's for a sliding-window
    /// layer when the step has one, else the full layers'.
    pub fn tables(&self, windowed: bool) -> (&Tensor, &Tensor) {
        match (&self.window, windowed) {
            (Some((slots, tables)), true) => (slots, tables),
            _ => (&self.slot_mapping, &self.block_tables),
        }
    }
}

/// Prefill sequences of a step, each i32 `[seqs]`.
#[derive(Clone, Debug)]
pub struct PrefillMeta {
    /// First token row of each sequence.
    pub q_start: Tensor,
    /// Its token rows.
    pub q_len: Tensor,
    /// Its tokens in the cache after this step.
    pub ctx_len: Tensor,
    /// Its row in the block tables.
    pub table_row: Tensor,
    /// The largest `q_len`.
    pub max_q_len: usize,
}

/// The decode tokens of a mixed step, one row each.
#[derive(Clone, Debug)]
pub struct DecodeRows {
    /// Their token rows, `[rows]` u32.
    pub index: Tensor,
    /// Their block table rows, `[rows]` i32.
    pub row_seq: Tensor,
    /// Positions each attends over, `[rows]` i32.
    pub context_lens: Tensor,
    /// The largest entry of `context_lens`.
    pub max_context_len: usize,
}

/// A packed (varlen) batch: tokens of all scheduled sequences back to back.
pub struct ForwardBatch<'a> {
    /// Input token ids, `[tokens]` u32.
    pub input_ids: Tensor,
    /// Position of each token, `[tokens]` u32.
    pub positions: Tensor,
    /// Paged-attention metadata.
    pub attention: AttentionMeta<'a>,
    /// Rows whose logits are needed (each sampling sequence's last token), `[rows]` u32. On a GPU
    /// a step where nothing samples gathers a placeholder row, its last token.
    pub sample_rows: Tensor,
    /// Number of sampled rows (0 with the placeholder).
    pub num_sample_rows: usize,
}

impl ForwardBatch<'_> {
    /// The rows of `x` (`[tokens, _]`) whose logits are needed: `x` itself when every row
    /// samples (a decode step: already in order, no gather), else the gathered `sample_rows`.
    pub fn sampled(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        if self.num_sample_rows == x.dim(0)? {
            Ok(x.clone())
        } else {
            x.index_select(&self.sample_rows, 0)
        }
    }
}
