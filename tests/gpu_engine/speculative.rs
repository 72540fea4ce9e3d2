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
        r#"{{"model":"{}","num_speculative_tokens":4,"adaptive":false}}"#,
        model("tiny-d64")
    );
    let ngram = r#"{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_min":1,"prompt_lookup_max":3,"adaptive":false}"#;
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

/// An EAGLE-3 head on the GPU (f32) proposes the drafts it proposes on the CPU at every step,
/// reading the target's hidden states from the GPU's eager steps, and the output is plain
/// decoding's.
#[test]
fn an_eagle3_head_on_the_gpu_drafts_as_on_the_cpu() {
    use common::speculation::{drafts_along, write_random_eagle3_head};
    let target = model("tiny-d64");
    let dir = std::env::temp_dir().join(format!("pagewise-gpu-eagle3-{}", std::process::id()));
    write_random_eagle3_head(&target, &dir, 5);
    let spec = format!(
        r#"{{"method":"eagle3","model":"{}","num_speculative_tokens":3,"adaptive":false}}"#,
        dir.display()
    );
    let params = greedy(24);
    let prompts = prompts(4, 256);
    let run = |device, spec: Option<&str>| {
        let mut llm = Llm::new(EngineArgs {
            device,
            ..args(spec)
        })
        .unwrap();
        let runs: Vec<_> = prompts
            .iter()
            .map(|p| drafts_along(&mut llm, p, &params))
            .collect();
        let (free, all) = llm.core().draft_block_usage().unwrap_or((0, 0));
        assert_eq!(free, all, "the head's blocks are all given back");
        runs
    };
    let gpu = run(DeviceArg::Cuda(0), Some(&spec));
    let cpu = run(DeviceArg::Cpu, Some(&spec));
    let plain = run(DeviceArg::Cuda(0), None);
    let rounds: usize = gpu.iter().map(|(r, _)| r.len()).sum();
    eprintln!("eagle3: {rounds} steps' drafts compared");
    assert!(rounds >= 20, "{rounds}");
    for (i, ((g, c), p)) in gpu.iter().zip(&cpu).zip(&plain).enumerate() {
        assert_eq!(g.0, c.0, "prompt {i}: drafts");
        assert_eq!(g.1, p.1, "prompt {i}: output");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// In bf16, where plain decode steps take the fused path inside CUDA graphs, the head reads the
/// hidden states a replay keeps. Four sequences of different lengths run together with no drafts
/// while more than two run (`disable_by_batch_size`): those steps replay graphs, and the head
/// reads their hidden states; the drafts after them are those of the same engine run eagerly.
#[test]
fn an_eagle3_head_reads_hidden_states_from_graph_replays() {
    use common::speculation::write_random_eagle3_head;
    let target = model("tiny-d64");
    let dir = std::env::temp_dir().join(format!("pagewise-gpu-eagle3-bf16-{}", std::process::id()));
    write_random_eagle3_head(&target, &dir, 9);
    let spec = format!(
        r#"{{"method":"eagle3","model":"{}","num_speculative_tokens":2,"disable_by_batch_size":2,"adaptive":false}}"#,
        dir.display()
    );
    let prompts = prompts(4, 256);
    let run = |enforce_eager| {
        let mut llm = Llm::new(EngineArgs {
            dtype: DtypeArg::Bfloat16,
            enforce_eager,
            ..args(Some(&spec))
        })
        .unwrap();
        let core = llm.core_mut();
        for (i, p) in prompts.iter().enumerate() {
            core.add(p.clone(), greedy(12 + 8 * i), None).unwrap();
        }
        let mut drafts = Vec::new();
        while core.has_unfinished() {
            core.step().unwrap();
            for seq in core.scheduler().running() {
                if !seq.spec_tokens().is_empty() {
                    drafts.push((seq.id, seq.num_tokens(), seq.spec_tokens().to_vec()));
                }
            }
        }
        (drafts, core.step_times().graph_steps())
    };
    let (graphs, replays) = run(false);
    let (eager, none) = run(true);
    eprintln!(
        "eagle3 bf16: {replays} graph replays, {} steps' drafts compared",
        graphs.len()
    );
    assert!(replays >= 8 && none == 0, "{replays} / {none}");
    assert!(graphs.len() >= 10, "{}", graphs.len());
    assert_eq!(graphs, eager);
    std::fs::remove_dir_all(&dir).unwrap();
}
