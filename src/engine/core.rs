//! The engine step, without threads: load a model, accept sequences, and run
//! `schedule -> execute (with the last step's detokenize/stop during the forward pass) -> update`
//! one step at a time. The engine thread (server)
//! and [`crate::Llm`] (library) both drive this.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokenizers::Tokenizer;

use crate::chat::{ChatError, ChatTemplate};

use super::args::{EngineArgs, EngineError};
use super::detokenizer::IncrementalDetokenizer;
use super::loading::StartupTimes;
use super::propose::Speculator;
use super::stop::StopMatcher;
use super::text::{self as text_phase, TextJob, TextState};
use crate::guided::{Grammars, Guide};
use crate::model::ModelConfig;
use crate::request::{FinishReason, InvalidParam, SamplingParams};
use crate::runner::ModelRunner;
use crate::runner::eagle::TargetStep;
use crate::runner::step_times::{Phase, StepTimes};
use crate::sampler::Logprobs;
use crate::scheduler::{Scheduler, SchedulerConfig, SchedulerOutput, SeqUpdate};
use crate::sequence::{SeqId, SeqMap, Sequence};
use crate::spec::{SpecStats, Speculation};

/// What one step produced for one sequence.
#[derive(Clone, Debug, PartialEq)]
pub struct SeqEvent {
    /// Which sequence.
    pub seq_id: SeqId,
    /// The sampled token.
    pub token_id: u32,
    /// Text that became final with this token (may be empty).
    pub text: String,
    /// Logprobs, when requested.
    pub logprobs: Option<Logprobs>,
    /// Set on the sequence's last event.
    pub finish: Option<FinishReason>,
    /// The stop string that ended the sequence, if one did (vLLM's `stop_reason`).
    pub stopped_on: Option<String>,
    /// This sequence failed (its last event; finish is `Abort`). Other sequences go on.
    pub error: Option<String>,
    /// The prompt's logprobs (of its tokens `1..`), on the first event of the sequence that
    /// computed them (`SamplingParams::prompt_logprobs`).
    pub prompt_logprobs: Option<Vec<Logprobs>>,
}

/// A loaded model and everything mutable around it; single-threaded by design.
pub struct EngineCore {
    scheduler: Scheduler,
    runner: ModelRunner,
    tokenizer: Arc<Tokenizer>,
    config: ModelConfig,
    chat: Result<Arc<ChatTemplate>, ChatError>,
    eos_token_ids: Arc<[u32]>,
    grammars: Grammars,
    text: SeqMap<TextState>,
    /// The last step's tokens, whose text phase runs during the next step's forward pass.
    pending: Vec<TextJob>,
    /// Buffers reused from step to step (no per-step allocation in the steady state).
    out: SchedulerOutput,
    updates: Vec<SeqUpdate>,
    ids: Vec<u32>,
    next_seq_id: u64,
    queue_times: Vec<Duration>,
    step_times: StepTimes,
    /// Speculative decoding, when configured.
    speculator: Option<Speculator>,
    startup: StartupTimes,
    spec_stats: SpecStats,
    #[cfg(feature = "fault-injection")]
    faults: super::faults::ArmedFaults,
}

