//! AVX2 dot products of one weight row against `R` activation rows (1 to 4): each weight block
//! is unpacked once and multiplied into every row, 32 byte products in one `vpmaddubsw`.
//! [`super::kernels`] calls these only after `is_x86_feature_detected!` says the CPU has AVX2,
//! FMA and F16C; the scalar functions in [`super::blocks`] are the reference they are tested
//! against.

use std::arch::x86_64::*;

use super::blocks::{Act, Bytes, Nibbles};

/// Horizontal sum of 8 floats.
#[target_feature(enable = "avx2,fma")]
fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// Loads an activation block's 32 values.
#[target_feature(enable = "avx2")]
fn load_act(a: &Act) -> __m256i {
    // SAFETY: `qs` is 32 bytes; unaligned load.
    unsafe { _mm256_loadu_si256(a.qs.as_ptr().cast()) }
}

/// `Σ_blocks` of 4-bit weight row `w` against each of the rows `a` (all as long as `w`).
#[target_feature(enable = "avx2,fma,f16c")]
pub fn dot_nibbles<const R: usize>(w: &[Nibbles], a: [&[Act]; R]) -> [f32; R] {
    for row in a {
        assert_eq!(row.len(), w.len());
    }
    let low = _mm_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); R];
    let mut offset = [0f32; R];
    for (b, wb) in w.iter().enumerate() {
        // SAFETY: `qs` is 16 bytes; unaligned load.
        let packed = unsafe { _mm_loadu_si128(wb.qs.as_ptr().cast()) };
        let lo = _mm_and_si128(packed, low);
        let hi = _mm_and_si128(_mm_srli_epi16(packed, 4), low);
        // Weights 0..16 in the low lane, 16..32 in the high one: the activations' order.
        let q = _mm256_set_m128i(hi, lo);
        let (d, m) = (wb.d.to_f32(), wb.m.to_f32());
        for r in 0..R {
            let ab = &a[r][b];
            let products = _mm256_madd_epi16(_mm256_maddubs_epi16(q, load_act(ab)), ones);
            let scale = _mm256_set1_ps(d * ab.d);
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(products), scale, acc[r]);
            offset[r] += m * ab.s;
        }
    }
    let mut out = [0f32; R];
    for r in 0..R {
        out[r] = hsum(acc[r]) + offset[r];
    }
    out
}

/// `Σ_blocks` of 8-bit weight row `w` against each of the rows `a` (all as long as `w`).
#[target_feature(enable = "avx2,fma,f16c")]
pub fn dot_bytes<const R: usize>(w: &[Bytes], a: [&[Act]; R]) -> [f32; R] {
    for row in a {
        assert_eq!(row.len(), w.len());
    }
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); R];
    for (b, wb) in w.iter().enumerate() {
        // SAFETY: `qs` is 32 bytes; unaligned load.
        let q = unsafe { _mm256_loadu_si256(wb.qs.as_ptr().cast()) };
        // vpmaddubsw multiplies unsigned by signed bytes: move the weights' signs onto the
        // activations.
        let magnitude = _mm256_sign_epi8(q, q);
        let d = wb.d.to_f32();
        for r in 0..R {
            let ab = &a[r][b];
            let signed = _mm256_sign_epi8(load_act(ab), q);
            let products = _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, signed), ones);
            let scale = _mm256_set1_ps(d * ab.d);
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(products), scale, acc[r]);
        }
    }
    let mut out = [0f32; R];
    for r in 0..R {
        out[r] = hsum(acc[r]);
    }
    out
}
