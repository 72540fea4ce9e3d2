//! The `pagewise` binary: generate, JSON logs, --config precedence, refused flags.

use std::process::Command;

#[path = "common/hub.rs"]
mod hub;

const MODEL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/qwen2-bias");

fn pagewise(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_pagewise"))
        .args(args)
        .output()
        .unwrap()
}

/// `pagewise --log-format json generate --model MODEL --prompt hi` with `args` after it on one
/// thread, `env` set and no KV-cache setting inherited; its stdout and stderr (it must succeed).
fn generate(args: &[&str], env: &[(&str, &str)]) -> (String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_pagewise"))
        .args(["--log-format", "json", "generate", "--model", MODEL])
        .args(["--prompt", "hi", "--cpu-threads", "1"])
        .args(args)
        .env_remove("PAGEWISE_KV_CACHE_MEMORY")
        .env_remove("VLLM_CPU_KVCACHE_SPACE")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(out.status.success(), "{stderr}");
    (String::from_utf8(out.stdout).unwrap(), stderr)
}

/// The stderr of `pagewise generate --model MODEL --prompt hi` with `args` after it, which must
/// fail.
fn generate_fails(args: &[&str]) -> String {
    let out = pagewise(&[&["generate", "--model", MODEL, "--prompt", "hi"], args].concat());
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{args:?}: {stderr}");
    stderr
}

/// The first JSON log line of `stderr` whose text contains `needle`.
fn log_line(stderr: &str, needle: &str) -> serde_json::Value {
    let line = stderr.lines().find(|l| l.contains(needle)).unwrap();
    serde_json::from_str(line).unwrap()
}

#[test]
fn generate_prints_completions_and_json_logs() {
    let (stdout, stderr) = generate(
        &[
            "--prompt",
            "yo",
            "--max-tokens",
            "3",
            "--temperature",
            "0",
            "--ignore-eos",
        ],
        &[],
    );
    assert_eq!(
        stdout
            .matches("--- finish_reason: length, 3 tokens")
            .count(),
        2,
        "{stdout}"
    );
    let v = log_line(&stderr, "KV cache allocated");
    assert_eq!(v["level"], "INFO");
    assert!(v["fields"]["num_blocks"].as_u64().unwrap() > 0);
    // --cpu-threads sizes the CPU's thread pool.
    let v = log_line(&stderr, "opening the model");
    assert_eq!(v["fields"]["cpu_threads"], 1, "{v}");
    // One line says where the startup went.
    let ready = stderr
        .lines()
        .filter(|l| l.contains("ready in"))
        .collect::<Vec<_>>();
    assert_eq!(ready.len(), 1, "{stderr}");
    for phase in [
        "device",
        "weights",
        "model",
        "KV cache",
        "CUDA graphs",
        "chat template",
    ] {
        assert!(ready[0].contains(phase), "{}", ready[0]);
    }
}

/// Bytes of the KV cache `pagewise generate` allocates with `args` and `env`.
fn kv_cache_bytes(args: &[&str], env: &[(&str, &str)]) -> u64 {
    let (_, stderr) = generate(&[&["--max-tokens", "2"], args].concat(), env);
    log_line(&stderr, "KV cache allocated")["fields"]["bytes"]
        .as_u64()
        .unwrap()
}

