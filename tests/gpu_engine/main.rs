//! The whole engine on a GPU (built only with `--features cuda`; run on the H200 by
//! scripts/gpu/run.sh). The models are made on that machine by scripts/gpu/make_gpu_models.py
//! into `$PAGEWISE_GPU_MODELS`: a tiny Llama with GPU head dims and a random Llama-3.2-1B shape
//! with transformers' logits.
#![cfg(feature = "cuda")]

mod architectures;
mod batching;
#[path = "../common/mod.rs"]
mod common;
mod fp8;
mod gguf;
mod int4;
mod kv_fp8;
mod moe;
mod speculative;

use candle_core::{DType, Device};
use common::{argmax, greedy, rel_err};
use pagewise::engine::device::DeviceArg;
use pagewise::loader::GgufMatmul;
use pagewise::sampler::SeededRng;
use pagewise::{DtypeArg, EngineArgs, Llm, SamplingParams};

fn model(name: &str) -> String {
    let dir = std::env::var("PAGEWISE_GPU_MODELS")
        .expect("set PAGEWISE_GPU_MODELS to the output of scripts/gpu/make_gpu_models.py");
    format!("{dir}/{name}")
}

fn gpu() -> Device {
    Device::new_cuda(0).expect("a CUDA GPU")
}

fn prompts(n: usize, vocab: u64) -> Vec<Vec<u32>> {
    let mut rng = SeededRng::new(7, 0);
    let mut tok = || (rng.next_u64() % vocab) as u32;
    let shared: Vec<u32> = (0..40).map(|_| tok()).collect();
    (0..n)
        .map(|i| {
            let tail: Vec<u32> = (0..1 + (i * 13) % 70).map(|_| tok()).collect();
            if i % 2 == 0 {
                [shared.clone(), tail].concat()
            } else {
                tail
            }
        })
        .collect()
}

/// One prompt (41 tokens) longer than the step's token budget (16), alone: its first chunks are steps where no
/// sequence samples (a placeholder row on the GPU), and the tokens equal the CPU's.
#[test]
fn a_lone_prompt_in_chunks_on_the_gpu_equals_the_cpu() {
    let args = |device| EngineArgs {
        model: model("tiny-d64"),
        device,
        dtype: DtypeArg::Float32,
        max_num_batched_tokens: Some(16),
        ..Default::default()
    };
    let prompt = prompts(1, 256);
    let mut cpu = Llm::new(args(DeviceArg::Cpu)).unwrap();
    let mut gpu = Llm::new(args(DeviceArg::Cuda(0))).unwrap();
    let want = cpu.generate_tokens(prompt.clone(), &greedy(8)).unwrap();
    let got = gpu.generate_tokens(prompt, &greedy(8)).unwrap();
    assert_eq!(got[0].outputs[0].token_ids, want[0].outputs[0].token_ids);
}

#[test]
fn gpu_float32_greedy_tokens_equal_the_cpu_reference() {
    for name in ["tiny-d64", "phi4mini-d64", "gemma3-d256", "qwen3moe-d128"] {
        let args = |device| EngineArgs {
            model: model(name),
            device,
            dtype: DtypeArg::Float32,
            ..Default::default()
        };
        let prompts = prompts(8, 256);
        let mut cpu = Llm::new(args(DeviceArg::Cpu)).unwrap();
        let mut gpu = Llm::new(args(DeviceArg::Cuda(0))).unwrap();
        let want = cpu.generate_tokens(prompts.clone(), &greedy(32)).unwrap();
        let got = gpu.generate_tokens(prompts, &greedy(32)).unwrap();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                g.outputs[0].token_ids, w.outputs[0].token_ids,
                "{name}, prompt {i}"
            );
        }
    }
}

