//! The engine thread and its handle: one OS thread owns the [`EngineCore`] (no locks around it);
//! async callers submit requests over a bounded channel and read each request's events from a
//! channel of its own. Dropping a request's receiver aborts its sequences on the next step.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::sync::{mpsc, oneshot};

use super::args::{EngineArgs, EngineError};
use super::core::EngineCore;
use super::request::{FinishReason, SamplingParams};
use super::sequence::{SeqId, SeqMap};
use super::step_times::Phase;
use crate::chat::ChatTemplate;
use crate::metrics::Histogram;
use crate::sampler::Logprobs;

/// A fully resolved request: prompt tokens and sampling parameters.
#[derive(Clone, Debug)]
pub struct GenerateRequest {
    /// The prompt's token ids.
    pub prompt_token_ids: Vec<u32>,
    /// Resolved sampling parameters (`n` sequences are generated).
    pub params: SamplingParams,
    /// Isolates this request's prefix-cache entries from other salts.
    pub cache_salt: Option<String>,
}

/// What a request's receiver gets.
#[derive(Clone, Debug, PartialEq)]
pub enum StreamEvent {
    /// A token of completion `index`, with the text it made final.
    Token {
        /// Which of the `n` completions.
        index: usize,
        /// The token.
        token_id: u32,
        /// Text that became final (may be empty).
        text: String,
        /// Logprobs, when requested.
        logprobs: Option<Logprobs>,
        /// Set on the completion's last token.
        finish: Option<FinishReason>,
    },
    /// The request failed; no more events follow.
    Error(String),
}

/// Counters and gauges the engine thread publishes after every step (for `/metrics`).
#[derive(Debug, Default)]
pub struct EngineStats {
    /// Sequences running.
    pub num_running: AtomicU64,
    /// Sequences waiting.
    pub num_waiting: AtomicU64,
    /// KV-cache usage in millionths.
    pub kv_usage_ppm: AtomicU64,
    /// Preemptions since start.
    pub num_preemptions: AtomicU64,
    /// Tokens generated since start.
    pub num_generated_tokens: AtomicU64,
    /// Prompt tokens looked up in the prefix cache.
    pub prefix_cache_queries: AtomicU64,
    /// Prompt tokens served from the prefix cache.
    pub prefix_cache_hits: AtomicU64,
    /// Time from submission to a sequence's first scheduled step.
    pub queue_time: Histogram,
    /// Engine steps run.
    pub steps: AtomicU64,
    /// Of those, steps that replayed a CUDA graph.
    pub graph_steps: AtomicU64,
    /// Engine-thread time per step phase, in microseconds ([`Phase::ALL`] order).
    pub phase_micros: [AtomicU64; 6],
    /// The forward phase of graph-replay steps, in microseconds.
    pub graph_forward_micros: AtomicU64,
}

/// Why a submission was refused before it reached the engine.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    /// The submission queue is full: try again later (HTTP 429/503).
    #[error("the engine's request queue is full")]
    QueueFull,
    /// The engine thread has stopped.
    #[error("the engine is not running")]
    EngineDead,
    /// The engine refused the request.
    #[error(transparent)]
    Rejected(#[from] EngineError),
}

enum Submission {
    Add {
        request: GenerateRequest,
        events: mpsc::UnboundedSender<StreamEvent>,
        accepted: oneshot::Sender<Result<(), EngineError>>,
    },
    /// End every request now with an error event (shutdown timeout).
    AbortAll(String),
}

/// What the model offers callers, read once at start.
#[derive(Clone)]
pub struct ModelInfo {
    /// The tokenizer.
    pub tokenizer: Arc<tokenizers::Tokenizer>,
    /// The chat template, if the model has one (shared read-only).
    pub chat_template: Option<Arc<ChatTemplate>>,
    /// Why there is no chat template, when there is none.
    pub chat_template_error: Option<String>,
    /// Longest prompt + output.
    pub max_model_len: usize,
    /// Vocabulary size.
    pub vocab_size: usize,
}

/// A cheap-to-clone handle to the engine thread.
#[derive(Clone)]
pub struct EngineHandle {
    tx: mpsc::Sender<Submission>,
    alive: Arc<AtomicBool>,
    stats: Arc<EngineStats>,
}

