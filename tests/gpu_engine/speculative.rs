//! Speculative decoding on the GPU: verify steps (several query rows a sequence, through the
//! prefill kernels) and a draft model's passes give plain decoding's greedy output, batched,
//! with the n-gram proposer and with the model drafting for itself.

use super::*;
use pagewise::spec::SpeculativeConfig;

fn args(spec: Option<&str>) -> EngineArgs {
    EngineArgs {
        model: model("tiny-d64"),
        device: DeviceArg::Cuda(0),
        dtype: DtypeArg::Float32,
        max_num_batched_tokens: Some(64),
        speculative_config: spec.map(|s| SpeculativeConfig::parse(s).unwrap()),
        ..Default::default()
    }
}

#[test]
fn speculation_on_the_gpu_keeps_greedy_output() {
    let prompts = prompts(12, 256);
    let params = greedy(48);
    let plain: Vec<Vec<u32>> = Llm::new(args(None))
        .unwrap()
        .generate_tokens(prompts.clone(), &params)
        .unwrap()
        .into_iter()
        .map(|o| o.outputs[0].token_ids.clone())
        .collect();
    let draft = format!(
        r#"{{"model":"{}","num_speculative_tokens":4}}"#,
        model("tiny-d64")
    );
    let ngram = r#"{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_min":1,"prompt_lookup_max":3}"#;
    for spec in [ngram, draft.as_str()] {
        let mut llm = Llm::new(args(Some(spec))).unwrap();
        let outs = llm.generate_tokens(prompts.clone(), &params).unwrap();
        for (i, (out, want)) in outs.iter().zip(&plain).enumerate() {
            assert_eq!(&out.outputs[0].token_ids, want, "{spec}: prompt {i}");
        }
        let s = llm.core().spec_stats();
        eprintln!(
            "{spec}: {} drafts, {} draft tokens, {:.1}% accepted",
            s.num_drafts,
            s.num_draft_tokens,
            100.0 * s.acceptance_rate()
        );
        assert!(s.num_accepted_tokens > 0, "{spec}");
        if spec.contains("\"model\"") {
            assert!(s.acceptance_rate() > 0.9, "drafting for itself: {s:?}");
            let (free, all) = llm.core().draft_block_usage().unwrap();
            assert_eq!(free, all);
        }
    }
}
