//! Gemma 3's place in the registry: its names, its settings and how `config.json` and llama.cpp's
//! GGUF files state them.

use serde::Deserialize;

use crate::model::config::{ArchSettings, ModelConfig, SlidingWindows};
use crate::model::gguf_config::GgufMeta;
use crate::model::hf_config::HfConfig;
use crate::model::registry::{Arch, Rope, Supports};
use crate::model::{CausalLm, ModelError};

/// Google's Gemma 3 (text).
pub static GEMMA3: Arch = Arch {
    name: "Gemma 3",
    hf_names: &["Gemma3ForCausalLM", "gemma3_text"],
    gguf_names: &["gemma3"],
    supports: Supports {
        tensor_parallel: true,
        sliding_window: true,
        rope: Rope::Own,
        quantization: &[],
    },
    from_hf,
    from_gguf,
    build: |cfg, w, max_len, par| -> Result<Box<dyn CausalLm>, ModelError> {
        Ok(Box::new(super::Gemma3::load(cfg, w, max_len, par)?))
    },
};

/// Gemma 3's settings beyond the Llama-like ones.
#[derive(Clone, Debug, PartialEq)]
pub struct GemmaSettings {
    /// Scores are scaled by `query_pre_attn_scalar^-½` (not `head_dim^-½`).
    pub query_pre_attn_scalar: f64,
    /// The local layers' rotary base (the global ones use `ModelConfig::rope_theta`).
    pub local_rope_theta: f64,
    /// The global layers' linear rope scaling factor (1 without scaling).
    pub global_rope_factor: f64,
    /// `logits = c · tanh(logits / c)` when set.
    pub final_logit_softcapping: Option<f64>,
}

/// The `config.json` fields only Gemma 3 has.
#[derive(Deserialize)]
struct GemmaFields {
    query_pre_attn_scalar: Option<f64>,
    sliding_window: Option<usize>,
    layer_types: Option<Vec<String>>,
    #[serde(alias = "_sliding_window_pattern")]
    sliding_window_pattern: Option<usize>,
    rope_local_base_freq: Option<f64>,
    rope_theta: Option<f64>,
    rope_scaling: Option<serde_json::Value>,
    rope_parameters: Option<serde_json::Value>,
    final_logit_softcapping: Option<f64>,
    attn_logit_softcapping: Option<f64>,
    hidden_activation: Option<String>,
    use_bidirectional_attention: Option<bool>,
}

fn unsupported(what: String) -> ModelError {
    ModelError::Unsupported(format!("Gemma 3 with {what}"))
}

/// What every Gemma 3 is, whatever the file: q/k norms, GeGLU, a tied head unless it says not.
fn common(cfg: &mut ModelConfig, settings: GemmaSettings, sliding: SlidingWindows) {
    cfg.qk_norm = true;
    cfg.gelu_mlp = true;
    cfg.sliding = Some(sliding);
    cfg.settings = ArchSettings::Gemma3(settings);
}

/// A rotary setting's base and linear factor (`rope_type` default or linear).
fn rope_base(v: &serde_json::Value, default_theta: f64) -> Result<(f64, f64), ModelError> {
    let theta = v
        .get("rope_theta")
        .and_then(|t| t.as_f64())
        .unwrap_or(default_theta);
    let kind = v
        .get("rope_type")
        .or_else(|| v.get("type"))
        .and_then(|t| t.as_str());
    match kind {
        None | Some("default") => Ok((theta, 1.0)),
        Some("linear") => {
            let factor = v.get("factor").and_then(|f| f.as_f64()).unwrap_or(1.0);
            Ok((theta, factor))
        }
        Some(other) => Err(unsupported(format!("rope type {other:?}"))),
    }
}

