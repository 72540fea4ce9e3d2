//! `pagewise bench`: serving load against any OpenAI-compatible server, and offline throughput and
//! latency through the library, with vLLM's benchmark semantics so numbers compare.

pub mod offline;
pub mod plot;
pub mod serve;
pub mod server_steps;
pub mod stats;

use clap::{Args, Subcommand};

use crate::engine_flags::EngineFlags;

/// `pagewise bench`.
#[derive(Args, Debug)]
pub struct BenchCmd {
    /// Which benchmark.
    #[command(subcommand)]
    pub kind: BenchKind,
}

/// The benchmarks.
#[derive(Subcommand, Debug)]
pub enum BenchKind {
    /// Load a running OpenAI-compatible server (ours or another) like `vllm bench serve`.
    Serve(BenchServeArgs),
    /// Offline: all prompts at once through the library; requests and tokens per second.
    Throughput(BenchThroughputArgs),
    /// Offline: one batch at a time; latency percentiles over iterations.
    Latency(BenchLatencyArgs),
    /// Charts TTFT and TPOT (median, p99) against request rate from `bench serve` result files.
    Plot(BenchPlotArgs),
}

/// `pagewise bench plot`.
#[derive(Args, Debug)]
pub struct BenchPlotArgs {
    /// Result files written by `pagewise bench serve --result-file` (one per request rate).
    #[arg(required = true)]
    pub results: Vec<std::path::PathBuf>,
    /// The PNG to write.
    #[arg(long, default_value = "serve-sweep.png")]
    pub out: std::path::PathBuf,
    /// TrueType font for the chart's text (default: DejaVu Sans or similar from the system).
    #[arg(long)]
    pub plot_font: Option<std::path::PathBuf>,
}

/// `pagewise bench serve`.
#[derive(Args, Debug)]
pub struct BenchServeArgs {
    /// Server root URL.
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    pub base_url: String,
    /// `/v1/completions` (token-exact prompts sent as ids) or `/v1/chat/completions` (word prompts).
    #[arg(long, default_value = "/v1/completions")]
    pub endpoint: String,
    /// Model name to request.
    #[arg(long, default_value = "SmolLM2-135M-Instruct")]
    pub model: String,
    /// Requests to send.
    #[arg(long, default_value_t = 1000)]
    pub num_prompts: usize,
    /// Mean prompt length (tokens).
    #[arg(long, default_value_t = 1024)]
    pub random_input_len: usize,
    /// Mean output length (tokens).
    #[arg(long, default_value_t = 128)]
    pub random_output_len: usize,
    /// Lengths vary uniformly within ±ratio of the mean.
    #[arg(long, default_value_t = 0.0)]
    pub random_range_ratio: f64,
    /// Tokens of a prefix shared by all prompts.
    #[arg(long, default_value_t = 0)]
    pub random_prefix_len: usize,
    /// Random prompt token ids are drawn below this (must fit the server's vocabulary).
    #[arg(long, default_value_t = 1000)]
    pub random_vocab_size: usize,
    /// Requests per second; `inf` sends all at once.
    #[arg(long, default_value = "inf")]
    pub request_rate: f64,
    /// Gamma shape of inter-arrival times (1: Poisson; lower: burstier).
    #[arg(long, default_value_t = 1.0)]
    pub burstiness: f64,
    /// Most requests in flight.
    #[arg(long)]
    pub max_concurrency: Option<usize>,
    /// Ask for full-length outputs (`ignore_eos`).
    #[arg(long)]
    pub ignore_eos: bool,
    /// Seed of prompts and arrivals.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Bearer key for the server.
    #[arg(long, env = "OPENAI_API_KEY")]
    pub api_key: Option<String>,
    /// Write the result as JSON here.
    #[arg(long)]
    pub result_file: Option<String>,
    /// A ShareGPT-format JSON file to take prompts from instead of random ones (needs --tokenizer).
    #[arg(long)]
    pub dataset_path: Option<String>,
    /// Model (directory, .gguf or hub id) whose tokenizer measures ShareGPT lengths.
    #[arg(long)]
    pub tokenizer: Option<String>,
    /// No progress line on stderr.
    #[arg(long)]
    pub no_progress: bool,
    /// Also draw the run's TTFT/TPOT/ITL/E2E percentiles as a PNG here.
    #[arg(long)]
    pub plot: Option<std::path::PathBuf>,
    /// TrueType font for chart text (default: DejaVu Sans or similar from the system).
    #[arg(long)]
    pub plot_font: Option<std::path::PathBuf>,
}

