//! Models on the paged KV cache. A model gets the batch and the KV cache as arguments to `forward`;
//! it never stores either. Each architecture's file declares its [`registry::Arch`]; adding one is
//! that file plus its line in [`registry::ARCHITECTURES`].

pub mod affine_linear;
pub mod attention;
#[cfg(feature = "cuda")]
mod attention_cuda;
pub mod batch;
pub mod checkpoint;
pub mod config;
#[cfg(feature = "cuda")]
pub mod decode_fused;
mod dummy_weights;
pub mod eagle3;
pub mod embedding;
pub mod fp8;
pub mod fp8_linear;
pub mod gemma3;
pub mod gguf_affine;
pub mod gguf_config;
pub(crate) mod gguf_weights;
mod glu;
pub mod gpt2;
pub mod gpt_neox;
pub mod gpt_oss;
pub mod hf_config;
mod host;
pub mod int4_linear;
pub mod int4_pack;
pub mod int_unpack;
pub mod int_weights;
pub mod layers;
pub mod llama;
mod lm_head;
pub mod moe;
#[cfg(feature = "cuda")]
mod moe_affine;
#[cfg(feature = "cuda")]
mod moe_device;
mod moe_settings;
#[cfg(feature = "cuda")]
mod moe_sorted;
pub(crate) mod mxfp4;
pub mod norm;
pub mod opt;
pub mod qkv;
pub mod quantized;
pub mod registry;
pub mod rope_scaling;
pub mod rotary;
mod sharding;
mod weight_parts;
pub mod weights;

use candle_core::Tensor;

pub use attention::{KvCache, KvElements, KvLayout};
pub use batch::ForwardBatch;
pub use config::ModelConfig;
pub use registry::Arch;
pub use weights::Weights;

use crate::parallel::{Parallel, TpRank};

/// Why a model could not be loaded or run.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A tensor operation failed.
    #[error("tensor error: {0}")]
    Candle(#[from] candle_core::Error),
    /// The model's configuration is malformed.
    #[error("bad model config: {0}")]
    Config(String),
    /// The model uses something pagewise does not implement.
    #[error("unsupported model: {0}")]
    Unsupported(String),
    /// A weight the architecture needs is absent.
    #[error("missing weight tensor {0}")]
    MissingTensor(String),
}

/// A causal language model over the paged KV cache.
pub trait CausalLm: Send {
    /// The model's configuration.
    fn config(&self) -> &ModelConfig;

    /// The tensor-parallel rank whose shard this is (the whole model: [`TpRank::SINGLE`]). Its
    /// KV cache holds [`ModelConfig::kv_heads`] of the model's KV heads.
    fn tp_rank(&self) -> TpRank {
        TpRank::SINGLE
    }

    /// Runs the packed batch, writing its K/V into `kv`, and returns f32 logits
    /// `[batch.num_sample_rows, vocab]` for the sampled rows only.
    fn forward(&self, batch: &ForwardBatch<'_>, kv: &mut KvCache) -> Result<Tensor, ModelError>;

    /// The most sequences a decode step may hold to be captured in a CUDA graph: `None` when the
    /// model sets no limit of its own, `Some(0)` for never. A mixture of experts whose larger
    /// steps read the routing back to the host caps it.
    fn graph_batch_limit(&self) -> Option<usize> {
        None
    }

    /// The most rows a step may hold for the fused decode path (src/model/decode_fused.rs) to
    /// take it with `kv`; 0 when no step does (the CPU, f32, partial rotary, weights its kernels
    /// do not stage). The runner logs it at startup.
    fn fused_decode_rows(&self, kv: &KvCache) -> usize {
        let _ = kv;
        0
    }

    /// [`CausalLm::forward`] with the logits left in the model's own dtype (bf16 on a GPU): the
    /// GPU sampler reads them as they are, so a step skips the cast. The runner calls this one.
    fn forward_native(
        &self,
        batch: &ForwardBatch<'_>,
        kv: &mut KvCache,
    ) -> Result<Tensor, ModelError> {
        self.forward(batch, kv)
    }

    /// [`CausalLm::forward_native`] that also returns, for every token row of the batch, the
    /// residual streams entering the decoder layers `layers` (each below the layer count),
    /// concatenated in that order: `[tokens, layers.len() * hidden]`, what an EAGLE-3 head reads.
    /// Models that cannot say so.
    fn forward_keeping(
        &self,
        batch: &ForwardBatch<'_>,
        kv: &mut KvCache,
        layers: &[usize],
    ) -> Result<(Tensor, Tensor), ModelError> {
        let _ = (batch, kv, layers);
        Err(ModelError::Unsupported(format!(
            "{} does not give its hidden states to an EAGLE-3 head (the Llama family does)",
            self.config().arch.name
        )))
    }

    /// The token embedding, where an EAGLE-3 head may share it.
    fn token_embedding(&self) -> Option<&embedding::TokenEmbedding> {
        None
    }
}

/// Builds the model `cfg` describes from `weights`; rotary tables cover `max_len` positions.
pub fn build(
    cfg: &ModelConfig,
    weights: &Weights,
    max_len: usize,
) -> Result<Box<dyn CausalLm>, ModelError> {
    build_sharded(cfg, weights, max_len, &Parallel::single())
}

/// [`build`] for one rank of a tensor-parallel group: the rank's shard of every split layer,
/// with `par`'s collectives joining the ranks' parts.
pub fn build_sharded(
    cfg: &ModelConfig,
    weights: &Weights,
    max_len: usize,
    par: &Parallel,
) -> Result<Box<dyn CausalLm>, ModelError> {
    if !par.rank.is_single() {
        let expert_parallel = matches!(par.experts(), crate::parallel::ExpertShard::Whole(_));
        cfg.check_tensor_parallel(par.rank.size, expert_parallel)
            .map_err(ModelError::Unsupported)?;
    }
    (cfg.arch.build)(cfg, weights, max_len, par)
}