impl EngineHandle {
    /// Loads the model on a new engine thread; returns once it is ready (or failed to load).
    pub fn spawn(
        args: EngineArgs,
        queue_capacity: usize,
    ) -> Result<(Self, ModelInfo), EngineError> {
        let (tx, rx) = mpsc::channel(queue_capacity.max(1));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let alive = Arc::new(AtomicBool::new(true));
        let stats = Arc::new(EngineStats::default());
        let (alive2, stats2) = (alive.clone(), stats.clone());
        std::thread::Builder::new()
            .name("pagewise-engine".into())
            .spawn(move || {
                let core = match EngineCore::new(&args) {
                    Ok(core) => core,
                    Err(e) => {
                        alive2.store(false, Ordering::Release);
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let (chat_template, chat_template_error) = match core.chat_template() {
                    Ok(t) => (Some(t), None),
                    Err(e) => (None, Some(e.0)),
                };
                let info = ModelInfo {
                    tokenizer: core.tokenizer().clone(),
                    chat_template,
                    chat_template_error,
                    max_model_len: core.scheduler().config().max_model_len,
                    vocab_size: core.model_config().vocab_size,
                };
                let _ = ready_tx.send(Ok(info));
                run(core, rx, &stats2);
                alive2.store(false, Ordering::Release);
            })
            .map_err(|e| EngineError::Config(format!("cannot start the engine thread: {e}")))?;
        let info = ready_rx
            .recv()
            .map_err(|_| EngineError::Config("the engine thread died while loading".into()))??;
        Ok((EngineHandle { tx, alive, stats }, info))
    }

    /// Whether the engine thread is running.
    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    /// The published counters.
    pub fn stats(&self) -> &EngineStats {
        &self.stats
    }

    /// Ends every request in flight with an error event (used when the shutdown timeout expires).
    /// Waits for room in the queue, so it is never lost.
    pub async fn abort_all(&self, message: &str) {
        let _ = self
            .tx
            .send(Submission::AbortAll(message.to_string()))
            .await;
    }

    /// Submits a request; the returned receiver yields its events. Never waits for queue room.
    pub async fn submit(
        &self,
        request: GenerateRequest,
    ) -> Result<mpsc::UnboundedReceiver<StreamEvent>, SubmitError> {
        let (events, rx) = mpsc::unbounded_channel();
        let (accepted, accepted_rx) = oneshot::channel();
        self.tx
            .try_send(Submission::Add {
                request,
                events,
                accepted,
            })
            .map_err(|e| match e {
                mpsc::error::TrySendError::Full(_) => SubmitError::QueueFull,
                mpsc::error::TrySendError::Closed(_) => SubmitError::EngineDead,
            })?;
        accepted_rx.await.map_err(|_| SubmitError::EngineDead)??;
        Ok(rx)
    }
}

/// Where a sequence's events go.
struct Route {
    events: mpsc::UnboundedSender<StreamEvent>,
    index: usize,
}

fn run(mut core: EngineCore, mut rx: mpsc::Receiver<Submission>, stats: &EngineStats) {
    let mut routes: SeqMap<Route> = SeqMap::default();
    loop {
        // Idle: sleep until a request arrives. Busy: take whatever is queued, without waiting.
        if !core.has_unfinished() {
            match rx.blocking_recv() {
                Some(s) => admit(&mut core, &mut routes, s),
                None => return,
            }
        }
        while let Ok(s) = rx.try_recv() {
            admit(&mut core, &mut routes, s);
        }
        // Clients that went away: free their sequences before computing for them.
        let gone: Vec<SeqId> = routes
            .iter()
            .filter(|(_, r)| r.events.is_closed())
            .map(|(&id, _)| id)
            .collect();
        for id in gone {
            core.abort(id);
            routes.remove(&id);
        }
        // Events go out as the step produces them (during the next forward pass, see
        // EngineCore::step_with), not when it returns; so are they counted (a client may read
        // the metrics as soon as its last event arrives).
        let stepped = core.step_with(&mut |e| {
            stats.num_generated_tokens.fetch_add(1, Ordering::Relaxed);
            let Some(route) = routes.get(&e.seq_id) else {
                return;
            };
            let _ = route.events.send(StreamEvent::Token {
                index: route.index,
                token_id: e.token_id,
                text: e.text,
                logprobs: e.logprobs,
                finish: e.finish,
            });
            if e.finish.is_some() {
                routes.remove(&e.seq_id);
            }
        });
        match stepped {
            Ok(()) => {}
            Err(e) => {
                tracing::error!("engine step failed: {e}");
                for (id, route) in routes.drain() {
                    let _ = route.events.send(StreamEvent::Error(e.to_string()));
                    core.abort(id);
                }
            }
        }
        publish(&mut core, stats);
    }
}

fn admit(core: &mut EngineCore, routes: &mut SeqMap<Route>, s: Submission) {
    let (request, events, accepted) = match s {
        Submission::Add {
            request,
            events,
            accepted,
        } => (request, events, accepted),
        Submission::AbortAll(message) => {
            for (id, route) in routes.drain() {
                let _ = route.events.send(StreamEvent::Error(message.clone()));
                core.abort(id);
            }
            return;
        }
    };
    match core.add(
        request.prompt_token_ids,
        request.params,
        request.cache_salt.as_deref(),
    ) {
        Ok(ids) => {
            for (index, id) in ids.into_iter().enumerate() {
                routes.insert(
                    id,
                    Route {
                        events: events.clone(),
                        index,
                    },
                );
            }
            let _ = accepted.send(Ok(()));
        }
        Err(e) => {
            let _ = accepted.send(Err(e));
        }
    }
}

fn publish(core: &mut EngineCore, stats: &EngineStats) {
    for t in core.take_queue_times() {
        stats.queue_time.observe(t);
    }
    let s = core.scheduler();
    let prefix = s.kv().prefix_cache_stats();
    stats
        .prefix_cache_queries
        .store(prefix.num_queried_tokens, Ordering::Relaxed);
    stats
        .prefix_cache_hits
        .store(prefix.num_hit_tokens, Ordering::Relaxed);
    // Cache usage first: whoever sees the running count drop also sees the freed blocks.
    stats
        .kv_usage_ppm
        .store((s.kv().pool().usage() * 1e6) as u64, Ordering::Relaxed);
    stats
        .num_waiting
        .store(s.num_waiting() as u64, Ordering::Release);
    stats
        .num_running
        .store(s.num_running() as u64, Ordering::Release);
    stats
        .num_preemptions
        .store(s.num_preemptions_total(), Ordering::Relaxed);
    let times = core.step_times();
    for ((phase, _), micros) in Phase::ALL.iter().zip(&stats.phase_micros) {
        micros.store(times.total(*phase).as_micros() as u64, Ordering::Relaxed);
    }
    stats
        .graph_steps
        .store(times.graph_steps(), Ordering::Relaxed);
    stats
        .graph_forward_micros
        .store(times.graph_forward().as_micros() as u64, Ordering::Relaxed);
    stats.steps.store(times.steps(), Ordering::Relaxed);
}
