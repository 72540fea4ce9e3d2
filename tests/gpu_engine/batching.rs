//! Batches and CUDA graphs on the GPU: prompts batched with chunked prefill, prefix caching and
//! preemption give each prompt's solo tokens; seeded sampling does not depend on the batch;
//! graph replays give the eager steps' tokens.

use super::*;

/// 32 prompts (half sharing a prefix), each alone, then all through one engine with a small
/// token budget (chunked prefill, mixed prefill + decode steps), prefix caching and a cache small
/// enough to preempt: the same greedy tokens, for the model `name` (of tiny-d64's shape). With
/// `rows`, every step of both runs has at most that many rows (sequences and tokens); so few
/// running sequences then never fill the cache, so only prefix hits and freed blocks are
/// checked.
pub(super) fn batch_invariance(
    name: &str,
    dtype: DtypeArg,
    kv_bytes_per_token: u64,
    rows: Option<usize>,
) {
    let prompts = prompts(32, 256);
    let args = |enable_prefix_caching| EngineArgs {
        model: model(name),
        device: DeviceArg::Cuda(0),
        dtype,
        enable_prefix_caching,
        max_num_seqs: rows.unwrap_or(EngineArgs::default().max_num_seqs),
        max_num_batched_tokens: rows,
        ..Default::default()
    };
    let mut solo = Llm::new(args(false)).unwrap();
    let expected: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| {
            solo.generate_tokens(vec![p.clone()], &greedy(24)).unwrap()[0].outputs[0]
                .token_ids
                .clone()
        })
        .collect();
    // 40 blocks of 16 tokens (the cache must hold one sequence of max_model_len: checked at
    // startup).
    let mut batched = Llm::new(EngineArgs {
        max_num_batched_tokens: rows.or(Some(48)),
        kv_cache_memory: Some(40 * 16 * kv_bytes_per_token),
        max_model_len: Some(256),
        ..args(true)
    })
    .unwrap();
    let outs = batched.generate_tokens(prompts, &greedy(24)).unwrap();
    for (i, (out, want)) in outs.iter().zip(&expected).enumerate() {
        assert_eq!(&out.outputs[0].token_ids, want, "{dtype:?}: prompt {i}");
    }
    if rows.is_none() {
        common::assert_preempted_cached_and_freed(&batched, &format!("GPU {dtype:?}: "));
    } else {
        let kv = batched.core().scheduler().kv();
        assert!(kv.prefix_cache_stats().num_hit_tokens > 0);
        assert_eq!(kv.pool().num_free(), kv.pool().num_usable());
    }
}

/// A quantized checkpoint `name` of tiny-d64's shape (1 KiB of bf16 KV per token) whose steps of
/// at most 8 rows take its own GEMVs: the same greedy tokens batched as alone among such steps
/// ([`batch_invariance`] with 8-row steps), and graph replays equal to eager steps for 1, 3 and
/// 16 prompts (the first run's decode steps all replays). `label` names it in the log.
pub(super) fn small_steps_batch_and_replay(name: &str, label: &str) {
    batch_invariance(name, DtypeArg::Bfloat16, 1024, Some(8));
    let (mut eager, mut graphs) = bf16_eager_and_graphs(model(name));
    let replays = graph_replays_equal_eager(&mut eager, &mut graphs, &[1, 3, 16]);
    eprintln!("{label}: (graph replays, steps) per run: {replays:?}");
    assert_eq!(replays[0], (23, 24));
}

#[test]
fn batched_chunked_cached_preempted_equals_solo_on_the_gpu() {
    // 2 layers x 2 KV heads x 64 dims x K,V: 2 KiB per token in f32, 1 KiB in bf16.
    batch_invariance("tiny-d64", DtypeArg::Float32, 2048, None);
    // bf16 runs the tensor-core prefill kernel and mixed prefill + decode steps.
    batch_invariance("tiny-d64", DtypeArg::Bfloat16, 1024, None);
}

#[test]
fn seeded_sampling_on_the_gpu_is_reproducible_and_batch_independent() {
    let mut llm = Llm::new(EngineArgs {
        model: model("tiny-d64"),
        device: DeviceArg::Cuda(0),
        ..Default::default()
    })
    .unwrap();
    let params = SamplingParams {
        temperature: 0.9,
        seed: Some(42),
        ..greedy(24)
    };
    let prompts = prompts(6, 256);
    let alone = llm
        .generate_tokens(vec![prompts[3].clone()], &params)
        .unwrap();
    let batch = llm.generate_tokens(prompts, &params).unwrap();
    assert_eq!(batch[3].outputs[0].token_ids, alone[0].outputs[0].token_ids);
    let unseeded = SamplingParams {
        seed: None,
        ..params.clone()
    };
    let a = llm
        .generate_tokens(vec![vec![5; 10]; 4], &unseeded)
        .unwrap();
    let distinct: std::collections::HashSet<_> =
        a.iter().map(|o| o.outputs[0].token_ids.clone()).collect();
    assert!(distinct.len() > 1, "unseeded draws must differ");
}

