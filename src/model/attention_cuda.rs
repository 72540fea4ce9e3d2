//! Paged attention on a GPU: our CUDA kernels (kernels/ crate) write the step's K/V into the paged
//! cache, then attend. In 16-bit dtypes prefill chunks go through the tensor-core prefill kernel
//! and decode tokens through the split-KV decode kernel (a mixed step runs both, each on its own
//! rows); in f32 (tests, parity) every query row goes through the decode kernel, which treats a
//! prefill row as a decode at its position. An FP8 cache (`PagedKv::fp8`) is written and read
//! by the same kernels (e4m3 tiles widened to 16 bits in shared memory).

use candle_core::{DType, Tensor};
use pagewise_kernels::{PagedKv, PrefillSeqs};

use super::batch::DeviceAttentionMeta;

/// Writes `k`, `v` at the slot mapping and attends `q` (over the last `window` positions of each
/// row's context in a sliding-window layer; with each head's sink logit in its softmax when
/// `sinks` is given); returns `[tokens, heads * head_dim]`.
#[allow(clippy::too_many_arguments)]
pub(super) fn attend(
    kv: PagedKv<'_>,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    meta: &DeviceAttentionMeta,
    scale: f32,
    window: Option<usize>,
    sinks: Option<&Tensor>,
) -> candle_core::Result<Tensor> {
    // SAFETY: the indices come from the scheduler's plan (ForwardBatch): block ids below the
    // cache's num_blocks, distinct slots within a step, contexts within each block-table row.
    unsafe {
        pagewise_kernels::reshape_and_cache(
            &k.contiguous()?,
            &v.contiguous()?,
            kv,
            meta.tables(window.is_some()).0,
        )
    }?;
    match (window, sinks) {
        (None, None) => attend_cached(kv, q, meta, scale),
        _ => attend_rows(kv, q, meta, scale, window, sinks),
    }
}

/// A sliding-window layer's attention, or attention with sinks (gpt-oss): every row, prefill
/// rows included, through the decode kernel, over the last `window` positions of its context
/// when given (a prefill row's context ends at its own position, so a row reads at most `window`
/// positions), with each head's sink in its softmax when given.
pub(super) fn attend_rows(
    kv: PagedKv<'_>,
    q: &Tensor,
    meta: &DeviceAttentionMeta,
    scale: f32,
    window: Option<usize>,
    sinks: Option<&Tensor>,
) -> candle_core::Result<Tensor> {
    let (tokens, heads, head_dim) = q.dims3()?;
    let longest = window.map_or(meta.max_context_len, |w| meta.max_context_len.min(w));
    let plan = split_plan(q, kv.k, meta, longest)?;
    // SAFETY: the indices come from the scheduler's plan (ForwardBatch): block ids below the
    // cache's num_blocks, contexts within each block-table row.
    let out = unsafe {
        pagewise_kernels::paged_attention_rows(
            &q.contiguous()?,
            kv,
            meta.tables(window.is_some()).1,
            Some(&meta.row_seq),
            &meta.context_lens,
            plan,
            window,
            sinks,
            scale,
        )
    }?;
    out.reshape((tokens, heads * head_dim))
}

/// A decode step's attention straight from its fused projection `x`, which the kernel rotates and
/// writes into the caches itself; `None` for a step with prefill rows (each row must be its
/// sequence's newest token) or in f32 (the tensor-core kernel's only).
pub(super) fn attend_fresh(
    (k_cache, v_cache): (&Tensor, &Tensor),
    x: &pagewise_kernels::QkvRope<'_>,
    meta: &DeviceAttentionMeta,
    scale: f32,
    window: Option<usize>,
) -> candle_core::Result<Option<Tensor>> {
    if meta.prefill.is_some() || !matches!(x.qkv.dtype(), DType::BF16 | DType::F16) {
        return Ok(None);
    }
    let (tokens, head_dim) = (x.qkv.dim(0)?, k_cache.dim(3)?);
    let longest = window.map_or(meta.max_context_len, |w| meta.max_context_len.min(w));
    let plan = match meta.split {
        Some(plan) => plan,
        None => pagewise_kernels::plan_for_rows(
            x.qkv.dtype(),
            (tokens, x.heads, head_dim),
            x.kv_heads,
            longest,
        )?,
    };
    let (slot_mapping, block_tables) = meta.tables(window.is_some());
    // SAFETY: the indices come from the scheduler's plan (ForwardBatch): block ids below the
    // cache's num_blocks, distinct slots within a step, each the slot of its row's newest
    // position, contexts within each block-table row.
    let out = unsafe {
        pagewise_kernels::paged_attention_fresh(
            x,
            (k_cache, v_cache),
            slot_mapping,
            block_tables,
            Some(&meta.row_seq),
            &meta.context_lens,
            plan,
            window,
            scale,
        )
    }?;
    Ok(Some(out.reshape((tokens, x.heads * head_dim))?))
}

