//! One sequence being generated: its tokens, how many of them have KV in the cache, its block
//! table, and what ends it. Plain data owned by the scheduler: no locks, no shared mutation.

use std::sync::Arc;

use crate::guided::Guide;
use crate::kv::BlockTable;
use crate::request::{FinishReason, SamplingParams};
use crate::sampler::{Logprobs, SampleRequest, SeededRng};

/// Identifies a sequence for the life of the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(pub u64);

/// A map keyed by sequence: the engine looks its sequences up several times per step, so the key
/// (a counter) is hashed by one multiplication instead of SipHash (no untrusted keys here).
pub type SeqMap<V> = std::collections::HashMap<SeqId, V, BuildSeqIdHasher>;

/// [`SeqMap`]'s hasher: Fibonacci hashing of the id.
#[derive(Clone, Copy, Debug, Default)]
pub struct BuildSeqIdHasher;

impl std::hash::BuildHasher for BuildSeqIdHasher {
    type Hasher = SeqIdHasher;
    fn build_hasher(&self) -> SeqIdHasher {
        SeqIdHasher(0)
    }
}

/// Hashes the `u64` inside a [`SeqId`].
#[derive(Clone, Copy, Debug)]
pub struct SeqIdHasher(u64);

impl std::hash::Hasher for SeqIdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Only reached for keys other than SeqId; fold the bytes in.
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// Where a sequence is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeqStatus {
    /// Queued, or preempted and waiting to be recomputed.
    Waiting,
    /// Admitted: holds blocks and is scheduled every step until it finishes or is preempted.
    Running,
    /// Done; its blocks are released.
    Finished(FinishReason),
}

/// A sequence of prompt and generated tokens, catching up its computed count step by step.
#[derive(Clone, Debug)]
pub struct Sequence {
    /// This sequence's id.
    pub id: SeqId,
    token_ids: Vec<u32>,
    num_prompt_tokens: usize,
    num_computed_tokens: usize,
    /// Waiting, running or finished.
    pub status: SeqStatus,
    /// The sequence's KV blocks.
    pub block_table: BlockTable,
    /// Resolved sampling parameters (shared by the `n` sequences of one request).
    pub params: Arc<SamplingParams>,
    /// The model's end-of-sequence ids (ignored when `params.ignore_eos`).
    eos_token_ids: Arc<[u32]>,
    /// EOS (unless ignored) and stop token ids: what `min_tokens` suppresses.
    stop_ids: Vec<u32>,
    /// This sequence's random stream.
    pub rng: SeededRng,
    /// Prompt tokens served from the prefix cache when first admitted.
    pub num_cached_tokens: usize,
    /// Times this sequence was preempted.
    pub num_preemptions: u32,
    /// The constraint its tokens follow, if the request has one.
    guide: Option<Guide>,
    /// Tokens a proposer guessed follow this sequence's tokens (speculative decoding): the next
    /// step feeds them after the pending token and the target model verifies them.
    spec_tokens: Vec<u32>,
    /// The prompt's logprobs while they are computed (`params.prompt_logprobs`): the
    /// alternatives asked for, and the entries of prompt tokens `1..` so far. Taken when the
    /// sequence first samples.
    prompt_logprobs: Option<(usize, Vec<Logprobs>)>,
}

impl Sequence {
    /// A waiting sequence for `prompt`. `stream` tells apart the `n` samples of one seeded request.
    pub fn new(
        id: SeqId,
        prompt: Vec<u32>,
        params: Arc<SamplingParams>,
        eos_token_ids: Arc<[u32]>,
        cache_salt: Option<&str>,
        stream: u64,
    ) -> Self {
        let rng = match params.seed {
            Some(seed) => SeededRng::new(seed, stream),
            None => SeededRng::from_entropy(),
        };
        let mut stop_ids = params.stop_token_ids.clone();
        if !params.ignore_eos {
            stop_ids.extend(eos_token_ids.iter().copied());
        }
        // (Each of the `n` computes them: each answer's first event carries them.)
        let prompt_logprobs = params.prompt_logprobs.map(|k| (k, Vec::new()));
        Sequence {
            id,
            num_prompt_tokens: prompt.len(),
            token_ids: prompt,
            num_computed_tokens: 0,
            status: SeqStatus::Waiting,
            block_table: BlockTable::new(cache_salt),
            params,
            eos_token_ids,
            stop_ids,
            rng,
            num_cached_tokens: 0,
            num_preemptions: 0,
            guide: None,
            spec_tokens: Vec::new(),
            prompt_logprobs,
        }
    }

