//! Batch invariance: 32 prompts of different lengths, half sharing a long prefix, through one engine
//! with a tiny token budget (chunked prefill), prefix caching, and a cache small enough to force
//! preemption, give exactly the greedy tokens each prompt gives alone.

mod common;

use pagewise::sampler::SeededRng;
use pagewise::{EngineArgs, Llm, SamplingParams};

const MODEL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/llama-gqa-tied");
/// Gemma 3 with a 5-token sliding window on two of its three layers.
const WINDOWED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/gemma3");

fn prompts() -> Vec<Vec<u32>> {
    let mut rng = SeededRng::new(99, 0);
    let mut tok = || (rng.next_u64() % 250) as u32 + 1;
    let shared: Vec<u32> = (0..24).map(|_| tok()).collect();
    (0..32)
        .map(|i| {
            let tail_len = 1 + (i * 7) % 40;
            let tail: Vec<u32> = (0..tail_len).map(|_| tok()).collect();
            if i % 2 == 0 {
                [shared.clone(), tail].concat()
            } else {
                tail
            }
        })
        .collect()
}

#[test]
fn batched_chunked_cached_preempted_equals_solo() {
    // 512 bytes of KV per token (2 layers x 2 KV heads x 16 dims x K,V x f32).
    batched_equals_solo(MODEL, 512, None);
}

/// The same under sliding windows: chunks, cached prefixes and recomputed sequences all reach
/// past the window, and the sliding layers' blocks (a window group: 4 sequences at most) are
/// released as they fall out of it.
#[test]
fn batched_chunked_cached_preempted_equals_solo_under_sliding_windows() {
    // 24 x 8 x 1024 bytes: 48 blocks of one layer (8 tokens x 2 KV heads x 32 dims x K,V x
    // f32 = 4 KiB); 2 x 15 go to the sliding layers' group (see kv_sizing), 18 to the full one.
    let batched = batched_equals_solo(WINDOWED, 1024, Some(4));
    let window = batched.core().scheduler().kv().window_pool();
    let window = window.expect("the sliding layers have a window group");
    assert_eq!(window.num_blocks(), 15);
    assert_eq!(batched.core().scheduler().kv().pool().num_blocks(), 18);
    assert_eq!(window.num_free(), window.num_usable());
}

/// The same for a mixture of experts: each expert takes the tokens that chose it, whatever else
/// is in the step.
#[test]
fn batched_chunked_cached_preempted_equals_solo_with_experts() {
    batched_equals_solo(
        concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/mixtral"),
        512,
        None,
    );
}

/// Runs the prompts batched (under `max_num_seqs` when given) and checks each against a solo run;
/// returns the batched engine.
fn batched_equals_solo(model: &str, kv_bytes_per_token: u64, max_num_seqs: Option<usize>) -> Llm {
    let params = SamplingParams {
        temperature: 0.0,
        max_tokens: 24,
        ignore_eos: true,
        ..Default::default()
    };
    let prompts = prompts();

    let mut solo = Llm::new(EngineArgs {
        model: model.into(),
        enable_prefix_caching: false,
        ..Default::default()
    })
    .unwrap();
    let expected: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| {
            solo.generate_tokens(vec![p.clone()], &params).unwrap()[0].outputs[0]
                .token_ids
                .clone()
        })
        .collect();

    // 24 blocks of 8 tokens.
    let mut batched = Llm::new(EngineArgs {
        model: model.into(),
        block_size: 8,
        max_num_batched_tokens: Some(16),
        kv_cache_memory: Some(24 * 8 * kv_bytes_per_token),
        // The cache must hold one sequence of the full context length (checked at startup).
        max_model_len: Some(128),
        max_num_seqs: max_num_seqs.unwrap_or(EngineArgs::default().max_num_seqs),
        ..Default::default()
    })
    .unwrap();
    let outs = batched.generate_tokens(prompts.clone(), &params).unwrap();
    for (i, (out, want)) in outs.iter().zip(&expected).enumerate() {
        assert_eq!(
            &out.outputs[0].token_ids,
            want,
            "prompt {i} (len {})",
            prompts[i].len()
        );
    }
    common::assert_preempted_cached_and_freed(&batched, "");
    batched
}

