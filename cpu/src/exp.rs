//! A sampled row's unnormalized probabilities, `exp((x − max) / t)` over the vocabulary in place
//! with their total: vectorized, since at 150k–262k tokens a row libm's `expf` one value at a time
//! and a serial f64 sum took 1.5 ms a sequence, a sixth of a 32-sequence CPU decode step.

use super::kernels::Isa;

/// Replaces every `x` of `row` by its weight `w = exp((x − max) · inv_t)`, or 0 where `w <
/// min_p` or is NaN, and returns the weights' total (f32 weights summed in f64).
pub fn exp_weights(row: &mut [f32], max: f32, inv_t: f32, min_p: f32) -> f64 {
    match Isa::detect() {
        // SAFETY: `Isa::Avx2` exists only when the CPU has AVX2, FMA and F16C.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 { .. } => unsafe { super::avx2_math::exp_weights(row, max, inv_t, min_p) },
        Isa::Scalar => exp_weights_scalar(row, max, inv_t, min_p),
    }
}

/// The scalar reference of [`exp_weights`].
pub fn exp_weights_scalar(row: &mut [f32], max: f32, inv_t: f32, min_p: f32) -> f64 {
    let mut total = 0f64;
    for x in row.iter_mut() {
        let w = ((*x - max) * inv_t).exp();
        // `w < min_p` also drops NaN weights (min_p of 0 then keeps everything else).
        *x = if w >= min_p && !w.is_nan() { w } else { 0.0 };
        total += f64::from(*x);
    }
    total
}

/// The largest value of `row` (NaNs ignored; −∞ for an empty or all-NaN row).
pub fn max(row: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 8];
    let mut chunks = row.chunks_exact(8);
    for c in &mut chunks {
        for (m, &x) in lanes.iter_mut().zip(c) {
            // (A NaN compares false and is skipped.)
            *m = if x > *m { x } else { *m };
        }
    }
    let tail = chunks.remainder().iter().copied();
    lanes
        .into_iter()
        .chain(tail)
        .fold(f32::NEG_INFINITY, |m, x| if x > m { x } else { m })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_match_the_scalar_reference() {
        let mut row: Vec<f32> = (0..1003)
            .map(|i| ((i * 7919) % 2000) as f32 / 40.0 - 25.0)
            .collect();
        row[5] = f32::NAN;
        row[17] = f32::NEG_INFINITY;
        let m = max(&row);
        assert_eq!(
            m,
            row.iter()
                .copied()
                .filter(|x| !x.is_nan())
                .fold(f32::MIN, f32::max)
        );
        for (inv_t, min_p) in [(1.0, 0.0), (1.7, 0.0), (0.5, 0.01)] {
            let (mut a, mut b) = (row.clone(), row.clone());
            let ta = exp_weights(&mut a, m, inv_t, min_p);
            let tb = exp_weights_scalar(&mut b, m, inv_t, min_p);
            assert!(
                (ta - tb).abs() <= 1e-6 * tb,
                "{inv_t} {min_p}: {ta} vs {tb}"
            );
            for (i, (x, y)) in a.iter().zip(&b).enumerate() {
                assert!((x - y).abs() <= 2e-7 * y.max(1e-30), "{i}: {x} vs {y}");
            }
            assert_eq!((a[5], a[17]), (0.0, 0.0), "NaN and -inf weigh nothing");
        }
    }
}
