//! Speculative decoding with the n-gram proposer, through the library: output with speculation is
//! the output without it (greedy token for token; seeded sampling too, since each position is
//! sampled as a plain step would sample it, from the same stream), under batching, chunked
//! prefill, prefix caching, preemption and sliding windows; sampled outputs follow the same
//! distribution (chi-square); and the drafts are really verified.

mod common;

use common::speculation::same_with_and_without;

use pagewise::sampler::SeededRng;
use pagewise::spec::SpeculativeConfig;
use pagewise::{EngineArgs, Llm, SamplingParams};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");

fn ngram(k: usize) -> Option<SpeculativeConfig> {
    Some(
        SpeculativeConfig::parse(&format!(
            r#"{{"method":"ngram","num_speculative_tokens":{k},"prompt_lookup_min":1,"prompt_lookup_max":3,"adaptive":false}}"#
        ))
        .unwrap(),
    )
}

fn greedy() -> SamplingParams {
    SamplingParams {
        temperature: 0.0,
        max_tokens: 32,
        ignore_eos: true,
        ..Default::default()
    }
}

#[test]
fn greedy_output_with_ngram_speculation_is_the_output_without() {
    same_with_and_without(
        &format!("{FIXTURES}/llama-gqa-tied"),
        512,
        &greedy(),
        ngram(4),
    );
}

#[test]
fn greedy_output_with_speculation_is_the_same_for_experts() {
    same_with_and_without(&format!("{FIXTURES}/mixtral"), 512, &greedy(), ngram(4));
}

#[test]
fn greedy_output_with_speculation_is_the_same_under_sliding_windows() {
    same_with_and_without(&format!("{FIXTURES}/gemma3"), 1024, &greedy(), ngram(4));
}

/// Seeded sampling at temperature 1 with top-p, top-k, min-p, penalties and `min_tokens`: every
/// position is sampled from the target's processed distribution with the sequence's next draw,
/// whether it is verifying a draft or not.
#[test]
fn seeded_sampling_with_speculation_is_the_output_without() {
    let params = SamplingParams {
        temperature: 0.4,
        top_p: 0.95,
        top_k: 50,
        min_p: 0.01,
        presence_penalty: 0.1,
        frequency_penalty: 0.05,
        min_tokens: 8,
        max_tokens: 32,
        seed: Some(11),
        ..Default::default()
    };
    same_with_and_without(
        &format!("{FIXTURES}/llama-gqa-tied"),
        512,
        &params,
        ngram(4),
    );
}

/// Two-sample chi-square statistic over the categories of `a` and `b` (pooling categories
/// expected fewer than 5 times into one), and its degrees of freedom.
fn chi_square(a: &[u32], b: &[u32]) -> (f64, usize) {
    use std::collections::BTreeMap;
    let mut counts: BTreeMap<u32, (f64, f64)> = BTreeMap::new();
    for &x in a {
        counts.entry(x).or_default().0 += 1.0;
    }
    for &x in b {
        counts.entry(x).or_default().1 += 1.0;
    }
    let (na, nb) = (a.len() as f64, b.len() as f64);
    let mut cells: Vec<(f64, f64)> = Vec::new();
    let mut rest = (0.0, 0.0);
    for (_, (ca, cb)) in counts {
        if (ca + cb) * na.min(nb) / (na + nb) >= 5.0 {
            cells.push((ca, cb));
        } else {
            rest = (rest.0 + ca, rest.1 + cb);
        }
    }
    if rest.0 + rest.1 > 0.0 {
        cells.push(rest);
    }
    let mut stat = 0.0;
    for (ca, cb) in &cells {
        let p = (ca + cb) / (na + nb);
        stat += (ca - p * na).powi(2) / (p * na) + (cb - p * nb).powi(2) / (p * nb);
    }
    (stat, cells.len() - 1)
}

/// The chi-square value a statistic with `df` degrees of freedom exceeds with probability 0.001
/// (Wilson-Hilferty).
fn chi_square_critical(df: usize) -> f64 {
    let (df, z) = (df as f64, 3.090);
    let c = 2.0 / (9.0 * df);
    df * (1.0 - c + z * c.sqrt()).powi(3)
}

