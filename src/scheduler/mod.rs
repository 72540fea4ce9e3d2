//! The continuous-batching scheduler, with vLLM v1's one rule: each step, every sequence gets
//! `min(num_tokens - num_computed_tokens, remaining budget)` tokens, running sequences first (in
//! admission order), then waiting ones in FCFS order, under `max_num_batched_tokens` and
//! `max_num_seqs`. A full prefill, a prefill chunk, a prefix-cache hit and a decode are all that rule.
//!
//! When blocks run out, the most recently admitted running sequence is preempted by recompute: its
//! blocks are freed, its computed count reset, and it goes back to the front of the waiting queue.
//! The oldest running sequence is never preempted for a younger one, so nothing starves.
//!
//! The step protocol is `schedule` -> (model runs, sampler samples) -> `update`. Adds, aborts and
//! finishes happen between an `update` and the next `schedule`.

mod output;

pub use output::{ScheduledSeq, SchedulerOutput, SeqUpdate};

use std::collections::VecDeque;

use crate::kv::{CachedPrefix, KvCacheManager, WindowConfig};
use crate::request::FinishReason;
use crate::sequence::{SeqId, SeqStatus, Sequence};

/// Static scheduler settings (vLLM's flag names).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Most sequences running at once.
    pub max_num_seqs: usize,
    /// Most tokens computed in one step (the token budget).
    pub max_num_batched_tokens: usize,
    /// Longest sequence (prompt + output) the model accepts.
    pub max_model_len: usize,
    /// Token slots per KV block.
    pub block_size: usize,
    /// KV blocks in the cache, including the reserved null block.
    pub num_blocks: usize,
    /// Reuse the KV of identical prompt prefixes across requests.
    pub enable_prefix_caching: bool,
    /// The sliding-window layers' own blocks, released as they fall out of the window (models
    /// that interleave sliding-window and full layers, with a window shorter than the context).
    pub window: Option<WindowConfig>,
}

/// Why a sequence cannot be accepted. Worded for the API user.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    /// No prompt tokens.
    #[error("The prompt is empty: at least one token is needed.")]
    EmptyPrompt,
    /// Prompt plus requested output exceed the model's context length.
    #[error(
        "This model's maximum context length is {max_model_len} tokens. However, you requested \
         {} tokens ({num_prompt_tokens} in the messages, {max_tokens} in the completion). Please \
         reduce the length of the messages or completion.",
        num_prompt_tokens.saturating_add(*max_tokens)
    )]
    ContextOverflow {
        /// The model's context length.
        max_model_len: usize,
        /// Prompt tokens.
        num_prompt_tokens: usize,
        /// Requested output tokens.
        max_tokens: usize,
    },
    /// The request could never fit in the whole KV cache.
    #[error(
        "The request needs {num_tokens} tokens of KV cache but the whole cache holds only \
         {capacity_tokens}. Reduce the prompt or max_tokens, or start the server with more KV-cache memory."
    )]
    CacheTooSmall {
        /// Prompt + max_tokens.
        num_tokens: usize,
        /// Tokens the whole cache holds.
        capacity_tokens: usize,
    },
}

/// The scheduler: the waiting and running queues and the page table manager.
#[derive(Clone, Debug)]
pub struct Scheduler {
    config: SchedulerConfig,
    kv: KvCacheManager,
    waiting: VecDeque<Sequence>,
    running: Vec<Sequence>,
    num_preemptions_total: u64,
}

impl Scheduler {
    /// A scheduler over a fresh KV cache of `config.num_blocks` blocks.
    pub fn new(config: SchedulerConfig) -> Self {
        let kv = KvCacheManager::with_window(
            config.num_blocks,
            config.block_size,
            config.enable_prefix_caching,
            config.window,
        );
        Scheduler {
            config,
            kv,
            waiting: VecDeque::new(),
            running: Vec::new(),
            num_preemptions_total: 0,
        }
    }

    /// The settings.
    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    /// The page table manager (read-only).
    pub fn kv(&self) -> &KvCacheManager {
        &self.kv
    }

    /// Sequences admitted and holding blocks.
    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    /// Sequences queued (new or preempted).
    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Whether any sequence is unfinished.
    pub fn has_unfinished(&self) -> bool {
        !self.running.is_empty() || !self.waiting.is_empty()
    }

    /// Preemptions since start.
    pub fn num_preemptions_total(&self) -> u64 {
        self.num_preemptions_total
    }

    /// Running sequences in admission order (the order `schedule` walks them).
    pub fn running(&self) -> &[Sequence] {
        &self.running
    }

    /// Running sequences, to set their draft tokens ([`Sequence::set_spec_tokens`]) between an
    /// `update` and the next `schedule`.
    pub fn running_mut(&mut self) -> &mut [Sequence] {
        &mut self.running
    }

    /// Waiting sequences, front first.
    pub fn waiting(&self) -> impl Iterator<Item = &Sequence> {
        self.waiting.iter()
    }

    /// The sequences of a step just scheduled, in the order of `out.seqs` (for the sampler, which
    /// needs their tokens and random streams).
    pub fn scheduled_mut(&mut self, out: &SchedulerOutput) -> &mut [Sequence] {
        &mut self.running[..out.seqs.len()]
    }

