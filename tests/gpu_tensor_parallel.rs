//! Tensor parallelism on the GPUs the test sees (built only with `--features nccl`; run on
//! `nvidia-h200-x2` by scripts/gpu/tp.sh, and as it is on 4 or 8 GPUs: the group takes the
//! largest TP size that fits them). Each rank is a thread with its own GPU and an NCCL
//! communicator, as the CPU tests (tests/tensor_parallel.rs) do with a thread group: TP=N logits
//! of the random
//! Llama-3.2-1B shape (scripts/gpu/make_gpu_models.py) must match TP=1's and transformers',
//! for a prefill and for a one-token decode step (the fused decode path); gpt-oss's (bf16 and
//! MXFP4 experts) and Gemma 3's TP=N logits must match their TP=1 ones, and the mixtures' with
//! their experts held whole (expert parallelism) too. The multi-process
//! engine (plans over TCP, graphs, server) is checked end to end by scripts/gpu/tp_check.py.
#![cfg(feature = "nccl")]

mod common;

use candle_core::{DType, Device, Tensor};
use common::{rel_err, same_argmax};
use pagewise::loader::{self, GgufMatmul, LoadFormat, LoadOptions};
use pagewise::model::{self, ForwardBatch, KvCache, KvLayout};
use pagewise::parallel::nccl::{NcclComm, unique_id};
use pagewise::parallel::{Parallel, TpRank};
use pagewise::scheduler::{ScheduledSeq, SchedulerOutput};
use pagewise::sequence::SeqId;

fn model_dir(name: &str) -> String {
    let dir = std::env::var("PAGEWISE_GPU_MODELS")
        .expect("set PAGEWISE_GPU_MODELS to the output of scripts/gpu/make_gpu_models.py");
    format!("{dir}/{name}")
}

const BS: usize = 16;

/// One sequence's step: tokens at positions `start..start + tokens.len()`, blocks 1.. in order.
fn step(tokens: &[u32], start: usize) -> SchedulerOutput {
    let end = start + tokens.len();
    let table: Vec<u32> = (1..=end.div_ceil(BS) as u32).collect();
    SchedulerOutput {
        seqs: vec![ScheduledSeq {
            seq_id: SeqId(0),
            num_computed_tokens: start,
            num_new_tokens: tokens.len(),
            num_draft_tokens: 0,
            tokens: 0..tokens.len(),
            block_table: 0..table.len(),
            samples: true,
            num_prompt_rows: 0,
        }],
        token_ids: tokens.to_vec(),
        positions: (start as u32..end as u32).collect(),
        slot_mapping: (start..end)
            .map(|p| table[p / BS] * BS as u32 + (p % BS) as u32)
            .collect(),
        block_tables: table,
        preempted: Vec::new(),
        ..SchedulerOutput::default()
    }
}

/// Rank `par.rank`'s f32 logits of model `name`: every position of a prefill of `prompt`, then
/// one decode step of `next` (last row).
fn rank_logits(
    name: &str,
    par: &Parallel,
    device: &Device,
    prompt: &[u32],
    next: u32,
) -> Vec<Vec<f32>> {
    let path = model_dir(name);
    let opts = LoadOptions {
        load_format: LoadFormat::Auto,
        dtype: DType::BF16,
        device: device.clone(),
        gguf_matmul: GgufMatmul::Auto,
        seed: 0,
        quantization: None,
    };
    let loaded = loader::load(&path, &opts).unwrap();
    let cfg = &loaded.config;
    let n = prompt.len() + 1;
    let m = model::build_sharded(cfg, &loaded.weights, n, par).unwrap();
    let layout = KvLayout {
        num_blocks: n.div_ceil(BS) + 1,
        block_size: BS,
        num_kv_heads: cfg.kv_heads(par.rank).len(),
        head_dim: cfg.head_dim,
    };
    let mut kv = KvCache::on_device(layout, cfg.num_hidden_layers, DType::BF16, device).unwrap();
    let out = step(prompt, 0);
    let mut batch = ForwardBatch::new(&out, device).unwrap();
    let rows: Vec<u32> = (0..prompt.len() as u32).collect();
    batch.sample_rows = Tensor::from_slice(&rows, rows.len(), device).unwrap();
    batch.num_sample_rows = rows.len();
    let mut logits = m
        .forward(&batch, &mut kv)
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
    let out = step(&[next], prompt.len());
    let batch = ForwardBatch::new(&out, device).unwrap();
    logits.extend(
        m.forward(&batch, &mut kv)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap(),
    );
    logits
}

/// The largest tensor-parallel size the visible GPUs hold (at least 2: the test needs two).
fn group_size() -> usize {
    let gpus = candle_core::cuda_backend::cudarc::driver::CudaContext::device_count()
        .expect("CUDA devices") as usize;
    let size = pagewise::parallel::TP_SIZES
        .into_iter()
        .filter(|&n| n <= gpus)
        .max()
        .unwrap_or(1);
    assert!(
        size >= 2,
        "tensor parallelism needs two GPUs, {gpus} visible"
    );
    size
}

/// Model `name`'s logits at TP=1 on GPU 0, and every rank's at TP=`size` (threads, one GPU and
/// NCCL communicator each).
fn tp1_and_ranks(
    name: &str,
    size: usize,
    prompt: &[u32],
    next: u32,
) -> (Vec<Vec<f32>>, Vec<Vec<Vec<f32>>>) {
    one_and_ranks(name, (size, false), prompt, next)
}

