//! A single GGUF file as a model: configuration, tokenizer and chat template from its metadata,
//! weights kept quantized (or dequantized at load on request).

use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::{DType, Device};
use tokenizers::Tokenizer;

use super::gguf_file;
use super::gguf_tokenizer::tokenizer_from_gguf;
use super::{GgufMatmul, LoadError};
use crate::model::config::{
    Architecture, ExpertActivation, ExpertNames, GemmaSettings, GptOssSettings, LongRope,
    ModelConfig, MoeSettings, NeoxSettings,
};
use crate::model::mxfp4::GgufMxfp4;
use crate::model::rope_scaling::{Yarn, parse_yarn};
use crate::model::weights::{Dequantize, Weights};

/// What a GGUF file provides besides weights.
pub struct GgufModel {
    /// The model configuration.
    pub config: ModelConfig,
    /// The tokenizer rebuilt from `tokenizer.ggml.*`.
    pub tokenizer: Tokenizer,
    /// `tokenizer.chat_template`, if present.
    pub chat_template: Option<String>,
    /// The tensors.
    pub weights: Weights,
}

pub(super) fn md<'a>(ct: &'a Content, key: &str) -> Result<&'a Value, LoadError> {
    ct.metadata
        .get(key)
        .ok_or_else(|| LoadError::Format(format!("GGUF metadata has no `{key}`")))
}

pub(super) fn md_u32(ct: &Content, key: &str) -> Result<u32, LoadError> {
    let v = md(ct, key)?;
    v.to_u32()
        .or_else(|_| v.to_u64().map(|x| x as u32))
        .or_else(|_| v.to_i32().map(|x| x as u32))
        .map_err(|e| LoadError::Format(format!("GGUF `{key}`: {e}")))
}

fn md_f64(ct: &Content, key: &str) -> Option<f64> {
    let v = ct.metadata.get(key)?;
    v.to_f32().map(f64::from).or_else(|_| v.to_f64()).ok()
}

pub(super) fn md_strings(ct: &Content, key: &str) -> Result<Vec<String>, LoadError> {
    let bad = |e: candle_core::Error| LoadError::Format(format!("GGUF `{key}`: {e}"));
    md(ct, key)?
        .to_vec()
        .map_err(bad)?
        .iter()
        .map(|v| v.to_string().cloned().map_err(bad))
        .collect()
}