/// Gemma 3's settings from `config.json`. transformers 5 writes the two rotary settings under
/// `rope_parameters.{full,sliding}_attention`; older configs `rope_theta`, `rope_scaling` (global)
/// and `rope_local_base_freq`.
fn from_hf(cfg: &mut ModelConfig, c: &HfConfig) -> Result<(), ModelError> {
    let layers = cfg.num_hidden_layers;
    let f: GemmaFields = c.fields()?;
    if f.attn_logit_softcapping.is_some() {
        return Err(unsupported("attention logit softcapping".into()));
    }
    if f.use_bidirectional_attention == Some(true) {
        return Err(unsupported("bidirectional attention".into()));
    }
    let act = f
        .hidden_activation
        .as_deref()
        .unwrap_or("gelu_pytorch_tanh");
    if !matches!(act, "gelu_pytorch_tanh" | "gelu_new") {
        return Err(unsupported(format!("activation {act:?}")));
    }
    let sliding = match (f.layer_types, f.sliding_window_pattern) {
        (Some(types), _) => {
            if types.len() != layers {
                return Err(ModelError::Config(format!(
                    "{} layer_types for {layers} layers",
                    types.len()
                )));
            }
            types
                .iter()
                .map(|t| match t.as_str() {
                    "sliding_attention" => Ok(true),
                    "full_attention" => Ok(false),
                    other => Err(unsupported(format!("layer type {other:?}"))),
                })
                .collect::<Result<Vec<_>, _>>()?
        }
        (None, pattern) => {
            let pattern = pattern.unwrap_or(6).max(1);
            (0..layers).map(|i| (i + 1) % pattern != 0).collect()
        }
    };
    let params = f
        .rope_parameters
        .as_ref()
        .filter(|p| p.get("full_attention").is_some());
    let ((global_theta, global_factor), (local_theta, local_factor)) = match params {
        Some(p) => (
            rope_base(&p["full_attention"], 1_000_000.0)?,
            rope_base(
                p.get("sliding_attention").unwrap_or(&p["full_attention"]),
                10_000.0,
            )?,
        ),
        None => {
            let theta = f
                .rope_theta
                .or_else(|| f.rope_parameters.as_ref()?.get("rope_theta")?.as_f64())
                .unwrap_or(1_000_000.0);
            let global = match f.rope_scaling.as_ref().filter(|v| !v.is_null()) {
                Some(v) => rope_base(v, theta)?,
                None => (theta, 1.0),
            };
            (global, (f.rope_local_base_freq.unwrap_or(10_000.0), 1.0))
        }
    };
    if local_factor != 1.0 {
        return Err(unsupported("rope scaling on the local layers".into()));
    }
    cfg.rope_theta = global_theta;
    cfg.max_position_embeddings = c.max_position_embeddings.unwrap_or(131_072);
    cfg.tie_word_embeddings = c.tie_word_embeddings.unwrap_or(true);
    // (Gemma's checkpoints store the norms' w, applied as 1 + w.)
    cfg.norms_plus_one = true;
    let settings = GemmaSettings {
        query_pre_attn_scalar: f.query_pre_attn_scalar.unwrap_or(256.0),
        local_rope_theta: local_theta,
        global_rope_factor: global_factor,
        final_logit_softcapping: f.final_logit_softcapping,
    };
    let window = f.sliding_window.unwrap_or(4096).max(1);
    common(cfg, settings, SlidingWindows { window, sliding });
    Ok(())
}

/// Gemma 3's settings from `gemma3.*`, as llama.cpp reads them: the local layers every layer but
/// each sixth (or as `attention.sliding_window_pattern` says, a period or a flag per layer), their
/// rotary base 10,000, linear rope scaling on the global layers only, scores scaled by
/// `attention.scale` or else by `head_dim^-½` (`(hidden / heads)^-½` for the 62-layer 27B). The
/// file's norm weights are the `1 + w` they multiply by.
fn from_gguf(cfg: &mut ModelConfig, meta: &mut GgufMeta<'_>) -> Result<(), ModelError> {
    let layers = cfg.num_hidden_layers;
    let sliding = match meta.bools("attention.sliding_window_pattern") {
        Some(flags) => flags?,
        None => {
            let period = meta
                .opt_u32("attention.sliding_window_pattern")
                .unwrap_or(6)
                .max(1);
            (0..layers)
                .map(|i| (i + 1) % period as usize != 0)
                .collect()
        }
    };
    if sliding.len() != layers {
        return Err(ModelError::Config(format!(
            "GGUF sliding_window_pattern: {} flags for {layers} layers",
            sliding.len()
        )));
    }
    let global_rope_factor = match meta.string("rope.scaling.type") {
        None | Some("none") => 1.0,
        Some("linear") => meta.f64("rope.scaling.factor").unwrap_or(1.0),
        Some(other) => {
            return Err(unsupported(format!(
                "rope scaling {other:?} in a GGUF file (linear is supported)"
            )));
        }
    };
    let query_pre_attn_scalar = match meta.f64("attention.scale") {
        Some(scale) if scale > 0.0 => 1.0 / (scale * scale),
        _ if layers == 62 => (cfg.hidden_size / cfg.num_attention_heads) as f64,
        _ => cfg.head_dim as f64,
    };
    cfg.rope_theta = meta.f64("rope.freq_base").unwrap_or(1_000_000.0);
    let settings = GemmaSettings {
        query_pre_attn_scalar,
        local_rope_theta: meta.f64("rope.local_freq_base").unwrap_or(10_000.0),
        global_rope_factor,
        final_logit_softcapping: meta.f64("final_logit_softcapping"),
    };
    let window = meta
        .opt_u32("attention.sliding_window")
        .map_or(4096, |w| w.max(1) as usize);
    common(cfg, settings, SlidingWindows { window, sliding });
    Ok(())
}