    /// Whether prompt logprobs are still to compute: the prompt must then be computed whole
    /// (no prefix-cache hits), since only computed rows have logits.
    pub fn wants_prompt_logprobs(&self) -> bool {
        self.prompt_logprobs
            .as_ref()
            .is_some_and(|(_, got)| got.len() + 1 < self.num_prompt_tokens)
    }

    /// Of `n` rows computed from position `start`, how many lead rows' logits give prompt
    /// logprobs (those whose next token is a prompt token), with the alternatives asked for.
    pub fn prompt_logprob_rows(&self, start: usize, n: usize) -> (usize, usize) {
        match &self.prompt_logprobs {
            Some((k, _)) if self.wants_prompt_logprobs() => (
                (start + n)
                    .min(self.num_prompt_tokens - 1)
                    .saturating_sub(start),
                *k,
            ),
            _ => (0, 0),
        }
    }

    /// The logprobs of prompt token `position + 1`, from the row at `position` (rows computed
    /// again after a preemption are skipped).
    pub fn add_prompt_logprob(&mut self, position: usize, lp: Logprobs) {
        if let Some((_, got)) = &mut self.prompt_logprobs
            && got.len() == position
        {
            got.push(lp);
        }
    }

    /// The prompt's logprobs, once: those of tokens `1..` (the first has none).
    pub fn take_prompt_logprobs(&mut self) -> Option<Vec<Logprobs>> {
        self.prompt_logprobs.take().map(|(_, got)| got)
    }

    /// Constrains this sequence's tokens to `guide` (compiled from its request's
    /// `structured_outputs`).
    pub fn set_guide(&mut self, guide: Guide) {
        self.guide = Some(guide);
    }

    /// Why this sequence's constraint failed, if it did (the sequence then ended with `Abort`).
    pub fn guide_error(&self) -> Option<&str> {
        self.guide.as_ref().and_then(Guide::error)
    }

    /// Prompt and generated tokens.
    pub fn token_ids(&self) -> &[u32] {
        &self.token_ids
    }

    /// The prompt's tokens.
    pub fn prompt_tokens(&self) -> &[u32] {
        &self.token_ids[..self.num_prompt_tokens]
    }

    /// The generated tokens.
    pub fn output_tokens(&self) -> &[u32] {
        &self.token_ids[self.num_prompt_tokens..]
    }

    /// All tokens.
    pub fn num_tokens(&self) -> usize {
        self.token_ids.len()
    }

    /// Prompt length.
    pub fn num_prompt_tokens(&self) -> usize {
        self.num_prompt_tokens
    }

    /// Generated length.
    pub fn num_output_tokens(&self) -> usize {
        self.token_ids.len() - self.num_prompt_tokens
    }

    /// Tokens whose KV is in the cache.
    pub fn num_computed_tokens(&self) -> usize {
        self.num_computed_tokens
    }

    /// Tokens still to compute before the next sample.
    pub fn num_pending_tokens(&self) -> usize {
        self.token_ids.len() - self.num_computed_tokens
    }

    /// Whether the sequence has finished.
    pub fn is_finished(&self) -> bool {
        matches!(self.status, SeqStatus::Finished(_))
    }

    /// Token ids that may not be sampled now: EOS and stop ids until `min_tokens` are generated.
    pub fn suppressed_tokens(&self) -> &[u32] {
        if self.num_output_tokens() < self.params.min_tokens {
            &self.stop_ids
        } else {
            &[]
        }
    }

    /// The draft tokens the next step verifies (empty: a plain decode step).
    pub fn spec_tokens(&self) -> &[u32] {
        &self.spec_tokens
    }

    /// Sets the draft tokens the next step verifies.
    pub fn set_spec_tokens(&mut self, drafts: &[u32]) {
        self.spec_tokens.clear();
        self.spec_tokens.extend_from_slice(drafts);
    }

    /// A copy of this sequence's constraint in its current state (its mask computed), for a
    /// verify step to follow the drafts with: the sequence's own guide takes the tokens only
    /// when they are appended. `None` without a constraint.
    pub fn guide_for_drafts(&mut self) -> Option<Guide> {
        let guide = self.guide.as_mut()?;
        guide.compute_mask();
        Some(guide.clone())
    }

