//! Decode attention that takes a step's new tokens straight from the fused q/k/v projection: the
//! tensor-core decode kernel normalizes (per head, Qwen3 and Gemma 3) and rotates the query heads
//! it attends with, and writes each new token's K and V into the caches, as [`rope_qkv_cache`]
//! would before it (the same roundings: the results are bit for bit those of the two kernels).
//! A decode layer is then one launch shorter, and every tile of the context may be copied
//! before the kernel waits for the projection.
//!
//! [`rope_qkv_cache`]: crate::rope_qkv_cache

use candle_core::{DType, Result, Tensor, bail};

use crate::PagedKv;
use crate::decode::{CacheWrites, DecodeWorkspace, decode_into};
use crate::rope::{QkvRope, qkv_rope_args};

/// Decode attention of a step whose row `r` is its sequence's newest token (position
/// `context_lens[r] - 1`, cache slot `slot_mapping[r]`, -1 = not written), read unrotated from
/// `x.qkv` (`[rows, (heads + 2 kv_heads) head_dim]`): attends over `block_tables` (row `r`
/// through `row_seq[r]`, or table `r`) with the `(splits, chunk)` plan, over the last `window`
/// positions of each context when given. Writes the rows' K and V into the caches
/// (`[blocks, block_size, kv_heads, head_dim]`) and returns the attention output
/// `[rows, heads, head_dim]`. bf16 and f16 only (the tensor-core kernel), 16-bit caches only (an
/// FP8 cache's steps rotate and write with [`rope_qkv_cache`](crate::rope_qkv_cache) first).
///
/// On sm_90 the kernel starts before the kernel before it ends and copies the cache right away:
/// that kernel must not write the caches (the projection does not).
///
/// # Safety
/// As [`paged_attention_planned_into`](crate::paged_attention_planned_into), and every slot in
/// the slot mapping is -1 or below `num_blocks * block_size` of the caches, distinct within the
/// step, and the slot of its row's newest position in the row's block table.
#[allow(clippy::too_many_arguments)]
pub unsafe fn paged_attention_fresh(
    x: &QkvRope<'_>,
    (k_cache, v_cache): (&Tensor, &Tensor),
    slot_mapping: &Tensor,
    block_tables: &Tensor,
    row_seq: Option<&Tensor>,
    context_lens: &Tensor,
    plan: (usize, usize),
    window: Option<usize>,
    scale: f32,
) -> Result<Tensor> {
    const OP: &str = "paged_attention_fresh";
    let kv = PagedKv::new(k_cache, v_cache);
    let (fresh, rows, d) = qkv_rope_args(OP, x, &kv, slot_mapping)?;
    if !matches!(x.qkv.dtype(), DType::BF16 | DType::F16) {
        bail!("{OP}: bf16 or f16 only, got {:?}", x.qkv.dtype());
    }
    if window == Some(0) {
        bail!("{OP}: a sliding window of no positions");
    }
    let out = crate::empty((rows, x.heads, d), x.qkv.dtype(), x.qkv.device())?;
    let ws = DecodeWorkspace::new(rows, x.heads, plan.0, d, x.qkv.device())?;
    // SAFETY: the caller's contract; shapes and dtypes checked above and in `decode_into` (`out`
    // gives the query's shape; the kernel reads the query from `fresh`).
    unsafe {
        decode_into(
            &out,
            &ws,
            &out,
            kv,
            block_tables,
            row_seq,
            context_lens,
            plan,
            CacheWrites::Anywhere,
            window.unwrap_or(0),
            None,
            scale,
            Some(&fresh),
        )
    }?;
    Ok(out)
}