impl EngineCore {
    /// Loads the model and sizes the KV cache.
    pub fn new(args: &EngineArgs) -> Result<Self, EngineError> {
        let loaded = super::loading::load(args)?;
        if loaded.member.is_some() {
            return Err(EngineError::Parallel(
                "this process is a worker rank: run it with engine::worker::run".into(),
            ));
        }
        let cfg = loaded.config;
        let template_start = Instant::now();
        let chat = compile_chat_template(
            args.chat_template.as_deref(),
            loaded.chat_template,
            &loaded.tokenizer,
            &cfg,
        )
        .map(Arc::new);
        if let Err(e) = &chat {
            tracing::warn!("chat requests will fail: {e}");
        }
        let mut startup = loaded.startup;
        startup.chat_template = template_start.elapsed();
        startup.total += startup.chat_template;
        tracing::info!("{}", startup.summary());
        let scheduler = Scheduler::new(SchedulerConfig {
            max_num_seqs: args.max_num_seqs,
            max_num_batched_tokens: loaded.max_num_batched_tokens,
            max_model_len: loaded.max_model_len,
            block_size: args.block_size,
            num_blocks: loaded.num_blocks,
            enable_prefix_caching: args.enable_prefix_caching,
            window: loaded.window,
        });
        let speculator = loaded
            .speculation
            .map(|spec| Speculator::new(spec, loaded.draft, loaded.eagle));
        let runner = loaded.runner;
        let tokenizer = loaded.tokenizer;
        let grammars = loaded.grammars;
        Ok(EngineCore {
            scheduler,
            runner,
            grammars,
            tokenizer,
            eos_token_ids: Arc::from(cfg.eos_token_ids.clone()),
            config: cfg,
            chat,
            text: SeqMap::default(),
            pending: Vec::new(),
            out: SchedulerOutput::default(),
            updates: Vec::new(),
            ids: Vec::new(),
            next_seq_id: 0,
            queue_times: Vec::new(),
            step_times: StepTimes::default(),
            speculator,
            spec_stats: SpecStats::default(),
            startup,
            #[cfg(feature = "fault-injection")]
            faults: super::faults::ArmedFaults::new(args.faults.clone()),
        })
    }

    /// Rank 0's side of the tensor-parallel group, if the model is split.
    pub fn tp_leader(&self) -> Option<&crate::parallel::group::Leader> {
        self.runner.leader()
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tokenizer
    }

    /// The model's configuration.
    pub fn model_config(&self) -> &ModelConfig {
        &self.config
    }

    /// The model's chat template, or why there is none.
    pub fn chat_template(&self) -> Result<Arc<ChatTemplate>, ChatError> {
        self.chat.clone()
    }

    /// The device the model runs on.
    pub fn device(&self) -> &candle_core::Device {
        self.runner.device()
    }

    /// The scheduler (read-only: queue lengths, cache usage, counters).
    pub fn scheduler(&self) -> &Scheduler {
        &self.scheduler
    }

    /// Whether any sequence is unfinished.
    pub fn has_unfinished(&self) -> bool {
        self.scheduler.has_unfinished() || !self.pending.is_empty()
    }

    /// The compiler of this model's constraints (`structured_outputs`).
    pub fn grammars(&self) -> &Grammars {
        &self.grammars
    }

    /// Queues `params.n` sequences for `prompt` and returns their ids (choice `i` is `ids[i]`).
    /// All or nothing: on error none is queued. A constraint in `params.structured_outputs` is
    /// compiled here (see [`EngineCore::add_guided`] to compile it elsewhere first).
    pub fn add(
        &mut self,
        prompt: Vec<u32>,
        params: SamplingParams,
        cache_salt: Option<&str>,
    ) -> Result<Vec<SeqId>, EngineError> {
        self.add_guided(prompt, params, cache_salt, None)
    }

    /// [`EngineCore::add`] with the request's constraint already compiled into `guide` (from
    /// `params.structured_outputs`, by [`EngineCore::grammars`]): the server compiles off the
    /// engine thread. Each of the `n` sequences follows its own copy.
    pub fn add_guided(
        &mut self,
        prompt: Vec<u32>,
        params: SamplingParams,
        cache_salt: Option<&str>,
        guide: Option<Guide>,
    ) -> Result<Vec<SeqId>, EngineError> {
        params.validate(Some(self.config.vocab_size))?;
        let guide = match (guide, &params.structured_outputs) {
            (Some(guide), _) => Some(guide),
            (None, Some(constraint)) => Some(self.grammars.compile(constraint).map_err(
                |message| InvalidParam {
                    param: "structured_outputs",
                    message,
                },
            )?),
            (None, None) => None,
        };
        crate::request::check_num_seqs(params.n, self.scheduler.config().max_num_seqs)?;
        if let Some(&t) = prompt
            .iter()
            .find(|&&t| t as usize >= self.config.vocab_size)
        {
            return Err(InvalidParam {
                param: "prompt",
                message: format!(
                    "prompt token id {t} is out of vocabulary (the model has {} tokens).",
                    self.config.vocab_size
                ),
            }
            .into());
        }
        let params = Arc::new(params);
        let mut ids = Vec::with_capacity(params.n);
        for i in 0..params.n {
            let id = SeqId(self.next_seq_id);
            self.next_seq_id += 1;
            let mut seq = Sequence::new(
                id,
                prompt.clone(),
                params.clone(),
                self.eos_token_ids.clone(),
                cache_salt,
                i as u64,
            );
            if let Some(guide) = &guide {
                seq.set_guide(guide.clone());
            }
            if let Err(e) = self.scheduler.add(seq) {
                for &done in &ids {
                    self.abort(done);
                }
                return Err(e.into());
            }
            self.text.insert(
                id,
                TextState {
                    detokenizer: IncrementalDetokenizer::new(&prompt, params.skip_special_tokens),
                    stop: StopMatcher::new(params.stop.clone(), params.include_stop_str_in_output),
                    arrival: Instant::now(),
                    scheduled: false,
                    #[cfg(feature = "fault-injection")]
                    fail: self.faults.on_add(id, &prompt),
                },
            );
            ids.push(id);
        }
        Ok(ids)
    }

