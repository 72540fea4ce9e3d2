//! pagewise: an OpenAI-compatible LLM inference server with a paged KV cache and continuous batching.
//!
//! The engine core is plain data on the CPU: [`kv`] (the page table manager), [`scheduler`] (continuous
//! batching with chunked prefill, prefix caching and preemption by recompute), [`sampler`], the
//! [`request`] and [`sequence`] types, and [`engine`] (the engine thread, incremental
//! detokenization and stop strings).

pub mod bench;
/// The CPU kernels for GGUF-quantized weights (the `pagewise-cpu` crate).
pub use pagewise_cpu as cpu;
pub mod chat;
pub mod cli;
pub mod client;
pub mod config_file;
pub mod default_model;
pub mod engine;
pub mod engine_flags;
pub mod guided;
pub mod kv;
pub mod llm;
pub mod loader;
pub mod metrics;
pub mod model;
pub mod parallel;
pub mod request;
pub mod runner;
pub mod sampler;
pub mod scheduler;
pub mod sequence;
pub mod server;
pub mod spec;
pub mod sse;

pub use engine::args::{DtypeArg, EngineArgs, EngineError, KvCacheDtype};
pub use llm::{CompletionOutput, Llm, RequestOutput};
pub use request::{FinishReason, SamplingParams};
pub use scheduler::{Scheduler, SchedulerConfig, SchedulerOutput};
pub use sequence::{SeqId, Sequence};
#[doc(hidden)]
pub mod testing;
