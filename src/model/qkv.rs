//! The attention block's input: q/k/v projections (dense weights fused into one matmul), Qwen3's
//! per-head q/k RMSNorm, rotary embedding and the KV-cache write, then paged attention. On a GPU
//! with fused weights one kernel rotates q and k and writes k and v into the cache straight from
//! the fused projection (after the per-head norms, where the model has them).

use candle_core::{DType, Tensor};

use super::ModelError;
use super::attention::{KvCache, Projected, Rows};
use super::batch::ForwardBatch;
use super::config::ModelConfig;
use super::host::with_f32s;
use super::layers::Linear;
use super::norm::{HostNorm, RmsNorm};
use super::rotary::RotaryRows;
use super::weights::{Part, Weights};
use crate::parallel::{TpRank, head_rows};

/// The q, k and v projections of one layer, and the per-head norms after them if any.
pub struct QkvProj {
    proj: Proj,
    /// Qwen3's and Gemma 3's RMSNorm of each query head and each key head (`[head_dim]`
    /// scales), applied before rotary.
    qk_norm: Option<(RmsNorm, RmsNorm)>,
}

enum Proj {
    /// One `[(heads + 2 * kv_heads) * head_dim, hidden]` matmul (dense weights).
    Fused(Linear),
    /// Three matmuls (quantized weights).
    Split(Linear, Linear, Linear),
}

impl QkvProj {
    /// Loads `prefix.{q,k,v}_proj`, fusing dense weights: the rows of the heads `tp` computes
    /// (all of them with one rank, read as whole tensors).
    pub fn load(
        w: &Weights,
        prefix: &str,
        cfg: &ModelConfig,
        tp: TpRank,
    ) -> Result<Self, ModelError> {
        let (h, d, b) = (cfg.hidden_size, cfg.head_dim, cfg.qkv_bias);
        let (nq, nkv) = (cfg.num_attention_heads, cfg.num_key_value_heads);
        if cfg.stacked_projections {
            // Phi-3 stores the three stacked already (not sharded: `ModelConfig::check_tensor_parallel` refuses it).
            let fused = w.linear(&format!("{prefix}.qkv_proj"), h, (nq + 2 * nkv) * d, b)?;
            return Ok(QkvProj {
                proj: Proj::Fused(fused.in_rows()?),
                qk_norm: None,
            });
        }
        let q_rows = Part::Rows(head_rows(&cfg.q_heads(tp), d));
        let kv_rows = Part::Rows(head_rows(&cfg.kv_heads(tp), d));
        let q = w.linear_part(&format!("{prefix}.q_proj"), (h, nq * d), b, q_rows)?;
        let k = w.linear_part(
            &format!("{prefix}.k_proj"),
            (h, nkv * d),
            b,
            kv_rows.clone(),
        )?;
        let v = w.linear_part(&format!("{prefix}.v_proj"), (h, nkv * d), b, kv_rows)?;
        let qk_norm = if cfg.qk_norm {
            let norm = |name: &str| {
                let name = format!("{prefix}.{name}.weight");
                // (Gemma's stored w is applied as 1 + w; a GGUF stores 1 + w already.)
                if cfg.norms_plus_one {
                    RmsNorm::load_plus_one(w, &name, d, cfg.norm_eps)
                } else {
                    RmsNorm::load(w, &name, d, cfg.norm_eps)
                }
            };
            Some((norm("q_norm")?, norm("k_norm")?))
        } else {
            None
        };
        let proj = match Linear::concat(&[&q, &k, &v])? {
            // (The decode GEMV with rotary reads 4-bit codes row by row.)
            Some(fused) => Proj::Fused(fused.in_rows()?),
            None => Proj::Split(q, k, v),
        };
        Ok(QkvProj { proj, qk_norm })
    }

    /// The fused weight as the fused decode kernels stream it, when dense or FP8 without a bias
    /// (the per-head norms, if any, are `QkvProj::head_norms`).
    #[cfg(feature = "cuda")]
    pub fn gemv_weight(&self) -> Option<pagewise_kernels::GemvWeight<'_>> {
        match &self.proj {
            Proj::Fused(l) => l.gemv_weight(),
            Proj::Split(..) => None,
        }
    }

    /// The per-head q/k norms as the GPU's rotary kernel applies them, if the model has them.
    #[cfg(feature = "cuda")]
    pub fn head_norms(&self) -> Option<pagewise_kernels::HeadNorms<'_>> {
        self.qk_norm
            .as_ref()
            .map(|(q, k)| pagewise_kernels::HeadNorms {
                q: q.weight(),
                k: k.weight(),
                eps: q.eps() as f32,
            })
    }
}

