//! Speculative decoding with a draft model (`{"model": ...}`), through the library: a smaller
//! model of the same vocabulary guesses, the target verifies, and the output is the target's
//! alone (greedy and seeded), whatever the draft: the target itself, a 4-bit copy of it, an
//! unrelated model, a GGUF file, a model with sliding windows. Under batching, chunked prefill,
//! prefix caching and preemption; every block of both caches is free at the end.

mod common;

use pagewise::sampler::SeededRng;
use pagewise::spec::SpeculativeConfig;
use pagewise::{EngineArgs, Llm, SamplingParams};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");

fn draft(model: &str, k: usize) -> Option<SpeculativeConfig> {
    Some(
        SpeculativeConfig::parse(&format!(
            r#"{{"model":"{model}","num_speculative_tokens":{k},"adaptive":false}}"#
        ))
        .unwrap(),
    )
}

/// 16 prompts, half sharing a prefix.
fn prompts() -> Vec<Vec<u32>> {
    let mut rng = SeededRng::new(5, 0);
    let mut tok = || (rng.next_u64() % 250) as u32 + 1;
    let shared: Vec<u32> = (0..24).map(|_| tok()).collect();
    (0..16)
        .map(|i| {
            let tail: Vec<u32> = (0..1 + (i * 7) % 30).map(|_| tok()).collect();
            match i % 2 {
                0 => [shared.clone(), tail].concat(),
                _ => tail,
            }
        })
        .collect()
}

fn target() -> String {
    format!("{FIXTURES}/llama-gqa-tied")
}

/// Each prompt alone without speculation.
fn plain_outputs(params: &SamplingParams) -> Vec<Vec<u32>> {
    let mut plain = Llm::new(EngineArgs {
        model: target(),
        ..Default::default()
    })
    .unwrap();
    prompts()
        .into_iter()
        .map(|p| {
            plain.generate_tokens(vec![p], params).unwrap()[0].outputs[0]
                .token_ids
                .clone()
        })
        .collect()
}

/// All prompts batched with `draft_model` (`draft_kv_bytes` of K/V a token) proposing in a small
/// cache: the same tokens as `expected`, and every block free after. Returns the acceptance rate.
fn same_with_draft(
    draft_model: &str,
    draft_kv_bytes: u64,
    params: &SamplingParams,
    expected: &[Vec<u32>],
) -> f64 {
    let mut spec = Llm::new(EngineArgs {
        model: target(),
        block_size: 8,
        max_num_batched_tokens: Some(24),
        // The target's share holds about 24 blocks of 8 tokens: preemption.
        kv_cache_memory: Some(24 * 8 * (512 + draft_kv_bytes)),
        max_model_len: Some(128),
        speculative_config: draft(draft_model, 4),
        ..Default::default()
    })
    .unwrap();
    let outs = spec.generate_tokens(prompts(), params).unwrap();
    for (i, (out, want)) in outs.iter().zip(expected).enumerate() {
        assert_eq!(&out.outputs[0].token_ids, want, "{draft_model}: prompt {i}");
    }
    let stats = spec.core().spec_stats();
    eprintln!(
        "{draft_model}: drafts {}, draft tokens {}, accepted {} ({:.0}%), per position {:?}",
        stats.num_drafts,
        stats.num_draft_tokens,
        stats.num_accepted_tokens,
        100.0 * stats.acceptance_rate(),
        stats.accepted_per_pos
    );
    assert!(stats.num_drafts > 0, "{draft_model}: no drafts");
    common::assert_preempted_cached_and_freed(&spec, &format!("{draft_model}: "));
    let (free, all) = spec.core().draft_block_usage().expect("a draft model");
    assert_eq!(
        free, all,
        "{draft_model}: the draft cache's blocks are all free again"
    );
    stats.acceptance_rate()
}

fn greedy() -> SamplingParams {
    SamplingParams {
        temperature: 0.0,
        max_tokens: 32,
        ignore_eos: true,
        ..Default::default()
    }
}

#[test]
fn greedy_output_with_a_draft_model_is_the_output_without() {
    let expected = plain_outputs(&greedy());
    // The target as its own draft guesses right (its K/V rolled back and caught up correctly).
    let own = same_with_draft(&target(), 512, &greedy(), &expected);
    assert!(own > 0.9, "the target drafting for itself: {own}");
    // A 4-bit copy of the target guesses right more often than an unrelated model (this tiny
    // random model's logits are nearly flat, so 4-bit rounding often moves the argmax).
    let awq = same_with_draft(&format!("{FIXTURES}/llama-awq"), 512, &greedy(), &expected);
    assert!(awq > 0.15, "a 4-bit copy of the target: {awq}");
    // Unrelated drafts: another architecture from a GGUF file, and one with sliding windows.
    same_with_draft(
        &format!("{FIXTURES}/qwen2-bias/model-F32.gguf"),
        256,
        &greedy(),
        &expected,
    );
    same_with_draft(&format!("{FIXTURES}/gemma3"), 1536, &greedy(), &expected);
}

