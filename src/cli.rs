//! The command line (clap): vLLM's flag names, each also readable from a `PAGEWISE_*` variable.

use clap::{Args, Parser, Subcommand};

use crate::engine_flags::EngineFlags;
use crate::request::SamplingParams;

/// pagewise: an OpenAI-compatible LLM inference server with a paged KV cache and continuous batching.
#[derive(Parser, Debug)]
#[command(name = "pagewise", version, about, long_about = None)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
    /// Log format.
    #[arg(long, env = "PAGEWISE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,
    /// TOML or YAML file of flag values (keys as the flag names). Precedence: command line >
    /// PAGEWISE_* environment > this file > defaults. Examples in configs/.
    #[arg(long, global = true)]
    pub config: Option<String>,
}

/// Log line format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Serve the OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions, ...).
    Serve(ServeCmd),
    /// Generate completions for prompts, offline (like vLLM's `LLM.generate`), and print them.
    Generate(GenerateCmd),
    /// Benchmarks: `serve` (against a server), `throughput` and `latency` (offline).
    Bench(crate::bench::BenchCmd),
    /// Chat in the terminal with a running server (`--url`), or with a model started here.
    Chat(ClientCmd),
    /// Complete prompts in the terminal, with a running server (`--url`) or a model started here.
    Complete(ClientCmd),
}

/// `pagewise chat` and `pagewise complete`: a terminal client. Each line is a user message
/// (chat: the conversation is kept) or a prompt (complete); the answer streams back. `/clear`
/// forgets the conversation; `/exit`, `/quit` or Ctrl-D end.
#[derive(Args, Debug)]
pub struct ClientCmd {
    /// A running server's API, e.g. http://localhost:8000/v1. Without it, the model of the engine
    /// flags below (default: SmolLM2-135M-Instruct) is started in this process.
    #[arg(long, env = "PAGEWISE_CLIENT_URL")]
    pub url: Option<String>,
    /// The model to ask the server for (default: the first it lists).
    #[arg(long)]
    pub model_name: Option<String>,
    /// Bearer key for the server's API.
    #[arg(long, env = "PAGEWISE_CLIENT_API_KEY")]
    pub client_api_key: Option<String>,
    /// A system message that opens the conversation (chat only).
    #[arg(long)]
    pub system_prompt: Option<String>,
    /// Tokens an answer may take (default: the server's).
    #[arg(long)]
    pub max_tokens: Option<usize>,
    /// Sampling temperature (default: the server's).
    #[arg(long)]
    pub temperature: Option<f32>,
    /// Send this one message or prompt, print the answer and exit.
    #[arg(long)]
    pub quick: Option<String>,
    /// Model and engine settings, for the model started here (not used with --url).
    #[command(flatten)]
    pub engine: EngineFlags,
}

