//! A real pagewise server on 127.0.0.1:0 for HTTP tests, and helpers to talk to it.

#![allow(dead_code)]

use std::time::Duration;

use pagewise::EngineArgs;
use pagewise::engine::handle::EngineHandle;
use pagewise::server::{self, AppState, ServerOptions};
use serde_json::Value;

pub const MODEL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/qwen2-bias");
pub const CHATML: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

pub fn engine_args() -> EngineArgs {
    EngineArgs {
        model: MODEL.into(),
        chat_template: Some(CHATML.into()),
        ..Default::default()
    }
}

pub async fn start(api_keys: Vec<String>) -> (String, AppState) {
    start_with(api_keys, 0, 256).await
}

pub async fn start_with(
    api_keys: Vec<String>,
    max_num_queued_requests: usize,
    max_num_seqs: usize,
) -> (String, AppState) {
    let args = EngineArgs {
        max_num_seqs,
        ..engine_args()
    };
    let opts = ServerOptions {
        served_model_names: vec!["tiny".into()],
        api_keys,
        allowed_origins: vec![],
        max_num_queued_requests,
        sse_keepalive: Some(Duration::from_millis(20)),
        ..Default::default()
    };
    serve(args, opts).await
}

/// A server for `args` with `opts` on 127.0.0.1:0: its base URL and state.
pub async fn serve(args: EngineArgs, opts: ServerOptions) -> (String, AppState) {
    let forever = std::future::pending();
    let (base, state, _) = serve_until(args, opts, forever, Duration::from_secs(5)).await;
    (base, state)
}

/// A server for `args` with `opts` on 127.0.0.1:0 until `shutdown` (draining up to `drain`): its
/// base URL, state, and the task running `server::serve` (its outcome).
pub async fn serve_until(
    args: EngineArgs,
    opts: ServerOptions,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    drain: Duration,
) -> (
    String,
    AppState,
    tokio::task::JoinHandle<std::io::Result<()>>,
) {
    let (engine, info) = EngineHandle::spawn(args, opts.max_num_queued_requests).unwrap();
    let state = AppState::new(engine, info, &opts);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let st = state.clone();
    let task =
        tokio::spawn(async move { server::serve(listener, st, &opts, shutdown, drain).await });
    (base, state, task)
}

/// POSTs `body` as JSON to `path` and returns the response as it starts.
pub async fn send_json(base: &str, path: &str, body: &Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{base}{path}"))
        .json(body)
        .send()
        .await
        .unwrap()
}

/// POSTs `body` to /v1/completions and returns the response as it starts (for streams).
pub async fn send_completion(base: &str, body: &Value) -> reqwest::Response {
    send_json(base, "/v1/completions", body).await
}

/// GETs `path` and parses the JSON body.
pub async fn get_json(base: &str, path: &str) -> Value {
    reqwest::get(format!("{base}{path}"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// GETs `path` and returns the body as text (`/metrics`).
pub async fn get_text(base: &str, path: &str) -> String {
    reqwest::get(format!("{base}{path}"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

pub async fn post(base: &str, path: &str, body: Value) -> (u16, Value) {
    let r = send_json(base, path, &body).await;
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// The `data:` payloads of an SSE body.
pub async fn sse(base: &str, path: &str, body: Value) -> Vec<String> {
    let r = send_json(base, path, &body).await;
    assert_eq!(r.status(), 200);
    assert!(
        r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let text = r.text().await.unwrap();
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    text.split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .map(str::to_string)
        .collect()
}

pub fn assert_error(body: &Value, kind: &str, needle: &str) {
    let e = &body["error"];
    assert_eq!(e["type"], kind, "{body}");
    assert!(e["message"].as_str().unwrap().contains(needle), "{body}");
    assert!(
        e.get("param").is_some() && e.get("code").is_some(),
        "{body}"
    );
}

/// The typed events of an SSE body (the Responses and Messages APIs): each event's name and data.
pub async fn typed_sse(base: &str, path: &str, body: &Value) -> Vec<(String, Value)> {
    let r = send_json(base, path, body).await;
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    text.split("\n\n")
        .filter(|e| e.contains("data: "))
        .map(|e| {
            let name = e
                .lines()
                .find_map(|l| l.strip_prefix("event: "))
                .unwrap_or("");
            let data = e.lines().find_map(|l| l.strip_prefix("data: ")).unwrap();
            (name.to_string(), serde_json::from_str(data).unwrap())
        })
        .collect()
}
