//! MXFP4 experts on tensor cores (`moe_experts_fp4_mma`) against the token-by-token expert kernels
//! over the same stacks (run on the GPU machine: scripts/gpu/run.sh).

use crate::common::{Lcg, host_f32, max_rel_diff, random, random_mxfp4};
use candle_core::{DType, Device, Tensor};
use pagewise_kernels::{ExpertExtras, moe_experts_fp4_mma, moe_experts_with, moe_route};

/// Router logits for `tokens` x `experts`: random, or (`only`) every token's largest on the
/// experts `only..only + top_k`.
fn logits(
    rng: &mut Lcg,
    tokens: usize,
    experts: usize,
    only: Option<usize>,
    dev: &Device,
) -> Tensor {
    let mut l = host_f32(&random(rng, (tokens, experts), 2.0, DType::F32, dev));
    if let Some(first) = only {
        for row in l.chunks_mut(experts) {
            for (e, v) in row.iter_mut().enumerate() {
                if e >= first && e < first + 4 {
                    *v += 20.0;
                }
            }
        }
    }
    Tensor::from_vec(l, (tokens, experts), dev).unwrap()
}

/// The tensor-core path gives the token-by-token kernels' outputs, but for the order of each
/// dot product's sums: every tile size (a handful of slots an expert, tens, hundreds), every
/// token on the same experts (one expert's many tiles; the others no slot), experts no token
/// picks, both 16-bit dtypes, plain SwiGLU and gpt-oss's extras, gpt-oss-20b's shape.
#[test]
fn mma_experts_equal_the_token_kernels() {
    let dev = Device::new_cuda(0).unwrap();
    let mut rng = Lcg(21);
    for (dtype, experts, top_k, hidden, inter, tokens, only) in [
        (DType::BF16, 8, 2, 256, 128, 1, None),
        (DType::BF16, 8, 2, 256, 128, 5, None),
        (DType::F16, 8, 2, 256, 128, 40, None),
        (DType::BF16, 16, 4, 128, 96, 100, Some(3)),
        (DType::BF16, 128, 4, 64, 32, 37, None),
        (DType::BF16, 64, 1, 96, 64, 300, None),
        (DType::BF16, 32, 4, 2880, 2880, 24, None),
    ] {
        let (gu, _) = random_mxfp4(&mut rng, (experts, 2 * inter, hidden), &dev);
        let (down, _) = random_mxfp4(&mut rng, (experts, hidden, inter), &dev);
        let x = random(&mut rng, (tokens, hidden), 1.0, dtype, &dev);
        let routes =
            moe_route(&logits(&mut rng, tokens, experts, only, &dev), top_k, true).unwrap();
        let gu_bias = random(&mut rng, (experts, 2 * inter), 0.3, dtype, &dev);
        let down_bias = random(&mut rng, (experts, hidden), 0.3, dtype, &dev);
        let gpt_oss = ExpertExtras {
            gate_up_bias: Some(&gu_bias),
            down_bias: Some(&down_bias),
            clamped_swiglu: Some((1.702, 0.5)),
            residual: Some(&x),
            ..Default::default()
        };
        for extras in [ExpertExtras::default(), gpt_oss] {
            let mma = moe_experts_fp4_mma(&x, &gu, &down, &routes, extras).unwrap();
            let want = moe_experts_with(&x, &gu, &down, &routes, extras).unwrap();
            let err = max_rel_diff(&host_f32(&mma), &host_f32(&want));
            assert!(
                err < 1e-2,
                "{dtype:?} {experts} experts (top {top_k}) of {hidden} x {inter}, {tokens} tokens \
                 ({only:?}): off by {err}"
            );
        }
    }
}

