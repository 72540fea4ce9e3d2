//! Steps of up to [`MAX_ROWS`] tokens on a GPU (decode steps of one or two sequences, or a one-
//! or two-token prompt) with each layer's element-wise steps folded into its matmuls
//! (`pagewise_kernels::gemv_fused`): the qkv and gate/up projections normalize their input as they
//! stage it, the qkv projection rotates q and k and writes k and v into the cache as it stores, the
//! o and down projections add the residual as they store, and the down projection applies
//! SiLU-and-multiply as it stages its input. A layer is then five kernels (qkv + rope + cache
//! write, attention (+ its merge), o, gate/up, down) instead of ten or more, which is what bounds
//! a batch-1 step. Models with per-head q/k norms (Qwen3, Gemma 3) as many: the qkv GEMV stores
//! plainly and the attention kernel normalizes, rotates and writes the cache itself
//! (`KvCache::attend_fresh`; a step with prefill rows runs `rope_qkv_cache` first).
//! A mixture-of-experts layer (Mixtral, Qwen3-MoE) ends in three kernels after o: the router
//! (norm folded in), the routing, and the chosen experts (norm folded into gate/up, the residual
//! into down); see `SparseMoe::forward_fused`.
//!
//! It makes batch-1 decode faster than cuBLAS and the separate kernels, because one kernel reads
//! each weight once and does the element-wise steps on the way (benches/history/tried.md, "The
//! fused decode path against cuBLAS").
//! It sums the matmuls in another order than cuBLAS, which it replaces for steps of at most
//! [`MAX_ROWS`] rows, so at real shapes a sequence's bf16 tokens can depend on whether its step
//! had more rows; so can cuBLAS's own, which picks its kernels by row count. The GPU
//! batch-invariance tests (tiny fixture, f32 and bf16) pass with it on.

use candle_core::{DType, Device, Tensor};
use pagewise_kernels::{GemvInput, GemvWeight, gemv_fits, gemv_fused};

use super::attention::KvCache;
use super::batch::ForwardBatch;
use super::glu::silu_mul;
use super::moe::SparseMoe;
use super::norm::RmsNorm;
use super::qkv::Heads;
use super::rotary::Rotary;
use crate::parallel::Parallel;

/// One decoder layer's weights as the fused path takes them (dense, no biases).
pub(super) struct FusedLayer<'a> {
    pub attn: FusedAttention<'a>,
    /// `[hidden, heads * head_dim]`.
    pub o: GemvWeight<'a>,
    pub post_norm: &'a RmsNorm,
    pub mlp: FusedMlp<'a>,
}

/// What the fused attention of a layer reads: its input norm, qkv projection and head norms.
pub(super) struct FusedAttention<'a> {
    pub input_norm: &'a RmsNorm,
    /// `[(heads + 2 * kv_heads) * head_dim, hidden]`.
    pub qkv: GemvWeight<'a>,
    /// Qwen3's and Gemma 3's per-head q/k norms, if the model has them.
    pub head_norms: Option<pagewise_kernels::HeadNorms<'a>>,
}

/// A fused layer's MLP.
pub(super) enum FusedMlp<'a> {
    /// SwiGLU: gate/up `[2 * intermediate, hidden]` (gate rows first), down
    /// `[hidden, intermediate]`.
    Dense {
        gate_up: GemvWeight<'a>,
        down: GemvWeight<'a>,
    },
    /// Experts routed on the device (`SparseMoe::forward_fused`).
    Sparse(&'a SparseMoe),
}

/// Most rows a step may have to take the fused path. Its GEMV does each row's multiply-adds on
/// CUDA cores, reading the staged rows from shared memory once per weight load, so past two rows
/// it stops being bound by the weights' bytes; cuBLAS's tensor-core kernels are then faster
/// (benches/history/tried.md, "The fused decode path against cuBLAS").
pub const MAX_ROWS: usize = 2;

