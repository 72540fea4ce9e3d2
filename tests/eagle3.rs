//! Speculative decoding with an EAGLE-3 head, through the library: the drafts the head proposes
//! are those of a reference written from the head's published definition (numpy,
//! tests/fixtures/make_eagle3_head.py, which reads the target's hidden states from a numpy
//! target checked against transformers), at every step of a greedy continuation; greedy output
//! with the head is the output without it, batched under preemption, chunked prefill and prefix
//! hits; and the head's cache is given back.

mod common;

use common::speculation::{drafts_along, same_with_and_without, write_random_eagle3_head};
use pagewise::spec::SpeculativeConfig;
use pagewise::{EngineArgs, Llm, SamplingParams};
use serde_json::Value;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");

fn eagle3(k: usize) -> Option<SpeculativeConfig> {
    Some(
        SpeculativeConfig::parse(&format!(
            r#"{{"method":"eagle3","model":"{FIXTURES}/eagle3-head","num_speculative_tokens":{k},"adaptive":false}}"#
        ))
        .unwrap(),
    )
}

fn greedy(max_tokens: usize) -> SamplingParams {
    SamplingParams {
        temperature: 0.0,
        max_tokens,
        ignore_eos: true,
        ..Default::default()
    }
}

/// Each reference case alone, step by step: after every step the running sequence's drafts are
/// the reference head's for its tokens so far, as many as `max_tokens` leaves room for, and
/// the output is the target's greedy continuation.
#[test]
fn eagle3_drafts_are_the_reference_heads() {
    let expected: Value = serde_json::from_str(
        &std::fs::read_to_string(format!("{FIXTURES}/eagle3-head/expected.json")).unwrap(),
    )
    .unwrap();
    let k = expected["k"].as_u64().unwrap() as usize;
    let mut llm = Llm::new(EngineArgs {
        model: format!("{FIXTURES}/llama-gqa-tied"),
        block_size: 8,
        max_num_batched_tokens: Some(5),
        speculative_config: eagle3(k),
        ..Default::default()
    })
    .unwrap();
    let (mut checked, mut accepted) = (0, 0);
    for case in expected["cases"].as_array().unwrap() {
        let ids = |v: &Value| -> Vec<u32> {
            v.as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_u64().unwrap() as u32)
                .collect()
        };
        let (prompt, want) = (ids(&case["prompt"]), ids(&case["greedy"]));
        let rounds: Vec<(usize, Vec<u32>)> = case["rounds"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| (r["len"].as_u64().unwrap() as usize, ids(&r["drafts"])))
            .collect();
        let core = llm.core_mut();
        core.add(prompt.clone(), greedy(want.len()), None).unwrap();
        let mut output = Vec::new();
        while core.has_unfinished() {
            core.step().unwrap();
            let Some(seq) = core.scheduler().running().first() else {
                continue;
            };
            output = seq.output_tokens().to_vec();
            let drafts = seq.spec_tokens();
            let len = seq.num_tokens();
            let left = want.len() - seq.num_output_tokens();
            let room = left.saturating_sub(1).min(k);
            if seq.num_pending_tokens() != 1 {
                assert!(drafts.is_empty(), "no drafts while reading the prompt");
                continue;
            }
            let (_, reference) = rounds
                .iter()
                .find(|(n, _)| *n == len)
                .unwrap_or_else(|| panic!("no reference round at length {len}"));
            assert_eq!(drafts, &reference[..room], "drafts at length {len}");
            checked += 1;
            accepted += reference[..room]
                .iter()
                .zip(&want[len - prompt.len()..])
                .take_while(|(a, b)| a == b)
                .count();
        }
        // (The last step's tokens finish the sequence, which leaves the running set.)
        assert!(output.len() + k + 1 >= want.len());
        assert_eq!(output, want[..output.len()], "greedy output with the head");
    }
    let stats = llm.core().spec_stats();
    eprintln!(
        "{checked} steps' drafts checked; drafts {}, draft tokens {}, accepted {} (predicted \
         {accepted}), per position {:?}",
        stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens, stats.accepted_per_pos
    );
    assert!(checked >= 20, "{checked} steps checked");
    assert_eq!(stats.num_accepted_tokens, accepted as u64);
    assert!(accepted > 0, "the fixture's head is right some of the time");
    let (free, all) = llm.core().draft_block_usage().unwrap();
    assert_eq!(free, all, "the head's blocks are all given back");
}

