//! Google's Gemma 3 (text; `Gemma3ForCausalLM`): RMSNorms that scale by `1 + w`, before and
//! after both the attention and the MLP; q/k norms; GeGLU; the embedding scaled by √hidden;
//! scores scaled by `query_pre_attn_scalar^-½`; local layers attending over a sliding window with
//! their own rotary base, between global layers (linear rope scaling on the global ones only);
//! optional final logit softcapping.

use candle_core::Tensor;

use super::attention::KvCache;
use super::batch::ForwardBatch;
use super::config::{ArchSettings, ModelConfig};
use super::embedding::TokenEmbedding;
use super::layers::{GatedMlp, Linear};
use super::lm_head::LmHead;
use super::norm::RmsNorm;
use super::qkv::{Heads, QkvProj, attention, o_proj};
use super::rotary::Rotary;
use super::weights::Weights;
use super::{CausalLm, ModelError};
use crate::parallel::{Parallel, TpRank};

pub mod config;
#[cfg(feature = "cuda")]
mod fused;

pub use config::GemmaSettings;

struct Layer {
    input_norm: RmsNorm,
    qkv: QkvProj,
    o: Linear,
    post_attention_norm: RmsNorm,
    pre_feedforward_norm: RmsNorm,
    post_feedforward_norm: RmsNorm,
    mlp: GatedMlp,
    sliding: bool,
}

/// A Gemma 3 text model, or one tensor-parallel rank's shard of it: heads and the MLP's
/// intermediate features split as Llama's are, the norms (after o and after the MLP, on the
/// summed outputs) replicated, the LM head split by vocabulary rows when they divide.
pub struct Gemma3 {
    cfg: ModelConfig,
    gemma: GemmaSettings,
    /// Positions a local layer's query sees.
    window: usize,
    embed: TokenEmbedding,
    layers: Vec<Layer>,
    norm: RmsNorm,
    lm_head: LmHead,
    global: Rotary,
    local: Rotary,
    par: Parallel,
}