/// [`tp1_and_ranks`], a mixture's experts held whole by the ranks when `expert_parallel`.
fn one_and_ranks(
    name: &str,
    (size, expert_parallel): (usize, bool),
    prompt: &[u32],
    next: u32,
) -> (Vec<Vec<f32>>, Vec<Vec<Vec<f32>>>) {
    let gpu0 = Device::new_cuda(0).unwrap();
    let tp1 = rank_logits(name, &Parallel::single(), &gpu0, prompt, next);
    drop(gpu0);
    let id = unique_id().unwrap();
    let ranks = std::thread::scope(|s| {
        let handles: Vec<_> = (0..size)
            .map(|rank| {
                let id = id.clone();
                s.spawn(move || {
                    let device = Device::new_cuda(rank).unwrap();
                    let tp = TpRank { rank, size };
                    let comm = NcclComm::new(&device, tp, &id).unwrap();
                    let par = Parallel::new(tp, std::sync::Arc::new(comm))
                        .with_expert_parallel(expert_parallel);
                    rank_logits(name, &par, &device, prompt, next)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    (tp1, ranks)
}

/// gpt-oss (gptoss-d64: 8 experts of 128, so a rank of 2 keeps 64 intermediate columns of each,
/// whole MXFP4 runs) with bf16 experts and with MXFP4 experts read as they are, and Gemma 3
/// (gemma3-d256: head dim 256, norms after o and the MLP on the summed outputs; its decode step
/// takes the fused path): TP=N's logits within bf16's noise of TP=1's (which the single-GPU
/// tests hold to the CPU), top-1 nearly always the same.
#[test]
fn tp_gpt_oss_and_gemma3_match_tp1() {
    let size = group_size();
    let prompt: Vec<u32> = (0..40).map(|i| (i * 37 + 11) % 300).collect();
    for name in ["gptoss-d64", "gptoss-d64-mxfp4", "gemma3-d256"] {
        let (tp1, ranks) = tp1_and_ranks(name, size, &prompt, 42);
        let err = rel_err(&ranks[0], &tp1);
        let agree = same_argmax(&tp1, &ranks[0]);
        eprintln!(
            "{name}: TP={size} vs TP=1 rel. err {err:.2e}, top-1 {agree}/{}",
            tp1.len()
        );
        assert!(ranks.iter().all(|r| r == &ranks[0]), "{name}: ranks differ");
        assert!(err < 3e-2, "{name}: TP={size} drifted from TP=1: {err}");
        assert!(
            agree * 10 >= tp1.len() * 9,
            "{name}: top-1 {agree}/{}",
            tp1.len()
        );
    }
}

/// Expert parallelism over NCCL (`--enable-expert-parallel`): each rank holds whole experts
/// (Qwen3-MoE's 8 experts of 128, gpt-oss's 8 with bf16 and with MXFP4 experts), attention split
/// as under TP; the logits of a prefill and a decode step within bf16's noise of one GPU's.
#[test]
fn ep_mixtures_match_one_gpu() {
    let size = group_size();
    let prompt: Vec<u32> = (0..40).map(|i| (i * 37 + 11) % 300).collect();
    for name in ["qwen3moe-d128", "gptoss-d64", "gptoss-d64-mxfp4"] {
        let (one, ranks) = one_and_ranks(name, (size, true), &prompt, 42);
        let err = rel_err(&ranks[0], &one);
        let agree = same_argmax(&one, &ranks[0]);
        eprintln!(
            "{name}: EP={size} vs one GPU rel. err {err:.2e}, top-1 {agree}/{}",
            one.len()
        );
        assert!(ranks.iter().all(|r| r == &ranks[0]), "{name}: ranks differ");
        assert!(err < 3e-2, "{name}: EP={size} drifted from one GPU: {err}");
        assert!(
            agree * 10 >= one.len() * 9,
            "{name}: top-1 {agree}/{}",
            one.len()
        );
    }
}

#[test]
fn tp_logits_match_tp1_and_transformers() {
    let size = group_size();
    let path = model_dir("llama-1b");
    let common::HfReference {
        tokens, logits: hf, ..
    } = common::hf_reference(&path);
    let seq = &tokens[0];
    let (prompt, next) = (&seq[..seq.len() - 1], seq[seq.len() - 1]);
    let (tp1, ranks) = tp1_and_ranks("llama-1b", size, prompt, next);
    let want = &hf[0];
    let (e1, e2) = (rel_err(&tp1, want), rel_err(&ranks[0], want));
    let e12 = rel_err(&ranks[0], &tp1);
    let decode_e = rel_err(&ranks[0][prompt.len()..], &tp1[prompt.len()..]);
    let agree = same_argmax(&tp1, &ranks[0]);
    eprintln!(
        "TP={size} vs TP=1 rel. err {e12:.2e} (decode step {decode_e:.2e}); against \
         transformers TP=1 {e1:.2e}, TP={size} {e2:.2e}; top-1 agreement {agree}/{}",
        tp1.len()
    );
    assert!(
        ranks.iter().all(|r| r == &ranks[0]),
        "every rank holds the same gathered logits"
    );
    // bf16 with the sums in another order: TP=N may differ from TP=1 by about as much as bf16
    // itself differs from transformers' f32 (e1), and must be no further from transformers.
    let noise = e1.max(1e-2);
    assert!(
        e12 < 2.0 * noise,
        "TP={size} drifted from TP=1: {e12} (bf16 noise {e1})"
    );
    assert!(
        decode_e < 2.0 * noise,
        "the decode step drifted: {decode_e}"
    );
    assert!(
        e2 < 1.25 * noise,
        "TP={size} is further from transformers: {e2} vs {e1}"
    );
}
