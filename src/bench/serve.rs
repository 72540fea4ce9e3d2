//! `pagewise bench serve`: load against any OpenAI-compatible server with the semantics of vLLM's
//! `vllm bench serve`: random prompts, Poisson (or gamma, `--burstiness`) arrivals at
//! `--request-rate`, optional `--max-concurrency`, streaming with usage; TTFT, TPOT, ITL and E2E.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::Semaphore;

use super::server_steps;
use super::stats::Summary;
use crate::runner::step_times::StepBreakdown;
use crate::sampler::SeededRng;

/// What to send and how fast.
#[derive(Clone, Debug)]
pub struct ServeBenchConfig {
    /// Server root, e.g. `http://127.0.0.1:8000`.
    pub base_url: String,
    /// `/v1/completions` (token-exact prompts as ids) or `/v1/chat/completions` (word prompts).
    pub endpoint: String,
    /// Model name to send.
    pub model: String,
    /// Requests in all.
    pub num_prompts: usize,
    /// Mean prompt length in tokens.
    pub input_len: usize,
    /// Mean output length in tokens.
    pub output_len: usize,
    /// Lengths vary uniformly in `len * [1 - ratio, 1 + ratio]`.
    pub range_ratio: f64,
    /// Tokens of a prefix shared by every prompt.
    pub prefix_len: usize,
    /// Requests per second (infinite: all at once).
    pub request_rate: f64,
    /// Gamma shape of inter-arrival times (1 = Poisson).
    pub burstiness: f64,
    /// Most requests in flight at once.
    pub max_concurrency: Option<usize>,
    /// Send `ignore_eos` so outputs have their full length.
    pub ignore_eos: bool,
    /// Random prompt token ids are drawn below this.
    pub vocab_size: usize,
    /// Seed of prompts and arrivals.
    pub seed: u64,
    /// Bearer key, if the server wants one.
    pub api_key: Option<String>,
    /// Prompts from a ShareGPT-format JSON file instead of random ones (needs `tokenizer`).
    pub sharegpt: Option<String>,
    /// Tokenizer for measuring ShareGPT prompt and completion lengths.
    pub tokenizer: Option<Arc<tokenizers::Tokenizer>>,
    /// Print progress to stderr.
    pub progress: bool,
}

/// One request's measurements.
#[derive(Clone, Debug, Default)]
struct RequestResult {
    ok: bool,
    ttft: f64,
    itl: Vec<f64>,
    e2e: f64,
    prompt_len: usize,
    output_tokens: usize,
    error: Option<String>,
}

/// The benchmark's report (also written as JSON).
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct ServeBenchResult {
    /// The request rate asked for (requests per second); absent for inf.
    #[serde(default)]
    pub request_rate: Option<f64>,
    /// Requests that succeeded.
    pub completed: usize,
    /// Requests that failed.
    pub failed: usize,
    /// First error message seen, if any.
    pub first_error: Option<String>,
    /// Wall time, seconds.
    pub duration_s: f64,
    /// Completed requests per second.
    pub request_throughput: f64,
    /// Output tokens per second.
    pub output_throughput: f64,
    /// Prompt + output tokens per second.
    pub total_token_throughput: f64,
    /// Time to first token.
    pub ttft: Summary,
    /// Time per output token after the first.
    pub tpot: Summary,
    /// Inter-token latency.
    pub itl: Summary,
    /// End-to-end latency.
    pub e2e: Summary,
    /// Where the server's engine steps spent their time during the run (a pagewise server's
    /// /metrics counters; absent for other servers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_steps: Option<StepBreakdown>,
}

