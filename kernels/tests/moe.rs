//! The mixture-of-experts kernels (routing, then each token's experts) against the same math on
//! the host (run on the GPU machine: scripts/gpu/run.sh); the slices against the row grids and
//! the benchmark of every plan in the two modules below.

mod affine;
mod bandwidth;
mod held;
mod o_router;
mod slices;

use crate::common::{Lcg, host_f32, max_rel_diff, random, random_mxfp4};
use candle_core::{DType, Device, Tensor};
use pagewise_kernels::{
    ExpertExtras, GroupedGemm, MoeRoutes, Mxfp4Stack, moe_experts, moe_experts_with, moe_route,
    moe_router,
};

/// The host routing: softmax, the `top_k` largest (ties to the lower expert), renormalized or not.
fn route(row: &[f32], top_k: usize, renormalize: bool) -> Vec<(u32, f32)> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let p: Vec<f32> = row.iter().map(|l| (l - max).exp()).collect();
    let sum: f32 = p.iter().sum();
    let mut order: Vec<usize> = (0..row.len()).collect();
    order.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
    let chosen = &order[..top_k];
    let norm = match renormalize {
        true => chosen.iter().map(|&e| p[e]).sum(),
        false => sum,
    };
    chosen.iter().map(|&e| (e as u32, p[e] / norm)).collect()
}

fn check_routes(logits: &[f32], experts: usize, top_k: usize, renormalize: bool, dev: &Device) {
    let tokens = logits.len() / experts;
    let t = Tensor::from_vec(logits.to_vec(), (tokens, experts), dev).unwrap();
    let r = moe_route(&t, top_k, renormalize).unwrap();
    let ids = r.ids().flatten_all().unwrap().to_vec1::<u32>().unwrap();
    let weights = host_f32(r.weights());
    for (i, row) in logits.chunks(experts).enumerate() {
        let want = route(row, top_k, renormalize);
        let at = i * top_k..(i + 1) * top_k;
        let want_ids: Vec<u32> = want.iter().map(|w| w.0).collect();
        assert_eq!(
            ids[at.clone()],
            want_ids,
            "{experts} experts, top {top_k}, token {i}"
        );
        for (got, w) in weights[at].iter().zip(&want) {
            assert!(
                (got - w.1).abs() < 1e-5,
                "token {i}: weight {got} vs {}",
                w.1
            );
        }
    }
}

#[test]
fn routing_takes_the_top_k_as_the_host_does() {
    let dev = Device::new_cuda(0).unwrap();
    let mut rng = Lcg(3);
    let shapes = [
        (1, 8, 2),
        (37, 8, 2),
        (5, 60, 4),
        (9, 128, 8),
        (3, 32, 16),
        (2, 256, 8),
        (4, 200, 16),
    ];
    for (tokens, experts, top_k) in shapes {
        let logits: Vec<f32> = (0..tokens * experts).map(|_| rng.next() * 4.0).collect();
        for renormalize in [true, false] {
            check_routes(&logits, experts, top_k, renormalize, &dev);
        }
    }
    // Ties go to the lower expert: all equal, and two equal maxima.
    check_routes(&[0.0; 8], 8, 3, true, &dev);
    check_routes(&[1.0, 3.0, 2.0, 3.0], 4, 2, false, &dev);
    // Probabilities that underflow to zero are still chosen, the lower expert first.
    check_routes(&[0.0, -200.0, -300.0, -200.0, 5.0], 5, 4, false, &dev);
    // Every token on one expert (k = 1, weight one once renormalized).
    let one: Vec<f32> = (0..6 * 5)
        .map(|i| if i % 5 == 3 { 9.0 } else { 0.0 })
        .collect();
    check_routes(&one, 5, 1, true, &dev);
    let zero = Tensor::zeros((0, 8), DType::F32, &dev).unwrap();
    assert_eq!(moe_route(&zero, 2, true).unwrap().ids().dims(), [0, 2]);
    let logits = Tensor::zeros((2, 4), DType::F32, &dev).unwrap();
    assert!(moe_route(&logits, 5, true).is_err());
    let too_many = Tensor::zeros((1, 257), DType::F32, &dev).unwrap();
    assert!(moe_route(&too_many, 2, true).is_err());
}

