//! GGUF's 16-bit float weights (F16 and BF16) interleaved 8 rows by 8. F16 weights are multiplied
//! by f32 activations as they are (no 8-bit quantization: the weights are already exact floats);
//! BF16 weights by activations rounded to BF16 ([`super::bf16`], which lays out their blocks).
//!
//! A block holds 32 columns of 8 rows, row after row. The kernels keep the columns in the lanes:
//! 8 columns of a weight row (converted to f32) times the same 8 columns of an activation row,
//! one accumulator for each pair of rows, summed across its lanes at the end.

use half::{bf16, f16};

/// Columns a block holds.
pub const HALF_COLS: usize = 32;

/// One block of 8 consecutive rows of 16-bit floats (`BF16`: bfloat16, else IEEE half): row
/// `r`'s weight of column `j` is `bits[32 r + j]` (row after row: a row's 8 consecutive columns
/// are one 16-byte load).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Halves8<const BF16: bool> {
    /// The weights' bits, column-major.
    pub bits: [u16; 8 * HALF_COLS],
}

/// F16 weights.
pub type F16x8 = Halves8<false>;
/// BF16 weights.
pub type Bf16x8 = Halves8<true>;

impl<const BF16: bool> Halves8<BF16> {
    /// Interleaves the little-endian 16-bit floats of 8 rows of `blocks * 32` columns each
    /// (row-major).
    pub fn interleave(bytes: &[u8], blocks: usize) -> Vec<Self> {
        let cols = blocks * HALF_COLS;
        assert_eq!(bytes.len(), 8 * cols * 2);
        let at = |r: usize, col: usize| {
            let i = 2 * (r * cols + col);
            u16::from_le_bytes([bytes[i], bytes[i + 1]])
        };
        (0..blocks)
            .map(|b| Halves8 {
                bits: std::array::from_fn(|i| at(i / HALF_COLS, b * HALF_COLS + i % HALF_COLS)),
            })
            .collect()
    }

    /// Row `r`'s weight `j` (of the block's 32 columns).
    pub fn weight(&self, r: usize, j: usize) -> f32 {
        let bits = self.bits[HALF_COLS * r + j];
        if BF16 {
            bf16::from_bits(bits).to_f32()
        } else {
            f16::from_bits(bits).to_f32()
        }
    }
}

/// Scalar reference: the 8 F16 rows of `w` (one group, all its blocks) against one f32 activation
/// row.
pub fn dot_f16x8_scalar(w: &[F16x8], a: &[f32]) -> [f32; 8] {
    std::array::from_fn(|r| {
        w.iter()
            .zip(a.chunks_exact(HALF_COLS))
            .map(|(b, x)| (0..HALF_COLS).map(|j| b.weight(r, j) * x[j]).sum::<f32>())
            .sum()
    })
}

/// AVX2 kernel: the 8 F16 rows of `w` against `R` f32 activation rows
/// (4 at most, to stay in registers: [`super::kernels::GroupBlock::TILE8`] is off), `WR` weight
/// rows at a time: per 8 columns, each of the `WR` rows' weights converted to f32 once and each
/// activation row loaded once, `WR · R` FMAs into as many accumulators, summed across their lanes
/// at the end. (Loads per FMA: `(WR + R) / (WR R)`. Columns across the rows' lanes, one broadcast
/// activation a column, took 9 loads per 8 FMAs: the load ports bound it, F16 prefill 75-80
/// GMAC/s against 86-103 so on Zen 4.) A decode row takes all 8 weight rows in one pass
/// (`WR` = 8), which streams through the group's memory once.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn dot_f16x8<const R: usize, const WR: usize>(
    w: &[F16x8],
    a: [&[f32]; R],
) -> [[f32; 8]; R] {
    use super::avx2::each_row;
    use std::arch::x86_64::*;
    const { assert!(8 % WR == 0) };
    for row in a {
        assert_eq!(row.len(), w.len() * HALF_COLS);
    }
    let mut out = [[0f32; 8]; R];
    for first in (0..8).step_by(WR) {
        let mut acc = [[_mm256_setzero_ps(); R]; WR];
        for (b, block) in w.iter().enumerate() {
            // (Not `from_fn`: see `blocks_at` in `avx2.rs`.)
            let mut x = [&a[0][..0]; R];
            each_row!(R, r => {
                x[r] = &a[r][b * HALF_COLS..][..HALF_COLS];
            });
            for c in (0..HALF_COLS).step_by(8) {
                let mut xs = [_mm256_setzero_ps(); R];
                // SAFETY: 8 floats of the row's block (`c + 8 <= 32`); unaligned load.
                each_row!(R, r => {
                    xs[r] = unsafe { _mm256_loadu_ps(x[r].as_ptr().add(c)) };
                });
                each_row!(WR, i => {
                    let at = HALF_COLS * (first + i) + c;
                    // SAFETY: 8 weights of row `first + i` (`at + 8 <= 256`); unaligned load.
                    let wv = _mm256_cvtph_ps(unsafe {
                        _mm_loadu_si128(block.bits.as_ptr().add(at).cast())
                    });
                    each_row!(R, r => {
                        acc[i][r] = _mm256_fmadd_ps(wv, xs[r], acc[i][r]);
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

/// The sum of the 8 lanes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
#[inline]
pub(super) fn hsum8(v: std::arch::x86_64::__m256) -> f32 {
    use std::arch::x86_64::*;
    let four = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let two = _mm_add_ps(four, _mm_movehl_ps(four, four));
    _mm_cvtss_f32(_mm_add_ss(two, _mm_movehdup_ps(two)))
}