/// What the tensor-core path does not take is refused: an input norm (the fused decode path's),
/// stacks that do not fit each other.
#[test]
fn mma_experts_refuse_what_they_cannot_run() {
    let dev = Device::new_cuda(0).unwrap();
    let mut rng = Lcg(22);
    let (gu, _) = random_mxfp4(&mut rng, (4, 64, 64), &dev);
    let (down, _) = random_mxfp4(&mut rng, (4, 64, 32), &dev);
    let x = random(&mut rng, (3, 64), 1.0, DType::BF16, &dev);
    let routes = moe_route(&logits(&mut rng, 3, 4, None, &dev), 2, true).unwrap();
    let w = random(&mut rng, (1, 64), 1.0, DType::BF16, &dev)
        .squeeze(0)
        .unwrap();
    let norm = ExpertExtras {
        input_norm: Some((&w, 1e-5)),
        ..Default::default()
    };
    assert!(moe_experts_fp4_mma(&x, &gu, &down, &routes, norm).is_err());
    // gate/up's inner width 32 and down's 32 agree; a down of inner 64 does not fit gate/up's.
    assert!(moe_experts_fp4_mma(&x, &gu, &down, &routes, ExpertExtras::default()).is_ok());
    let (down64, _) = random_mxfp4(&mut rng, (4, 64, 64), &dev);
    assert!(moe_experts_fp4_mma(&x, &gu, &down64, &routes, ExpertExtras::default()).is_err());
}

/// gpt-oss-20b's and gpt-oss-120b's expert layers (MXFP4) for steps of 1 to 256 tokens, routed
/// at random: microseconds a layer, token by token (`moe_experts_with`) against tensor cores
/// (`moe-mma-tests --ignored --nocapture mma_bandwidth`; `PAGEWISE_MMA_TOKENS="64"` and
/// `PAGEWISE_MMA_SHAPE=gpt-oss-20b` narrow it, for a profiler).
#[test]
#[ignore]
fn mma_bandwidth() {
    let dev = Device::new_cuda(0).unwrap();
    let stream = dev.as_cuda_device().unwrap().cuda_stream();
    let mut rng = Lcg(23);
    println!(
        "| shape | tokens | token by token (µs) | tensor cores (µs) | experts' codes read a step (MB) | TB/s (tensor cores) |"
    );
    println!("|---|---|---|---|---|---|");
    let token_counts: Vec<usize> = std::env::var("PAGEWISE_MMA_TOKENS")
        .map(|v| {
            v.split_whitespace()
                .filter_map(|t| t.parse().ok())
                .collect()
        })
        .unwrap_or_else(|_| vec![1, 4, 8, 16, 32, 64, 128, 256]);
    let only = std::env::var("PAGEWISE_MMA_SHAPE").ok();
    for (name, experts, top_k, hidden, inter) in [
        ("gpt-oss-20b", 32, 4, 2880, 2880),
        ("gpt-oss-120b", 128, 4, 2880, 2880),
    ] {
        if only.as_deref().is_some_and(|o| o != name) {
            continue;
        }
        let (gu, _) = random_mxfp4(&mut rng, (experts, 2 * inter, hidden), &dev);
        let (down, _) = random_mxfp4(&mut rng, (experts, hidden, inter), &dev);
        for &tokens in &token_counts {
            let x = random(&mut rng, (tokens, hidden), 1.0, DType::BF16, &dev);
            let routes: Vec<_> = (0..8)
                .map(|_| {
                    let l = logits(&mut rng, tokens, experts, None, &dev);
                    moe_route(&l, top_k, true).unwrap()
                })
                .collect();
            let used: f64 = routes
                .iter()
                .map(|r| {
                    let mut ids = r.ids().flatten_all().unwrap().to_vec1::<u32>().unwrap();
                    ids.sort_unstable();
                    ids.dedup();
                    ids.len() as f64
                })
                .sum::<f64>()
                / routes.len() as f64;
            let bytes = used * (3 * hidden * inter) as f64 * 17.0 / 32.0;
            let time = |mma: bool| {
                let run = |i: usize| {
                    let r = &routes[i % routes.len()];
                    let e = ExpertExtras::default();
                    match mma {
                        true => moe_experts_fp4_mma(&x, &gu, &down, r, e).unwrap(),
                        false => moe_experts_with(&x, &gu, &down, r, e).unwrap(),
                    };
                };
                for i in 0..4 {
                    run(i);
                }
                crate::common::graph_replay_seconds(&stream, 32, &run)
            };
            let (gemv, mma) = (time(false), time(true));
            println!(
                "| {name} | {tokens} | {:.1} | {:.1} | {:.0} | {:.2} |",
                gemv * 1e6,
                mma * 1e6,
                bytes / 1e6,
                bytes / mma / 1e12
            );
        }
    }
}