/// The router kernel against the host: the f32 logits of x, or of RMSNorm(x) rounded to its
/// dtype, times f32 weights (Mixtral's 8 experts and Qwen3-MoE's 128, one and two tokens).
#[test]
fn router_logits_match_the_host() {
    let dev = Device::new_cuda(0).unwrap();
    let mut rng = Lcg(5);
    for dtype in [DType::BF16, DType::F16] {
        for (tokens, hidden, experts) in [(1, 4096, 8), (2, 2048, 128), (3, 64, 20)] {
            let x = random(&mut rng, (tokens, hidden), 1.0, dtype, &dev);
            let norm_w = random(&mut rng, (1, hidden), 1.0, dtype, &dev)
                .flatten_all()
                .unwrap();
            let w = random(&mut rng, (experts, hidden), 0.05, DType::F32, &dev);
            let (xv, nv, wv) = (host_f32(&x), host_f32(&norm_w), host_f32(&w));
            for normed in [false, true] {
                let eps = 1e-5f32;
                let norm = normed.then_some((&norm_w, eps));
                let got = host_f32(&moe_router(&x, &w, norm).unwrap());
                let mut want = Vec::new();
                for t in 0..tokens {
                    let mut xt = xv[t * hidden..(t + 1) * hidden].to_vec();
                    if normed {
                        let ms = xt.iter().map(|v| v * v).sum::<f32>() / hidden as f32;
                        let inv = 1.0 / (ms + eps).sqrt();
                        let n = xt.iter().zip(&nv).map(|(v, g)| v * inv * g).collect();
                        xt = round(n, dtype, &dev);
                    }
                    for e in 0..experts {
                        let row = &wv[e * hidden..(e + 1) * hidden];
                        want.push(row.iter().zip(&xt).map(|(a, b)| a * b).sum::<f32>());
                    }
                }
                let err = max_rel_diff(&got, &want);
                assert!(
                    err < 1e-3,
                    "{dtype:?} {tokens}x{hidden}, {experts} experts, normed {normed}: {err}"
                );
            }
        }
    }
    let x = Tensor::zeros((1, 64), DType::BF16, &dev).unwrap();
    let w16 = Tensor::zeros((8, 64), DType::BF16, &dev).unwrap();
    assert!(
        moe_router(&x, &w16, None).is_err(),
        "a 16-bit router weight"
    );
}

/// silu(g) * u rounded to the dtype's precision (through a tensor of it).
fn round(v: Vec<f32>, dtype: DType, dev: &Device) -> Vec<f32> {
    let n = v.len();
    host_f32(
        &Tensor::from_vec(v, n, dev)
            .unwrap()
            .to_dtype(dtype)
            .unwrap(),
    )
}

/// A random dense expert layer and what it takes, drawn in this order: x `[tokens, hidden]`, the
/// gate/up and down stacks, the routes (from logits at scale 3, renormalized), both biases, an
/// input norm's weight and a residual.
struct DenseLayer {
    x: Tensor,
    gu: Tensor,
    down: Tensor,
    routes: MoeRoutes,
    gu_bias: Tensor,
    down_bias: Tensor,
    norm_w: Tensor,
    residual: Tensor,
}

