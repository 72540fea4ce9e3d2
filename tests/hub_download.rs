//! Models downloaded from the Hugging Face hub by id, against a mock hub on a local port
//! (`HF_ENDPOINT`): the download's progress lines, then the model runs.

use std::process::Command;

#[path = "common/hub.rs"]
mod hub;
use hub::hub_serving;

const MODEL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/qwen2-bias");

/// A model downloaded from the hub by id: a file of 64 MiB or more logs a line at each tenth of
/// its download when stderr is not a terminal, and the model then runs.
#[test]
fn hub_downloads_log_their_progress_and_the_model_runs() {
    let read = |f: &str| std::fs::read(format!("{MODEL}/{f}")).unwrap();
    // The fixture's weights with 66 MiB of spaces in their JSON header (valid safetensors).
    let weights = read("model.safetensors");
    let n = u64::from_le_bytes(weights[..8].try_into().unwrap()) as usize;
    let pad = 66 << 20;
    let mut big = ((n + pad) as u64).to_le_bytes().to_vec();
    big.extend_from_slice(&weights[8..8 + n]);
    big.resize(8 + n + pad, b' ');
    big.extend_from_slice(&weights[8 + n..]);
    let hub = hub_serving(vec![
        ("config.json", read("config.json")),
        ("tokenizer.json", read("tokenizer.json")),
        ("model.safetensors", big),
    ]);
    let home = std::env::temp_dir().join(format!("pagewise-hf-download-{}", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_pagewise"))
        .args(["generate", "--model", "test-org/tiny", "--prompt", "hi"])
        .args(["--max-tokens", "2", "--cpu-threads", "1"])
        .env("HF_HOME", &home)
        .env("HF_ENDPOINT", &hub)
        .env("RUST_LOG", "info")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("downloading model.safetensors of test-org/tiny: "))
        .collect();
    assert_eq!(lines.len(), 10, "{stderr}");
    assert!(lines[9].contains("100% (70 of 70 MB, "), "{}", lines[9]);
    // The small files: one line each, no progress.
    assert!(
        !stderr.contains("config.json of test-org/tiny: "),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&home);
}