#[test]
fn gpu_bfloat16_logits_stay_close_to_the_cpu_float32_logits() {
    let tokens: Vec<u32> = prompts(1, 256)[0]
        .iter()
        .copied()
        .cycle()
        .take(300)
        .collect();
    // phi4mini-d64 turns 3/4 of each head (partial rotary): the unfused route.
    for name in ["tiny-d64", "phi4mini-d64"] {
        let path = model(name);
        let on = |device: &Device, dtype| {
            common::logits_at_every_position_on(&path, GgufMatmul::Auto, &tokens, device, dtype)
        };
        let want = on(&Device::Cpu, DType::F32);
        let (f32_gpu, bf16_gpu) = (on(&gpu(), DType::F32), on(&gpu(), DType::BF16));
        let (e32, e16) = (rel_err(&f32_gpu, &want), rel_err(&bf16_gpu, &want));
        eprintln!("{name}, 300 positions: rel. err. f32 GPU {e32:.2e}, bf16 GPU {e16:.2e}");
        assert!(e32 < 1e-4, "{name}, f32 on the GPU: {e32}");
        // bf16 keeps 8 bits of mantissa; these models' large random weights (std 0.1) amplify it.
        assert!(e16 < 5e-2, "{name}, bf16 on the GPU: {e16}");
    }
}

/// Decode steps of as many rows as the fused path takes (`decode_fused::MAX_ROWS`) in bf16
/// against the CPU's f32 prefill logits: the step-by-step path (the GEMV kernels with the norms,
/// SiLU-and-mul and residual adds folded in) takes every step and stays within bf16's error.
#[test]
fn bfloat16_decode_steps_stay_close_to_the_cpu_float32_logits() {
    let path = model("tiny-d64");
    let rows = pagewise::model::decode_fused::MAX_ROWS;
    let seqs: Vec<Vec<u32>> = (0..rows)
        .map(|i| {
            (0..40)
                .map(|p| ((p * 31 + i * 97 + 7) % 256) as u32)
                .collect()
        })
        .collect();
    let fused_rows = common::fused_decode_rows(&path, &gpu(), DType::BF16, None);
    assert_eq!(fused_rows, rows, "every step must take the fused path");
    let got = common::logits_decoding_step_by_step(&path, &seqs, &gpu(), DType::BF16);
    let label = format!("tiny-d64, 40 decode steps of {rows} rows (fused)");
    assert_decode_near_the_cpu(&label, &path, &seqs, &got);
}

/// Each sequence's bf16 decode-step logits `got` within 5e-2 (relative) of the CPU's f32
/// prefill logits of the same tokens.
fn assert_decode_near_the_cpu(label: &str, path: &str, seqs: &[Vec<u32>], got: &[Vec<Vec<f32>>]) {
    for (i, s) in seqs.iter().enumerate() {
        let want = common::logits_at_every_position_on(
            path,
            GgufMatmul::Auto,
            s,
            &Device::Cpu,
            DType::F32,
        );
        let err = rel_err(&got[i], &want);
        eprintln!("{label}, sequence {i}: rel. err. {err:.2e}");
        assert!(err < 5e-2, "{label}, sequence {i}: {err}");
    }
}

/// Teacher-forced top-1 agreement of `got` with `want` over the positions where `want`'s top-1
/// leads its top-2 by more than 0.1: (agreeing, decisive positions).
fn top1_agreement(got: &[Vec<f32>], want: &[Vec<f32>]) -> (usize, usize) {
    let (mut agree, mut decisive) = (0, 0);
    for (g, w) in got.iter().zip(want) {
        let top = argmax(w);
        let second = (0..w.len())
            .filter(|&i| i != top)
            .fold(f32::NEG_INFINITY, |m, i| m.max(w[i]));
        if w[top] - second > 0.1 {
            decisive += 1;
            agree += usize::from(argmax(g) == top);
        }
    }
    (agree, decisive)
}

