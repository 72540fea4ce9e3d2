//! Integer-weight checkpoints on the CPU (tests/fixtures/make_int_models.py): AWQ (GEMM, dense and
//! MoE), GPTQ (4-bit with act-order groups, 8-bit per channel) and compressed-tensors
//! pack-quantized, unpacked at load, against transformers on the same weights dequantized (1e-4
//! of the logits' scale, greedy tokens equal); and malformed ones refused by name.

mod common;

use std::path::Path;

use common::parity::{FIXTURES, check};
use pagewise::{EngineArgs, Llm};

#[test]
fn awq_gemm_4bit_matches_transformers() {
    check("llama-awq");
}

#[test]
fn awq_experts_match_transformers() {
    check("qwen3-moe-awq");
}

#[test]
fn gptq_4bit_with_act_order_groups_matches_transformers() {
    check("qwen3-gptq-act-order");
}

#[test]
fn gptq_8bit_per_channel_matches_transformers() {
    check("llama-gptq-8bit");
}

#[test]
fn compressed_tensors_w4a16_matches_transformers() {
    check("llama-w4a16");
}

/// A copy of fixture `name` with `edit` applied to its tensors.
fn refused(name: &str, edit: impl FnOnce(&mut Vec<(String, candle_core::Tensor)>)) -> String {
    let src = Path::new(FIXTURES).join(name);
    let dir = std::env::temp_dir().join(format!("pagewise-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["tokenizer.json", "generation_config.json", "config.json"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    let mut tensors: Vec<(String, candle_core::Tensor)> =
        candle_core::safetensors::load(src.join("model.safetensors"), &candle_core::Device::Cpu)
            .unwrap()
            .into_iter()
            .collect();
    edit(&mut tensors);
    let map: std::collections::HashMap<_, _> = tensors.into_iter().collect();
    candle_core::safetensors::save(&map, dir.join("model.safetensors")).unwrap();
    let e = Llm::new(EngineArgs {
        model: dir.to_str().unwrap().into(),
        ..Default::default()
    })
    .err()
    .expect("a malformed checkpoint must be refused")
    .to_string();
    std::fs::remove_dir_all(&dir).unwrap();
    e
}

#[test]
fn missing_or_misshapen_packed_tensors_are_refused_by_name() {
    let zeros = "model.layers.0.self_attn.q_proj.qzeros";
    let e = refused("llama-awq", |t| t.retain(|(n, _)| n != zeros));
    assert!(e.contains(zeros), "{e}");
    let scales = "model.layers.1.mlp.up_proj.scales";
    let e = refused("qwen3-gptq-act-order", |t| {
        let (_, s) = t.iter_mut().find(|(n, _)| n == scales).unwrap();
        *s = s.t().unwrap().contiguous().unwrap();
    });
    assert!(e.contains(scales) && e.contains("expected"), "{e}");
}
