//! GGUF's BF16 weights against activations rounded to BF16, as llama.cpp multiplies them (its
//! `vec_dot_type` for BF16 is BF16): with AVX512-BF16, one `vdpbf16ps` multiplies two columns of
//! 8 rows by a pair of activations and adds both products into f32 lanes; without it, the two
//! columns are widened to f32 (a shift and a mask) and multiplied by FMAs.
//!
//! Layout ([`Bf16x8`]): a block holds 32 columns of 8 rows as 16 column pairs; pair `p`'s 16
//! values are, for each row `r`, its weights of columns `2p` and `2p + 1` (`bits[16 p + 2 r]` and
//! `bits[16 p + 2 r + 1]`): one 32-byte load is the 8 rows' two columns, a row to each 32-bit
//! lane, as `vdpbf16ps` takes them. Activations are pairs too ([`bf16_pairs`]): column `2p` in
//! the low 16 bits of a `u32`, `2p + 1` in the high ones.

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
/// pairs, both products of a pair added, then into the sum (as `vdpbf16ps` orders them).
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

/// Each activation row's pairs of block `b`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn block_pairs<const R: usize>(a: [&[u32]; R], b: usize) -> [&[u32; PAIRS]; R] {
    std::array::from_fn(|r| {
        a[r][b * PAIRS..(b + 1) * PAIRS]
            .try_into()
            .expect("a row of whole blocks")
    })
}

/// Column pair `p` of `block`: 16 BF16 values, row `r`'s two in 32-bit lane `r`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
#[inline]
fn pair_bits(block: &Bf16x8, p: usize) -> std::arch::x86_64::__m256i {
    assert!(p < PAIRS);
    // SAFETY: 32 bytes, `bits[16 p..16 p + 16]`; unaligned load.
    unsafe { std::arch::x86_64::_mm256_loadu_si256(block.bits.as_ptr().add(16 * p).cast()) }
}

/// AVX2 kernel (no AVX512-BF16): per column pair, the two columns widened to f32 (BF16 is the
/// high half of an f32) and multiplied by each row's two activations, widened once a block into
/// even and odd columns (so that each is one broadcast load); even and odd columns into separate
/// accumulators.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(super) fn dot_bf16x8<const R: usize>(w: &[Bf16x8], a: [&[u32]; R]) -> [[f32; 8]; R] {
    use super::avx2::each_row;
    use std::arch::x86_64::*;
    let high = _mm256_set1_epi32(0xFFFF_0000u32 as i32);
    let (mut even, mut odd) = ([_mm256_setzero_ps(); R], [_mm256_setzero_ps(); R]);
    // Row r's activations of the block: columns 2p in `xs[r][0][p]`, 2p + 1 in `xs[r][1][p]`.
    let mut xs = [[[0f32; PAIRS]; 2]; R];
    for (b, block) in w.iter().enumerate() {
        let x = block_pairs(a, b);
        each_row!(R, r => {
            for half in 0..2 {
                // SAFETY: 8 of the row's 16 pairs; unaligned load and stores.
                unsafe {
                    let v = _mm256_loadu_si256(x[r].as_ptr().add(8 * half).cast());
                    let (lo, hi) = (_mm256_slli_epi32(v, 16), _mm256_and_si256(v, high));
                    _mm256_storeu_si256(xs[r][0].as_mut_ptr().add(8 * half).cast(), lo);
                    _mm256_storeu_si256(xs[r][1].as_mut_ptr().add(8 * half).cast(), hi);
                }
            }
        });
        // (`p` indexes the block's pairs and every row's activations alike.)
        #[allow(clippy::needless_range_loop)]
        for p in 0..PAIRS {
            let v = pair_bits(block, p);
            let (w0, w1) = (
                _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)),
                _mm256_castsi256_ps(_mm256_and_si256(v, high)),
            );
            each_row!(R, r => {
                even[r] = _mm256_fmadd_ps(w0, _mm256_set1_ps(xs[r][0][p]), even[r]);
                odd[r] = _mm256_fmadd_ps(w1, _mm256_set1_ps(xs[r][1][p]), odd[r]);
            });
        }
    }
    let mut out = [[0f32; 8]; R];
    each_row!(R, r => {
        // SAFETY: 8 floats; unaligned store.
        unsafe { _mm256_storeu_ps(out[r].as_mut_ptr(), _mm256_add_ps(even[r], odd[r])) };
    });
    out
}

/// The same 256 bits as 16 BF16 values.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn as_bf16(v: std::arch::x86_64::__m256i) -> std::arch::x86_64::__m256bh {
    // SAFETY: both are 256-bit vectors, and every bit pattern is a valid value of either.
    unsafe { std::mem::transmute(v) }
}

/// AVX512-BF16 kernel: per column pair, one `vdpbf16ps` a row (both columns' products of the 8
/// rows, added into its f32 lanes); even and odd pairs into separate accumulators, so that
/// consecutive `vdpbf16ps` of a row do not wait on each other.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,avx512f,avx512vl,avx512bw,avx512bf16")]
#[inline]
pub(super) fn dot_bf16x8_dp<const R: usize>(w: &[Bf16x8], a: [&[u32]; R]) -> [[f32; 8]; R] {
    use super::avx2::each_row;
    use std::arch::x86_64::*;
    let (mut even, mut odd) = ([_mm256_setzero_ps(); R], [_mm256_setzero_ps(); R]);
    for (b, block) in w.iter().enumerate() {
        let x = block_pairs(a, b);
        for p in (0..PAIRS).step_by(2) {
            let (v0, v1) = (pair_bits(block, p), pair_bits(block, p + 1));
            let (v0, v1) = (as_bf16(v0), as_bf16(v1));
            each_row!(R, r => {
                let x0 = as_bf16(_mm256_set1_epi32(x[r][p] as i32));
                let x1 = as_bf16(_mm256_set1_epi32(x[r][p + 1] as i32));
                even[r] = _mm256_dpbf16_ps(even[r], v0, x0);
                odd[r] = _mm256_dpbf16_ps(odd[r], v1, x1);
            });
        }
    }
    let mut out = [[0f32; 8]; R];
    each_row!(R, r => {
        // SAFETY: 8 floats; unaligned store.
        unsafe { _mm256_storeu_ps(out[r].as_mut_ptr(), _mm256_add_ps(even[r], odd[r])) };
    });
    out
}
