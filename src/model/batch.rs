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
    /// The same metadata as device tensors, for models on a GPU (built once per step).
    pub device: Option<DeviceAttentionMeta>,
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

impl PrefillMeta {
    fn new(out: &SchedulerOutput, device: &Device) -> candle_core::Result<Option<Self>> {
        let seqs: Vec<(usize, &crate::scheduler::ScheduledSeq)> = out
            .seqs
            .iter()
            .enumerate()
            .filter(|(_, s)| s.num_new_tokens > 1)
            .collect();
        if seqs.is_empty() {
            return Ok(None);
        }
        let n = seqs.len();
        let col = |f: &dyn Fn(usize, &crate::scheduler::ScheduledSeq) -> usize| {
            let v: Vec<i32> = seqs.iter().map(|&(i, s)| f(i, s) as i32).collect();
            Tensor::from_vec(v, n, device)
        };
        Ok(Some(PrefillMeta {
            q_start: col(&|_, s| s.tokens.start)?,
            q_len: col(&|_, s| s.num_new_tokens)?,
            ctx_len: col(&|_, s| s.num_computed_tokens + s.num_new_tokens)?,
            table_row: col(&|i, _| i)?,
            max_q_len: seqs
                .iter()
                .map(|(_, s)| s.num_new_tokens)
                .max()
                .unwrap_or(0),
        }))
    }
}

impl DecodeRows {
    fn new(out: &SchedulerOutput, device: &Device) -> candle_core::Result<Option<Self>> {
        let (mut index, mut row_seq, mut lens) = (Vec::new(), Vec::new(), Vec::new());
        for (i, s) in out.seqs.iter().enumerate() {
            if s.num_new_tokens == 1 {
                index.push(s.tokens.start as u32);
                row_seq.push(i as i32);
                lens.push((s.num_computed_tokens + 1) as i32);
            }
        }
        if index.is_empty() {
            return Ok(None);
        }
        let n = index.len();
        Ok(Some(DecodeRows {
            index: Tensor::from_vec(index, n, device)?,
            row_seq: Tensor::from_vec(row_seq, n, device)?,
            max_context_len: lens.iter().copied().max().unwrap_or(0) as usize,
            context_lens: Tensor::from_vec(lens, n, device)?,
        }))
    }
}

/// The longest block table of the step's sequences, at least 1: the width of its padded tables.
pub fn block_table_width(out: &SchedulerOutput) -> usize {
    out.seqs
        .iter()
        .map(|s| s.block_table.len())
        .max()
        .unwrap_or(0)
        .max(1)
}

/// The step's block tables as one row per sequence, padded with the null block to the longest:
/// `([seqs * width], width)` with `width >= 1`.
pub fn padded_block_tables(out: &SchedulerOutput) -> (Vec<i32>, usize) {
    let width = block_table_width(out);
    let mut tables = vec![0i32; out.seqs.len() * width];
    for (row, s) in tables.chunks_mut(width).zip(&out.seqs) {
        for (dst, &b) in row.iter_mut().zip(&out.block_tables[s.block_table.clone()]) {
            *dst = b as i32;
        }
    }
    (tables, width)
}

impl DeviceAttentionMeta {
    fn new(out: &SchedulerOutput, device: &Device) -> candle_core::Result<Self> {
        let n = out.num_batched_tokens();
        let (tables, max_blocks) = padded_block_tables(out);
        let mut row_seq = Vec::with_capacity(n);
        let mut context_lens = Vec::with_capacity(n);
        for (i, s) in out.seqs.iter().enumerate() {
            for j in 0..s.num_new_tokens {
                row_seq.push(i as i32);
                context_lens.push((s.num_computed_tokens + j + 1) as i32);
            }
        }
        let slots: Vec<i64> = out.slot_mapping.iter().map(|&s| i64::from(s)).collect();
        let prefill = PrefillMeta::new(out, device)?;
        let decode = match prefill {
            Some(_) => DecodeRows::new(out, device)?,
            None => None,
        };
        Ok(DeviceAttentionMeta {
            prefill,
            decode,
            slot_mapping: Tensor::from_vec(slots, n, device)?,
            block_tables: Tensor::from_vec(tables, (out.seqs.len(), max_blocks), device)?,
            row_seq: Tensor::from_vec(row_seq, n, device)?,
            max_context_len: context_lens.iter().copied().max().unwrap_or(0) as usize,
            context_lens: Tensor::from_vec(context_lens, n, device)?,
            split: None,
        })
    }
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
                device: if device.is_cpu() {
                    None
                } else {
                    Some(DeviceAttentionMeta::new(out, device)?)
                },
            },
        })
    }
}