/// `prefix.o_proj` (`[hidden, heads * head_dim]`), row-parallel: the columns of `tp`'s query
/// heads, and the bias (if the model has one) on the leading rank only, so the all-reduce that
/// follows counts it once.
pub fn o_proj(
    w: &Weights,
    prefix: &str,
    cfg: &ModelConfig,
    tp: TpRank,
) -> Result<Linear, ModelError> {
    let (h, d, nq) = (cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads);
    let cols = Part::Cols(head_rows(&cfg.q_heads(tp), d));
    w.linear_part(
        &format!("{prefix}.o_proj"),
        (nq * d, h),
        cfg.o_bias && tp.leads(),
        cols,
    )
}

/// A fused projection's output `qkv` (`[tokens, (q + 2 * kv) * dim]`: every q head, then every k,
/// then every v) as q `[tokens, q, dim]`, k and v `[tokens, kv, dim]`, each contiguous.
pub fn split_qkv(qkv: &Tensor, heads: Heads) -> candle_core::Result<(Tensor, Tensor, Tensor)> {
    let n = qkv.dim(0)?;
    let (qw, kvw) = (heads.q * heads.dim, heads.kv * heads.dim);
    let part = |start, width, count: usize| {
        qkv.narrow(1, start, width)?
            .contiguous()?
            .reshape((n, count, heads.dim))
    };
    Ok((
        part(0, qw, heads.q)?,
        part(qw, kvw, heads.kv)?,
        part(qw + kvw, kvw, heads.kv)?,
    ))
}

/// `x` (`[tokens, heads * dim]`) with each head RMS-normalized by `norm`.
fn norm_heads(norm: &RmsNorm, x: &Tensor, heads: usize, dim: usize) -> candle_core::Result<Tensor> {
    let n = x.dim(0)?;
    norm.forward(&x.reshape((n * heads, dim))?)?
        .reshape((n, heads * dim))
}

/// Head counts and scale of an attention block.
#[derive(Clone, Copy, Debug)]
pub struct Heads {
    /// Query heads.
    pub q: usize,
    /// Key/value heads.
    pub kv: usize,
    /// Head dimension.
    pub dim: usize,
    /// Softmax scale.
    pub scale: f32,
    /// A sliding-window layer's window (positions each query sees, itself included).
    pub window: Option<usize>,
}

/// Layer `layer`'s attention over the normalized stream `h` (`[tokens, hidden]`): projections,
/// rotary, cache write, paged attention. Returns `[tokens, heads * head_dim]`.
pub fn attention(
    proj: &QkvProj,
    layer: usize,
    h: &Tensor,
    rotary: &RotaryRows,
    batch: &ForwardBatch<'_>,
    kv: &mut KvCache,
    heads: Heads,
) -> candle_core::Result<Tensor> {
    attention_with_sinks(proj, layer, h, rotary, batch, kv, heads, None)
}

/// [`attention`] with each head's sink logit in its softmax when `sinks` is given (gpt-oss;
/// see [`KvCache::attend_with_sinks`]).
#[allow(clippy::too_many_arguments)]
pub fn attention_with_sinks(
    proj: &QkvProj,
    layer: usize,
    h: &Tensor,
    rotary: &RotaryRows,
    batch: &ForwardBatch<'_>,
    kv: &mut KvCache,
    heads: Heads,
    sinks: Option<&Tensor>,
) -> candle_core::Result<Tensor> {
    let n = h.dim(0)?;
    let (qw, kvw) = (heads.q * heads.dim, heads.kv * heads.dim);
    let (q, k, v) = match &proj.proj {
        Proj::Fused(linear) => {
            let mut qkv = linear.forward(h)?;
            #[cfg(feature = "cuda")]
            if sinks.is_none()
                && let Some(out) = attend_projected(&qkv, proj, layer, rotary, batch, kv, heads)
            {
                return out;
            }
            let width = qw + 2 * kvw;
            let parts = [0, qw, qw + kvw].map(|offset| (&qkv, width, offset));
            let norms = proj.qk_norm.as_ref();
            if let Some(out) = attend_host(layer, parts, norms, rotary, batch, kv, heads, sinks)? {
                return Ok(out);
            }
            if let Some((qn, kn)) = &proj.qk_norm {
                let q = norm_heads(qn, &qkv.narrow(1, 0, qw)?, heads.q, heads.dim)?;
                let k = norm_heads(kn, &qkv.narrow(1, qw, kvw)?, heads.kv, heads.dim)?;
                qkv = Tensor::cat(&[&q, &k, &qkv.narrow(1, qw + kvw, kvw)?], 1)?;
            }
            split_qkv(&qkv, heads)?
        }
        Proj::Split(q, k, v) => {
            let (mut q, mut k, v) = (q.forward(h)?, k.forward(h)?, v.forward(h)?);
            let parts = [(&q, qw, 0), (&k, kvw, 0), (&v, kvw, 0)];
            let norms = proj.qk_norm.as_ref();
            if let Some(out) = attend_host(layer, parts, norms, rotary, batch, kv, heads, sinks)? {
                return Ok(out);
            }
            if let Some((qn, kn)) = &proj.qk_norm {
                q = norm_heads(qn, &q, heads.q, heads.dim)?;
                k = norm_heads(kn, &k, heads.kv, heads.dim)?;
            }
            (q, k, v)
        }
    };
    let q = rotary.apply(&q.reshape((n, heads.q, heads.dim))?)?;
    let k = rotary.apply(&k.reshape((n, heads.kv, heads.dim))?)?;
    let v = v.reshape((n, heads.kv, heads.dim))?;
    kv.attend_with_sinks(
        layer,
        &q,
        &k,
        &v,
        &batch.attention,
        heads.scale,
        heads.window,
        sinks,
    )
}

