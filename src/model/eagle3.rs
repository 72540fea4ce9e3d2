//! An EAGLE-3 head: the drafter of EAGLE-3 speculative decoding (`"method": "eagle3"`), in the
//! layout the published heads use (`LlamaForCausalLMEagle3`, as vLLM and SGLang read them).
//!
//! One Llama decoder layer guesses the target's next token from two inputs at each position
//! `p`: the embedding of token `p + 1` and a hidden state for position `p`. For positions the
//! target has computed, the hidden state is the target's own: the residual streams entering
//! three of its layers (by default 2, L/2 and L-3), concatenated and projected by `fc`. For a
//! position past them (the head's own guesses), it is the head's previous output before its
//! final norm. The layer's attention reads `[norm(embedding), norm(hidden)]` (twice the width),
//! the residual stream starts at the hidden state, and the logits cover a smaller draft
//! vocabulary mapped back to the target's by `d2t` (`target = draft + d2t[draft]`).

use candle_core::{DType, Tensor};
use candle_nn::Embedding;
use serde_json::Value;

use super::ModelError;
use super::attention::KvCache;
use super::batch::ForwardBatch;
use super::config::ModelConfig;
use super::embedding::TokenEmbedding;
use super::layers::{GatedMlp, Linear};
use super::norm::RmsNorm;
use super::qkv::{Heads, QkvProj, attention, o_proj};
use super::rotary::Rotary;
use super::weights::Weights;
use crate::parallel::TpRank;

/// What an EAGLE-3 head's `config.json` says beyond a Llama config.
#[derive(Clone, Debug, PartialEq)]
pub struct Eagle3Config {
    /// The head's layer, as a Llama config (one layer; `hidden_size` is the head's width).
    pub layer: ModelConfig,
    /// Rows of the head's LM head (`draft_vocab_size`; the target's vocabulary when absent).
    pub draft_vocab_size: usize,
    /// Width of the target's hidden states (`target_hidden_size`; the head's when absent).
    pub target_hidden_size: usize,
    /// The target layers whose incoming residual streams the head reads
    /// (`eagle_aux_hidden_state_layer_ids`, at the top level or in `eagle_config`); `None`:
    /// 2, L/2 and L-3 of a target of L layers, as vLLM picks them.
    pub aux_layers: Option<Vec<usize>>,
    /// `norm_before_residual`: the residual stream starts at the normalized hidden state.
    pub norm_before_residual: bool,
}

/// The architecture names EAGLE-3 heads are published under.
const ARCHITECTURES: [&str; 2] = ["LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM"];

impl Eagle3Config {
    /// Parses the head's `config.json`; refuses other formats by name.
    pub fn parse(text: &str) -> Result<Self, ModelError> {
        let bad = |m: String| ModelError::Unsupported(format!("EAGLE-3 head config: {m}"));
        let mut json: Value =
            serde_json::from_str(text).map_err(|e| bad(format!("not JSON: {e}")))?;
        let arch = json
            .get("architectures")
            .and_then(|a| a.get(0))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if json.get("speculators_config").is_some() {
            return Err(bad(
                "the `speculators` format (speculators_config) is not read; heads in EAGLE-3's \
                 own layout (LlamaForCausalLMEagle3) are"
                    .into(),
            ));
        }
        if !ARCHITECTURES.contains(&arch.as_str()) {
            return Err(bad(format!(
                "architecture {arch:?} is not an EAGLE-3 head (expected one of {ARCHITECTURES:?})"
            )));
        }
        let usize_field = |json: &Value, name: &str| {
            json.get(name)
                .filter(|v| !v.is_null())
                .map(|v| {
                    v.as_u64()
                        .map(|n| n as usize)
                        .ok_or_else(|| bad(format!("{name} is not a count: {v}")))
                })
                .transpose()
        };
        let draft_vocab = usize_field(&json, "draft_vocab_size")?;
        let target_hidden = usize_field(&json, "target_hidden_size")?;
        let aux_json = json
            .get("eagle_aux_hidden_state_layer_ids")
            .or_else(|| {
                json.get("eagle_config")?
                    .get("eagle_aux_hidden_state_layer_ids")
            })
            .filter(|v| !v.is_null());
        let aux_layers = match aux_json {
            Some(v) => Some(
                serde_json::from_value::<Vec<usize>>(v.clone())
                    .map_err(|e| bad(format!("eagle_aux_hidden_state_layer_ids: {e}")))?,
            ),
            None => None,
        };
        let norm_before_residual = json
            .get("norm_before_residual")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        json["architectures"] = Value::from(vec!["LlamaForCausalLM"]);
        let layer = ModelConfig::from_hf_json(&json.to_string())?;
        if layer.num_hidden_layers != 1 {
            return Err(bad(format!(
                "{} layers; EAGLE-3 heads of one layer are supported",
                layer.num_hidden_layers
            )));
        }
        if layer.quantization.is_some() {
            return Err(bad("a quantized head is not supported".into()));
        }
        Ok(Eagle3Config {
            draft_vocab_size: draft_vocab.unwrap_or(layer.vocab_size),
            target_hidden_size: target_hidden.unwrap_or(layer.hidden_size),
            aux_layers,
            norm_before_residual,
            layer,
        })
    }

