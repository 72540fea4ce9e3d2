//! `pagewise bench throughput` and `pagewise bench latency`: in-process, through `Llm`, with
//! random token-id prompts of exact lengths (vLLM's `bench throughput` / `bench latency`), or
//! for `latency` one text prompt (`--prompt`: workloads whose output depends on the input, as
//! speculative decoding needs).

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
    /// Drafts and acceptance, with `--speculative-config`.
    pub speculative: Option<SpecSummary>,
}

/// What `bench latency` runs.
#[derive(Clone, Debug)]
pub struct LatencyWorkload {
    /// Sequences per batch.
    pub batch_size: usize,
    /// Prompt length (tokens) of the random prompts.
    pub input_len: usize,
    /// Output length (tokens, EOS ignored).
    pub output_len: usize,
    /// Untimed batches first.
    pub warmup: usize,
    /// Timed batches.
    pub iters: usize,
    /// A text prompt for every sequence instead of random tokens; with `chat`, as one user
    /// message in the model's chat template.
    pub prompt: Option<String>,
    /// See `prompt`.
    pub chat: bool,
    /// Sampling temperature (vLLM's `bench latency` samples at 1.0).
    pub temperature: f32,
}

impl Default for LatencyWorkload {
    fn default() -> Self {
        LatencyWorkload {
            batch_size: 1,
            input_len: 128,
            output_len: 512,
            warmup: 1,
            iters: 5,
            prompt: None,
            chat: false,
            temperature: 1.0,
        }
    }
}

/// Speculative decoding over the timed batches.
#[derive(Clone, Debug, Serialize)]
pub struct SpecSummary {
    /// Draft tokens verified.
    pub draft_tokens: u64,
    /// Of those, accepted.
    pub accepted_tokens: u64,
    /// Accepted per draft token.
    pub acceptance_rate: f64,
    /// Output tokens per engine step and sequence (1 without speculation).
    pub tokens_per_step: f64,
}

/// `w.iters` timed batches after `w.warmup` untimed ones.
pub fn latency(args: EngineArgs, w: &LatencyWorkload) -> Result<LatencyResult, EngineError> {
    let mut llm = Llm::new(EngineArgs {
        enable_prefix_caching: false,
        ..args
    })?;
    let vocab = llm.core().model_config().vocab_size;
    let params = SamplingParams {
        temperature: w.temperature,
        ..fixed_length(w.output_len)
    };
    let text = match &w.prompt {
        Some(p) => Some(llm.prompt_tokens(p, w.chat)?),
        None => None,
    };
    let input_len = text.as_ref().map_or(w.input_len, Vec::len);
    let prompts = |i: usize| match &text {
        Some(t) => vec![t.clone(); w.batch_size],
        None => random_prompts(w.batch_size, w.input_len, vocab, i as u64),
    };
    let mut samples = Vec::with_capacity(w.iters);
    let mut spec_before = llm.core().spec_stats().clone();
    for i in 0..w.warmup + w.iters {
        if i == w.warmup {
            llm.core_mut().reset_step_times();
            spec_before = llm.core().spec_stats().clone();
        }
        let start = Instant::now();
        llm.generate_tokens(prompts(i), &params)?;
        if i >= w.warmup {
            samples.push(start.elapsed().as_secs_f64());
        }
    }
    let step_breakdown = llm.core().step_times().per_step();
    let speculative = llm.core().speculation().map(|_| {
        let after = llm.core().spec_stats();
        let drafts = after.num_draft_tokens - spec_before.num_draft_tokens;
        let accepted = after.num_accepted_tokens - spec_before.num_accepted_tokens;
        let steps = llm.core().step_times().steps().max(1) as f64;
        SpecSummary {
            draft_tokens: drafts,
            accepted_tokens: accepted,
            acceptance_rate: accepted as f64 / drafts.max(1) as f64,
            tokens_per_step: (w.iters * w.batch_size * w.output_len) as f64
                / (steps * w.batch_size as f64),
        }
    });
    // The same batches again with one output token: the prefill alone.
    let first = fixed_length(1);
    let mut firsts = Vec::with_capacity(w.iters);
    for i in w.warmup..w.warmup + w.iters {
        let start = Instant::now();
        llm.generate_tokens(prompts(i), &first)?;
        firsts.push(start.elapsed().as_secs_f64());
    }
    let latency = Summary::of_seconds(&samples);
    let ttft = Summary::of_seconds(&firsts);
    let decode_s = ((latency.mean_ms - ttft.mean_ms) / 1e3).max(f64::MIN_POSITIVE);
    Ok(LatencyResult {
        step_breakdown,
        batch_size: w.batch_size,
        decode_tokens_per_s_per_seq: w.output_len as f64 / (latency.mean_ms / 1e3),
        prefill_tokens_per_s: (w.batch_size * input_len) as f64 / (ttft.mean_ms / 1e3),
        decode_only_tokens_per_s_per_seq: w.output_len.saturating_sub(1) as f64 / decode_s,
        latency,
        ttft,
        speculative,
    })
}
