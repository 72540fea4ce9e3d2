//! GET /metrics: the engines' gauges and counters (one sample a replica, `engine="i"`) plus the
//! server's request counts and latencies, in the Prometheus text format with vLLM's names.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};

use std::fmt::Write;

use super::AppState;
use crate::engine::handle::EngineHandle;
use crate::metrics::{Histogram, render_sample, render_samples};
use crate::request::FinishReason;
use crate::runner::step_times::Phase;

/// What the HTTP layer measures.
#[derive(Debug, Default)]
pub struct ServerMetrics {
    /// Prompt tokens of accepted requests.
    pub prompt_tokens: AtomicU64,
    /// Finished sequences by reason: stop, length, abort.
    pub success: [AtomicU64; 3],
    /// Arrival to first token.
    pub ttft: Histogram,
    /// Between consecutive tokens of one sequence.
    pub itl: Histogram,
    /// Arrival to last token.
    pub e2e: Histogram,
}

impl ServerMetrics {
    /// Counts a finished sequence.
    pub fn finished(&self, reason: FinishReason) {
        let i = match reason {
            FinishReason::Stop => 0,
            FinishReason::Length => 1,
            FinishReason::Abort => 2,
        };
        self.success[i].fetch_add(1, Ordering::Relaxed);
    }
}

/// Per-request timing: first token, gaps between tokens of each choice, and the end.
pub struct RequestTimer {
    arrived: Instant,
    first_seen: bool,
    last: Vec<Option<Instant>>,
}

impl RequestTimer {
    /// A timer for a request with `num_choices` choices that arrived at `arrived`.
    pub fn new(arrived: Instant, num_choices: usize) -> Self {
        RequestTimer {
            arrived,
            first_seen: false,
            last: vec![None; num_choices],
        }
    }

    /// Records a token of choice `index`.
    pub fn token(&mut self, m: &ServerMetrics, index: usize) {
        let now = Instant::now();
        if !self.first_seen {
            self.first_seen = true;
            m.ttft.observe(now - self.arrived);
        }
        if let Some(prev) = self.last[index] {
            m.itl.observe(now - prev);
        }
        self.last[index] = Some(now);
    }

    /// Records the request's end.
    pub fn done(&self, m: &ServerMetrics) {
        m.e2e.observe(self.arrived.elapsed());
    }

    /// Time since arrival.
    pub fn elapsed(&self) -> Duration {
        self.arrived.elapsed()
    }
}

/// A gauge or counter each engine replica publishes: name, kind, help, its value.
type EngineFamily = (
    &'static str,
    &'static str,
    &'static str,
    fn(&EngineHandle) -> f64,
);

fn load(a: &AtomicU64) -> f64 {
    a.load(Ordering::Relaxed) as f64
}

/// The engines' gauges and counters, one sample a replica (`engine="i"`, as vLLM labels its
/// data-parallel engines).
const ENGINE_FAMILIES: [EngineFamily; 13] = [
    (
        "vllm:num_requests_running",
        "gauge",
        "Sequences running on the engine.",
        |e| load(&e.stats().num_running),
    ),
    (
        "vllm:num_requests_waiting",
        "gauge",
        "Sequences waiting to be scheduled.",
        |e| load(&e.stats().num_waiting),
    ),
    (
        "vllm:kv_cache_usage_perc",
        "gauge",
        "KV-cache usage: 1 means every block in use.",
        |e| load(&e.stats().kv_usage_ppm) / 1e6,
    ),
    (
        "vllm:gpu_cache_usage_perc",
        "gauge",
        "KV-cache usage (older name).",
        |e| load(&e.stats().kv_usage_ppm) / 1e6,
    ),
    (
        "pagewise:kv_window_cache_usage_perc",
        "gauge",
        "Usage of the window group, the sliding-window layers' own blocks (models that mix \
         sliding-window and full layers): 1 means every block in use; 0 without a group.",
        |e| load(&e.stats().kv_window_usage_ppm) / 1e6,
    ),
    (
        "pagewise:num_queued_sequences",
        "gauge",
        "Sequences accepted and not yet scheduled (what --max-num-queued-requests bounds).",
        |e| e.num_queued() as f64,
    ),
    (
        "pagewise:engine_alive",
        "gauge",
        "1 while the engine thread runs, 0 once it has died (the server then exits 1).",
        |e| f64::from(u8::from(e.is_alive())),
    ),
    (
        "vllm:generation_tokens_total",
        "counter",
        "Tokens generated.",
        |e| load(&e.stats().num_generated_tokens),
    ),
    (
        "vllm:num_preemptions_total",
        "counter",
        "Sequences preempted by recompute.",
        |e| load(&e.stats().num_preemptions),
    ),
    (
        "vllm:prefix_cache_queries_total",
        "counter",
        "Prompt tokens looked up in the prefix cache.",
        |e| load(&e.stats().prefix_cache_queries),
    ),
    (
        "vllm:prefix_cache_hits_total",
        "counter",
        "Prompt tokens served from the prefix cache.",
        |e| load(&e.stats().prefix_cache_hits),
    ),
    (
        "pagewise:engine_steps_total",
        "counter",
        "Engine steps run.",
        |e| load(&e.stats().steps),
    ),
    (
        "pagewise:engine_cuda_graph_steps_total",
        "counter",
        "Engine steps whose forward pass replayed a CUDA graph.",
        |e| load(&e.stats().graph_steps),
    ),
];

