//! Meta's OPT (`facebook/opt-*`, the vLLM quick start's model) on the paged KV cache: learned
//! positions offset by 2, pre- or post-LayerNorm (`do_layer_norm_before`), ReLU MLP, and
//! `project_in` / `project_out` when the embedding width differs from the hidden size.

use candle_core::{Module, Tensor};
use candle_nn::{Embedding, LayerNorm};

use super::attention::KvCache;
use super::batch::ForwardBatch;
use serde::Deserialize;

use super::config::{ArchSettings, ModelConfig};
use super::hf_config::HfConfig;
use super::layers::{Linear, layer_norm};
use super::registry::{Arch, Rope, Supports};
use super::weights::Weights;
use super::{CausalLm, ModelError};

/// Meta's OPT.
pub static OPT: Arch = Arch {
    name: "OPT",
    hf_names: &["OPTForCausalLM", "opt"],
    gguf_names: &[],
    supports: Supports {
        tensor_parallel: false,
        sliding_window: false,
        rope: Rope::Full,
        quantization: &[],
    },
    from_hf,
    from_gguf: Arch::shared_gguf_only,
    build: |cfg, w, _, _| -> Result<Box<dyn CausalLm>, ModelError> {
        Ok(Box::new(Opt::load(cfg, w)?))
    },
};

/// OPT-only settings.
#[derive(Clone, Debug, PartialEq)]
pub struct OptSettings {
    /// Embedding width; `project_in`/`project_out` map it to and from `hidden_size` when different.
    pub word_embed_proj_dim: usize,
    /// Pre-norm (true for all OPT sizes but 350m).
    pub do_layer_norm_before: bool,
    /// Whether the final layer norm exists.
    pub has_final_layer_norm: bool,
}

/// The `config.json` fields only OPT has.
#[derive(Deserialize)]
struct OptFields {
    word_embed_proj_dim: Option<usize>,
    do_layer_norm_before: Option<bool>,
    activation_function: Option<String>,
    enable_bias: Option<bool>,
    _remove_final_layer_norm: Option<bool>,
}

/// OPT from `config.json`: ReLU, biases everywhere, the head tied to the embedding.
fn from_hf(cfg: &mut ModelConfig, c: &HfConfig) -> Result<(), ModelError> {
    let f: OptFields = c.fields()?;
    if f.activation_function
        .as_deref()
        .is_some_and(|a| a != "relu")
    {
        return Err(ModelError::Unsupported(format!(
            "OPT activation {:?}",
            f.activation_function
        )));
    }
    if f.enable_bias == Some(false) {
        return Err(ModelError::Unsupported("OPT without biases".to_string()));
    }
    cfg.norm_eps = c.rms_norm_eps.unwrap_or(1e-5);
    cfg.tie_word_embeddings = true;
    (cfg.qkv_bias, cfg.o_bias, cfg.mlp_bias) = (true, true, true);
    let pre_norm = f.do_layer_norm_before.unwrap_or(true);
    cfg.settings = ArchSettings::Opt(OptSettings {
        word_embed_proj_dim: f.word_embed_proj_dim.unwrap_or(c.hidden_size),
        do_layer_norm_before: pre_norm,
        has_final_layer_norm: pre_norm && !f._remove_final_layer_norm.unwrap_or(false),
    });
    Ok(())
}

/// OPT's learned position table starts at row 2 (rows 0 and 1 are padding legacy).
const POSITION_OFFSET: u32 = 2;

struct DecoderLayer {
    attn_norm: LayerNorm,
    q: Linear,
    k: Linear,
    v: Linear,
    out: Linear,
    mlp_norm: LayerNorm,
    fc1: Linear,
    fc2: Linear,
}

/// An OPT causal LM.
pub struct Opt {
    cfg: ModelConfig,
    pre_norm: bool,
    embed_tokens: Embedding,
    embed_tokens_weight: Tensor,
    embed_positions: Embedding,
    project_in: Option<Linear>,
    project_out: Option<Linear>,
    final_norm: Option<LayerNorm>,
    layers: Vec<DecoderLayer>,
}

