//! The Llama family (Llama 2/3/3.1/3.2, SmolLM/SmolLM2, Mistral, Qwen2/2.5, Qwen3, Phi-3/4, and
//! the mixtures of experts Mixtral and Qwen3-MoE) on the paged KV cache.

use candle_core::Tensor;

use super::attention::KvCache;
use super::batch::ForwardBatch;
use super::config::ModelConfig;
#[cfg(feature = "cuda")]
use super::decode_fused;
use super::embedding::TokenEmbedding;
use super::layers::{GatedMlp, Linear};
use super::lm_head::LmHead;
use super::moe::SparseMoe;
use super::norm::RmsNorm;
use super::qkv::{Heads, QkvProj, attention, o_proj};
use super::rotary::Rotary;
use super::weights::Weights;
use super::{CausalLm, ModelError};
use crate::parallel::{Parallel, TpRank};

pub mod archs;

struct DecoderLayer {
    input_norm: RmsNorm,
    qkv: QkvProj,
    o: Linear,
    post_norm: RmsNorm,
    mlp: Mlp,
}

/// A layer's MLP: dense, or a mixture of experts (Mixtral, Qwen3-MoE).
enum Mlp {
    Dense(GatedMlp),
    Sparse(SparseMoe),
}

impl Mlp {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        match self {
            Mlp::Dense(m) => m.forward(x),
            Mlp::Sparse(m) => m.forward(x),
        }
    }
}

/// A Llama-family causal LM, whole or one tensor-parallel rank's shard of it (its query and KV
/// heads, its intermediate features and, when the vocabulary splits evenly, its rows of the LM
/// head; the embedding and the norms are replicated).
pub struct Llama {
    cfg: ModelConfig,
    embed: TokenEmbedding,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    lm_head: LmHead,
    rotary: Rotary,
    par: Parallel,
}

