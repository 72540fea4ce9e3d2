//! GGUF's 16-bit float weights (F16 and BF16) interleaved 8 rows by 8. F16 weights are multiplied
//! by f32 activations as they are (no 8-bit quantization: the weights are already exact floats);
//! BF16 weights by activations rounded to BF16 ([`super::bf16`], which lays out their blocks).
//!
//! An F16 block holds 32 columns of 8 rows, column after column: the 8 rows' weights of one column
//! are 16 contiguous bytes, which one load converts to 8 f32 lanes (a lane a row). The kernel
//! multiplies them by one activation broadcast to every lane, so each activation row needs one
//! accumulator for the 8 rows, and one converted column serves every activation row of the tile.

use half::{bf16, f16};

/// Columns a block holds.
pub const HALF_COLS: usize = 32;

/// One block of 8 consecutive rows of 16-bit floats (`BF16`: bfloat16, else IEEE half): row
/// `r`'s weight of column `j` is `bits[8 j + r]` (F16), or `bits[16 (j / 2) + 2 r + j % 2]`
/// (BF16: column pairs, [`super::bf16`]).
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
                bits: std::array::from_fn(|i| {
                    let (r, j) = Self::place(i);
                    at(r, b * HALF_COLS + j)
                }),
            })
            .collect()
    }

    /// The row and column whose weight `bits[i]` holds.
    fn place(i: usize) -> (usize, usize) {
        if BF16 {
            (i % 16 / 2, 2 * (i / 16) + i % 2)
        } else {
            (i % 8, i / 8)
        }
    }

    /// Where row `r`'s weight of column `j` lies in `bits`.
    fn index(r: usize, j: usize) -> usize {
        if BF16 {
            16 * (j / 2) + 2 * r + j % 2
        } else {
            8 * j + r
        }
    }

    /// Row `r`'s weight `j` (of the block's 32 columns).
    pub fn weight(&self, r: usize, j: usize) -> f32 {
        let bits = self.bits[Self::index(r, j)];
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

/// AVX2 kernel: the 8 F16 rows of `w` against `R` f32 activation rows. Each column's 8 weights are
/// converted once (`vcvtph2ps`) and multiplied into every row's
/// broadcast activation; even and odd columns go to separate accumulators so that consecutive
/// FMAs do not wait on each other. [`super::kernels`] calls it only where AVX2, FMA and F16C are.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn dot_f16x8<const R: usize>(w: &[F16x8], a: [&[f32]; R]) -> [[f32; 8]; R] {
    use std::arch::x86_64::*;
    // Column `j`'s 8 weights as f32 lanes.
    let column = |block: &F16x8, j: usize| {
        // SAFETY: 16 bytes, column `j`'s 8 weights (`8 j + 8 <= 256`); unaligned load.
        _mm256_cvtph_ps(unsafe { _mm_loadu_si128(block.bits.as_ptr().add(8 * j).cast()) })
    };
    let (mut even, mut odd) = ([_mm256_setzero_ps(); R], [_mm256_setzero_ps(); R]);
    for (b, block) in w.iter().enumerate() {
        let x: [&[f32; HALF_COLS]; R] = std::array::from_fn(|r| {
            a[r][b * HALF_COLS..(b + 1) * HALF_COLS]
                .try_into()
                .expect("a row of whole blocks")
        });
        for j in (0..HALF_COLS).step_by(2) {
            let (w0, w1) = (column(block, j), column(block, j + 1));
            super::avx2::each_row!(R, r => {
                even[r] = _mm256_fmadd_ps(w0, _mm256_set1_ps(x[r][j]), even[r]);
                odd[r] = _mm256_fmadd_ps(w1, _mm256_set1_ps(x[r][j + 1]), odd[r]);
            });
        }
    }
    std::array::from_fn(|r| {
        let mut out = [0f32; 8];
        // SAFETY: 8 floats; unaligned store.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), _mm256_add_ps(even[r], odd[r])) };
        out
    })
}
