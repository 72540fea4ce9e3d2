//! The engine thread and its handle: one OS thread owns the [`EngineCore`] (no locks around it);
//! async callers submit requests over a channel and read each request's events from a channel of
//! their own. Dropping a request's receiver aborts its sequences on the next step.
//!
//! Admission reads a live count: the sequences accepted and not yet scheduled, raised by
//! [`EngineHandle::submit`] before the request is sent and lowered by the engine thread as each
//! sequence takes its first step (or is aborted or refused first).
//!
//! The engine thread's death is an event: a panic or a failed step (a device fault) fails every
//! request in flight or queued with an [`EngineFailure`] marked `engine_died`, refuses new
//! submissions, and resolves [`EngineHandle::died`], so a server turns `/health` to 503 and exits.
//! A failure that belongs to one sequence (its text phase) ends only that sequence's request.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use tokio::sync::{mpsc, oneshot, watch};

use super::args::{EngineArgs, EngineError};
use super::core::EngineCore;
use super::engine_thread::EngineThread;
use super::snapshot::{PoolWatch, Publisher};
use crate::chat::ChatTemplate;
use crate::metrics::Histogram;
use crate::request::{FinishReason, SamplingParams};
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
    /// `params.structured_outputs` compiled ([`ModelInfo::grammars`]); compiled by the engine
    /// when absent.
    pub guide: Option<crate::guided::Guide>,
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
        /// The stop string that ended the completion, if one did.
        stopped_on: Option<String>,
        /// The prompt's logprobs (of its tokens `1..`), on each completion's first token when
        /// `SamplingParams::prompt_logprobs` asked for them.
        prompt_logprobs: Option<Vec<Logprobs>>,
    },
    /// The request failed; no more events follow.
    Error(EngineFailure),
}

/// Why a request failed inside the engine.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct EngineFailure {
    /// What happened, worded for the API user.
    pub message: String,
    /// The engine itself stopped (every request fails; the server should be restarted), as
    /// opposed to a failure of this request alone.
    pub engine_died: bool,
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
    /// The window group's usage in millionths (0 without one).
    pub kv_window_usage_ppm: AtomicU64,
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
    /// Engine-thread time per step phase, in microseconds ([`Phase::ALL`](crate::runner::step_times::Phase::ALL) order).
    pub phase_micros: [AtomicU64; crate::runner::step_times::Phase::COUNT],
    /// The forward phase of graph-replay steps, in microseconds.
    pub graph_forward_micros: AtomicU64,
    /// Speculative decoding's counters.
    pub spec: SpecCounters,
}

/// Speculative decoding's counters (vLLM's `spec_decode_*`), published after every step.
#[derive(Debug, Default)]
pub struct SpecCounters {
    /// Draft tokens a step may verify per sequence (0: speculation is off).
    pub num_speculative_tokens: AtomicU64,
    /// Sequence-steps that verified drafts.
    pub num_drafts: AtomicU64,
    /// Draft tokens verified.
    pub num_draft_tokens: AtomicU64,
    /// Draft tokens accepted.
    pub num_accepted_tokens: AtomicU64,
    /// Accepted draft tokens by position in the draft.
    pub accepted_per_pos: [AtomicU64; crate::spec::MAX_SPECULATIVE_TOKENS],
}

impl SpecCounters {
    /// Publishes `stats` (with `k` drafts per step at most).
    pub fn store(&self, k: usize, stats: &crate::spec::SpecStats) {
        use std::sync::atomic::Ordering::Relaxed;
        self.num_speculative_tokens.store(k as u64, Relaxed);
        self.num_drafts.store(stats.num_drafts, Relaxed);
        self.num_draft_tokens.store(stats.num_draft_tokens, Relaxed);
        self.num_accepted_tokens
            .store(stats.num_accepted_tokens, Relaxed);
        for (a, &n) in self.accepted_per_pos.iter().zip(&stats.accepted_per_pos) {
            a.store(n, Relaxed);
        }
    }
}

/// Why a submission was refused before it reached the engine.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    /// Too many sequences wait already: try again later (HTTP 429).
    #[error("the engine's request queue is full")]
    QueueFull,
    /// The engine thread has stopped.
    #[error("the engine is not running")]
    EngineDead,
    /// The engine refused the request.
    #[error(transparent)]
    Rejected(#[from] EngineError),
}

pub(super) enum Submission {
    Add {
        request: Box<GenerateRequest>,
        events: mpsc::UnboundedSender<StreamEvent>,
        accepted: oneshot::Sender<Result<(), EngineError>>,
    },
    /// End every request now with an error event (shutdown timeout).
    AbortAll(String),
    /// Publish the page table now, even while idle (a viewer just opened the live view).
    Snapshot,
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
    /// Most sequences the engine runs at once (`--max-num-seqs`): the most one request may ask.
    pub max_num_seqs: usize,
    /// Compiles requests' constraints against the model's vocabulary.
    pub grammars: crate::guided::Grammars,
}

/// A cheap-to-clone handle to the engine thread.
#[derive(Clone)]
pub struct EngineHandle {
    tx: mpsc::UnboundedSender<Submission>,
    /// `Some(reason)` once the engine thread has died.
    death: watch::Receiver<Option<Arc<str>>>,
    stats: Arc<EngineStats>,
    /// Sequences accepted and not yet scheduled (live, not published).
    queued: Arc<AtomicUsize>,
    max_queued: usize,
    /// Closed when the engine thread has ended (its engine, and any tensor-parallel group it
    /// leads, dropped).
    exited: watch::Receiver<()>,
    /// The page table's snapshots: the prototype receiver, behind an `Arc` so that cloning the
    /// handle does not count as a viewer.
    pool: Arc<PoolWatch>,
}

