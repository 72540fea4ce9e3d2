use super::*;

fn req<'a>(params: &'a SamplingParams, rng: &'a mut SeededRng) -> SampleRequest<'a> {
    SampleRequest {
        params,
        prompt_tokens: &[],
        output_tokens: &[],
        suppressed: &[],
        rng,
        guide: None,
    }
}

fn greedy() -> SamplingParams {
    SamplingParams {
        temperature: 0.0,
        ..Default::default()
    }
}

fn counts(params: &SamplingParams, row: &[f32], draws: usize, seed: u64) -> Vec<usize> {
    let mut sampler = Sampler::default();
    let mut rng = SeededRng::new(seed, 0);
    let mut counts = vec![0; row.len()];
    for _ in 0..draws {
        let mut r = row.to_vec();
        counts[sampler.sample(&mut r, req(params, &mut rng)).token_id as usize] += 1;
    }
    counts
}

#[test]
fn greedy_takes_the_argmax_after_bias_and_suppression() {
    let mut s = Sampler::default();
    let mut rng = SeededRng::new(0, 0);
    let p = greedy();
    assert_eq!(
        s.sample(&mut [0.1, 3.0, 2.0], req(&p, &mut rng)).token_id,
        1
    );
    let biased = SamplingParams {
        logit_bias: vec![(2, 1.5)],
        ..greedy()
    };
    assert_eq!(
        s.sample(&mut [0.1, 3.0, 2.0], req(&biased, &mut rng))
            .token_id,
        2
    );
    let mut r = SampleRequest {
        suppressed: &[1],
        ..req(&p, &mut rng)
    };
    r.prompt_tokens = &[];
    assert_eq!(s.sample(&mut [0.1, 3.0, 2.0], r).token_id, 2);
}

#[test]
fn temperature_sampling_follows_the_softmax() {
    let row = [0.0f32, 1.0, 2.0, -1.0];
    let p = SamplingParams::default();
    let n = 200_000;
    let c = counts(&p, &row, n, 3);
    let z: f64 = row.iter().map(|&x| f64::from(x).exp()).sum();
    for (i, &x) in row.iter().enumerate() {
        let expected = f64::from(x).exp() / z;
        let got = c[i] as f64 / n as f64;
        assert!(
            (got - expected).abs() < 0.005,
            "token {i}: {got} vs {expected}"
        );
    }
    // A low temperature sharpens: token 2 dominates far more.
    let cold = SamplingParams {
        temperature: 0.25,
        ..Default::default()
    };
    let c = counts(&cold, &row, 10_000, 3);
    assert!(c[2] > 9_500, "{c:?}");
}

/// A vocabulary of many runs of 256: the draw skips whole runs by their sums and lands on each
/// token as often as its probability says, the first and last tokens included.
#[test]
fn a_large_vocabulary_is_drawn_in_proportion() {
    let mut row = vec![f32::NEG_INFINITY; 5000];
    let picks = [
        (0, 0.0f32),
        (255, 1.0),
        (256, 0.5),
        (3001, 1.5),
        (4999, 0.2),
    ];
    for &(i, x) in &picks {
        row[i] = x;
    }
    let n = 100_000;
    let c = counts(&SamplingParams::default(), &row, n, 9);
    let z: f64 = picks.iter().map(|&(_, x)| f64::from(x).exp()).sum();
    for &(i, x) in &picks {
        let (got, want) = (c[i] as f64 / n as f64, f64::from(x).exp() / z);
        assert!((got - want).abs() < 0.006, "token {i}: {got} vs {want}");
    }
    assert_eq!(c.iter().sum::<usize>(), n, "only the five tokens");
}

#[test]
fn top_k_top_p_and_min_p_cut_the_tail() {
    let row = [3.0f32, 2.9, 2.8, 0.0, -1.0, 1.0];
    let top_k = SamplingParams {
        top_k: 2,
        ..Default::default()
    };
    let c = counts(&top_k, &row, 5_000, 1);
    assert!(c[0] > 0 && c[1] > 0);
    assert_eq!(c[2] + c[3] + c[4] + c[5], 0, "{c:?}");

    // Weights e^3, e^2.9, e^2.8 hold ~87% of the mass; top_p 0.5 keeps the first two only.
    let top_p = SamplingParams {
        top_p: 0.5,
        ..Default::default()
    };
    let c = counts(&top_p, &row, 5_000, 2);
    assert!(c[0] > 0 && c[1] > 0);
    assert_eq!(c[2] + c[3] + c[4] + c[5], 0, "{c:?}");

    // min_p 0.3: e^(1-3) = 0.135 < 0.3 is dropped, e^(2.8-3) = 0.82 stays.
    let min_p = SamplingParams {
        min_p: 0.3,
        ..Default::default()
    };
    let c = counts(&min_p, &row, 5_000, 4);
    assert!(c[0] > 0 && c[1] > 0 && c[2] > 0);
    assert_eq!(c[3] + c[4] + c[5], 0, "{c:?}");

    let tiny_p = SamplingParams {
        top_p: 1e-6,
        ..Default::default()
    };
    assert_eq!(counts(&tiny_p, &row, 100, 5)[0], 100);
}