impl ServeBenchResult {
    /// A plain-text table like vLLM's.
    pub fn report(&self) -> String {
        let mut out = format!(
            "successful requests: {}\nfailed requests: {}\nduration (s): {:.2}\nrequest throughput (req/s): {:.2}\n\
             output token throughput (tok/s): {:.2}\ntotal token throughput (tok/s): {:.2}\n\
             {:<6} {:>10} {:>10} {:>10} {:>10}   (ms)\n",
            self.completed,
            self.failed,
            self.duration_s,
            self.request_throughput,
            self.output_throughput,
            self.total_token_throughput,
            "",
            "mean",
            "median",
            "p90",
            "p99"
        );
        for (name, s) in [
            ("TTFT", &self.ttft),
            ("TPOT", &self.tpot),
            ("ITL", &self.itl),
            ("E2E", &self.e2e),
        ] {
            out.push_str(&s.row(name));
            out.push('\n');
        }
        if let Some(b) = &self.server_steps {
            out.push_str(&format!("server engine, {}\n", b.row()));
        }
        if let (true, Some(e)) = (self.failed > 0, &self.first_error) {
            out.push_str(&format!("first error: {e}\n"));
        }
        out
    }
}

fn standard_normal(rng: &mut SeededRng) -> f64 {
    let u1 = rng.next_f64().max(f64::MIN_POSITIVE);
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * rng.next_f64()).cos()
}

/// A Gamma(shape, 1) draw (Marsaglia and Tsang; boosted for shape < 1).
fn gamma(shape: f64, rng: &mut SeededRng) -> f64 {
    if shape < 1.0 {
        return gamma(shape + 1.0, rng) * rng.next_f64().max(f64::MIN_POSITIVE).powf(1.0 / shape);
    }
    let d = shape - 1.0 / 3.0;
    let c = 1.0 / (9.0 * d).sqrt();
    loop {
        let x = standard_normal(rng);
        let v = (1.0 + c * x).powi(3);
        if v <= 0.0 {
            continue;
        }
        let u = rng.next_f64();
        if u.ln() < 0.5 * x * x + d - d * v + d * v.ln() {
            return d * v;
        }
    }
}

fn vary(len: usize, ratio: f64, rng: &mut SeededRng) -> usize {
    let lo = (len as f64 * (1.0 - ratio)).max(1.0);
    let hi = (len as f64 * (1.0 + ratio)).max(lo);
    (lo + rng.next_f64() * (hi - lo)).round() as usize
}

fn request_body(cfg: &ServeBenchConfig, prompt: Value, max_tokens: usize) -> Value {
    let mut body = json!({"model": cfg.model, "max_tokens": max_tokens, "stream": true,
                          "stream_options": {"include_usage": true}, "ignore_eos": cfg.ignore_eos});
    if cfg.endpoint.contains("chat") {
        let text = match prompt {
            Value::String(s) => s,
            ids => ids
                .as_array()
                .into_iter()
                .flatten()
                .map(|t| format!("w{t}"))
                .collect::<Vec<_>>()
                .join(" "),
        };
        body["messages"] = json!([{"role": "user", "content": text}]);
    } else {
        body["prompt"] = prompt;
    }
    body
}

/// ShareGPT conversations as (prompt, prompt tokens, completion tokens), filtered like vLLM's
/// benchmark (both at least 4 tokens, prompt at most 1024, together at most 2048), shuffled.
fn sharegpt(cfg: &ServeBenchConfig, path: &str) -> Result<Vec<(Value, usize)>, String> {
    let tokenizer = cfg
        .tokenizer
        .as_ref()
        .ok_or("--dataset-path needs --tokenizer")?;
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    let data: Value = serde_json::from_str(&text).map_err(|e| format!("{path}: {e}"))?;
    let count = |s: &str| tokenizer.encode(s, false).map(|e| e.len()).unwrap_or(0);
    let mut pairs: Vec<(String, usize, usize)> = data
        .as_array()
        .ok_or(format!("{path}: expected a JSON array of conversations"))?
        .iter()
        .filter_map(|entry| {
            let turns = entry["conversations"].as_array()?;
            let prompt = turns.first()?["value"].as_str()?.to_string();
            let completion = turns.get(1)?["value"].as_str()?;
            let (p, c) = (count(&prompt), count(completion));
            (p >= 4 && c >= 4 && p <= 1024 && p + c <= 2048).then_some((prompt, p, c))
        })
        .collect();
    let mut rng = SeededRng::new(cfg.seed, 0x7368_6172);
    for i in (1..pairs.len()).rev() {
        pairs.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
    }
    if pairs.len() < cfg.num_prompts {
        return Err(format!(
            "{path}: only {} usable conversations for {} prompts",
            pairs.len(),
            cfg.num_prompts
        ));
    }
    Ok(pairs
        .into_iter()
        .take(cfg.num_prompts)
        .map(|(prompt, p, c)| (request_body(cfg, Value::String(prompt), c), p))
        .collect())
}

