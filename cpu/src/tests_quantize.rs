//! The activations' 8-bit quantization: every instruction set's bit for bit the scalar
//! reference's, ties (a value exactly halfway between two integers) included.

use super::act_k::{ActK, quantize_row_k_scalar, quantize_row_k_with};
use super::blocks::{Act, quantize_row_scalar, quantize_row_with};
use super::kernels::Isa;
use super::tests::random_input;

/// Rows that exercise the corners: random values at several magnitudes, an all-zero block, and a
/// block whose largest magnitude is 127 (scale 1), so that ±k.5 are ties.
fn rows() -> Vec<Vec<f32>> {
    let mut ties: Vec<f32> = (0..31).map(|i| (i as f32 - 15.0) + 0.5).collect();
    ties.push(-127.0);
    let mut mixed = random_input(32 * 5, 9);
    mixed[32..64].fill(0.0);
    [1e-3, 1.0, 250.0]
        .iter()
        .map(|&scale| random_input(32 * 7, 3).iter().map(|v| v * scale).collect())
        .chain([ties, mixed])
        .collect()
}

#[test]
fn every_isa_quantizes_as_the_scalar_reference() {
    for row in rows() {
        let mut want = Vec::new();
        quantize_row_scalar(&row, &mut want);
        for isa in Isa::available() {
            let mut got: Vec<Act> = Vec::new();
            quantize_row_with(isa, &row, &mut got);
            assert_eq!(got, want, "{isa:?}");
        }
    }
}

/// The k-quants' activations (one scale a 256): every instruction set bit for bit the scalar
/// reference, over the rows above joined into super-blocks (a zero block among others, ties at
/// scale 1 next to larger values).
#[test]
fn every_isa_quantizes_super_blocks_as_the_scalar_reference() {
    let joined: Vec<f32> = rows().concat();
    let whole = joined.len() / 256 * 256;
    let mut all_zero = joined[..whole].to_vec();
    all_zero[..256].fill(0.0);
    for row in [&joined[..whole], &all_zero[..]] {
        let mut want = Vec::new();
        quantize_row_k_scalar(row, &mut want);
        assert_eq!(
            want[0].sums32[0],
            want[0].sub(0).iter().map(|&q| q as i16).sum::<i16>()
        );
        for isa in Isa::available() {
            let mut got: Vec<ActK> = Vec::new();
            quantize_row_k_with(isa, row, &mut got);
            assert_eq!(got, want, "{isa:?}");
        }
    }
}

#[test]
fn ties_round_away_from_zero() {
    let row = &rows()[3];
    let mut acts = Vec::new();
    quantize_row_scalar(row, &mut acts);
    assert_eq!(acts[0].d, 1.0);
    // Position i holds i - 14.5: -14.5 and 14.5 go to -15 and 15, -0.5 and 0.5 to -1 and 1.
    assert_eq!([acts[0].qs[0], acts[0].qs[29]], [-15, 15]);
    assert_eq!([acts[0].qs[14], acts[0].qs[15]], [-1, 1]);
}
