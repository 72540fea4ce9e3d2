//! `--load-format dummy` (seeded random weights from config.json alone) and `--dtype` on the CPU.

use pagewise::loader::LoadFormat;
use pagewise::{DtypeArg, EngineArgs, Llm, SamplingParams};

const LLAMA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/llama-gqa-tied");

fn greedy_tokens(args: EngineArgs) -> Vec<u32> {
    let params = SamplingParams {
        temperature: 0.0,
        max_tokens: 12,
        ignore_eos: true,
        ..Default::default()
    };
    let out = Llm::new(args)
        .unwrap()
        .generate_tokens(vec![vec![10, 20, 30, 40]], &params)
        .unwrap();
    out[0].outputs[0].token_ids.clone()
}

/// The top-5 logprobs of the first generated token: a fingerprint of the weights.
fn fingerprint(args: EngineArgs) -> Vec<(u32, f32)> {
    let params = SamplingParams {
        temperature: 0.0,
        max_tokens: 1,
        logprobs: Some(5),
        ..Default::default()
    };
    let out = Llm::new(args)
        .unwrap()
        .generate_tokens(vec![vec![10, 20, 30, 40]], &params)
        .unwrap();
    out[0].outputs[0].logprobs.as_ref().unwrap()[0].top.clone()
}

#[test]
fn dummy_weights_are_seeded_and_differ_from_the_real_ones() {
    let dummy = |seed| EngineArgs {
        model: LLAMA.into(),
        load_format: LoadFormat::Dummy,
        seed,
        ..Default::default()
    };
    let a = fingerprint(dummy(1));
    assert_eq!(a.len(), 5);
    assert_eq!(a, fingerprint(dummy(1)), "same seed, same model");
    assert_ne!(a, fingerprint(dummy(2)), "another seed, another model");
    assert_ne!(
        a,
        fingerprint(EngineArgs {
            model: LLAMA.into(),
            ..Default::default()
        })
    );
    assert_eq!(greedy_tokens(dummy(3)).len(), 12);
}

#[test]
fn bfloat16_and_float16_run_on_the_cpu() {
    let f32_tokens = greedy_tokens(EngineArgs {
        model: LLAMA.into(),
        ..Default::default()
    });
    for dtype in [DtypeArg::Bfloat16, DtypeArg::Float16] {
        let tokens = greedy_tokens(EngineArgs {
            model: LLAMA.into(),
            dtype,
            ..Default::default()
        });
        assert_eq!(tokens.len(), 12);
        // Reduced precision may flip near-ties later on; the first tokens agree.
        assert_eq!(tokens[..2], f32_tokens[..2], "{dtype:?}");
    }
}

#[test]
fn bad_engine_settings_are_refused_clearly() {
    let err = |args: EngineArgs| Llm::new(args).err().expect("must fail").to_string();
    let e = err(EngineArgs {
        model: LLAMA.into(),
        block_size: 12,
        ..Default::default()
    });
    assert!(e.contains("block size 12"), "{e}");
    let e = err(EngineArgs {
        model: LLAMA.into(),
        max_model_len: Some(100_000),
        ..Default::default()
    });
    assert!(e.contains("max_position_embeddings 256"), "{e}");
    let e = err(EngineArgs {
        model: "/no/such/model".into(),
        ..Default::default()
    });
    assert!(e.contains("/no/such/model"), "{e}");
    let e = err(EngineArgs {
        model: LLAMA.into(),
        kv_cache_memory: Some(10),
        ..Default::default()
    });
    assert!(e.contains("holds no block"), "{e}");
}

/// A GGUF file of one 32 x 4 tensor of ggml type `ggml_type` (its data zeros) and the
/// architecture `arch`, written to the temporary folder as `name`.
fn one_tensor_gguf(name: &str, arch: &str, ggml_type: u32, data_bytes: usize) -> String {
    let mut f = b"GGUF".to_vec();
    f.extend(3u32.to_le_bytes());
    f.extend(1u64.to_le_bytes()); // tensors
    f.extend(1u64.to_le_bytes()); // metadata entries
    let string = |f: &mut Vec<u8>, s: &str| {
        f.extend((s.len() as u64).to_le_bytes());
        f.extend(s.as_bytes());
    };
    string(&mut f, "general.architecture");
    f.extend(8u32.to_le_bytes()); // a string
    string(&mut f, arch);
    string(&mut f, "token_embd.weight");
    f.extend(2u32.to_le_bytes());
    f.extend(32u64.to_le_bytes());
    f.extend(4u64.to_le_bytes());
    f.extend(ggml_type.to_le_bytes());
    f.extend(0u64.to_le_bytes());
    f.resize(f.len().div_ceil(32) * 32 + data_bytes, 0);
    let path = std::env::temp_dir().join(format!("pagewise-{}-{name}.gguf", std::process::id()));
    std::fs::write(&path, f).unwrap();
    path.to_str().unwrap().to_string()
}

