//! How many KV blocks the cache gets. CPU: `--kv-cache-memory` bytes (default a quarter of the
//! memory available at start, within 1 to 64 GiB: `args::default_cpu_kv_cache_memory`). GPU: what is
//! left under `--gpu-memory-utilization` of the device after the weights and the activations of one
//! profiling forward pass at the largest step the scheduler can build (vLLM's method); an explicit
//! `--kv-cache-memory` wins. Both are capped at what `max_num_seqs` full-length sequences can use.
//!
//! A model that mixes sliding-window layers with full ones (Gemma 3, gpt-oss), with a window
//! shorter than the context, gets a window group (`crate::kv::WindowConfig`): its sliding layers
//! hold only the blocks their windows can reach, so they get just enough blocks for every
//! sequence's window plus a full step of new tokens, and the rest of the memory goes to the full
//! layers. Gemma 3 (five sliding layers to one full) then holds about six times the context in
//! the same memory. When windows for `max_num_seqs` sequences would leave no room for one
//! sequence of the full context, the group is planned for fewer (the others wait for window
//! blocks). When even then the model's whole context does not fit and `--max-model-len` was not
//! given, the engine serves the longest context that fits (one warning names the flags).

use candle_core::DType;
#[cfg(feature = "cuda")]
use candle_core::Device;

use super::args::{EngineArgs, EngineError, KvCacheDtype, default_cpu_kv_cache_memory};
use crate::kv::WindowConfig;
#[cfg(feature = "cuda")]
use crate::model::CausalLm;
use crate::model::ModelConfig;

/// The sizes the cache is built from.
pub struct KvSizing<'a> {
    /// Engine settings.
    pub args: &'a EngineArgs,
    /// The model's configuration.
    pub cfg: &'a ModelConfig,
    /// KV heads this rank's cache holds (all of them without tensor parallelism).
    pub kv_heads: usize,
    /// Longest sequence.
    pub max_model_len: usize,
    /// Most tokens per step.
    pub max_num_batched_tokens: usize,
    /// The model's dtype (the cache's, unless `args.kv_cache_dtype` is FP8: one byte a value).
    pub dtype: DType,
}

/// How the cache's blocks are laid out over the layers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvPlan {
    /// Blocks of the full-attention layers (every layer without a window group), the null
    /// block included.
    pub num_blocks: usize,
    /// The sliding-window layers' own group, when the model has one.
    pub window: Option<WindowConfig>,
    /// Blocks of each layer.
    pub layer_blocks: Vec<usize>,
}

impl KvPlan {
    /// The longest sequence the full-attention layers' blocks hold.
    pub fn capacity_tokens(&self, block_size: usize) -> usize {
        (self.num_blocks - 1) * block_size
    }
}

