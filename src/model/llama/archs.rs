//! The architectures that run on the Llama graph ([`super::Llama`]), each with its names, what it
//! reads beyond the shared config and what it supports.

use super::Llama;
use crate::model::config::{ExpertNames, LongRope, ModelConfig};
use crate::model::gguf_config::GgufMeta;
use crate::model::registry::{Arch, Rope, Supports};
use crate::model::weights::Weights;
use crate::model::{CausalLm, ModelError, moe};
use crate::parallel::Parallel;

fn build(
    cfg: &ModelConfig,
    w: &Weights,
    max_len: usize,
    par: &Parallel,
) -> Result<Box<dyn CausalLm>, ModelError> {
    Ok(Box::new(Llama::load(cfg, w, max_len, par)?))
}

const SHARDED: Supports = Supports {
    tensor_parallel: true,
    sliding_window: false,
    rope: Rope::Full,
    quantization: &[],
};

/// Llama 2/3/3.1/3.2, SmolLM/SmolLM2, Mistral (a sliding window caps the context at the window,
/// where full attention and windowed attention agree).
pub static LLAMA: Arch = Arch {
    name: "Llama",
    hf_names: &["LlamaForCausalLM", "MistralForCausalLM", "llama", "mistral"],
    gguf_names: &["llama"],
    supports: SHARDED,
    from_hf: Arch::shared_hf_only,
    from_gguf: llama_gguf,
    build,
};

/// llama.cpp's converter permutes Llama's q/k rows for interleaved rotary; its `llama` files
/// hold Mixtral's experts too.
fn llama_gguf(cfg: &mut ModelConfig, meta: &mut GgufMeta<'_>) -> Result<(), ModelError> {
    cfg.rope_interleaved = true;
    cfg.moe = moe::gguf_settings(meta, ExpertNames::Mixtral)?;
    Ok(())
}

/// Mistral's mixture of experts.
pub static MIXTRAL: Arch = Arch {
    name: "Mixtral",
    hf_names: &["MixtralForCausalLM", "mixtral"],
    gguf_names: &[],
    supports: SHARDED,
    from_hf: |cfg, c| {
        cfg.moe = Some(moe::settings(c, ExpertNames::Mixtral)?);
        Ok(())
    },
    from_gguf: Arch::shared_gguf_only,
    build,
};

/// Qwen2 / Qwen2.5: Llama with biases on the q/k/v projections.
pub static QWEN2: Arch = Arch {
    name: "Qwen2",
    hf_names: &["Qwen2ForCausalLM", "qwen2"],
    gguf_names: &["qwen2"],
    supports: SHARDED,
    from_hf: |cfg, _| {
        cfg.qkv_bias = true;
        Ok(())
    },
    from_gguf: Arch::shared_gguf_only,
    build,
};

/// Qwen3 (dense): Llama with an RMSNorm on each query and key head before rotary.
pub static QWEN3: Arch = Arch {
    name: "Qwen3",
    hf_names: &["Qwen3ForCausalLM", "qwen3"],
    gguf_names: &["qwen3"],
    supports: SHARDED,
    from_hf: |cfg, _| {
        cfg.qk_norm = true;
        Ok(())
    },
    from_gguf: qwen3_gguf,
    build,
};

fn qwen3_gguf(cfg: &mut ModelConfig, meta: &mut GgufMeta<'_>) -> Result<(), ModelError> {
    cfg.qk_norm = true;
    cfg.moe = moe::gguf_settings(meta, ExpertNames::Qwen)?;
    Ok(())
}

/// Qwen3-MoE: Qwen3 with a mixture of experts in every (or every `decoder_sparse_step`th) layer.
pub static QWEN3_MOE: Arch = Arch {
    name: "Qwen3-MoE",
    hf_names: &["Qwen3MoeForCausalLM", "qwen3_moe"],
    gguf_names: &["qwen3moe"],
    supports: SHARDED,
    from_hf: |cfg, c| {
        cfg.qk_norm = true;
        cfg.moe = Some(moe::settings(c, ExpertNames::Qwen)?);
        Ok(())
    },
    from_gguf: qwen3_gguf,
    build,
};

/// Phi-3 / Phi-4: Llama with q/k/v in one `qkv_proj` and gate/up in one `gate_up_proj` (not
/// sharded), LongRoPE, and (Phi-4-mini) rotary over part of each head.
pub static PHI3: Arch = Arch {
    name: "Phi-3",
    hf_names: &["Phi3ForCausalLM", "phi3"],
    gguf_names: &["phi3"],
    supports: Supports {
        tensor_parallel: false,
        rope: Rope::Partial,
        ..SHARDED
    },
    from_hf: |cfg, _| {
        cfg.stacked_projections = true;
        Ok(())
    },
    from_gguf: phi3_gguf,
    build,
};

fn phi3_gguf(cfg: &mut ModelConfig, meta: &mut GgufMeta<'_>) -> Result<(), ModelError> {
    cfg.stacked_projections = true;
    cfg.gguf_partial_rotary(meta);
    cfg.longrope = longrope(meta)?;
    Ok(())
}

/// Phi-3's LongRoPE as llama.cpp's converter writes it: the per-frequency divisors in the tensors
/// `rope_factors_short` / `rope_factors_long`, the pre-training context in
/// `rope.scaling.original_context_length` and the cos/sin scale in `rope.scaling.attn_factor`
/// (else vLLM's default from the two contexts). `None` without the tensors.
fn longrope(meta: &mut GgufMeta<'_>) -> Result<Option<LongRope>, ModelError> {
    let (short, long) = ("rope_factors_short.weight", "rope_factors_long.weight");
    if !meta.has_tensor(long) {
        return Ok(None);
    }
    let factors = |v: Vec<f32>| v.into_iter().map(f64::from).collect::<Vec<_>>();
    let (short_factor, long_factor) = (
        factors(meta.read_f32(short)?),
        factors(meta.read_f32(long)?),
    );
    let context = meta.opt_u32("context_length").map_or(2048, |v| v as usize);
    let original = meta.u32("rope.scaling.original_context_length")? as usize;
    let extension = context as f64 / original.max(1) as f64;
    let attention_factor = meta
        .f64("rope.scaling.attn_factor")
        .unwrap_or(match extension <= 1.0 {
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