/// At temperature 1, 800 samples with speculation and 800 without (different seeds, so
/// independent): the tokens at the verified positions follow the same distribution. The prompt
/// holds 150 distinct tokens of the 320, so after about half the first tokens the proposer guesses the token
/// that followed it in the prompt; had the drafts been taken unverified, the second token
/// would be that guess most of the time.
#[test]
fn sampled_outputs_follow_the_same_distribution_with_speculation() {
    let model = format!("{FIXTURES}/llama-gqa-tied");
    let mut rng = SeededRng::new(3, 0);
    let mut prompt: Vec<u32> = (0..256).filter(|&t| t != 0).collect();
    for i in (1..prompt.len()).rev() {
        prompt.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
    }
    prompt.truncate(150);
    let next_in_prompt = |t: u32| {
        prompt
            .iter()
            .position(|&p| p == t)
            .and_then(|i| prompt.get(i + 1).copied())
    };
    let run = |spec: Option<SpeculativeConfig>, seed0: u64| {
        let mut llm = Llm::new(EngineArgs {
            model: model.clone(),
            speculative_config: spec,
            ..Default::default()
        })
        .unwrap();
        let params: Vec<SamplingParams> = (0..800)
            .map(|i| SamplingParams {
                temperature: 1.0,
                max_tokens: 3,
                ignore_eos: true,
                seed: Some(seed0 + i),
                ..Default::default()
            })
            .collect();
        let outs = llm
            .generate_tokens_each(vec![prompt.clone(); 800], &params)
            .unwrap();
        let tokens: Vec<Vec<u32>> = outs
            .iter()
            .map(|o| o.outputs[0].token_ids.clone())
            .collect();
        (tokens, llm.core().spec_stats().clone())
    };
    let (plain, _) = run(None, 0);
    let (spec, stats) = run(ngram(2), 1_000_000);
    eprintln!(
        "drafts {}, draft tokens {}, accepted {}",
        stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens
    );
    assert!(stats.num_drafts > 300, "many sequences must verify a draft");
    let guessed = |outs: &[Vec<u32>]| -> Vec<u32> {
        outs.iter()
            .map(|o| u32::from(next_in_prompt(o[0]) == Some(o[1])))
            .collect()
    };
    let at = |outs: &[Vec<u32>], i: usize| -> Vec<u32> { outs.iter().map(|o| o[i]).collect() };
    for (what, a, b) in [
        ("first token", at(&plain, 0), at(&spec, 0)),
        ("second token", at(&plain, 1), at(&spec, 1)),
        ("third token", at(&plain, 2), at(&spec, 2)),
        ("second token is the guess", guessed(&plain), guessed(&spec)),
    ] {
        let (stat, df) = chi_square(&a, &b);
        let critical = chi_square_critical(df);
        eprintln!("{what}: chi-square {stat:.1}, df {df}, critical (p = 0.001) {critical:.1}");
        assert!(
            df > 0 && stat < critical,
            "{what}: chi-square {stat} >= {critical} (df {df})"
        );
    }
}