/// 96 sequences in one step run the text phase (detokenization, stop strings) on a thread pool;
/// each sequence's text, tokens and finish reason must be what it gets alone (sequential text).
#[test]
fn a_large_batch_detokenizes_and_stops_like_each_prompt_alone() {
    let mut rng = SeededRng::new(5, 0);
    let prompts: Vec<Vec<u32>> = (0..96)
        .map(|i| {
            (0..4 + i % 9)
                .map(|_| (rng.next_u64() % 250) as u32 + 1)
                .collect()
        })
        .collect();
    let params = SamplingParams {
        temperature: 0.0,
        max_tokens: 20,
        ignore_eos: true,
        stop: vec!["e".into(), "an".into()],
        ..Default::default()
    };
    let mut llm = Llm::new(EngineArgs {
        model: MODEL.into(),
        ..Default::default()
    })
    .unwrap();
    let batched = llm.generate_tokens(prompts.clone(), &params).unwrap();
    let mut stopped = 0;
    for (i, (p, b)) in prompts.into_iter().zip(&batched).enumerate() {
        let alone = llm.generate_tokens(vec![p], &params).unwrap();
        let (a, b) = (&alone[0].outputs[0], &b.outputs[0]);
        assert_eq!(
            (&b.text, &b.token_ids, b.finish_reason),
            (&a.text, &a.token_ids, a.finish_reason),
            "prompt {i}"
        );
        stopped += usize::from(b.token_ids.len() < 20);
    }
    // The stop strings matter: some sequences end on them, some run to max_tokens.
    assert!(stopped > 0 && stopped < 96, "{stopped} of 96 stopped early");
}

/// The text phase runs one step late (during the next forward pass), so a sequence that a stop
/// string ends has already been scheduled once more: that token must not reach the output, the
/// output must end where the stop string starts, and every block must be free afterwards.
#[test]
fn a_stop_string_ends_the_output_at_its_token_despite_the_late_text_phase() {
    let mut rng = SeededRng::new(11, 0);
    let prompts: Vec<Vec<u32>> = (0..8)
        .map(|_| (0..6).map(|_| (rng.next_u64() % 250) as u32 + 1).collect())
        .collect();
    let free = SamplingParams {
        temperature: 0.0,
        max_tokens: 24,
        ignore_eos: true,
        ..Default::default()
    };
    let stopping = SamplingParams {
        stop: vec!["e".into()],
        ..free.clone()
    };
    let mut llm = Llm::new(EngineArgs {
        model: MODEL.into(),
        ..Default::default()
    })
    .unwrap();
    let unstopped = llm.generate_tokens(prompts.clone(), &free).unwrap();
    let stopped = llm.generate_tokens(prompts, &stopping).unwrap();
    let tokenizer = llm.core().tokenizer().clone();
    let mut ended = 0;
    for (i, (u, s)) in unstopped.iter().zip(&stopped).enumerate() {
        let (u, s) = (&u.outputs[0], &s.outputs[0]);
        match u.text.find('e') {
            Some(at) => {
                ended += 1;
                assert_eq!(
                    s.text,
                    u.text[..at],
                    "prompt {i}: text up to the stop string"
                );
                assert_eq!(
                    s.finish_reason,
                    Some(pagewise::FinishReason::Stop),
                    "prompt {i}"
                );
                // The tokens end with the one whose text reached the stop string.
                let n = s.token_ids.len();
                assert_eq!(s.token_ids[..], u.token_ids[..n], "prompt {i}");
                let text_before = tokenizer.decode(&u.token_ids[..n - 1], true).unwrap();
                assert!(!text_before.contains('e'), "prompt {i}: one token too many");
                assert!(
                    tokenizer
                        .decode(&u.token_ids[..n], true)
                        .unwrap()
                        .contains('e')
                );
            }
            None => assert_eq!(s.token_ids, u.token_ids, "prompt {i}"),
        }
    }
    assert!(ended > 0, "some outputs must contain the stop string");
    let s = llm.core().scheduler();
    assert!(!llm.core().has_unfinished());
    assert_eq!(s.kv().pool().num_free(), s.kv().pool().num_usable());
}