impl BenchServeArgs {
    /// The load generator's settings (loads the tokenizer when one is named).
    pub fn config(&self) -> Result<serve::ServeBenchConfig, crate::loader::LoadError> {
        let tokenizer = match &self.tokenizer {
            Some(t) => Some(std::sync::Arc::new(crate::loader::load_tokenizer(t)?)),
            None => None,
        };
        Ok(serve::ServeBenchConfig {
            base_url: self.base_url.clone(),
            endpoint: self.endpoint.clone(),
            model: self.model.clone(),
            num_prompts: self.num_prompts,
            input_len: self.random_input_len,
            output_len: self.random_output_len,
            range_ratio: self.random_range_ratio,
            prefix_len: self.random_prefix_len,
            request_rate: self.request_rate,
            burstiness: self.burstiness,
            max_concurrency: self.max_concurrency,
            ignore_eos: self.ignore_eos,
            vocab_size: self.random_vocab_size,
            seed: self.seed,
            api_key: self.api_key.clone(),
            sharegpt: self.dataset_path.clone(),
            tokenizer,
            progress: !self.no_progress,
        })
    }
}

/// `pagewise bench throughput`.
#[derive(Args, Debug)]
pub struct BenchThroughputArgs {
    /// Model and engine settings.
    #[command(flatten)]
    pub engine: EngineFlags,
    /// Prompts.
    #[arg(long, default_value_t = 1000)]
    pub num_prompts: usize,
    /// Prompt length (tokens).
    #[arg(long, default_value_t = 1024)]
    pub input_len: usize,
    /// Output length (tokens, EOS ignored).
    #[arg(long, default_value_t = 128)]
    pub output_len: usize,
    /// Fraction of the prompts (spread evenly) whose output is constrained to a JSON schema, to
    /// measure what constrained decoding costs.
    #[arg(long, default_value_t = 0.0)]
    pub json_schema_fraction: f64,
    /// The schema of the constrained prompts (a file). Default: an object holding one string of
    /// at least 4096 characters, so a constrained output runs to its length like the others.
    #[arg(long)]
    pub json_schema: Option<std::path::PathBuf>,
    /// Write the result as JSON here.
    #[arg(long)]
    pub output_json: Option<String>,
}

/// `pagewise bench latency`.
#[derive(Args, Debug)]
pub struct BenchLatencyArgs {
    /// Model and engine settings.
    #[command(flatten)]
    pub engine: EngineFlags,
    /// Sequences per batch.
    #[arg(long, default_value_t = 1)]
    pub batch_size: usize,
    /// Prompt length (tokens).
    #[arg(long, default_value_t = 128)]
    pub input_len: usize,
    /// Output length (tokens, EOS ignored).
    #[arg(long, default_value_t = 512)]
    pub output_len: usize,
    /// Untimed iterations first.
    #[arg(long, default_value_t = 1)]
    pub num_iters_warmup: usize,
    /// Timed iterations.
    #[arg(long, default_value_t = 5)]
    pub num_iters: usize,
    /// A text prompt for every sequence instead of `--input-len` random tokens (an
    /// input-grounded workload: rewriting or summarizing the text it gives).
    #[arg(long)]
    pub prompt: Option<String>,
    /// `--prompt` as one user message in the model's chat template.
    #[arg(long, requires = "prompt")]
    pub chat: bool,
    /// Sampling temperature (0 = greedy; vLLM's bench latency samples at 1).
    #[arg(long, default_value_t = 1.0)]
    pub temperature: f32,
    /// Write the result as JSON here.
    #[arg(long)]
    pub output_json: Option<String>,
}

impl BenchLatencyArgs {
    /// The workload these flags describe.
    pub fn workload(&self) -> offline::LatencyWorkload {
        offline::LatencyWorkload {
            batch_size: self.batch_size,
            input_len: self.input_len,
            output_len: self.output_len,
            warmup: self.num_iters_warmup,
            iters: self.num_iters,
            prompt: self.prompt.clone(),
            chat: self.chat,
            temperature: self.temperature,
        }
    }
}
