//! F16 and BF16 weights: the interleaved blocks hold the GGUF values, and every kernel multiplies
//! them by the activations as they are (F16: f32, not quantized to 8 bits) or rounded to BF16
//! (BF16 weights, as llama.cpp multiplies them).

use candle_core::quantized::GgmlDType;
use half::{bf16, f16};

use super::QLinear;
use super::kernels::Isa;
use super::team::Team;
use super::tests::{Rng, max_rel_diff, random_input};

/// GGUF bytes of a random `[rows, cols]` F16 or BF16 tensor, and its values as f64, row-major,
/// read apart from the interleaving.
fn random_halves(dtype: GgmlDType, rows: usize, cols: usize, seed: u64) -> (Vec<u8>, Vec<f64>) {
    let mut rng = Rng(seed);
    let (mut bytes, mut values) = (Vec::new(), Vec::new());
    for _ in 0..rows * cols {
        let v = rng.unit() * 0.5;
        let (le, back) = match dtype {
            GgmlDType::F16 => (f16::from_f32(v).to_le_bytes(), f16::from_f32(v).to_f64()),
            GgmlDType::BF16 => (bf16::from_f32(v).to_le_bytes(), bf16::from_f32(v).to_f64()),
            other => panic!("not a 16-bit float type: {other:?}"),
        };
        bytes.extend(le);
        values.push(back);
    }
    (bytes, values)
}

/// `x` as the kernels multiply `dtype`'s weights by it: as it is for F16, rounded to BF16 for
/// BF16.
fn as_multiplied(dtype: GgmlDType, x: &[f32]) -> Vec<f32> {
    match dtype {
        GgmlDType::BF16 => x.iter().map(|&v| bf16::from_f32(v).to_f32()).collect(),
        _ => x.to_vec(),
    }
}

/// `x W^T` in f64.
fn exact(w: &[f64], x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    x.chunks_exact(cols)
        .flat_map(|xi| {
            w.chunks_exact(cols).take(rows).map(move |wr| {
                let dot: f64 = xi.iter().zip(wr).map(|(&a, &b)| a as f64 * b).sum();
                dot as f32
            })
        })
        .collect()
}

/// Every ISA and team size, every tile mix (1 to 7 activation rows), a last group padded to 8
/// rows and whole groups: within f32 rounding of the f64 product of the file's values and the
/// activations as multiplied (BF16-rounded for BF16 weights: then within BF16's rounding, 2^-9
/// of each activation, of the product of the activations as they are).
#[test]
fn every_isa_multiplies_16_bit_floats_without_quantizing_the_activations() {
    for dtype in [GgmlDType::F16, GgmlDType::BF16] {
        for (rows, cols) in [(37, 96), (40, 64)] {
            let (bytes, values) = random_halves(dtype, rows, cols, 3);
            let layer = QLinear::from_gguf(dtype, &bytes, rows, cols).expect("a supported layer");
            let dequantized: Vec<f64> = layer.dequantize().iter().map(|&v| v as f64).collect();
            assert_eq!(
                dequantized, values,
                "{dtype:?}: the blocks hold the file's values"
            );
            for m in 1..=15 {
                let x = random_input(m * cols, 20 + m as u64);
                let want = exact(&values, &as_multiplied(dtype, &x), rows, cols);
                let unrounded = exact(&values, &x, rows, cols);
                for isa in Isa::available() {
                    for size in [1, 2, 3] {
                        let got = layer.matmul_with(isa, &Team::new(size), &x, m);
                        let diff = max_rel_diff(&got, &want);
                        // (8-bit activations would be ~1e-2 off.)
                        assert!(diff < 1e-5, "{dtype:?} {rows}x{cols} {isa:?} m={m}: {diff}");
                        let diff = max_rel_diff(&got, &unrounded);
                        assert!(
                            diff < 4e-3,
                            "{dtype:?} {isa:?} m={m}: {diff} from f32 inputs"
                        );
                    }
                }
            }
        }
    }
}

/// BF16 is not F16: the same bytes read as the other type give other products (the kernels
/// convert each type as its own).
#[test]
fn bf16_and_f16_bytes_are_read_as_their_own_type() {
    let (bytes, values) = random_halves(GgmlDType::BF16, 8, 32, 5);
    let x = random_input(32, 6);
    let want = exact(&values, &as_multiplied(GgmlDType::BF16, &x), 8, 32);
    let as_bf16 = QLinear::from_gguf(GgmlDType::BF16, &bytes, 8, 32).unwrap();
    let as_f16 = QLinear::from_gguf(GgmlDType::F16, &bytes, 8, 32).unwrap();
    for isa in Isa::available() {
        let team = Team::new(1);
        assert!(max_rel_diff(&as_bf16.matmul_with(isa, &team, &x, 1), &want) < 1e-5);
        assert!(max_rel_diff(&as_f16.matmul_with(isa, &team, &x, 1), &want) > 1e-2);
    }
}

/// Rows not a whole number of 32-column blocks, or bytes that are not `rows * cols` values, are
/// refused (the loader then keeps float weights).
#[test]
fn misshapen_16_bit_tensors_are_refused() {
    assert!(QLinear::from_gguf(GgmlDType::F16, &[0; 96], 1, 48).is_none());
    assert!(QLinear::from_gguf(GgmlDType::BF16, &[0; 62], 1, 32).is_none());
    assert!(QLinear::from_gguf(GgmlDType::F32, &[0; 128], 1, 32).is_none());
    assert!(QLinear::from_gguf(GgmlDType::F16, &[0; 64], 1, 32).is_some());
}

/// Stacked layers and looked-up rows read the same values.
#[test]
fn stacked_and_looked_up_16_bit_rows_are_the_files() {
    let (qb, qv) = random_halves(GgmlDType::F16, 8, 64, 7);
    let (kb, kv) = random_halves(GgmlDType::F16, 4, 64, 8);
    let q = QLinear::from_gguf(GgmlDType::F16, &qb, 8, 64).unwrap();
    let k = QLinear::from_gguf(GgmlDType::F16, &kb, 4, 64).unwrap();
    let both = QLinear::concat(&[&q, &k]).expect("same format and width");
    let x = random_input(2 * 64, 9);
    let want = exact(&[qv.clone(), kv.clone()].concat(), &x, 12, 64);
    assert!(max_rel_diff(&both.matmul(&x, 2), &want) < 1e-5);
    let rows: Vec<f64> = both
        .dequantize_rows(&[9, 0])
        .iter()
        .map(|&v| v as f64)
        .collect();
    assert_eq!(rows, [&kv[64..128], &qv[..64]].concat());
}

/// The activations' BF16 pairs: the first value in the low half, each rounded to nearest, ties
/// to even.
#[test]
fn activations_pair_up_rounded_to_bf16() {
    let x = [1.0 + 1.0 / 256.0, 1.0 + 3.0 / 256.0, -3.5, f32::INFINITY];
    let mut pairs = Vec::new();
    crate::bf16::bf16_pairs(&x, &mut pairs);
    assert_eq!(pairs, [0x3F82_3F80, 0x7F80_C060]);
}
