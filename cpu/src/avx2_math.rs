//! AVX2 elementwise maths: `exp` over 8 floats (Cephes' polynomial after a reduction by ln 2,
//! within 2 ulp), and the gated activations of [`super::activations`] on it. Called only after
//! `Isa::detect` found AVX2 and FMA.

use std::arch::x86_64::*;

use super::activations::Glu;

/// `e^x` for 8 floats, `x` clamped to where the result is a normal float.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn exp8(x: __m256) -> __m256 {
    let x = _mm256_min_ps(
        _mm256_max_ps(x, _mm256_set1_ps(-87.3)),
        _mm256_set1_ps(88.3),
    );
    // x = n ln 2 + r, |r| <= ln 2 / 2, ln 2 in two parts so that n ln 2 is exact enough.
    let n = _mm256_round_ps(
        _mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)),
        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC,
    );
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_359_4), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.121_944_4e-4), r);
    let mut p = _mm256_set1_ps(1.987_569_1e-4);
    for c in [1.398_2e-3, 8.333_452e-3, 4.166_579_6e-2, 0.166_666_65, 0.5] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    }
    let y = _mm256_fmadd_ps(
        _mm256_mul_ps(p, r),
        r,
        _mm256_add_ps(r, _mm256_set1_ps(1.0)),
    );
    // 2^n: n + 127 in the exponent bits (n is in -126..=128 after the clamp).
    let bits = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)),
        23,
    );
    _mm256_mul_ps(y, _mm256_castsi256_ps(bits))
}

/// `act(gate[j]) * up[j]` into `out` (all as long as `out`).
#[target_feature(enable = "avx2,fma")]
pub fn glu(kind: Glu, gate: &[f32], up: &[f32], out: &mut [f32]) {
    let n = out.len();
    assert!(gate.len() >= n && up.len() >= n);
    let one = _mm256_set1_ps(1.0);
    let mut j = 0;
    while j + 8 <= n {
        // SAFETY: j + 8 <= n, inside all three slices; unaligned loads and store.
        let (g, u) = unsafe {
            (
                _mm256_loadu_ps(gate.as_ptr().add(j)),
                _mm256_loadu_ps(up.as_ptr().add(j)),
            )
        };
        let arg = match kind {
            Glu::Silu => g,
            Glu::GeluTanh => {
                let g3 = _mm256_mul_ps(_mm256_mul_ps(g, g), g);
                let inner = _mm256_fmadd_ps(g3, _mm256_set1_ps(0.044715), g);
                _mm256_mul_ps(inner, _mm256_set1_ps(2.0 * 0.797_884_6))
            }
        };
        let denominator = _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), arg)));
        let v = _mm256_mul_ps(_mm256_div_ps(g, denominator), u);
        // SAFETY: as above.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(j), v) };
        j += 8;
    }
    for k in j..n {
        let g = gate[k];
        let arg = match kind {
            Glu::Silu => g,
            Glu::GeluTanh => 2.0 * 0.797_884_6 * (g + 0.044715 * g * g * g),
        };
        out[k] = g / (1.0 + (-arg).exp()) * up[k];
    }
}

/// [`super::exp::exp_weights`]: 8 weights at a time, the total in four f64 lanes.
#[target_feature(enable = "avx2,fma")]
pub fn exp_weights(row: &mut [f32], max: f32, inv_t: f32, min_p: f32) -> f64 {
    let (vmax, vinv, vmin) = (
        _mm256_set1_ps(max),
        _mm256_set1_ps(inv_t),
        _mm256_set1_ps(min_p),
    );
    let mut total = _mm256_setzero_pd();
    let n = row.len() / 8 * 8;
    for j in (0..n).step_by(8) {
        // SAFETY: j + 8 <= row.len(); unaligned load and store.
        let x = unsafe { _mm256_loadu_ps(row.as_ptr().add(j)) };
        let arg = _mm256_mul_ps(_mm256_sub_ps(x, vmax), vinv);
        // Below exp8's clamp every weight is 0 (and NaN stays NaN for the mask).
        let w = exp8(arg);
        let underflow = _mm256_cmp_ps(arg, _mm256_set1_ps(-87.3), _CMP_LT_OQ);
        let w = _mm256_andnot_ps(underflow, w);
        // `w >= min_p` is false for NaN: ordered comparison.
        let keep = _mm256_cmp_ps(w, vmin, _CMP_GE_OQ);
        let keep = _mm256_andnot_ps(_mm256_cmp_ps(arg, arg, _CMP_UNORD_Q), keep);
        let w = _mm256_and_ps(w, keep);
        // SAFETY: as above.
        unsafe { _mm256_storeu_ps(row.as_mut_ptr().add(j), w) };
        total = _mm256_add_pd(total, _mm256_cvtps_pd(_mm256_castps256_ps128(w)));
        total = _mm256_add_pd(total, _mm256_cvtps_pd(_mm256_extractf128_ps(w, 1)));
    }
    let mut lanes = [0f64; 4];
    // SAFETY: 4 doubles; unaligned store.
    unsafe { _mm256_storeu_pd(lanes.as_mut_ptr(), total) };
    let tail = super::exp::exp_weights_scalar(&mut row[n..], max, inv_t, min_p);
    lanes.iter().sum::<f64>() + tail
}