    /// The target layers to read for a target of `target_layers` layers (each below it).
    pub fn aux_layers_for(&self, target_layers: usize) -> Result<Vec<usize>, ModelError> {
        let layers = match &self.aux_layers {
            Some(l) => l.clone(),
            None if target_layers >= 4 => vec![2, target_layers / 2, target_layers - 3],
            None => {
                return Err(ModelError::Unsupported(format!(
                    "EAGLE-3: a target of {target_layers} layers has no default layers to read \
                     (2, L/2, L-3); give eagle_aux_hidden_state_layer_ids in the head's config"
                )));
            }
        };
        if layers.is_empty() || layers.iter().any(|&l| l >= target_layers) {
            return Err(ModelError::Unsupported(format!(
                "EAGLE-3: eagle_aux_hidden_state_layer_ids {layers:?} must name layers below the \
                 target's {target_layers}"
            )));
        }
        Ok(layers)
    }
}

/// A loaded EAGLE-3 head.
pub struct Eagle3Head {
    cfg: Eagle3Config,
    embed: TokenEmbedding,
    fc: Linear,
    hidden_norm: RmsNorm,
    input_norm: RmsNorm,
    qkv: QkvProj,
    o: Linear,
    post_norm: RmsNorm,
    mlp: GatedMlp,
    norm: RmsNorm,
    lm_head: Linear,
    /// Target token of each draft token.
    d2t: Vec<u32>,
    rotary: Rotary,
}

/// A head pass's results for the rows that sample.
pub struct HeadOutput {
    /// Each row's draft as a target token id (the argmax of the head's logits, mapped).
    pub tokens: Vec<u32>,
    /// The rows' streams before the final norm (`[rows, hidden]`): the next pass's hidden state.
    pub hidden: Tensor,
}