impl Gemma3 {
    /// Loads the model (`par`'s shard of it); rotary tables cover positions below `max_len`.
    pub fn load(
        cfg: &ModelConfig,
        w: &Weights,
        max_len: usize,
        par: &Parallel,
    ) -> Result<Self, ModelError> {
        let (ArchSettings::Gemma3(gemma), Some(sliding)) = (&cfg.settings, &cfg.sliding) else {
            return Err(ModelError::Config("Gemma 3 without its settings".into()));
        };
        let (gemma, window) = (gemma.clone(), sliding.window);
        let h = cfg.hidden_size;
        let eps = cfg.norm_eps;
        let norm = |name: &str| match cfg.norms_plus_one {
            true => RmsNorm::load_plus_one(w, name, h, eps),
            false => RmsNorm::load(w, name, h, eps),
        };
        // llama.cpp's converter names the norm after attention its own way (its `ffn_norm` is the
        // one before the MLP).
        let gguf = matches!(w, Weights::Gguf { .. });
        let post_attention = match gguf {
            true => "post_attention_norm",
            false => "post_attention_layernorm",
        };
        let tp = par.rank;
        let embed = TokenEmbedding::load(w, cfg.vocab_size, h)?;
        let tied = cfg.tie_word_embeddings || !w.contains("lm_head.weight");
        let lm_head = LmHead::load(w, cfg, &embed, tied, tp)?;
        let layers = (0..cfg.num_hidden_layers)
            .map(|i| {
                let p = format!("model.layers.{i}");
                let attn = format!("{p}.self_attn");
                Ok(Layer {
                    input_norm: norm(&format!("{p}.input_layernorm.weight"))?,
                    qkv: QkvProj::load(w, &attn, cfg, tp)?,
                    o: o_proj(w, &attn, cfg, tp)?,
                    post_attention_norm: norm(&format!("{p}.{post_attention}.weight"))?,
                    pre_feedforward_norm: norm(&format!("{p}.pre_feedforward_layernorm.weight"))?,
                    post_feedforward_norm: norm(&format!("{p}.post_feedforward_layernorm.weight"))?,
                    mlp: GatedMlp::load(w, &format!("{p}.mlp"), cfg, tp)?,
                    sliding: sliding.sliding[i],
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        let (dtype, device) = (w.dtype(), w.device());
        let global = Rotary::with_base(
            cfg,
            cfg.rope_theta,
            gemma.global_rope_factor,
            max_len,
            dtype,
            device,
        )?;
        let local = Rotary::with_base(cfg, gemma.local_rope_theta, 1.0, max_len, dtype, device)?;
        Ok(Gemma3 {
            cfg: cfg.clone(),
            gemma,
            window,
            embed,
            layers,
            norm: norm("model.norm.weight")?,
            lm_head,
            global,
            local,
            par: par.clone(),
        })
    }
}

impl CausalLm for Gemma3 {
    fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    #[cfg(feature = "cuda")]
    fn fused_decode_rows(&self, kv: &KvCache) -> usize {
        let w = self.norm.weight();
        crate::model::decode_fused::most_rows(|rows| {
            self.fused_layers(rows, w.dtype(), w.device(), kv).is_some()
        })
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
        let cfg = &self.cfg;
        let g = &self.gemma;
        let tp = self.par.rank;
        let heads = |sliding: bool| Heads {
            q: cfg.q_heads(tp).len(),
            kv: cfg.kv_heads(tp).len(),
            dim: cfg.head_dim,
            scale: g.query_pre_attn_scalar.powf(-0.5) as f32,
            window: sliding.then_some(self.window),
        };
        let embedded = self.embed.forward(&batch.input_ids)?;
        // transformers rounds √hidden to the model's dtype before the product.
        let scale = Tensor::new((cfg.hidden_size as f32).sqrt(), embedded.device())?
            .to_dtype(embedded.dtype())?;
        let mut x = embedded.broadcast_mul(&scale)?;
        #[cfg(feature = "cuda")]
        if batch.attention.device.is_some()
            && let Some(layers) = self.fused_layers(x.dim(0)?, x.dtype(), x.device(), kv)
        {
            let (stream, last) = self.forward_fused(x, &layers, batch, kv, heads)?;
            return self.logits_after_add(stream, last, batch);
        }
        let (global, local) = (
            self.global.at(&batch.positions)?,
            self.local.at(&batch.positions)?,
        );
        for (i, layer) in self.layers.iter().enumerate() {
            let rotary = if layer.sliding { &local } else { &global };
            let h = layer.input_norm.forward(&x)?;
            let attn = attention(&layer.qkv, i, &h, rotary, batch, kv, heads(layer.sliding))?;
            // The norms after o and after the MLP take the ranks' summed outputs.
            let o = self.par.all_reduce(layer.o.forward(&attn)?)?;
            let x_mid = layer.post_attention_norm.add_normed(&x, &o)?;
            let mlp = layer
                .mlp
                .forward(&layer.pre_feedforward_norm.forward(&x_mid)?)?;
            let mlp = self.par.all_reduce(mlp)?;
            x = layer.post_feedforward_norm.add_normed(&x_mid, &mlp)?;
        }
        self.logits(&self.norm.forward(&x)?, batch)
    }
}

impl Gemma3 {
    /// The logits of the rows of the normalized stream `h` that sample, softcapped where the
    /// model says.
    fn logits(&self, h: &Tensor, batch: &ForwardBatch<'_>) -> Result<Tensor, ModelError> {
        self.softcapped(self.lm_head.forward(&batch.sampled(h)?, &self.par)?)
    }

    /// `logits`, softcapped where the model says.
    fn softcapped(&self, logits: Tensor) -> Result<Tensor, ModelError> {
        Ok(match self.gemma.final_logit_softcapping {
            Some(c) => ((logits / c)?.tanh()? * c)?,
            None => logits,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#""vocab_size":10,"hidden_size":8,"intermediate_size":16,
        "num_hidden_layers":12,"num_attention_heads":2,"num_key_value_heads":1,"head_dim":4,
        "max_position_embeddings":131072"#;

    fn parse(extra: &str) -> Result<ModelConfig, ModelError> {
        ModelConfig::from_hf_json(&format!(
            r#"{{"architectures":["Gemma3ForCausalLM"],{BASE}{extra}}}"#
        ))
    }

    /// The pre-transformers-5 spelling: a pattern of 6 (five local layers, then a global one),
    /// `rope_scaling` for the global layers, `rope_local_base_freq` for the local ones.
    #[test]
    fn older_configs_give_the_layer_pattern_and_both_rotary_settings() {
        let c = parse(
            r#","sliding_window":512,"sliding_window_pattern":6,"rope_theta":1000000.0,
            "rope_scaling":{"rope_type":"linear","factor":8.0},"rope_local_base_freq":10000.0"#,
        )
        .unwrap();
        let ArchSettings::Gemma3(g) = &c.settings else {
            panic!("{:?}", c.settings)
        };
        let globals: Vec<usize> = (0..12)
            .filter(|&i| !c.sliding.as_ref().unwrap().sliding[i])
            .collect();
        assert_eq!(globals, [5, 11]);
        assert_eq!((c.rope_theta, g.global_rope_factor), (1e6, 8.0));
        assert_eq!((g.local_rope_theta, g.query_pre_attn_scalar), (1e4, 256.0));
        assert!(c.tie_word_embeddings && c.qk_norm && c.rope_scaling.is_none());
        assert_eq!(c.max_position_embeddings, 131072, "windows are not a cap");
    }

    #[test]
    fn what_is_not_implemented_is_refused_by_name() {
        for (extra, what) in [
            (r#","attn_logit_softcapping":50.0"#, "softcapping"),
            (r#","hidden_activation":"relu""#, "relu"),
            (r#","use_bidirectional_attention":true"#, "bidirectional"),
            (
                r#","rope_scaling":{"rope_type":"yarn","factor":4.0}"#,
                "yarn",
            ),
            (r#","layer_types":["full_attention"]"#, "layer_types"),
        ] {
            let err = parse(extra).unwrap_err().to_string();
            assert!(err.contains(what), "{extra}: {err}");
        }
        let multimodal = ModelConfig::from_hf_json(&format!(
            r#"{{"architectures":["Gemma3ForConditionalGeneration"],{BASE}}}"#
        ))
        .unwrap_err();
        assert!(
            multimodal
                .to_string()
                .contains("Gemma3ForConditionalGeneration")
        );
    }
}
