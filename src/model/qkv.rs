//! The attention block's input: q/k/v projections (dense weights fused into one matmul), rotary
//! embedding and the KV-cache write, then paged attention. On a GPU with fused weights one kernel
//! rotates q and k and writes k and v into the cache straight from the fused projection.

use candle_core::Tensor;

use super::ModelError;
use super::attention::KvCache;
use super::batch::ForwardBatch;
use super::config::ModelConfig;
use super::layers::{Linear, RotaryRows};
use super::weights::{Part, Weights};
use crate::parallel::{TpRank, head_rows};

/// The q, k and v projections of one layer.
pub enum QkvProj {
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
        let q_rows = Part::Rows(head_rows(&tp.q_heads(cfg), d));
        let kv_rows = Part::Rows(head_rows(&tp.kv_heads(cfg), d));
        let q = w.linear_part(&format!("{prefix}.q_proj"), (h, nq * d), b, q_rows)?;
        let k = w.linear_part(
            &format!("{prefix}.k_proj"),
            (h, nkv * d),
            b,
            kv_rows.clone(),
        )?;
        let v = w.linear_part(&format!("{prefix}.v_proj"), (h, nkv * d), b, kv_rows)?;
        Ok(match Linear::concat(&[&q, &k, &v])? {
            Some(fused) => QkvProj::Fused(fused),
            None => QkvProj::Split(q, k, v),
        })
    }

    /// The fused weight, when dense without a bias.
    pub fn dense_weight(&self) -> Option<&Tensor> {
        match self {
            QkvProj::Fused(l) => l.dense_weight(),
            QkvProj::Split(..) => None,
        }
    }
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
    let n = h.dim(0)?;
    let (q, k, v) = match proj {
        QkvProj::Fused(linear) => {
            let qkv = linear.forward(h)?;
            #[cfg(feature = "cuda")]
            if let Some(out) = attend_projected(&qkv, layer, rotary, batch, kv, heads) {
                return out;
            }
            let (qw, kvw) = (heads.q * heads.dim, heads.kv * heads.dim);
            (
                qkv.narrow(1, 0, qw)?.contiguous()?,
                qkv.narrow(1, qw, kvw)?.contiguous()?,
                qkv.narrow(1, qw + kvw, kvw)?.contiguous()?,
            )
        }
        QkvProj::Split(q, k, v) => (q.forward(h)?, k.forward(h)?, v.forward(h)?),
    };
    let q = rotary.apply(&q.reshape((n, heads.q, heads.dim))?)?;
    let k = rotary.apply(&k.reshape((n, heads.kv, heads.dim))?)?;
    let v = v.reshape((n, heads.kv, heads.dim))?;
    kv.attend(layer, &q, &k, &v, &batch.attention, heads.scale)
}

/// On a GPU, the rest of [`attention`] from the fused projection's output `qkv`
/// (`[tokens, (heads + 2 * kv_heads) * head_dim]`): one kernel rotates q and k and writes k and v
/// into the cache, then paged attention. `None` when the layer's cache or the step's device
/// metadata is not on a GPU.
#[cfg(feature = "cuda")]
pub fn attend_projected(
    qkv: &Tensor,
    layer: usize,
    rotary: &RotaryRows,
    batch: &ForwardBatch<'_>,
    kv: &mut KvCache,
    heads: Heads,
) -> Option<candle_core::Result<Tensor>> {
    let (Some(caches), Some(dm)) = (kv.device_layer(layer), &batch.attention.device) else {
        return None;
    };
    let q = match rotary.apply_qkv_and_cache(qkv, heads.q, heads.kv, caches, &dm.slot_mapping) {
        Ok(q) => q,
        Err(e) => return Some(Err(e)),
    };
    Some(kv.attend_written(layer, &q, &batch.attention, heads.scale))
}
