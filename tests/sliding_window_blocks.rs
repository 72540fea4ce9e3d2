//! The page table's window group through the engine: a model that mixes sliding-window and full
//! layers (the tiny Gemma 3: a 5-token window on two of its three layers) keeps only the blocks
//! its windows can reach in the sliding layers, gives the rest of the memory to the full layers,
//! and generates exactly what it generates with every layer holding the whole context.

mod common;

use common::greedy;
use pagewise::{EngineArgs, Llm};

const GEMMA3: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/gemma3");
/// Bytes of one 8-token block of one layer: 8 tokens x 2 KV heads x 32 dims x K,V x f32.
const LAYER_BLOCK: u64 = 8 * 2 * 32 * 2 * 4;

fn engine(max_num_seqs: usize) -> Llm {
    Llm::new(EngineArgs {
        model: GEMMA3.into(),
        block_size: 8,
        max_num_seqs,
        max_num_batched_tokens: Some(16),
        // 40 blocks for each of the 3 layers when they are alike.
        kv_cache_memory: Some(3 * 40 * LAYER_BLOCK),
        max_model_len: Some(256),
        ..Default::default()
    })
    .unwrap()
}

#[test]
fn the_sliding_layers_hold_only_their_window_and_the_full_layers_get_the_memory() {
    // 4 sequences at most: each needs the block its window starts in, the block it ends in and
    // one more, and a step's 16 new tokens take 2: 4 x 3 + 2 blocks (+ the null block) in each
    // sliding layer; the full layer gets the other 120 - 2 x 15 = 90.
    let mut llm = engine(4);
    let s = llm.core().scheduler();
    let window = s.kv().window().expect("a window group");
    assert_eq!((window.window, window.num_blocks), (5, 15));
    assert_eq!(s.kv().pool().num_blocks(), 90);
    assert_eq!(s.kv().capacity_tokens(), 89 * 8);

    let prompt: Vec<u32> = (1..=10).collect();
    llm.core_mut().add(prompt, greedy(200), None).unwrap();
    let (mut most_window, mut most_full) = (0, 0);
    while llm.core().has_unfinished() {
        llm.core_mut().step().unwrap();
        let s = llm.core().scheduler();
        for seq in s.running() {
            let table = &seq.block_table;
            let live = table.window_blocks().iter().filter(|b| b.0 != 0).count();
            most_window = most_window.max(live);
            most_full = most_full.max(table.len());
            let in_use = s.kv().window_pool().unwrap();
            assert_eq!(in_use.num_usable() - in_use.num_free(), live);
        }
    }
    eprintln!("most blocks held: {most_full} full, {most_window} in the window group");
    // 209 of the 210 tokens are computed (the last one sampled is not); the step that computes
    // the 209th retires the sequence.
    assert_eq!(
        most_full,
        208usize.div_ceil(8),
        "the full layer keeps the whole context"
    );
    assert!(most_window <= 3, "{most_window} window blocks held at once");
    let s = llm.core().scheduler();
    let pool = s.kv().window_pool().unwrap();
    assert_eq!(pool.num_free(), pool.num_usable(), "everything given back");
}

#[test]
fn releasing_window_blocks_changes_no_token() {
    // 256 sequences' windows would not fit in this memory: no window group, every layer keeps
    // the whole context. With 4 sequences the sliding layers release their blocks.
    let mut whole = engine(256);
    assert!(whole.core().scheduler().kv().window().is_none());
    let mut windowed = engine(4);
    assert!(windowed.core().scheduler().kv().window().is_some());
    let prompts: Vec<Vec<u32>> = (0..6u32)
        .map(|i| {
            (0..30 + 9 * i)
                .map(|t| (t * 31 + i * 17) % 250 + 1)
                .collect()
        })
        .collect();
    let params = greedy(150);
    let want = whole.generate_tokens(prompts.clone(), &params).unwrap();
    let got = windowed.generate_tokens(prompts, &params).unwrap();
    for (i, (w, g)) in want.iter().zip(&got).enumerate() {
        assert_eq!(g.outputs[0].token_ids, w.outputs[0].token_ids, "prompt {i}");
    }
    let s = windowed.core().scheduler();
    assert!(
        s.num_preemptions_total() > 0,
        "4 sequences of up to 225 tokens at once in 89 blocks"
    );
}

/// A budget where no layout for 256 sequences holds one sequence of the full context (alike,
/// every layer gets 30 blocks, 232 tokens; a window group for 256 windows takes more than all of
/// it): the window group is planned for 8 windows, which leaves the full layer 36 blocks, and the
/// engine starts and generates what it generates with room to spare; sequences past the 8th
/// wait for window blocks.
#[test]
fn a_window_group_for_fewer_sequences_lets_the_full_context_fit() {
    let mut fewer = Llm::new(EngineArgs {
        model: GEMMA3.into(),
        block_size: 8,
        max_num_seqs: 256,
        max_num_batched_tokens: Some(16),
        kv_cache_memory: Some(3 * 30 * LAYER_BLOCK),
        max_model_len: Some(256),
        ..Default::default()
    })
    .unwrap();
    let s = fewer.core().scheduler();
    let window = s.kv().window().expect("a window group for fewer sequences");
    assert_eq!(window.num_blocks, 8 * 3 + 2 + 1);
    assert_eq!(s.kv().pool().num_blocks(), 90 - 2 * 27);
    let prompts: Vec<Vec<u32>> = (0..12u32)
        .map(|i| {
            (0..20 + 5 * i)
                .map(|t| (t * 29 + i * 13) % 250 + 1)
                .collect()
        })
        .collect();
    let params = greedy(60);
    let want = engine(256)
        .generate_tokens(prompts.clone(), &params)
        .unwrap();
    let got = fewer.generate_tokens(prompts, &params).unwrap();
    for (i, (w, g)) in want.iter().zip(&got).enumerate() {
        assert_eq!(g.outputs[0].token_ids, w.outputs[0].token_ids, "prompt {i}");
    }
}