/// The CPU KV cache: by default a share of the available memory (here more than a few MiB, up
/// to what 256 full-length sequences of the tiny model take); vLLM's `VLLM_CPU_KVCACHE_SPACE`
/// (GiB, 0: the default) and `--kv-cache-memory` (bytes, which wins) set it.
#[test]
fn the_cpu_kv_cache_is_sized_from_memory_or_the_settings() {
    const MIB: u64 = 1 << 20;
    let default = kv_cache_bytes(&[], &[]);
    assert!(default > 8 * MIB, "default: {default}");
    let vllm = kv_cache_bytes(&[], &[("VLLM_CPU_KVCACHE_SPACE", "0.004")]);
    assert!(
        vllm <= 4 * MIB + MIB / 10 && vllm > 3 * MIB,
        "VLLM_CPU_KVCACHE_SPACE: {vllm}"
    );
    assert_eq!(
        kv_cache_bytes(&[], &[("VLLM_CPU_KVCACHE_SPACE", "0")]),
        default
    );
    let both = kv_cache_bytes(
        &["--kv-cache-memory", "2097152"],
        &[("VLLM_CPU_KVCACHE_SPACE", "0.004")],
    );
    assert!(both <= 2 * MIB && both > MIB, "--kv-cache-memory: {both}");
    let out = Command::new(env!("CARGO_BIN_EXE_pagewise"))
        .args(["generate", "--model", MODEL, "--prompt", "hi"])
        .env("VLLM_CPU_KVCACHE_SPACE", "-1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("not a number of GiB"),
        "{stderr}"
    );
}