/// GET /metrics
pub async fn metrics(State(state): State<AppState>) -> Response {
    let labels = format!(
        "model_name=\"{}\"",
        state.served_model_names[0].replace('"', "'")
    );
    let engines = state.engine.replicas();
    let engine_labels: Vec<String> = (0..engines.len())
        .map(|i| format!("{labels},engine=\"{i}\""))
        .collect();
    let m = &state.metrics;
    let mut out = String::new();
    for (name, kind, help, value) in ENGINE_FAMILIES {
        let samples = engines
            .iter()
            .zip(&engine_labels)
            .map(|(e, l)| (l.clone(), value(e)));
        render_samples(&mut out, name, kind, help, samples);
    }
    render_samples(
        &mut out,
        "pagewise:engine_cuda_graph_forward_seconds_total",
        "counter",
        "Forward-phase time of the steps that replayed a CUDA graph.",
        engines
            .iter()
            .zip(&engine_labels)
            .map(|(e, l)| (l.clone(), load(&e.stats().graph_forward_micros) / 1e6)),
    );
    render_samples(
        &mut out,
        "pagewise:routed_requests_total",
        "counter",
        "Requests given to each engine replica (--data-parallel-size).",
        engine_labels
            .iter()
            .enumerate()
            .map(|(i, l)| (l.clone(), state.engine.routed(i) as f64)),
    );
    render_sample(
        &mut out,
        "vllm:prompt_tokens_total",
        "counter",
        "Prompt tokens processed.",
        &labels,
        load(&m.prompt_tokens),
    );
    out.push_str("# HELP vllm:request_success_total Finished sequences by finish reason.\n");
    out.push_str("# TYPE vllm:request_success_total counter\n");
    for (i, reason) in ["stop", "length", "abort"].iter().enumerate() {
        let v = m.success[i].load(Ordering::Relaxed);
        out.push_str(&format!(
            "vllm:request_success_total{{{labels},finished_reason=\"{reason}\"}} {v}\n"
        ));
    }
    render_samples(
        &mut out,
        "pagewise:engine_step_phase_seconds_total",
        "counter",
        "Engine-thread time by step phase.",
        engines.iter().zip(&engine_labels).flat_map(|(e, l)| {
            Phase::ALL
                .iter()
                .zip(&e.stats().phase_micros)
                .map(move |((_, phase), micros)| {
                    (format!("{l},phase=\"{phase}\""), load(micros) / 1e6)
                })
        }),
    );
    render_spec(&mut out, engines, &engine_labels);
    m.ttft.render(
        &mut out,
        "vllm:time_to_first_token_seconds",
        "Arrival to first token.",
        &labels,
    );
    m.itl.render(
        &mut out,
        "vllm:inter_token_latency_seconds",
        "Between consecutive tokens.",
        &labels,
    );
    m.e2e.render(
        &mut out,
        "vllm:e2e_request_latency_seconds",
        "Arrival to last token.",
        &labels,
    );
    let _ = writeln!(
        out,
        "# HELP vllm:request_queue_time_seconds Arrival to first scheduled step.\n\
         # TYPE vllm:request_queue_time_seconds histogram"
    );
    for (e, l) in engines.iter().zip(&engine_labels) {
        e.stats()
            .queue_time
            .render_series(&mut out, "vllm:request_queue_time_seconds", l);
    }
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        out,
    )
        .into_response()
}

/// Speculative decoding's counters, with vLLM's names, when it is on.
fn render_spec(out: &mut String, engines: &[EngineHandle], labels: &[String]) {
    let k = engines[0]
        .stats()
        .spec
        .num_speculative_tokens
        .load(Ordering::Relaxed) as usize;
    if k == 0 {
        return;
    }
    type Counter = fn(&crate::engine::handle::SpecCounters) -> &AtomicU64;
    let families: [(&str, &str, Counter); 3] = [
        (
            "vllm:spec_decode_num_drafts_total",
            "Sequence-steps that verified draft tokens.",
            |s| &s.num_drafts,
        ),
        (
            "vllm:spec_decode_num_draft_tokens_total",
            "Draft tokens verified.",
            |s| &s.num_draft_tokens,
        ),
        (
            "vllm:spec_decode_num_accepted_tokens_total",
            "Draft tokens accepted.",
            |s| &s.num_accepted_tokens,
        ),
    ];
    for (name, help, counter) in families {
        let samples = engines
            .iter()
            .zip(labels)
            .map(|(e, l)| (l.clone(), load(counter(&e.stats().spec))));
        render_samples(out, name, "counter", help, samples);
    }
    render_samples(
        out,
        "vllm:spec_decode_num_accepted_tokens_per_pos_total",
        "counter",
        "Accepted draft tokens by position in the draft.",
        engines.iter().zip(labels).flat_map(|(e, l)| {
            e.stats()
                .spec
                .accepted_per_pos
                .iter()
                .take(k)
                .enumerate()
                .map(move |(pos, n)| (format!("{l},position=\"{pos}\""), load(n)))
        }),
    );
}
