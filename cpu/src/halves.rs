//! GGUF's 16-bit float weights (F16 and BF16) interleaved 8 rows by 8, multiplied by f32
//! activations as they are (no 8-bit quantization: the weights are already exact floats, and
//! llama.cpp keeps their activations in 16 bits too).
//!
//! A block holds 32 columns of 8 rows, column after column: the 8 rows' weights of one column are
//! 16 contiguous bytes, which one load converts to 8 f32 lanes (a lane a row). The kernel
//! multiplies them by one activation broadcast to every lane, so each activation row needs one
//! accumulator for the 8 rows, and one converted column serves every activation row of the tile.

use half::{bf16, f16};

/// Columns a block holds.
pub const HALF_COLS: usize = 32;

/// One block of 8 consecutive rows of 16-bit floats (`BF16`: bfloat16, else IEEE half): row
/// `r`'s weight of column `j` is `bits[8 j + r]`.
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
                bits: std::array::from_fn(|i| at(i % 8, b * HALF_COLS + i / 8)),
            })
            .collect()
    }

    /// Row `r`'s weight `j` (of the block's 32 columns).
    pub fn weight(&self, r: usize, j: usize) -> f32 {
        let bits = self.bits[8 * j + r];
        if BF16 {
            bf16::from_bits(bits).to_f32()
        } else {
            f16::from_bits(bits).to_f32()
        }
    }
}

/// Scalar reference: the 8 rows of `w` (one group, all its blocks) against one f32 activation
/// row.
pub fn dot_halves8_scalar<const BF16: bool>(w: &[Halves8<BF16>], a: &[f32]) -> [f32; 8] {
    std::array::from_fn(|r| {
        w.iter()
            .zip(a.chunks_exact(HALF_COLS))
            .map(|(b, x)| (0..HALF_COLS).map(|j| b.weight(r, j) * x[j]).sum::<f32>())
            .sum()
    })
}

/// AVX2 kernel: the 8 rows of `w` against `R` f32 activation rows. Each column's 8 weights are
/// converted once (`vcvtph2ps`, or a widening shift for BF16) and multiplied into every row's
/// broadcast activation; even and odd columns go to separate accumulators so that consecutive
/// FMAs do not wait on each other. [`super::kernels`] calls it only where AVX2, FMA and F16C are.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn dot_halves8<const R: usize, const BF16: bool>(
    w: &[Halves8<BF16>],
    a: [&[f32]; R],
) -> [[f32; 8]; R] {
    use std::arch::x86_64::*;
    // Column `j`'s 8 weights as f32 lanes.
    let column = |block: &Halves8<BF16>, j: usize| {
        // SAFETY: 16 bytes, column `j`'s 8 weights (`8 j + 8 <= 256`); unaligned load.
        let bits = unsafe { _mm_loadu_si128(block.bits.as_ptr().add(8 * j).cast()) };
        if BF16 {
            _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16))
        } else {
            _mm256_cvtph_ps(bits)
        }
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