/// On the CPU, the rest of [`attention`] over plain buffers ([`KvCache::attend_projected_host`]):
/// `parts` are the q, k and v projections as (tensor, row stride, offset of the part in a row),
/// `norms` the per-head norms of q and k, if any. `None` when they are not f32 in host memory,
/// the rotary tables are not on the host, or the cache is not.
#[allow(clippy::too_many_arguments)]
fn attend_host(
    layer: usize,
    parts: [(&Tensor, usize, usize); 3],
    norms: Option<&(RmsNorm, RmsNorm)>,
    rotary: &RotaryRows,
    batch: &ForwardBatch<'_>,
    kv: &mut KvCache,
    heads: Heads,
    sinks: Option<&Tensor>,
) -> candle_core::Result<Option<Tensor>> {
    if rotary.dims() > heads.dim {
        return Ok(None);
    }
    let Some(turn) = rotary.host()? else {
        return Ok(None);
    };
    let sinks = sinks
        .map(|s| s.to_dtype(DType::F32)?.to_vec1::<f32>())
        .transpose()?;
    let (n, device) = (parts[0].0.dim(0)?, parts[0].0.device());
    let mut attend = |norms: Option<[HostNorm<'_>; 2]>| {
        let p = Projected {
            heads: heads.q,
            kv_heads: heads.kv,
            head_dim: heads.dim,
            rotary: turn,
            scale: heads.scale,
            window: heads.window,
            sinks: sinks.as_deref(),
            norms,
        };
        with_f32s(parts.map(|(t, ..)| t), |values| {
            let rows = std::array::from_fn(|j| Rows {
                data: values[j],
                stride: parts[j].1,
                offset: parts[j].2,
            });
            kv.attend_projected_host(layer, n, rows, &batch.attention, p)
        })
    };
    let out = match norms {
        None => attend(None)?,
        Some((qn, kn)) => {
            let scales = [qn.weight(), kn.weight()];
            let eps = [qn.eps() as f32, kn.eps() as f32];
            with_f32s(scales, |scales| {
                attend(Some(std::array::from_fn(|j| HostNorm {
                    scale: scales[j],
                    eps: eps[j],
                })))
            })?
            .transpose()?
            .flatten()
        }
    };
    match out.transpose()?.flatten() {
        Some(out) => Tensor::from_vec(out, (n, heads.q * heads.dim), device).map(Some),
        None => Ok(None),
    }
}

/// On a GPU, the rest of [`attention`] from the fused projection's output `qkv`
/// (`[tokens, (heads + 2 * kv_heads) * head_dim]`): q and k normalized per head (where the model
/// has per-head norms) and rotated, k and v written into the cache, and paged attention (over the
/// window in a sliding-window layer) — in a decode step all in the attention kernel
/// (`KvCache::attend_fresh`), otherwise one kernel for the first three, then attention. `None` when the layer's cache or the step's device
/// metadata is not on a GPU, or rotary turns only part of each head.
#[cfg(feature = "cuda")]
pub fn attend_projected(
    qkv: &Tensor,
    proj: &QkvProj,
    layer: usize,
    rotary: &RotaryRows,
    batch: &ForwardBatch<'_>,
    kv: &mut KvCache,
    heads: Heads,
) -> Option<candle_core::Result<Tensor>> {
    let (Some(caches), Some(dm)) = (kv.device_layer(layer), &batch.attention.device) else {
        return None;
    };
    if rotary.dims() < heads.dim {
        // The kernel turns whole heads; partial rotary goes through `RotaryRows::apply`.
        return None;
    }
    let x = rotary.qkv_rope(qkv, (heads.q, heads.kv), proj.head_norms());
    match kv.attend_fresh(layer, &x, &batch.attention, heads.scale, heads.window) {
        Ok(Some(out)) => return Some(Ok(out)),
        Ok(None) => {}
        Err(e) => return Some(Err(e)),
    }
    let slots = dm.tables(heads.window.is_some()).0;
    // SAFETY: the indices come from the scheduler's plan (ForwardBatch): block ids below the
    // cache's num_blocks, distinct slots within a step, contexts within each block-table row.
    let q = match unsafe { pagewise_kernels::rope_qkv_cache(&x, caches, slots) } {
        Ok(q) => q,
        Err(e) => return Some(Err(e)),
    };
    Some(kv.attend_written(layer, &q, &batch.attention, heads.scale, heads.window))
}
