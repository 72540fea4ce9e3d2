//! A model-free stand-in for the model runner: it writes each scheduled token into a fake paged KV
//! cache at the scheduler's slot mapping, and for each sampling row reads the sequence's whole
//! context back *through the block table* and derives the next token from what it read. A wrong
//! slot, a stale prefix-cache block or an overwritten block changes the tokens, so comparing with a
//! plain loop over the same function proves the paging, chunking and preemption are invisible.

#![allow(dead_code)]

use std::hash::{DefaultHasher, Hash, Hasher};

use pagewise::SchedulerOutput;

/// Vocabulary of the fake model; token 0 is its EOS.
pub const VOCAB: u32 = 64;
/// The fake model's end-of-sequence token.
pub const EOS: u32 = 0;

/// The fake model's next token after `context`.
pub fn next_token(context: &[u32]) -> u32 {
    let mut h = DefaultHasher::new();
    context.hash(&mut h);
    (h.finish() % u64::from(VOCAB)) as u32
}

/// What the fake model generates for `prompt` alone: up to `max_tokens`, ending early at EOS.
pub fn reference(prompt: &[u32], max_tokens: usize) -> Vec<u32> {
    let mut tokens = prompt.to_vec();
    let mut out = Vec::new();
    while out.len() < max_tokens {
        let t = next_token(&tokens);
        tokens.push(t);
        out.push(t);
        if t == EOS {
            break;
        }
    }
    out
}

/// The fake paged KV cache: for each physical slot, the (token, position) written there.
pub struct FakeModel {
    block_size: usize,
    slots: Vec<Option<(u32, u32)>>,
}

impl FakeModel {
    pub fn new(num_blocks: usize, block_size: usize) -> Self {
        FakeModel {
            block_size,
            slots: vec![None; num_blocks * block_size],
        }
    }

    /// Runs one step: returns one token per sampling sequence, in order.
    pub fn execute(&mut self, out: &SchedulerOutput) -> Vec<u32> {
        for i in 0..out.num_batched_tokens() {
            let slot = out.slot_mapping[i] as usize;
            assert!(slot >= self.block_size, "slot {slot} is in the null block");
            self.slots[slot] = Some((out.token_ids[i], out.positions[i]));
        }
        let mut sampled = Vec::new();
        for s in out.seqs.iter().filter(|s| s.samples) {
            let table = &out.block_tables[s.block_table.clone()];
            let len = s.num_computed_tokens + s.num_new_tokens;
            let context: Vec<u32> = (0..len)
                .map(|pos| {
                    let slot = table[pos / self.block_size] as usize * self.block_size
                        + pos % self.block_size;
                    let (token, written_at) = self.slots[slot].unwrap_or_else(|| {
                        panic!("{:?}: slot {slot} (pos {pos}) never written", s.seq_id)
                    });
                    assert_eq!(
                        written_at as usize, pos,
                        "{:?}: slot {slot} holds another position",
                        s.seq_id
                    );
                    token
                })
                .collect();
            sampled.push(next_token(&context));
        }
        sampled
    }
}