    /// Time each sequence scheduled since the last call spent waiting for its first step.
    pub fn take_queue_times(&mut self) -> Vec<Duration> {
        std::mem::take(&mut self.queue_times)
    }

    /// Whether `id` was accepted and has not been scheduled yet (it waits for its first step).
    pub fn is_queued(&self, id: SeqId) -> bool {
        self.text.get(&id).is_some_and(|t| !t.scheduled)
    }

    /// Cancels a sequence and frees its blocks.
    pub fn abort(&mut self, id: SeqId) -> bool {
        self.text.remove(&id);
        let pending = self.pending.len();
        self.pending.retain(|job| job.seq_id != id);
        // A sequence whose last token is still waiting for its text phase is already finished
        // in the scheduler.
        self.scheduler.abort(id) || self.pending.len() < pending
    }

    /// Where the steps since the last [`EngineCore::reset_step_times`] spent their time.
    pub fn step_times(&self) -> &StepTimes {
        &self.step_times
    }

    /// Where this engine's startup went.
    pub fn startup_times(&self) -> &StartupTimes {
        &self.startup
    }

    /// Speculative decoding's settings, when it is on.
    pub fn speculation(&self) -> Option<&Speculation> {
        self.speculator.as_ref().map(Speculator::speculation)
    }

    /// The draft model's (or EAGLE-3 head's) KV blocks: free, and all of them (`None` without
    /// either).
    pub fn draft_block_usage(&self) -> Option<(usize, usize)> {
        self.speculator.as_ref().and_then(Speculator::block_usage)
    }

    /// Draft and acceptance counts of speculative decoding since start.
    pub fn spec_stats(&self) -> &SpecStats {
        &self.spec_stats
    }

    /// Starts the step-time accounting afresh.
    pub fn reset_step_times(&mut self) {
        self.step_times = StepTimes::default();
    }

    /// Runs one step; returns the events [`EngineCore::step_with`] hands out.
    pub fn step(&mut self) -> Result<Vec<SeqEvent>, EngineError> {
        let mut events = Vec::new();
        self.step_with(&mut |e| events.push(e))?;
        Ok(events)
    }