/// A GGUF file the loader cannot run is refused with an error that names what: an architecture
/// it does not have, a tensor type it does not read (IQ2_XXS, ggml type 16), a damaged header.
#[test]
fn gguf_files_it_cannot_run_are_refused_by_name() {
    let err = |path: &str| {
        let args = EngineArgs {
            model: path.into(),
            ..Default::default()
        };
        let e = Llm::new(args).err().expect("must fail").to_string();
        std::fs::remove_file(path).unwrap();
        e
    };
    let e = err(&one_tensor_gguf("arch", "mamba", 0, 32 * 4 * 4));
    assert!(e.contains("\"mamba\" is not supported"), "{e}");
    let e = err(&one_tensor_gguf("type", "llama", 16, 4 * 66));
    assert!(e.contains("ggml type 16 is not supported"), "{e}");
    // Cut inside the tensor table.
    let damaged = one_tensor_gguf("damaged", "llama", 0, 0);
    let bytes = std::fs::read(&damaged).unwrap();
    std::fs::write(&damaged, &bytes[..70]).unwrap();
    let e = err(&damaged);
    assert!(e.contains("damaged.gguf"), "{e}");
}

/// GGUF files with a SentencePiece vocabulary (`tokenizer.ggml.model = "llama"`: Llama 2, Mistral,
/// Phi-3, Gemma) tokenize as SentencePiece itself does (tests/fixtures/make_spm_gguf.py trains the
/// models and records its ids): with the prefix space and without (Gemma), byte fallback for
/// characters outside the vocabulary, digits split, special tokens matched whole. Decoding gives
/// the text back, whole and token by token as a stream.
#[test]
fn sentencepiece_gguf_tokenizers_tokenize_as_sentencepiece() {
    use pagewise::engine::detokenizer::IncrementalDetokenizer;
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/spm");
    let expected: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(format!("{dir}/expected.json")).unwrap())
            .unwrap();
    for kind in ["prefix", "noprefix"] {
        let tok =
            pagewise::loader::load_tokenizer(&format!("{dir}/tokenizer-{kind}.gguf")).unwrap();
        for case in expected[kind].as_array().unwrap() {
            let text = case["text"].as_str().unwrap();
            let want: Vec<u32> = serde_json::from_value(case["ids"].clone()).unwrap();
            let got = tok.encode(text, false).unwrap().get_ids().to_vec();
            assert_eq!(got, want, "{kind}: {text:?}");
            // With special tokens: the BOS first, as the GGUF asks.
            let with_bos = tok.encode(text, true).unwrap().get_ids().to_vec();
            assert_eq!(with_bos[0], 1, "{kind}: {text:?} starts with <s>");
            assert_eq!(&with_bos[1..], &want[..], "{kind}: {text:?}");
            if text.contains("<start_of_turn>") {
                continue;
            }
            let decoded = tok.decode(&got, false).unwrap();
            assert_eq!(
                decoded,
                case["decoded"].as_str().unwrap(),
                "{kind}: {text:?}"
            );
            let mut stream = IncrementalDetokenizer::new(&[], false);
            let mut streamed = String::new();
            for &id in &got {
                streamed += &stream.step(&tok, id).unwrap();
            }
            streamed += &stream.flush(&tok).unwrap();
            assert_eq!(streamed, decoded, "{kind}: {text:?} streamed");
        }
    }
    // The prefix space is there or not, as the file says.
    let ids = |kind: &str| {
        let tok =
            pagewise::loader::load_tokenizer(&format!("{dir}/tokenizer-{kind}.gguf")).unwrap();
        let ids = tok.encode("Hello", false).unwrap().get_ids().to_vec();
        tok.id_to_token(ids[0]).unwrap()
    };
    assert!(ids("prefix").starts_with('\u{2581}'), "{}", ids("prefix"));
    assert!(
        !ids("noprefix").starts_with('\u{2581}'),
        "{}",
        ids("noprefix")
    );
}

/// A checkpoint quantized in a way pagewise does not read (here compressed-tensors'
/// `int-quantized`, as llm-compressor writes W8A8) is refused at load, naming the method and the format, instead of
/// being run with its weights read as plain values and its scales dropped.
#[test]
fn quantized_checkpoints_it_cannot_read_are_refused_by_name() {
    let dir = std::env::temp_dir().join(format!("pagewise-w8a8-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for f in std::fs::read_dir(LLAMA).unwrap().flatten() {
        std::fs::copy(f.path(), dir.join(f.file_name())).unwrap();
    }
    let path = dir.join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    config["quantization_config"] = serde_json::json!({
        "quant_method": "compressed-tensors",
        "format": "int-quantized",
        "config_groups": {"group_0": {"targets": ["Linear"],
            "weights": {"num_bits": 8, "type": "int", "strategy": "channel"},
            "input_activations": {"num_bits": 8, "type": "int", "strategy": "token",
                "dynamic": true}}},
        "ignore": ["lm_head"]
    });
    std::fs::write(&path, config.to_string()).unwrap();
    for load_format in [LoadFormat::Auto, LoadFormat::Dummy] {
        let e = Llm::new(EngineArgs {
            model: dir.to_str().unwrap().into(),
            load_format,
            ..Default::default()
        })
        .err()
        .expect("a quantized checkpoint it cannot read must be refused")
        .to_string();
        assert!(
            e.contains("compressed-tensors") && e.contains("int-quantized"),
            "{e}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The engine reports where its startup went: every phase within the total, and reading the
/// weights took some of it.
#[test]
fn startup_times_add_up() {
    let llm = Llm::new(EngineArgs {
        model: LLAMA.into(),
        ..Default::default()
    })
    .unwrap();
    let t = *llm.core().startup_times();
    let phases = t.device + t.weights + t.model + t.kv_cache + t.graphs + t.chat_template;
    assert!(phases <= t.total, "{t:?}");
    assert!(t.weights > std::time::Duration::ZERO, "{t:?}");
    assert!(t.summary().starts_with("ready in "), "{}", t.summary());
}