#[test]
fn top_p_over_a_large_vocabulary_matches_a_full_sort() {
    // Many candidates so the progressive partial sort needs several rounds.
    let mut noise = SeededRng::new(11, 0);
    let row: Vec<f32> = (0..5_000)
        .map(|_| (noise.next_f64() * 4.0) as f32)
        .collect();
    let p = SamplingParams {
        top_p: 0.7,
        ..Default::default()
    };
    let mut sorted: Vec<(f32, u32)> = row.iter().zip(0u32..).map(|(&x, i)| (x.exp(), i)).collect();
    sorted.sort_by(by_weight_desc);
    let total: f64 = sorted.iter().map(|x| f64::from(x.0)).sum();
    let mut cum = 0.0;
    let keep = sorted
        .iter()
        .position(|x| {
            cum += f64::from(x.0);
            cum >= 0.7 * total
        })
        .unwrap()
        + 1;
    let allowed: std::collections::HashSet<u32> = sorted[..keep].iter().map(|x| x.1).collect();
    let c = counts(&p, &row, 3_000, 9);
    for (i, &n) in c.iter().enumerate() {
        if n > 0 {
            assert!(
                allowed.contains(&(i as u32)),
                "token {i} is outside the nucleus"
            );
        }
    }
}

#[test]
fn seeded_rows_are_reproducible_whatever_else_is_in_the_batch() {
    let vocab = 50;
    let mut noise = SeededRng::new(5, 0);
    let rows: Vec<f32> = (0..4 * vocab)
        .map(|_| noise.next_f64() as f32 * 3.0)
        .collect();
    let seeded = SamplingParams {
        seed: Some(1234),
        top_p: 0.9,
        ..Default::default()
    };
    let other = SamplingParams {
        temperature: 1.3,
        ..Default::default()
    };

    let run = |batch: &[usize], params: &[&SamplingParams]| -> Vec<u32> {
        let mut sampler = Sampler::default();
        let mut rngs: Vec<SeededRng> = params.iter().map(|_| SeededRng::new(1234, 0)).collect();
        let mut out = Vec::new();
        for _ in 0..20 {
            let mut logits: Vec<f32> = batch
                .iter()
                .flat_map(|&r| rows[r * vocab..(r + 1) * vocab].to_vec())
                .collect();
            let reqs = params
                .iter()
                .zip(rngs.iter_mut())
                .map(|(p, rng)| req(p, rng));
            out.push(sampler.sample_batch(&mut logits, vocab, reqs)[0].token_id);
        }
        out
    };
    let alone = run(&[0], &[&seeded]);
    let batched = run(&[0, 1, 2, 3], &[&seeded, &other, &other, &seeded]);
    assert_eq!(alone, batched);
    assert!(
        alone.iter().any(|&t| t != alone[0]),
        "sampling should vary over steps"
    );
}

#[test]
fn logprobs_are_raw_log_softmax_with_rank_and_sorted_top() {
    let mut s = Sampler::default();
    let mut rng = SeededRng::new(0, 0);
    let p = SamplingParams {
        logprobs: Some(2),
        logit_bias: vec![(0, 10.0)],
        ..greedy()
    };
    let raw = [1.0f32, 3.0, 2.0, 0.5];
    let out = s.sample(&mut raw.clone(), req(&p, &mut rng));
    assert_eq!(out.token_id, 0, "bias changes the choice");
    let lp = out.logprobs.unwrap();
    let lse = raw.iter().map(|&x| x.exp()).sum::<f32>().ln();
    assert!(
        (lp.logprob - (1.0 - lse)).abs() < 1e-6,
        "raw, not biased, logprob"
    );
    assert_eq!(lp.rank, 3);
    assert_eq!(lp.top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 2]);
    assert!((lp.top[0].1 - (3.0 - lse)).abs() < 1e-6);
    let none = SamplingParams {
        logprobs: Some(0),
        ..greedy()
    };
    let lp = s
        .sample(&mut raw.clone(), req(&none, &mut rng))
        .logprobs
        .unwrap();
    assert!(lp.top.is_empty());
    assert_eq!(lp.rank, 1);
}

#[test]
fn degenerate_rows_never_panic() {
    let mut s = Sampler::default();
    let mut rng = SeededRng::new(0, 0);
    let p = SamplingParams {
        top_p: 0.5,
        top_k: 3,
        min_p: 0.2,
        ..Default::default()
    };
    let mut all_inf = [f32::NEG_INFINITY; 4];
    assert!(s.sample(&mut all_inf, req(&p, &mut rng)).token_id < 4);
    let mut nan = [f32::NAN, 1.0, f32::NAN];
    assert_eq!(s.sample(&mut nan, req(&p, &mut rng)).token_id, 1);
    let mut huge_k = [0.0f32, 1.0];
    let k = SamplingParams {
        top_k: 1000,
        ..Default::default()
    };
    assert!(s.sample(&mut huge_k, req(&k, &mut rng)).token_id < 2);
}

#[test]
fn only_plain_temperature_rows_may_be_sampled_on_a_device() {
    let mut rng = SeededRng::new(1, 0);
    let t = |p: SamplingParams, rng: &mut SeededRng| req(&p, rng).device_temperature();
    assert_eq!(t(greedy(), &mut rng), Some(0.0));
    let warm = SamplingParams {
        temperature: 0.7,
        min_p: 0.1,
        ..Default::default()
    };
    assert_eq!(t(warm.clone(), &mut rng), Some(0.7));
    let top_k_1 = SamplingParams {
        top_k: 1,
        ..warm.clone()
    };
    assert_eq!(t(top_k_1, &mut rng), Some(0.0));
    for host in [
        SamplingParams {
            top_p: 0.9,
            ..warm.clone()
        },
        SamplingParams {
            top_k: 40,
            ..warm.clone()
        },
        SamplingParams {
            logprobs: Some(0),
            ..warm.clone()
        },
        SamplingParams {
            logit_bias: vec![(3, 1.0)],
            ..greedy()
        },
        SamplingParams {
            repetition_penalty: 1.1,
            ..greedy()
        },
    ] {
        assert_eq!(t(host, &mut rng), None);
    }
    let p = greedy();
    let suppressed = SampleRequest {
        suppressed: &[2],
        ..req(&p, &mut rng)
    };
    assert_eq!(suppressed.device_temperature(), None);
}
