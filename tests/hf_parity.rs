//! Parity with Hugging Face transformers on tiny random-weight models (tests/fixtures/, made by
//! tests/fixtures/make_tiny_models.py): f32 logits at every position within 1e-4 relative error,
//! and the engine's greedy continuation token for token.

use candle_core::{DType, Device, Tensor};
use pagewise::loader::{self, LoadOptions};
use pagewise::model::batch::{AttentionMeta, SeqSpan};
use pagewise::model::{self, ForwardBatch, KvCache, KvLayout};
use pagewise::{EngineArgs, Llm, SamplingParams};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");

struct Case {
    prompt: Vec<u32>,
    greedy: Vec<u32>,
    logits: Vec<Vec<f32>>,
}

fn cases(name: &str) -> Vec<Case> {
    let text = std::fs::read_to_string(format!("{FIXTURES}/{name}/expected.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let ids = |x: &serde_json::Value| -> Vec<u32> {
        x.as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap() as u32)
            .collect()
    };
    v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| Case {
            prompt: ids(&c["prompt"]),
            greedy: ids(&c["greedy"]),
            logits: c["logits"]
                .as_array()
                .unwrap()
                .iter()
                .map(|row| {
                    row.as_array()
                        .unwrap()
                        .iter()
                        .map(|x| x.as_f64().unwrap() as f32)
                        .collect()
                })
                .collect(),
        })
        .collect()
}

/// Logits at every position of `tokens`, as one prefill through the paged cache (blocks shuffled).
fn all_logits(name: &str, tokens: &[u32]) -> Vec<Vec<f32>> {
    let opts = LoadOptions {
        load_format: loader::LoadFormat::Auto,
        dtype: DType::F32,
        device: Device::Cpu,
        gguf_matmul: loader::GgufMatmul::Auto,
        seed: 0,
    };
    let loaded = loader::load(&format!("{FIXTURES}/{name}"), &opts).unwrap();
    let cfg = &loaded.config;
    let m = model::build(cfg, &loaded.weights, 256).unwrap();
    let bs = 8;
    let n = tokens.len();
    let num_blocks = n.div_ceil(bs);
    let table: Vec<u32> = (1..=num_blocks as u32).rev().collect();
    let slots: Vec<u32> = (0..n)
        .map(|p| table[p / bs] * bs as u32 + (p % bs) as u32)
        .collect();
    let layout = KvLayout {
        num_blocks: num_blocks + 1,
        block_size: bs,
        num_kv_heads: cfg.num_key_value_heads,
        head_dim: cfg.head_dim,
    };
    let mut kv = KvCache::new(layout, cfg.num_hidden_layers);
    let positions: Vec<u32> = (0..n as u32).collect();
    let batch = ForwardBatch {
        input_ids: Tensor::from_slice(tokens, n, &Device::Cpu).unwrap(),
        positions: Tensor::from_slice(&positions, n, &Device::Cpu).unwrap(),
        attention: AttentionMeta {
            slot_mapping: &slots,
            block_tables: &table,
            seqs: vec![SeqSpan {
                query_start: 0,
                query_len: n,
                context_len: n,
                block_table: 0..num_blocks,
            }],
        },
        sample_rows: Tensor::from_slice(&positions, n, &Device::Cpu).unwrap(),
        num_sample_rows: n,
    };
    m.forward(&batch, &mut kv)
        .unwrap()
        .to_vec2::<f32>()
        .unwrap()
}

fn check(name: &str) {
    let cases = cases(name);
    for case in &cases {
        let full = [case.prompt.clone(), case.greedy.clone()].concat();
        let got = all_logits(name, &full);
        assert_eq!(got.len(), case.logits.len());
        let scale = case
            .logits
            .iter()
            .flatten()
            .fold(0.0f32, |m, x| m.max(x.abs()));
        let err = got
            .iter()
            .flatten()
            .zip(case.logits.iter().flatten())
            .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
        eprintln!("{name}: rel err {:.2e}, scale {scale}", err / scale);
        assert!(
            err / scale <= 1e-4,
            "{name}: logits rel. err {} (max abs {err}, scale {scale})",
            err / scale
        );
    }

    let mut llm = Llm::new(EngineArgs {
        model: format!("{FIXTURES}/{name}"),
        ..Default::default()
    })
    .unwrap();
    let params = SamplingParams {
        temperature: 0.0,
        max_tokens: 20,
        ..Default::default()
    };
    let outs = llm
        .generate_tokens(cases.iter().map(|c| c.prompt.clone()).collect(), &params)
        .unwrap();
    for (out, case) in outs.iter().zip(&cases) {
        assert_eq!(
            out.outputs[0].token_ids, case.greedy,
            "{name}: greedy tokens for {:?}",
            case.prompt
        );
    }
}

#[test]
fn llama_with_gqa_tied_embeddings_and_llama3_rope_matches_transformers() {
    check("llama-gqa-tied");
}

#[test]
fn qwen2_with_qkv_bias_matches_transformers() {
    check("qwen2-bias");
}

#[test]
fn opt_with_project_in_out_matches_transformers() {
    check("opt");
}
