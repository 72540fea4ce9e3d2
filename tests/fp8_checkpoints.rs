//! FP8 checkpoints on the CPU (tests/fixtures/make_fp8_models.py): e4m3 weights with per-channel,
//! per-tensor and block scales, in compressed-tensors' and the block `fp8` layouts, dequantized at
//! load, against transformers reading the same directories (1e-4 of the logits' scale, greedy
//! tokens equal); and the ways such a checkpoint can be malformed, each refused by name.

mod common;

use std::path::{Path, PathBuf};

use common::parity::{FIXTURES, check};
use pagewise::{EngineArgs, Llm};

#[test]
fn compressed_tensors_fp8_with_channel_scales_matches_transformers() {
    check("llama-fp8-channel");
}

#[test]
fn compressed_tensors_fp8_with_tensor_scales_and_static_activations_matches_transformers() {
    check("llama-fp8-tensor");
}

#[test]
fn block_fp8_matches_transformers() {
    check("qwen3-fp8-block");
}

#[test]
fn block_fp8_experts_match_transformers() {
    check("qwen3-moe-fp8-block");
}

/// A copy of fixture `name` in a fresh directory, with `edit` applied to its config and tensors.
fn edited_copy(
    name: &str,
    edit: impl FnOnce(&mut serde_json::Value, &mut Vec<(String, candle_core::Tensor)>),
) -> PathBuf {
    let src = Path::new(FIXTURES).join(name);
    let dir = std::env::temp_dir().join(format!("pagewise-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["tokenizer.json", "generation_config.json"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    let mut tensors: Vec<(String, candle_core::Tensor)> =
        candle_core::safetensors::load(src.join("model.safetensors"), &candle_core::Device::Cpu)
            .unwrap()
            .into_iter()
            .collect();
    edit(&mut config, &mut tensors);
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    candle_core::safetensors::save(
        &tensors
            .into_iter()
            .collect::<std::collections::HashMap<_, _>>(),
        dir.join("model.safetensors"),
    )
    .unwrap();
    dir
}

fn load_error(dir: &Path) -> String {
    let e = Llm::new(EngineArgs {
        model: dir.to_str().unwrap().into(),
        ..Default::default()
    })
    .err()
    .expect("a malformed FP8 checkpoint must be refused")
    .to_string();
    std::fs::remove_dir_all(dir).unwrap();
    e
}

/// Per-channel scales stored along the input axis (`[1, out]` instead of `[out, 1]`, the same
/// count for a square matrix) are refused, never broadcast along the wrong axis.
#[test]
fn scales_on_the_wrong_axis_are_refused() {
    let scale = "model.layers.0.self_attn.q_proj.weight_scale";
    let dir = edited_copy("llama-fp8-channel", |_, tensors| {
        let (_, s) = tensors.iter_mut().find(|(n, _)| n == scale).unwrap();
        *s = s.t().unwrap().contiguous().unwrap();
    });
    let e = load_error(&dir);
    assert!(e.contains("q_proj.weight") && e.contains("[1, 64]"), "{e}");
}

#[test]
fn a_missing_scale_is_refused_by_name() {
    let scale = "model.layers.1.mlp.down_proj.weight_scale_inv";
    let dir = edited_copy("qwen3-fp8-block", |_, tensors| {
        tensors.retain(|(n, _)| n != scale);
    });
    let e = load_error(&dir);
    assert!(e.contains(scale), "{e}");
}

/// FP8 tensors with no `quantization_config` to say how they are scaled are refused rather than
/// read as plain values.
#[test]
fn fp8_tensors_without_a_quantization_config_are_refused() {
    let dir = edited_copy("llama-fp8-tensor", |config, _| {
        config
            .as_object_mut()
            .unwrap()
            .remove("quantization_config");
    });
    let e = load_error(&dir);
    assert!(
        e.contains("FP8") && e.contains("quantization_config"),
        "{e}"
    );
}
