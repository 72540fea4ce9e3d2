//! `pagewise bench`: the serving load generator against a real server, and the offline benchmarks.

mod common;

use pagewise::EngineArgs;
use pagewise::bench::offline;
use pagewise::bench::serve::{ServeBenchConfig, run};
use pagewise::server::ServerOptions;

const MODEL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/llama-gqa-tied");
const CHATML: &str =
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}";

fn args() -> EngineArgs {
    EngineArgs {
        model: MODEL.into(),
        chat_template: Some(CHATML.into()),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_benchmark_measures_a_real_server() {
    let opts = ServerOptions {
        served_model_names: vec!["tiny".into()],
        ..Default::default()
    };
    let (base, _) = common::server::serve(args(), opts).await;
    let cfg = ServeBenchConfig {
        base_url: base,
        endpoint: "/v1/completions".into(),
        model: "tiny".into(),
        num_prompts: 30,
        input_len: 16,
        output_len: 8,
        range_ratio: 0.0,
        prefix_len: 4,
        request_rate: 300.0,
        burstiness: 1.0,
        max_concurrency: Some(8),
        ignore_eos: true,
        vocab_size: 250,
        seed: 3,
        api_key: None,
        sharegpt: None,
        tokenizer: None,
        progress: false,
    };
    let r = run(&cfg).await.unwrap();
    assert_eq!((r.completed, r.failed), (30, 0), "{:?}", r.first_error);
    let output_tokens = (r.output_throughput * r.duration_s).round() as usize;
    assert_eq!(output_tokens, 30 * 8);
    let total_tokens = (r.total_token_throughput * r.duration_s).round() as usize;
    assert_eq!(total_tokens, 30 * (8 + 20));
    assert!(r.ttft.mean_ms > 0.0 && r.ttft.p99_ms >= r.ttft.median_ms);
    assert!(r.e2e.mean_ms >= r.ttft.mean_ms);
    assert!(r.itl.mean_ms > 0.0 && r.tpot.mean_ms > 0.0);
    assert!(r.report().contains("successful requests: 30"));
    assert_eq!(r.request_rate, Some(300.0));
    // Our server publishes its engine steps: the run's share of them comes back per step.
    let steps = r.server_steps.expect("the server's step counters");
    assert!(
        steps.steps >= 8,
        "30 requests of 8 tokens take steps: {steps:?}"
    );
    assert!(steps.forward_ms > 0.0 && steps.total_ms() >= steps.forward_ms);
    assert!(r.report().contains("server engine, per step over"));
    check_charts(&r);

    let chat = run(&ServeBenchConfig {
        endpoint: "/v1/chat/completions".into(),
        request_rate: f64::INFINITY,
        ..cfg.clone()
    })
    .await
    .unwrap();
    assert_eq!(
        (chat.completed, chat.failed),
        (30, 0),
        "{:?}",
        chat.first_error
    );
    let bad = run(&ServeBenchConfig {
        model: "other".into(),
        num_prompts: 2,
        ..cfg.clone()
    })
    .await
    .unwrap();
    assert_eq!(bad.failed, 2);
    assert!(
        bad.report().contains("first error: HTTP 404"),
        "{}",
        bad.report()
    );
    assert!(bad.first_error.unwrap().contains("404"));

    // ShareGPT prompts, lengths measured with the model's tokenizer; too-short turns are skipped.
    let path = std::env::temp_dir().join(format!("pagewise-sharegpt-{}.json", std::process::id()));
    let long = "a fairly long sentence of several words";
    let convs: Vec<serde_json::Value> = (0..6)
        .map(|i| serde_json::json!({"conversations": [
            {"from": "human", "value": if i == 0 { "hi".to_string() } else { format!("{long} {i}") }},
            {"from": "gpt", "value": "an answer of some length"}]}))
        .collect();
    std::fs::write(&path, serde_json::to_string(&convs).unwrap()).unwrap();
    let tokenizer = std::sync::Arc::new(pagewise::loader::load_tokenizer(MODEL).unwrap());
    let share = ServeBenchConfig {
        sharegpt: Some(path.to_string_lossy().into_owned()),
        tokenizer: Some(tokenizer.clone()),
        num_prompts: 5,
        ..cfg.clone()
    };
    let r = run(&share).await.unwrap();
    assert_eq!((r.completed, r.failed), (5, 0), "{:?}", r.first_error);
    let too_many = run(&ServeBenchConfig {
        num_prompts: 6,
        ..share
    })
    .await
    .unwrap_err();
    assert!(
        too_many.contains("only 5 usable conversations"),
        "{too_many}"
    );
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn offline_throughput_and_latency() {
    let free = (0.0, offline::default_bench_schema());
    let t = offline::throughput(args(), 12, 10, 6, free).unwrap();
    assert_eq!(t.num_prompts, 12);
    assert!((t.output_tokens_per_s * t.elapsed_s - 72.0).abs() < 1e-6);
    // Half constrained: the default schema's string outlasts the outputs, and the masks are
    // timed in their own phase.
    let half = (0.5, offline::default_bench_schema());
    let c = offline::throughput(args(), 12, 10, 6, half).unwrap();
    assert!((c.output_tokens_per_s * c.elapsed_s - 72.0).abs() < 1e-6);
    assert!(
        c.step_breakdown.guide_ms > t.step_breakdown.guide_ms,
        "{:?} vs {:?}",
        c.step_breakdown,
        t.step_breakdown
    );
    assert!(t.requests_per_s > 0.0);
    // The step breakdown covers the run: at least one step per output token (the prompts are
    // prefilled first), its phases fit inside the wall time, and the model dominates.
    let b = t.step_breakdown;
    assert!(b.steps >= 6, "{b:?}");
    assert!(b.total_ms() * b.steps as f64 <= t.elapsed_s * 1e3, "{b:?}");
    assert!(b.forward_ms > b.schedule_ms && b.forward_ms > 0.0, "{b:?}");
    assert!(b.row().contains("forward"));
    let workload = offline::LatencyWorkload {
        batch_size: 2,
        input_len: 8,
        output_len: 5,
        warmup: 1,
        iters: 3,
        ..Default::default()
    };
    let l = offline::latency(args(), &workload).unwrap();
    assert!(l.speculative.is_none());
    assert_eq!(l.batch_size, 2);
    assert!(l.latency.mean_ms > 0.0 && l.decode_tokens_per_s_per_seq > 0.0);
    // Three timed iterations of one prefill step and four decode steps each (the fifth token
    // comes from the prefill).
    assert_eq!(l.step_breakdown.steps, 3 * 5, "{:?}", l.step_breakdown);
}

/// A PNG's width and height from its IHDR chunk.
fn png_size(path: &std::path::Path) -> (u32, u32) {
    let b = std::fs::read(path).unwrap();
    assert_eq!(
        &b[..8],
        b"\x89PNG\r\n\x1a\n",
        "{} is not a PNG",
        path.display()
    );
    let be = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    (be(16), be(20))
}

/// `--plot` and `bench plot` draw real PNGs (skipped outside CI when no system font exists).
fn check_charts(r: &pagewise::bench::serve::ServeBenchResult) {
    use pagewise::bench::plot;
    let bad = plot::load_font(Some(std::path::Path::new("/no/such/font.ttf"))).unwrap_err();
    assert!(bad.contains("/no/such/font.ttf"), "{bad}");
    if let Err(e) = plot::load_font(None) {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI needs a font for --plot: {e}"
        );
        eprintln!("skipping the charts: {e}");
        return;
    }
    let dir = std::env::temp_dir().join(format!("pagewise-plot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let one = dir.join("run.png");
    plot::percentiles_chart(r, &one).unwrap();
    assert_eq!(png_size(&one), (1000, 600));
    let inf = pagewise::bench::serve::ServeBenchResult {
        request_rate: None,
        ..r.clone()
    };
    let sweep = dir.join("sweep.png");
    plot::rate_sweep_chart(&[inf, r.clone()], &sweep).unwrap();
    assert_eq!(png_size(&sweep), (1000, 800));
    // Not a blank canvas: the bars and text leave many non-white pixels (a PNG of one flat colour
    // compresses to a few hundred bytes).
    assert!(std::fs::metadata(&sweep).unwrap().len() > 10_000);
    assert!(
        plot::rate_sweep_chart(&[], &sweep)
            .unwrap_err()
            .contains("no results")
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