/// Attends `q` over caches that already hold this step's K/V; returns `[tokens, heads * head_dim]`.
pub(super) fn attend_cached(
    kv: PagedKv<'_>,
    q: &Tensor,
    meta: &DeviceAttentionMeta,
    scale: f32,
) -> candle_core::Result<Tensor> {
    let (tokens, heads, head_dim) = q.dims3()?;
    let q = q.contiguous()?;
    let out = match &meta.prefill {
        Some(p) if matches!(q.dtype(), DType::BF16 | DType::F16) => {
            let out = Tensor::zeros(q.shape(), q.dtype(), q.device())?;
            let seqs = PrefillSeqs {
                q_start: &p.q_start,
                q_len: &p.q_len,
                ctx_len: &p.ctx_len,
                table_row: &p.table_row,
                max_q_len: p.max_q_len,
            };
            // SAFETY: the indices come from the scheduler's plan (ForwardBatch): block ids below the
            // cache's num_blocks, distinct slots within a step, contexts within each block-table row.
            unsafe {
                pagewise_kernels::paged_prefill_attention(
                    &out,
                    &q,
                    kv,
                    &meta.block_tables,
                    &seqs,
                    scale,
                )
            }?;
            match &meta.decode {
                // The decode rows of `out` are still zero: adding their results sets them.
                Some(d) => {
                    // SAFETY: the indices come from the scheduler's plan (ForwardBatch): block ids below the
                    // cache's num_blocks, distinct slots within a step, contexts within each block-table row.
                    let decoded = unsafe {
                        pagewise_kernels::paged_attention(
                            &q.index_select(&d.index, 0)?,
                            kv,
                            &meta.block_tables,
                            Some(&d.row_seq),
                            &d.context_lens,
                            d.max_context_len,
                            scale,
                        )
                    }?;
                    out.index_add(&d.index, &decoded, 0)?
                }
                None => out,
            }
        }
        _ => {
            let plan = split_plan(&q, kv.k, meta, meta.max_context_len)?;
            // SAFETY: the indices come from the scheduler's plan (ForwardBatch): block ids below the
            // cache's num_blocks, distinct slots within a step, contexts within each block-table row.
            unsafe {
                pagewise_kernels::paged_attention_planned(
                    &q,
                    kv,
                    &meta.block_tables,
                    Some(&meta.row_seq),
                    &meta.context_lens,
                    plan,
                    cache_writes(meta),
                    scale,
                )
            }?
        }
    };
    out.reshape((tokens, heads * head_dim))
}

/// The decode kernel's split plan: the step's (what a CUDA graph captured), else one for contexts
/// up to `longest`.
fn split_plan(
    q: &Tensor,
    k_cache: &Tensor,
    meta: &DeviceAttentionMeta,
    longest: usize,
) -> candle_core::Result<(usize, usize)> {
    match meta.split {
        Some(plan) => Ok(plan),
        None => pagewise_kernels::plan_for(q, k_cache, longest),
    }
}

/// Where the kernel before decode attention may be writing the caches. A step without prefill
/// rows has one row per sequence, its new token, whose K/V the kernel just before wrote (rope +
/// cache write): the attention kernel may then copy earlier positions before that kernel ends.
/// (It saves about a microsecond at 1 x 8k: benches/history/tried.md, "Early cache copies in
/// decode attention".)
fn cache_writes(meta: &DeviceAttentionMeta) -> pagewise_kernels::CacheWrites {
    if meta.prefill.is_none() {
        pagewise_kernels::CacheWrites::LastPosition
    } else {
        pagewise_kernels::CacheWrites::Anywhere
    }
}