/// The request bodies, seeded.
fn bodies(cfg: &ServeBenchConfig) -> Result<Vec<(Value, usize)>, String> {
    if let Some(path) = &cfg.sharegpt {
        return sharegpt(cfg, path);
    }
    let mut rng = SeededRng::new(cfg.seed, 0x7365_7276);
    let vocab = cfg.vocab_size.max(2) as u64;
    let prefix: Vec<u32> = (0..cfg.prefix_len)
        .map(|_| (rng.next_u64() % vocab) as u32)
        .collect();
    Ok((0..cfg.num_prompts)
        .map(|_| {
            let input = vary(cfg.input_len, cfg.range_ratio, &mut rng);
            let output = vary(cfg.output_len, cfg.range_ratio, &mut rng);
            let mut ids = prefix.clone();
            ids.extend((0..input).map(|_| (rng.next_u64() % vocab) as u32));
            let len = ids.len();
            (request_body(cfg, json!(ids), output), len)
        })
        .collect())
}

async fn one(
    client: reqwest::Client,
    url: String,
    key: Option<String>,
    body: Value,
    prompt_len: usize,
) -> RequestResult {
    let start = Instant::now();
    let mut r = RequestResult {
        prompt_len,
        ..Default::default()
    };
    let mut req = client.post(&url).json(&body);
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    let resp = match req.send().await {
        Ok(resp) if resp.status().is_success() => resp,
        Ok(resp) => {
            r.error = Some(format!(
                "HTTP {}: {}",
                resp.status(),
                resp.text().await.unwrap_or_default()
            ));
            return r;
        }
        Err(e) => {
            r.error = Some(e.to_string());
            return r;
        }
    };
    let mut stream = resp.bytes_stream();
    let mut events = crate::sse::SseEvents::default();
    let mut last = start;
    let mut chunks = 0usize;
    while let Some(piece) = stream.next().await {
        let Ok(piece) = piece else {
            r.error = Some("the stream broke".into());
            return r;
        };
        for data in events.push(&piece) {
            if data == "[DONE]" {
                r.ok = r.error.is_none();
                r.e2e = start.elapsed().as_secs_f64();
                if r.output_tokens == 0 {
                    r.output_tokens = chunks;
                }
                return r;
            }
            let Ok(v) = serde_json::from_str::<Value>(&data) else {
                continue;
            };
            if let Some(e) = v.get("error") {
                r.error = Some(e.to_string());
            }
            if let Some(n) = v["usage"]["completion_tokens"].as_u64() {
                r.output_tokens = n as usize;
            }
            if v["choices"].as_array().is_some_and(|c| !c.is_empty()) {
                let now = Instant::now();
                if chunks == 0 {
                    r.ttft = (now - start).as_secs_f64();
                } else {
                    r.itl.push((now - last).as_secs_f64());
                }
                last = now;
                chunks += 1;
            }
        }
    }
    r.error
        .get_or_insert_with(|| "the stream ended without [DONE]".into());
    r
}

