//! The two products of a query group's attention over a run of cached rows, vectorized: the
//! scores `q · k` of every query head of the group against every row, and the weighted sum
//! `Σ w · v` of the rows. The rows are cache slots anywhere in one layer's K or V (a paged cache
//! puts a block's rows at a fixed stride and the blocks anywhere), named by their offsets.
//!
//! A decode step's attention reads every cached row once per KV head; written as plain loops,
//! one dependent add chain per score and a load and store of the output per row and head, it
//! took a sixth of a SmolLM2 decode step at 200 positions.

use super::kernels::Isa;

/// `out[g * n + i] = scale · (q_g · k[rows[i]..][..d])` for each query head `g` of `q` (rows of
/// `d`) and each of the `n = rows.len()` rows. In a model's step the rows come from memory, not
/// cache: the vectorized kernel asks for each K row a few rows before it reads it, and for the
/// same row of `v` (which the weighted sum reads next) as it reads the K row.
///
/// # Panics
/// If a row reaches past `k` or `v`, or `out` is shorter than `q.len() / d * n`.
#[allow(clippy::too_many_arguments)]
pub fn scores(
    isa: Isa,
    q: &[f32],
    d: usize,
    k: &[f32],
    v: &[f32],
    rows: &[usize],
    scale: f32,
    out: &mut [f32],
) {
    check(
        q.len(),
        d,
        k.len().min(v.len()),
        rows,
        out.len(),
        rows.len(),
    );
    match isa {
        // SAFETY: `Isa::Avx2` exists only when the CPU has AVX2 and FMA; `check` bounds every
        // row and the output.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 { .. } => unsafe { avx2::scores(q, d, k, v, rows, scale, out) },
        Isa::Scalar => scores_scalar(q, d, k, rows, scale, out),
    }
}

/// `out[g * d + c] = Σ_i w[g * n + i] · v[rows[i] + c]` for each head `g` of the `out.len() / d`
/// and each of the `n = rows.len()` rows (the output is overwritten).
///
/// # Panics
/// If a row reaches past `v`, or `w` is shorter than `out.len() / d * n`.
pub fn weighted_sum(isa: Isa, w: &[f32], d: usize, v: &[f32], rows: &[usize], out: &mut [f32]) {
    check(out.len(), d, v.len(), rows, w.len(), rows.len());
    match isa {
        // SAFETY: as in `scores`.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 { .. } => unsafe { avx2::weighted_sum(w, d, v, rows, out) },
        Isa::Scalar => weighted_sum_scalar(w, d, v, rows, out),
    }
}

/// Heads of `heads_len / d` (a whole number), every row inside the cache, and `per_head` values
/// a head in the other buffer.
fn check(
    heads_len: usize,
    d: usize,
    cache_len: usize,
    rows: &[usize],
    other: usize,
    per_head: usize,
) {
    assert!(
        d > 0 && heads_len.is_multiple_of(d),
        "{heads_len} values are not heads of {d}"
    );
    assert!(
        other >= heads_len / d * per_head,
        "a buffer of {other} for {} heads",
        heads_len / d
    );
    assert!(
        rows.iter()
            .all(|&r| r.checked_add(d).is_some_and(|e| e <= cache_len)),
        "a row outside the cache of {cache_len}"
    );
}

/// The scalar reference of [`scores`].
pub fn scores_scalar(q: &[f32], d: usize, k: &[f32], rows: &[usize], scale: f32, out: &mut [f32]) {
    let n = rows.len();
    for (g, qg) in q.chunks_exact(d).enumerate() {
        for (i, &r) in rows.iter().enumerate() {
            let dot: f32 = qg.iter().zip(&k[r..r + d]).map(|(a, b)| a * b).sum();
            out[g * n + i] = dot * scale;
        }
    }
}

