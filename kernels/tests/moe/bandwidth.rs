//! How fast each plan runs a decode token's experts (ignored: a benchmark for the GPU machine).

use candle_core::{DType, Device, Tensor};
use pagewise_kernels::{
    CodeBits, ExpertExtras, ExpertPlan, moe_experts_by, moe_experts_with, moe_route,
};

use super::affine::random_stack;
use crate::common::{self, Lcg, random, random_mxfp4};

/// The experts of one and two decode tokens at Mixtral-8x7B's, Qwen3-30B-A3B's and
/// gpt-oss-20b's shapes (and a rank's share of the first two under two-way tensor parallelism),
/// by every plan: microseconds a layer and the bandwidth of the chosen experts' weights
/// (`moe-tests --ignored --nocapture moe_bandwidth`; `PAGEWISE_MOE_SHAPE=Qwen3-30B-A3B` and
/// `PAGEWISE_MOE_TOKENS=1` narrow it, for a profiler). Each shape's first plan (Auto) pays a
/// warm-up of about 1.5 µs: compare the plans after it.
#[test]
#[ignore]
fn moe_bandwidth() {
    let dev = Device::new_cuda(0).unwrap();
    let stream = dev.as_cuda_device().unwrap().cuda_stream();
    let mut rng = Lcg(5);
    let only = std::env::var("PAGEWISE_MOE_SHAPE").ok();
    let token_counts: Vec<usize> = std::env::var("PAGEWISE_MOE_TOKENS")
        .map(|v| {
            v.split_whitespace()
                .filter_map(|t| t.parse().ok())
                .collect()
        })
        .unwrap_or_else(|_| vec![1, 2]);
    println!(
        "| shape, plan | tokens | experts (top-k) | hidden x inter | µs a layer | TB/s of the chosen experts |"
    );
    println!("|---|---|---|---|---|---|");
    for (name, experts, top_k, hidden, inter) in [
        ("Mixtral-8x7B", 8, 2, 4096, 14336),
        ("Qwen3-30B-A3B", 128, 8, 2048, 768),
        ("gpt-oss-20b", 32, 4, 2880, 2880),
        // A rank's share under two-way tensor parallelism (experts split by inner columns).
        ("Mixtral-8x7B, TP=2 rank", 8, 2, 4096, 7168),
        ("Qwen3-30B-A3B, TP=2 rank", 128, 8, 2048, 384),
    ] {
        if only.as_deref().is_some_and(|o| o != name) {
            continue;
        }
        let gu = random(
            &mut rng,
            (experts * 2 * inter, hidden),
            0.05,
            DType::BF16,
            &dev,
        )
        .reshape((experts, 2 * inter, hidden))
        .unwrap();
        let down = random(&mut rng, (experts * hidden, inter), 0.05, DType::BF16, &dev)
            .reshape((experts, hidden, inter))
            .unwrap();
        // gpt-oss's experts in MXFP4 too, as it ships them.
        let fp4 = (name == "gpt-oss-20b").then(|| {
            let (gu4, _) = random_mxfp4(&mut rng, (experts, 2 * inter, hidden), &dev);
            let (down4, _) = random_mxfp4(&mut rng, (experts, hidden, inter), &dev);
            (gu4, down4)
        });
        // Mixtral's and Qwen3-MoE's experts as codes too: AWQ's 4 bits in groups of 128, and a
        // Q4_K_M file's Q4_K gate/up (groups of 32) with Q6_K down (bytes in groups of 16), with
        // the bytes a weight each reads (codes and f16 pairs).
        let codes: Vec<_> = match name {
            "Mixtral-8x7B" | "Qwen3-30B-A3B" => [
                (
                    "AWQ 4-bit g128",
                    (CodeBits::Four, 128),
                    (CodeBits::Four, 128),
                ),
                ("Q4_K / Q6_K", (CodeBits::Four, 32), (CodeBits::Eight, 16)),
            ]
            .into_iter()
            .map(|(label, g, d)| {
                let bytes =
                    |(b, group): (CodeBits, usize)| b.bits() as f64 / 8.0 + 4.0 / group as f64;
                let (gu, _) = random_stack(&mut rng, g.0, (experts, 2 * inter, hidden), g.1, &dev);
                let (dn, _) = random_stack(&mut rng, d.0, (experts, hidden, inter), d.1, &dev);
                (label, gu, dn, (2.0 * bytes(g) + bytes(d)) / 3.0)
            })
            .collect(),
            _ => Vec::new(),
        };
        for &tokens in &token_counts {
            let x = random(&mut rng, (tokens, hidden), 1.0, DType::BF16, &dev);
            // Different experts each call (call i favours experts i.. i + top_k for the first
            // token, i + top_k.. for the second).
            let logits: Vec<Tensor> = (0..64)
                .map(|i| {
                    let v: Vec<f32> = (0..tokens * experts)
                        .map(|n| {
                            let (t, e) = (n / experts, n % experts);
                            let first = (i + t * top_k) % experts;
                            if (e + experts - first) % experts < top_k {
                                5.0
                            } else {
                                0.0
                            }
                        })
                        .collect();
                    Tensor::from_vec(v, (tokens, experts), &dev).unwrap()
                })
                .collect();
            let slices = [8, 16, 32, 64].into_iter().filter(|c| inter % c == 0);
            let plans = [ExpertPlan::Auto, ExpertPlan::Rows]
                .into_iter()
                .chain(slices.map(ExpertPlan::Slices));
            for plan in plans {
                let run = |i: usize| {
                    let routes = moe_route(&logits[i % 64], top_k, true).unwrap();
                    moe_experts_by(&x, &gu, &down, &routes, ExpertExtras::default(), plan).unwrap();
                };
                for i in 0..4 {
                    run(i);
                }
                let s = common::graph_replay_seconds(&stream, 64, &run);
                let bytes = (tokens * top_k * 3 * hidden * inter * 2) as f64;
                println!(
                    "| {name}, {plan:?} | {tokens} | {experts} (top-{top_k}) | {hidden} x {inter} | {:.1} | {:.2} |",
                    s * 1e6,
                    bytes / s / 1e12
                );
            }
            for (label, gu, dn, per_weight) in &codes {
                let run = |i: usize| {
                    let routes = moe_route(&logits[i % 64], top_k, true).unwrap();
                    moe_experts_with(&x, gu, dn, &routes, ExpertExtras::default()).unwrap();
                };
                for i in 0..4 {
                    run(i);
                }
                let s = common::graph_replay_seconds(&stream, 64, &run);
                let bytes = (tokens * top_k * 3 * hidden * inter) as f64 * per_weight;
                println!(
                    "| {name}, {label} | {tokens} | {experts} (top-{top_k}) | {hidden} x {inter} | {:.1} | {:.2} |",
                    s * 1e6,
                    bytes / s / 1e12
                );
            }
            if let Some((gu4, down4)) = &fp4 {
                // 17 bytes a run of 32.
                let run = |i: usize| {
                    let routes = moe_route(&logits[i % 64], top_k, true).unwrap();
                    moe_experts_with(&x, gu4, down4, &routes, ExpertExtras::default()).unwrap();
                };
                for i in 0..4 {
                    run(i);
                }
                let s = common::graph_replay_seconds(&stream, 64, &run);
                let bytes = (tokens * top_k * 3 * hidden * inter) as f64 * 17.0 / 32.0;
                println!(
                    "| {name}, MXFP4 | {tokens} | {experts} (top-{top_k}) | {hidden} x {inter} | {:.1} | {:.2} |",
                    s * 1e6,
                    bytes / s / 1e12
                );
            }
        }
    }
}