/// `pagewise serve`.
#[derive(Args, Debug)]
pub struct ServeCmd {
    /// Model to serve (same forms as --model; default: SmolLM2-135M-Instruct).
    #[arg(value_name = "MODEL")]
    pub model_arg: Option<String>,
    /// Model and engine settings.
    #[command(flatten)]
    pub engine: EngineFlags,
    /// Engine replicas behind this server (data parallelism): each a whole model on its own GPU
    /// (the `--device` GPU and the ones after it; all on the CPU with `--device cpu`), with its
    /// own scheduler and KV cache. A request goes to the replica holding its prompt's prefix
    /// unless that one is a full batch busier than the least-loaded. `/metrics` labels each
    /// replica's samples `engine="i"`; `/dashboard?engine=i` shows its page table.
    #[arg(long, env = "PAGEWISE_DATA_PARALLEL_SIZE", default_value_t = 1)]
    pub data_parallel_size: usize,
    /// Address to listen on.
    #[arg(long, env = "PAGEWISE_HOST", default_value = "0.0.0.0")]
    pub host: String,
    /// Port to listen on.
    #[arg(long, env = "PAGEWISE_PORT", default_value_t = 8000)]
    pub port: u16,
    /// Names the model answers to in requests (repeatable; the first is reported). Default: the
    /// model argument (the default model: SmolLM2-135M-Instruct).
    #[arg(long, env = "PAGEWISE_SERVED_MODEL_NAME", value_delimiter = ',')]
    pub served_model_name: Vec<String>,
    /// API keys accepted as `Authorization: Bearer KEY` on /v1/*, /tokenize and /detokenize
    /// (repeatable or comma-separated). None: no authentication.
    #[arg(long, env = "PAGEWISE_API_KEY", value_delimiter = ',')]
    pub api_key: Vec<String>,
    /// Origins allowed by CORS (repeatable or comma-separated; `*` for any). None: no CORS headers.
    #[arg(long, env = "PAGEWISE_ALLOWED_ORIGINS", value_delimiter = ',')]
    pub allowed_origins: Vec<String>,
    /// Sequences (a request of `n` counts `n`) that may wait for their first engine step before
    /// new requests get 429 with Retry-After; counted live at admission. 0: no limit.
    #[arg(long, env = "PAGEWISE_MAX_NUM_QUEUED_REQUESTS", default_value_t = 1024)]
    pub max_num_queued_requests: usize,
    /// Seconds in-flight requests get to finish after SIGTERM/SIGINT.
    #[arg(long, env = "PAGEWISE_SHUTDOWN_TIMEOUT", default_value_t = 30)]
    pub shutdown_timeout: u64,
    /// Serve no `/dashboard` (the live view of the page table) and no `/dashboard/events`.
    #[arg(long, env = "PAGEWISE_DISABLE_DASHBOARD")]
    pub disable_dashboard: bool,
    /// Largest output constraint a request may send (a JSON schema, regex, choice list or
    /// grammar), in bytes; larger ones get a 400.
    #[arg(long, env = "PAGEWISE_STRUCTURED_OUTPUTS_MAX_BYTES", default_value_t = 256 * 1024)]
    pub structured_outputs_max_bytes: usize,
    /// Seconds an output constraint may take to compile before its request gets a 400.
    #[arg(
        long,
        env = "PAGEWISE_STRUCTURED_OUTPUTS_TIMEOUT",
        default_value_t = 10.0
    )]
    pub structured_outputs_timeout: f64,
    /// Honour `tool_choice: "auto"` (the default when a chat request sends tools): the model
    /// decides, and `--tool-call-parser` reads its calls. Without it such requests get a 400;
    /// "required" and named functions work either way.
    #[arg(
        long,
        env = "PAGEWISE_ENABLE_AUTO_TOOL_CHOICE",
        requires = "tool_call_parser"
    )]
    pub enable_auto_tool_choice: bool,
    /// How the model writes tool calls: hermes (Qwen2.5, Qwen3, Hermes), llama3_json
    /// (Llama 3.1/3.2), mistral, or openai (gpt-oss's harmony messages to `functions.*`; implies
    /// `--reasoning-parser openai_gptoss`, and `strict` tools are not enforced under it).
    #[arg(long, env = "PAGEWISE_TOOL_CALL_PARSER", value_enum)]
    pub tool_call_parser: Option<crate::server::tools::ToolParser>,
    /// Split chat answers' reasoning into `reasoning_content` (streamed as
    /// `delta.reasoning_content`): deepseek_r1 (`...</think>`), qwen3 (`<think>...</think>`,
    /// or no thinking) or openai_gptoss (gpt-oss's harmony channels: `analysis` is reasoning).
    #[arg(long, env = "PAGEWISE_REASONING_PARSER", value_enum)]
    pub reasoning_parser: Option<crate::server::reasoning::ReasoningParser>,
    /// Responses of /v1/responses kept in memory (with `store`, the default) for
    /// `previous_response_id` and `GET /v1/responses/{id}`; the least recently used go first.
    /// 0: keep none.
    #[arg(
        long,
        env = "PAGEWISE_RESPONSES_STORE_SIZE",
        default_value_t = crate::server::responses_api::DEFAULT_STORE_SIZE
    )]
    pub responses_store_size: usize,
    /// This node serves no HTTP: it only runs its ranks of a multi-node tensor-parallel group
    /// (`--node-rank` 1 or more, which implies it).
    #[arg(long, env = "PAGEWISE_HEADLESS")]
    pub headless: bool,
}

/// `pagewise generate`.
#[derive(Args, Debug)]
pub struct GenerateCmd {
    /// Model and engine settings.
    #[command(flatten)]
    pub engine: EngineFlags,
    /// A prompt; repeat for several (they are batched together).
    #[arg(long = "prompt", required = true)]
    pub prompts: Vec<String>,
    /// Treat each prompt as one user message and apply the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// Sampling temperature (0 = greedy).
    #[arg(long, default_value_t = 1.0)]
    pub temperature: f32,
    /// Nucleus sampling probability mass.
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Keep only the k most likely tokens (0 or -1: off).
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub top_k: i32,
    /// Minimum probability relative to the most likely token.
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f32,
    /// Tokens to generate at most.
    #[arg(long, default_value_t = 64)]
    pub max_tokens: usize,
    /// Seed of the sampling random stream.
    #[arg(long)]
    pub sampling_seed: Option<u64>,
    /// Stop strings (repeatable).
    #[arg(long)]
    pub stop: Vec<String>,
    /// Keep generating past EOS (for timing fixed lengths).
    #[arg(long)]
    pub ignore_eos: bool,
    /// Completions per prompt.
    #[arg(long, default_value_t = 1)]
    pub n: usize,
}

impl GenerateCmd {
    /// The sampling parameters the flags describe.
    pub fn sampling_params(&self) -> SamplingParams {
        SamplingParams {
            n: self.n,
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            min_p: self.min_p,
            max_tokens: self.max_tokens,
            seed: self.sampling_seed,
            stop: self.stop.clone(),
            ignore_eos: self.ignore_eos,
            ..Default::default()
        }
    }
}