/// Whether a step of `rows` rows in `dtype` on `device` fits the fused kernels with these
/// layers: a GPU, f16 or bf16, at most [`MAX_ROWS`] rows, and inputs the kernels can stage.
pub(super) fn fits(rows: usize, dtype: DType, device: &Device, layers: &[FusedLayer<'_>]) -> bool {
    if !step_fits(rows, dtype, device) {
        return false;
    }
    layers.iter().all(|l| {
        let mlp = match l.mlp {
            FusedMlp::Dense { gate_up, down } => {
                // (A dense down may be past the staging space: `finish_layer` then takes cuBLAS.)
                let down_fits = match down {
                    GemvWeight::Dense(_) => down.takes(dtype),
                    GemvWeight::Fp8(_) | GemvWeight::Int4(_) | GemvWeight::Affine(_) => {
                        gemv_takes(rows, dtype, &[down])
                    }
                };
                gemv_takes(rows, dtype, &[gate_up]) && down_fits
            }
            // (The expert kernels check their own shapes.)
            FusedMlp::Sparse(_) => l.post_norm.weight().dtype() == dtype,
        };
        gemv_takes(rows, dtype, &[l.attn.qkv, l.o]) && mlp
    })
}

/// Whether a step of `rows` rows in `dtype` on `device` itself fits the fused kernels: on a GPU,
/// f16 or bf16, at most [`MAX_ROWS`] rows.
pub(super) fn step_fits(rows: usize, dtype: DType, device: &Device) -> bool {
    device.is_cuda() && (1..=MAX_ROWS).contains(&rows) && matches!(dtype, DType::BF16 | DType::F16)
}

/// The most rows, down from [`MAX_ROWS`], for which `takes(rows)`; 0 when none
/// ([`crate::model::CausalLm::fused_decode_rows`]).
pub(super) fn most_rows(takes: impl Fn(usize) -> bool) -> usize {
    (1..=MAX_ROWS).rev().find(|&r| takes(r)).unwrap_or(0)
}

/// Whether the GEMV takes `rows` rows in `dtype` through each of `weights` (`[out, k]`):
/// dense in the same dtype or FP8 it takes, and the rows' `k` within its staging space.
pub(super) fn gemv_takes(rows: usize, dtype: DType, weights: &[GemvWeight<'_>]) -> bool {
    weights.iter().all(|w| {
        w.takes(dtype)
            && rows <= w.max_rows()
            && gemv_fits(rows, w.dims().map_or(usize::MAX, |d| d.1), dtype)
    })
}

/// The GEMV input that folds `norm` in.
pub(super) fn norm_input(norm: &RmsNorm) -> GemvInput<'_> {
    GemvInput::RmsNorm {
        weight: norm.weight(),
        eps: norm.eps() as f32,
    }
}

/// Layer `layer`'s attention output (`[rows, heads * head_dim]`) from the residual stream `x`
/// (`[rows, hidden]`): the qkv projection of its norm with rotary (the tables read at the step's
/// positions, no gather) and the cache write folded in (one kernel; two with per-head q/k
/// norms or an FP8 cache, which the projection does not write), then paged attention.
pub(super) fn attention(
    x: &Tensor,
    l: &FusedAttention<'_>,
    layer: usize,
    rotary: &Rotary,
    batch: &ForwardBatch<'_>,
    kv: &KvCache,
    heads: Heads,
) -> candle_core::Result<Tensor> {
    let (caches, slots) = step_caches(layer, batch, kv, heads)?;
    if l.head_norms.is_some() || caches.fp8.is_some() {
        // A head's norm needs the whole head, which the projection's warps do not hold (and
        // the projection writes 16-bit caches only): the projection (its input norm folded in),
        // then one kernel that normalizes each head, rotates and writes the cache.
        let qkv = gemv_fused(x, l.qkv, norm_input(l.input_norm), None)?;
        return attend_projected(&qkv, l, layer, rotary, batch, kv, heads);
    }
    let q = rotary.project_qkv_and_cache(
        x,
        l.qkv,
        l.input_norm,
        (heads.q, heads.kv),
        (caches.k, caches.v),
        (&batch.positions, slots),
    )?;
    kv.attend_written(layer, &q, &batch.attention, heads.scale, heads.window)
}

/// Layer `layer`'s attention output from its qkv projection `qkv`, projected by the caller
/// (`[rows, (heads + 2 kv_heads) head_dim]`): in a decode step the attention kernel normalizes
/// each head (per-head q/k norms), rotates and writes the cache itself
/// (`KvCache::attend_fresh`, 16-bit caches); otherwise one kernel does that first, then paged
/// attention.
pub(super) fn attend_projected(
    qkv: &Tensor,
    l: &FusedAttention<'_>,
    layer: usize,
    rotary: &Rotary,
    batch: &ForwardBatch<'_>,
    kv: &KvCache,
    heads: Heads,
) -> candle_core::Result<Tensor> {
    let x = rotary.qkv_rope(qkv, (heads.q, heads.kv), l.head_norms, &batch.positions);
    if let Some(out) = kv.attend_fresh(layer, &x, &batch.attention, heads.scale, heads.window)? {
        return Ok(out);
    }
    let (caches, slots) = step_caches(layer, batch, kv, heads)?;
    // SAFETY: the indices come from the scheduler's plan (ForwardBatch): distinct slots within a
    // step, inside the caches; positions past the tables read their last row.
    let q = unsafe { pagewise_kernels::rope_qkv_cache(&x, caches, slots) }?;
    kv.attend_written(layer, &q, &batch.attention, heads.scale, heads.window)
}

/// Layer `layer`'s device caches and the step's cache slots for its kind of attention.
fn step_caches<'k>(
    layer: usize,
    batch: &'k ForwardBatch<'_>,
    kv: &'k KvCache,
    heads: Heads,
) -> candle_core::Result<(pagewise_kernels::PagedKv<'k>, &'k Tensor)> {
    let (Some(caches), Some(dm)) = (kv.device_layer(layer), &batch.attention.device) else {
        candle_core::bail!(
            "the fused decode path needs the cache and the step's metadata on the GPU"
        );
    };
    Ok((caches, dm.tables(heads.window.is_some()).0))
}

