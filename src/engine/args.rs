//! Engine settings (vLLM's names), and the one error type of the engine layer.

use candle_core::{DType, Device};

use super::detokenizer::DetokenizeError;
use crate::loader::{GgufMatmul, LoadError, LoadFormat, Quantization};
use crate::model::ModelError;
use crate::request::InvalidParam;
use crate::scheduler::ScheduleError;

/// Weight and activation dtype (vLLM's `--dtype`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DtypeArg {
    /// float32 on the CPU, bfloat16 on a GPU.
    #[default]
    Auto,
    /// 32-bit floats.
    Float32,
    /// bfloat16.
    Bfloat16,
    /// float16.
    Float16,
}

impl DtypeArg {
    /// The dtype for `device`.
    pub fn resolve(self, device: &Device) -> DType {
        match self {
            DtypeArg::Auto if device.is_cpu() => DType::F32,
            DtypeArg::Auto => DType::BF16,
            DtypeArg::Float32 => DType::F32,
            DtypeArg::Bfloat16 => DType::BF16,
            DtypeArg::Float16 => DType::F16,
        }
    }
}

/// The KV cache's element type (vLLM's `--kv-cache-dtype`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum KvCacheDtype {
    /// The model's dtype.
    #[default]
    Auto,
    /// FP8 e4m3 (`fp8`, `fp8_e4m3`): one byte a value, with one scale a layer for K and one for
    /// V (the checkpoint's `k_scale` / `v_scale`, else 1.0). GPU and 16-bit models only.
    Fp8E4m3,
}

/// Everything needed to start an engine. `..Default::default()` fills vLLM's defaults.
#[derive(Clone, Debug)]
pub struct EngineArgs {
    /// A local Hugging Face directory, a `.gguf` file, or a directory holding one.
    pub model: String,
    /// Where the model runs.
    pub device: super::device::DeviceArg,
    /// Weight and activation dtype.
    pub dtype: DtypeArg,
    /// How to read weights.
    pub load_format: LoadFormat,
    /// Longest prompt + output; defaults to the model's `max_position_embeddings`.
    pub max_model_len: Option<usize>,
    /// Token slots per KV block (8, 16 or 32).
    pub block_size: usize,
    /// Bytes of KV cache (CPU default: a quarter of the memory available at start, 1 to 64 GiB; on
    /// a GPU it overrides `gpu_memory_utilization`); capped
    /// at what `max_num_seqs` full-length sequences need.
    pub kv_cache_memory: Option<u64>,
    /// GPU: fraction of device memory pagewise may use (weights, activations and KV cache).
    pub gpu_memory_utilization: f32,
    /// Most sequences running at once.
    pub max_num_seqs: usize,
    /// Most tokens computed per step (default 8192, at least `max_model_len` is not required:
    /// long prompts are prefilled in chunks).
    pub max_num_batched_tokens: Option<usize>,
    /// Reuse KV of identical prompt prefixes.
    pub enable_prefix_caching: bool,
    /// Seed for `--load-format dummy` weights.
    pub seed: u64,
    /// A chat template (a file path, or the template text) replacing the model's own.
    pub chat_template: Option<String>,
    /// Structured outputs: objects of JSON schemas that do not set `additionalProperties`
    /// accept properties they do not name (JSON Schema's reading). Default false: they hold
    /// only their named properties, as OpenAI and vLLM's default backend generate.
    pub structured_outputs_allow_additional_properties: bool,
    /// GGUF: quantized or dequantized matmuls.
    pub gguf_matmul: GgufMatmul,
    /// Weights quantized at load (`--quantization fp8`); `None` serves them as stored.
    pub quantization: Option<Quantization>,
    /// The KV cache's element type.
    pub kv_cache_dtype: KvCacheDtype,
    /// GPU: run every step eagerly instead of replaying captured CUDA graphs for decode steps.
    pub enforce_eager: bool,
    /// GPU: the longest context a CUDA graph serves (capped at `max_model_len`); decode steps with
    /// a longer sequence run eagerly.
    pub max_seq_len_to_capture: usize,
    /// Tensor parallelism: how many GPUs, on how many nodes, meeting where.
    pub parallel: crate::parallel::ParallelConfig,
    /// Speculative decoding (vLLM's `--speculative-config`); `None`: off.
    pub speculative_config: Option<crate::spec::SpeculativeConfig>,
    /// Deliberate failures for tests (feature `fault-injection` only).
    #[cfg(feature = "fault-injection")]
    pub faults: super::faults::Faults,
}

