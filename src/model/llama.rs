//! The Llama family (Llama 2/3/3.1/3.2, SmolLM/SmolLM2, Mistral, Qwen2/2.5) on the paged KV cache.

use candle_core::{Module, Tensor};
use candle_nn::Embedding;

use super::attention::KvCache;
use super::batch::ForwardBatch;
use super::config::ModelConfig;
#[cfg(feature = "cuda")]
use super::decode_fused;
use super::layers::{GatedMlp, Linear, Rotary};
use super::norm::RmsNorm;
use super::qkv::{Heads, QkvProj, attention};
use super::weights::Weights;
use super::{CausalLm, ModelError};

struct DecoderLayer {
    input_norm: RmsNorm,
    qkv: QkvProj,
    o: Linear,
    post_norm: RmsNorm,
    mlp: GatedMlp,
}

/// A Llama-family causal LM.
pub struct Llama {
    cfg: ModelConfig,
    embed: Embedding,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    lm_head: Linear,
    rotary: Rotary,
}

impl Llama {
    /// Loads the model; rotary tables cover positions below `max_len`.
    pub fn load(cfg: &ModelConfig, w: &Weights, max_len: usize) -> Result<Self, ModelError> {
        let (h, d, nq) = (cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads);
        let embed_w = w.tensor("model.embed_tokens.weight", (cfg.vocab_size, h))?;
        let lm_head = if cfg.tie_word_embeddings || !w.contains("lm_head.weight") {
            match w {
                Weights::Gguf { .. } => w.linear("model.embed_tokens", h, cfg.vocab_size, false)?,
                Weights::Dense(_) => Linear::dense(embed_w.clone(), None),
            }
        } else {
            w.linear("lm_head", h, cfg.vocab_size, false)?
        };
        let layers = (0..cfg.num_hidden_layers)
            .map(|i| {
                let p = format!("model.layers.{i}");
                let attn = format!("{p}.self_attn");
                Ok(DecoderLayer {
                    input_norm: RmsNorm::load(
                        w,
                        &format!("{p}.input_layernorm.weight"),
                        h,
                        cfg.norm_eps,
                    )?,
                    qkv: QkvProj::load(w, &attn, cfg)?,
                    o: w.linear(&format!("{attn}.o_proj"), nq * d, h, cfg.o_bias)?,
                    post_norm: RmsNorm::load(
                        w,
                        &format!("{p}.post_attention_layernorm.weight"),
                        h,
                        cfg.norm_eps,
                    )?,
                    mlp: GatedMlp::load(w, &format!("{p}.mlp"), cfg)?,
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        Ok(Llama {
            cfg: cfg.clone(),
            embed: Embedding::new(embed_w, h),
            layers,
            norm: RmsNorm::load(w, "model.norm.weight", h, cfg.norm_eps)?,
            lm_head,
            rotary: Rotary::new(cfg, max_len, w.dtype(), w.device())?,
        })
    }
}

impl CausalLm for Llama {
    fn config(&self) -> &ModelConfig {
        &self.cfg
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
        let cfg = &self.cfg;
        let heads = Heads {
            q: cfg.num_attention_heads,
            kv: cfg.num_key_value_heads,
            dim: cfg.head_dim,
            scale: 1.0 / (cfg.head_dim as f32).sqrt(),
        };
        let mut x = self.embed.forward(&batch.input_ids)?;
        #[cfg(feature = "cuda")]
        if let Some(layers) = self.fused_layers(&x, batch, kv) {
            decode_fused::count_step();
            for (i, layer) in layers.iter().enumerate() {
                let attn = decode_fused::attention(&x, layer, i, &self.rotary, batch, kv, heads)?;
                x = decode_fused::finish_layer(&x, &attn, layer)?;
            }
            return self.logits(&self.norm.forward(&x)?, batch);
        }
        let rotary = self.rotary.at(&batch.positions)?;
        // `h` is the normalized residual stream entering the next block: each residual add is
        // fused with the norm that follows it (the next layer's input norm, or the final norm).
        let mut h = match self.layers.first() {
            Some(first) => first.input_norm.forward(&x)?,
            None => self.norm.forward(&x)?,
        };
        for (i, layer) in self.layers.iter().enumerate() {
            let attn = attention(&layer.qkv, i, &h, &rotary, batch, kv, heads)?;
            let (x_mid, h_mid) = layer.post_norm.add_forward(&x, &layer.o.forward(&attn)?)?;
            let next_norm = self.layers.get(i + 1).map_or(&self.norm, |l| &l.input_norm);
            (x, h) = next_norm.add_forward(&x_mid, &layer.mlp.forward(&h_mid)?)?;
        }
        drop(x);
        self.logits(&h, batch)
    }
}

impl Llama {
    /// The logits (model dtype) of the rows of the normalized stream `h` that sample. When every
    /// row samples (a decode step), the rows are already in order and need no gather.
    fn logits(&self, h: &Tensor, batch: &ForwardBatch<'_>) -> Result<Tensor, ModelError> {
        if batch.num_sample_rows == h.dim(0)? {
            return Ok(self.lm_head.forward(h)?);
        }
        let last = h.index_select(&batch.sample_rows, 0)?;
        Ok(self.lm_head.forward(&last)?)
    }

    /// The layers' weights for the fused decode path, when it is switched on and takes this step
    /// (src/model/decode_fused.rs).
    #[cfg(feature = "cuda")]
    fn fused_layers(
        &self,
        x: &Tensor,
        batch: &ForwardBatch<'_>,
        kv: &KvCache,
    ) -> Option<Vec<decode_fused::FusedLayer<'_>>> {
        if !decode_fused::enabled() || batch.attention.device.is_none() {
            return None;
        }
        let layers = self
            .layers
            .iter()
            .enumerate()
            .map(|(i, l)| {
                kv.device_layer(i)?;
                let (gate_up, down) = l.mlp.dense_weights()?;
                Some(decode_fused::FusedLayer {
                    input_norm: &l.input_norm,
                    qkv: l.qkv.dense_weight()?,
                    o: l.o.dense_weight()?,
                    post_norm: &l.post_norm,
                    gate_up,
                    down,
                })
            })
            .collect::<Option<Vec<_>>>()?;
        decode_fused::fits(x, &layers).then_some(layers)
    }
}
