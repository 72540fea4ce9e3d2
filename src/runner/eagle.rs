//! The EAGLE-3 head of speculative decoding (`"method": "eagle3"`): after each target step, the
//! head reads the target's hidden states of the positions the step computed for good and
//! guesses each decoding sequence's next tokens, greedily, one head pass per guess
//! ([`crate::model::eagle3`] says what a pass computes).
//!
//! The head keeps its own paged KV cache (one layer; the same page table manager, no prefix
//! cache), one [`BlockTable`] per sequence. A sequence's head cache holds the positions the head
//! has read from the target's hidden states (exact), then those of its last guesses (from its own
//! hidden states), which the next round overwrites. Its first entry is the first position the
//! head saw, which is not 0 after a prefix-cache hit (the target did not compute those
//! positions); positions stay absolute for the rotary embedding. A sequence whose positions
//! come back out of order (preempted and recomputed) starts again from there; one that leaves
//! the running set has its blocks freed; with no blocks left, a sequence goes without a draft
//! and starts again in a later step.

use candle_core::{Device, Tensor};

use crate::kv::{BlockTable, CachedPrefix, KvCacheManager};
use crate::model::eagle3::Eagle3Head;
use crate::model::{ForwardBatch, KvCache, ModelError};
use crate::scheduler::{ScheduledSeq, SchedulerOutput};
use crate::sequence::{SeqId, SeqMap, Sequence};

/// An EAGLE-3 head, its cache and the sequences' tables in it.
pub struct EagleRunner {
    head: Eagle3Head,
    kv: KvCache,
    device: Device,
    blocks: KvCacheManager,
    seqs: SeqMap<HeadSeq>,
    /// Proposal rounds so far (marks which sequences are still running).
    round: u64,
    out: SchedulerOutput,
}

/// One sequence's state in the head cache.
struct HeadSeq {
    table: BlockTable,
    /// Position of the cache's first entry.
    origin: usize,
    /// Entries computed from the target's hidden states (positions `origin..origin + exact`).
    exact: usize,
    /// The last round this sequence was running.
    seen: u64,
}

/// A target step as the head reads it: the plan, how many tokens each sampling sequence
/// emitted (empty without drafts), and the kept hidden states (one row per token of the plan).
pub struct TargetStep<'a> {
    /// The step's plan.
    pub out: &'a SchedulerOutput,
    /// [`super::Sampled::emitted`].
    pub emitted: &'a [usize],
    /// [`super::ModelRunner::take_hidden_states`].
    pub hidden: Tensor,
}

/// A sequence read (and guessed for) in this round.
struct Feed {
    index: usize,
    id: SeqId,
    /// First position read from the target's hidden states, and how many.
    start: usize,
    rows: std::ops::Range<usize>,
    origin: usize,
    /// Guesses wanted.
    want: usize,
    drafts: Vec<u32>,
    /// Row of its last guess's hidden state in the last pass's output.
    out_row: usize,
}

impl EagleRunner {
    /// A runner of `head` over `kv` (its layout's block count and size) on `device`.
    pub fn new(
        head: Eagle3Head,
        kv: KvCache,
        device: Device,
        num_blocks: usize,
        block_size: usize,
    ) -> Self {
        EagleRunner {
            head,
            kv,
            device,
            blocks: KvCacheManager::new(num_blocks, block_size, false),
            seqs: SeqMap::default(),
            round: 0,
            out: SchedulerOutput::default(),
        }
    }

    /// Blocks free in the head cache, and all of them (the null block excluded).
    pub fn block_usage(&self) -> (usize, usize) {
        (
            self.blocks.pool().num_free(),
            self.blocks.pool().num_usable(),
        )
    }

