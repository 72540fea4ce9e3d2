//! The mixtures of experts on the GPU (part of the gpu_engine test binary): decode steps in CUDA
//! graphs equal eager ones; gpt-oss's MXFP4 experts read as they are against the CPU.

use candle_core::{DType, Device};
use pagewise::engine::device::DeviceArg;
use pagewise::loader::GgufMatmul;
use pagewise::{DtypeArg, EngineArgs, Llm};

use super::batching::graph_replays_equal_eager;
use super::common::{self, rel_err};
use super::{gpu, model, prompts, top1_agreement};

/// A mixture of experts in bf16: decode steps of up to `moe::DEVICE_TOKENS` sequences route
/// on the device (`moe_device.rs`), so they are captured in CUDA graphs, and replaying them gives
/// the eager steps' tokens; larger batches run eagerly (the grouped GEMMs, routed on the device).
/// gpt-oss's experts (biases, the clamped SwiGLU) and attention with sinks take the same path.
#[test]
fn moe_decode_steps_in_cuda_graphs_equal_eager_steps() {
    for name in ["qwen3moe-d128", "gptoss-d64"] {
        moe_graphs_equal_eager(name, false);
    }
}

/// gpt-oss with MXFP4 experts, read as they are by the GPU's kernels in bf16 (dequantized at
/// load on the CPU): in llama.cpp's layout (gptoss-d64's experts quantized by
/// tests/fixtures/make_gptoss_gguf.py) and as gpt-oss's safetensors ship them (`_blocks` and
/// `_scales`, by tests/fixtures/make_gptoss_mxfp4.py), within bf16's error of the same files on
/// the CPU in f32 (a 100-token prefill on tensor cores, `moe_experts_fp4_mma`, its slots sorted by
/// expert on the device; a 300-token one with the experts it routes to dequantized for the
/// grouped GEMMs); and their decode steps in CUDA graphs equal eager ones, up to
/// `moe::MXFP4_DEVICE_TOKENS` sequences a step (past `moe::MXFP4_TOKEN_KERNEL_TOKENS` = 4 on
/// tensor cores), where dense experts stop at 8.
#[test]
fn gpt_oss_mxfp4_on_the_gpu_matches_the_cpu() {
    for name in ["gptoss-d64/model-MXFP4.gguf", "gptoss-d64-mxfp4"] {
        // 100 tokens on tensor cores, 300 past MXFP4_DEVICE_TOKENS in the grouped GEMMs.
        for len in [100, 300] {
            gpt_oss_matches_the_cpu(&model(name), len);
        }
        moe_graphs_equal_eager(name, true);
    }
}

fn gpt_oss_matches_the_cpu(path: &str, len: usize) {
    let tokens: Vec<u32> = prompts(1, 256)[0]
        .iter()
        .copied()
        .cycle()
        .take(len)
        .collect();
    let on = |device: &Device, dtype| {
        common::logits_at_every_position_on(path, GgufMatmul::Auto, &tokens, device, dtype)
    };
    let want = on(&Device::Cpu, DType::F32);
    let got = on(&gpu(), DType::BF16);
    let err = rel_err(&got, &want);
    let (agree, decisive) = top1_agreement(&got, &want);
    eprintln!("{path}, GPU bf16 vs CPU f32: rel. err. {err:.2e}, top-1 {agree}/{decisive}");
    assert!(err < 1e-1, "{err}");
    assert!(agree as f64 >= 0.95 * decisive as f64, "{agree}/{decisive}");
}

/// `mxfp4`: the model's experts are MXFP4 (8 of them, top 2), whose device path takes every
/// step of these runs' 16 sequences.
fn moe_graphs_equal_eager(name: &str, mxfp4: bool) {
    let args = |enforce_eager| EngineArgs {
        model: model(name),
        device: DeviceArg::Cuda(0),
        dtype: DtypeArg::Bfloat16,
        enforce_eager,
        max_num_seqs: 16,
        // A small step leaves room for gpt-oss's window group (its sliding layers' own blocks),
        // whose slots and tables the graphs then stage too.
        max_num_batched_tokens: Some(256),
        ..Default::default()
    };
    let mut eager = Llm::new(args(true)).unwrap();
    let mut graphs = Llm::new(args(false)).unwrap();
    let windowed = graphs.core().scheduler().kv().window().is_some();
    assert_eq!(
        windowed,
        name.starts_with("gptoss"),
        "{name}: a window group"
    );
    let replays = graph_replays_equal_eager(&mut eager, &mut graphs, &[1, 5, 12]);
    eprintln!("{name} (graph replays, steps) per run: {replays:?}");
    assert_eq!(replays[0], (23, 24));
    assert!(replays[1].0 > 0, "{replays:?}");
    let (replayed, steps) = replays[2];
    if mxfp4 {
        // Twelve sequences fit the captured batches: only the steps that prefill (their 620
        // prompt tokens in steps of 256) run eagerly.
        assert!(steps - replayed <= 4, "{replays:?}");
    } else {
        // Twelve sequences are past the captured batches until eight or fewer remain.
        assert!(replayed + 4 < steps, "{replays:?}");
    }
}

/// Expert parallelism with two ranks on one GPU (threads, each on its own stream, joined by a
/// thread group's all-reduce): each rank holds half the experts whole, and its stack takes routes
/// remapped to its experts (`MoeRoutes::held`). A 39-token prefill (the grouped GEMMs for dense
/// experts; MXFP4 experts on tensor cores) and a decode step (the expert kernels), the two ranks
/// bit for bit alike, against the whole model on the same GPU: no further from it than the same
/// split with every expert sliced (tensor parallelism), whose distance is bf16's rounding of the
/// ranks' partial sums; top-1 mostly the same.
#[test]
fn expert_parallel_ranks_on_one_gpu_match_the_whole_model() {
    use super::common::sharded::{On, rank_logits_on, sharded_logits_on};
    use pagewise::loader::LoadFormat;
    use pagewise::parallel::Parallel;
    let on = On {
        device: gpu(),
        dtype: DType::BF16,
    };
    let tokens: Vec<u32> = prompts(1, 256)[0].iter().copied().take(40).collect();
    let mut failures = Vec::new();
    for name in ["qwen3moe-d128", "gptoss-d64", "gptoss-d64-mxfp4"] {
        let path = model(name);
        let whole = rank_logits_on(&path, LoadFormat::Auto, &tokens, &Parallel::single(), &on);
        let split = |ep| sharded_logits_on(&path, LoadFormat::Auto, &tokens, (2, ep), &on);
        let (tp, ep) = (split(false), split(true));
        let (tp_err, ep_err) = (rel_err(&tp[0], &whole), rel_err(&ep[0], &whole));
        let (agree, decisive) = top1_agreement(&ep[0], &whole);
        eprintln!(
            "{name}: against one rank, rel. err TP=2 {tp_err:.2e}, EP=2 {ep_err:.2e}; EP top-1 \
             {agree}/{decisive}"
        );
        if ep[0] != ep[1] || ep_err > 1.5 * tp_err.max(1e-2) || agree * 100 < decisive * 85 {
            failures.push(name);
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
}