impl Eagle3Head {
    /// Loads the head from `w` (names as the EAGLE-3 checkpoints write them: `midlayer.*`,
    /// `fc`, `norm`, `lm_head`; `layers.0.*` also read), with `d2t` already read. Without an
    /// `embed_tokens` of its own it uses `target_embed`. Rotary tables cover `max_len`.
    pub fn load(
        cfg: Eagle3Config,
        w: &Weights,
        d2t: Option<Vec<i64>>,
        target_embed: &TokenEmbedding,
        target_vocab: usize,
        max_len: usize,
    ) -> Result<Self, ModelError> {
        let l = &cfg.layer;
        let h = l.hidden_size;
        let bad = |m: String| ModelError::Unsupported(format!("EAGLE-3 head: {m}"));
        if l.vocab_size != target_vocab {
            return Err(bad(format!(
                "its vocabulary ({}) is not the target's ({target_vocab})",
                l.vocab_size
            )));
        }
        let layer = ["midlayer", "layers.0", "model.layers.0"]
            .into_iter()
            .find(|p| w.contains(&format!("{p}.input_layernorm.weight")))
            .ok_or_else(|| bad("no midlayer.input_layernorm.weight".into()))?;
        let named = |short: &str| match w.contains(short) {
            true => short.to_string(),
            false => format!("model.{short}"),
        };
        let embed = match named("embed_tokens.weight") {
            n if w.contains(&n) => {
                TokenEmbedding::Dense(Embedding::new(w.tensor(&n, (l.vocab_size, h))?, h))
            }
            _ => target_embed.clone(),
        };
        let dv = cfg.draft_vocab_size;
        let d2t: Vec<u32> = match d2t {
            Some(offsets) if offsets.len() == dv => offsets
                .iter()
                .enumerate()
                .map(|(d, &o)| {
                    u32::try_from(d as i64 + o)
                        .ok()
                        .filter(|&t| (t as usize) < target_vocab)
                        .ok_or_else(|| bad(format!("d2t maps draft token {d} off the vocabulary")))
                })
                .collect::<Result<_, _>>()?,
            Some(offsets) => {
                return Err(bad(format!(
                    "d2t has {} entries for a draft vocabulary of {dv}",
                    offsets.len()
                )));
            }
            None if dv == target_vocab => (0..dv as u32).collect(),
            None => return Err(bad(format!("no d2t for a draft vocabulary of {dv}"))),
        };
        // The attention reads [embedding, hidden]: twice the width in.
        let wide = ModelConfig {
            hidden_size: 2 * h,
            ..l.clone()
        };
        let attn = format!("{layer}.self_attn");
        let norm = |name: &str| RmsNorm::load(w, name, h, l.norm_eps);
        Ok(Eagle3Head {
            embed,
            fc: w.linear("fc", 3 * cfg.target_hidden_size, h, false)?,
            hidden_norm: norm(&format!("{layer}.hidden_norm.weight"))?,
            input_norm: norm(&format!("{layer}.input_layernorm.weight"))?,
            qkv: QkvProj::load(w, &attn, &wide, TpRank::SINGLE)?,
            o: o_proj(w, &attn, l, TpRank::SINGLE)?,
            post_norm: norm(&format!("{layer}.post_attention_layernorm.weight"))?,
            mlp: GatedMlp::load(w, &format!("{layer}.mlp"), l, TpRank::SINGLE)?,
            norm: norm(&named("norm.weight"))?,
            lm_head: w.linear("lm_head", h, dv, false)?,
            d2t,
            rotary: Rotary::new(l, max_len, w.dtype(), w.device())?,
            cfg,
        })
    }

    /// The head's configuration.
    pub fn config(&self) -> &Eagle3Config {
        &self.cfg
    }

    /// One pass over `batch` (its token ids are each position's next token), writing the head's
    /// K/V into `kv`: `hidden` holds each row's hidden state, the target's (`3 *
    /// target_hidden_size` wide) or the head's own (`hidden_size`).
    pub fn forward(
        &self,
        batch: &ForwardBatch<'_>,
        kv: &mut KvCache,
        hidden: &Tensor,
    ) -> Result<HeadOutput, ModelError> {
        let l = &self.cfg.layer;
        let hidden = match hidden.dim(1)? == l.hidden_size {
            true => hidden.clone(),
            false => self.fc.forward(hidden)?,
        };
        let (normed, residual) = match self.cfg.norm_before_residual {
            true => {
                let n = self.hidden_norm.forward(&hidden)?;
                (n.clone(), n)
            }
            false => (self.hidden_norm.forward(&hidden)?, hidden),
        };
        let embeds = self
            .input_norm
            .forward(&self.embed.forward(&batch.input_ids)?)?;
        let x = Tensor::cat(&[&embeds, &normed], 1)?;
        let heads = Heads {
            q: l.num_attention_heads,
            kv: l.num_key_value_heads,
            dim: l.head_dim,
            scale: 1.0 / (l.head_dim as f32).sqrt(),
            window: None,
        };
        let rotary = self.rotary.at(&batch.positions)?;
        let attn = attention(&self.qkv, 0, &x, &rotary, batch, kv, heads)?;
        let (mid, h_mid) = self
            .post_norm
            .add_forward(&residual, &self.o.forward(&attn)?)?;
        let mlp = self.mlp.forward(&h_mid)?;
        let (pre, out) = self.norm.add_forward(&mid, &mlp)?;
        if batch.num_sample_rows == 0 {
            return Ok(HeadOutput {
                tokens: Vec::new(),
                hidden: pre,
            });
        }
        let logits = self.lm_head.forward(&batch.sampled(&out)?)?;
        let picked = logits
            .to_dtype(DType::F32)?
            .argmax(candle_core::D::Minus1)?
            .to_vec1::<u32>()?;
        Ok(HeadOutput {
            tokens: picked.iter().map(|&d| self.d2t[d as usize]).collect(),
            hidden: batch.sampled(&pre)?,
        })
    }
}
