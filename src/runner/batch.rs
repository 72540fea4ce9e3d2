//! A [`ForwardBatch`] from the scheduler's plan: the packed tensors, the per-sequence spans and,
//! on a GPU, the paged-attention metadata the kernels read. The runner's side of the line between
//! the scheduler and the models.

use candle_core::{Device, Tensor};

use crate::model::batch::{
    AttentionMeta, DecodeRows, DeviceAttentionMeta, ForwardBatch, PrefillMeta, SeqSpan,
    WindowTables,
};
use crate::scheduler::{ScheduledSeq, SchedulerOutput};

/// The step's prefill sequences (more than one token), if any.
fn prefill_meta(
    out: &SchedulerOutput,
    device: &Device,
) -> candle_core::Result<Option<PrefillMeta>> {
    let seqs: Vec<(usize, &ScheduledSeq)> = out
        .seqs
        .iter()
        .enumerate()
        .filter(|(_, s)| s.num_new_tokens > 1)
        .collect();
    if seqs.is_empty() {
        return Ok(None);
    }
    let n = seqs.len();
    let col = |f: &dyn Fn(usize, &ScheduledSeq) -> usize| {
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

/// The step's decode tokens (one token), if any.
fn decode_rows(out: &SchedulerOutput, device: &Device) -> candle_core::Result<Option<DecodeRows>> {
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

/// The longest block table of the step's sequences, at least 1: the width of its padded tables.
pub fn block_table_width(out: &SchedulerOutput) -> usize {
    out.seqs
        .iter()
        .map(|s| s.block_table.len())
        .max()
        .unwrap_or(0)
        .max(1)
}

/// Block tables laid out as the step's (`tables` is `out.block_tables` or the window group's) as
/// one row per sequence, padded with the null block to the longest: `([seqs * width], width)`
/// with `width >= 1`.
pub fn padded_block_tables(out: &SchedulerOutput, tables: &[u32]) -> (Vec<i32>, usize) {
    let width = block_table_width(out);
    let mut padded = vec![0i32; out.seqs.len() * width];
    for (row, s) in padded.chunks_mut(width).zip(&out.seqs) {
        for (dst, &b) in row.iter_mut().zip(&tables[s.block_table.clone()]) {
            *dst = b as i32;
        }
    }
    (padded, width)
}

/// Slots as the kernels read them (i64).
fn slots_tensor(slots: &[u32], device: &Device) -> candle_core::Result<Tensor> {
    let wide: Vec<i64> = slots.iter().map(|&s| i64::from(s)).collect();
    Tensor::from_vec(wide, slots.len(), device)
}

/// The step's attention metadata on `device`, one row per query token.
fn device_meta(out: &SchedulerOutput, device: &Device) -> candle_core::Result<DeviceAttentionMeta> {
    let n = out.num_batched_tokens();
    let (tables, max_blocks) = padded_block_tables(out, &out.block_tables);
    let mut row_seq = Vec::with_capacity(n);
    let mut context_lens = Vec::with_capacity(n);
    for (i, s) in out.seqs.iter().enumerate() {
        for j in 0..s.num_new_tokens {
            row_seq.push(i as i32);
            context_lens.push((s.num_computed_tokens + j + 1) as i32);
        }
    }
    let window = match out.has_window() {
        true => {
            let (tables, _) = padded_block_tables(out, &out.window_block_tables);
            Some((
                slots_tensor(&out.window_slot_mapping, device)?,
                Tensor::from_vec(tables, (out.seqs.len(), max_blocks), device)?,
            ))
        }
        false => None,
    };
    let prefill = prefill_meta(out, device)?;
    let decode = match prefill {
        Some(_) => decode_rows(out, device)?,
        None => None,
    };
    Ok(DeviceAttentionMeta {
        prefill,
        decode,
        slot_mapping: slots_tensor(&out.slot_mapping, device)?,
        window,
        block_tables: Tensor::from_vec(tables, (out.seqs.len(), max_blocks), device)?,
        row_seq: Tensor::from_vec(row_seq, n, device)?,
        max_context_len: context_lens.iter().copied().max().unwrap_or(0) as usize,
        context_lens: Tensor::from_vec(context_lens, n, device)?,
        split: None,
    })
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
        // Per sequence, its leading prompt-logprob rows, then, if it samples, its last row and
        // the rows of its draft tokens before it.
        let rows: Vec<u32> = out
            .seqs
            .iter()
            .flat_map(|s| {
                let prompt = s.tokens.start..s.tokens.start + s.num_prompt_rows;
                let sampled = match s.samples {
                    true => s.tokens.end - 1 - s.num_draft_tokens..s.tokens.end,
                    false => 0..0,
                };
                prompt.chain(sampled).map(|r| r as u32)
            })
            .collect();
        // A step where no sequence samples (a long prompt's first chunks, alone) still gathers
        // one row on a GPU, the step's last token, whose logits nobody reads: a device buffer of
        // no bytes cannot be made (CUDA_ERROR_INVALID_VALUE).
        let gathered = match rows.is_empty() && !device.is_cpu() {
            true => vec![n.saturating_sub(1) as u32],
            false => rows.clone(),
        };
        Ok(ForwardBatch {
            input_ids: Tensor::from_slice(&out.token_ids, n, device)?,
            positions: Tensor::from_slice(&out.positions, n, device)?,
            num_sample_rows: rows.len(),
            sample_rows: Tensor::from_vec(gathered.clone(), gathered.len(), device)?,
            attention: AttentionMeta {
                slot_mapping: &out.slot_mapping,
                block_tables: &out.block_tables,
                window: out.has_window().then_some(WindowTables {
                    slot_mapping: &out.window_slot_mapping,
                    block_tables: &out.window_block_tables,
                }),
                seqs,
                device: if device.is_cpu() {
                    None
                } else {
                    Some(device_meta(out, device)?)
                },
            },
        })
    }
}