/// An eager engine and one with CUDA graphs on `model`, in bf16 with up to 16 sequences: the
/// pair [`graph_replays_equal_eager`] compares.
pub(super) fn bf16_eager_and_graphs(model: String) -> (Llm, Llm) {
    let args = |enforce_eager| EngineArgs {
        model: model.clone(),
        device: DeviceArg::Cuda(0),
        dtype: DtypeArg::Bfloat16,
        enforce_eager,
        max_num_seqs: 16,
        ..Default::default()
    };
    (
        Llm::new(args(true)).unwrap(),
        Llm::new(args(false)).unwrap(),
    )
}

/// For each `n` of `counts`, `n` prompts decoded greedily for 24 tokens by `eager` and by
/// `graphs`, which must give the same tokens; returns each run's (graph replays, steps) of
/// `graphs`.
pub(super) fn graph_replays_equal_eager(
    eager: &mut Llm,
    graphs: &mut Llm,
    counts: &[usize],
) -> Vec<(u64, u64)> {
    let mut replays = Vec::new();
    for &n in counts {
        let prompts = prompts(n, 256);
        let want = eager.generate_tokens(prompts.clone(), &greedy(24)).unwrap();
        graphs.core_mut().reset_step_times();
        let got = graphs.generate_tokens(prompts, &greedy(24)).unwrap();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                g.outputs[0].token_ids, w.outputs[0].token_ids,
                "{n} prompts: prompt {i}"
            );
        }
        let times = graphs.core().step_times().per_step();
        replays.push((times.graph_steps, times.steps));
    }
    replays
}

#[test]
fn cuda_graph_decode_steps_equal_eager_steps() {
    let args = |enforce_eager| EngineArgs {
        model: model("tiny-d64"),
        device: DeviceArg::Cuda(0),
        dtype: DtypeArg::Float32,
        enforce_eager,
        max_num_seqs: 16,
        // Prompts reach 110 + 24 tokens: the longest sequences outgrow the graphs (7 blocks of
        // 16) mid-run and finish their decode eagerly.
        max_seq_len_to_capture: 112,
        ..Default::default()
    };
    let mut eager = Llm::new(args(true)).unwrap();
    let mut graphs = Llm::new(args(false)).unwrap();
    // 1 and 16 fill a bucket; 3 and 13 pad up to 4 and 16; sequences finish and the batch
    // shrinks across buckets as they go.
    let replays = graph_replays_equal_eager(&mut eager, &mut graphs, &[1, 3, 13, 16]);
    eprintln!("(graph replays, steps) per run: {replays:?}");
    // One prompt: a prefill step, then 23 decode steps, every one a replay.
    assert_eq!(replays[0], (23, 24));
    assert!(replays.iter().all(|&(g, _)| g > 0), "{replays:?}");
    // Some decode steps ran eagerly: a sequence longer than max_seq_len_to_capture.
    assert!(replays.iter().any(|&(g, s)| g + 1 < s), "{replays:?}");
    assert_eq!(eager.core().step_times().per_step().graph_steps, 0);
}

/// Prompt logprobs on the GPU (prompts in chunks of 16 tokens, batched with others' decode
/// steps): the CPU's, for every prompt token.
#[test]
fn prompt_logprobs_on_the_gpu_equal_the_cpus() {
    let args = |device| EngineArgs {
        model: model("tiny-d64"),
        device,
        dtype: DtypeArg::Float32,
        max_num_batched_tokens: Some(16),
        ..Default::default()
    };
    let params = SamplingParams {
        prompt_logprobs: Some(2),
        ..greedy(4)
    };
    let prompts = prompts(6, 256);
    let want = Llm::new(args(DeviceArg::Cpu))
        .unwrap()
        .generate_tokens(prompts.clone(), &params)
        .unwrap();
    let got = Llm::new(args(DeviceArg::Cuda(0)))
        .unwrap()
        .generate_tokens(prompts.clone(), &params)
        .unwrap();
    let mut entries = 0;
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.outputs[0].token_ids, w.outputs[0].token_ids, "prompt {i}");
        let (g, w) = (
            g.prompt_logprobs.as_ref().unwrap(),
            w.prompt_logprobs.as_ref().unwrap(),
        );
        assert_eq!(g.len(), prompts[i].len());
        for (j, (g, w)) in g.iter().zip(w).enumerate().skip(1) {
            let (g, w) = (g.as_ref().unwrap(), w.as_ref().unwrap());
            assert!(
                (g.logprob - w.logprob).abs() < 1e-3,
                "prompt {i} token {j}: {g:?} {w:?}"
            );
            entries += 1;
        }
    }
    println!("prompt logprobs: {entries} entries equal the CPU's");
}