    /// Queues a sequence, refusing one that could never be scheduled.
    pub fn add(&mut self, seq: Sequence) -> Result<(), ScheduleError> {
        let num_prompt_tokens = seq.num_prompt_tokens();
        if num_prompt_tokens == 0 {
            return Err(ScheduleError::EmptyPrompt);
        }
        let max_tokens = seq.params.max_tokens;
        // Saturating: a max_tokens near usize::MAX must not wrap past the checks.
        if num_prompt_tokens.saturating_add(max_tokens) > self.config.max_model_len {
            return Err(ScheduleError::ContextOverflow {
                max_model_len: self.config.max_model_len,
                num_prompt_tokens,
                max_tokens,
            });
        }
        let num_tokens = seq.num_tokens().saturating_add(max_tokens);
        if num_tokens > self.kv.capacity_tokens() {
            return Err(ScheduleError::CacheTooSmall {
                num_tokens,
                capacity_tokens: self.kv.capacity_tokens(),
            });
        }
        self.waiting.push_back(seq);
        Ok(())
    }

    /// Builds the next step.
    pub fn schedule(&mut self) -> SchedulerOutput {
        let mut out = SchedulerOutput::default();
        self.schedule_into(&mut out);
        out
    }

    /// Builds the next step into `out`, reusing its buffers.
    pub fn schedule_into(&mut self, out: &mut SchedulerOutput) {
        out.clear();
        let mut budget = self.config.max_num_batched_tokens;
        let none = CachedPrefix::default();

        // Running sequences first, oldest first; preempt from the newest end when blocks run out.
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let seq = &self.running[i];
            let pending = seq.num_pending_tokens();
            // Draft tokens ride on a decode step (one pending token), as far as the budget goes.
            let drafts = match pending {
                1 => seq.spec_tokens().len().min(budget - 1),
                _ => 0,
            };
            let n = (pending + drafts).min(budget);
            let target = self.running[i].num_computed_tokens() + n;
            loop {
                let seq = &mut self.running[i];
                if self
                    .kv
                    .allocate_slots(&mut seq.block_table, &none, target)
                    .is_ok()
                {
                    break;
                }
                let victim = self.running.pop().expect("running is not empty");
                out.preempted.push(victim.id);
                self.preempt(victim);
                if i == self.running.len() {
                    break; // the sequence preempted itself
                }
            }
            if i == self.running.len() {
                break;
            }
            self.push_scheduled(out, i, n, drafts);
            budget -= n;
            i += 1;
        }

