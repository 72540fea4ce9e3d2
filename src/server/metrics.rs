//! GET /metrics: the engine's gauges and counters plus the server's request latencies, in the
//! Prometheus text format with vLLM's names.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};

use super::AppState;
use crate::metrics::{Histogram, render_sample};
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

/// GET /metrics
pub async fn metrics(State(state): State<AppState>) -> Response {
    let labels = format!(
        "model_name=\"{}\"",
        state.served_model_names[0].replace('"', "'")
    );
    let e = state.engine.stats();
    let m = &state.metrics;
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
    let mut out = String::new();
    let gauges = [
        (
            "vllm:num_requests_running",
            "Sequences running on the engine.",
            load(&e.num_running),
        ),
        (
            "vllm:num_requests_waiting",
            "Sequences waiting to be scheduled.",
            load(&e.num_waiting),
        ),
        (
            "vllm:kv_cache_usage_perc",
            "KV-cache usage: 1 means every block in use.",
            load(&e.kv_usage_ppm) / 1e6,
        ),
        (
            "vllm:gpu_cache_usage_perc",
            "KV-cache usage (older name).",
            load(&e.kv_usage_ppm) / 1e6,
        ),
        (
            "pagewise:kv_window_cache_usage_perc",
            "Usage of the window group, the sliding-window layers' own blocks (models that mix \
             sliding-window and full layers): 1 means every block in use; 0 without a group.",
            load(&e.kv_window_usage_ppm) / 1e6,
        ),
        (
            "pagewise:num_queued_sequences",
            "Sequences accepted and not yet scheduled (what --max-num-queued-requests bounds).",
            state.engine.num_queued() as f64,
        ),
        (
            "pagewise:engine_alive",
            "1 while the engine thread runs, 0 once it has died (the server then exits 1).",
            f64::from(u8::from(state.engine.is_alive())),
        ),
    ];
    for (name, help, v) in gauges {
        render_sample(&mut out, name, "gauge", help, &labels, v);
    }
    let counters = [
        (
            "vllm:prompt_tokens_total",
            "Prompt tokens processed.",
            load(&m.prompt_tokens),
        ),
        (
            "vllm:generation_tokens_total",
            "Tokens generated.",
            load(&e.num_generated_tokens),
        ),
        (
            "vllm:num_preemptions_total",
            "Sequences preempted by recompute.",
            load(&e.num_preemptions),
        ),
        (
            "vllm:prefix_cache_queries_total",
            "Prompt tokens looked up in the prefix cache.",
            load(&e.prefix_cache_queries),
        ),
        (
            "vllm:prefix_cache_hits_total",
            "Prompt tokens served from the prefix cache.",
            load(&e.prefix_cache_hits),
        ),
        (
            "pagewise:engine_steps_total",
            "Engine steps run.",
            load(&e.steps),
        ),
        (
            "pagewise:engine_cuda_graph_steps_total",
            "Engine steps whose forward pass replayed a CUDA graph.",
            load(&e.graph_steps),
        ),
        (
            "pagewise:engine_cuda_graph_forward_seconds_total",
            "Forward-phase time of the steps that replayed a CUDA graph.",
            load(&e.graph_forward_micros) / 1e6,
        ),
    ];
    for (name, help, v) in counters {
        render_sample(&mut out, name, "counter", help, &labels, v);
    }
    out.push_str("# HELP vllm:request_success_total Finished sequences by finish reason.\n");
    out.push_str("# TYPE vllm:request_success_total counter\n");
    for (i, reason) in ["stop", "length", "abort"].iter().enumerate() {
        let v = m.success[i].load(Ordering::Relaxed);
        out.push_str(&format!(
            "vllm:request_success_total{{{labels},finished_reason=\"{reason}\"}} {v}\n"
        ));
    }
    out.push_str(
        "# HELP pagewise:engine_step_phase_seconds_total Engine-thread time by step phase.\n\
         # TYPE pagewise:engine_step_phase_seconds_total counter\n",
    );
    for ((_, phase), micros) in Phase::ALL.iter().zip(&e.phase_micros) {
        let v = load(micros) / 1e6;
        out.push_str(&format!(
            "pagewise:engine_step_phase_seconds_total{{{labels},phase=\"{phase}\"}} {v}\n"
        ));
    }
    render_spec(&mut out, &e.spec, &labels);
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
    e.queue_time.render(
        &mut out,
        "vllm:request_queue_time_seconds",
        "Arrival to first scheduled step.",
        &labels,
    );
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
fn render_spec(out: &mut String, spec: &crate::engine::handle::SpecCounters, labels: &str) {
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
    let k = spec.num_speculative_tokens.load(Ordering::Relaxed) as usize;
    if k == 0 {
        return;
    }
    for (name, help, v) in [
        (
            "vllm:spec_decode_num_drafts_total",
            "Sequence-steps that verified draft tokens.",
            load(&spec.num_drafts),
        ),
        (
            "vllm:spec_decode_num_draft_tokens_total",
            "Draft tokens verified.",
            load(&spec.num_draft_tokens),
        ),
        (
            "vllm:spec_decode_num_accepted_tokens_total",
            "Draft tokens accepted.",
            load(&spec.num_accepted_tokens),
        ),
    ] {
        render_sample(out, name, "counter", help, labels, v);
    }
    out.push_str(
        "# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted draft tokens by \
         position in the draft.\n\
         # TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter\n",
    );
    for (pos, n) in spec.accepted_per_pos.iter().take(k).enumerate() {
        let v = load(n);
        out.push_str(&format!(
            "vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position=\"{pos}\"}} {v}\n"
        ));
    }
}
