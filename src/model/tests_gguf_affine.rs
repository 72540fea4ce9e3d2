//! The GGUF repack against candle's dequantization of the same blocks (candle quantizes random
//! weights into each type here; its dequantization follows llama.cpp's).

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};

use super::*;

const TYPES: [GgmlDType; 8] = [
    GgmlDType::Q4_0,
    GgmlDType::Q4_1,
    GgmlDType::Q5_0,
    GgmlDType::Q5_1,
    GgmlDType::Q8_0,
    GgmlDType::Q4K,
    GgmlDType::Q5K,
    GgmlDType::Q6K,
];

/// A random `[out, inp]` matrix quantized to `ty`: its bytes and candle's dequantized values.
fn quantized(ty: GgmlDType, (out, inp): (usize, usize), seed: u64) -> (Vec<u8>, Vec<f32>) {
    let mut state = seed;
    let values: Vec<f32> = (0..out * inp)
        .map(|i| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let u = (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            // Rows of different magnitudes, some shifted off zero (Q4_1's and the k-quants' mins).
            u * 0.1 * (1 + i / inp % 3) as f32 + if i / inp % 2 == 1 { 0.03 } else { 0.0 }
        })
        .collect();
    let t = Tensor::from_vec(values, (out, inp), &Device::Cpu).unwrap();
    let q = QTensor::quantize(&t, ty).unwrap();
    let bytes = q.data().unwrap().to_vec();
    let back = q.dequantize(&Device::Cpu).unwrap();
    (bytes, back.flatten_all().unwrap().to_vec1::<f32>().unwrap())
}

#[test]
fn every_type_repacks_to_the_values_llama_cpp_dequantizes() {
    for ty in TYPES {
        let shape = (6, 512);
        let (bytes, want) = quantized(ty, shape, 7);
        let a = affine_codes(ty, &bytes, shape).unwrap_or_else(|| panic!("{ty:?}"));
        assert_eq!((a.out, a.inp, a.codes.len()), (6, 512, 6 * 512), "{ty:?}");
        assert!(
            a.codes.iter().all(|&q| usize::from(q) < 1 << a.bits),
            "{ty:?}: a code past {} bits",
            a.bits
        );
        for (i, &w) in want.iter().enumerate() {
            let got = a.value(i);
            // (s * q + b and llama.cpp's d * (q - z) round differently in f32.)
            assert!(
                (got - w).abs() <= 1e-6 + 1e-5 * w.abs(),
                "{ty:?} element {i}: {got} against {w}"
            );
        }
    }
}

#[test]
fn a_wrong_nibble_order_or_offset_is_seen() {
    // The check above fails when the repack is off: codes swapped within a block, or the pairs
    // of two groups exchanged.
    let (bytes, want) = quantized(GgmlDType::Q4K, (2, 256), 11);
    let mut a = affine_codes(GgmlDType::Q4K, &bytes, (2, 256)).unwrap();
    a.codes.swap(0, 32);
    let off = |a: &AffineCodes| (0..want.len()).any(|i| (a.value(i) - want[i]).abs() > 1e-4);
    assert!(off(&a));
    let mut b = affine_codes(GgmlDType::Q4K, &bytes, (2, 256)).unwrap();
    b.pairs.swap(1, 3);
    assert!(off(&b));
}

#[test]
fn other_types_and_ragged_bytes_are_not_repacked() {
    for ty in [
        GgmlDType::Q2K,
        GgmlDType::Q3K,
        GgmlDType::F16,
        GgmlDType::F32,
    ] {
        assert!(!repacks(ty));
    }
    let (bytes, _) = quantized(GgmlDType::Q8_0, (2, 64), 3);
    assert!(affine_codes(GgmlDType::Q8_0, &bytes, (2, 64)).is_some());
    assert!(affine_codes(GgmlDType::Q8_0, &bytes[1..], (2, 64)).is_none());
    // Columns not whole blocks.
    assert!(affine_codes(GgmlDType::Q4K, &bytes, (1, 128)).is_none());
}