impl Llama {
    /// Loads the model (`par`'s shard of it); rotary tables cover positions below `max_len`.
    pub fn load(
        cfg: &ModelConfig,
        w: &Weights,
        max_len: usize,
        par: &Parallel,
    ) -> Result<Self, ModelError> {
        let h = cfg.hidden_size;
        let tp = par.rank;
        let embed = TokenEmbedding::load(w, cfg.vocab_size, h)?;
        let tied = cfg.tie_word_embeddings || !w.contains("lm_head.weight");
        let lm_head = LmHead::load(w, cfg, &embed, tied, tp)?;
        let layers = (0..cfg.num_hidden_layers)
            .map(|i| {
                let p = format!("model.layers.{i}");
                let attn = format!("{p}.self_attn");
                #[allow(unused_mut)]
                let mut layer = DecoderLayer {
                    input_norm: RmsNorm::load(
                        w,
                        &format!("{p}.input_layernorm.weight"),
                        h,
                        cfg.norm_eps,
                    )?,
                    qkv: QkvProj::load(w, &attn, cfg, tp)?,
                    o: o_proj(w, &attn, cfg, tp)?,
                    post_norm: RmsNorm::load(
                        w,
                        &format!("{p}.post_attention_layernorm.weight"),
                        h,
                        cfg.norm_eps,
                    )?,
                    mlp: match &cfg.moe {
                        Some(moe) if moe.sparse[i] => {
                            Mlp::Sparse(SparseMoe::load(w, i, h, moe, par.experts())?)
                        }
                        _ => Mlp::Dense(GatedMlp::load(w, &format!("{p}.mlp"), cfg, tp)?),
                    },
                };
                // (Experts take the fused decode path on one rank only: `fused_layers`.)
                #[cfg(feature = "cuda")]
                if let (Mlp::Sparse(moe), Some(o), 1) =
                    (&mut layer.mlp, layer.o.dense_weight(), tp.size)
                {
                    moe.fold_router(o, &layer.post_norm)?;
                }
                Ok(layer)
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        Ok(Llama {
            cfg: cfg.clone(),
            embed,
            layers,
            norm: RmsNorm::load(w, "model.norm.weight", h, cfg.norm_eps)?,
            lm_head,
            rotary: Rotary::new(cfg, max_len, w.dtype(), w.device())?,
            par: par.clone(),
        })
    }
}

impl CausalLm for Llama {
    fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    #[cfg(feature = "cuda")]
    fn fused_decode_rows(&self, kv: &KvCache) -> usize {
        let w = self.norm.weight();
        decode_fused::most_rows(|rows| self.fused_layers(rows, w.dtype(), w.device(), kv).is_some())
    }

    fn graph_batch_limit(&self) -> Option<usize> {
        self.layers
            .iter()
            .filter_map(|l| match &l.mlp {
                Mlp::Sparse(m) => Some(m.device_tokens()),
                Mlp::Dense(_) => None,
            })
            .min()
    }

    fn tp_rank(&self) -> TpRank {
        self.par.rank
    }

    fn forward(&self, batch: &ForwardBatch<'_>, kv: &mut KvCache) -> Result<Tensor, ModelError> {
        Ok(self
            .forward_native(batch, kv)?
            .to_dtype(candle_core::DType::F32)?)
    }

    fn forward_native(
        &self,
        batch: &ForwardBatch<'_>,
        kv: &mut KvCache,
    ) -> Result<Tensor, ModelError> {
        Ok(self.run(batch, kv, None)?.0)
    }

    fn forward_keeping(
        &self,
        batch: &ForwardBatch<'_>,
        kv: &mut KvCache,
        layers: &[usize],
    ) -> Result<(Tensor, Tensor), ModelError> {
        if let Some(&bad) = layers.iter().find(|&&l| l >= self.layers.len()) {
            return Err(ModelError::Unsupported(format!(
                "no layer {bad} to keep the hidden states of ({} layers)",
                self.layers.len()
            )));
        }
        let (logits, kept) = self.run(batch, kv, Some(layers))?;
        Ok((logits, kept.expect("kept when asked")))
    }

    fn token_embedding(&self) -> Option<&TokenEmbedding> {
        Some(&self.embed)
    }
}

impl Llama {
    /// The forward pass: the sampled rows' logits (model dtype) and, when `keep` names layers,
    /// the residual streams entering them, concatenated (see [`CausalLm::forward_keeping`]).
    fn run(
        &self,
        batch: &ForwardBatch<'_>,
        kv: &mut KvCache,
        keep: Option<&[usize]>,
    ) -> Result<(Tensor, Option<Tensor>), ModelError> {
        let cfg = &self.cfg;
        let tp = self.par.rank;
        let heads = Heads {
            q: cfg.q_heads(tp).len(),
            kv: cfg.kv_heads(tp).len(),
            dim: cfg.head_dim,
            scale: 1.0 / (cfg.head_dim as f32).sqrt(),
            window: None,
        };
        let mut x = self.embed.forward(&batch.input_ids)?;
        let mut kept: Vec<Option<Tensor>> = vec![None; keep.map_or(0, <[usize]>::len)];
        // The residual stream entering layer i, into the slots that ask for it.
        let mut keep_at = |i: usize, x: &Tensor| {
            for (slot, _) in kept
                .iter_mut()
                .zip(keep.unwrap_or(&[]))
                .filter(|(_, l)| **l == i)
            {
                *slot = Some(x.clone());
            }
        };
        #[cfg(feature = "cuda")]
        if batch.attention.device.is_some()
            && let Some(layers) = self.fused_layers(x.dim(0)?, x.dtype(), x.device(), kv)
        {
            for (i, layer) in layers.iter().enumerate() {
                keep_at(i, &x);
                let attn =
                    decode_fused::attention(&x, &layer.attn, i, &self.rotary, batch, kv, heads)?;
                x = decode_fused::finish_layer(&x, &attn, layer, &self.par)?;
            }
            let logits = self.logits(&self.norm.forward(&x)?, batch)?;
            return Ok((logits, concat_kept(keep, kept)?));
        }
        let rotary = self.rotary.at(&batch.positions)?;
        // `h` is the normalized residual stream entering the next block: each residual add is
        // fused with the norm that follows it (the next layer's input norm, or the final norm).
        let mut h = match self.layers.first() {
            Some(first) => first.input_norm.forward(&x)?,
            None => self.norm.forward(&x)?,
        };
        for (i, layer) in self.layers.iter().enumerate() {
            keep_at(i, &x);
            let attn = attention(&layer.qkv, i, &h, &rotary, batch, kv, heads)?;
            let o = self.par.all_reduce(layer.o.forward(&attn)?)?;
            let (x_mid, h_mid) = layer.post_norm.add_forward(&x, &o)?;
            let next_norm = self.layers.get(i + 1).map_or(&self.norm, |l| &l.input_norm);
            let mlp = self.par.all_reduce(layer.mlp.forward(&h_mid)?)?;
            (x, h) = next_norm.add_forward(&x_mid, &mlp)?;
        }
        drop(x);
        Ok((self.logits(&h, batch)?, concat_kept(keep, kept)?))
    }

    /// The logits (model dtype) of the rows of the normalized stream `h` that sample. When every
    /// row samples (a decode step), the rows are already in order and need no gather. A
    /// vocabulary-parallel head's parts are gathered from the ranks.
    fn logits(&self, h: &Tensor, batch: &ForwardBatch<'_>) -> Result<Tensor, ModelError> {
        self.lm_head.forward(&batch.sampled(h)?, &self.par)
    }

    /// The layers' weights for the fused decode path, when it takes a step of `rows` rows in
    /// `dtype` on `device` (src/model/decode_fused.rs).
    #[cfg(feature = "cuda")]
    fn fused_layers(
        &self,
        rows: usize,
        dtype: candle_core::DType,
        device: &candle_core::Device,
        kv: &KvCache,
    ) -> Option<Vec<decode_fused::FusedLayer<'_>>> {
        // The fused kernels turn whole heads: partial rotary (Phi-4-mini) takes the other path.
        if self.cfg.rotary_dim() < self.cfg.head_dim {
            return None;
        }
        let layers = self
            .layers
            .iter()
            .enumerate()
            .map(|(i, l)| {
                kv.device_layer(i)?;
                let mlp = match &l.mlp {
                    Mlp::Dense(mlp) => {
                        let (gate_up, down) = mlp.gemv_weights()?;
                        decode_fused::FusedMlp::Dense { gate_up, down }
                    }
                    // (Experts are not split across ranks.)
                    Mlp::Sparse(moe) if self.par.rank.size == 1 => {
                        moe.fused_router()?;
                        decode_fused::FusedMlp::Sparse(moe)
                    }
                    Mlp::Sparse(_) => return None,
                };
                Some(decode_fused::FusedLayer {
                    attn: decode_fused::FusedAttention {
                        input_norm: &l.input_norm,
                        qkv: l.qkv.gemv_weight()?,
                        head_norms: l.qkv.head_norms(),
                    },
                    o: l.o.gemv_weight()?,
                    post_norm: &l.post_norm,
                    mlp,
                })
            })
            .collect::<Option<Vec<_>>>()?;
        decode_fused::fits(rows, dtype, device, &layers).then_some(layers)
    }
}

/// The kept streams side by side, `[tokens, layers * hidden]`, when `keep` asked for some.
fn concat_kept(
    keep: Option<&[usize]>,
    kept: Vec<Option<Tensor>>,
) -> candle_core::Result<Option<Tensor>> {
    match keep {
        Some(_) => {
            let parts: Vec<Tensor> = kept.into_iter().flatten().collect();
            Tensor::cat(&parts, 1).map(Some)
        }
        None => Ok(None),
    }
}
