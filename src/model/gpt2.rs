//! OpenAI's GPT-2 (`gpt2`, `gpt2-medium`, ..., and models of its shape) on the paged KV cache:
//! learned positions, pre-LayerNorm blocks, one `c_attn` projection for q/k/v, GELU (tanh
//! approximation), an LM head tied to the token embedding. Its checkpoints store the projections
//! as Conv1D weights, `[in, out]`: they are transposed once at load.

use candle_core::{Module, Tensor};
use candle_nn::{Embedding, LayerNorm};

use super::attention::KvCache;
use super::batch::ForwardBatch;
use serde::Deserialize;

use super::config::ModelConfig;
use super::hf_config::HfConfig;
use super::layers::{Linear, layer_norm};
use super::qkv::{Heads, split_qkv};
use super::registry::{Arch, Rope, Supports};
use super::weights::Weights;
use super::{CausalLm, ModelError};

/// OpenAI's GPT-2.
pub static GPT2: Arch = Arch {
    name: "GPT-2",
    hf_names: &["GPT2LMHeadModel", "gpt2"],
    gguf_names: &["gpt2"],
    supports: Supports {
        tensor_parallel: false,
        sliding_window: false,
        rope: Rope::Full,
        quantization: &[],
    },
    from_hf,
    from_gguf: |cfg, meta| {
        cfg.gguf_partial_rotary(meta);
        legacy_biases(cfg);
        // (Its head is its embedding, whatever the file holds.)
        cfg.tie_word_embeddings = true;
        Ok(())
    },
    build: |cfg, w, _, _| -> Result<Box<dyn CausalLm>, ModelError> {
        Ok(Box::new(Gpt2::load(cfg, w)?))
    },
};

/// GPT-2 and GPT-NeoX: LayerNorm and biases everywhere.
pub(super) fn legacy_biases(cfg: &mut ModelConfig) {
    (cfg.qkv_bias, cfg.o_bias, cfg.mlp_bias) = (true, true, true);
}

#[derive(Deserialize)]
struct Gpt2Fields {
    activation_function: Option<String>,
}

/// GPT-2 from `config.json`: its own field names (read as the shared ones), `n_inner: null` for
/// four times the width, 1024 positions unless it says otherwise, the head tied.
fn from_hf(cfg: &mut ModelConfig, c: &HfConfig) -> Result<(), ModelError> {
    let f: Gpt2Fields = c.fields()?;
    if f.activation_function
        .as_deref()
        .is_some_and(|a| !matches!(a, "gelu_new" | "gelu_pytorch_tanh"))
    {
        return Err(ModelError::Unsupported(format!(
            "GPT-2 activation {:?} (supported: gelu_new)",
            f.activation_function
        )));
    }
    cfg.intermediate_size = c.intermediate_size.unwrap_or(4 * c.hidden_size);
    cfg.max_position_embeddings = c.max_position_embeddings.unwrap_or(1024);
    cfg.norm_eps = c.rms_norm_eps.unwrap_or(1e-5);
    cfg.tie_word_embeddings = true;
    legacy_biases(cfg);
    Ok(())
}

struct Block {
    ln_1: LayerNorm,
    /// `[3 * hidden, hidden]`: q, then k, then v rows.
    c_attn: Linear,
    attn_proj: Linear,
    ln_2: LayerNorm,
    c_fc: Linear,
    mlp_proj: Linear,
}

/// A GPT-2 causal LM.
pub struct Gpt2 {
    cfg: ModelConfig,
    wte: Embedding,
    wte_weight: Tensor,
    wpe: Embedding,
    blocks: Vec<Block>,
    ln_f: LayerNorm,
}

/// A Conv1D layer `prefix` (`weight` `[inputs, outputs]`, `bias` `[outputs]`) as a [`Linear`].
fn conv1d(w: &Weights, prefix: &str, inputs: usize, outputs: usize) -> Result<Linear, ModelError> {
    let weight = w
        .tensor(&format!("{prefix}.weight"), (inputs, outputs))?
        .t()?
        .contiguous()?;
    let bias = w.tensor(&format!("{prefix}.bias"), outputs)?;
    Ok(Linear::dense(weight, Some(bias)))
}

impl Gpt2 {
    /// Loads the model: Hugging Face names (with or without the leading `transformer.`, Conv1D
    /// weights), or llama.cpp's GGUF names (`blk.N.attn_qkv`, ..., weights already `[out, in]`).
    pub fn load(cfg: &ModelConfig, w: &Weights) -> Result<Self, ModelError> {
        let gguf = matches!(w, Weights::Gguf { .. });
        let root = if w.contains("transformer.wte.weight") {
            "transformer."
        } else {
            ""
        };
        // A module of layer `i` by its Hugging Face and its llama.cpp name.
        let module = |i: usize, hf: &str, ggml: &str| match gguf {
            true => format!("blk.{i}.{ggml}"),
            false => format!("{root}h.{i}.{hf}"),
        };
        let proj = |i, hf, ggml, inputs, outputs| match gguf {
            true => w.linear(&module(i, hf, ggml), inputs, outputs, true),
            false => conv1d(w, &module(i, hf, ggml), inputs, outputs),
        };
        let top = |hf: &str, ggml: &str| match gguf {
            true => ggml.to_string(),
            false => format!("{root}{hf}"),
        };
        let (h, eps, inner) = (cfg.hidden_size, cfg.norm_eps, cfg.intermediate_size);
        let wte_weight = w.tensor(&top("wte.weight", "token_embd.weight"), (cfg.vocab_size, h))?;
        let wpe = w.tensor(
            &top("wpe.weight", "position_embd.weight"),
            (cfg.max_position_embeddings, h),
        )?;
        let blocks = (0..cfg.num_hidden_layers)
            .map(|i| {
                Ok(Block {
                    ln_1: layer_norm(w, &module(i, "ln_1", "attn_norm"), h, eps)?,
                    c_attn: proj(i, "attn.c_attn", "attn_qkv", h, 3 * h)?,
                    attn_proj: proj(i, "attn.c_proj", "attn_output", h, h)?,
                    ln_2: layer_norm(w, &module(i, "ln_2", "ffn_norm"), h, eps)?,
                    c_fc: proj(i, "mlp.c_fc", "ffn_up", h, inner)?,
                    mlp_proj: proj(i, "mlp.c_proj", "ffn_down", inner, h)?,
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        Ok(Gpt2 {
            cfg: cfg.clone(),
            wte: Embedding::new(wte_weight.clone(), h),
            wte_weight,
            wpe: Embedding::new(wpe, h),
            blocks,
            ln_f: layer_norm(w, &top("ln_f", "output_norm"), h, eps)?,
        })
    }
}

impl CausalLm for Gpt2 {
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
        let mut x = (self.wte.forward(&batch.input_ids)? + self.wpe.forward(&batch.positions)?)?;
        for (i, b) in self.blocks.iter().enumerate() {
            let qkv = b.c_attn.forward(&b.ln_1.forward(&x)?)?;
            let (q, k, v) = split_qkv(&qkv, heads)?;
            let attn = kv.attend(i, &q, &k, &v, &batch.attention, heads.scale)?;
            x = (x + b.attn_proj.forward(&attn)?)?;
            let m = b.c_fc.forward(&b.ln_2.forward(&x)?)?.gelu()?;
            x = (x + b.mlp_proj.forward(&m)?)?;
        }
        let last = self.ln_f.forward(&x.index_select(&batch.sample_rows, 0)?)?;
        let logits = last.matmul(&self.wte_weight.t()?)?;
        Ok(logits.to_dtype(candle_core::DType::F32)?)
    }
}
