//! The o projection with the router folded in (`o_router`) against the GEMV and the router
//! kernel, and the slices routing from its logits (`RouterLogits::BeforeNorm`).

use candle_core::{DType, Device, Tensor};
use pagewise_kernels::{
    ExpertExtras, GemvInput, RouterLogits, fold_router, gemv_fused, moe_experts_with, moe_route,
    moe_route_experts, moe_router, o_router,
};

use super::DenseLayer;
use crate::common::{Lcg, host_f32, max_rel_diff, random};

/// Each row's 1 / rms on the host, as RMSNorm takes it.
fn inv_rms(x: &Tensor, eps: f32) -> Vec<f32> {
    let (_, hidden) = x.dims2().unwrap();
    host_f32(x)
        .chunks(hidden)
        .map(|r| 1.0 / (r.iter().map(|v| v * v).sum::<f32>() / hidden as f32 + eps).sqrt())
        .collect()
}

/// The stream bit for bit as the GEMV with the residual computes it, and the logits times the
/// norm's 1 / rms within rounding of the router kernel's logits of the normalized stream: one
/// and two rows, one and two warps an output (k below and at 2048), Qwen3-30B-A3B's and
/// Mixtral's router widths. Three rows and a router of the wrong width are refused.
#[test]
fn o_router_projects_as_the_gemv_and_scores_as_the_router() {
    let dev = Device::new_cuda(0).unwrap();
    let mut rng = Lcg(41);
    let eps = 1e-6;
    for (dtype, rows, k, hidden, experts) in [
        (DType::BF16, 1, 4096, 2048, 128),
        (DType::BF16, 2, 1024, 512, 8),
        (DType::F16, 2, 2048, 256, 60),
        (DType::BF16, 1, 512, 1024, 128),
    ] {
        let a = random(&mut rng, (rows, k), 1.0, dtype, &dev);
        let o = random(&mut rng, (hidden, k), 0.05, dtype, &dev);
        let residual = random(&mut rng, (rows, hidden), 1.0, dtype, &dev);
        let router = random(&mut rng, (experts, hidden), 0.1, DType::F32, &dev);
        let g = random(&mut rng, (1, hidden), 1.0, dtype, &dev)
            .reshape(hidden)
            .unwrap();
        let folded = fold_router(&router, &g, &o).unwrap();
        let (y, logits) = o_router(&a, &o, &residual, &folded).unwrap();
        let want_y = gemv_fused(&a, &o, GemvInput::Plain, Some(&residual)).unwrap();
        let label = format!("{dtype:?} {rows} rows, o {hidden}x{k}, {experts} experts");
        assert_eq!(host_f32(&y), host_f32(&want_y), "{label}: the stream");
        let want = host_f32(&moe_router(&y, &router, Some((&g, eps))).unwrap());
        let inv = inv_rms(&y, eps);
        let got: Vec<f32> = host_f32(&logits)
            .chunks(experts)
            .zip(&inv)
            .flat_map(|(row, s)| row.iter().map(move |l| l * s))
            .collect();
        let diff = max_rel_diff(&got, &want);
        assert!(diff < 1e-2, "{label}: logits {diff} off the router's");
    }
    let a = random(&mut rng, (3, 512), 1.0, DType::BF16, &dev);
    let o = random(&mut rng, (256, 512), 0.05, DType::BF16, &dev);
    let residual = random(&mut rng, (3, 256), 1.0, DType::BF16, &dev);
    let folded = Tensor::zeros((8, 768), DType::F32, &dev).unwrap();
    assert!(o_router(&a, &o, &residual, &folded).is_err(), "three rows");
    let narrow = folded.narrow(1, 0, 512).unwrap().contiguous().unwrap();
    let (a2, r2) = (
        a.narrow(0, 0, 2).unwrap(),
        residual.narrow(0, 0, 2).unwrap(),
    );
    assert!(
        o_router(&a2, &o, &r2, &narrow).is_err(),
        "a router of k columns only"
    );
}

/// The slices routing from logits before the norm pick what the routing kernel picks from the
/// same logits times each token's 1 / rms (the scale the slices compute as they stage the norm):
/// the same experts, weights within float rounding of the scale. Past the slices (three tokens)
/// such logits are refused.
#[test]
fn slices_scale_logits_before_the_norm() {
    let dev = Device::new_cuda(0).unwrap();
    let mut rng = Lcg(43);
    let eps = 1e-6;
    for (tokens, hidden, inter, experts, top_k) in [(1, 2048, 768, 128, 8), (2, 256, 128, 16, 4)] {
        let layer = DenseLayer::random(
            &mut rng,
            DType::BF16,
            (tokens, hidden, inter, experts, top_k),
            &dev,
        );
        let extras = layer.norm_and_residual(eps);
        let (x, gu, down) = (&layer.x, &layer.gu, &layer.down);
        let before = random(&mut rng, (tokens, experts), 20.0, DType::F32, &dev);
        let inv = Tensor::from_vec(inv_rms(x, eps), (tokens, 1), &dev).unwrap();
        let scaled = before.broadcast_mul(&inv).unwrap();
        for renormalize in [true, false] {
            let routes = moe_route(&scaled, top_k, renormalize).unwrap();
            let want = host_f32(&moe_experts_with(x, gu, down, &routes, extras).unwrap());
            let routing = (top_k, renormalize);
            let got = moe_route_experts(
                x,
                gu,
                down,
                RouterLogits::BeforeNorm(&before),
                routing,
                extras,
            )
            .unwrap();
            let diff = max_rel_diff(&host_f32(&got), &want);
            assert!(
                diff < 1e-2,
                "{tokens} tokens, {experts} experts, renormalize {renormalize}: {diff}"
            );
        }
    }
    let layer = DenseLayer::random(&mut rng, DType::BF16, (3, 256, 64, 8, 2), &dev);
    let extras = ExpertExtras {
        input_norm: Some((&layer.norm_w, eps)),
        ..Default::default()
    };
    let before = random(&mut rng, (3, 8), 1.0, DType::F32, &dev);
    let (x, gu, down) = (&layer.x, &layer.gu, &layer.down);
    let logits = RouterLogits::BeforeNorm(&before);
    assert!(moe_route_experts(x, gu, down, logits, (2, true), extras).is_err());
}