/// Reads `path`; tensors go to `device`, dense ones (norms, embeddings) in `dtype`.
pub fn load(
    path: &Path,
    device: &Device,
    dtype: DType,
    matmul: GgufMatmul,
) -> Result<GgufModel, LoadError> {
    let io = |e: std::io::Error| LoadError::Io(format!("{}: {e}", path.display()));
    let mut file = std::io::BufReader::new(std::fs::File::open(path).map_err(io)?);
    let header = gguf_file::read(&mut file)
        .map_err(|e| LoadError::Format(format!("{}: {e}", path.display())))?;
    let ct = &header.content;
    let arch = md(ct, "general.architecture")?
        .to_string()
        .map_err(|e| LoadError::Format(e.to_string()))?
        .clone();
    let architecture = match arch.as_str() {
        "llama" => Architecture::Llama,
        "qwen2" => Architecture::Qwen2,
        "qwen3" | "qwen3moe" => Architecture::Qwen3,
        "phi3" => Architecture::Phi3,
        "gemma3" => Architecture::Gemma3,
        "gpt2" => Architecture::Gpt2,
        "gptneox" => Architecture::GptNeox,
        "gpt-oss" => Architecture::GptOss,
        other => {
            return Err(LoadError::Format(format!(
                "GGUF architecture {other:?} is not supported (supported: llama (Mixtral's \
                 experts included), qwen2, qwen3, qwen3moe, phi3, gemma3, gpt2, gptneox, gpt-oss)"
            )));
        }
    };
    // Metadata keys are prefixed by the architecture's name.
    let key = |k: &str| format!("{arch}.{k}");
    let tokens = md_strings(ct, "tokenizer.ggml.tokens")?;
    let heads = md_u32(ct, &key("attention.head_count"))? as usize;
    let hidden = md_u32(ct, &key("embedding_length"))? as usize;
    let eos = md_u32(ct, "tokenizer.ggml.eos_token_id").ok();
    // Qwen3's head width is not hidden / heads: `attention.key_length` says it. Phi-3's
    // `rope.dimension_count` is the rotary part of a head (Phi-4-mini turns 3/4 of it).
    let phi3 = architecture == Architecture::Phi3;
    // GPT-2 and GPT-NeoX: LayerNorm with biases everywhere; NeoX turns `rope.dimension_count`
    // of each head.
    let legacy = matches!(architecture, Architecture::Gpt2 | Architecture::GptNeox);
    let head_dim = match md_u32(ct, &key("attention.key_length")) {
        Ok(v) => v as usize,
        Err(_) if phi3 || legacy => hidden / heads,
        Err(_) => md_u32(ct, &key("rope.dimension_count")).map_or(hidden / heads, |v| v as usize),
    };
    let rotary_dim = match phi3 || legacy {
        true => md_u32(ct, &key("rope.dimension_count")).map_or(head_dim, |v| v as usize),
        false => head_dim,
    };
    let context = md_u32(ct, &key("context_length")).map_or(2048, |v| v as usize);
    // Phi-3-mini's window (llama.cpp writes 0 for none) caps the context, as in config.json.
    let gemma = match architecture {
        Architecture::Gemma3 => Some(gemma_settings(ct, &arch, head_dim)?),
        _ => None,
    };
    let gpt_oss = match architecture {
        Architecture::GptOss => Some(gpt_oss_settings(ct, &arch, context)?),
        _ => None,
    };
    let max_position_embeddings = match md_u32(ct, &key("attention.sliding_window")) {
        Ok(w) if gemma.is_none() && gpt_oss.is_none() && w > 0 && (w as usize) < context => {
            w as usize
        }
        _ => context,
    };
    let longrope = longrope(ct, &mut file, &arch, context)?;
    let config = ModelConfig {
        architecture,
        qk_norm: matches!(architecture, Architecture::Qwen3 | Architecture::Gemma3),
        vocab_size: tokens.len(),
        hidden_size: hidden,
        intermediate_size: md_u32(ct, &key("feed_forward_length"))? as usize,
        num_hidden_layers: md_u32(ct, &key("block_count"))? as usize,
        num_attention_heads: heads,
        num_key_value_heads: md_u32(ct, &key("attention.head_count_kv"))
            .map_or(heads, |v| v as usize),
        head_dim,
        norm_eps: md_f64(ct, &key("attention.layer_norm_rms_epsilon"))
            .or_else(|| md_f64(ct, &key("attention.layer_norm_epsilon")))
            .unwrap_or(1e-5),
        rope_theta: md_f64(ct, &key("rope.freq_base")).unwrap_or(match gemma {
            Some(_) => 1_000_000.0,
            None => 10_000.0,
        }),
        rope_scaling: None,
        longrope,
        yarn: gpt_oss.as_ref().and_then(|(_, yarn)| yarn.clone()),
        gpt_oss: gpt_oss.map(|(settings, _)| settings),
        // llama.cpp's converter permutes Llama's q/k rows for interleaved rotary; Qwen's stay in
        // the rotate-half order.
        rope_interleaved: architecture == Architecture::Llama,
        max_position_embeddings,
        // (GPT-2's head is its embedding, whatever the file holds.)
        tie_word_embeddings: architecture == Architecture::Gpt2
            || !ct.tensor_infos.contains_key("output.weight"),
        qkv_bias: legacy || ct.tensor_infos.contains_key("blk.0.attn_q.bias"),
        o_bias: legacy || ct.tensor_infos.contains_key("blk.0.attn_output.bias"),
        mlp_bias: legacy,
        bos_token_id: md_u32(ct, "tokenizer.ggml.bos_token_id").ok(),
        eos_token_ids: eos.into_iter().collect(),
        opt: None,
        // llama.cpp's files do not name NeoX's activation: Pythia's (and GPT-NeoX-20B's) exact
        // GELU.
        neox: (architecture == Architecture::GptNeox).then(|| NeoxSettings {
            parallel_residual: ct
                .metadata
                .get(&key("use_parallel_residual"))
                .and_then(|v| v.to_bool().ok())
                .unwrap_or(true),
            gelu_tanh: false,
        }),
        gemma,
        moe: moe_settings(ct, &arch)?,
        rotary_dim,
    };
    let tokenizer = tokenizer_from_gguf(ct, &tokens)?;
    let chat_template = ct
        .metadata
        .get("tokenizer.chat_template")
        .and_then(|v| v.to_string().ok().cloned());

    let mxfp4 = GgufMxfp4::new(path.to_path_buf(), ct.tensor_data_offset, &header.mxfp4);
    let num_params: usize = ct
        .tensor_infos
        .values()
        .map(|t| t.shape.elem_count())
        .sum::<usize>()
        + mxfp4.num_params();
    let dequantize = match matmul {
        GgufMatmul::Quantized => Dequantize::Nothing,
        GgufMatmul::Dequantized => Dequantize::All,
        GgufMatmul::Auto if device.is_cpu() && num_params * 4 <= 4 << 30 => {
            Dequantize::WithoutCpuKernel
        }
        GgufMatmul::Auto => Dequantize::Nothing,
    };
    tracing::info!(num_params, ?dequantize, "GGUF weights");
    let mut tensors = HashMap::new();
    for name in ct.tensor_infos.keys() {
        let t = ct
            .tensor(&mut file, name, device)
            .map_err(|e| LoadError::Format(format!("GGUF tensor {name}: {e}")))?;
        tensors.insert(name.clone(), t);
    }
    // MXFP4 tensors (gpt-oss's experts) are read as the model asks for them, a layer at a time.
    Ok(GgufModel {
        config,
        tokenizer,
        chat_template,
        weights: Weights::Gguf {
            tensors,
            dtype,
            device: device.clone(),
            dequantize,
            mxfp4,
        },
    })
}

