//! EleutherAI's GPT-NeoX (Pythia, GPT-NeoX-20B) on the paged KV cache: LayerNorm, one
//! `query_key_value` projection whose rows are grouped by head (q, k, v of head 0, then head 1,
//! ...; regrouped as all q, all k, all v at load), rotary on the leading `rotary_dim` dimensions
//! of each head (rotate-half), GELU, and by default the parallel residual
//! `x + attn(ln1(x)) + mlp(ln2(x))`.

use candle_core::{Module, Tensor};
use candle_nn::{Embedding, LayerNorm};

use super::attention::KvCache;
use super::batch::ForwardBatch;
use serde::Deserialize;

use super::config::{ArchSettings, ModelConfig};
use super::gguf_config::GgufMeta;
use super::hf_config::HfConfig;
use super::layers::{Linear, layer_norm};
use super::qkv::{Heads, split_qkv};
use super::registry::{Arch, Rope, Supports};
use super::rotary::Rotary;
use super::weights::Weights;
use super::{CausalLm, ModelError};

/// EleutherAI's GPT-NeoX.
pub static GPT_NEOX: Arch = Arch {
    name: "GPT-NeoX",
    hf_names: &["GPTNeoXForCausalLM", "gpt_neox"],
    gguf_names: &["gptneox"],
    supports: Supports {
        tensor_parallel: false,
        sliding_window: false,
        rope: Rope::Partial,
        quantization: &[],
    },
    from_hf,
    from_gguf,
    build: |cfg, w, max_len, _| -> Result<Box<dyn CausalLm>, ModelError> {
        Ok(Box::new(GptNeox::load(cfg, w, max_len)?))
    },
};

/// GPT-NeoX settings.
#[derive(Clone, Debug, PartialEq)]
pub struct NeoxSettings {
    /// `x + attn(ln1(x)) + mlp(ln2(x))` instead of one after the other.
    pub parallel_residual: bool,
    /// GELU by its tanh approximation (`gelu_new`) instead of the exact one (`gelu`).
    pub gelu_tanh: bool,
}

#[derive(Deserialize)]
struct NeoxFields {
    use_parallel_residual: Option<bool>,
    hidden_act: Option<String>,
}

fn from_hf(cfg: &mut ModelConfig, c: &HfConfig) -> Result<(), ModelError> {
    let f: NeoxFields = c.fields()?;
    let gelu_tanh = match f.hidden_act.as_deref().unwrap_or("gelu") {
        "gelu" => false,
        "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" => true,
        other => {
            return Err(ModelError::Unsupported(format!(
                "GPT-NeoX activation {other:?}"
            )));
        }
    };
    cfg.norm_eps = c.rms_norm_eps.unwrap_or(1e-5);
    super::gpt2::legacy_biases(cfg);
    cfg.settings = ArchSettings::Neox(NeoxSettings {
        parallel_residual: f.use_parallel_residual.unwrap_or(true),
        gelu_tanh,
    });
    Ok(())
}

/// llama.cpp's files do not name NeoX's activation: Pythia's (and GPT-NeoX-20B's) exact GELU.
fn from_gguf(cfg: &mut ModelConfig, meta: &mut GgufMeta<'_>) -> Result<(), ModelError> {
    cfg.gguf_partial_rotary(meta);
    super::gpt2::legacy_biases(cfg);
    cfg.settings = ArchSettings::Neox(NeoxSettings {
        parallel_residual: meta.bool("use_parallel_residual").unwrap_or(true),
        gelu_tanh: false,
    });
    Ok(())
}

struct Layer {
    ln_1: LayerNorm,
    ln_2: LayerNorm,
    /// `[3 * hidden, hidden]`: every head's q rows, then k, then v.
    qkv: Linear,
    dense: Linear,
    fc_in: Linear,
    fc_out: Linear,
}

/// A GPT-NeoX causal LM.
pub struct GptNeox {
    cfg: ModelConfig,
    settings: NeoxSettings,
    embed: Embedding,
    layers: Vec<Layer>,
    final_norm: LayerNorm,
    lm_head: Linear,
    rotary: Rotary,
}

/// `t`'s leading dimension, `heads` groups of (q, k, v) rows of `d` each, regrouped as all q
/// rows, then all k, then all v.
fn regroup(t: &Tensor, heads: usize, d: usize) -> candle_core::Result<Tensor> {
    let rest: Vec<usize> = t.dims()[1..].to_vec();
    let grouped = [vec![heads, 3, d], rest.clone()].concat();
    let flat = [vec![3 * heads * d], rest].concat();
    t.reshape(grouped)?
        .transpose(0, 1)?
        .contiguous()?
        .reshape(flat)
}

