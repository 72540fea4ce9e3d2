//! IQ4_NL and IQ4_XS: the interleaved weights against ggml's dequantization of the same bytes,
//! their accuracy and refusals; their random bytes for the tests every format takes
//! (`tests.rs`: SIMD against scalar, every byte into its own row).

use half::f16;

use super::QLinear;
use super::iq4::{IQ4_VALUES, Iq4Type, dequantize};
use super::tests::{Rng, float_reference, max_rel_diff, random_input};

const TYPES: [Iq4Type; 2] = [Iq4Type::Nl, Iq4Type::Xs];

/// GGUF bytes of a random `[rows, cols]` tensor of `ty`: scales of either sign (IQ4_XS's 6-bit
/// ones over their whole range), random codes.
pub(crate) fn iq4_bytes(ty: Iq4Type, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    let mut out = Vec::new();
    for _ in 0..rows * cols / ty.block() {
        let d = f16::from_f32(0.001 + 0.002 * rng.unit());
        out.extend(d.to_le_bytes());
        let extra = match ty {
            Iq4Type::Nl => 16,
            Iq4Type::Xs => 2 + 4 + 128,
        };
        let mut block: Vec<u8> = (0..extra).map(|_| rng.next() as u8).collect();
        if ty == Iq4Type::Xs {
            // No sub-block scale of 0 (ls = 32): every code then counts.
            let h = u16::from_le_bytes([block[0], block[1]]);
            for ib in 0..8 {
                let ls = ((block[2 + ib / 2] >> (4 * (ib % 2))) & 15)
                    | ((((h >> (2 * ib)) & 3) as u8) << 4);
                if ls == 32 {
                    block[2 + ib / 2] ^= 1 << (4 * (ib % 2));
                }
            }
        }
        out.extend(block);
    }
    out
}

fn layer(ty: Iq4Type, bytes: &[u8], rows: usize, cols: usize) -> QLinear {
    QLinear::from_iq4(ty, bytes, rows, cols).expect("a well-formed IQ4 tensor")
}

/// Columns of a test layer: whole blocks (IQ4_XS's are 256 wide).
pub(crate) fn width(ty: Iq4Type) -> usize {
    match ty {
        Iq4Type::Nl => 96,
        Iq4Type::Xs => 512,
    }
}

/// ggml's `dequantize_row_iq4_nl` / `_iq4_xs` written out for one block (not through
/// [`dequantize`], which the interleaved layout is also checked against).
fn ggml_block(ty: Iq4Type, b: &[u8]) -> Vec<f32> {
    let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
    let (scales, qs): (Vec<f32>, &[u8]) = match ty {
        Iq4Type::Nl => (vec![d], &b[2..18]),
        Iq4Type::Xs => {
            let h = u16::from_le_bytes([b[2], b[3]]) as i32;
            let scales = (0..8)
                .map(|ib| {
                    let ls = ((b[4 + ib / 2] as i32 >> (4 * (ib % 2))) & 0xf)
                        | (((h >> (2 * ib)) & 3) << 4);
                    d * (ls - 32) as f32
                })
                .collect();
            (scales, &b[8..136])
        }
    };
    let mut out = Vec::new();
    for (ib, dl) in scales.into_iter().enumerate() {
        let q = &qs[16 * ib..16 * ib + 16];
        out.extend(
            q.iter()
                .map(|&c| dl * IQ4_VALUES[(c & 0xf) as usize] as f32),
        );
        out.extend(q.iter().map(|&c| dl * IQ4_VALUES[(c >> 4) as usize] as f32));
    }
    out
}

#[test]
fn interleaved_weights_are_ggmls_dequantized_weights() {
    for ty in TYPES {
        let (rows, cols) = (37, width(ty));
        let bytes = iq4_bytes(ty, rows, cols, &mut Rng(3));
        let want: Vec<f32> = bytes
            .chunks_exact(ty.block_bytes())
            .flat_map(|b| ggml_block(ty, b))
            .collect();
        let mut plain = Vec::new();
        dequantize(ty, &bytes, &mut plain);
        assert_eq!(plain, want, "{ty:?}: dequantize");
        let layer = layer(ty, &bytes, rows, cols);
        assert_eq!(layer.dequantize(), want, "{ty:?}: the interleaved blocks");
        let ids = [36, 0, 9, 9];
        let rows_back: Vec<f32> = ids
            .iter()
            .flat_map(|&r| want[r * cols..(r + 1) * cols].to_vec())
            .collect();
        assert_eq!(
            layer.dequantize_rows(&ids),
            rows_back,
            "{ty:?}: looked-up rows"
        );
    }
}

#[test]
fn quantized_matmul_is_within_quantization_error_of_f32() {
    for ty in TYPES {
        let (rows, cols) = (64, 1024);
        let layer = layer(ty, &iq4_bytes(ty, rows, cols, &mut Rng(11)), rows, cols);
        let x = random_input(3 * cols, 12);
        let (got, want) = (layer.matmul(&x, 3), float_reference(&layer, &x, 3));
        // The activations' 8 bits lose about 1/254 of each block's largest value.
        let diff = max_rel_diff(&got, &want);
        assert!(diff < 2e-2 && diff > 0.0, "{ty:?}: {diff}");
    }
}

#[test]
fn misshapen_tensors_are_refused() {
    for ty in TYPES {
        let bytes = iq4_bytes(ty, 8, 256, &mut Rng(1));
        assert!(QLinear::from_iq4(ty, &bytes, 8, 256).is_some());
        assert!(
            QLinear::from_iq4(ty, &bytes[1..], 8, 256).is_none(),
            "{ty:?}: short"
        );
        assert!(
            QLinear::from_iq4(ty, &bytes, 9, 256).is_none(),
            "{ty:?}: rows"
        );
    }
    assert!(
        QLinear::from_iq4(Iq4Type::Xs, &[0; 8 * 136], 8, 128).is_none(),
        "cols of half a block"
    );
}
