//! Data parallelism on the CPU (`--data-parallel-size`): one server in front of two engine
//! replicas in this process. Requests that share a prefix land on the same replica (whose prefix
//! cache then serves them), new prefixes go to the other; greedy outputs equal a single engine's;
//! `/metrics` labels each replica's samples and `/dashboard/events?engine=i` watches replica i.

mod common;

use std::time::Duration;

use common::server::{engine_args, get_text, send_json};
use pagewise::EngineArgs;
use pagewise::engine::replicas;
use pagewise::server::{self, AppState, ServerOptions};
use serde_json::{Value, json};

/// A server over `n` replicas of the tiny fixture model: its base URL.
async fn start(n: usize) -> String {
    let args = EngineArgs {
        max_num_seqs: 4,
        kv_cache_memory: Some(8 << 20),
        ..engine_args()
    };
    let opts = ServerOptions {
        served_model_names: vec!["tiny".into()],
        sse_keepalive: Some(Duration::from_millis(20)),
        ..Default::default()
    };
    let (engines, info) = replicas::spawn(&args, n, 0).unwrap();
    assert_eq!(engines.replicas().len(), n);
    let state = AppState::new(engines, info, &opts);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let forever = std::future::pending();
    let drain = Duration::from_secs(5);
    tokio::spawn(async move { server::serve(listener, state, &opts, forever, drain).await });
    base
}

/// A 64-token prompt: a 48-token prefix of family `family`, then 16 tokens of `variant`.
fn prompt(family: u32, variant: u32) -> Vec<u32> {
    let prefix = (0..48).map(|i| 10 + (family * 37 + i * 7) % 300);
    let rest = (0..16).map(|i| 10 + (variant * 53 + i * 11) % 300);
    prefix.chain(rest).collect()
}

/// The greedy completion of `tokens` (8 tokens).
async fn complete(base: &str, tokens: &[u32]) -> String {
    let body = json!({
        "model": "tiny", "prompt": tokens, "max_tokens": 8, "temperature": 0, "ignore_eos": true
    });
    let response = send_json(base, "/v1/completions", &body).await;
    assert_eq!(response.status(), 200);
    let v: Value = response.json().await.unwrap();
    v["choices"][0]["text"].as_str().unwrap().to_string()
}

/// The value of the sample of `name` for replica `engine` in a /metrics text.
fn sample(text: &str, name: &str, engine: usize) -> f64 {
    let label = format!("engine=\"{engine}\"");
    text.lines()
        .find(|l| l.starts_with(&format!("{name}{{")) && l.contains(&label))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} for engine {engine} not in /metrics:\n{text}"))
}

async fn metrics(base: &str) -> String {
    get_text(base, "/metrics").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_prefixes_land_together_and_outputs_equal_one_engine() {
    let (two, one) = (start(2).await, start(1).await);
    let mut got = Vec::new();
    for family in [1, 2] {
        for variant in 0..3 {
            got.push(complete(&two, &prompt(family, variant)).await);
        }
    }
    let text = metrics(&two).await;
    // The first family went to replica 0 and stayed; the second, new, went to replica 1.
    for engine in [0, 1] {
        assert_eq!(sample(&text, "pagewise:routed_requests_total", engine), 3.0);
        // Each replica served its family's later prompts' 48 shared tokens (3 blocks of 16)
        // from its prefix cache.
        let hits = sample(&text, "vllm:prefix_cache_hits_total", engine);
        assert!(
            hits >= 2.0 * 48.0,
            "engine {engine}: {hits} prefix-cache hits"
        );
        assert!(sample(&text, "vllm:generation_tokens_total", engine) >= 24.0);
        assert_eq!(sample(&text, "pagewise:engine_alive", engine), 1.0);
    }
    // Each metric family has one header, one sample a replica.
    assert_eq!(text.matches("# TYPE vllm:num_requests_running").count(), 1);
    assert_eq!(text.matches("vllm:num_requests_running{").count(), 2);
    // The same greedy tokens as one engine's.
    let mut want = Vec::new();
    for family in [1, 2] {
        for variant in 0..3 {
            want.push(complete(&one, &prompt(family, variant)).await);
        }
    }
    assert_eq!(got, want);
    let one_text = metrics(&one).await;
    assert_eq!(sample(&one_text, "pagewise:routed_requests_total", 0), 6.0);
    assert!(!one_text.contains("engine=\"1\""));
}

/// Concurrent requests of one family: its replica takes them until it is a full batch
/// (`--max-num-seqs` 4) busier than the other, which then takes the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_replica_gives_way_to_the_idle_one() {
    let base = start(2).await;
    let body = |variant: u32| {
        json!({"model": "tiny", "prompt": prompt(7, variant), "max_tokens": 180,
               "temperature": 0, "ignore_eos": true})
    };
    let sends = (0..12).map(|v| {
        let (base, body) = (base.clone(), body(v));
        async move { send_json(&base, "/v1/completions", &body).await.status() }
    });
    let statuses = futures_util::future::join_all(sends).await;
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    let text = metrics(&base).await;
    let routed = [0, 1].map(|e| sample(&text, "pagewise:routed_requests_total", e));
    assert_eq!(routed[0] + routed[1], 12.0);
    assert!(routed[0] >= 4.0 && routed[1] >= 1.0, "{routed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_watches_the_replica_asked_for() {
    let base = start(2).await;
    let events = |q: &str| reqwest::get(format!("{base}/dashboard/events{q}"));
    for q in ["", "?engine=0", "?engine=1"] {
        let mut response = events(q).await.unwrap();
        assert_eq!(response.status(), 200, "{q}");
        let chunk = tokio::time::timeout(Duration::from_secs(10), response.chunk())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        let frame = String::from_utf8_lossy(&chunk).into_owned();
        assert!(frame.contains("event: snapshot"), "{q}: {frame}");
    }
    let response = events("?engine=2").await.unwrap();
    assert_eq!(response.status(), 404);
    let v: Value = response.json().await.unwrap();
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains("no engine 2"), "{message}");
}

#[test]
fn replicas_of_a_tensor_parallel_group_experts_over_replicas_or_none_are_refused_by_name() {
    let mut args = engine_args();
    args.parallel.tensor_parallel_size = 2;
    let e = replicas::spawn(&args, 2, 0).err().unwrap().to_string();
    assert!(
        e.contains("--data-parallel-size above 1 with --tensor-parallel-size"),
        "{e}"
    );
    let mut args = engine_args();
    args.parallel.enable_expert_parallel = true;
    let e = replicas::spawn(&args, 2, 0).err().unwrap().to_string();
    assert!(
        e.contains("--enable-expert-parallel with --data-parallel-size"),
        "{e}"
    );
    let e = replicas::spawn(&engine_args(), 0, 0)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("--data-parallel-size must be at least 1"), "{e}");
}