impl DenseLayer {
    /// The fused decode path's extras: the input RMSNorm (`eps`) and the residual.
    fn norm_and_residual(&self, eps: f32) -> ExpertExtras<'_> {
        ExpertExtras {
            input_norm: Some((&self.norm_w, eps)),
            residual: Some(&self.residual),
            ..Default::default()
        }
    }

    /// `dims`: (tokens, hidden, inter, experts, top_k).
    fn random(
        rng: &mut Lcg,
        dtype: DType,
        dims: (usize, usize, usize, usize, usize),
        dev: &Device,
    ) -> DenseLayer {
        let (tokens, hidden, inter, experts, top_k) = dims;
        let x = random(rng, (tokens, hidden), 1.0, dtype, dev);
        let gu = random(rng, (experts * 2 * inter, hidden), 0.05, dtype, dev)
            .reshape((experts, 2 * inter, hidden))
            .unwrap();
        let down = random(rng, (experts * hidden, inter), 0.05, dtype, dev)
            .reshape((experts, hidden, inter))
            .unwrap();
        let logits = random(rng, (tokens, experts), 3.0, DType::F32, dev);
        let routes = moe_route(&logits, top_k, true).unwrap();
        let gu_bias = random(rng, (experts, 2 * inter), 0.5, dtype, dev);
        let down_bias = random(rng, (experts, hidden), 0.5, dtype, dev);
        let norm_w = random(rng, (1, hidden), 1.0, dtype, dev)
            .flatten_all()
            .unwrap();
        let residual = random(rng, (tokens, hidden), 1.0, dtype, dev);
        DenseLayer {
            x,
            gu,
            down,
            routes,
            gu_bias,
            down_bias,
            norm_w,
            residual,
        }
    }
}

/// Plain SwiGLU experts; gpt-oss's (biases, the clamped SwiGLU with a limit low enough to
/// bite); and the fused decode path's (an input RMSNorm and a residual). The shapes cut the down
/// projection's work into 1 to 8 slices an output, and one (gpt-oss's 2880) into slices that are
/// not whole rows.
#[test]
fn experts_match_each_tokens_experts_on_the_host() {
    let dev = Device::new_cuda(0).unwrap();
    let mut rng = Lcg(8);
    for (dtype, gpt_oss, fused) in [
        (DType::BF16, false, false),
        (DType::F16, false, false),
        (DType::BF16, true, false),
        (DType::BF16, false, true),
        (DType::F16, false, true),
    ] {
        for (tokens, hidden, inter, experts, top_k) in [
            (1, 256, 512, 8, 2),
            (3, 1024, 1408, 8, 2),
            (8, 512, 768, 128, 8),
            (5, 2048, 96, 16, 4),
            (2, 2880, 2880, 32, 4),
        ] {
            let DenseLayer {
                x,
                gu,
                down,
                routes,
                gu_bias,
                down_bias,
                norm_w,
                residual,
            } = DenseLayer::random(
                &mut rng,
                dtype,
                (tokens, hidden, inter, experts, top_k),
                &dev,
            );
            let (alpha, limit, eps) = (1.702f32, 1.0f32, 1e-6f32);
            let got = match (gpt_oss, fused) {
                (false, false) => moe_experts(&x, &gu, &down, &routes),
                (true, _) => moe_experts_with(
                    &x,
                    &gu,
                    &down,
                    &routes,
                    ExpertExtras {
                        gate_up_bias: Some(&gu_bias),
                        down_bias: Some(&down_bias),
                        clamped_swiglu: Some((alpha, limit)),
                        ..Default::default()
                    },
                ),
                (false, true) => moe_experts_with(
                    &x,
                    &gu,
                    &down,
                    &routes,
                    ExpertExtras {
                        input_norm: Some((&norm_w, eps)),
                        residual: Some(&residual),
                        ..Default::default()
                    },
                ),
            };
            let got = host_f32(&got.unwrap());
            let (gbv, dbv) = (host_f32(&gu_bias), host_f32(&down_bias));
            let (nwv, rv) = (host_f32(&norm_w), host_f32(&residual));

            let ids = routes
                .ids()
                .flatten_all()
                .unwrap()
                .to_vec1::<u32>()
                .unwrap();
            let weights = host_f32(routes.weights());
            let (xv, guv, dv) = (host_f32(&x), host_f32(&gu), host_f32(&down));
            let mut want = match fused {
                true => rv.clone(),
                false => vec![0f32; tokens * hidden],
            };
            for t in 0..tokens {
                let mut xt = xv[t * hidden..(t + 1) * hidden].to_vec();
                if fused {
                    let ms = xt.iter().map(|v| v * v).sum::<f32>() / hidden as f32;
                    let inv = 1.0 / (ms + eps).sqrt();
                    let normed = xt.iter().zip(&nwv).map(|(v, w)| v * inv * w).collect();
                    xt = round(normed, dtype, &dev);
                }
                for j in 0..top_k {
                    let e = ids[t * top_k + j] as usize;
                    let mid: Vec<f32> = (0..2 * inter)
                        .map(|o| {
                            let row = &guv[(e * 2 * inter + o) * hidden..][..hidden];
                            let b = if gpt_oss { gbv[e * 2 * inter + o] } else { 0.0 };
                            row.iter().zip(&xt).map(|(a, b)| a * b).sum::<f32>() + b
                        })
                        .collect();
                    let mid = round(mid, dtype, &dev);
                    let act: Vec<f32> = (0..inter)
                        .map(|i| match gpt_oss {
                            false => mid[i] / (1.0 + (-mid[i]).exp()) * mid[inter + i],
                            true => {
                                let g = mid[i].min(limit);
                                let u = mid[inter + i].clamp(-limit, limit);
                                (u + 1.0) * g / (1.0 + (-alpha * g).exp())
                            }
                        })
                        .collect();
                    let act = round(act, dtype, &dev);
                    for o in 0..hidden {
                        let row = &dv[(e * hidden + o) * inter..][..inter];
                        let dot: f32 = row.iter().zip(&act).map(|(a, b)| a * b).sum();
                        let b = if gpt_oss { dbv[e * hidden + o] } else { 0.0 };
                        want[t * hidden + o] += weights[t * top_k + j] * (dot + b);
                    }
                }
            }
            let err = max_rel_diff(&got, &want);
            assert!(
                err < 1e-2,
                "{dtype:?} {tokens} tokens, {experts} experts of {hidden}x{inter}, top {top_k} \
                 (gpt-oss {gpt_oss}, fused {fused}): off by {err}"
            );
        }
    }
    // Weights that do not fit the routes are refused.
    let x = Tensor::zeros((2, 64), DType::BF16, &dev).unwrap();
    let gu = Tensor::zeros((4, 64, 64), DType::BF16, &dev).unwrap();
    let down = Tensor::zeros((4, 64, 32), DType::BF16, &dev).unwrap();
    let routes = moe_route(&Tensor::zeros((2, 8), DType::F32, &dev).unwrap(), 2, true).unwrap();
    assert!(moe_experts(&x, &gu, &down, &routes).is_err());
}