/// `--kv-cache-dtype auto` (the model's dtype) runs. On the CPU `fp8` (and its alias
/// `fp8_e4m3`) is a clear startup error (the CPU's cache is f32); `fp8_e5m2` is refused by name
/// everywhere; an unknown dtype lists the ones there are.
#[test]
fn kv_cache_dtype_auto_runs_and_fp8_is_refused_on_the_cpu_by_name() {
    let (stdout, _) = generate(&["--kv-cache-dtype", "auto", "--max-tokens", "2"], &[]);
    assert!(stdout.contains("finish_reason"), "{stdout}");
    for fp8 in ["fp8", "fp8_e4m3"] {
        let stderr = generate_fails(&["--kv-cache-dtype", fp8]);
        assert!(
            stderr.contains("--kv-cache-dtype fp8 needs a GPU: the CPU's KV cache is f32"),
            "{stderr}"
        );
    }
    let stderr = generate_fails(&["--kv-cache-dtype", "fp8_e5m2"]);
    assert!(
        stderr.contains("an FP8 KV cache as fp8_e5m2 is not implemented"),
        "{stderr}"
    );
    let stderr = generate_fails(&["--kv-cache-dtype", "int8"]);
    assert!(
        stderr.contains("`auto`, `fp8` and `fp8_e4m3` are the ones there are"),
        "{stderr}"
    );
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
    // A key no flag reads (a typo, a vLLM setting pagewise lacks) is refused by name, not ignored.
    for key in ["max-num-seq", "swap-space"] {
        let cfg = dir.join(format!("{key}.yaml"));
        std::fs::write(&cfg, format!("max-model-len: 64\n{key}: 8\n")).unwrap();
        let stderr = generate_fails(&["--config", cfg.to_str().unwrap()]);
        assert!(
            stderr.contains(&format!("`{key}` is not a setting")),
            "{stderr}"
        );
    }
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

/// `--enable-expert-parallel` splits a mixture's experts over a tensor-parallel group; where
/// there is none to split (a dense model, or one device) it runs and says it does nothing.
#[test]
fn expert_parallelism_without_a_group_or_experts_runs_and_says_so() {
    let (_, stderr) = generate(&["--enable-expert-parallel", "--max-tokens", "2"], &[]);
    let line = log_line(&stderr, "--enable-expert-parallel has no effect");
    assert!(line.to_string().contains("a dense model"), "{line}");
    let mixtral = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/mixtral");
    let out = Command::new(env!("CARGO_BIN_EXE_pagewise"))
        .args(["--log-format", "json", "generate", "--model", mixtral])
        .args([
            "--prompt",
            "hi",
            "--max-tokens",
            "2",
            "--enable-expert-parallel",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let line = log_line(&stderr, "--enable-expert-parallel has no effect");
    assert!(line.to_string().contains("one device"), "{line}");
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

/// `pagewise serve` with `args` and environment `env` must fail with one `error: ` line that
/// contains every one of `needles` (the cause and the fix), and no backtrace or "Caused by".
fn fails_in_one_line(args: &[&str], env: &[(&str, &str)], needles: &[&str]) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pagewise"));
    cmd.args(args)
        .env_remove("RUST_BACKTRACE")
        .env("RUST_LOG", "error");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("error: "))
        .collect();
    assert_eq!(errors.len(), 1, "{args:?}: {stderr}");
    assert!(
        !stderr.contains("Caused by") && !stderr.contains("backtrace"),
        "{stderr}"
    );
    for needle in needles {
        assert!(
            errors[0].contains(needle),
            "{args:?}: {needle:?} not in {}",
            errors[0]
        );
    }
}

/// The errors a newcomer meets first, each one line that names the fix.
#[test]
fn newcomer_errors_are_one_line_that_names_the_fix() {
    let home = std::env::temp_dir().join(format!("pagewise-hf-home-{}", std::process::id()));
    let home = home.to_str().unwrap();
    let id = "nosuchorg/nosuchmodel";
    // A model id that does not exist.
    let hub = hub::hub_serving(Vec::new());
    fails_in_one_line(
        &["serve", "--model", id],
        &[("HF_HOME", home), ("HF_ENDPOINT", &hub)],
        &[
            "no model \"nosuchorg/nosuchmodel\" on the Hugging Face hub",
            "check the name",
        ],
    );
    // Downloads are logged file by file when stderr is not a terminal (a bar when it is).
    let out = Command::new(env!("CARGO_BIN_EXE_pagewise"))
        .args(["serve", "--model", id])
        .env("HF_HOME", home)
        .env("HF_ENDPOINT", &hub)
        .env("RUST_LOG", "info")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("downloading config.json of {id} from {hub}")),
        "{stderr}"
    );
    // No network.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed_url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    fails_in_one_line(
        &["serve", "--model", id],
        &[("HF_HOME", home), ("HF_ENDPOINT", &closed_url)],
        &["cannot reach the Hugging Face hub", "HF_HUB_OFFLINE=1"],
    );
    // Offline, and not in the cache.
    fails_in_one_line(
        &["serve", "--model", id],
        &[("HF_HOME", home), ("HF_HUB_OFFLINE", "1")],
        &["not in the Hugging Face cache", "unset HF_HUB_OFFLINE"],
    );
    // A port in use.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    fails_in_one_line(
        &[
            "serve",
            "--model",
            MODEL,
            "--host",
            "127.0.0.1",
            "--port",
            &port,
        ],
        &[],
        &[&format!("port {port} on 127.0.0.1 is in use"), "--port"],
    );
    // No GPU (this build has none).
    fails_in_one_line(
        &["serve", "--model", MODEL, "--device", "cuda", "--port", "0"],
        &[],
        &["without GPU support", "--features cuda"],
    );
    // Safetensors without config.json.
    let dir = std::env::temp_dir().join(format!("pagewise-no-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(
        format!("{MODEL}/model.safetensors"),
        dir.join("model.safetensors"),
    )
    .unwrap();
    fails_in_one_line(
        &["serve", "--model", dir.to_str().unwrap(), "--port", "0"],
        &[],
        &["no config.json", "put the model's config.json"],
    );
    // A GGUF of an architecture pagewise does not run: the Qwen3 fixture renamed "zzzz3"
    // (every key of the file with it, so it is still well formed).
    let gguf = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/qwen3-qknorm/model-F32.gguf"
    ))
    .unwrap();
    let mut renamed = gguf.clone();
    for i in 0..gguf.len().saturating_sub(5) {
        if &gguf[i..i + 5] == b"qwen3" {
            renamed[i..i + 5].copy_from_slice(b"zzzz3");
        }
    }
    let file = dir.join("zzzz3.gguf");
    std::fs::write(&file, renamed).unwrap();
    fails_in_one_line(
        &["serve", "--model", file.to_str().unwrap(), "--port", "0"],
        &[],
        &[
            "GGUF architecture \"zzzz3\" is not supported",
            "llama",
            "qwen3",
        ],
    );
    std::fs::remove_dir_all(&dir).unwrap();
    let _ = std::fs::remove_dir_all(home);
}
