//! gpt-oss's place in the registry: its names, and how `config.json` and llama.cpp's GGUF files
//! state its windows, experts and YaRN.

use serde::Deserialize;

use crate::model::config::{ExpertNames, ModelConfig, SlidingWindows};
use crate::model::gguf_config::GgufMeta;
use crate::model::hf_config::HfConfig;
use crate::model::registry::{Arch, Rope, Supports};
use crate::model::rope_scaling::parse_yarn;
use crate::model::{CausalLm, ModelError, moe};

/// OpenAI's gpt-oss.
pub static GPT_OSS: Arch = Arch {
    name: "gpt-oss",
    hf_names: &["GptOssForCausalLM", "gpt_oss"],
    gguf_names: &["gpt-oss"],
    supports: Supports {
        tensor_parallel: true,
        sliding_window: true,
        rope: Rope::Full,
        quantization: &["mxfp4"],
    },
    from_hf,
    from_gguf,
    build: |cfg, w, max_len, par| -> Result<Box<dyn CausalLm>, ModelError> {
        Ok(Box::new(super::GptOss::load(cfg, w, max_len, par)?))
    },
};

#[derive(Deserialize)]
struct Fields {
    sliding_window: Option<usize>,
    layer_types: Option<Vec<String>>,
}

/// gpt-oss from `config.json`: `layer_types`, or transformers' default of sliding layers first
/// and alternating; biases on the attention unless `attention_bias` says not; the experts.
fn from_hf(cfg: &mut ModelConfig, c: &HfConfig) -> Result<(), ModelError> {
    let layers = cfg.num_hidden_layers;
    let f: Fields = c.fields()?;
    let sliding = match f.layer_types {
        Some(types) if types.len() != layers => {
            return Err(ModelError::Config(format!(
                "{} layer_types for {layers} layers",
                types.len()
            )));
        }
        Some(types) => types
            .iter()
            .map(|t| match t.as_str() {
                "sliding_attention" => Ok(true),
                "full_attention" => Ok(false),
                other => Err(ModelError::Unsupported(format!(
                    "gpt-oss layer type {other:?}"
                ))),
            })
            .collect::<Result<Vec<_>, _>>()?,
        None => (0..layers).map(|i| i % 2 == 0).collect(),
    };
    cfg.sliding = Some(SlidingWindows {
        window: f.sliding_window.unwrap_or(128).max(1),
        sliding,
    });
    cfg.max_position_embeddings = c.max_position_embeddings.unwrap_or(131_072);
    cfg.qkv_bias = c.attention_bias.unwrap_or(true);
    cfg.o_bias = c.attention_bias.unwrap_or(true);
    cfg.moe = Some(moe::settings(c, ExpertNames::GptOss)?);
    Ok(())
}

/// gpt-oss from `gpt-oss.*`, as llama.cpp reads it: sliding-window layers and full ones
/// alternating, the first sliding (`attention.sliding_window` positions), and YaRN from
/// `rope.scaling.*` (the factor, the pre-training context, the betas when given), its ramp not
/// rounded to whole dimensions, as gpt-oss's `config.json` says.
fn from_gguf(cfg: &mut ModelConfig, meta: &mut GgufMeta<'_>) -> Result<(), ModelError> {
    let layers = cfg.num_hidden_layers;
    cfg.sliding = Some(SlidingWindows {
        window: meta
            .opt_u32("attention.sliding_window")
            .map_or(128, |w| w.max(1)) as usize,
        sliding: (0..layers).map(|i| i % 2 == 0).collect(),
    });
    cfg.yarn = match meta.string("rope.scaling.type") {
        None | Some("none") => None,
        Some("yarn") => {
            let mut v = serde_json::json!({ "truncate": false });
            let keys = [
                ("factor", "rope.scaling.factor"),
                ("beta_fast", "rope.scaling.yarn_beta_fast"),
                ("beta_slow", "rope.scaling.yarn_beta_slow"),
            ];
            for (name, k) in keys {
                if let Some(x) = meta.f64(k) {
                    v[name] = x.into();
                }
            }
            let context = meta.opt_u32("context_length").map_or(2048, |v| v as usize);
            let original = meta.opt_u32("rope.scaling.original_context_length");
            Some(parse_yarn(&v, Some(context), original.map(|o| o as usize))?)
        }
        Some(other) => {
            return Err(ModelError::Unsupported(format!(
                "GGUF gpt-oss with rope scaling {other:?} (yarn is supported)"
            )));
        }
    };
    cfg.moe = moe::gguf_settings(meta, ExpertNames::GptOss)?;
    Ok(())
}