    /// Runs one step. The tokens it samples get their text phase during the next step's forward
    /// pass (or the next call, when nothing more is scheduled), which hands `sink` one event per
    /// token as soon as its text is final: so each call delivers the previous step's events.
    pub fn step_with(&mut self, sink: &mut dyn FnMut(SeqEvent)) -> Result<(), EngineError> {
        let start = Instant::now();
        let mut out = std::mem::take(&mut self.out);
        self.scheduler.schedule_into(&mut out);
        for s in &out.seqs {
            if let Some(state) = self.text.get_mut(&s.seq_id).filter(|t| !t.scheduled) {
                state.scheduled = true;
                self.queue_times.push(state.arrival.elapsed());
            }
        }
        let start = self.step_times.lap(Phase::Schedule, start);
        #[cfg(feature = "fault-injection")]
        self.faults
            .on_step(out.seqs.iter().map(|s| s.seq_id))
            .map_err(|e| EngineError::from(candle_core::Error::msg(e)))?;
        let (tokenizer, pending, states) = (&self.tokenizer, &mut self.pending, &mut self.text);
        let mut ended = Vec::new();
        let mut text_phase = || {
            if !pending.is_empty() {
                ended = text_phase::finish_jobs(tokenizer, pending, states, sink);
            }
        };
        let executed = Instant::now();
        let sampled = self.runner.execute(
            &out,
            self.scheduler.scheduled_mut(&out),
            &mut self.step_times,
            &mut text_phase,
        );
        let sampled = sampled?;
        if let Some(s) = self.speculator.as_mut() {
            s.record_step(out.num_batched_tokens(), executed.elapsed().as_secs_f64());
        }
        let start = if out.is_empty() {
            self.step_times.lap(Phase::Text, start)
        } else {
            Instant::now()
        };
        self.ids.clear();
        self.ids.extend(sampled.tokens.iter().map(|s| s.token_id));
        self.scheduler
            .update_into(&out, &self.ids, &sampled.emitted, &mut self.updates);
        if !sampled.emitted.is_empty() {
            let verified = out.seqs.iter().filter(|s| s.samples);
            for (s, &n) in verified.zip(&sampled.emitted) {
                self.spec_stats.record(s.num_draft_tokens, n - 1);
                if let Some(spec) = self.speculator.as_mut() {
                    spec.record_verify(s.num_draft_tokens, n - 1);
                }
            }
        }
        // A stop string or a failure ended these in the last step's text phase; this step ran
        // them once more.
        for (id, reason) in ended {
            self.scheduler.finish(id, reason);
        }
        // Sequences without text state (aborted, or ended by a stop string) produce no event.
        let mut prompt_logprobs = sampled.prompt_logprobs;
        let mut tokens = sampled.tokens.into_iter();
        let mut emitted = sampled.emitted.iter();
        for u in self.updates.drain(..) {
            let count = emitted.next().copied().unwrap_or(1);
            // (Tokens past a finish were sampled but not appended.)
            let mut appended: Vec<_> = tokens
                .by_ref()
                .take(count)
                .map(|t| (t.token_id, t.logprobs))
                .collect();
            appended.truncate(u.num_accepted + 1);
            if let Some(state) = self.text.remove(&u.seq_id) {
                let mut job = TextJob::new(state, u.seq_id, appended, u.finish);
                job.error = u.error;
                if let Some(i) = prompt_logprobs.iter().position(|(id, _)| *id == u.seq_id) {
                    job.prompt_logprobs = Some(prompt_logprobs.swap_remove(i).1);
                }
                self.pending.push(job);
            }
        }
        let start = match out.is_empty() {
            true => start,
            false => self.step_times.lap(Phase::Update, start),
        };
        if let Some(speculator) = self.speculator.as_mut() {
            let hidden = self.runner.take_hidden_states();
            let target = hidden.map(|hidden| TargetStep {
                out: &out,
                emitted: &sampled.emitted,
                hidden,
            });
            speculator.propose(&mut self.scheduler, target)?;
            if !out.is_empty() {
                let phase = match speculator.has_model() {
                    true => Phase::Draft,
                    false => Phase::Update,
                };
                self.step_times.lap(phase, start);
            }
        }
        if !out.is_empty() {
            self.step_times.end_step();
        }
        self.out = out;
        Ok(())
    }
}

/// The template to use: `--chat-template` (a file, or the template itself), else the model's.
fn compile_chat_template(
    flag: Option<&str>,
    from_model: Option<String>,
    tokenizer: &Tokenizer,
    cfg: &ModelConfig,
) -> Result<ChatTemplate, ChatError> {
    let source = match flag {
        Some(f) if std::path::Path::new(f).is_file() => std::fs::read_to_string(f)
            .map_err(|e| ChatError(format!("--chat-template {f}: {e}")))?,
        Some(inline) => inline.to_string(),
        None => from_model.ok_or_else(|| {
            ChatError(
                "this model has no chat template; pass one with --chat-template, or use the \
                 completions API"
                    .to_string(),
            )
        })?,
    };
    let token = |id: Option<u32>| {
        id.and_then(|id| tokenizer.id_to_token(id))
            .unwrap_or_default()
    };
    ChatTemplate::new(
        &source,
        &token(cfg.bos_token_id),
        &token(cfg.eos_token_ids.first().copied()),
    )
}