#[test]
fn llama_1b_shape_matches_transformers() {
    let path = model("llama-1b");
    let common::HfReference {
        tokens,
        logits: hf,
        logits_bf16: hf_bf16,
    } = common::hf_reference(&path);
    let run = |dtype| -> Vec<Vec<Vec<f32>>> {
        tokens
            .iter()
            .map(|seq| {
                common::logits_at_every_position_on(&path, GgufMatmul::Auto, seq, &gpu(), dtype)
            })
            .collect()
    };
    let flat = |x: &[Vec<Vec<f32>>]| x.concat();
    let (hf, hf_bf16) = (flat(&hf), flat(&hf_bf16));
    let ours_f32 = flat(&run(DType::F32));
    let ours_bf16 = flat(&run(DType::BF16));

    let e_f32 = rel_err(&ours_f32, &hf);
    let e_bf16 = rel_err(&ours_bf16, &hf);
    let e_hf_bf16 = rel_err(&hf_bf16, &hf);
    let (a_ours, d) = top1_agreement(&ours_bf16, &hf);
    let (a_hf, _) = top1_agreement(&hf_bf16, &hf);
    let pct = |a: usize| 100.0 * a as f64 / d.max(1) as f64;
    eprintln!(
        "llama-1b shape vs transformers float32, {} positions ({d} decisive):\n  \
         ours float32:  rel. err. {e_f32:.2e}\n  \
         ours bfloat16: rel. err. {e_bf16:.2e}, top-1 {a_ours}/{d} = {:.2}%\n  \
         transformers bfloat16: rel. err. {e_hf_bf16:.2e}, top-1 {a_hf}/{d} = {:.2}%",
        hf.len(),
        pct(a_ours),
        pct(a_hf)
    );
    // Same arithmetic precision: the implementations must agree closely.
    assert!(e_f32 <= 1e-3, "float32 logits rel. err. {e_f32}");
    assert!(d >= 100, "too few decisive positions: {d}");
    // bfloat16: no worse than transformers' own bfloat16 run, against the same reference.
    assert!(
        e_bf16 <= 2e-2_f64.max(1.1 * e_hf_bf16),
        "bfloat16 logits rel. err. {e_bf16} (transformers bf16: {e_hf_bf16})"
    );
    assert!(
        pct(a_ours) >= 99.0_f64.min(pct(a_hf) - 0.5),
        "bfloat16 top-1 {} (transformers bf16: {})",
        pct(a_ours),
        pct(a_hf)
    );
}

#[test]
fn the_kv_cache_is_sized_by_gpu_memory_utilization() {
    let blocks = |util: f32| {
        Llm::new(EngineArgs {
            model: model("llama-1b"),
            device: DeviceArg::Cuda(0),
            gpu_memory_utilization: util,
            max_model_len: Some(8192),
            max_num_seqs: 4096,
            ..Default::default()
        })
        .map(|llm| llm.core().scheduler().config().num_blocks)
    };
    let (small, large) = (blocks(0.3).unwrap(), blocks(0.6).unwrap());
    // Llama-3.2-1B: 32 KiB of bf16 KV per token, 512 KiB per 16-token block; 0.3 of an H200 is
    // ~42 GB, so the 0.3 cache alone is tens of thousands of blocks and 0.6 adds 0.3 more.
    eprintln!("KV blocks: {small} at 0.3, {large} at 0.6");
    let per_block = 32 * 1024 * 16;
    let gained = (large - small) as f64 * per_block as f64;
    let total = 0.3 * pagewise::engine::device::gpu_memory(&gpu()).unwrap().total as f64;
    assert!(small > 20_000, "{small}");
    assert!(
        (gained / total - 1.0).abs() < 0.1,
        "0.3 more utilization bought {gained} bytes"
    );
    let err = blocks(0.005)
        .expect_err("nothing left must refuse")
        .to_string();
    assert!(err.contains("no GPU memory left for the KV cache"), "{err}");
}

