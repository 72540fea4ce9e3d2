//! The draft model of speculative decoding (`{"model": ...}` in `--speculative-config`): a
//! smaller model of the target's vocabulary guesses each decoding sequence's next tokens,
//! greedily, one forward pass per token after catching up on the sequence's tokens it has not
//! seen yet. The target verifies the guesses in its next step (`super::verify`); a greedy,
//! deterministic guess keeps the target's output (and, seeded, its samples) exactly as without
//! speculation.
//!
//! The draft keeps its own paged KV cache: the same page table manager ([`KvCacheManager`],
//! block size as the target's, no prefix cache) with one [`BlockTable`] per sequence. Its K/V
//! stays valid for the tokens the target accepted; the rest is rolled back (blocks past them
//! given back) before the next guess. A prompt the target reads in chunks is read by the draft
//! as far as the target has, step by step. A sequence that leaves the running set (finished,
//! aborted, preempted) has its blocks freed; with no blocks left, a sequence goes without a
//! draft for that step.

use candle_core::{D, Device};

use crate::kv::{BlockTable, CachedPrefix, KvCacheManager};
use crate::model::{CausalLm, ForwardBatch, KvCache, ModelError};
use crate::scheduler::{ScheduledSeq, SchedulerOutput};
use crate::sequence::{SeqId, SeqMap, Sequence};

/// A draft model, its cache and the sequences' tables in it.
pub struct DraftRunner {
    model: Box<dyn CausalLm>,
    kv: KvCache,
    device: Device,
    blocks: KvCacheManager,
    seqs: SeqMap<DraftSeq>,
    settings: DraftSettings,
    /// Proposal rounds so far (marks which sequences are still running).
    round: u64,
    out: SchedulerOutput,
}

/// The limits a draft runs under.
#[derive(Clone, Copy, Debug)]
pub struct DraftSettings {
    /// The longest sequence the draft model takes (positions past it get no draft).
    pub max_model_len: usize,
    /// Most tokens one draft forward pass computes (catching up is chunked by it).
    pub max_num_batched_tokens: usize,
    /// The target's vocabulary size: a guess at or past it ends the draft.
    pub target_vocab: usize,
}

/// One sequence's state in the draft cache.
struct DraftSeq {
    table: BlockTable,
    /// The sequence's length when the draft last guessed: its K/V holds positions before it.
    base: usize,
    /// The guesses fed after `base` (their K/V written at `base..`): valid as far as the
    /// sequence's tokens still equal them.
    fed: Vec<u32>,
    /// The last round this sequence was running.
    seen: u64,
}

impl DraftSeq {
    /// Positions whose K/V equals what the draft would compute for `tokens` now.
    fn valid(&self, tokens: &[u32]) -> usize {
        let after = tokens.get(self.base..).unwrap_or(&[]);
        let agree = self
            .fed
            .iter()
            .zip(after)
            .take_while(|(a, b)| a == b)
            .count();
        (self.base + agree).min(tokens.len())
    }
}

/// A sequence being guessed for in this round.
struct Guess {
    /// Index into the round's sequences.
    index: usize,
    id: SeqId,
    /// Where its reading ends: the sequence's length when it is guessed for (its last token is
    /// the one the target computes next), else how far the target has read its prompt.
    len: usize,
    /// Next position to feed.
    next: usize,
    /// Guesses wanted (0: reading only).
    want: usize,
    draft: Vec<u32>,
}

impl DraftRunner {
    /// A runner of `model` over `kv` (its layout's block count and size) on `device`.
    pub fn new(
        model: Box<dyn CausalLm>,
        kv: KvCache,
        device: Device,
        num_blocks: usize,
        block_size: usize,
        settings: DraftSettings,
    ) -> Self {
        DraftRunner {
            model,
            kv,
            device,
            blocks: KvCacheManager::new(num_blocks, block_size, false),
            seqs: SeqMap::default(),
            settings,
            round: 0,
            out: SchedulerOutput::default(),
        }
    }

    /// Blocks free in the draft cache, and all of them (the null block excluded).
    pub fn block_usage(&self) -> (usize, usize) {
        (
            self.blocks.pool().num_free(),
            self.blocks.pool().num_usable(),
        )
    }