    /// The request for sampling the position after `outputs` (this sequence's output tokens,
    /// then the drafts accepted so far in a verify step): penalties and `min_tokens` see them,
    /// and `guide` (from [`Self::guide_for_drafts`], following the same drafts) masks it.
    pub fn draft_request<'a>(
        &'a mut self,
        outputs: &'a [u32],
        guide: Option<&'a mut Guide>,
    ) -> SampleRequest<'a> {
        debug_assert_eq!(self.guide.is_some(), guide.is_some());
        let suppressed: &[u32] = if outputs.len() < self.params.min_tokens {
            &self.stop_ids
        } else {
            &[]
        };
        SampleRequest {
            params: &self.params,
            prompt_tokens: &self.token_ids[..self.num_prompt_tokens],
            output_tokens: outputs,
            suppressed,
            rng: &mut self.rng,
            guide,
        }
    }

    /// What the sampler needs for this sequence's next token (borrowing its own random stream).
    pub fn sample_request(&mut self) -> SampleRequest<'_> {
        let np = self.num_prompt_tokens;
        let suppressed: &[u32] = if self.token_ids.len() - np < self.params.min_tokens {
            &self.stop_ids
        } else {
            &[]
        };
        SampleRequest {
            params: &self.params,
            prompt_tokens: &self.token_ids[..np],
            output_tokens: &self.token_ids[np..],
            suppressed,
            rng: &mut self.rng,
            guide: self.guide.as_mut(),
        }
    }

    /// The block table and the tokens it holds, borrowed together for the page table manager.
    pub fn table_and_tokens(&mut self) -> (&mut BlockTable, &[u32]) {
        (&mut self.block_table, &self.token_ids)
    }

    pub(crate) fn set_num_computed_tokens(&mut self, n: usize) {
        debug_assert!(n <= self.token_ids.len());
        self.num_computed_tokens = n;
    }

    /// Appends a sampled token and says whether that ends the sequence (vLLM's order: nothing
    /// stops before `min_tokens`; then EOS, stop token ids, then `max_tokens` / `max_model_len`).
    /// A constrained sequence's guide takes the token first: a token it cannot take aborts the
    /// sequence ([`Sequence::guide_error`] says why), and the token after a completed grammar
    /// (the EOS its mask allowed) ends it.
    pub(crate) fn append(&mut self, token: u32, max_model_len: usize) -> Option<FinishReason> {
        self.token_ids.push(token);
        if let Some(guide) = &mut self.guide {
            if guide.is_complete() {
                // The grammar was complete: this token is the EOS its mask allowed, and nothing
                // may follow, whatever `min_tokens` or `ignore_eos` ask.
                return Some(FinishReason::Stop);
            }
            if guide.advance(token).is_err() {
                return Some(FinishReason::Abort);
            }
        }
        let num_output = self.num_output_tokens();
        if num_output >= self.params.min_tokens {
            let is_eos = !self.params.ignore_eos && self.eos_token_ids.contains(&token);
            if is_eos || self.params.stop_token_ids.contains(&token) {
                return Some(FinishReason::Stop);
            }
        }
        if num_output >= self.params.max_tokens || self.token_ids.len() >= max_model_len {
            return Some(FinishReason::Length);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seq_maps_hash_sequential_ids_apart_and_work_as_maps() {
        use std::hash::BuildHasher;
        let hashes: std::collections::HashSet<u64> = (0..10_000u64)
            .map(|i| BuildSeqIdHasher.hash_one(SeqId(i)))
            .collect();
        assert_eq!(hashes.len(), 10_000);
        let mut map = SeqMap::default();
        for i in 0..1000u64 {
            map.insert(SeqId(i), i * 2);
        }
        assert!((0..1000u64).all(|i| map.get(&SeqId(i)) == Some(&(i * 2))));
        assert_eq!(map.remove(&SeqId(7)), Some(14));
        assert_eq!(map.len(), 999);
    }

    fn seq(params: SamplingParams) -> Sequence {
        Sequence::new(
            SeqId(1),
            vec![5, 6, 7],
            Arc::new(params),
            Arc::from(vec![2u32]),
            None,
            0,
        )
    }

    #[test]
    fn prompt_logprobs_are_kept_once_per_position_through_a_recompute() {
        let lp = |logprob: f32| Logprobs {
            logprob,
            rank: 1,
            top: Vec::new(),
        };
        let mut s = seq(SamplingParams {
            prompt_logprobs: Some(2),
            ..Default::default()
        });
        // Prompt [5, 6, 7]: rows 0 and 1 give the logprobs of tokens 1 and 2.
        assert!(s.wants_prompt_logprobs());
        assert_eq!(s.prompt_logprob_rows(0, 3), (2, 2));
        assert_eq!(s.prompt_logprob_rows(1, 1), (1, 2));
        s.add_prompt_logprob(0, lp(-1.0));
        // A preempted sequence computes its prompt again: the rows already kept are skipped.
        s.add_prompt_logprob(0, lp(-9.0));
        s.add_prompt_logprob(1, lp(-2.0));
        assert!(!s.wants_prompt_logprobs());
        assert_eq!(s.prompt_logprob_rows(0, 3), (0, 0));
        let got: Vec<f32> = s
            .take_prompt_logprobs()
            .unwrap()
            .iter()
            .map(|l| l.logprob)
            .collect();
        assert_eq!(got, [-1.0, -2.0]);
        assert_eq!(s.take_prompt_logprobs(), None);
        assert!(!seq(SamplingParams::default()).wants_prompt_logprobs());
    }

    #[test]
    fn stop_order_follows_vllm() {
        let p = SamplingParams {
            max_tokens: 4,
            min_tokens: 2,
            stop_token_ids: vec![9],
            ..Default::default()
        };
        let mut s = seq(p.clone());
        assert_eq!(s.suppressed_tokens(), &[9, 2]);
        assert_eq!(
            s.append(2, 100),
            None,
            "EOS before min_tokens does not stop"
        );
        assert_eq!(s.suppressed_tokens(), &[9, 2]);
        assert_eq!(s.append(9, 100), Some(FinishReason::Stop));
        assert!(s.suppressed_tokens().is_empty());

        let mut s = seq(p.clone());
        for t in [10, 11, 12] {
            assert_eq!(s.append(t, 100), None);
        }
        assert_eq!(s.append(13, 100), Some(FinishReason::Length));
        assert_eq!(s.output_tokens(), &[10, 11, 12, 13]);

        let mut s = seq(p);
        assert_eq!(s.append(10, 5), None);
        assert_eq!(s.append(11, 5), Some(FinishReason::Length), "max_model_len");

        let mut s = seq(SamplingParams {
            ignore_eos: true,
            ..Default::default()
        });
        assert_eq!(s.append(2, 100), None);
    }

    #[test]
    fn a_guide_ends_its_sequence_when_complete_or_broken() {
        use crate::guided::{Grammars, StructuredOutputs};
        let tokenizer = Arc::new(crate::testing::byte_level_tokenizer(&[]));
        let eos = tokenizer.token_to_id("<eos>").unwrap();
        let grammars = Grammars::new(tokenizer, 300, &[eos], false);
        let choice = StructuredOutputs::Choice(vec!["ok".into()]);
        let guided = |min_tokens| {
            let mut s = Sequence::new(
                SeqId(1),
                vec![5, 6, 7],
                Arc::new(SamplingParams {
                    min_tokens,
                    ignore_eos: true,
                    ..Default::default()
                }),
                Arc::from(vec![eos]),
                None,
                0,
            );
            s.set_guide(grammars.compile(&choice).unwrap());
            s
        };
        // Complete after "ok": the next token (the EOS its mask allows) ends it, even with
        // ignore_eos and min_tokens unmet.
        let mut s = guided(10);
        assert_eq!(s.append(u32::from(b'o'), 100), None);
        assert_eq!(s.append(u32::from(b'k'), 100), None);
        let mut req = s.sample_request();
        let mask = req.guide.as_deref_mut().unwrap().mask().unwrap().clone();
        assert!(mask.is_allowed(eos) && mask.num_set() == 1);
        assert_eq!(s.append(eos, 100), Some(FinishReason::Stop));
        assert!(s.guide_error().is_none());
        // A token the mask does not allow aborts it, with the reason.
        let mut s = guided(0);
        assert_eq!(s.append(u32::from(b'x'), 100), Some(FinishReason::Abort));
        assert!(s.guide_error().unwrap().contains("not allowed"));
    }
}
