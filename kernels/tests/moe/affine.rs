//! Experts of integer codes (AWQ / GPTQ experts, GGUF experts repacked at load) against the dense
//! expert kernels over their dequantized stacks, whose values equal the host's.

use candle_core::{DType, Device, Tensor};
use pagewise_kernels::{AffineStack, CodeBits, ExpertExtras, moe_experts_with, moe_route};

use super::round;
use crate::common::affine::Weight;
use crate::common::{Lcg, host_f32, max_rel_diff, random};

/// `experts` random matrices `[rows, cols]` of codes stacked, and their values on the host.
pub(crate) fn random_stack(
    rng: &mut Lcg,
    bits: CodeBits,
    (experts, rows, cols): (usize, usize, usize),
    group: usize,
    dev: &Device,
) -> (AffineStack, Vec<f32>) {
    let w = Weight::new(rng, bits, (experts * rows, cols), group, false, dev);
    let width = cols * bits.bits() / 8;
    let groups = cols.div_ceil(group);
    let codes = w.codes.reshape((experts, rows, width)).unwrap();
    let pairs = w.pairs.reshape((experts, rows, groups, 2)).unwrap();
    let stack = AffineStack::new(codes, pairs, group, bits).unwrap();
    (stack, w.values)
}

/// Code widths and groups as the formats have them (AWQ's 4 bits in groups of 128, Q4_K's 32,
/// Q6_K's bytes in 16, GPTQ's 8 bits a channel), for gate/up and down apart (a Q4_K_M file's Q4_K
/// gate/up with Q6_K down); Qwen3-30B-A3B's shape, Mixtral's top 2 and small ones; 1 to 3 tokens.
/// The codes' sums are taken in another order than the dense kernels' and against bf16-rounded
/// values there, so within 1e-2 of the largest output, not bit for bit.
#[test]
fn affine_experts_match_the_dense_kernels_on_their_values() {
    let dev = Device::new_cuda(0).unwrap();
    let mut rng = Lcg(21);
    let four = |g| (CodeBits::Four, g);
    let eight = |g| (CodeBits::Eight, g);
    for (dtype, (experts, top_k, hidden, inter, tokens), gu_codes, down_codes) in [
        (DType::BF16, (128, 8, 2048, 768, 1), four(128), four(128)),
        (DType::BF16, (16, 8, 512, 256, 3), four(32), eight(16)),
        (DType::F16, (8, 2, 256, 128, 2), eight(32), four(32)),
        (DType::BF16, (8, 2, 1024, 1792, 1), four(1024), eight(1792)),
        (DType::BF16, (4, 1, 64, 32, 2), four(32), eight(16)),
        // Down inputs staged in more than 48 KB, 4-bit then bytes at the same staging size: each
        // kernel must opt in to that much shared memory itself.
        (DType::BF16, (2, 2, 128, 14336, 1), four(128), four(128)),
        (DType::BF16, (2, 2, 128, 14336, 1), four(32), eight(16)),
    ] {
        let what = format!(
            "{dtype:?} {experts} experts (top {top_k}) of {hidden} x {inter}, {tokens} tokens, \
             codes {gu_codes:?} and {down_codes:?}"
        );
        let (gu, gu_values) = random_stack(
            &mut rng,
            gu_codes.0,
            (experts, 2 * inter, hidden),
            gu_codes.1,
            &dev,
        );
        let (down, down_values) = random_stack(
            &mut rng,
            down_codes.0,
            (experts, hidden, inter),
            down_codes.1,
            &dev,
        );
        let dense_gu = gu.dequantize(dtype).unwrap();
        let dense_down = down.dequantize(dtype).unwrap();
        assert_eq!(
            host_f32(&dense_gu),
            round(gu_values.clone(), dtype, &dev),
            "{what}: gate/up"
        );
        assert_eq!(
            host_f32(&dense_down),
            round(down_values, dtype, &dev),
            "{what}: down"
        );
        let x = random(&mut rng, (tokens, hidden), 1.0, dtype, &dev);
        let logits = random(&mut rng, (tokens, experts), 2.0, DType::F32, &dev);
        let routes = moe_route(&logits, top_k, true).unwrap();
        let norm_w = random(&mut rng, (1, hidden), 1.0, dtype, &dev)
            .flatten_all()
            .unwrap();
        let fused = ExpertExtras {
            input_norm: Some((&norm_w, 1e-6)),
            residual: Some(&x),
            ..Default::default()
        };
        for extras in [ExpertExtras::default(), fused] {
            let codes = moe_experts_with(&x, &gu, &down, &routes, extras).unwrap();
            let dense = moe_experts_with(&x, &dense_gu, &dense_down, &routes, extras).unwrap();
            let err = max_rel_diff(&host_f32(&codes), &host_f32(&dense));
            assert!(err < 1e-2, "{what}: off by {err}");
        }
        // Only the listed experts are written, runs of them or one.
        let mut listed = vec![1, 2, experts as u32 - 1];
        listed.retain(|&e| (e as usize) < experts);
        listed.dedup();
        let out = dense_gu.zeros_like().unwrap();
        gu.dequantize_into(&out, &listed).unwrap();
        let (got, want) = (host_f32(&out), round(gu_values, dtype, &dev));
        let per = 2 * inter * hidden;
        for e in 0..experts {
            let is_listed = listed.contains(&(e as u32));
            let part = &got[e * per..(e + 1) * per];
            match is_listed {
                true => assert_eq!(part, &want[e * per..(e + 1) * per], "{what}: expert {e}"),
                false => assert!(part.iter().all(|&v| v == 0.0), "{what}: expert {e} written"),
            }
        }
        assert!(gu.dequantize_into(&out, &[experts as u32]).is_err());
    }
    // Columns not in whole runs, and groups the kernels do not take, are refused.
    let codes = |cols: usize| Tensor::zeros((1, 4, cols / 2), DType::U8, &dev).unwrap();
    let pairs = |groups: usize| Tensor::zeros((1, 4, groups, 2), DType::F16, &dev).unwrap();
    assert!(AffineStack::new(codes(48), pairs(1), 48, CodeBits::Four).is_err());
    assert!(AffineStack::new(codes(128), pairs(2), 64, CodeBits::Four).is_ok());
    assert!(AffineStack::new(codes(128), pairs(8), 16, CodeBits::Four).is_err());
    assert!(AffineStack::new(codes(128), pairs(3), 48, CodeBits::Four).is_err());
}
