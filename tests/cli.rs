//! The `pagewise` binary: generate, JSON logs, --config precedence, refused flags.

use std::process::Command;

const MODEL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/qwen2-bias");

fn pagewise(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_pagewise"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn generate_prints_completions_and_json_logs() {
    let out = pagewise(&[
        "--log-format",
        "json",
        "generate",
        "--model",
        MODEL,
        "--prompt",
        "hi",
        "--prompt",
        "yo",
        "--max-tokens",
        "3",
        "--temperature",
        "0",
        "--ignore-eos",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        stdout
            .matches("--- finish_reason: length, 3 tokens")
            .count(),
        2,
        "{stdout}"
    );
    let stderr = String::from_utf8(out.stderr).unwrap();
    let line = stderr
        .lines()
        .find(|l| l.contains("KV cache allocated"))
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(line).unwrap();
    assert_eq!(v["level"], "INFO");
    assert!(v["fields"]["num_blocks"].as_u64().unwrap() > 0);
}

#[test]
fn config_file_is_below_the_command_line() {
    let dir = std::env::temp_dir().join(format!("pagewise-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("c.toml");
    // The file asks for block size 12 (invalid); the command line's 16 must win.
    std::fs::write(&cfg, "block-size = 12\nmax-model-len = 64\n").unwrap();
    let cfg = cfg.to_str().unwrap();
    let base = [
        "generate",
        "--model",
        MODEL,
        "--prompt",
        "hi",
        "--max-tokens",
        "2",
        "--config",
        cfg,
    ];
    let out = pagewise(&base);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("block size 12"));
    let out = pagewise(&[&base[..], &["--block-size", "16"]].concat());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn tensor_parallelism_without_nccl_or_with_a_bad_layout_is_refused_clearly() {
    let out = pagewise(&["serve", MODEL, "--tensor-parallel-size", "2", "--port", "0"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("needs a build with `--features nccl`"),
        "{err}"
    );
    let out = pagewise(&["serve", MODEL, "--tensor-parallel-size", "3", "--port", "0"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--tensor-parallel-size 3 is not one of [1, 2, 4, 8]"),
        "{err}"
    );
    let out = pagewise(&[
        "serve",
        MODEL,
        "--tensor-parallel-size",
        "4",
        "--nnodes",
        "2",
        "--port",
        "0",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--master-port is required"), "{err}");
    let out = pagewise(&["serve", MODEL, "--headless", "--port", "0"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--headless is for the other nodes"), "{err}");
}

#[test]
fn a_serving_benchmark_whose_every_request_fails_exits_with_the_first_error() {
    // Nothing listens on port 1: every request fails to connect.
    let out = pagewise(&[
        "bench",
        "serve",
        "--base-url",
        "http://127.0.0.1:1",
        "--model",
        "nobody",
        "--num-prompts",
        "2",
        "--random-input-len",
        "4",
        "--random-output-len",
        "2",
        "--random-vocab-size",
        "100",
        "--no-progress",
    ]);
    assert!(!out.status.success(), "a run with no answer exited 0");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("failed requests: 2"), "{stdout}");
    assert!(stdout.contains("first error:"), "{stdout}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("every request failed"), "{stderr}");
}
