//! One model description for every supported architecture, read from a Hugging Face `config.json`
//! (`hf_config.rs`) or from GGUF metadata (`loader::gguf`).

pub use super::gemma3::GemmaSettings;
pub use super::gpt_oss::GptOssSettings;
pub use super::moe::{ExpertActivation, ExpertNames, MoeSettings};
pub use super::rope_scaling::{Llama3RopeScaling, LongRope, Yarn};

/// Supported architectures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Architecture {
    /// Llama 2/3/3.1/3.2, SmolLM/SmolLM2, Mistral (same graph; a sliding window caps the context
    /// at the window, where full attention and windowed attention agree).
    Llama,
    /// Qwen2 / Qwen2.5: Llama with biases on the q/k/v projections.
    Qwen2,
    /// Qwen3 (dense): Llama with an RMSNorm on each query and key head before rotary.
    Qwen3,
    /// Phi-3 / Phi-4: Llama with q/k/v in one `qkv_proj` and gate/up in one `gate_up_proj`.
    Phi3,
    /// Meta's OPT (`facebook/opt-*`).
    Opt,
    /// OpenAI's GPT-2: learned positions, LayerNorm, GELU (tanh), Conv1D (`[in, out]`) weights.
    Gpt2,
    /// EleutherAI's GPT-NeoX (Pythia, GPT-NeoX-20B): parallel residual, partial rotary.
    GptNeox,
    /// Google's Gemma 3 (text): see [`super::gemma3`].
    Gemma3,
    /// OpenAI's gpt-oss: see [`super::gpt_oss`].
    GptOss,
}

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

/// GPT-NeoX settings.
#[derive(Clone, Debug, PartialEq)]
pub struct NeoxSettings {
    /// `x + attn(ln1(x)) + mlp(ln2(x))` instead of one after the other.
    pub parallel_residual: bool,
    /// GELU by its tanh approximation (`gelu_new`) instead of the exact one (`gelu`).
    pub gelu_tanh: bool,
}

/// Everything the model code needs, whatever the source format.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    /// Which graph to build.
    pub architecture: Architecture,
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
    /// OPT-only settings.
    pub opt: Option<OptSettings>,
    /// GPT-NeoX-only settings.
    pub neox: Option<NeoxSettings>,
    /// Gemma 3-only settings.
    pub gemma: Option<GemmaSettings>,
    /// gpt-oss-only settings.
    pub gpt_oss: Option<GptOssSettings>,
    /// The experts of a mixture-of-experts model (Mixtral, Qwen3-MoE, gpt-oss).
    pub moe: Option<MoeSettings>,
    /// Leading dimensions of each head that rotary turns: `head_dim`, or
    /// `partial_rotary_factor * head_dim` (GPT-NeoX, Phi-4-mini); the rest pass through.
    pub rotary_dim: usize,
}

impl ModelConfig {
    /// Leading dimensions of each head that rotary turns (all of them but with partial rotary).
    pub fn rotary_dim(&self) -> usize {
        self.rotary_dim
    }

    /// The layers that attend over a sliding window, and the window, for models that mix them
    /// with full-attention layers (Gemma 3, gpt-oss): `(window, sliding[layer])`.
    pub fn sliding_layers(&self) -> Option<(usize, &[bool])> {
        match (&self.gemma, &self.gpt_oss) {
            (Some(g), _) => Some((g.sliding_window, &g.sliding)),
            (_, Some(g)) => Some((g.sliding_window, &g.sliding)),
            _ => None,
        }
    }

    /// Bytes of KV cache one token takes in all layers for `kv_heads` of the KV heads (all of
    /// them, or a tensor-parallel rank's), at `dtype_bytes` per element.
    pub fn kv_bytes_per_token(&self, kv_heads: usize, dtype_bytes: usize) -> usize {
        2 * self.num_hidden_layers * kv_heads * self.head_dim * dtype_bytes
    }
}