impl KvSizing<'_> {
    /// Bytes of one cached value: the model dtype's, or 1 in an FP8 cache.
    pub fn value_bytes(&self) -> usize {
        match self.args.kv_cache_dtype {
            KvCacheDtype::Auto => self.dtype.size_in_bytes(),
            KvCacheDtype::Fp8E4m3 => 1,
        }
    }

    /// Bytes of one block of one layer.
    fn bytes_per_layer_block(&self) -> u64 {
        let bytes = 2 * self.kv_heads * self.cfg.head_dim * self.value_bytes();
        (bytes * self.args.block_size) as u64
    }

    /// The window and the sliding layers, when a window group pays: some layers slide, some do
    /// not, and the window is shorter than the context.
    fn sliding(&self) -> Option<(usize, &[bool])> {
        let (window, sliding) = self.cfg.sliding_layers()?;
        let mixed = sliding.contains(&true) && sliding.contains(&false);
        (mixed && window < self.max_model_len).then_some((window, sliding))
    }

    /// The layout of `budget` bytes (`what` names the setting it came from, for errors). It
    /// depends on nothing else, so the ranks of a tensor-parallel group, given the same budget,
    /// lay their caches out alike, window group included.
    ///
    /// With sliding-window layers the window group is planned for `max_num_seqs` windows; when
    /// that leaves no room for one sequence of `max_model_len`, for fewer (halving), before
    /// going without. A layout that holds no sequence of `max_model_len` is refused when the
    /// user set `--max-model-len`; otherwise it is returned, and [`KvPlan::capacity_tokens`]
    /// says how long a sequence it holds.
    pub fn plan_for(&self, budget: u64, what: &str) -> Result<KvPlan, EngineError> {
        let per_block = self.bytes_per_layer_block();
        let layers = self.cfg.num_hidden_layers;
        let bs = self.args.block_size;
        let useful = (self.args.max_num_seqs * self.max_model_len).div_ceil(bs);
        let layer_blocks = budget / per_block;
        let uniform = (layer_blocks / layers as u64).min(useful as u64) as usize + 1;
        let mut plan = KvPlan {
            num_blocks: uniform,
            window: None,
            layer_blocks: vec![uniform; layers],
        };
        if let Some((window, sliding)) = self.sliding() {
            let fits = |p: &KvPlan| p.capacity_tokens(bs) >= self.max_model_len;
            let all = self.args.max_num_seqs;
            // The most windows (halving from max_num_seqs) whose group still lets a sequence of
            // the full context fit.
            let mut windows = all;
            let fitting = loop {
                match self.window_plan(layer_blocks, window, sliding, windows) {
                    Some(grouped) if fits(&grouped) => break Some((windows, grouped)),
                    _ if windows > 1 => windows /= 2,
                    _ => break None,
                }
            };
            match fitting {
                // Planned for every sequence, or for fewer where without a group no sequence
                // of the full context would fit.
                Some((n, grouped)) if n == all || !fits(&plan) => {
                    if n < all {
                        tracing::info!(
                            windows = n,
                            max_num_seqs = all,
                            "the sliding-window layers' blocks are planned for fewer sequences \
                             than --max-num-seqs, so that a sequence of the full context fits; \
                             more sequences wait for window blocks"
                        );
                    }
                    plan = grouped;
                }
                // Nothing fits: the group for every sequence, if it pays (as long a context as
                // the budget allows either way is then served).
                None if !fits(&plan) => {
                    if let Some(grouped) = self.window_plan(layer_blocks, window, sliding, all) {
                        plan = grouped;
                    }
                }
                _ => tracing::info!(
                    max_num_seqs = all,
                    "no window group: the sliding-window layers' blocks for max_num_seqs \
                     windows would leave the full layers no more than they get without one"
                ),
            }
        }
        let num_blocks = plan.num_blocks;
        if num_blocks < 2 {
            return Err(EngineError::Config(format!(
                "{what} {budget} bytes holds no block of {} bytes",
                per_block * layers as u64
            )));
        }
        // One sequence of the full context length must fit, or it would wait forever: refused
        // when the user asked for that length, else the caller serves what fits.
        let capacity = plan.capacity_tokens(bs);
        if capacity < self.max_model_len && self.args.max_model_len.is_some() {
            return Err(EngineError::Config(format!(
                "The model's max seq len ({}) is larger than the maximum number of tokens that \
                 can be stored in KV cache ({capacity}). Try increasing {what} or decreasing \
                 --max-model-len.",
                self.max_model_len
            )));
        }
        let bytes: u64 = plan
            .layer_blocks
            .iter()
            .map(|&b| (b - 1) as u64)
            .sum::<u64>()
            * per_block;
        tracing::info!(
            num_blocks = num_blocks - 1,
            block_size = bs,
            tokens = capacity,
            window_blocks = plan.window.map(|w| w.num_blocks - 1),
            bytes,
            "KV cache allocated"
        );
        Ok(plan)
    }

    /// The layout with a window group for `windows` sequences' windows (plus one step's new
    /// tokens), when it leaves the full layers more blocks than the group takes.
    fn window_plan(
        &self,
        layer_blocks: u64,
        window: usize,
        sliding: &[bool],
        windows: usize,
    ) -> Option<KvPlan> {
        let bs = self.args.block_size;
        let useful = (self.args.max_num_seqs * self.max_model_len).div_ceil(bs);
        // Every sequence's window (and the block it ends in), plus one step's new tokens.
        let need =
            windows * ((window - 1).div_ceil(bs) + 2) + self.max_num_batched_tokens.div_ceil(bs);
        let window_blocks = need.min(useful) + 1;
        let num_sliding = sliding.iter().filter(|&&s| s).count() as u64;
        let num_full = self.cfg.num_hidden_layers as u64 - num_sliding;
        let rest = layer_blocks.checked_sub(num_sliding * window_blocks as u64)?;
        let full = (rest / num_full).min(useful as u64 + 1) as usize;
        (full > window_blocks).then(|| KvPlan {
            num_blocks: full,
            window: Some(WindowConfig {
                window,
                num_blocks: window_blocks,
            }),
            layer_blocks: sliding
                .iter()
                .map(|&s| if s { window_blocks } else { full })
                .collect(),
        })
    }

    /// The bytes of a host cache, and the setting they come from.
    pub fn cpu_budget(&self) -> (u64, &'static str) {
        match self.args.kv_cache_memory {
            Some(bytes) => (bytes, "kv_cache_memory"),
            None => {
                let available = crate::cpu::memory::available_memory();
                let bytes = default_cpu_kv_cache_memory(available);
                tracing::info!(
                    available_gib = available.map(|b| b as f64 / (1u64 << 30) as f64),
                    budget_gib = bytes as f64 / (1u64 << 30) as f64,
                    "CPU KV cache: a quarter of the available memory (set --kv-cache-memory)"
                );
                (
                    bytes,
                    "kv_cache_memory (default: a quarter of the available memory)",
                )
            }
        }
    }

    /// The bytes of a cache on `device`, after profiling `model` there, and the setting they
    /// come from.
    #[cfg(feature = "cuda")]
    pub fn gpu_budget(
        &self,
        model: &dyn CausalLm,
        device: &Device,
    ) -> Result<(u64, &'static str), EngineError> {
        use super::device::{gpu_memory, reset_peak};
        if let Some(bytes) = self.args.kv_cache_memory {
            return Ok((bytes, "kv_cache_memory"));
        }
        let util = self.args.gpu_memory_utilization;
        if !(util > 0.0 && util <= 1.0) {
            return Err(EngineError::Config(format!(
                "gpu_memory_utilization must be in (0, 1], got {util}"
            )));
        }
        reset_peak(device)?;
        self.profile(model, device)?;
        let mem = gpu_memory(device)?;
        let activations = mem.pool_peak.saturating_sub(mem.pool_used);
        let in_use = mem.total - mem.free;
        let cap = (mem.total as f64 * f64::from(util)) as u64;
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        tracing::info!(
            total_gib = gib(mem.total),
            in_use_gib = gib(in_use),
            activation_peak_gib = gib(activations),
            "GPU memory after the profiling pass"
        );
        let budget = cap
            .checked_sub(in_use + activations)
            .filter(|&b| b > 0)
            .ok_or_else(|| {
                EngineError::Config(format!(
                    "no GPU memory left for the KV cache: {:.2} GiB in use (weights and other \
                 processes) + {:.2} GiB of activations exceed gpu_memory_utilization {util} of \
                 {:.2} GiB; raise --gpu-memory-utilization, or lower --max-num-batched-tokens or \
                 --max-num-seqs",
                    gib(in_use),
                    gib(activations),
                    gib(mem.total)
                ))
            })?;
        Ok((budget, "gpu_memory_utilization"))
    }

    /// One forward pass of the largest step: `max_num_batched_tokens` tokens spread over up to
    /// `max_num_seqs` sequences, each sampling a row, over a throwaway cache.
    #[cfg(feature = "cuda")]
    fn profile(&self, model: &dyn CausalLm, device: &Device) -> Result<(), EngineError> {
        use crate::model::{ForwardBatch, KvCache, KvLayout};
        let out = profile_step(
            self.max_num_batched_tokens,
            self.args.max_num_seqs,
            self.max_model_len,
            self.args.block_size,
        );
        let layout = KvLayout {
            num_blocks: out.block_tables.len() + 1,
            block_size: self.args.block_size,
            num_kv_heads: self.kv_heads,
            head_dim: self.cfg.head_dim,
        };
        let mut kv = KvCache::on_device(layout, self.cfg.num_hidden_layers, self.dtype, device)?;
        let batch = ForwardBatch::new(&out, device)?;
        model.forward(&batch, &mut kv)?;
        device.synchronize()?;
        Ok(())
    }
}

