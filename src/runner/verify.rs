//! Sampling a step that verifies draft tokens (speculative decoding).
//!
//! A sequence with `k` drafts has `k + 1` sampled rows: row `i` holds the target model's logits
//! after the pending token and drafts `0..i`. Its rows are sampled in order, each exactly as a
//! plain decode step would sample that position (the same processing, penalties and `min_tokens`
//! counting the drafts accepted before it, a constraint's mask in the state the accepted drafts
//! lead to, the same draw from the sequence's own stream), and
//! the walk stops at the first sampled token that differs from its draft. Every draft is one
//! token for certain (n-gram lookup, or a draft model's argmax), and for such a proposal this is
//! the rejection rule of
//! speculative sampling: the draft `d` is accepted with probability `p(d)`, and on rejection
//! the token comes from `p` without `d`, renormalized. So the output follows the target's
//! distribution, greedy output is the target's own, and with a seed it is the same token for
//! token as without speculation.

use crate::sampler::{SampledToken, Sampler};
use crate::scheduler::SchedulerOutput;
use crate::sequence::Sequence;

/// Samples the rows of a step in which some sequences verify drafts (`logits`: one row of
/// `vocab` per sampled row, in `out.seqs` order). Returns each sampling sequence's tokens back
/// to back, and how many each emitted (its accepted drafts, then one of the target's own).
pub(super) fn sample_verify(
    sampler: &mut Sampler,
    logits: &mut [f32],
    vocab: usize,
    out: &SchedulerOutput,
    seqs: &mut [Sequence],
) -> (Vec<SampledToken>, Vec<usize>) {
    let mut tokens = Vec::with_capacity(out.num_sample_rows());
    let mut emitted = Vec::with_capacity(out.num_sampling());
    let mut outputs = Vec::new();
    let mut rest = logits;
    for (s, seq) in out.seqs.iter().zip(seqs.iter_mut()) {
        if !s.samples {
            continue;
        }
        let k = s.num_draft_tokens;
        let (mine, later) = std::mem::take(&mut rest).split_at_mut((k + 1) * vocab);
        rest = later;
        let seq_rows = mine.chunks_exact_mut(vocab);
        let drafts = &out.token_ids[s.tokens.end - k..s.tokens.end];
        outputs.clear();
        outputs.extend_from_slice(seq.output_tokens());
        // A constrained sequence's rows are masked by a copy of its guide that follows the
        // accepted drafts; its own guide takes the tokens when the scheduler appends them.
        let mut guide = seq.guide_for_drafts();
        let mut n = 0;
        for (i, row) in seq_rows.enumerate() {
            let token = sampler.sample(row, seq.draft_request(&outputs, guide.as_mut()));
            let id = token.token_id;
            tokens.push(token);
            n += 1;
            if i == k || id != drafts[i] {
                break;
            }
            if let Some(g) = guide.as_mut() {
                // (Sampled under the mask, so allowed: this cannot fail.)
                let _ = g.advance(id);
            }
            outputs.push(id);
        }
        emitted.push(n);
    }
    (tokens, emitted)
}
