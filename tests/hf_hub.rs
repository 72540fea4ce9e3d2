//! Models named by Hugging Face repo id, resolved offline from a Hugging Face cache laid out the way
//! `huggingface_hub` writes it (HF_HUB_CACHE, HF_HUB_OFFLINE=1). One test: it sets process env vars.

use pagewise::{EngineArgs, Llm, SamplingParams};

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/qwen2-bias");

#[test]
fn repo_id_loads_from_the_offline_cache_and_names_missing_files() {
    let cache = std::env::temp_dir().join(format!("pagewise-hf-cache-{}", std::process::id()));
    let repo = cache.join("models--test-org--tiny-qwen2");
    let snapshot = repo.join("snapshots").join("0123abcd");
    std::fs::create_dir_all(&snapshot).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs").join("main"), "0123abcd").unwrap();
    for file in [
        "config.json",
        "tokenizer.json",
        "generation_config.json",
        "model.safetensors",
    ] {
        std::fs::copy(format!("{FIXTURE}/{file}"), snapshot.join(file)).unwrap();
    }
    // SAFETY: this test binary has this one test, so no other thread reads the environment.
    unsafe {
        std::env::set_var("HF_HUB_CACHE", &cache);
        std::env::set_var("HF_HUB_OFFLINE", "1");
    }

    let params = SamplingParams {
        temperature: 0.0,
        max_tokens: 5,
        ..Default::default()
    };
    let from_hub = Llm::new(EngineArgs {
        model: "test-org/tiny-qwen2".into(),
        ..Default::default()
    })
    .unwrap()
    .generate_tokens(vec![vec![1, 2, 3]], &params)
    .unwrap();
    let from_dir = Llm::new(EngineArgs {
        model: FIXTURE.into(),
        ..Default::default()
    })
    .unwrap()
    .generate_tokens(vec![vec![1, 2, 3]], &params)
    .unwrap();
    assert_eq!(
        from_hub[0].outputs[0].token_ids,
        from_dir[0].outputs[0].token_ids
    );

    std::fs::remove_file(snapshot.join("tokenizer.json")).unwrap();
    let err = Llm::new(EngineArgs {
        model: "test-org/tiny-qwen2".into(),
        ..Default::default()
    })
    .err()
    .expect("a missing tokenizer.json must fail")
    .to_string();
    assert!(
        err.contains("tokenizer.json is not in the Hugging Face cache")
            && err.contains("unset HF_HUB_OFFLINE"),
        "{err}"
    );
    let err = Llm::new(EngineArgs {
        model: "test-org/not-cached".into(),
        ..Default::default()
    })
    .err()
    .unwrap()
    .to_string();
    assert!(
        err.contains("test-org/not-cached: config.json is not in the Hugging Face cache"),
        "{err}"
    );
    std::fs::remove_dir_all(&cache).unwrap();
}