/// Runs the benchmark; fails only when the prompts cannot be made.
pub async fn run(cfg: &ServeBenchConfig) -> Result<ServeBenchResult, String> {
    let bodies = bodies(cfg)?;
    let client = reqwest::Client::new();
    let url = format!("{}{}", cfg.base_url.trim_end_matches('/'), cfg.endpoint);
    let limit = Arc::new(Semaphore::new(
        cfg.max_concurrency.unwrap_or(Semaphore::MAX_PERMITS),
    ));
    let mut arrivals = SeededRng::new(cfg.seed, 0x6172_7276);
    let steps_before = server_steps::scrape(&client, &cfg.base_url).await;
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(cfg.num_prompts);
    let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let total = bodies.len();
    let ticker = cfg.progress.then(|| {
        let done = done.clone();
        tokio::spawn(async move {
            loop {
                let d = done.load(std::sync::atomic::Ordering::Relaxed);
                eprint!("\r{d}/{total} requests done");
                if d == total {
                    eprintln!();
                    return;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        })
    });
    for (body, prompt_len) in bodies {
        if cfg.request_rate.is_finite() && cfg.request_rate > 0.0 {
            let scale = 1.0 / (cfg.request_rate * cfg.burstiness);
            tokio::time::sleep(Duration::from_secs_f64(
                gamma(cfg.burstiness, &mut arrivals) * scale,
            ))
            .await;
        }
        let permit = limit.clone().acquire_owned().await.expect("never closed");
        let (client, url, key) = (client.clone(), url.clone(), cfg.api_key.clone());
        let done = done.clone();
        tasks.push(tokio::spawn(async move {
            let r = one(client, url, key, body, prompt_len).await;
            drop(permit);
            done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            r
        }));
    }
    let mut results = Vec::with_capacity(tasks.len());
    for t in tasks {
        results.push(t.await.unwrap_or_else(|e| RequestResult {
            error: Some(e.to_string()),
            ..Default::default()
        }));
    }
    let duration = start.elapsed().as_secs_f64();
    let server_steps = match (
        steps_before,
        server_steps::scrape(&client, &cfg.base_url).await,
    ) {
        (Some(before), Some(after)) => after.since(&before),
        _ => None,
    };
    if let Some(t) = ticker {
        let _ = t.await;
    }
    let ok: Vec<&RequestResult> = results.iter().filter(|r| r.ok).collect();
    let output: usize = ok.iter().map(|r| r.output_tokens).sum();
    let prompt: usize = ok.iter().map(|r| r.prompt_len).sum();
    let tpot: Vec<f64> = ok
        .iter()
        .filter(|r| r.output_tokens > 1)
        .map(|r| (r.e2e - r.ttft) / (r.output_tokens - 1) as f64)
        .collect();
    let itl: Vec<f64> = ok.iter().flat_map(|r| r.itl.iter().copied()).collect();
    Ok(ServeBenchResult {
        request_rate: cfg.request_rate.is_finite().then_some(cfg.request_rate),
        completed: ok.len(),
        failed: results.len() - ok.len(),
        first_error: results.iter().find_map(|r| r.error.clone()),
        duration_s: duration,
        request_throughput: ok.len() as f64 / duration,
        output_throughput: output as f64 / duration,
        total_token_throughput: (output + prompt) as f64 / duration,
        ttft: Summary::of_seconds(&ok.iter().map(|r| r.ttft).collect::<Vec<_>>()),
        tpot: Summary::of_seconds(&tpot),
        itl: Summary::of_seconds(&itl),
        e2e: Summary::of_seconds(&ok.iter().map(|r| r.e2e).collect::<Vec<_>>()),
        server_steps,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gamma_has_the_right_mean_and_lengths_stay_in_range() {
        let mut rng = SeededRng::new(1, 0);
        for shape in [0.5, 1.0, 4.0] {
            let n = 20_000;
            let mean: f64 = (0..n).map(|_| gamma(shape, &mut rng)).sum::<f64>() / n as f64;
            assert!(
                (mean - shape).abs() < 0.05 * shape.max(1.0),
                "shape {shape}: mean {mean}"
            );
        }
        for _ in 0..1000 {
            let l = vary(100, 0.25, &mut rng);
            assert!((75..=125).contains(&l));
        }
        assert_eq!(vary(10, 0.0, &mut rng), 10);
    }
}