    /// Sets every sequence's draft for the next step: up to `limits[i]` greedy guesses for
    /// `seqs[i]` (0: none). `seqs` are all the running sequences: the others' blocks are freed.
    /// With `read_ahead`, prompts the target is reading in chunks are read along (speculation is
    /// on; off, the draft reads what it missed when it next guesses).
    pub fn propose(
        &mut self,
        seqs: &mut [Sequence],
        limits: &[usize],
        read_ahead: bool,
    ) -> Result<(), ModelError> {
        self.round += 1;
        let mut guesses = Vec::new();
        for (index, (seq, &limit)) in seqs.iter_mut().zip(limits).enumerate() {
            seq.set_spec_tokens(&[]);
            let entry = self.seqs.entry(seq.id).or_insert_with(|| DraftSeq {
                table: BlockTable::new(None),
                base: 0,
                fed: Vec::new(),
                seen: 0,
            });
            entry.seen = self.round;
            let max_len = self.settings.max_model_len;
            let len = seq.num_tokens();
            let want = limit.min((max_len + 1).saturating_sub(len));
            // A prompt the target is still reading in chunks: the draft reads as far as the
            // target has (so its catching up is spread over the same steps), guessing nothing.
            let (end, cover) = match want {
                0 if read_ahead && seq.num_pending_tokens() > 1 => {
                    let read = seq.num_computed_tokens().min(max_len);
                    (read, read)
                }
                0 => continue,
                _ => (len, len + want - 1),
            };
            // Roll back what the target did not accept, then cover every position fed.
            let valid = entry.valid(seq.token_ids());
            if want == 0 && end <= valid {
                continue;
            }
            self.blocks.truncate(&mut entry.table, valid);
            if self
                .blocks
                .allocate_slots(&mut entry.table, &CachedPrefix::default(), cover)
                .is_err()
            {
                continue;
            }
            entry.base = end;
            entry.fed.clear();
            guesses.push(Guess {
                index,
                id: seq.id,
                len: end,
                // (A guess needs the logits of the last token: fed again if already read.)
                next: if want > 0 { valid.min(end - 1) } else { valid },
                want,
                draft: Vec::with_capacity(want),
            });
        }
        let (round, blocks) = (self.round, &mut self.blocks);
        self.seqs.retain(|_, s| {
            if s.seen != round {
                blocks.free(&mut s.table);
            }
            s.seen == round
        });
        if guesses.is_empty() {
            return Ok(());
        }
        // Catch up (chunked), ending with each sequence's last token: the first guess.
        while guesses.iter().any(|g| g.next < g.len) {
            self.step(seqs, &mut guesses, true)?;
        }
        // Then one guess a pass.
        while guesses.iter().any(|g| g.draft.len() < g.want) {
            self.step(seqs, &mut guesses, false)?;
        }
        for g in &guesses {
            seqs[g.index].set_spec_tokens(&g.draft);
        }
        Ok(())
    }

    /// One forward pass: catching up (`catch_up`: each sequence's unseen tokens, as many as the
    /// budget takes) or one guess fed per sequence still guessing. Sequences whose pass ends on
    /// their last fed token take the argmax as their next guess.
    fn step(
        &mut self,
        seqs: &[Sequence],
        guesses: &mut [Guess],
        catch_up: bool,
    ) -> Result<(), ModelError> {
        let out = &mut self.out;
        out.clear();
        let mut budget = self.settings.max_num_batched_tokens;
        let mut sampling = Vec::new();
        for (gi, g) in guesses.iter_mut().enumerate() {
            let state = &self.seqs[&g.id];
            let tokens = seqs[g.index].token_ids();
            let (start, fed): (usize, Vec<u32>) = if catch_up {
                let n = (g.len - g.next).min(budget);
                (g.next, tokens[g.next..g.next + n].to_vec())
            } else if g.draft.len() < g.want && g.next + 1 == g.len + g.draft.len() {
                (g.next, vec![*g.draft.last().expect("a first guess")])
            } else {
                continue;
            };
            if fed.is_empty() {
                continue;
            }
            budget -= fed.len().min(budget);
            let t0 = out.token_ids.len();
            for (j, &t) in fed.iter().enumerate() {
                let pos = start + j;
                out.token_ids.push(t);
                out.positions.push(pos as u32);
                out.slot_mapping.push(self.blocks.slot(&state.table, pos));
            }
            let b0 = out.block_tables.len();
            out.block_tables
                .extend(state.table.blocks().iter().map(|b| b.0));
            g.next = start + fed.len();
            let samples = g.next >= g.len && g.want > 0;
            if samples {
                sampling.push(gi);
            }
            out.seqs.push(ScheduledSeq {
                seq_id: g.id,
                num_computed_tokens: start,
                num_new_tokens: fed.len(),
                num_draft_tokens: 0,
                tokens: t0..out.token_ids.len(),
                block_table: b0..out.block_tables.len(),
                samples,
                num_prompt_rows: 0,
            });
            if !catch_up {
                self.seqs
                    .get_mut(&g.id)
                    .expect("state made above")
                    .fed
                    .extend(&fed);
            }
        }
        if out.is_empty() {
            return Ok(());
        }
        if sampling.is_empty() {
            // Catching up on a chunk that reaches no sequence's end: the K/V alone.
            let batch = ForwardBatch::new(out, &self.device)?;
            self.model.forward(&batch, &mut self.kv)?;
            return Ok(());
        }
        let batch = ForwardBatch::new(out, &self.device)?;
        let logits = self.model.forward(&batch, &mut self.kv)?;
        let picked = logits.argmax(D::Minus1)?.to_vec1::<u32>()?;
        for (&gi, &t) in sampling.iter().zip(&picked) {
            let g = &mut guesses[gi];
            if t as usize >= self.settings.target_vocab {
                g.want = g.draft.len();
            } else {
                g.draft.push(t);
            }
        }
        Ok(())
    }
}
