//! The engine thread through its async handle: concurrent requests, n > 1, rejections, and a
//! dropped receiver aborting its sequences.

mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::greedy;
use pagewise::engine::handle::{EngineHandle, GenerateRequest, StreamEvent};
use pagewise::{EngineArgs, FinishReason, Llm, SamplingParams};

const MODEL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/qwen2-bias");

fn args() -> EngineArgs {
    EngineArgs {
        model: MODEL.into(),
        ..Default::default()
    }
}

async fn collect(
    mut rx: tokio::sync::mpsc::UnboundedReceiver<StreamEvent>,
    n: usize,
) -> Vec<(Vec<u32>, Option<FinishReason>)> {
    let mut out = vec![(Vec::new(), None); n];
    while let Some(e) = rx.recv().await {
        match e {
            StreamEvent::Token {
                index,
                token_id,
                finish,
                ..
            } => {
                out[index].0.push(token_id);
                out[index].1 = finish;
            }
            StreamEvent::Error(e) => panic!("{e}"),
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_match_offline_generation() {
    let prompts: Vec<Vec<u32>> = (0..6u32)
        .map(|i| (1..10 + i * 3).map(|t| (t * 7 + i) % 250).collect())
        .collect();
    let expected = Llm::new(args())
        .unwrap()
        .generate_tokens(prompts.clone(), &greedy(12))
        .unwrap();

    let (engine, info) = EngineHandle::spawn(args(), 64).unwrap();
    assert_eq!(info.vocab_size, 320);
    let mut tasks = Vec::new();
    for p in prompts.clone() {
        let engine = engine.clone();
        tasks.push(tokio::spawn(async move {
            let rx = engine
                .submit(GenerateRequest {
                    prompt_token_ids: p,
                    params: greedy(12),
                    cache_salt: None,
                    guide: None,
                })
                .await
                .unwrap();
            collect(rx, 1).await
        }));
    }
    for (task, want) in tasks.into_iter().zip(&expected) {
        let got = task.await.unwrap();
        assert_eq!(got[0].0, want.outputs[0].token_ids);
        assert_eq!(got[0].1, Some(FinishReason::Length));
    }

    // n = 2 with a seed: two completions, each reproducible.
    let params = SamplingParams {
        n: 2,
        seed: Some(7),
        max_tokens: 10,
        ignore_eos: true,
        ..Default::default()
    };
    let req = GenerateRequest {
        prompt_token_ids: prompts[0].clone(),
        params,
        cache_salt: None,
        guide: None,
    };
    let a = collect(engine.submit(req.clone()).await.unwrap(), 2).await;
    let b = collect(engine.submit(req).await.unwrap(), 2).await;
    assert_eq!(a, b);
    assert_eq!(a[0].0.len(), 10);
    assert_ne!(
        a[0].0, a[1].0,
        "the n completions use different random streams"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_requests_are_rejected_and_dropped_receivers_abort() {
    let (engine, _) = EngineHandle::spawn(args(), 64).unwrap();
    let bad = GenerateRequest {
        prompt_token_ids: vec![1, 2, 3],
        params: SamplingParams {
            top_p: 0.0,
            ..Default::default()
        },
        cache_salt: None,
        guide: None,
    };
    let err = engine.submit(bad).await.unwrap_err();
    assert!(err.to_string().contains("top_p"), "{err}");
    let too_long = GenerateRequest {
        prompt_token_ids: vec![1; 250],
        params: greedy(10),
        cache_salt: None,
        guide: None,
    };
    let err = engine.submit(too_long).await.unwrap_err();
    assert!(
        err.to_string()
            .contains("maximum context length is 256 tokens"),
        "{err}"
    );

    let long = GenerateRequest {
        prompt_token_ids: vec![5, 6, 7],
        params: greedy(200),
        cache_salt: None,
        guide: None,
    };
    let mut rx = engine.submit(long).await.unwrap();
    for _ in 0..3 {
        assert!(matches!(
            rx.recv().await,
            Some(StreamEvent::Token { finish: None, .. })
        ));
    }
    drop(rx);
    let deadline = Instant::now() + Duration::from_secs(10);
    while engine.stats().num_running.load(Ordering::Relaxed) > 0 {
        assert!(
            Instant::now() < deadline,
            "the abandoned sequence kept running"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(engine.stats().num_generated_tokens.load(Ordering::Relaxed) < 200);
    assert!(engine.is_alive());
}
