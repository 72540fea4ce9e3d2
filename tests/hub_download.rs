//! Models downloaded from the Hugging Face hub by id, against a mock hub on a local port
//! (`HF_ENDPOINT`): the download's progress lines, then the model runs.

use std::process::Command;

const MODEL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/qwen2-bias");

/// A hub serving `files` of any repository (path `/<org>/<name>/resolve/<rev>/<file>`) as the
/// Hugging Face hub does for hf-hub's client: the commit and an etag on a one-byte range read,
/// then the file from the range asked; 404 for any other file.
fn hub_serving(files: Vec<(&'static str, Vec<u8>)>) -> String {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let files = std::sync::Arc::new(files);
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let files = files.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut request = String::new();
                let _ = reader.read_line(&mut request);
                let mut start = 0usize;
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 || line.trim().is_empty() {
                        break;
                    }
                    if let Some(r) = line.to_ascii_lowercase().strip_prefix("range: bytes=") {
                        start = r.trim().split('-').next().unwrap().parse().unwrap_or(0);
                    }
                }
                let path = request.split_whitespace().nth(1).unwrap_or("");
                let mut out = stream;
                let Some((i, body)) = files
                    .iter()
                    .enumerate()
                    .find(|(_, (name, _))| path.ends_with(&format!("/{name}")))
                    .map(|(i, (_, body))| (i, body))
                else {
                    let _ = out.write_all(
                        b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                    );
                    return;
                };
                let end = body.len();
                let head = format!(
                    "HTTP/1.1 206 Partial Content\r\nx-repo-commit: 0123456789abcdef0123456789abcdef01234567\r\n\
                     etag: \"etag-{i}\"\r\ncontent-range: bytes {start}-{}/{end}\r\n\
                     Content-Length: {}\r\nConnection: close\r\n\r\n",
                    end - 1,
                    end - start
                );
                let _ = out.write_all(head.as_bytes());
                let _ = out.write_all(&body[start..]);
            });
        }
    });
    format!("http://{addr}")
}

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
