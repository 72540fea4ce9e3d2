//! Output with and without speculative decoding, batched under pressure: shared by the tests of
//! each proposer.
#![allow(dead_code)]

use pagewise::sampler::SeededRng;
use pagewise::spec::SpeculativeConfig;
use pagewise::{EngineArgs, Llm, SamplingParams};

/// 24 prompts, half sharing a prefix, some repeating a pattern (so the proposer finds drafts
/// from the start).
pub fn prompts() -> Vec<Vec<u32>> {
    let mut rng = SeededRng::new(7, 0);
    let mut tok = || (rng.next_u64() % 250) as u32 + 1;
    let shared: Vec<u32> = (0..24).map(|_| tok()).collect();
    (0..24)
        .map(|i| {
            let tail: Vec<u32> = (0..1 + (i * 5) % 30).map(|_| tok()).collect();
            let p = match i % 3 {
                0 => [shared.clone(), tail].concat(),
                1 => tail,
                _ => [tail.clone(), tail.clone(), tail].concat(),
            };
            p.into_iter().take(60).collect()
        })
        .collect()
}

/// Each prompt's output alone without speculation, then all of them batched with `spec` in a
/// small cache (chunked prefill, preemption, prefix hits): the same tokens. Returns the batched
/// engine.
pub fn same_with_and_without(
    model: &str,
    kv_bytes_per_token: u64,
    params: &SamplingParams,
    spec: Option<SpeculativeConfig>,
) -> Llm {
    let prompts = prompts();
    let mut plain = Llm::new(EngineArgs {
        model: model.into(),
        ..Default::default()
    })
    .unwrap();
    let expected: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| {
            plain.generate_tokens(vec![p.clone()], params).unwrap()[0].outputs[0]
                .token_ids
                .clone()
        })
        .collect();
    let mut spec = Llm::new(EngineArgs {
        model: model.into(),
        block_size: 8,
        max_num_batched_tokens: Some(24),
        kv_cache_memory: Some(30 * 8 * kv_bytes_per_token),
        max_model_len: Some(128),
        speculative_config: spec,
        ..Default::default()
    })
    .unwrap();
    let outs = spec.generate_tokens(prompts.clone(), params).unwrap();
    for (i, (out, want)) in outs.iter().zip(&expected).enumerate() {
        assert_eq!(&out.outputs[0].token_ids, want, "prompt {i}");
    }
    let stats = spec.core().spec_stats();
    eprintln!(
        "drafts {}, draft tokens {}, accepted {} ({:.0}%), per position {:?}",
        stats.num_drafts,
        stats.num_draft_tokens,
        stats.num_accepted_tokens,
        100.0 * stats.acceptance_rate(),
        stats.accepted_per_pos
    );
    assert!(
        stats.num_accepted_tokens > 0,
        "some drafts must be accepted"
    );
    assert!(
        stats.num_accepted_tokens < stats.num_draft_tokens,
        "some drafts must be rejected"
    );
    super::assert_preempted_cached_and_freed(&spec, "");
    spec
}

/// Writes a random EAGLE-3 head for the Hugging Face target in `target` into `dir` (seeded; its
/// draft vocabulary is the target's, so it has no `d2t`; it reads the streams entering the
/// target's last, first and middle layers).
pub fn write_random_eagle3_head(target: &str, dir: &std::path::Path, seed: u64) {
    use candle_core::{DType, Device, Tensor};
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(format!("{target}/config.json")).unwrap())
            .unwrap();
    let n = |k: &str| cfg[k].as_u64().unwrap() as usize;
    let (h, vocab, layers, nq) = (
        n("hidden_size"),
        n("vocab_size"),
        n("num_hidden_layers"),
        n("num_attention_heads"),
    );
    let nkv = cfg["num_key_value_heads"]
        .as_u64()
        .map_or(nq, |v| v as usize);
    let d = cfg["head_dim"].as_u64().map_or(h / nq, |v| v as usize);
    let inter = 2 * h;
    let mut rng = SeededRng::new(seed, 0);
    let mut rand = |shape: (usize, usize), scale: f32| {
        let v: Vec<f32> = (0..shape.0 * shape.1)
            .map(|_| ((rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0 * scale)
            .collect();
        Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
    };
    let ones = |size: usize| Tensor::ones(size, DType::F32, &Device::Cpu).unwrap();
    let w = [
        ("fc.weight", rand((h, 3 * h), 0.1)),
        (
            "midlayer.self_attn.q_proj.weight",
            rand((nq * d, 2 * h), 0.15),
        ),
        (
            "midlayer.self_attn.k_proj.weight",
            rand((nkv * d, 2 * h), 0.15),
        ),
        (
            "midlayer.self_attn.v_proj.weight",
            rand((nkv * d, 2 * h), 0.15),
        ),
        ("midlayer.self_attn.o_proj.weight", rand((h, nq * d), 0.15)),
        ("midlayer.mlp.gate_proj.weight", rand((inter, h), 0.15)),
        ("midlayer.mlp.up_proj.weight", rand((inter, h), 0.15)),
        ("midlayer.mlp.down_proj.weight", rand((h, inter), 0.15)),
        ("lm_head.weight", rand((vocab, h), 0.5)),
    ];
    let mut tensors: std::collections::HashMap<String, Tensor> =
        w.into_iter().map(|(k, t)| (k.to_string(), t)).collect();
    for norm in [
        "midlayer.hidden_norm.weight",
        "midlayer.input_layernorm.weight",
        "midlayer.post_attention_layernorm.weight",
        "norm.weight",
    ] {
        tensors.insert(norm.into(), ones(h));
    }
    std::fs::create_dir_all(dir).unwrap();
    candle_core::safetensors::save(&tensors, dir.join("model.safetensors")).unwrap();
    let head = serde_json::json!({
        "architectures": ["LlamaForCausalLMEagle3"],
        "hidden_size": h, "intermediate_size": inter, "num_hidden_layers": 1,
        "num_attention_heads": nq, "num_key_value_heads": nkv, "head_dim": d,
        "rms_norm_eps": 1e-6, "vocab_size": vocab,
        "max_position_embeddings": cfg["max_position_embeddings"],
        "rope_theta": cfg["rope_theta"].as_f64().unwrap_or(10_000.0),
        "eagle_aux_hidden_state_layer_ids": [layers - 1, 0, layers / 2],
    });
    std::fs::write(dir.join("config.json"), head.to_string()).unwrap();
}

/// Runs `prompt` alone on `llm` step by step: each step's drafts with the sequence's length
/// when they were proposed, and the output.
pub fn drafts_along(
    llm: &mut Llm,
    prompt: &[u32],
    params: &SamplingParams,
) -> (Vec<(usize, Vec<u32>)>, Vec<u32>) {
    let core = llm.core_mut();
    core.add(prompt.to_vec(), params.clone(), None).unwrap();
    let (mut rounds, mut output) = (Vec::new(), Vec::new());
    while core.has_unfinished() {
        output.extend(core.step().unwrap().iter().map(|e| e.token_id));
        if let Some(seq) = core.scheduler().running().first()
            && !seq.spec_tokens().is_empty()
        {
            rounds.push((seq.num_tokens(), seq.spec_tokens().to_vec()));
        }
    }
    (rounds, output)
}
