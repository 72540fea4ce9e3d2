//! The engine thread's loop: admit submissions, drop abandoned sequences, step, publish the
//! counters; and its supervision: a panic or a failed step is the engine's death (see
//! [`super::handle`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::{mpsc, watch};

use super::args::EngineError;
use super::core::EngineCore;
use super::handle::{EngineFailure, EngineStats, StreamEvent, Submission};
use super::snapshot::Publisher;
use crate::runner::step_times::Phase;
use crate::sequence::{SeqId, SeqMap};

/// Where a sequence's events go.
struct Route {
    events: mpsc::UnboundedSender<StreamEvent>,
    index: usize,
}

/// What the engine thread owns.
pub(super) struct EngineThread {
    core: EngineCore,
    rx: mpsc::UnboundedReceiver<Submission>,
    routes: SeqMap<Route>,
    stats: Arc<EngineStats>,
    queued: Arc<AtomicUsize>,
    publisher: Publisher,
    /// A clock for waiting on submissions with a deadline (an idle pool still to publish); made
    /// on first use.
    timer: Option<tokio::runtime::Runtime>,
}

/// The text of a panic's payload.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

impl EngineThread {
    /// The thread's state over a loaded engine.
    pub fn new(
        core: EngineCore,
        rx: mpsc::UnboundedReceiver<Submission>,
        stats: Arc<EngineStats>,
        queued: Arc<AtomicUsize>,
        publisher: Publisher,
    ) -> Self {
        EngineThread {
            core,
            rx,
            routes: SeqMap::default(),
            stats,
            queued,
            publisher,
            timer: None,
        }
    }

