//! Loading an engine's model: device, weights (this rank's shard of them under tensor
//! parallelism), the KV cache sized from memory (by the smallest rank), the runner and its CUDA
//! graphs. Rank 0's [`super::core::EngineCore`] and the other ranks' workers
//! (`super::worker`) load the same way, so their forward passes match step for step.

use std::sync::Arc;
use std::time::{Duration, Instant};

use candle_core::Device;
use tokenizers::Tokenizer;

use super::args::{DEFAULT_MAX_NUM_BATCHED_TOKENS, EngineArgs, EngineError};
use super::kv_dtype::{check_kv_cache_dtype, kv_elements};
use super::kv_sizing::KvSizing;
use super::proposer_cache;
use crate::guided::Grammars;
use crate::kv::BLOCK_SIZES;
use crate::loader::{self, LoadOptions};
use crate::model::{self, KvCache, KvLayout, ModelConfig};
use crate::parallel::Parallel;
use crate::parallel::group::{self, Member};
use crate::parallel::rendezvous::Settings;
use crate::runner::ModelRunner;

/// A loaded model, its sized cache and its runner.
pub struct LoadedEngine {
    /// The model's configuration (the whole model's, on every rank).
    pub config: ModelConfig,
    /// The tokenizer.
    pub tokenizer: Arc<Tokenizer>,
    /// Compiles constraints against the tokenizer's vocabulary (its trie being built on a thread
    /// of its own since the tokenizer loaded).
    pub grammars: Grammars,
    /// The model's own chat template, if it has one.
    pub chat_template: Option<String>,
    /// Longest sequence.
    pub max_model_len: usize,
    /// Most tokens per step.
    pub max_num_batched_tokens: usize,
    /// KV blocks, the null block included (the same on every rank).
    pub num_blocks: usize,
    /// The sliding-window layers' own block group, when the model has one.
    pub window: Option<crate::kv::WindowConfig>,
    /// The runner (rank 0's sends each step's plan to the other ranks).
    pub runner: ModelRunner,
    /// A worker rank's side of the group (`None` on rank 0 and without tensor parallelism).
    pub member: Option<Member>,
    /// Where loading's time went.
    pub startup: StartupTimes,
    /// Speculative decoding, checked (`None`: off).
    pub speculation: Option<crate::spec::Speculation>,
    /// The draft model's runner, when speculation uses one (rank 0 only).
    pub draft: Option<crate::runner::draft::DraftRunner>,
    /// The EAGLE-3 head's runner, when speculation uses one.
    pub eagle: Option<crate::runner::eagle::EagleRunner>,
}

/// Where an engine's startup went, phase by phase.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StartupTimes {
    /// Opening the device (and joining the tensor-parallel group).
    pub device: Duration,
    /// Reading config, tokenizer and weights.
    pub weights: Duration,
    /// Building the model from the weights (dequantizing, stacking, uploading).
    pub model: Duration,
    /// Sizing the KV cache (on a GPU, its profiling pass) and allocating it.
    pub kv_cache: Duration,
    /// Capturing CUDA graphs.
    pub graphs: Duration,
    /// Compiling the chat template (after loading).
    pub chat_template: Duration,
    /// All of it, from the start of loading.
    pub total: Duration,
}

impl StartupTimes {
    /// One line for the log.
    pub fn summary(&self) -> String {
        let s = |d: Duration| d.as_secs_f64();
        format!(
            "ready in {:.2} s: device {:.2}, weights {:.2}, model {:.2}, KV cache {:.2}, CUDA \
             graphs {:.2}, chat template {:.2}",
            s(self.total),
            s(self.device),
            s(self.weights),
            s(self.model),
            s(self.kv_cache),
            s(self.graphs),
            s(self.chat_template)
        )
    }
}