/// MXFP4 experts (gpt-oss's, as they ship) read as they are: the dense kernels' outputs on their
/// dequantized weights (which equal the host's values exactly), but for the order of the sums
/// and the rounding it moves. Plain SwiGLU and gpt-oss's extras, with the input norm and residual
/// of the fused path; gpt-oss-20b's shape and small ones, runs a lane's share of a row and not,
/// 1 to 3 tokens.
#[test]
fn mxfp4_experts_equal_the_dense_kernels_on_their_values() {
    let dev = Device::new_cuda(0).unwrap();
    let mut rng = Lcg(12);
    for (dtype, experts, top_k, hidden, inter, tokens) in [
        (DType::BF16, 8, 2, 256, 128, 3),
        (DType::F16, 8, 2, 256, 128, 2),
        (DType::BF16, 32, 4, 2880, 2880, 1),
        (DType::BF16, 4, 1, 64, 32, 2),
    ] {
        let (gu, gu_values) = random_mxfp4(&mut rng, (experts, 2 * inter, hidden), &dev);
        let (down, down_values) = random_mxfp4(&mut rng, (experts, hidden, inter), &dev);
        let dense_gu = gu.dequantize(dtype).unwrap();
        let dense_down = down.dequantize(dtype).unwrap();
        assert_eq!(host_f32(&dense_gu), gu_values, "dequantized gate/up");
        assert_eq!(host_f32(&dense_down), down_values, "dequantized down");
        let x = random(&mut rng, (tokens, hidden), 1.0, dtype, &dev);
        let logits = random(&mut rng, (tokens, experts), 2.0, DType::F32, &dev);
        let routes = moe_route(&logits, top_k, true).unwrap();
        let gu_bias = random(&mut rng, (experts, 2 * inter), 0.3, dtype, &dev);
        let down_bias = random(&mut rng, (experts, hidden), 0.3, dtype, &dev);
        let norm_w = random(&mut rng, (1, hidden), 1.0, dtype, &dev)
            .flatten_all()
            .unwrap();
        let gpt_oss = ExpertExtras {
            gate_up_bias: Some(&gu_bias),
            down_bias: Some(&down_bias),
            clamped_swiglu: Some((1.702, 0.5)),
            input_norm: Some((&norm_w, 1e-5)),
            residual: Some(&x),
        };
        for extras in [ExpertExtras::default(), gpt_oss] {
            let fp4 = moe_experts_with(&x, &gu, &down, &routes, extras).unwrap();
            let dense = moe_experts_with(&x, &dense_gu, &dense_down, &routes, extras).unwrap();
            let err = max_rel_diff(&host_f32(&fp4), &host_f32(&dense));
            assert!(
                err < 1e-2,
                "{dtype:?} {experts} experts (top {top_k}) of {hidden} x {inter}, {tokens} tokens: \
                 off by {err}"
            );
        }
        // Only the listed experts are written.
        let out = dense_gu.zeros_like().unwrap();
        gu.dequantize_into(&out, &[1]).unwrap();
        let got = host_f32(&out);
        let per = 2 * inter * hidden;
        assert_eq!(got[per..2 * per], gu_values[per..2 * per]);
        assert!(got[..per].iter().chain(&got[2 * per..]).all(|&v| v == 0.0));
        assert!(gu.dequantize_into(&out, &[experts as u32]).is_err());
    }
    // Scales past 2^113 and runs that are not whole are refused.
    assert!(Mxfp4Stack::from_host(&[0; 16], &[241], (1, 1, 32), &dev).is_err());
    assert!(Mxfp4Stack::from_host(&[0; 8], &[127], (1, 1, 16), &dev).is_err());
}

