//! The dense experts in slices of inner columns (`ExpertPlan::Slices`) against the row grids.

use candle_core::{DType, Device, Tensor};
use pagewise_kernels::{
    ExpertExtras, ExpertPlan, RouterLogits, moe_experts_by, moe_experts_with, moe_route,
    moe_route_experts,
};

use super::DenseLayer;
use crate::common::{Lcg, host_f32, max_rel_diff, random, random_mxfp4};

/// The experts in slices of 8 to 64 inner columns against the two row grids (which the test
/// above holds to the host): plain SwiGLU, gpt-oss's extras and the fused path's norm and
/// residual; one and two tokens, Qwen3-30B-A3B's shape among small ones; hidden widths that are
/// not whole blocks of the sum. Slice widths that do not divide the experts, and MXFP4 stacks,
/// are refused.
#[test]
fn slices_equal_the_rows() {
    let dev = Device::new_cuda(0).unwrap();
    let mut rng = Lcg(21);
    for (dtype, tokens, hidden, inter, experts, top_k) in [
        (DType::BF16, 1, 2048, 768, 128, 8),
        (DType::F16, 2, 264, 128, 8, 2),
        (DType::BF16, 2, 1024, 192, 16, 4),
        (DType::BF16, 3, 512, 64, 4, 1),
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
        let gpt_oss = ExpertExtras {
            gate_up_bias: Some(&gu_bias),
            down_bias: Some(&down_bias),
            clamped_swiglu: Some((1.702, 1.0)),
            ..Default::default()
        };
        let fused = ExpertExtras {
            input_norm: Some((&norm_w, 1e-6)),
            residual: Some(&residual),
            ..Default::default()
        };
        for extras in [ExpertExtras::default(), gpt_oss, fused] {
            let by = |plan| moe_experts_by(&x, &gu, &down, &routes, extras, plan);
            let rows = host_f32(&by(ExpertPlan::Rows).unwrap());
            for cols in [8, 16, 32, 64].into_iter().filter(|c| inter % c == 0) {
                let got = host_f32(&by(ExpertPlan::Slices(cols)).unwrap());
                let err = max_rel_diff(&got, &rows);
                assert!(
                    err < 1e-2,
                    "{dtype:?} {tokens} tokens, {experts} experts of {hidden}x{inter}, top \
                     {top_k}, slices of {cols}: off by {err}"
                );
                // The same again: the slices' sums do not depend on the blocks' order.
                assert_eq!(host_f32(&by(ExpertPlan::Slices(cols)).unwrap()), got);
            }
        }
        assert!(
            moe_experts_by(
                &x,
                &gu,
                &down,
                &routes,
                ExpertExtras::default(),
                ExpertPlan::Slices(24)
            )
            .is_err()
        );
    }
    let x = random(&mut rng, (1, 64), 1.0, DType::BF16, &dev);
    let routes = moe_route(&random(&mut rng, (1, 4), 1.0, DType::F32, &dev), 2, true).unwrap();
    let (gu4, _) = random_mxfp4(&mut rng, (4, 64, 64), &dev);
    let (down4, _) = random_mxfp4(&mut rng, (4, 64, 32), &dev);
    let extras = ExpertExtras::default();
    assert!(moe_experts_by(&x, &gu4, &down4, &routes, extras, ExpertPlan::Slices(16)).is_err());
    assert!(moe_experts_by(&x, &gu4, &down4, &routes, extras, ExpertPlan::Auto).is_ok());
}

/// The slices that route their own tokens (`moe_route_experts`) against `moe_route` then
/// `moe_experts_with`: the same outputs bit for bit, with the fused path's norm and residual —
/// Qwen3-30B-A3B's shape for one token, a small one for two, random and all-tied logits,
/// renormalized or not — and the kernels' fallback (routing kernel, then rows) for three tokens.
#[test]
fn slices_that_route_equal_the_routing_kernel() {
    let dev = Device::new_cuda(0).unwrap();
    let mut rng = Lcg(33);
    for (tokens, hidden, inter, experts, top_k) in [
        (1, 2048, 768, 128, 8),
        (2, 256, 128, 16, 4),
        (3, 256, 64, 8, 2),
    ] {
        let layer = DenseLayer::random(
            &mut rng,
            DType::BF16,
            (tokens, hidden, inter, experts, top_k),
            &dev,
        );
        let extras = layer.norm_and_residual(1e-6);
        let spread = random(&mut rng, (tokens, experts), 2.0, DType::F32, &dev);
        let tied = Tensor::zeros((tokens, experts), DType::F32, &dev).unwrap();
        for (name, logits) in [("random", &spread), ("tied", &tied)] {
            for renormalize in [true, false] {
                let routes = moe_route(logits, top_k, renormalize).unwrap();
                let (x, gu, down) = (&layer.x, &layer.gu, &layer.down);
                let want = host_f32(&moe_experts_with(x, gu, down, &routes, extras).unwrap());
                let routing = (top_k, renormalize);
                let logits = RouterLogits::Normed(logits);
                let got = moe_route_experts(x, gu, down, logits, routing, extras).unwrap();
                assert_eq!(
                    host_f32(&got),
                    want,
                    "{tokens} tokens, {experts} experts of {hidden}x{inter}, top {top_k}, \
                     {name} logits, renormalize {renormalize}"
                );
            }
        }
    }
}