/// Waits for the engine thread to end, without keeping it alive (see [`EngineHandle::exit`]).
pub struct EngineExit(watch::Receiver<()>);

impl EngineExit {
    /// Blocks until the engine thread has ended (every [`EngineHandle`] dropped, or its death),
    /// at most `limit`; returns whether it ended.
    pub fn wait(&self, limit: std::time::Duration) -> bool {
        let deadline = std::time::Instant::now() + limit;
        while self.0.has_changed().is_ok() {
            if std::time::Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        true
    }
}

impl EngineHandle {
    /// Loads the model on a new engine thread; returns once it is ready (or failed to load).
    /// `max_queued_seqs` bounds the sequences accepted and not yet scheduled (0: no limit).
    pub fn spawn(
        args: EngineArgs,
        max_queued_seqs: usize,
    ) -> Result<(Self, ModelInfo), EngineError> {
        let (tx, rx) = mpsc::unbounded_channel();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (death_tx, death) = watch::channel(None);
        let (exited_tx, exited) = watch::channel(());
        let stats = Arc::new(EngineStats::default());
        let queued = Arc::new(AtomicUsize::new(0));
        let (stats2, queued2) = (stats.clone(), queued.clone());
        let (publisher, pool) = Publisher::new();
        std::thread::Builder::new()
            .name("pagewise-engine".into())
            .spawn(move || {
                let core = match EngineCore::new(&args) {
                    Ok(core) => core,
                    Err(e) => {
                        let _ = death_tx.send(Some(Arc::from(e.to_string())));
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
                    max_num_seqs: core.scheduler().config().max_num_seqs,
                    grammars: core.grammars().clone(),
                };
                if let Some(leader) = core.tp_leader() {
                    // A lost rank is the engine's death even while this thread waits on a
                    // collective that will never finish.
                    let death = death_tx.clone();
                    leader.watch(move |reason| {
                        tracing::error!("{reason}");
                        let _ = death.send(Some(Arc::from(reason.as_str())));
                    });
                }
                let _ = ready_tx.send(Ok(info));
                EngineThread::new(core, rx, stats2, queued2, publisher).run_supervised(&death_tx);
                drop(exited_tx);
            })
            .map_err(|e| EngineError::Config(format!("cannot start the engine thread: {e}")))?;
        let info = ready_rx
            .recv()
            .map_err(|_| EngineError::Config("the engine thread died while loading".into()))??;
        let handle = EngineHandle {
            tx,
            death,
            stats,
            queued,
            max_queued: max_queued_seqs,
            exited,
            pool: Arc::new(pool),
        };
        Ok((handle, info))
    }

    /// A way to wait for the engine thread to end that does not itself keep it running: a
    /// server drops its handles and then waits, so the engine is torn down (a tensor-parallel
    /// group told to stop) before the process exits.
    pub fn exit(&self) -> EngineExit {
        EngineExit(self.exited.clone())
    }

    /// Whether the engine thread is running.
    pub fn is_alive(&self) -> bool {
        self.death.borrow().is_none()
    }

    /// Why the engine thread died, once it has.
    pub fn death_reason(&self) -> Option<Arc<str>> {
        self.death.borrow().clone()
    }

    /// Resolves with the reason when the engine thread dies (never, while it runs).
    pub async fn died(&self) -> Arc<str> {
        let mut death = self.death.clone();
        let reason = death
            .wait_for(Option::is_some)
            .await
            .ok()
            .and_then(|r| r.clone());
        match reason {
            Some(reason) => reason,
            // The engine thread ended without dying: every other handle is gone.
            None => std::future::pending().await,
        }
    }

    /// A view of the page table's snapshots (`/dashboard`). While any such view is alive, the
    /// engine publishes one after a step at most every `snapshot::PERIOD`; this call also asks
    /// for one now, so an idle engine shows its pool at once.
    pub fn watch_pool(&self) -> PoolWatch {
        let view = (*self.pool).clone();
        let _ = self.tx.send(Submission::Snapshot);
        view
    }

    /// The published counters.
    pub fn stats(&self) -> &EngineStats {
        &self.stats
    }

    /// Sequences accepted and not yet scheduled, counted live (what admission compares with the
    /// queue limit).
    pub fn num_queued(&self) -> usize {
        self.queued.load(Ordering::Acquire)
    }

    /// Ends every request in flight with an error event (used when the shutdown timeout expires).
    pub async fn abort_all(&self, message: &str) {
        let _ = self.tx.send(Submission::AbortAll(message.to_string()));
    }

    /// Submits a request; the returned receiver yields its events. Never waits for queue room:
    /// when the queue limit would be passed, refuses at once with [`SubmitError::QueueFull`].
    pub async fn submit(
        &self,
        request: GenerateRequest,
    ) -> Result<mpsc::UnboundedReceiver<StreamEvent>, SubmitError> {
        if !self.is_alive() {
            return Err(SubmitError::EngineDead);
        }
        let n = request.params.n;
        let before = self.queued.fetch_add(n, Ordering::AcqRel);
        if self.max_queued > 0 && before.saturating_add(n) > self.max_queued {
            self.queued.fetch_sub(n, Ordering::AcqRel);
            return Err(SubmitError::QueueFull);
        }
        let (events, rx) = mpsc::unbounded_channel();
        let (accepted, accepted_rx) = oneshot::channel();
        let sent = self.tx.send(Submission::Add {
            request: Box::new(request),
            events,
            accepted,
        });
        if sent.is_err() {
            self.queued.fetch_sub(n, Ordering::AcqRel);
            return Err(SubmitError::EngineDead);
        }
        accepted_rx.await.map_err(|_| SubmitError::EngineDead)??;
        Ok(rx)
    }
}
