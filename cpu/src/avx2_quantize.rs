//! The activations' 8-bit quantization ([`super::blocks::quantize_row`]) on AVX2, bit for bit
//! the scalar reference's: the same largest magnitude, scale and product per value, and rounding
//! half away from zero as `f32::round` does (`x + copysign(0.5 - 2⁻²⁵, x)`, truncated: exact for
//! every `|x| ≤ 127`). Called only after `Isa::detect` found AVX2.

use std::arch::x86_64::*;

use super::blocks::{Act, BLOCK};

/// Quantizes `x` (a multiple of 32 long) to 8-bit blocks, appending them to `out`.
#[target_feature(enable = "avx2")]
pub(super) fn quantize_row(x: &[f32], out: &mut Vec<Act>) {
    let sign = _mm256_set1_ps(-0.0);
    let half = _mm256_set1_ps(0.5 - f32::EPSILON / 4.0);
    for chunk in x.chunks_exact(BLOCK) {
        // SAFETY: 32 floats, 8 at a time; unaligned loads.
        let v: [__m256; 4] =
            std::array::from_fn(|k| unsafe { _mm256_loadu_ps(chunk.as_ptr().add(8 * k)) });
        let abs = v.map(|v| _mm256_andnot_ps(sign, v));
        let amax = max8(_mm256_max_ps(
            _mm256_max_ps(abs[0], abs[1]),
            _mm256_max_ps(abs[2], abs[3]),
        ));
        let d = amax / 127.0;
        let inv = _mm256_set1_ps(if d > 0.0 { 1.0 / d } else { 0.0 });
        let q = v.map(|v| {
            let x = _mm256_mul_ps(v, inv);
            let away = _mm256_or_ps(half, _mm256_and_ps(x, sign));
            _mm256_cvttps_epi32(_mm256_add_ps(x, away))
        });
        let sums = [
            sum8(_mm256_add_epi32(q[0], q[1])),
            sum8(_mm256_add_epi32(q[2], q[3])),
        ];
        // Packing works within 128-bit lanes: the quads come out in the order 0 2 4 6 1 3 5 7.
        let packed = _mm256_packs_epi16(
            _mm256_packs_epi32(q[0], q[1]),
            _mm256_packs_epi32(q[2], q[3]),
        );
        let ordered =
            _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        let mut qs = [0i8; 32];
        // SAFETY: 32 bytes; unaligned store.
        unsafe { _mm256_storeu_si256(qs.as_mut_ptr().cast(), ordered) };
        out.push(Act {
            d,
            s: d * (sums[0] + sums[1]) as f32,
            sums: sums.map(|s| s as i16),
            qs,
        });
    }
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
