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

/// What a fake cache slot holds: the (token, position) written there.
type Slots = Vec<Option<(u32, u32)>>;

/// The fake paged KV cache: for each physical slot, the (token, position) written there; with a
/// window group, the same for the sliding-window layers' own blocks.
pub struct FakeModel {
    block_size: usize,
    slots: Slots,
    /// The window, and the window group's slots.
    window: Option<(usize, Slots)>,
}

impl FakeModel {
    pub fn new(num_blocks: usize, block_size: usize) -> Self {
        FakeModel {
            block_size,
            slots: vec![None; num_blocks * block_size],
            window: None,
        }
    }

    /// A fake model that also has sliding-window layers of `window` positions over a window
    /// group of `num_blocks` blocks: each sampling row also reads its last `window` positions
    /// through the window block table, and they must hold the same tokens.
    pub fn with_window(
        num_blocks: usize,
        block_size: usize,
        window: usize,
        window_blocks: usize,
    ) -> Self {
        FakeModel {
            window: Some((window, vec![None; window_blocks * block_size])),
            ..Self::new(num_blocks, block_size)
        }
    }

    fn read(slots: &[Option<(u32, u32)>], table: &[u32], bs: usize, pos: usize, what: &str) -> u32 {
        let slot = table[pos / bs] as usize * bs + pos % bs;
        assert!(slot >= bs, "{what}: position {pos} reads the null block");
        let (token, written_at) =
            slots[slot].unwrap_or_else(|| panic!("{what}: slot {slot} (pos {pos}) never written"));
        assert_eq!(
            written_at as usize, pos,
            "{what}: slot {slot} holds another position"
        );
        token
    }

    /// Runs one step: returns one token per sampling sequence, in order.
    pub fn execute(&mut self, out: &SchedulerOutput) -> Vec<u32> {
        let (tokens, emitted) = self.execute_verify(out);
        assert!(emitted.iter().all(|&n| n == 1), "a step without drafts");
        tokens
    }

    /// Runs one step that may verify draft tokens: a sequence's rows are read in order, each
    /// row's next token taken, up to the first that differs from its draft. Returns the tokens
    /// back to back and how many each sampling sequence emitted.
    pub fn execute_verify(&mut self, out: &SchedulerOutput) -> (Vec<u32>, Vec<usize>) {
        let bs = self.block_size;
        for i in 0..out.num_batched_tokens() {
            let slot = out.slot_mapping[i] as usize;
            assert!(slot >= bs, "slot {slot} is in the null block");
            self.slots[slot] = Some((out.token_ids[i], out.positions[i]));
            if let Some((_, slots)) = &mut self.window {
                let slot = out.window_slot_mapping[i] as usize;
                assert!(slot >= bs, "window slot {slot} is in the null block");
                slots[slot] = Some((out.token_ids[i], out.positions[i]));
            }
        }
        let (mut sampled, mut emitted) = (Vec::new(), Vec::new());
        for s in &out.seqs {
            let table = &out.block_tables[s.block_table.clone()];
            let len = s.num_computed_tokens + s.num_new_tokens;
            let what = format!("{:?}", s.seq_id);
            let context: Vec<u32> = (0..len)
                .map(|pos| Self::read(&self.slots, table, bs, pos, &what))
                .collect();
            if let Some((window, slots)) = &self.window {
                // Each row of the step reads its own window through the window group's table.
                let table = &out.window_block_tables[s.block_table.clone()];
                for row in s.num_computed_tokens..len {
                    let first = (row + 1).saturating_sub(*window);
                    for (pos, &want) in context.iter().enumerate().take(row + 1).skip(first) {
                        let token = Self::read(slots, table, bs, pos, &format!("{what} window"));
                        assert_eq!(token, want, "{what}: window position {pos}");
                    }
                }
            }
            if s.samples {
                let k = s.num_draft_tokens;
                let drafts = &out.token_ids[s.tokens.end - k..s.tokens.end];
                let mut n = 0;
                for i in 0..=k {
                    let token = next_token(&context[..len - k + i]);
                    sampled.push(token);
                    n += 1;
                    if i == k || token != drafts[i] {
                        break;
                    }
                }
                emitted.push(n);
            }
        }
        (sampled, emitted)
    }
}
