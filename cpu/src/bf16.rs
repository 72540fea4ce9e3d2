//! GGUF's BF16 weights against activations rounded to BF16, as llama.cpp multiplies them (its
//! `vec_dot_type` for BF16 is BF16): with AVX512-BF16, one `vdpbf16ps` multiplies 16 columns of a
//! weight row by the same columns of an activation row, each 32-bit lane adding its pair's two
//! products into its f32 sum; without it, both are widened to f32 and multiplied by FMAs.
//!
//! The blocks ([`Bf16x8`]) are laid out as F16's, row after row. Activations are pairs
//! ([`bf16_pairs`]): column `2p` in the low 16 bits of a `u32`, `2p + 1` in the high ones, which
//! is a BF16 array's layout.

use half::bf16;

use super::halves::{Bf16x8, HALF_COLS};

/// Activation pairs a block of [`Bf16x8`] takes.
pub const PAIRS: usize = HALF_COLS / 2;

/// `x` (an even length) rounded to BF16 (to nearest, ties to even), two values a `u32` (the first
/// in the low half: a BF16 array's bytes), appended to `out`. (A vectorized conversion measured
/// no faster in a 64-row prefill: it is a few percent of the matmul's time at most.)
pub fn bf16_pairs(x: &[f32], out: &mut Vec<u32>) {
    out.extend(x.chunks_exact(2).map(|p| {
        let (lo, hi) = (bf16::from_f32(p[0]), bf16::from_f32(p[1]));
        lo.to_bits() as u32 | (hi.to_bits() as u32) << 16
    }));
}

/// The pair's two activations as f32: (low, high).
fn unpair(pair: u32) -> (f32, f32) {
    (
        f32::from_bits(pair << 16),
        f32::from_bits(pair & 0xFFFF_0000),
    )
}

/// Scalar reference: the 8 rows of `w` (one group, all its blocks) against one row of activation
/// pairs, both products of a pair added, then into the sum.
pub fn dot_bf16x8_scalar(w: &[Bf16x8], a: &[u32]) -> [f32; 8] {
    std::array::from_fn(|r| {
        let mut sum = 0f32;
        for (block, pairs) in w.iter().zip(a.chunks_exact(PAIRS)) {
            for (p, &pair) in pairs.iter().enumerate() {
                let (x0, x1) = unpair(pair);
                sum += block.weight(r, 2 * p) * x0 + block.weight(r, 2 * p + 1) * x1;
            }
        }
        sum
    })
}

/// The same 256 bits as 16 BF16 values.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn as_bf16(v: std::arch::x86_64::__m256i) -> std::arch::x86_64::__m256bh {
    // SAFETY: both are 256-bit vectors, and every bit pattern is a valid value of either.
    unsafe { std::mem::transmute(v) }
}