/// Only the tokenizer of a GGUF file (reads the metadata, not the tensors).
pub fn load_tokenizer(path: &Path) -> Result<Tokenizer, LoadError> {
    let io = |e: std::io::Error| LoadError::Io(format!("{}: {e}", path.display()));
    let mut file = std::io::BufReader::new(std::fs::File::open(path).map_err(io)?);
    let header = gguf_file::read(&mut file)
        .map_err(|e| LoadError::Format(format!("{}: {e}", path.display())))?;
    let tokens = md_strings(&header.content, "tokenizer.ggml.tokens")?;
    tokenizer_from_gguf(&header.content, &tokens)
}

/// Gemma 3's settings from `gemma3.*`, as llama.cpp reads them: the local layers every layer but
/// each sixth (or as `attention.sliding_window_pattern` says, a period or a flag per layer), their
/// rotary base 10,000, linear rope scaling on the global layers only, scores scaled by
/// `attention.scale` or else by `head_dim^-½` (`(hidden / heads)^-½` for the 62-layer 27B).
fn gemma_settings(ct: &Content, arch: &str, head_dim: usize) -> Result<GemmaSettings, LoadError> {
    let key = |k: &str| format!("{arch}.{k}");
    let layers = md_u32(ct, &key("block_count"))? as usize;
    let pattern = ct.metadata.get(&key("attention.sliding_window_pattern"));
    let sliding = match pattern.map(|v| v.to_vec()) {
        Some(Ok(flags)) => flags
            .iter()
            .map(|f| f.to_bool())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| LoadError::Format(format!("GGUF sliding_window_pattern: {e}")))?,
        _ => {
            let period = md_u32(ct, &key("attention.sliding_window_pattern"))
                .unwrap_or(6)
                .max(1);
            (0..layers)
                .map(|i| (i + 1) % period as usize != 0)
                .collect()
        }
    };
    if sliding.len() != layers {
        return Err(LoadError::Format(format!(
            "GGUF sliding_window_pattern: {} flags for {layers} layers",
            sliding.len()
        )));
    }
    let global_rope_factor = match ct.metadata.get(&key("rope.scaling.type")) {
        None => 1.0,
        Some(t) => match t.to_string().map(String::as_str) {
            Ok("linear") => md_f64(ct, &key("rope.scaling.factor")).unwrap_or(1.0),
            Ok("none") => 1.0,
            other => {
                return Err(LoadError::Format(format!(
                    "GGUF Gemma 3 with rope scaling {other:?} is not supported (linear is)"
                )));
            }
        },
    };
    let query_pre_attn_scalar = match md_f64(ct, &key("attention.scale")) {
        Some(scale) if scale > 0.0 => 1.0 / (scale * scale),
        _ if layers == 62 => {
            let hidden = md_u32(ct, &key("embedding_length"))? as f64;
            hidden / md_u32(ct, &key("attention.head_count"))? as f64
        }
        _ => head_dim as f64,
    };
    Ok(GemmaSettings {
        query_pre_attn_scalar,
        sliding_window: md_u32(ct, &key("attention.sliding_window"))
            .map_or(4096, |w| w.max(1) as usize),
        sliding,
        local_rope_theta: md_f64(ct, &key("rope.local_freq_base")).unwrap_or(10_000.0),
        global_rope_factor,
        final_logit_softcapping: md_f64(ct, &key("final_logit_softcapping")),
    })
}

