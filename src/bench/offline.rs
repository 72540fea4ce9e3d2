//! `pagewise bench throughput` and `pagewise bench latency`: in-process, through `Llm`, with
//! random token-id prompts of exact lengths (vLLM's `bench throughput` / `bench latency`).

use std::time::Instant;

use serde::Serialize;

use super::stats::Summary;
use crate::engine::args::{EngineArgs, EngineError};
use crate::llm::Llm;
use crate::request::SamplingParams;
use crate::runner::step_times::StepBreakdown;
use crate::sampler::SeededRng;

/// Random prompts of `len` token ids below `vocab` (seeded).
pub fn random_prompts(n: usize, len: usize, vocab: usize, seed: u64) -> Vec<Vec<u32>> {
    let mut rng = SeededRng::new(seed, 0x6265_6e63);
    (0..n)
        .map(|_| {
            (0..len)
                .map(|_| (rng.next_u64() % vocab as u64) as u32)
                .collect()
        })
        .collect()
}

fn fixed_length(output_len: usize) -> SamplingParams {
    SamplingParams {
        temperature: 1.0,
        max_tokens: output_len,
        ignore_eos: true,
        seed: Some(0),
        ..Default::default()
    }
}

/// Offline throughput result.
#[derive(Clone, Debug, Serialize)]
pub struct ThroughputResult {
    /// Prompts run.
    pub num_prompts: usize,
    /// Wall time, seconds.
    pub elapsed_s: f64,
    /// Requests per second.
    pub requests_per_s: f64,
    /// (prompt + output) tokens per second.
    pub total_tokens_per_s: f64,
    /// Output tokens per second.
    pub output_tokens_per_s: f64,
    /// Mean time per engine step of each phase.
    pub step_breakdown: StepBreakdown,
}

/// The schema `bench throughput --json-schema-fraction` uses by default: one long string, so a
/// constrained output runs to its length as the free ones do.
pub fn default_bench_schema() -> serde_json::Value {
    serde_json::json!({
        "type": "object",
        "properties": {"story": {"type": "string", "minLength": 4096}},
        "required": ["story"]
    })
}

/// All prompts at once through `Llm::generate_tokens_each`; `constrained` of them (spread
/// evenly) with their output constrained to `schema`.
pub fn throughput(
    args: EngineArgs,
    num_prompts: usize,
    input_len: usize,
    output_len: usize,
    constrained: (f64, serde_json::Value),
) -> Result<ThroughputResult, EngineError> {
    let mut llm = Llm::new(args)?;
    let vocab = llm.core().model_config().vocab_size;
    let prompts = random_prompts(num_prompts, input_len, vocab, 0);
    let (fraction, schema) = constrained;
    let free = fixed_length(output_len);
    let json = SamplingParams {
        structured_outputs: Some(crate::guided::StructuredOutputs::Json(schema)),
        ..free.clone()
    };
    // Prompt i is constrained when the running count of constrained prompts steps up at i.
    let params: Vec<SamplingParams> = (0..num_prompts)
        .map(|i| {
            let before = (i as f64 * fraction).floor();
            let after = ((i + 1) as f64 * fraction).floor();
            if after > before {
                json.clone()
            } else {
                free.clone()
            }
        })
        .collect();
    llm.core_mut().reset_step_times();
    let start = Instant::now();
    let outs = llm.generate_tokens_each(prompts, &params)?;
    let elapsed = start.elapsed().as_secs_f64();
    let step_breakdown = llm.core().step_times().per_step();
    let output: usize = outs.iter().map(|o| o.outputs[0].token_ids.len()).sum();
    let total = output + num_prompts * input_len;
    Ok(ThroughputResult {
        num_prompts,
        elapsed_s: elapsed,
        requests_per_s: num_prompts as f64 / elapsed,
        total_tokens_per_s: total as f64 / elapsed,
        output_tokens_per_s: output as f64 / elapsed,
        step_breakdown,
    })
}

/// Latency result: one batch generated per iteration.
#[derive(Clone, Debug, Serialize)]
pub struct LatencyResult {
    /// Sequences per batch.
    pub batch_size: usize,
    /// Per-iteration latency.
    pub latency: Summary,
    /// Output tokens per second per sequence, from the mean latency (prefill included).
    pub decode_tokens_per_s_per_seq: f64,
    /// Time to the first token: the same batch run with one output token (llama-bench's `pp`).
    pub ttft: Summary,
    /// Prompt tokens per second of the batch, from the mean time to the first token.
    pub prefill_tokens_per_s: f64,
    /// Per sequence, tokens per second of the decode steps alone: the output tokens after the
    /// first over the mean latency less the mean time to the first token (llama-bench's `tg`).
    pub decode_only_tokens_per_s_per_seq: f64,
    /// Mean time per engine step of each phase, over the timed iterations.
    pub step_breakdown: StepBreakdown,
}

/// `iters` timed batches after `warmup` untimed ones.
pub fn latency(
    args: EngineArgs,
    batch_size: usize,
    input_len: usize,
    output_len: usize,
    warmup: usize,
    iters: usize,
) -> Result<LatencyResult, EngineError> {
    let mut llm = Llm::new(EngineArgs {
        enable_prefix_caching: false,
        ..args
    })?;
    let vocab = llm.core().model_config().vocab_size;
    let params = fixed_length(output_len);
    let prompts = |i: usize| random_prompts(batch_size, input_len, vocab, i as u64);
    let mut samples = Vec::with_capacity(iters);
    for i in 0..warmup + iters {
        if i == warmup {
            llm.core_mut().reset_step_times();
        }
        let start = Instant::now();
        llm.generate_tokens(prompts(i), &params)?;
        if i >= warmup {
            samples.push(start.elapsed().as_secs_f64());
        }
    }
    let step_breakdown = llm.core().step_times().per_step();
    // The same batches again with one output token: the prefill alone.
    let first = fixed_length(1);
    let mut firsts = Vec::with_capacity(iters);
    for i in warmup..warmup + iters {
        let start = Instant::now();
        llm.generate_tokens(prompts(i), &first)?;
        firsts.push(start.elapsed().as_secs_f64());
    }
    let latency = Summary::of_seconds(&samples);
    let ttft = Summary::of_seconds(&firsts);
    let decode_s = ((latency.mean_ms - ttft.mean_ms) / 1e3).max(f64::MIN_POSITIVE);
    Ok(LatencyResult {
        step_breakdown,
        batch_size,
        decode_tokens_per_s_per_seq: output_len as f64 / (latency.mean_ms / 1e3),
        prefill_tokens_per_s: (batch_size * input_len) as f64 / (ttft.mean_ms / 1e3),
        decode_only_tokens_per_s_per_seq: output_len.saturating_sub(1) as f64 / decode_s,
        latency,
        ttft,
    })
}