    /// Reads `step` (none when nothing ran) and sets every running sequence's draft for the next
    /// step: up to `limits[i]` guesses for `seqs[i]`. The others' blocks are freed.
    pub fn propose(
        &mut self,
        seqs: &mut [Sequence],
        limits: &[usize],
        step: Option<TargetStep<'_>>,
    ) -> Result<(), ModelError> {
        self.round += 1;
        let mut computed = SeqMap::default();
        if let Some(step) = &step {
            let mut emitted = step.emitted.iter();
            for s in &step.out.seqs {
                // A verify step keeps the rows of the pending token and the accepted drafts.
                let emitted = if s.samples { emitted.next() } else { None };
                let n = match emitted {
                    Some(&n) if s.num_draft_tokens > 0 => n.min(s.num_new_tokens),
                    _ => s.num_new_tokens,
                };
                computed.insert(s.seq_id, (s.num_computed_tokens, s.tokens.start, n));
            }
        }
        let mut feeds = Vec::new();
        for (index, (seq, &limit)) in seqs.iter_mut().zip(limits).enumerate() {
            seq.set_spec_tokens(&[]);
            let Some(&(start, row, n)) = computed.get(&seq.id) else {
                if let Some(s) = self.seqs.get_mut(&seq.id) {
                    s.seen = self.round;
                }
                continue;
            };
            let round = self.round;
            let entry = self.seqs.entry(seq.id).or_insert_with(|| HeadSeq {
                table: BlockTable::new(None),
                origin: start,
                exact: 0,
                seen: round,
            });
            entry.seen = round;
            if start < entry.origin || start > entry.origin + entry.exact {
                self.blocks.free(&mut entry.table);
                entry.origin = start;
            }
            entry.exact = start - entry.origin;
            self.blocks.truncate(&mut entry.table, entry.exact);
            // Position p reads token p + 1: the last one read is the sequence's last token's.
            let n = n.min(seq.num_tokens().saturating_sub(start + 1));
            let want = match start + n + 1 == seq.num_tokens() {
                true => limit,
                false => 0,
            };
            let cover = entry.exact + n + want.saturating_sub(1);
            if n == 0
                || self
                    .blocks
                    .allocate_slots(&mut entry.table, &CachedPrefix::default(), cover)
                    .is_err()
            {
                // (Out of blocks: it starts again, from its next computed positions.)
                self.blocks.free(&mut entry.table);
                entry.exact = 0;
                entry.origin = usize::MAX;
                continue;
            }
            entry.exact += n;
            feeds.push(Feed {
                index,
                id: seq.id,
                start,
                rows: row..row + n,
                origin: entry.origin,
                want,
                drafts: Vec::with_capacity(want),
                out_row: 0,
            });
        }
        let (round, blocks) = (self.round, &mut self.blocks);
        self.seqs.retain(|_, s| {
            if s.seen != round {
                blocks.free(&mut s.table);
            }
            s.seen == round
        });
        let Some(step) = step.filter(|_| !feeds.is_empty()) else {
            return Ok(());
        };
        // The first pass: every fed sequence's positions, with the target's hidden states.
        let parts = feeds
            .iter()
            .map(|f| step.hidden.narrow(0, f.rows.start, f.rows.len()))
            .collect::<candle_core::Result<Vec<_>>>()?;
        let mut hidden = Tensor::cat(&parts, 0)?;
        let mut first = true;
        loop {
            self.out.clear();
            let (mut rows, mut sampled) = (Vec::new(), Vec::new());
            for (fi, f) in feeds.iter().enumerate() {
                let (pos, tokens): (usize, Vec<u32>) = if first {
                    let t = seqs[f.index].token_ids();
                    (f.start, t[f.start + 1..f.start + 1 + f.rows.len()].to_vec())
                } else if f.drafts.len() < f.want {
                    rows.push(f.out_row as u32);
                    let pos = f.start + f.rows.len() + f.drafts.len() - 1;
                    (pos, vec![*f.drafts.last().expect("a first guess")])
                } else {
                    continue;
                };
                if f.drafts.len() < f.want {
                    sampled.push(fi);
                }
                self.push(f, pos, &tokens);
            }
            if self.out.is_empty() {
                break;
            }
            if !first {
                let index = Tensor::new(rows.as_slice(), hidden.device())?;
                hidden = hidden.index_select(&index, 0)?;
            }
            let batch = ForwardBatch::new(&self.out, &self.device)?;
            let head = self.head.forward(&batch, &mut self.kv, &hidden)?;
            for (row, (&fi, &t)) in sampled.iter().zip(&head.tokens).enumerate() {
                feeds[fi].drafts.push(t);
                feeds[fi].out_row = row;
            }
            hidden = head.hidden;
            first = false;
        }
        for f in &feeds {
            seqs[f.index].set_spec_tokens(&f.drafts);
        }
        Ok(())
    }

    /// Adds feed `f`'s `tokens` at positions from `pos` to the pass being built.
    fn push(&mut self, f: &Feed, pos: usize, tokens: &[u32]) {
        let out = &mut self.out;
        let table = &self.seqs[&f.id].table;
        let t0 = out.token_ids.len();
        for (j, &t) in tokens.iter().enumerate() {
            out.token_ids.push(t);
            out.positions.push((pos + j) as u32);
            out.slot_mapping
                .push(self.blocks.slot(table, pos + j - f.origin));
        }
        let b0 = out.block_tables.len();
        out.block_tables.extend(table.blocks().iter().map(|b| b.0));
        out.seqs.push(ScheduledSeq {
            seq_id: f.id,
            num_computed_tokens: pos - f.origin,
            num_new_tokens: tokens.len(),
            num_draft_tokens: 0,
            tokens: t0..out.token_ids.len(),
            block_table: b0..out.block_tables.len(),
            samples: f.drafts.len() < f.want,
            num_prompt_rows: 0,
        });
    }
}