/// gpt-oss's settings from `gpt-oss.*`, as llama.cpp reads them: sliding-window layers and full
/// ones alternating, the first sliding (`attention.sliding_window` positions), and YaRN from
/// `rope.scaling.*` (the factor, the pre-training context, the betas when given), its ramp not
/// rounded to whole dimensions, as gpt-oss's `config.json` says.
fn gpt_oss_settings(
    ct: &Content,
    arch: &str,
    context: usize,
) -> Result<(GptOssSettings, Option<Yarn>), LoadError> {
    let key = |k: &str| format!("{arch}.{k}");
    let layers = md_u32(ct, &key("block_count"))? as usize;
    let settings = GptOssSettings {
        sliding_window: md_u32(ct, &key("attention.sliding_window")).map_or(128, |w| w.max(1))
            as usize,
        sliding: (0..layers).map(|i| i % 2 == 0).collect(),
    };
    let scaling = ct
        .metadata
        .get(&key("rope.scaling.type"))
        .and_then(|t| t.to_string().ok().cloned());
    let yarn = match scaling.as_deref() {
        None | Some("none") => None,
        Some("yarn") => {
            let mut v = serde_json::json!({ "truncate": false });
            let keys = [
                ("factor", "rope.scaling.factor"),
                ("beta_fast", "rope.scaling.yarn_beta_fast"),
                ("beta_slow", "rope.scaling.yarn_beta_slow"),
            ];
            for (name, k) in keys {
                if let Some(x) = md_f64(ct, &key(k)) {
                    v[name] = x.into();
                }
            }
            let original = md_u32(ct, &key("rope.scaling.original_context_length")).ok();
            Some(
                parse_yarn(&v, Some(context), original.map(|o| o as usize))
                    .map_err(|e| LoadError::Format(format!("GGUF gpt-oss: {e}")))?,
            )
        }
        Some(other) => {
            return Err(LoadError::Format(format!(
                "GGUF gpt-oss with rope scaling {other:?} is not supported (yarn is)"
            )));
        }
    };
    Ok((settings, yarn))
}

/// Phi-3's LongRoPE as llama.cpp's converter writes it: the per-frequency divisors in the tensors
/// `rope_factors_short` / `rope_factors_long`, the pre-training context in
/// `rope.scaling.original_context_length` and the cos/sin scale in `rope.scaling.attn_factor`
/// (else vLLM's default from the two contexts). `None` without the tensors.
fn longrope<R: std::io::Seek + std::io::Read>(
    ct: &Content,
    file: &mut R,
    arch: &str,
    context: usize,
) -> Result<Option<LongRope>, LoadError> {
    let (short, long) = ("rope_factors_short.weight", "rope_factors_long.weight");
    if !ct.tensor_infos.contains_key(long) {
        return Ok(None);
    }
    let mut factors = |name: &str| -> Result<Vec<f64>, LoadError> {
        let bad = |e: candle_core::Error| LoadError::Format(format!("GGUF tensor {name}: {e}"));
        let t = ct.tensor(file, name, &Device::Cpu).map_err(bad)?;
        let v = t.dequantize(&Device::Cpu).map_err(bad)?;
        let v = v
            .flatten_all()
            .and_then(|v| v.to_vec1::<f32>())
            .map_err(bad)?;
        Ok(v.into_iter().map(f64::from).collect())
    };
    let (short_factor, long_factor) = (factors(short)?, factors(long)?);
    let original = md_u32(ct, &format!("{arch}.rope.scaling.original_context_length"))? as usize;
    let extension = context as f64 / original.max(1) as f64;
    let attention_factor =
        md_f64(ct, &format!("{arch}.rope.scaling.attn_factor")).unwrap_or(match extension <= 1.0 {
            true => 1.0,
            false => (1.0 + extension.ln() / (original as f64).ln()).sqrt(),
        });
    Ok(Some(LongRope {
        short_factor,
        long_factor,
        original_max_position_embeddings: original,
        attention_factor,
    }))
}

/// A mixture of experts' settings from `<arch>.expert_*` (Mixtral as `llama`, `qwen3moe`): a
/// layer is sparse where it has a router (`blk.N.ffn_gate_inp`); llama.cpp renormalizes the
/// chosen experts' weights for both.
fn moe_settings(ct: &Content, arch: &str) -> Result<Option<MoeSettings>, LoadError> {
    let key = |k: &str| format!("{arch}.{k}");
    let Ok(num_experts) = md_u32(ct, &key("expert_count")) else {
        return Ok(None);
    };
    let layers = md_u32(ct, &key("block_count"))? as usize;
    let dense = md_u32(ct, &key("feed_forward_length")).unwrap_or(0) as usize;
    Ok(Some(MoeSettings {
        num_experts: num_experts as usize,
        top_k: md_u32(ct, &key("expert_used_count"))? as usize,
        renormalize: true,
        expert_intermediate: md_u32(ct, &key("expert_feed_forward_length"))
            .map_or(dense, |v| v as usize),
        sparse: (0..layers)
            .map(|i| {
                ct.tensor_infos
                    .contains_key(&format!("blk.{i}.ffn_gate_inp.weight"))
            })
            .collect(),
        names: match arch {
            "llama" => ExpertNames::Mixtral,
            "gpt-oss" => ExpertNames::GptOss,
            _ => ExpertNames::Qwen,
        },
        // (gpt-oss's clamp is not in llama.cpp's metadata: the released models' 7.)
        activation: match arch {
            "gpt-oss" => ExpertActivation::ClampedSwiglu {
                alpha: 1.702,
                limit: 7.0,
            },
            _ => ExpertActivation::SiluMul,
        },
    }))
}