        // Then waiting sequences, FCFS, unless this step had to preempt.
        while out.preempted.is_empty()
            && budget > 0
            && self.running.len() < self.config.max_num_seqs
        {
            let Some(seq) = self.waiting.front_mut() else {
                break;
            };
            let whole = seq.wants_prompt_logprobs();
            let (table, tokens) = seq.table_and_tokens();
            let num_tokens = tokens.len();
            let cached = match whole {
                // Prompt logprobs need every prompt row computed.
                true => Default::default(),
                false => self.kv.cached_prefix(table, tokens),
            };
            let n = (num_tokens - cached.num_tokens).min(budget);
            if self
                .kv
                .allocate_slots(table, &cached, cached.num_tokens + n)
                .is_err()
            {
                break; // head of line waits for blocks; FCFS keeps order
            }
            let mut seq = self.waiting.pop_front().expect("front exists");
            self.kv
                .record_prefix_lookup(seq.num_tokens(), cached.num_tokens);
            if seq.num_preemptions == 0 {
                seq.num_cached_tokens = cached.num_tokens;
            }
            seq.set_num_computed_tokens(cached.num_tokens);
            seq.status = SeqStatus::Running;
            self.running.push(seq);
            self.push_scheduled(out, self.running.len() - 1, n, 0);
            budget -= n;
        }
    }

    /// Adds `n` tokens of running sequence `index` to `out`, its last `drafts` its draft tokens.
    fn push_scheduled(&mut self, out: &mut SchedulerOutput, index: usize, n: usize, drafts: usize) {
        let seq = &self.running[index];
        let start = seq.num_computed_tokens();
        let tokens = out.token_ids.len()..out.token_ids.len() + n;
        out.token_ids
            .extend_from_slice(&seq.token_ids()[start..start + n - drafts]);
        out.token_ids
            .extend_from_slice(&seq.spec_tokens()[..drafts]);
        out.positions.extend((start..start + n).map(|p| p as u32));
        out.slot_mapping
            .extend((start..start + n).map(|p| self.kv.slot(&seq.block_table, p)));
        let table_start = out.block_tables.len();
        out.block_tables
            .extend(seq.block_table.blocks().iter().map(|b| b.0));
        if self.kv.window().is_some() {
            let table = &seq.block_table;
            out.window_slot_mapping
                .extend((start..start + n).map(|p| self.kv.window_slot(table, p)));
            out.window_block_tables
                .extend(table.window_blocks().iter().map(|b| b.0));
        }
        out.seqs.push(ScheduledSeq {
            seq_id: seq.id,
            num_computed_tokens: start,
            num_new_tokens: n,
            num_draft_tokens: drafts,
            tokens,
            block_table: table_start..out.block_tables.len(),
            samples: start + n - drafts == seq.num_tokens(),
            num_prompt_rows: seq.prompt_logprob_rows(start, n - drafts).0,
        });
    }

    fn preempt(&mut self, mut seq: Sequence) {
        self.kv.free(&mut seq.block_table);
        seq.set_spec_tokens(&[]);
        seq.set_num_computed_tokens(0);
        seq.status = SeqStatus::Waiting;
        seq.num_preemptions += 1;
        self.num_preemptions_total += 1;
        self.waiting.push_front(seq);
    }

    /// Applies a computed step: advances computed counts, commits full blocks to the prefix cache,
    /// appends `sampled` (one token per sampling sequence, in `out.seqs` order) and retires finished
    /// sequences, freeing their blocks.
    pub fn update(&mut self, out: &SchedulerOutput, sampled: &[u32]) -> Vec<SeqUpdate> {
        let mut updates = Vec::with_capacity(sampled.len());
        self.update_into(out, sampled, &[], &mut updates);
        updates
    }

    /// [`Self::update`] into a reused buffer, for steps that verify draft tokens too: `sampled`
    /// holds each sampling sequence's tokens back to back, `emitted[i]` of them for the `i`-th
    /// (the drafts the target accepted, then one token of its own); an empty `emitted` means one
    /// each. Accepted drafts keep their KV; the blocks that only rejected drafts' KV reached are
    /// freed, so a rejected token never reaches the prefix cache.
    pub fn update_into(
        &mut self,
        out: &SchedulerOutput,
        sampled: &[u32],
        emitted: &[usize],
        updates: &mut Vec<SeqUpdate>,
    ) {
        let num_sampling = out.num_sampling();
        assert!(emitted.is_empty() || emitted.len() == num_sampling);
        let total = match emitted.is_empty() {
            true => num_sampling,
            false => emitted.iter().sum(),
        };
        assert_eq!(
            sampled.len(),
            total,
            "the tokens of every sampling sequence"
        );
        updates.clear();
        let max_model_len = self.config.max_model_len;
        let (mut next, mut sampling) = (0, 0);
        let mut any_finished = false;
        for (seq, s) in self.running.iter_mut().zip(&out.seqs) {
            assert_eq!(seq.id, s.seq_id, "update must follow its own schedule");
            let mut computed = s.num_computed_tokens + s.num_new_tokens - s.num_draft_tokens;
            let mut last = None;
            if s.samples {
                let count = emitted.get(sampling).copied().unwrap_or(1);
                assert!((1..=1 + s.num_draft_tokens).contains(&count));
                sampling += 1;
                let tokens = &sampled[next..next + count];
                next += count;
                let mut finish = None;
                let mut appended = 0;
                for &token in tokens {
                    appended += 1;
                    finish = seq.append(token, max_model_len);
                    if finish.is_some() {
                        break;
                    }
                }
                // The accepted drafts' KV is written (those before the target's own token).
                computed += appended - 1;
                last = Some((tokens[appended - 1], appended - 1, finish));
            }
            seq.set_num_computed_tokens(computed);
            seq.set_spec_tokens(&[]);
            let (table, tokens) = seq.table_and_tokens();
            self.kv.commit_full_blocks(table, tokens, computed);
            self.kv.release_out_of_window(table, computed);
            if s.num_draft_tokens > 0 {
                let num_tokens = seq.num_tokens();
                self.kv.truncate(&mut seq.block_table, num_tokens);
            }
            let Some((token_id, num_accepted, finish)) = last else {
                continue;
            };
            let mut error = None;
            if let Some(reason) = finish {
                seq.status = SeqStatus::Finished(reason);
                any_finished = true;
                error = seq.guide_error().map(str::to_owned);
            }
            updates.push(SeqUpdate {
                seq_id: seq.id,
                token_id,
                num_accepted,
                finish,
                error,
            });
        }
        if any_finished {
            for mut seq in self.running.extract_if(.., |s| s.is_finished()) {
                self.kv.free(&mut seq.block_table);
            }
        }
    }

    /// Ends a sequence early (a stop string matched, or the client went away), freeing its blocks at
    /// once. Returns whether it was found.
    pub fn finish(&mut self, id: SeqId, reason: FinishReason) -> bool {
        let seq = if let Some(i) = self.running.iter().position(|s| s.id == id) {
            self.running.remove(i)
        } else if let Some(i) = self.waiting.iter().position(|s| s.id == id) {
            self.waiting.remove(i).expect("index from position")
        } else {
            return false;
        };
        let mut seq = seq;
        seq.status = SeqStatus::Finished(reason);
        self.kv.free(&mut seq.block_table);
        true
    }

    /// Cancels a sequence: [`Self::finish`] with [`FinishReason::Abort`].
    pub fn abort(&mut self, id: SeqId) -> bool {
        self.finish(id, FinishReason::Abort)
    }
}

#[cfg(test)]
mod tests;
