//! One model description for every supported architecture, read from a Hugging Face `config.json`
//! (`hf_config.rs`) or from GGUF metadata (`gguf_config.rs`): the shared fields, then what the
//! architecture's own file reads ([`super::registry`]).

pub use super::gemma3::config::GemmaSettings;
pub use super::gpt_neox::NeoxSettings;
pub use super::moe::{ExpertActivation, ExpertNames, MoeSettings};
pub use super::opt::OptSettings;
pub use super::registry::Arch;
pub use super::rope_scaling::{Llama3RopeScaling, LongRope, Yarn};

/// The settings only one architecture has, in that architecture's own type.
#[derive(Clone, Debug, PartialEq)]
pub enum ArchSettings {
    /// Nothing beyond the shared fields.
    None,
    /// OPT's.
    Opt(OptSettings),
    /// GPT-NeoX's.
    Neox(NeoxSettings),
    /// Gemma 3's.
    Gemma3(GemmaSettings),
}

/// Layers that attend over a sliding window, between full-attention ones (Gemma 3, gpt-oss).
#[derive(Clone, Debug, PartialEq)]
pub struct SlidingWindows {
    /// Positions a sliding layer's query sees, itself included.
    pub window: usize,
    /// Which layers slide.
    pub sliding: Vec<bool>,
}

/// Everything the model code needs, whatever the source format.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    /// The architecture: which graph to build, and what it supports.
    pub arch: &'static Arch,
    /// Vocabulary size (rows of the embedding and the LM head).
    pub vocab_size: usize,
    /// Residual stream width.
    pub hidden_size: usize,
    /// MLP inner width.
    pub intermediate_size: usize,
    /// Decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// KV heads (GQA when fewer than query heads).
    pub num_key_value_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// RMSNorm / LayerNorm epsilon.
    pub norm_eps: f64,
    /// Rotary base.
    pub rope_theta: f64,
    /// Llama 3.1 rotary scaling, if any.
    pub rope_scaling: Option<Llama3RopeScaling>,
    /// Phi-3's LongRoPE scaling, if any.
    pub longrope: Option<LongRope>,
    /// YaRN scaling (gpt-oss; Qwen's long-context settings), if any.
    pub yarn: Option<Yarn>,
    /// Rotary applied to interleaved pairs (GGUF llama weights) instead of rotate-half (HF).
    pub rope_interleaved: bool,
    /// Longest context the model supports.
    pub max_position_embeddings: usize,
    /// LM head shares the embedding matrix.
    pub tie_word_embeddings: bool,
    /// Biases on q/k/v (Qwen2, or Llama's `attention_bias`).
    pub qkv_bias: bool,
    /// An RMSNorm over each query and key head before rotary (Qwen3).
    pub qk_norm: bool,
    /// Bias on the attention output projection (Llama's `attention_bias`).
    pub o_bias: bool,
    /// Biases on the MLP projections (Llama's `mlp_bias`).
    pub mlp_bias: bool,
    /// Beginning-of-sequence token, if the model has one.
    pub bos_token_id: Option<u32>,
    /// End-of-sequence tokens.
    pub eos_token_ids: Vec<u32>,
    /// Q/k/v stored stacked in one `qkv_proj`, and gate/up in one `gate_up_proj` (Phi-3).
    pub stacked_projections: bool,
    /// RMSNorm weights stored as `w` that scale by `1 + w` (Gemma's checkpoints; llama.cpp's
    /// GGUF files store `1 + w`).
    pub norms_plus_one: bool,
    /// The gated MLP takes GELU (tanh) of the gate instead of SiLU (Gemma's GeGLU).
    pub gelu_mlp: bool,
    /// Sliding-window layers, where the architecture implements them.
    pub sliding: Option<SlidingWindows>,
    /// The architecture's own settings.
    pub settings: ArchSettings,
    /// The experts of a mixture-of-experts model (Mixtral, Qwen3-MoE, gpt-oss).
    pub moe: Option<MoeSettings>,
    /// Leading dimensions of each head that rotary turns: `head_dim`, or
    /// `partial_rotary_factor * head_dim` (GPT-NeoX, Phi-4-mini); the rest pass through.
    pub rotary_dim: usize,
    /// A quantized checkpoint's layout (FP8 or integer weights, dequantized at load); `None`
    /// for any other.
    pub quantization: Option<super::quantized::CheckpointQuant>,
}

impl ModelConfig {
    /// Leading dimensions of each head that rotary turns (all of them but with partial rotary).
    pub fn rotary_dim(&self) -> usize {
        self.rotary_dim
    }

    /// The layers that attend over a sliding window, and the window, for models that mix them
    /// with full-attention layers (Gemma 3, gpt-oss): `(window, sliding[layer])`.
    pub fn sliding_layers(&self) -> Option<(usize, &[bool])> {
        let s = self.sliding.as_ref()?;
        Some((s.window, &s.sliding))
    }

    /// Bytes of KV cache one token takes in all layers for `kv_heads` of the KV heads (all of
    /// them, or a tensor-parallel rank's), at `dtype_bytes` per element.
    pub fn kv_bytes_per_token(&self, kv_heads: usize, dtype_bytes: usize) -> usize {
        2 * self.num_hidden_layers * kv_heads * self.head_dim * dtype_bytes
    }
}