/// AVX2 kernel (no AVX512-BF16), as [`super::halves::dot_f16x8`] with 16 columns a step: 16
/// weights of a row and 8 activation pairs are each one load, split into even and odd columns as
/// f32 (a BF16 value is the high half of an f32: a shift, a mask), and multiplied lane by lane,
/// even by even and odd by odd.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(super) fn dot_bf16x8<const R: usize, const WR: usize>(
    w: &[Bf16x8],
    a: [&[u32]; R],
) -> [[f32; 8]; R] {
    use super::avx2::each_row;
    use super::halves::hsum8;
    use std::arch::x86_64::*;
    const { assert!(8 % WR == 0) };
    for row in a {
        assert_eq!(row.len(), w.len() * PAIRS);
    }
    let high = _mm256_set1_epi32(0xFFFF_0000u32 as i32);
    // The even and odd columns of 8 pairs of BF16 values, as f32.
    let split = |v: __m256i| {
        (
            _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)),
            _mm256_castsi256_ps(_mm256_and_si256(v, high)),
        )
    };
    let mut out = [[0f32; 8]; R];
    for first in (0..8).step_by(WR) {
        let mut acc = [[_mm256_setzero_ps(); R]; WR];
        for (b, block) in w.iter().enumerate() {
            // (Not `from_fn`: see `blocks_at` in `avx2.rs`.)
            let mut x = [&a[0][..0]; R];
            each_row!(R, r => {
                x[r] = &a[r][b * PAIRS..][..PAIRS];
            });
            for c in (0..HALF_COLS).step_by(16) {
                let mut xs = [(_mm256_setzero_ps(), _mm256_setzero_ps()); R];
                // SAFETY: 8 pairs of the row's block (`c / 2 + 8 <= 16`); unaligned load.
                each_row!(R, r => {
                    xs[r] = split(unsafe { _mm256_loadu_si256(x[r].as_ptr().add(c / 2).cast()) });
                });
                each_row!(WR, i => {
                    let at = HALF_COLS * (first + i) + c;
                    // SAFETY: 16 weights of row `first + i` (`at + 16 <= 256`); unaligned load.
                    let (even, odd) =
                        split(unsafe { _mm256_loadu_si256(block.bits.as_ptr().add(at).cast()) });
                    each_row!(R, r => {
                        acc[i][r] = _mm256_fmadd_ps(even, xs[r].0, acc[i][r]);
                        acc[i][r] = _mm256_fmadd_ps(odd, xs[r].1, acc[i][r]);
                    });
                });
            }
        }
        each_row!(WR, i => {
            each_row!(R, r => {
                out[r][first + i] = hsum8(acc[i][r]);
            });
        });
    }
    out
}

/// AVX512-BF16 kernel, as [`super::halves::dot_f16x8`] with 16 columns a step: each of the `WR`
/// weight rows' 16 values and each activation row's 8 pairs loaded once, then one `vdpbf16ps` per
/// pair of rows (both columns of each lane's pair multiplied and added into its f32 sum).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,avx512f,avx512vl,avx512bw,avx512bf16")]
#[inline]
pub(super) fn dot_bf16x8_dp<const R: usize, const WR: usize>(
    w: &[Bf16x8],
    a: [&[u32]; R],
) -> [[f32; 8]; R] {
    use super::avx2::each_row;
    use super::halves::hsum8;
    use std::arch::x86_64::*;
    const { assert!(8 % WR == 0) };
    for row in a {
        assert_eq!(row.len(), w.len() * PAIRS);
    }
    let mut out = [[0f32; 8]; R];
    for first in (0..8).step_by(WR) {
        let mut acc = [[_mm256_setzero_ps(); R]; WR];
        for (b, block) in w.iter().enumerate() {
            // (Not `from_fn`: see `blocks_at` in `avx2.rs`.)
            let mut x = [&a[0][..0]; R];
            each_row!(R, r => {
                x[r] = &a[r][b * PAIRS..][..PAIRS];
            });
            for c in (0..HALF_COLS).step_by(16) {
                let mut xs = [as_bf16(_mm256_setzero_si256()); R];
                // SAFETY: 8 pairs of the row's block (`c / 2 + 8 <= 16`); unaligned load.
                each_row!(R, r => {
                    xs[r] = as_bf16(unsafe { _mm256_loadu_si256(x[r].as_ptr().add(c / 2).cast()) });
                });
                each_row!(WR, i => {
                    let at = HALF_COLS * (first + i) + c;
                    // SAFETY: 16 weights of row `first + i` (`at + 16 <= 256`); unaligned load.
                    let wv = as_bf16(unsafe {
                        _mm256_loadu_si256(block.bits.as_ptr().add(at).cast())
                    });
                    each_row!(R, r => {
                        acc[i][r] = _mm256_dpbf16_ps(acc[i][r], wv, xs[r]);
                    });
                });
            }
        }
        each_row!(WR, i => {
            each_row!(R, r => {
                out[r][first + i] = hsum8(acc[i][r]);
            });
        });
    }
    out
}