/// A synthetic step of `tokens` tokens (token id 0) over `min(max_seqs, tokens)` fresh sequences
/// of at most `max_len` tokens, each on its own blocks starting at block 1.
pub fn profile_step(
    tokens: usize,
    max_seqs: usize,
    max_len: usize,
    block_size: usize,
) -> crate::scheduler::SchedulerOutput {
    use crate::scheduler::ScheduledSeq;
    use crate::sequence::SeqId;
    let seqs = max_seqs.min(tokens).max(1);
    let tokens = tokens.min(seqs * max_len).max(1);
    let mut out = crate::scheduler::SchedulerOutput::default();
    let mut next_block = 1u32;
    for i in 0..seqs {
        let len = tokens / seqs + usize::from(i < tokens % seqs);
        if len == 0 {
            continue;
        }
        let start = out.token_ids.len();
        let table_start = out.block_tables.len();
        let blocks = len.div_ceil(block_size);
        out.block_tables
            .extend(next_block..next_block + blocks as u32);
        for p in 0..len {
            out.token_ids.push(0);
            out.positions.push(p as u32);
            out.slot_mapping.push(
                (next_block + (p / block_size) as u32) * block_size as u32
                    + (p % block_size) as u32,
            );
        }
        next_block += blocks as u32;
        out.seqs.push(ScheduledSeq {
            seq_id: SeqId(i as u64),
            num_computed_tokens: 0,
            num_new_tokens: len,
            num_draft_tokens: 0,
            tokens: start..start + len,
            block_table: table_start..out.block_tables.len(),
            samples: true,
            num_prompt_rows: 0,
        });
    }
    out
}

#[cfg(test)]
#[path = "tests_kv_sizing.rs"]
mod tests;