/// The scalar reference of [`weighted_sum`].
pub fn weighted_sum_scalar(w: &[f32], d: usize, v: &[f32], rows: &[usize], out: &mut [f32]) {
    let n = rows.len();
    for (g, og) in out.chunks_exact_mut(d).enumerate() {
        og.fill(0.0);
        for (i, &r) in rows.iter().enumerate() {
            let wi = w[g * n + i];
            for (o, x) in og.iter_mut().zip(&v[r..r + d]) {
                *o += wi * x;
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    /// Lanes of one register.
    const L: usize = 8;
    /// Rows ahead that `scores` asks for a K row before it reads it.
    const AHEAD: usize = 8;

    /// Asks for the cache lines of `d` floats at `p`.
    #[inline(always)]
    fn prefetch(p: *const f32, d: usize) {
        for at in (0..d).step_by(16) {
            // SAFETY: a prefetch only hints (an address outside the row would be harmless).
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(at).cast()) };
        }
    }
    /// Registers of output a pass of `weighted_sum` keeps (64 values).
    const ACC: usize = 8;

    /// The sum of a register's lanes.
    #[target_feature(enable = "avx2,fma")]
    fn sum8(x: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
    }

    /// [`super::scores`]: four rows at a time, each query register loaded once for the four,
    /// and the four sums reduced together.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA; every row's `d` values are inside `k` and `v`, and `out` holds
    /// `q.len() / d * rows.len()` values.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn scores(
        q: &[f32],
        d: usize,
        k: &[f32],
        v: &[f32],
        rows: &[usize],
        scale: f32,
        out: &mut [f32],
    ) {
        let (n, full) = (rows.len(), d / L * L);
        let (kp, vp) = (k.as_ptr(), v.as_ptr());
        for &r in rows.iter().take(AHEAD) {
            prefetch(kp.wrapping_add(r), d);
        }
        for (g, qg) in q.chunks_exact(d).enumerate() {
            let qp = qg.as_ptr();
            let tail = |r: usize| -> f32 { (full..d).map(|c| qg[c] * k[r + c]).sum() };
            let mut i = 0;
            while i + 4 <= n {
                let r = [rows[i], rows[i + 1], rows[i + 2], rows[i + 3]];
                if g == 0 {
                    for j in i..i + 4 {
                        if let Some(&ahead) = rows.get(j + AHEAD) {
                            prefetch(kp.wrapping_add(ahead), d);
                        }
                        prefetch(vp.wrapping_add(rows[j]), d);
                    }
                }
                let mut acc = [_mm256_setzero_ps(); 4];
                for c in (0..full).step_by(L) {
                    // SAFETY: c + 8 <= d, inside the query head and (by the caller) each row.
                    unsafe {
                        let qv = _mm256_loadu_ps(qp.add(c));
                        for j in 0..4 {
                            acc[j] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kp.add(r[j] + c)), acc[j]);
                        }
                    }
                }
                // Lane sums of the four: [a0 a1 a2 a3] in each half, then the halves added.
                let h = _mm256_hadd_ps(
                    _mm256_hadd_ps(acc[0], acc[1]),
                    _mm256_hadd_ps(acc[2], acc[3]),
                );
                let s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
                let mut four = [0f32; 4];
                // SAFETY: four floats into an array of four.
                unsafe { _mm_storeu_ps(four.as_mut_ptr(), s) };
                for j in 0..4 {
                    out[g * n + i + j] = (four[j] + tail(r[j])) * scale;
                }
                i += 4;
            }
            for (i, &r) in rows.iter().enumerate().skip(i) {
                if g == 0 {
                    prefetch(vp.wrapping_add(r), d);
                }
                let mut acc = _mm256_setzero_ps();
                for c in (0..full).step_by(L) {
                    // SAFETY: as above.
                    unsafe {
                        acc = _mm256_fmadd_ps(
                            _mm256_loadu_ps(qp.add(c)),
                            _mm256_loadu_ps(kp.add(r + c)),
                            acc,
                        );
                    }
                }
                out[g * n + i] = (sum8(acc) + tail(r)) * scale;
            }
        }
    }

    /// [`super::weighted_sum`]: 64 output values of one head at a time held in registers over
    /// all the rows (the rows, a few KB, stay in L1 for the group's other heads).
    ///
    /// # Safety
    /// As [`scores`], with `w` for `q` and `out` for the heads.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn weighted_sum(w: &[f32], d: usize, v: &[f32], rows: &[usize], out: &mut [f32]) {
        let (n, full) = (rows.len(), d / L * L);
        let vp = v.as_ptr();
        for (g, og) in out.chunks_exact_mut(d).enumerate() {
            let wg = &w[g * n..(g + 1) * n];
            let op = og.as_mut_ptr();
            let mut c = 0;
            while c + ACC * L <= full {
                let mut acc = [_mm256_setzero_ps(); ACC];
                for (&wi, &r) in wg.iter().zip(rows) {
                    let wv = _mm256_set1_ps(wi);
                    for (j, a) in acc.iter_mut().enumerate() {
                        // SAFETY: c + 64 <= d, inside each row (by the caller).
                        *a = _mm256_fmadd_ps(
                            wv,
                            unsafe { _mm256_loadu_ps(vp.add(r + c + j * L)) },
                            *a,
                        );
                    }
                }
                for (j, a) in acc.iter().enumerate() {
                    // SAFETY: c + 64 <= d, inside the head's output.
                    unsafe { _mm256_storeu_ps(op.add(c + j * L), *a) };
                }
                c += ACC * L;
            }
            while c < full {
                let mut acc = _mm256_setzero_ps();
                for (&wi, &r) in wg.iter().zip(rows) {
                    // SAFETY: c + 8 <= d, as above.
                    acc = _mm256_fmadd_ps(
                        _mm256_set1_ps(wi),
                        unsafe { _mm256_loadu_ps(vp.add(r + c)) },
                        acc,
                    );
                }
                // SAFETY: as above.
                unsafe { _mm256_storeu_ps(op.add(c), acc) };
                c += L;
            }
            for c in full..d {
                og[c] = wg.iter().zip(rows).map(|(&wi, &r)| wi * v[r + c]).sum();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator of values in [-1, 1).
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
            })
            .collect()
    }

    /// Every head width the models use (and odd ones), row counts around the 4-row step, rows
    /// out of order: each ISA within a few ulp of the f64 sum.
    #[test]
    fn both_products_match_the_f64_sums() {
        for d in [8, 13, 64, 80, 96, 128, 256] {
            for n in [1, 3, 4, 5, 9, 16, 37] {
                let group = 3;
                let stride = 2 * d + 5;
                let cache = values(stride * 50, d as u64 * 1000 + n as u64);
                let rows: Vec<usize> = (0..n).map(|i| ((i * 17) % 50) * stride + 3).collect();
                let q = values(group * d, 7 + d as u64);
                let w = values(group * n, 11 + n as u64);
                let want_s: Vec<f64> = (0..group * n)
                    .map(|x| {
                        let (g, i) = (x / n, x % n);
                        (0..d)
                            .map(|c| q[g * d + c] as f64 * cache[rows[i] + c] as f64)
                            .sum::<f64>()
                            * 0.5
                    })
                    .collect();
                let want_o: Vec<f64> = (0..group * d)
                    .map(|x| {
                        let (g, c) = (x / d, x % d);
                        (0..n)
                            .map(|i| w[g * n + i] as f64 * cache[rows[i] + c] as f64)
                            .sum()
                    })
                    .collect();
                for isa in Isa::available() {
                    let mut s = vec![f32::NAN; group * n];
                    scores(isa, &q, d, &cache, &cache, &rows, 0.5, &mut s);
                    let mut o = vec![f32::NAN; group * d];
                    weighted_sum(isa, &w, d, &cache, &rows, &mut o);
                    let bound = 1e-5 * (d.max(n) as f64).sqrt();
                    for (x, (got, want)) in s.iter().zip(&want_s).enumerate() {
                        assert!(
                            (*got as f64 - want).abs() < bound,
                            "{isa:?} d {d} n {n} score {x}: {got} vs {want}"
                        );
                    }
                    for (x, (got, want)) in o.iter().zip(&want_o).enumerate() {
                        assert!(
                            (*got as f64 - want).abs() < bound,
                            "{isa:?} d {d} n {n} out {x}: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    #[should_panic(expected = "outside the cache")]
    fn a_row_past_the_cache_is_refused() {
        let k = vec![0.0; 100];
        let mut out = vec![0.0; 2];
        scores(
            Isa::detect(),
            &[1.0; 64],
            64,
            &k,
            &k,
            &[0, 37],
            1.0,
            &mut out,
        );
    }
}
