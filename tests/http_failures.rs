//! Failures over HTTP. The engine's death (a panic, or a failed step as from a device fault) turns
//! `/health` and `/ready` to 503, fails every request in flight with a 503-class error, and makes
//! `serve` return an error (the process exits non-zero). A failure that belongs to one request
//! ends that request alone. Faults are injected through the `fault-injection` feature
//! (src/engine/faults.rs), triggered by a token id in the prompt of the request that meets them.

mod common;

use std::time::Duration;

use common::server::*;
use futures_util::StreamExt;
use pagewise::EngineArgs;
use pagewise::engine::faults::Faults;
use pagewise::engine::handle::EngineHandle;
use pagewise::server::{AppState, ServerOptions};
use serde_json::{Value, json};

/// A token id of the tiny model's vocabulary that its tokenizer never produces from text.
const TRIGGER: u32 = 300;

/// A server with `faults` armed: base URL, state, and the `serve` task (its outcome).
async fn start_faulty(
    faults: Faults,
) -> (
    String,
    AppState,
    tokio::task::JoinHandle<std::io::Result<()>>,
) {
    let args = EngineArgs {
        faults,
        ..engine_args()
    };
    let opts = ServerOptions {
        served_model_names: vec!["tiny".into()],
        ..Default::default()
    };
    serve_until(args, opts, std::future::pending(), Duration::from_secs(5)).await
}

/// Starts a long stream and waits for its first chunk (so it is running).
async fn running_stream(base: &str) -> reqwest::Response {
    let long = json!({"prompt": "x", "max_tokens": 240, "ignore_eos": true, "stream": true});
    let r = send_completion(base, &long).await;
    assert_eq!(r.status(), 200);
    r
}

/// The rest of an SSE body, as text.
async fn rest_of(r: reqwest::Response) -> String {
    let mut body = r.bytes_stream();
    let mut text = String::new();
    while let Some(chunk) = body.next().await {
        text.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
    }
    text
}

async fn status_of(base: &str, path: &str) -> u16 {
    reqwest::get(format!("{base}{path}"))
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// The death path, whatever killed the engine: the running stream ends with a 503-class error
/// event and [DONE], the request that met the fault gets a 503, health and readiness turn 503,
/// new requests get 503, and `serve` returns an error.
async fn assert_engine_death(faults: Faults, cause: &str) {
    let (base, _, server) = start_faulty(faults).await;
    assert_eq!(status_of(&base, "/health").await, 200);
    let victim = running_stream(&base).await;
    let (status, reply) = post(
        &base,
        "/v1/completions",
        json!({"prompt": [5, TRIGGER, 6], "max_tokens": 4}),
    )
    .await;
    assert_eq!(status, 503, "{reply}");
    assert_error(&reply, "service_unavailable_error", cause);

    let text = rest_of(victim).await;
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    assert!(text.contains("service_unavailable_error"), "{text}");
    assert!(text.contains(cause), "{text}");

    // The server exits once the errors are delivered; until then it answers 503.
    let outcome = tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("serve must return after the engine dies")
        .unwrap();
    let err = outcome.expect_err("serve must fail when the engine dies");
    assert!(err.to_string().contains("the engine died"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_panic_flips_health_and_ends_the_server() {
    let faults = Faults {
        panic_on_token: Some(TRIGGER),
        ..Default::default()
    };
    assert_engine_death(faults, "injected engine panic").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_fault_takes_the_engine_death_path() {
    let faults = Faults {
        device_error_on_token: Some(TRIGGER),
        ..Default::default()
    };
    assert_engine_death(faults, "injected device fault").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_ready_answer_503_before_a_dead_engine_exits() {
    let faults = Faults {
        panic_on_token: Some(TRIGGER),
        ..Default::default()
    };
    let (base, state, server) = start_faulty(faults).await;
    let (status, _) = post(
        &base,
        "/v1/completions",
        json!({"prompt": [TRIGGER], "max_tokens": 1}),
    )
    .await;
    assert_eq!(status, 503);
    assert!(!state.engine.is_alive());
    for path in ["/health", "/ready"] {
        let r = reqwest::get(format!("{base}{path}")).await.unwrap();
        assert_eq!(r.status(), 503, "{path}");
        let body: Value = r.json().await.unwrap();
        assert_error(&body, "service_unavailable_error", "injected engine panic");
    }
    let (status, reply) = post(&base, "/v1/completions", json!({"prompt": "hi"})).await;
    assert_eq!(status, 503, "{reply}");
    let metrics = reqwest::get(format!("{base}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("pagewise:engine_alive{model_name=\"tiny\",engine=\"0\"} 0\n"),
        "{metrics}"
    );
    assert!(server.await.unwrap().is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_of_one_request_ends_only_that_request() {
    let faults = Faults {
        request_error_on_token: Some(TRIGGER),
        ..Default::default()
    };
    let (base, state, _server) = start_faulty(faults).await;
    let other = running_stream(&base).await;

    let (status, reply) = post(
        &base,
        "/v1/completions",
        json!({"prompt": [5, TRIGGER], "max_tokens": 4}),
    )
    .await;
    assert_eq!(status, 500, "{reply}");
    assert_error(&reply, "internal_server_error", "injected fault");
    let streamed = sse(
        &base,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "hi"}], "stream": true}),
    )
    .await;
    assert!(!streamed.is_empty());
    let stream_fail = send_completion(
        &base,
        &json!({"prompt": [TRIGGER], "max_tokens": 4, "stream": true, "n": 2}),
    )
    .await;
    let text = rest_of(stream_fail).await;
    assert!(text.contains("injected fault"), "{text}");
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");

    // The other request finishes whole, and the engine lives on.
    let text = rest_of(other).await;
    assert!(!text.contains("error"), "{text}");
    assert!(text.contains("\"finish_reason\":\"length\""), "{text}");
    assert_eq!(status_of(&base, "/health").await, 200);
    assert!(state.engine.is_alive());
    let (status, _) = post(
        &base,
        "/v1/completions",
        json!({"prompt": "hi", "max_tokens": 2}),
    )
    .await;
    assert_eq!(status, 200);
}

/// A cache too small for one sequence of the model's whole context: with `--max-model-len`
/// asking for that context, startup fails naming both; without it, the engine serves the
/// context that fits.
#[test]
fn a_cache_too_small_for_one_full_sequence_fails_at_startup_when_asked_for() {
    let args = EngineArgs {
        // 2 layers x 1 KV head x 16 dims x 2 (K, V) x 4 bytes = 256 bytes a token: 128 tokens.
        kv_cache_memory: Some(128 * 256),
        ..engine_args()
    };
    let llm = pagewise::Llm::new(args.clone()).unwrap();
    assert_eq!(llm.core().scheduler().config().max_model_len, 128);
    let args = EngineArgs {
        max_model_len: Some(256),
        ..args
    };
    let err = match EngineHandle::spawn(args, 0) {
        Ok(_) => panic!("a cache of 128 tokens cannot serve max_model_len 256"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("max seq len (256) is larger than the maximum number of tokens"),
        "{err}"
    );
}