/// The device this process computes on: `--device`, or under tensor parallelism the GPU of its
/// local rank (choose a node's GPUs with `CUDA_VISIBLE_DEVICES`).
fn open_device(args: &EngineArgs) -> Result<Device, EngineError> {
    let p = &args.parallel;
    if !p.is_parallel() {
        let device = args.device.open()?;
        if device.is_cpu() {
            crate::cpu::memory::keep_freed_memory();
        }
        return Ok(device);
    }
    use super::device::DeviceArg;
    match args.device {
        DeviceArg::Auto | DeviceArg::Cuda(_) => DeviceArg::Cuda(p.local_rank).open(),
        DeviceArg::Cpu => Err(EngineError::Parallel(
            "--tensor-parallel-size above 1 needs CUDA GPUs, not --device cpu".into(),
        )),
    }
}

/// Loads everything [`LoadedEngine`] holds.
pub fn load(args: &EngineArgs) -> Result<LoadedEngine, EngineError> {
    let started = Instant::now();
    let mut times = StartupTimes::default();
    let mut lap = started;
    let mut mark = |phase: &mut Duration| {
        *phase = lap.elapsed();
        lap = Instant::now();
    };
    if !BLOCK_SIZES.contains(&args.block_size) {
        return Err(EngineError::Config(format!(
            "block size {} is not one of {BLOCK_SIZES:?}",
            args.block_size
        )));
    }
    if args.max_num_seqs == 0 {
        return Err(EngineError::Config(
            "max_num_seqs must be at least 1".into(),
        ));
    }
    args.parallel.check().map_err(EngineError::Parallel)?;
    let speculation = match &args.speculative_config {
        Some(c) => Some(c.check().map_err(EngineError::Config)?),
        None => None,
    };
    if args.parallel.is_parallel() && !cfg!(feature = "nccl") {
        return Err(EngineError::Parallel(
            "--tensor-parallel-size above 1 needs a build with `--features nccl` (NCCL on CUDA \
             GPUs); this one runs a model on one device"
                .into(),
        ));
    }
    let device = open_device(args)?;
    let dtype = args.dtype.resolve(&device);
    check_kv_cache_dtype(args.kv_cache_dtype, &device, dtype)?;
    tracing::info!(
        device = ?device,
        cpu_threads = rayon::current_num_threads(),
        "opening the model"
    );
    // Join the group first: a rank that cannot join fails before minutes of loading.
    let (par, member) = if args.parallel.is_parallel() {
        let (par, member) = group::join_group(&args.parallel, &group_settings(args), &device)?;
        (
            par.with_expert_parallel(args.parallel.enable_expert_parallel),
            Some(member),
        )
    } else {
        (Parallel::single(), None)
    };
    mark(&mut times.device);
    let loaded = loader::load(
        &args.model,
        &LoadOptions {
            load_format: args.load_format,
            dtype,
            device: device.clone(),
            gguf_matmul: args.gguf_matmul,
            seed: args.seed,
            quantization: args.quantization,
        },
    )?;
    mark(&mut times.weights);
    let cfg = loaded.config;
    let tokenizer = Arc::new(loaded.tokenizer);
    let grammars = Grammars::new(
        tokenizer.clone(),
        cfg.vocab_size,
        &cfg.eos_token_ids,
        args.structured_outputs_allow_additional_properties,
    );
    if member.is_none() {
        grammars.warm_up();
    }
    let max_model_len = match args.max_model_len {
        Some(n) if n > cfg.max_position_embeddings => {
            return Err(EngineError::Config(format!(
                "max_model_len {n} is larger than the model's max_position_embeddings {}",
                cfg.max_position_embeddings
            )));
        }
        Some(0) => {
            return Err(EngineError::Config(
                "max_model_len must be at least 1".into(),
            ));
        }
        Some(n) => n,
        None => cfg.max_position_embeddings,
    };
    if args.parallel.enable_expert_parallel && (cfg.moe.is_none() || !args.parallel.is_parallel()) {
        tracing::warn!(
            "--enable-expert-parallel has no effect: it splits a mixture's experts over a \
             tensor-parallel group, and this is {}",
            match cfg.moe {
                None => "a dense model",
                Some(_) => "one device",
            }
        );
    }
    let model = model::build_sharded(&cfg, &loaded.weights, max_model_len, &par)?;
    let kv_elements = kv_elements(args.kv_cache_dtype, dtype, &loaded.weights, &cfg)?;
    drop(loaded.weights);
    // The draft model (rank 0's alone) loads before the cache is sized: its weights take memory.
    let draft = match (&speculation, &member) {
        (Some(spec), None | Some(Member::Leader(_))) => {
            super::draft::load(spec, args, &device, dtype, &tokenizer)?
        }
        _ => None,
    };
    let eagle = match speculation.as_ref().and_then(|s| s.eagle3_head()) {
        Some(_) if member.is_some() => {
            return Err(EngineError::Config(
                "an EAGLE-3 head with tensor parallelism is not implemented yet: run it on one \
                 device"
                    .into(),
            ));
        }
        Some(name) => Some(super::eagle::load(
            name,
            &device,
            dtype,
            model.as_ref(),
            max_model_len,
        )?),
        None => None,
    };
    mark(&mut times.model);
    let max_num_batched_tokens = args
        .max_num_batched_tokens
        .unwrap_or(DEFAULT_MAX_NUM_BATCHED_TOKENS);
    let kv_heads = cfg.kv_heads(par.rank).len();
    let sizing = KvSizing {
        args,
        cfg: &cfg,
        kv_heads,
        max_model_len,
        max_num_batched_tokens,
        dtype,
    };
    let (budget, what) = if device.is_cpu() {
        sizing.cpu_budget()
    } else {
        gpu_budget(&sizing, model.as_ref(), &device)?
    };
    // The draft's share comes off this rank's budget before the ranks agree on theirs.
    let proposer = match (&draft, &eagle) {
        (Some(d), _) => Some(d.config()),
        (None, Some(h)) => Some(h.config()),
        (None, None) => None,
    };
    let target_per_token = cfg.kv_bytes_per_token(kv_heads, sizing.value_bytes()) as u64;
    let draft_bytes = proposer.map_or(0, |p| {
        proposer_cache::budget_share(budget, target_per_token, p, dtype)
    });
    let budget = budget - draft_bytes;
    let mut member = member;
    // The ranks of a tensor-parallel group lay out the least of their budgets, so their caches
    // (window group included) are alike.
    let budget = match member.as_mut() {
        Some(m) => m.agree_kv_bytes(budget)?,
        None => budget,
    };
    let plan = sizing.plan_for(budget, what)?;
    let num_blocks = plan.num_blocks;
    let bs = args.block_size;
    // The model's whole context does not fit and no --max-model-len asked for it: serve what
    // fits rather than refuse to start.
    let capacity = plan.capacity_tokens(bs);
    let max_model_len = if capacity < max_model_len {
        tracing::warn!(
            "serving a context of {capacity} tokens: the model's {max_model_len} do not fit \
             the KV cache ({what}); set --max-model-len, or give the cache more memory \
             (--kv-cache-memory, or --gpu-memory-utilization on a GPU)"
        );
        capacity
    } else {
        max_model_len
    };
    let layout = KvLayout {
        num_blocks,
        block_size: bs,
        num_kv_heads: kv_heads,
        head_dim: cfg.head_dim,
    };
    let kv = KvCache::on_device_grouped(layout, &plan.layer_blocks, kv_elements, &device)?;
    let draft = match draft {
        Some(d) => Some(d.into_runner(
            draft_bytes,
            args,
            &device,
            dtype,
            cfg.vocab_size,
            max_num_batched_tokens,
        )?),
        None => None,
    };
    let (eagle, aux_layers) = match eagle {
        Some(h) => {
            let layers = h.aux_layers.clone();
            (
                Some(h.into_runner(draft_bytes, args, &device, dtype)?),
                Some(layers),
            )
        }
        None => (None, None),
    };
    mark(&mut times.kv_cache);
    let runner_device_is_cpu = device.is_cpu();
    // A mixture of experts routes small decode steps on the device; larger ones read the routing
    // back, so only the small ones are captured.
    let graph_seqs = args
        .max_num_seqs
        .min(model.graph_batch_limit().unwrap_or(usize::MAX));
    if graph_seqs < args.max_num_seqs && !args.enforce_eager && !runner_device_is_cpu {
        tracing::warn!(
            graph_seqs,
            "mixture-of-experts decode steps of more sequences than this run eagerly (no CUDA \
             graphs): their routing is read on the host"
        );
    }
    if !runner_device_is_cpu {
        let rows = model.fused_decode_rows(&kv);
        if rows > 0 {
            tracing::info!(
                rows,
                "decode steps of up to this many rows take the fused GEMV path"
            );
        } else {
            tracing::info!("decode steps take cuBLAS and separate kernels (no fused GEMV path)");
        }
    }
    let mut runner = ModelRunner::new(model, kv, device);
    if let Some(layers) = aux_layers {
        // (Every step keeps the hidden states the head reads: no step replays a graph.)
        runner.keep_hidden_states(layers);
    }
    if !args.enforce_eager && graph_seqs > 0 {
        runner.capture_graphs(
            graph_seqs,
            args.max_seq_len_to_capture.min(max_model_len),
            bs,
            plan.window.is_some(),
        );
    }
    mark(&mut times.graphs);
    times.total = started.elapsed();
    let member = match member {
        Some(Member::Leader(leader)) => {
            runner.lead(leader);
            None
        }
        other => other,
    };
    Ok(LoadedEngine {
        config: cfg,
        tokenizer,
        grammars,
        chat_template: loaded.chat_template,
        max_model_len,
        max_num_batched_tokens,
        num_blocks,
        window: plan.window,
        runner,
        member,
        startup: times,
        speculation,
        draft,
        eagle,
    })
}