    /// Runs the loop; a panic or a failed step is the engine's death: every request in flight or
    /// queued fails, the death is announced, and new submissions are refused.
    pub fn run_supervised(&mut self, death: &watch::Sender<Option<Arc<str>>>) {
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.run()));
        let reason = match outcome {
            Ok(Ok(())) => return, // every handle is gone: a normal end
            Ok(Err(e)) => format!("The engine failed and stopped: {e}"),
            Err(payload) => format!(
                "The engine stopped after an internal error: {}",
                panic_message(payload.as_ref())
            ),
        };
        tracing::error!("{reason}; failing every request in flight");
        let _ = death.send(Some(Arc::from(reason.as_str())));
        let failure = EngineFailure {
            message: reason,
            engine_died: true,
        };
        self.rx.close();
        for (_, route) in self.routes.drain() {
            let _ = route.events.send(StreamEvent::Error(failure.clone()));
        }
        // Submissions still in the channel: dropping their `accepted` refuses them (EngineDead).
        // (The queued count is left as it is: submit checks for death before it counts.)
        while self.rx.try_recv().is_ok() {}
        self.stats.num_running.store(0, Ordering::Release);
        self.stats.num_waiting.store(0, Ordering::Release);
    }

    /// The loop: admit, drop abandoned sequences, step, publish. Returns when every handle is
    /// gone, or with the error of a failed step.
    fn run(&mut self) -> Result<(), EngineError> {
        loop {
            // Idle: sleep until a request arrives. Busy: take whatever is queued, without waiting.
            if !self.core.has_unfinished() {
                match self.wait_for_work() {
                    Some(s) => self.admit(s),
                    None => return Ok(()),
                }
            }
            while let Ok(s) = self.rx.try_recv() {
                self.admit(s);
            }
            // Clients that went away: free their sequences before computing for them.
            let gone: Vec<SeqId> = self
                .routes
                .iter()
                .filter(|(_, r)| r.events.is_closed())
                .map(|(&id, _)| id)
                .collect();
            for id in gone {
                self.abort(id);
                self.routes.remove(&id);
            }
            // Events go out as the step produces them (during the next forward pass, see
            // EngineCore::step_with), not when it returns; so are they counted (a client may read
            // the metrics as soon as its last event arrives).
            let (routes, stats) = (&mut self.routes, &self.stats);
            self.core.step_with(&mut |e| {
                stats.num_generated_tokens.fetch_add(1, Ordering::Relaxed);
                let Some(route) = routes.get(&e.seq_id) else {
                    return;
                };
                let event = match e.error {
                    Some(message) => StreamEvent::Error(EngineFailure {
                        message,
                        engine_died: false,
                    }),
                    None => StreamEvent::Token {
                        index: route.index,
                        token_id: e.token_id,
                        text: e.text,
                        logprobs: e.logprobs,
                        finish: e.finish,
                        stopped_on: e.stopped_on,
                        prompt_logprobs: e.prompt_logprobs,
                    },
                };
                let _ = route.events.send(event);
                if e.finish.is_some() {
                    routes.remove(&e.seq_id);
                }
            })?;
            self.publish();
            let idle = !self.core.has_unfinished();
            self.publisher
                .after_step(self.core.scheduler(), self.core.device(), idle);
        }
    }

    /// Sleeps until a submission arrives (`None`: every handle is gone). An idle pool the
    /// publisher holds back goes out when its wait ends first.
    fn wait_for_work(&mut self) -> Option<Submission> {
        if let Some(wait) = self.publisher.idle_wait() {
            let timer = match self.timer.take() {
                Some(timer) => Some(timer),
                None => tokio::runtime::Builder::new_current_thread()
                    .enable_time()
                    .build()
                    .ok(),
            };
            let received = timer.as_ref().and_then(|timer| {
                // The timer is made inside the runtime (it needs its clock).
                let rx = &mut self.rx;
                timer
                    .block_on(async { tokio::time::timeout(wait, rx.recv()).await })
                    .ok()
            });
            self.timer = timer;
            if let Some(submission) = received {
                return submission;
            }
            self.publisher
                .publish_now(self.core.scheduler(), self.core.device());
        }
        self.rx.blocking_recv()
    }

    /// Aborts `id`, leaving the queued count right.
    fn abort(&mut self, id: SeqId) {
        if self.core.is_queued(id) {
            self.queued.fetch_sub(1, Ordering::AcqRel);
        }
        self.core.abort(id);
    }

    fn admit(&mut self, s: Submission) {
        let (request, events, accepted) = match s {
            Submission::Add {
                request,
                events,
                accepted,
            } => (request, events, accepted),
            Submission::Snapshot => {
                self.publisher
                    .publish_now(self.core.scheduler(), self.core.device());
                return;
            }
            Submission::AbortAll(message) => {
                let failure = EngineFailure {
                    message,
                    engine_died: false,
                };
                let ids: Vec<SeqId> = self.routes.iter().map(|(&id, _)| id).collect();
                for id in ids {
                    self.abort(id);
                    if let Some(route) = self.routes.remove(&id) {
                        let _ = route.events.send(StreamEvent::Error(failure.clone()));
                    }
                }
                return;
            }
        };
        let n = request.params.n;
        match self.core.add_guided(
            request.prompt_token_ids,
            request.params,
            request.cache_salt.as_deref(),
            request.guide,
        ) {
            Ok(ids) => {
                for (index, id) in ids.into_iter().enumerate() {
                    let route = Route {
                        events: events.clone(),
                        index,
                    };
                    self.routes.insert(id, route);
                }
                let _ = accepted.send(Ok(()));
            }
            Err(e) => {
                self.queued.fetch_sub(n, Ordering::AcqRel);
                let _ = accepted.send(Err(e));
            }
        }
    }

    fn publish(&mut self) {
        let (core, stats) = (&mut self.core, &self.stats);
        let started = core.take_queue_times();
        self.queued.fetch_sub(started.len(), Ordering::AcqRel);
        for t in started {
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
        let window_usage = s.kv().window_pool().map_or(0.0, |p| p.usage());
        stats
            .kv_window_usage_ppm
            .store((window_usage * 1e6) as u64, Ordering::Relaxed);
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
        let k = core.speculation().map_or(0, |s| s.num_speculative_tokens);
        stats.spec.store(k, core.spec_stats());
    }
}