/// Grouped GEMMs against one matmul a group: runs of rows of every length (none, one, many),
/// experts skipped and repeated, both 16-bit dtypes.
#[test]
fn grouped_matmul_equals_a_matmul_per_group() {
    let dev = Device::new_cuda(0).unwrap();
    let mut rng = Lcg(11);
    let gemm = GroupedGemm::new(&dev).unwrap();
    for dtype in [DType::BF16, DType::F16] {
        let (experts, n, k) = (6, 96, 128);
        let w = random(&mut rng, (experts * n, k), 0.1, dtype, &dev)
            .reshape((experts, n, k))
            .unwrap();
        let groups = [(0, 5), (2, 0), (3, 1), (5, 37), (1, 12), (3, 4)];
        let rows: usize = groups.iter().map(|g| g.1).sum();
        let x = random(&mut rng, (rows, k), 1.0, dtype, &dev);
        let got = host_f32(&gemm.matmul(&x, &w, &groups).unwrap());
        let mut want = Vec::new();
        let mut row = 0;
        for &(e, count) in groups.iter().filter(|g| g.1 > 0) {
            let part = x.narrow(0, row, count).unwrap();
            let we = w.get(e).unwrap();
            let y = part
                .to_dtype(DType::F32)
                .unwrap()
                .matmul(&we.to_dtype(DType::F32).unwrap().t().unwrap())
                .unwrap();
            want.extend(host_f32(&y));
            row += count;
        }
        let err = max_rel_diff(&got, &want);
        assert!(err < 1e-2, "{dtype:?}: off by {err}");
        // Groups that do not cover the rows, or name no expert, are refused.
        assert!(gemm.matmul(&x, &w, &[(0, rows - 1)]).is_err());
        assert!(gemm.matmul(&x, &w, &[(6, rows)]).is_err());
    }
}