/// Seeded sampling with penalties: each position is sampled as a plain step samples it, from
/// the same stream, whatever the draft guessed.
#[test]
fn seeded_sampling_with_a_draft_model_is_the_output_without() {
    let params = SamplingParams {
        temperature: 0.7,
        top_p: 0.95,
        top_k: 50,
        presence_penalty: 0.1,
        min_tokens: 4,
        max_tokens: 32,
        seed: Some(3),
        ..Default::default()
    };
    let expected = plain_outputs(&params);
    let rate = same_with_draft(&format!("{FIXTURES}/llama-awq"), 512, &params, &expected);
    assert!(rate > 0.0, "{rate}");
}

#[test]
fn draft_models_of_another_vocabulary_or_none_at_all_are_refused() {
    let start = |config: Option<SpeculativeConfig>| {
        Llm::new(EngineArgs {
            model: target(),
            speculative_config: config,
            ..Default::default()
        })
        .err()
        .expect("refused")
        .to_string()
    };
    if let Some(smollm2) = common::smollm2_gguf() {
        let e = start(draft(&smollm2, 3));
        assert!(e.contains("another vocabulary"), "{e}");
    }
    let e = start(draft(&format!("{FIXTURES}/no-such-draft"), 3));
    assert!(
        e.contains("the draft model") && e.contains("no-such-draft"),
        "{e}"
    );
    let e = start(Some(
        SpeculativeConfig::parse(r#"{"method":"eagle3","model":"x","num_speculative_tokens":3}"#)
            .unwrap(),
    ));
    assert!(e.contains("the EAGLE-3 head x"), "{e}");
}

/// Every draft is the draft model's own greedy continuation of the sequence's tokens as they are
/// now: its K/V caught up, and rolled back past rejected guesses (target llama-awq, draft
/// llama-gqa-tied: the guesses are often rejected), checked against the draft model run alone.
#[test]
fn each_draft_is_the_draft_models_own_greedy_continuation() {
    let mut alone = Llm::new(EngineArgs {
        model: target(),
        ..Default::default()
    })
    .unwrap();
    let mut spec = Llm::new(EngineArgs {
        model: format!("{FIXTURES}/llama-awq"),
        block_size: 8,
        max_num_batched_tokens: Some(24),
        kv_cache_memory: Some(24 * 8 * 1024),
        max_model_len: Some(128),
        speculative_config: draft(&target(), 4),
        ..Default::default()
    })
    .unwrap();
    for p in prompts().into_iter().take(8) {
        spec.core_mut().add(p, greedy(), None).unwrap();
    }
    let (mut checked, mut differ) = (0, 0);
    while spec.core().has_unfinished() {
        spec.core_mut().step().unwrap();
        let running: Vec<(Vec<u32>, Vec<u32>)> = spec
            .core()
            .scheduler()
            .running()
            .iter()
            .filter(|s| !s.spec_tokens().is_empty())
            .map(|s| (s.token_ids().to_vec(), s.spec_tokens().to_vec()))
            .collect();
        for (tokens, guess) in running {
            let params = SamplingParams {
                max_tokens: guess.len(),
                ..greedy()
            };
            let own = &alone.generate_tokens(vec![tokens], &params).unwrap()[0].outputs[0];
            checked += 1;
            differ += usize::from(own.token_ids != guess);
        }
    }
    let rate = spec.core().spec_stats().acceptance_rate();
    eprintln!("{checked} drafts checked, {differ} differ; acceptance {rate:.2}");
    assert!(
        checked > 50 && rate < 0.6,
        "{checked} drafts, acceptance {rate}"
    );
    assert_eq!(differ, 0);
}

/// A prompt the target reads in chunks is read by the draft as far as the target has, step by
/// step: after each chunk, the draft cache holds the blocks of the tokens read so far.
#[test]
fn the_draft_reads_a_chunked_prompt_with_the_target() {
    let mut llm = Llm::new(EngineArgs {
        model: target(),
        block_size: 8,
        max_num_batched_tokens: Some(24),
        max_model_len: Some(256),
        speculative_config: draft(&target(), 3),
        ..Default::default()
    })
    .unwrap();
    let prompt: Vec<u32> = (0..100).map(|i| (i * 7 % 250) as u32 + 1).collect();
    llm.core_mut().add(prompt, greedy(), None).unwrap();
    let (_, all) = llm.core().draft_block_usage().unwrap();
    for chunk in 1..=4 {
        llm.core_mut().step().unwrap();
        let (free, _) = llm.core().draft_block_usage().unwrap();
        assert_eq!(all - free, (24 * chunk) / 8, "after chunk {chunk}");
    }
}