#[cfg(feature = "cuda")]
fn gpu_budget(
    sizing: &KvSizing<'_>,
    model: &dyn model::CausalLm,
    device: &Device,
) -> Result<(u64, &'static str), EngineError> {
    sizing.gpu_budget(model, device)
}

#[cfg(not(feature = "cuda"))]
fn gpu_budget(
    _: &KvSizing<'_>,
    _: &dyn model::CausalLm,
    device: &Device,
) -> Result<(u64, &'static str), EngineError> {
    Err(EngineError::Config(format!(
        "{device:?} needs a build with `--features cuda`"
    )))
}

/// The settings every rank must share (compared at the rendezvous).
fn group_settings(args: &EngineArgs) -> Settings {
    let p = &args.parallel;
    [
        ("model", args.model.clone()),
        ("--dtype", format!("{:?}", args.dtype)),
        ("--load-format", format!("{:?}", args.load_format)),
        ("--max-model-len", format!("{:?}", args.max_model_len)),
        ("--block-size", args.block_size.to_string()),
        ("--max-num-seqs", args.max_num_seqs.to_string()),
        (
            "--max-num-batched-tokens",
            format!("{:?}", args.max_num_batched_tokens),
        ),
        ("--enforce-eager", args.enforce_eager.to_string()),
        (
            "--max-seq-len-to-capture",
            args.max_seq_len_to_capture.to_string(),
        ),
        ("--kv-cache-memory", format!("{:?}", args.kv_cache_memory)),
        ("--seed", args.seed.to_string()),
        ("--nnodes", p.nnodes.to_string()),
        (
            "--disable-custom-all-reduce",
            p.disable_custom_all_reduce.to_string(),
        ),
        (
            "--enable-expert-parallel",
            p.enable_expert_parallel.to_string(),
        ),
        ("pagewise version", env!("CARGO_PKG_VERSION").to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}