#[test]
fn greedy_output_with_an_eagle3_head_is_the_output_without() {
    let llm = same_with_and_without(
        &format!("{FIXTURES}/llama-gqa-tied"),
        512,
        &SamplingParams {
            temperature: 0.0,
            max_tokens: 32,
            ignore_eos: true,
            ..Default::default()
        },
        eagle3(4),
    );
    let (free, all) = llm.core().draft_block_usage().unwrap();
    assert_eq!(free, all, "the head's blocks are all given back");
}

/// A head that does not fit the target, or is not an EAGLE-3 head, is refused by name.
#[test]
fn mismatched_heads_are_refused_by_name() {
    let dir = std::env::temp_dir().join(format!("pagewise-eagle3-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let base: Value = serde_json::from_str(
        &std::fs::read_to_string(format!("{FIXTURES}/eagle3-head/config.json")).unwrap(),
    )
    .unwrap();
    std::fs::copy(
        format!("{FIXTURES}/eagle3-head/model.safetensors"),
        dir.join("model.safetensors"),
    )
    .unwrap();
    for (edit, named) in [
        (
            ("architectures", serde_json::json!(["LlamaForCausalLM"])),
            "not an EAGLE-3 head",
        ),
        (
            ("target_hidden_size", serde_json::json!(96)),
            "hidden states of 96",
        ),
        (
            (
                "eagle_config",
                serde_json::json!({"eagle_aux_hidden_state_layer_ids": [0, 2]}),
            ),
            "below the target's 2",
        ),
        (
            ("eagle_config", serde_json::json!(null)),
            "no default layers",
        ),
        (("vocab_size", serde_json::json!(300)), "vocabulary (300)"),
    ] {
        let mut cfg = base.clone();
        cfg[edit.0] = edit.1.clone();
        std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
        let spec = SpeculativeConfig::parse(&format!(
            r#"{{"method":"eagle3","model":"{}","num_speculative_tokens":2}}"#,
            dir.display()
        ))
        .unwrap();
        let err = Llm::new(EngineArgs {
            model: format!("{FIXTURES}/llama-gqa-tied"),
            speculative_config: Some(spec),
            ..Default::default()
        })
        .err()
        .unwrap_or_else(|| panic!("{edit:?} loaded"))
        .to_string();
        assert!(
            err.contains("EAGLE-3") && err.contains(named),
            "{edit:?}: {err}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A head of the target's whole vocabulary (no `d2t`), reading the layers in another order, as
/// the GPU test writes it: it drafts, and greedy output is the output without it.
#[test]
fn a_full_vocabulary_head_keeps_greedy_output() {
    let target = format!("{FIXTURES}/llama-gqa-tied");
    let dir = std::env::temp_dir().join(format!("pagewise-eagle3-full-{}", std::process::id()));
    write_random_eagle3_head(&target, &dir, 5);
    let spec = SpeculativeConfig::parse(&format!(
        r#"{{"method":"eagle3","model":"{}","num_speculative_tokens":3,"adaptive":false}}"#,
        dir.display()
    ))
    .unwrap();
    let run = |spec: Option<SpeculativeConfig>| {
        let mut llm = Llm::new(EngineArgs {
            model: target.clone(),
            speculative_config: spec,
            ..Default::default()
        })
        .unwrap();
        common::speculation::prompts()[..4]
            .iter()
            .map(|p| drafts_along(&mut llm, p, &greedy(24)))
            .collect::<Vec<_>>()
    };
    let (with, without) = (run(Some(spec)), run(None));
    let rounds: usize = with.iter().map(|(r, _)| r.len()).sum();
    assert!(rounds >= 20, "{rounds} steps drafted");
    for (i, (w, p)) in with.iter().zip(&without).enumerate() {
        assert!(p.0.is_empty());
        assert_eq!(w.1, p.1, "prompt {i}");
        assert_eq!(w.1.len(), 24);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