/// Through the server: streamed completions with speculation (several tokens per step reach the
/// stream as one chunk each, logprobs with them, a stop string cuts inside a step's tokens)
/// equal the library's output without it, and `/metrics` counts drafts with vLLM's names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_output_and_metrics_with_speculation() {
    use common::server::{engine_args, post, serve, sse};
    use serde_json::{Value, json};
    let prompt = "abcabcabcabcabcabc";
    let want = |stop: Vec<String>| {
        Llm::new(engine_args())
            .unwrap()
            .generate(
                &[prompt],
                &SamplingParams {
                    temperature: 0.0,
                    max_tokens: 40,
                    ignore_eos: true,
                    stop,
                    logprobs: Some(1),
                    ..Default::default()
                },
            )
            .unwrap()[0]
            .outputs[0]
            .clone()
    };
    let plain = want(vec![]);
    let args = EngineArgs {
        speculative_config: ngram(5),
        ..engine_args()
    };
    let opts = pagewise::server::ServerOptions {
        served_model_names: vec!["tiny".into()],
        ..Default::default()
    };
    let (base, _) = serve(args, opts).await;
    let body = json!({"model": "tiny", "prompt": prompt, "max_tokens": 40, "temperature": 0,
        "ignore_eos": true, "logprobs": 1, "stream": true});
    let chunks: Vec<Value> = sse(&base, "/v1/completions", body)
        .await
        .iter()
        .filter(|c| *c != "[DONE]")
        .map(|c| serde_json::from_str(c).unwrap())
        .collect();
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(text, plain.text);
    let logprobs: Vec<f64> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["logprobs"]["token_logprobs"].as_array())
        .flatten()
        .map(|x| x.as_f64().unwrap())
        .collect();
    let want_logprobs: Vec<f64> = plain
        .logprobs
        .as_ref()
        .unwrap()
        .iter()
        .map(|l| f64::from(l.logprob))
        .collect();
    assert_eq!(logprobs.len(), 40);
    for (a, b) in logprobs.iter().zip(&want_logprobs) {
        assert!((a - b).abs() < 1e-4, "{a} vs {b}");
    }

    // A stop string inside the text: the output ends where it does without speculation.
    let stop = plain.text.chars().skip(7).take(2).collect::<String>();
    let cut = want(vec![stop.clone()]);
    let (status, body) = post(
        &base,
        "/v1/completions",
        json!({"model": "tiny", "prompt": prompt,
        "max_tokens": 40, "temperature": 0, "ignore_eos": true, "stop": [stop]}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["text"], cut.text.as_str());
    assert_eq!(body["choices"][0]["finish_reason"], "stop");

    let metrics = reqwest::get(format!("{base}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let value = |name: &str| -> f64 {
        metrics
            .lines()
            .find(|l| l.starts_with(name) && !l.starts_with('#'))
            .and_then(|l| l.rsplit(' ').next())
            .unwrap_or_else(|| panic!("{name} missing from /metrics"))
            .parse()
            .unwrap()
    };
    let drafts = value("vllm:spec_decode_num_draft_tokens_total");
    let accepted = value("vllm:spec_decode_num_accepted_tokens_total");
    eprintln!("drafts {drafts}, accepted {accepted}");
    assert!(value("vllm:spec_decode_num_drafts_total") > 0.0);
    assert!(accepted > 0.0 && accepted <= drafts);
    assert!(metrics.contains("vllm:spec_decode_num_accepted_tokens_per_pos_total{"));
    assert!(metrics.contains("position=\"4\"}"));

    // The dashboard's first snapshot shows the same counts (the engine is idle: they hold).
    let mut events = reqwest::get(format!("{base}/dashboard/events"))
        .await
        .unwrap();
    let mut text = String::new();
    let snapshot: Value = loop {
        let chunk = events.chunk().await.unwrap().expect("the stream goes on");
        text.push_str(&String::from_utf8_lossy(&chunk));
        if let Some(at) = text.find("event: snapshot\ndata: ")
            && let Some(end) = text[at..].find("\n\n")
        {
            break serde_json::from_str(&text[at + 22..at + end]).unwrap();
        }
    };
    let st = &snapshot["stats"];
    assert_eq!(st["spec_tokens"], 5);
    assert_eq!(st["spec_draft_tokens"].as_f64(), Some(drafts));
    assert_eq!(st["spec_accepted_tokens"].as_f64(), Some(accepted));
}

/// Constrained sequences take drafts too: each verified row is masked in the state the accepted
/// drafts lead to, so a regex and a JSON schema come out as they do without speculation
/// (greedy, and seeded sampling), while drafts of the forced parts are accepted.
#[test]
fn constrained_output_with_speculation_is_the_output_without() {
    use pagewise::guided::StructuredOutputs;
    let model = format!("{FIXTURES}/llama-gqa-tied");
    let schema = serde_json::json!({"type": "object", "required": ["a"], "properties": {"a": {
        "type": "array", "minItems": 6, "maxItems": 6,
        "items": {"type": "string", "enum": ["xy", "zw"]}}}});
    let constraints = [
        StructuredOutputs::Regex("(abc ){8}[a-z]{6}".into()),
        StructuredOutputs::Json(schema),
    ];
    let prompts: Vec<Vec<u32>> = (0..4u32)
        .map(|i| (1..12).map(|t| t * 7 + i).collect())
        .collect();
    for constraint in constraints {
        for (temperature, seed) in [(0.0, None), (1.0, Some(5))] {
            let params = SamplingParams {
                temperature,
                seed,
                max_tokens: 64,
                structured_outputs: Some(constraint.clone()),
                ..Default::default()
            };
            let run = |spec| {
                let mut llm = Llm::new(EngineArgs {
                    model: model.clone(),
                    speculative_config: spec,
                    ..Default::default()
                })
                .unwrap();
                let outs = llm.generate_tokens(prompts.clone(), &params).unwrap();
                let tokens: Vec<Vec<u32>> = outs
                    .iter()
                    .map(|o| o.outputs[0].token_ids.clone())
                    .collect();
                (tokens, llm.core().spec_stats().clone())
            };
            let (want, _) = run(None);
            let (got, stats) = run(ngram(4));
            assert_eq!(got, want, "{constraint:?} at temperature {temperature}");
            eprintln!(
                "{}: {} of {} drafts accepted",
                constraint.kind(),
                stats.num_accepted_tokens,
                stats.num_draft_tokens
            );
            assert!(stats.num_accepted_tokens > 0, "{constraint:?}");
        }
    }
}

/// With the draft length tuned from measured step costs (the default), output is still the
/// output without speculation, and drafts are still verified (the tuner starts by speculating,
/// and tries every length now and then).
#[test]
fn greedy_output_with_tuned_draft_lengths_is_the_output_without() {
    let tuned = SpeculativeConfig::parse(
        r#"{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_min":1,"prompt_lookup_max":3}"#,
    )
    .unwrap();
    assert!(tuned.check().unwrap().adaptive);
    let llm = same_with_and_without(
        &format!("{FIXTURES}/llama-gqa-tied"),
        512,
        &greedy(),
        Some(tuned),
    );
    assert!(llm.core().spec_stats().num_drafts > 0);
}
