//! Server lifecycle over HTTP: a disconnecting client freeing its sequence, metrics, 429 on a full
//! queue, keep-alive comments, and the shutdown timeout ending the rest with an error event.

mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::server::*;
use futures_util::StreamExt;
use pagewise::EngineArgs;
use pagewise::server::ServerOptions;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_mid_stream_frees_its_sequence() {
    let (base, state) = start(vec![]).await;
    let r = reqwest::Client::new()
        .post(format!("{base}/v1/completions"))
        .json(&json!({"prompt": "x", "max_tokens": 240, "ignore_eos": true, "stream": true}))
        .send()
        .await
        .unwrap();
    let mut body = r.bytes_stream();
    body.next().await.unwrap().unwrap();
    drop(body);
    // The engine frees the sequence within a step of noticing; /metrics shows it (polled: the
    // running count alone is ambiguous right after the first token).
    let freed = "vllm:kv_cache_usage_perc{model_name=\"tiny\",engine=\"0\"} 0\n";
    let aborted = "vllm:request_success_total{model_name=\"tiny\",finished_reason=\"abort\"} 1\n";
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = reqwest::get(format!("{base}/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let running = state.engine.replicas()[0]
            .stats()
            .num_running
            .load(Ordering::Acquire);
        if text.contains(freed) && text.contains(aborted) && running == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the sequence kept its blocks after the client left: {text}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        state.engine.replicas()[0]
            .stats()
            .num_generated_tokens
            .load(Ordering::Relaxed)
            < 240
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_use_vllm_names() {
    let (base, _) = start(vec![]).await;
    let (s, _) = post(
        &base,
        "/v1/completions",
        json!({"prompt": "abc", "max_tokens": 4, "ignore_eos": true}),
    )
    .await;
    assert_eq!(s, 200);
    let r = reqwest::get(format!("{base}/metrics")).await.unwrap();
    assert!(
        r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain")
    );
    let text = r.text().await.unwrap();
    for name in [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:num_preemptions_total",
        "vllm:request_success_total",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_count",
        "vllm:e2e_request_latency_seconds_sum",
        "vllm:request_queue_time_seconds_count",
    ] {
        assert!(text.contains(name), "{name} missing from\n{text}");
    }
    // Our own: where the engine's steps spend their time, read back the way `bench serve` does.
    let steps = pagewise::bench::server_steps::StepCounters::parse(&text).expect("step counters");
    assert!(steps.steps >= 1, "{text}");
    assert!(steps.seconds.iter().sum::<f64>() > 0.0, "{text}");
    assert!(text.contains(
        "pagewise:engine_step_phase_seconds_total{model_name=\"tiny\",engine=\"0\",phase=\"forward\"}"
    ));
    assert!(
        text.contains("vllm:prompt_tokens_total{model_name=\"tiny\"} 3\n"),
        "{text}"
    );
    assert!(
        text.contains("vllm:generation_tokens_total{model_name=\"tiny\",engine=\"0\"} 4\n"),
        "{text}"
    );
    assert!(text.contains("finished_reason=\"length\"} 1\n"), "{text}");
    assert!(
        text.contains("vllm:time_to_first_token_seconds_count{model_name=\"tiny\"} 1\n"),
        "{text}"
    );
    assert!(
        text.contains("vllm:inter_token_latency_seconds_count{model_name=\"tiny\"} 3\n"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_waiting_queue_answers_429_with_retry_after() {
    let (base, state) = start_with(vec![], 1, 1).await;
    let long = json!({"prompt": "x", "max_tokens": 240, "ignore_eos": true, "stream": true});
    let first = send_completion(&base, &long).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while state.engine.num_queued() > 0 {
        assert!(Instant::now() < deadline, "the first request never started");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let second = send_completion(&base, &long).await;
    while state.engine.replicas()[0]
        .stats()
        .num_waiting
        .load(Ordering::Relaxed)
        < 1
    {
        assert!(Instant::now() < deadline, "the second request never waited");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let r = send_completion(&base, &long).await;
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["retry-after"], "1");
    assert_error(&r.json().await.unwrap(), "rate_limit_error", "overloaded");
    drop((first, second));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_timeout_ends_the_rest_with_an_error_event() {
    let args = EngineArgs {
        max_num_seqs: 1,
        ..engine_args()
    };
    let opts = ServerOptions {
        served_model_names: vec!["tiny".into()],
        max_num_queued_requests: 64,
        ..Default::default()
    };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let stop = async move {
        let _ = stop_rx.await;
    };
    let (base, _, server) = serve_until(args, opts, stop, Duration::from_millis(200)).await;
    let long = json!({"prompt": "x", "max_tokens": 250, "ignore_eos": true, "stream": true});
    let mut streams = Vec::new();
    for _ in 0..20 {
        let r = reqwest::Client::new()
            .post(format!("{base}/v1/completions"))
            .json(&long)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        streams.push(tokio::spawn(async move { r.text().await.unwrap() }));
    }
    stop_tx.send(()).unwrap();
    let started = Instant::now();
    let mut errors = 0;
    for s in streams {
        let text = s.await.unwrap();
        assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
        if text.contains("\"error\"") {
            errors += 1;
            assert!(text.contains("shutting down"), "{text}");
        }
    }
    assert!(
        errors > 0,
        "20 x 250 tokens one at a time cannot finish in 200 ms"
    );
    server.await.unwrap().unwrap();
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_stream_gets_keep_alive_comments() {
    // One sequence at a time: the second stream waits, silent but for keep-alives (every 20 ms).
    let (base, _) = start_with(vec![], 0, 1).await;
    let long = json!({"prompt": "x", "max_tokens": 250, "ignore_eos": true, "stream": true});
    let first = send_completion(&base, &long).await;
    let second = send_completion(&base, &long).await;
    let (a, b) = (first.text().await.unwrap(), second.text().await.unwrap());
    assert!(a.ends_with("data: [DONE]\n\n") && b.ends_with("data: [DONE]\n\n"));
    assert!(b.contains(": keep-alive\n\n"), "{}", &b[..b.len().min(300)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_queue_limit_accepts_a_whole_burst() {
    // `--max-num-queued-requests 0` means no limit: a burst far beyond what runs at once waits
    // its turn, none refused.
    let (base, _) = start_with(vec![], 0, 1).await;
    let body = json!({"prompt": "x", "max_tokens": 3, "ignore_eos": true});
    let burst: Vec<_> = (0..40)
        .map(|_| {
            let (base, body) = (base.clone(), body.clone());
            tokio::spawn(async move { post(&base, "/v1/completions", body).await })
        })
        .collect();
    for r in burst {
        let (status, reply) = r.await.unwrap();
        assert_eq!(status, 200, "{reply}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_counts_queued_sequences_live() {
    // One sequence runs; at most 2 may wait. A burst of 10 concurrent requests lands between two
    // engine steps' published counts: exactly 2 are accepted, whatever was published.
    let (base, state) = start_with(vec![], 2, 1).await;
    let long = json!({"prompt": "x", "max_tokens": 250, "ignore_eos": true, "stream": true});
    let first = send_completion(&base, &long).await;
    assert_eq!(first.status(), 200);
    let deadline = Instant::now() + Duration::from_secs(10);
    while state.engine.num_queued() > 0 {
        assert!(Instant::now() < deadline, "the first request never started");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let burst: Vec<_> = (0..10)
        .map(|_| {
            let (base, long) = (base.clone(), long.clone());
            tokio::spawn(async move { send_completion(&base, &long).await })
        })
        .collect();
    let mut accepted = Vec::new();
    let mut refused = 0;
    for r in burst {
        let r = r.await.unwrap();
        match r.status().as_u16() {
            200 => accepted.push(r),
            429 => refused += 1,
            s => panic!("unexpected status {s}"),
        }
    }
    assert_eq!(accepted.len(), 2, "{refused} refused");
    assert_eq!(state.engine.num_queued(), 2);
    let metrics = reqwest::get(format!("{base}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("pagewise:num_queued_sequences{model_name=\"tiny\",engine=\"0\"} 2\n"),
        "{metrics}"
    );
    assert!(metrics.contains("pagewise:engine_alive{model_name=\"tiny\",engine=\"0\"} 1\n"));
    drop((first, accepted));
    let deadline = Instant::now() + Duration::from_secs(10);
    while state.engine.num_queued() > 0
        || state.engine.replicas()[0]
            .stats()
            .num_running
            .load(Ordering::Relaxed)
            > 0
    {
        assert!(
            Instant::now() < deadline,
            "abandoned requests were not released"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
