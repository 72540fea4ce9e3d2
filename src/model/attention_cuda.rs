//! Paged attention on a GPU: our CUDA kernels (kernels/ crate) write the step's K/V into the paged
//! cache, then every query row (decode tokens and prefill chunks alike) attends through its
//! sequence's block table.

use candle_core::Tensor;

use super::batch::DeviceAttentionMeta;

/// Writes `k`, `v` at the slot mapping and attends `q`; returns `[tokens, heads * head_dim]`.
pub(super) fn attend(
    k_cache: &Tensor,
    v_cache: &Tensor,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    meta: &DeviceAttentionMeta,
    scale: f32,
) -> candle_core::Result<Tensor> {
    let (tokens, heads, head_dim) = q.dims3()?;
    pagewise_kernels::reshape_and_cache(
        &k.contiguous()?,
        &v.contiguous()?,
        k_cache,
        v_cache,
        &meta.slot_mapping,
    )?;
    let out = pagewise_kernels::paged_attention(
        &q.contiguous()?,
        k_cache,
        v_cache,
        &meta.block_tables,
        Some(&meta.row_seq),
        &meta.context_lens,
        meta.max_context_len,
        scale,
    )?;
    out.reshape((tokens, heads * head_dim))
}