impl Default for EngineArgs {
    fn default() -> Self {
        EngineArgs {
            model: String::new(),
            device: super::device::DeviceArg::Auto,
            dtype: DtypeArg::Auto,
            load_format: LoadFormat::Auto,
            max_model_len: None,
            block_size: 16,
            kv_cache_memory: None,
            gpu_memory_utilization: 0.9,
            max_num_seqs: 256,
            max_num_batched_tokens: None,
            enable_prefix_caching: true,
            seed: 0,
            chat_template: None,
            structured_outputs_allow_additional_properties: false,
            gguf_matmul: GgufMatmul::Auto,
            quantization: None,
            kv_cache_dtype: KvCacheDtype::Auto,
            enforce_eager: false,
            max_seq_len_to_capture: DEFAULT_MAX_SEQ_LEN_TO_CAPTURE,
            parallel: Default::default(),
            speculative_config: None,
            #[cfg(feature = "fault-injection")]
            faults: Default::default(),
        }
    }
}

/// The CPU KV cache by default: this share of the memory available at start...
pub const CPU_KV_CACHE_SHARE: f64 = 0.25;
/// ...at most this many bytes...
pub const CPU_KV_CACHE_CAP: u64 = 64 << 30;
/// ...and at least this many (or half the available memory, if less); also the size where the
/// available memory is not known.
pub const CPU_KV_CACHE_FLOOR: u64 = 1 << 30;

/// Bytes of the CPU KV cache by default, where `available` bytes of memory are available (`None`:
/// not known). Pages of blocks never used are never touched (`cpu::memory::fresh_mappings`).
pub fn default_cpu_kv_cache_memory(available: Option<u64>) -> u64 {
    match available {
        None => CPU_KV_CACHE_FLOOR,
        Some(bytes) => ((bytes as f64 * CPU_KV_CACHE_SHARE) as u64)
            .max(CPU_KV_CACHE_FLOOR.min(bytes / 2))
            .min(CPU_KV_CACHE_CAP),
    }
}
/// Default longest context a CUDA graph serves (vLLM's default).
pub const DEFAULT_MAX_SEQ_LEN_TO_CAPTURE: usize = 8192;
/// Default token budget per step.
pub const DEFAULT_MAX_NUM_BATCHED_TOKENS: usize = 8192;

/// Anything the engine can fail with, mapped once to an HTTP status by the server.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The model could not be loaded.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// The model failed while running.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// A request parameter is out of range.
    #[error(transparent)]
    InvalidParam(#[from] InvalidParam),
    /// A request can never be scheduled.
    #[error(transparent)]
    Schedule(#[from] ScheduleError),
    /// Text could not be tokenized or detokenized.
    #[error("tokenizer error: {0}")]
    Tokenizer(String),
    /// The chat template is missing or failed.
    #[error(transparent)]
    Chat(#[from] crate::chat::ChatError),
    /// The engine settings are inconsistent.
    #[error("invalid engine settings: {0}")]
    Config(String),
    /// The tensor-parallel group could not form, or lost a rank.
    #[error("tensor parallelism: {0}")]
    Parallel(String),
}

impl From<crate::parallel::group::GroupError> for EngineError {
    fn from(e: crate::parallel::group::GroupError) -> Self {
        EngineError::Parallel(e.0)
    }
}

impl From<DetokenizeError> for EngineError {
    fn from(e: DetokenizeError) -> Self {
        EngineError::Tokenizer(e.0)
    }
}

impl From<candle_core::Error> for EngineError {
    fn from(e: candle_core::Error) -> Self {
        EngineError::Model(ModelError::Candle(e))
    }
}
