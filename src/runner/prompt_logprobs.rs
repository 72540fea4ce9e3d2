//! Prompt logprobs (`SamplingParams::prompt_logprobs`): the logits of a prompt's rows, brought to
//! the host with the sampled rows, become the logprobs of the prompt tokens that follow them.

use crate::sampler::raw_logprobs;
use crate::scheduler::SchedulerOutput;
use crate::sequence::Sequence;

/// Stores in each sequence of `out` (`seqs`, in `out.seqs` order) the logprobs its prompt rows
/// give, then removes those rows from `data` (rows of `vocab` logits: per sequence its prompt
/// rows, then its sampled rows), leaving the sampled rows back to back as the sampler reads them.
pub(super) fn take_prompt_rows(
    data: &mut Vec<f32>,
    vocab: usize,
    out: &SchedulerOutput,
    seqs: &mut [Sequence],
) {
    if out.num_prompt_rows() == 0 {
        return;
    }
    let (mut read, mut write) = (0, 0);
    let mut scratch = Vec::new();
    for (s, seq) in out.seqs.iter().zip(seqs.iter_mut()) {
        let (rows, k) = seq.prompt_logprob_rows(s.num_computed_tokens, s.num_new_tokens);
        debug_assert_eq!(rows, s.num_prompt_rows);
        for j in 0..s.num_prompt_rows {
            let position = s.num_computed_tokens + j;
            let next = seq.token_ids()[position + 1];
            let row = &data[(read + j) * vocab..(read + j + 1) * vocab];
            let lp = raw_logprobs(row, next, k, &mut scratch);
            seq.add_prompt_logprob(position, lp);
        }
        read += s.num_prompt_rows;
        if s.samples {
            let n = 1 + s.num_draft_tokens;
            data.copy_within(read * vocab..(read + n) * vocab, write * vocab);
            (read, write) = (read + n, write + n);
        }
    }
    data.truncate(write * vocab);
}