/// A real quantized model through candle's CUDA quantized matmuls: the first 4 blocks of
/// SmolLM2-135M-Instruct (Q4_1 blocks, Q8_0 embedding; made by scripts/gpu/truncate_gguf.py),
/// on the GPU against the CPU's quantized path, then served through the engine.
#[test]
fn quantized_gguf_on_the_gpu_matches_the_cpu() {
    let path = model("smollm2-4l.gguf");
    let tokens: Vec<u32> = prompts(1, 49152)[0]
        .iter()
        .copied()
        .cycle()
        .take(200)
        .collect();
    let on = |device: &Device, dtype| {
        common::logits_at_every_position_on(&path, GgufMatmul::Quantized, &tokens, device, dtype)
    };
    let want = on(&Device::Cpu, DType::F32);
    for dtype in [DType::F32, DType::BF16] {
        let got = on(&gpu(), dtype);
        let err = rel_err(&got, &want);
        let (agree, decisive) = top1_agreement(&got, &want);
        eprintln!(
            "SmolLM2 4 blocks, quantized, GPU {dtype:?} vs CPU: rel. err. {err:.2e}, top-1 {agree}/{decisive}"
        );
        assert!(err < 0.1, "{dtype:?}: {err}");
        assert!(
            agree as f64 >= 0.9 * decisive as f64,
            "{dtype:?}: {agree}/{decisive}"
        );
    }
    let mut llm = Llm::new(EngineArgs {
        model: path.clone(),
        device: DeviceArg::Cuda(0),
        gguf_matmul: GgufMatmul::Quantized,
        ..Default::default()
    })
    .unwrap();
    let out = llm
        .generate_tokens(vec![tokens[..20].to_vec(); 3], &greedy(16))
        .unwrap();
    let times = llm.core().step_times().per_step();
    eprintln!(
        "engine on the GPU: {} steps, {} graph replays",
        times.steps, times.graph_steps
    );
    for o in &out {
        assert_eq!(o.outputs[0].token_ids, out[0].outputs[0].token_ids);
        assert_eq!(o.outputs[0].token_ids.len(), 16);
    }
}

/// Constrained rows on the GPU: the sampling kernel's bitmask keeps every output valid, greedy
/// or drawn, through CUDA graph replays; the free rows of the same batch are unchanged.
#[test]
fn constrained_outputs_on_the_gpu_are_valid_and_leave_free_rows_unchanged() {
    use pagewise::guided::StructuredOutputs;
    let mut llm = Llm::new(EngineArgs {
        model: model("tiny-d64"),
        device: DeviceArg::Cuda(0),
        max_num_seqs: 16,
        ..Default::default()
    })
    .unwrap();
    let schema = serde_json::json!({
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 999},
                       "tag": {"enum": ["red", "blue"]}, "ok": {"type": "boolean"}},
        "required": ["n", "tag", "ok"], "additionalProperties": false
    });
    let constrained = |temperature: f32| SamplingParams {
        temperature,
        seed: Some(3),
        max_tokens: 100,
        structured_outputs: Some(StructuredOutputs::Json(schema.clone())),
        ..Default::default()
    };
    let prompts = prompts(8, 256);
    let free_alone = llm.generate_tokens(prompts.clone(), &greedy(24)).unwrap();
    llm.core_mut().reset_step_times();
    let core = llm.core_mut();
    let mut ids = Vec::new();
    for (i, p) in prompts.iter().enumerate() {
        ids.push(core.add(p.clone(), greedy(24), None).unwrap()[0]);
        let t = if i % 2 == 0 { 0.0 } else { 1.0 };
        ids.push(core.add(p.clone(), constrained(t), None).unwrap()[0]);
    }
    let mut tokens: std::collections::HashMap<_, Vec<u32>> = Default::default();
    while core.has_unfinished() {
        for e in core.step().unwrap() {
            assert!(e.error.is_none(), "{:?}", e.error);
            tokens.entry(e.seq_id).or_default().push(e.token_id);
        }
    }
    for (i, pair) in ids.chunks(2).enumerate() {
        assert_eq!(
            tokens[&pair[0]], free_alone[i].outputs[0].token_ids,
            "free row {i}"
        );
        let text = core.tokenizer().decode(&tokens[&pair[1]], true).unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
        assert!((0..=999).contains(&v["n"].as_i64().unwrap()), "{text}");
        assert!(
            ["red", "blue"].contains(&v["tag"].as_str().unwrap()),
            "{text}"
        );
        assert!(v["ok"].is_boolean(), "{text}");
    }
    let times = core.step_times().per_step();
    eprintln!("{}", times.row());
    assert!(times.graph_steps > 0, "constrained rows replay graphs too");
}