impl GptNeox {
    /// Loads the model; rotary tables cover positions below `max_len`.
    pub fn load(cfg: &ModelConfig, w: &Weights, max_len: usize) -> Result<Self, ModelError> {
        let ArchSettings::Neox(settings) = cfg.settings.clone() else {
            return Err(ModelError::Config("GPT-NeoX settings missing".into()));
        };
        let (h, eps, heads, d) = (
            cfg.hidden_size,
            cfg.norm_eps,
            cfg.num_attention_heads,
            cfg.head_dim,
        );
        // llama.cpp's GGUF names; its converter has already regrouped q, k and v.
        let gguf = matches!(w, Weights::Gguf { .. });
        let name = |hf: &str, ggml: &str| match gguf {
            true => ggml.to_string(),
            false => hf.to_string(),
        };
        let embed_w = w.tensor(
            &name("gpt_neox.embed_in.weight", "token_embd.weight"),
            (cfg.vocab_size, h),
        )?;
        let layers = (0..cfg.num_hidden_layers)
            .map(|i| {
                let module = |hf: &str, ggml: &str| match gguf {
                    true => format!("blk.{i}.{ggml}"),
                    false => format!("gpt_neox.layers.{i}.{hf}"),
                };
                let lin = |hf, ggml, i, o| w.linear(&module(hf, ggml), i, o, true);
                let qkv_name = module("attention.query_key_value", "attn_qkv");
                let qkv = match gguf {
                    true => w.linear(&qkv_name, h, 3 * h, true)?,
                    false => Linear::dense(
                        regroup(
                            &w.tensor(&format!("{qkv_name}.weight"), (3 * h, h))?,
                            heads,
                            d,
                        )?,
                        Some(regroup(
                            &w.tensor(&format!("{qkv_name}.bias"), 3 * h)?,
                            heads,
                            d,
                        )?),
                    ),
                };
                Ok(Layer {
                    ln_1: layer_norm(w, &module("input_layernorm", "attn_norm"), h, eps)?,
                    ln_2: layer_norm(w, &module("post_attention_layernorm", "ffn_norm"), h, eps)?,
                    qkv,
                    dense: lin("attention.dense", "attn_output", h, h)?,
                    fc_in: lin("mlp.dense_h_to_4h", "ffn_up", h, cfg.intermediate_size)?,
                    fc_out: lin("mlp.dense_4h_to_h", "ffn_down", cfg.intermediate_size, h)?,
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        let head = name("embed_out", "output");
        let lm_head = if cfg.tie_word_embeddings || !w.contains(&format!("{head}.weight")) {
            Linear::dense(embed_w.clone(), None)
        } else {
            w.linear(&head, h, cfg.vocab_size, false)?
        };
        Ok(GptNeox {
            cfg: cfg.clone(),
            settings,
            embed: Embedding::new(embed_w, h),
            layers,
            final_norm: layer_norm(w, &name("gpt_neox.final_layer_norm", "output_norm"), h, eps)?,
            lm_head,
            rotary: Rotary::new(cfg, max_len, w.dtype(), w.device())?,
        })
    }

    fn mlp(&self, l: &Layer, x: &Tensor) -> candle_core::Result<Tensor> {
        let a = l.fc_in.forward(&l.ln_2.forward(x)?)?;
        let a = if self.settings.gelu_tanh {
            a.gelu()?
        } else {
            a.gelu_erf()?
        };
        l.fc_out.forward(&a)
    }
}

impl CausalLm for GptNeox {
    fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    fn forward(&self, batch: &ForwardBatch<'_>, kv: &mut KvCache) -> Result<Tensor, ModelError> {
        let (cfg, d) = (&self.cfg, self.cfg.head_dim);
        let heads = Heads {
            q: cfg.num_attention_heads,
            kv: cfg.num_attention_heads,
            dim: d,
            scale: 1.0 / (d as f32).sqrt(),
            window: None,
        };
        let rows = self.rotary.at(&batch.positions)?;
        let mut x = self.embed.forward(&batch.input_ids)?;
        for (i, l) in self.layers.iter().enumerate() {
            let qkv = l.qkv.forward(&l.ln_1.forward(&x)?)?;
            let (q, k, v) = split_qkv(&qkv, heads)?;
            let (q, k) = (rows.apply(&q)?, rows.apply(&k)?);
            let attn = kv.attend(i, &q, &k, &v, &batch.attention, heads.scale)?;
            let attn = l.dense.forward(&attn)?;
            x = if self.settings.parallel_residual {
                ((&x + attn)? + self.mlp(l, &x)?)?
            } else {
                let x = (x + attn)?;
                (&x + self.mlp(l, &x)?)?
            };
        }
        let last = self
            .final_norm
            .forward(&x.index_select(&batch.sample_rows, 0)?)?;
        Ok(self
            .lm_head
            .forward(&last)?
            .to_dtype(candle_core::DType::F32)?)
    }
}
