//! 4-bit integer checkpoints on the GPU (part of the gpu_engine test binary; models by
//! scripts/gpu/make_int_gpu_models.py in tests/fixtures/make_int_models.py's layouts): AWQ, GPTQ
//! and W4A16 projections stay packed there, run on the fused decode kernels and the CUDA graphs,
//! and stay near the CPU's float32 logits of the same weights; a GPTQ `desc_act` checkpoint is
//! dequantized at load and runs as well. A mixture of experts' experts stay codes for the expert
//! kernels (AWQ's 4 bits, GPTQ's 8).

use pagewise::model::layers::Linear;

use super::batching::{
    bf16_eager_and_graphs, graph_replays_equal_eager, small_steps_batch_and_replay,
};
use super::fp8::{first_q_proj, near_the_cpu};
use super::gpu;
use super::model;

#[test]
fn int4_checkpoints_keep_their_packed_weights_on_the_gpu() {
    let mut names = vec!["tiny-d64-awq", "qwen3-d128-gptq"];
    // (Written only where compressed-tensors is installed.)
    if std::path::Path::new(&model("tiny-d64-w4a16")).exists() {
        names.push("tiny-d64-w4a16");
    }
    for name in names {
        let path = model(name);
        assert!(
            matches!(first_q_proj(&path, None), Linear::Int4(_)),
            "{name}: the q projection must stay 4-bit on the GPU"
        );
        near_the_cpu(name, &path, None, (true, false));
    }
}

#[test]
fn a_gptq_desc_act_checkpoint_is_dequantized_on_the_gpu() {
    let path = model("qwen3-d128-gptq-act-order");
    assert!(matches!(first_q_proj(&path, None), Linear::Dense(_)));
    near_the_cpu("qwen3-d128-gptq-act-order", &path, None, (true, false));
}

#[test]
fn int4_batches_and_graphs_equal_solo_and_eager_runs() {
    // tiny-d64's shape: 1 KiB of bf16 KV per token. Steps of at most 8 rows take the 4-bit
    // GEMV, which computes each row as it computes one alone; a larger step multiplies by the
    // weights dequantized to bf16 (cuBLAS), whose rounding changes greedy tokens of this random
    // model (seen on an H100: with steps of up to 48 rows, prompt 1 differed from its third
    // token). So 4-bit output is batch-invariant only among steps of at most 8 rows.
    small_steps_batch_and_replay("tiny-d64-awq", "4-bit");
}

/// Expert 0's gate projection of layer 0 of `path`, loaded for the GPU in bf16.
fn first_expert_gate(path: &str) -> Linear {
    use candle_core::DType;
    use pagewise::loader::{self, GgufMatmul, LoadFormat, LoadOptions};
    let opts = LoadOptions {
        load_format: LoadFormat::Auto,
        dtype: DType::BF16,
        device: gpu(),
        gguf_matmul: GgufMatmul::Auto,
        seed: 0,
        quantization: None,
    };
    let loaded = loader::load(path, &opts).unwrap();
    let c = &loaded.config;
    let inter = c
        .moe
        .as_ref()
        .expect("a mixture of experts")
        .expert_intermediate;
    loaded
        .weights
        .linear(
            "model.layers.0.mlp.experts.0.gate_proj",
            c.hidden_size,
            inter,
            false,
        )
        .unwrap()
}

/// Qwen3-MoE as AWQ (4-bit codes in groups of 32) and as GPTQ 8-bit per channel: the experts stay
/// codes on the GPU (`Linear::Affine`, stacked for the expert kernels); decode steps and the
/// 40-token prefill run them token by token, near the CPU's float32 logits, and so does a
/// 100-token prefill, past `moe::AFFINE_DEVICE_TOKENS`, which dequantizes the routed experts for
/// the grouped GEMMs; decode steps in CUDA graphs equal eager ones.
#[test]
fn int_moe_experts_stay_codes_on_the_gpu() {
    for name in ["qwen3moe-d128-awq", "qwen3moe-d128-gptq8"] {
        let path = model(name);
        assert!(
            matches!(first_expert_gate(&path), Linear::Affine(_)),
            "{name}: the experts must stay codes on the GPU"
        );
        near_the_cpu(name, &path, None, (true, false));
        let tokens: Vec<u32> = (0..100).map(|i| (i * 37 + 3) % 250).collect();
        let on = |device: &candle_core::Device, dtype| {
            super::common::logits_at_every_position_on(
                &path,
                pagewise::loader::GgufMatmul::Auto,
                &tokens,
                device,
                dtype,
            )
        };
        let want = on(&candle_core::Device::Cpu, candle_core::DType::F32);
        let got = on(&gpu(), candle_core::DType::BF16);
        let err = super::common::rel_err(&got, &want);
        let (agree, decisive) = super::top1_agreement(&got, &want);
        eprintln!("{name}: 100-token bf16 prefill, rel. err. {err:.2e}, top-1 {agree}/{decisive}");
        assert!(err < 5e-2, "{name}: {err}");
        assert!(agree as f64 >= 0.95 * decisive as f64, "{agree}/{decisive}");
        let (mut eager, mut graphs) = bf16_eager_and_graphs(path.clone());
        let replays = graph_replays_equal_eager(&mut eager, &mut graphs, &[1, 5]);
        eprintln!("{name}: (graph replays, steps) per run: {replays:?}");
        assert_eq!(replays[0], (23, 24));
    }
}