impl Opt {
    /// Loads the model (tensor names with or without the leading `model.`).
    pub fn load(cfg: &ModelConfig, w: &Weights) -> Result<Self, ModelError> {
        let ArchSettings::Opt(opt) = &cfg.settings else {
            return Err(ModelError::Config("OPT settings missing".into()));
        };
        let root = if w.contains("decoder.embed_tokens.weight")
            && !w.contains("model.decoder.embed_tokens.weight")
        {
            "decoder"
        } else {
            "model.decoder"
        };
        let (h, e, eps) = (cfg.hidden_size, opt.word_embed_proj_dim, cfg.norm_eps);
        let embed_w = w.tensor(&format!("{root}.embed_tokens.weight"), (cfg.vocab_size, e))?;
        let num_pos = cfg.max_position_embeddings + POSITION_OFFSET as usize;
        let pos_w = w.tensor(&format!("{root}.embed_positions.weight"), (num_pos, h))?;
        let (project_in, project_out) = if e != h {
            (
                Some(w.linear(&format!("{root}.project_in"), e, h, false)?),
                Some(w.linear(&format!("{root}.project_out"), h, e, false)?),
            )
        } else {
            (None, None)
        };
        let final_norm = if opt.has_final_layer_norm {
            Some(layer_norm(w, &format!("{root}.final_layer_norm"), h, eps)?)
        } else {
            None
        };
        let layers = (0..cfg.num_hidden_layers)
            .map(|i| {
                let p = format!("{root}.layers.{i}");
                let lin = |name: &str, i, o| w.linear(&format!("{p}.{name}"), i, o, true);
                Ok(DecoderLayer {
                    attn_norm: layer_norm(w, &format!("{p}.self_attn_layer_norm"), h, eps)?,
                    q: lin("self_attn.q_proj", h, h)?,
                    k: lin("self_attn.k_proj", h, h)?,
                    v: lin("self_attn.v_proj", h, h)?,
                    out: lin("self_attn.out_proj", h, h)?,
                    mlp_norm: layer_norm(w, &format!("{p}.final_layer_norm"), h, eps)?,
                    fc1: lin("fc1", h, cfg.intermediate_size)?,
                    fc2: lin("fc2", cfg.intermediate_size, h)?,
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        Ok(Opt {
            cfg: cfg.clone(),
            pre_norm: opt.do_layer_norm_before,
            embed_tokens: Embedding::new(embed_w.clone(), e),
            embed_tokens_weight: embed_w,
            embed_positions: Embedding::new(pos_w, h),
            project_in,
            project_out,
            final_norm,
            layers,
        })
    }
}

impl CausalLm for Opt {
    fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    fn forward(&self, batch: &ForwardBatch<'_>, kv: &mut KvCache) -> Result<Tensor, ModelError> {
        let cfg = &self.cfg;
        let n = batch.input_ids.dim(0)?;
        let (heads, d) = (cfg.num_attention_heads, cfg.head_dim);
        let scale = 1.0 / (d as f32).sqrt();
        let mut x = self.embed_tokens.forward(&batch.input_ids)?;
        if let Some(p) = &self.project_in {
            x = p.forward(&x)?;
        }
        let positions = (&batch.positions + f64::from(POSITION_OFFSET))?;
        x = (x + self.embed_positions.forward(&positions)?)?;
        for (i, l) in self.layers.iter().enumerate() {
            let h = if self.pre_norm {
                l.attn_norm.forward(&x)?
            } else {
                x.clone()
            };
            let q = l.q.forward(&h)?.reshape((n, heads, d))?;
            let k = l.k.forward(&h)?.reshape((n, heads, d))?;
            let v = l.v.forward(&h)?.reshape((n, heads, d))?;
            let attn = kv.attend(i, &q, &k, &v, &batch.attention, scale)?;
            x = (x + l.out.forward(&attn)?)?;
            if !self.pre_norm {
                x = l.attn_norm.forward(&x)?;
            }
            let h = if self.pre_norm {
                l.mlp_norm.forward(&x)?
            } else {
                x.clone()
            };
            let h = l.fc2.forward(&l.fc1.forward(&h)?.relu()?)?;
            x = (x + h)?;
            if !self.pre_norm {
                x = l.mlp_norm.forward(&x)?;
            }
        }
        let mut last = x.index_select(&batch.sample_rows, 0)?;
        if let Some(norm) = &self.final_norm {
            last = norm.forward(&last)?;
        }
        if let Some(p) = &self.project_out {
            last = p.forward(&last)?;
        }
        let logits = last.matmul(&self.embed_tokens_weight.t()?)?;
        Ok(logits.to_dtype(candle_core::DType::F32)?)
    }
}