/// The residual stream after the layer, from the stream `x` entering it and the attention
/// output `attn` (`[rows, heads * head_dim]`): `x + o(attn)`, then that plus the MLP of its norm.
/// Under tensor parallelism o and down are this rank's columns: the leading rank adds the
/// residual as it stores and the all-reduce sums the ranks' parts, so the residual counts once.
/// (Expert layers take this path on one rank only: `Llama::fused_layers`.)
pub(super) fn finish_layer(
    x: &Tensor,
    attn: &Tensor,
    l: &FusedLayer<'_>,
    par: &Parallel,
) -> candle_core::Result<Tensor> {
    if let (FusedMlp::Sparse(moe), GemvWeight::Dense(o)) = (&l.mlp, l.o)
        && let Some(folded) = moe.router_fold(x.dim(0)?)
    {
        // The router scored in the o projection's grid (`SparseMoe::fold_router`).
        let (x_mid, logits) = pagewise_kernels::o_router(attn, o, x, folded)?;
        return moe.forward_fused(&x_mid, l.post_norm, Some(&logits));
    }
    let residual = |r| par.rank.leads().then_some(r);
    let x_mid = par.all_reduce(gemv_fused(attn, l.o, GemvInput::Plain, residual(x))?)?;
    let (gate_up_w, down_w) = match l.mlp {
        FusedMlp::Dense { gate_up, down } => (gate_up, down),
        FusedMlp::Sparse(moe) => return moe.forward_fused(&x_mid, l.post_norm, None),
    };
    let gate_up = gemv_fused(&x_mid, gate_up_w, norm_input(l.post_norm), None)?;
    let (rows, inter) = (x.dim(0)?, down_w.dims()?.1);
    let out = if gemv_fits(rows, inter, x.dtype()) {
        gemv_fused(&gate_up, down_w, GemvInput::SiluMul, residual(&x_mid))?
    } else {
        // (8 x 14336 bf16 is past the staging space: SiLU-and-mul and cuBLAS, as unfused; `fits`
        // keeps FP8 downs within it.)
        let GemvWeight::Dense(down_w) = down_w else {
            candle_core::bail!("an FP8 down projection past the GEMV's staging space");
        };
        let down = silu_mul(&gate_up)?.matmul(&down_w.t()?)?;
        match residual(&x_mid) {
            Some(r) => (r + down)?,
            None => down,
        }
    };
    par.all_reduce(out)
}
