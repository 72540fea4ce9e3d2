//! The activations' 8-bit quantization ([`super::blocks::quantize_row`], and per 256 for the
//! k-quants, [`super::act_k`]) on AVX2, bit for bit
//! the scalar reference's: the same largest magnitude, scale and product per value, and rounding
//! half away from zero as `f32::round` does (`x + copysign(0.5 - 2⁻²⁵, x)`, truncated: exact for
//! every `|x| ≤ 127`). Called only after `Isa::detect` found AVX2.

use std::arch::x86_64::*;

use super::act_k::{ActK, SUPER};
use super::blocks::{Act, BLOCK};

/// Quantizes `x` (a multiple of 32 long) to 8-bit blocks, appending them to `out`.
#[target_feature(enable = "avx2")]
pub(super) fn quantize_row(x: &[f32], out: &mut Vec<Act>) {
    for chunk in x.chunks_exact(BLOCK) {
        let v = load32(chunk);
        let d = max8(abs_max(&v)) / 127.0;
        let (qs, sums) = quantize32(&v, d);
        out.push(Act {
            d,
            s: d * (sums[0] + sums[1]) as f32,
            sums: sums.map(|s| s as i16),
            qs,
        });
    }
}

/// Quantizes `x` (a multiple of 256 long) to super-blocks of one scale, appending them to `out`
/// ([`super::act_k::quantize_row_k_scalar`] bit for bit).
#[target_feature(enable = "avx2")]
pub(super) fn quantize_row_k(x: &[f32], out: &mut Vec<ActK>) {
    for chunk in x.chunks_exact(SUPER) {
        let mut v = [[_mm256_setzero_ps(); 4]; 8];
        for (j, vj) in v.iter_mut().enumerate() {
            *vj = load32(&chunk[32 * j..32 * j + 32]);
        }
        let mut m = abs_max(&v[0]);
        for vj in &v[1..] {
            m = _mm256_max_ps(m, abs_max(vj));
        }
        let d = max8(m) / 127.0;
        let mut qs = [0i8; SUPER];
        for (j, vj) in v.iter().enumerate() {
            qs[32 * j..32 * j + 32].copy_from_slice(&quantize32(vj, d).0);
        }
        out.push(ActK::new(d, qs));
    }
}

/// 32 floats in 4 vectors.
#[target_feature(enable = "avx2")]
#[inline]
fn load32(chunk: &[f32]) -> [__m256; 4] {
    assert_eq!(chunk.len(), BLOCK);
    // SAFETY: 32 floats, 8 at a time; unaligned loads.
    std::array::from_fn(|k| unsafe { _mm256_loadu_ps(chunk.as_ptr().add(8 * k)) })
}

/// The lanes' largest magnitudes over the 4 vectors.
#[target_feature(enable = "avx2")]
#[inline]
fn abs_max(v: &[__m256; 4]) -> __m256 {
    let sign = _mm256_set1_ps(-0.0);
    let abs = |k: usize| _mm256_andnot_ps(sign, v[k]);
    _mm256_max_ps(_mm256_max_ps(abs(0), abs(1)), _mm256_max_ps(abs(2), abs(3)))
}

/// The 32 values of `v` at scale `d`, in order, and the sums of their halves.
#[target_feature(enable = "avx2")]
#[inline]
fn quantize32(v: &[__m256; 4], d: f32) -> ([i8; 32], [i32; 2]) {
    let sign = _mm256_set1_ps(-0.0);
    let half = _mm256_set1_ps(0.5 - f32::EPSILON / 4.0);
    let inv = _mm256_set1_ps(if d > 0.0 { 1.0 / d } else { 0.0 });
    let mut q = [_mm256_setzero_si256(); 4];
    for k in 0..4 {
        let x = _mm256_mul_ps(v[k], inv);
        let away = _mm256_or_ps(half, _mm256_and_ps(x, sign));
        q[k] = _mm256_cvttps_epi32(_mm256_add_ps(x, away));
    }
    let sums = [
        sum8(_mm256_add_epi32(q[0], q[1])),
        sum8(_mm256_add_epi32(q[2], q[3])),
    ];
    // Packing works within 128-bit lanes: the quads come out in the order 0 2 4 6 1 3 5 7.
    let packed = _mm256_packs_epi16(
        _mm256_packs_epi32(q[0], q[1]),
        _mm256_packs_epi32(q[2], q[3]),
    );
    let ordered = _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    let mut qs = [0i8; 32];
    // SAFETY: 32 bytes; unaligned store.
    unsafe { _mm256_storeu_si256(qs.as_mut_ptr().cast(), ordered) };
    (qs, sums)
}

/// The largest of 8 floats.
#[target_feature(enable = "avx2")]
#[inline]
fn max8(v: __m256) -> f32 {
    let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps(m, m, 1)))
}

/// The sum of 8 integers.
#[target_feature(enable = "avx2")]
#[inline]
fn sum8(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
    _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0b00_00_00_01)))
}
