//! Output with and without speculative decoding, batched under pressure: shared by the tests of
//! each proposer.
#![allow(dead_code)]

use pagewise::sampler::SeededRng;
use pagewise::spec::SpeculativeConfig;
use pagewise::{EngineArgs, Llm, SamplingParams};

/// 24 prompts, half sharing a prefix, some repeating a pattern (so the proposer finds drafts
/// from the start).
pub fn prompts() -> Vec<Vec<u32>> {
    let mut rng = SeededRng::new(7, 0);
    let mut tok = || (rng.next_u64() % 250) as u32 + 1;
    let shared: Vec<u32> = (0..24).map(|_| tok()).collect();
    (0..24)
        .map(|i| {
            let tail: Vec<u32> = (0..1 + (i * 5) % 30).map(|_| tok()).collect();
            let p = match i % 3 {
                0 => [shared.clone(), tail].concat(),
                1 => tail,
                _ => [tail.clone(), tail.clone(), tail].concat(),
            };
            p.into_iter().take(60).collect()
        })
        .collect()
}

/// Each prompt's output alone without speculation, then all of them batched with `spec` in a
/// small cache (chunked prefill, preemption, prefix hits): the same tokens. Returns the batched
/// engine.
pub fn same_with_and_without(
    model: &str,
    kv_bytes_per_token: u64,
    params: &SamplingParams,
    spec: Option<SpeculativeConfig>,
) -> Llm {
    let prompts = prompts();
    let mut plain = Llm::new(EngineArgs {
        model: model.into(),
        ..Default::default()
    })
    .unwrap();
    let expected: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| {
            plain.generate_tokens(vec![p.clone()], params).unwrap()[0].outputs[0]
                .token_ids
                .clone()
        })
        .collect();
    let mut spec = Llm::new(EngineArgs {
        model: model.into(),
        block_size: 8,
        max_num_batched_tokens: Some(24),
        kv_cache_memory: Some(30 * 8 * kv_bytes_per_token),
        max_model_len: Some(128),
        speculative_config: spec,
        ..Default::default()
    })
    .unwrap();
    let outs = spec.generate_tokens(prompts.clone(), params).unwrap();
    for (i, (out, want)) in outs.iter().zip(&expected).enumerate() {
        assert_eq!(&out.outputs[0].token_ids, want, "prompt {i}");
    }
    let stats = spec.core().spec_stats();
    eprintln!(
        "drafts {}, draft tokens {}, accepted {} ({:.0}%), per position {:?}",
        stats.num_drafts,
        stats.num_draft_tokens,
        stats.num_accepted_tokens,
        100.0 * stats.acceptance_rate(),
        stats.accepted_per_pos
    );
    assert!(
        stats.num_accepted_tokens > 0,
        "some drafts must be accepted"
    );
    assert!(
        stats.num_accepted_tokens < stats.num_draft_tokens,
        "some drafts must be rejected"
    );
    super::assert_preempted_cached_and_freed(&spec, "");
    spec
}
