//! The two products of attention over a run of cached rows, vectorized: the scores `q · k` of
//! every query head against every row, and the weighted sums `Σ w · v` of the rows. The rows
//! are cache slots anywhere in one layer's K or V (a paged cache puts a block's slots at a fixed
//! stride and the blocks anywhere), named by their offsets; a slot holds every KV head's values,
//! and query head `h` reads KV head `h / group` (grouped-query attention).
//!
//! Written as plain loops (one dependent add chain per score, a load and store of the output per
//! row and head, a KV head's slice of each slot read apart from the others), a SmolLM2 decode
//! step's attention read its cache at 3 GB/s on one core, a sixth of the step at 200 positions.

use super::kernels::Isa;

/// Query heads over a cache slot: `d` values a head, and query head `h` reads the slot's KV
/// head `h / group`, the `d` values from `h / group * d`.
#[derive(Clone, Copy, Debug)]
pub struct Heads {
    /// Values a head.
    pub d: usize,
    /// Query heads a KV head.
    pub group: usize,
}

impl Heads {
    /// Where query head `h`'s values start in a slot.
    fn offset(self, h: usize) -> usize {
        h / self.group * self.d
    }
}

/// `out[h * n + i] = scale · (q_h · k[rows[i] + offset(h)..][..d])` for each query head `h` of `q`
/// (`q.len() / d` of them) and each of the `n = rows.len()` rows.
///
/// # Panics
/// If a head's values reach past `k` in a row, or `out` is shorter than `q.len() / d * n`.
pub fn scores(
    isa: Isa,
    heads: Heads,
    q: &[f32],
    k: &[f32],
    rows: &[usize],
    scale: f32,
    out: &mut [f32],
) {
    check(heads, q.len(), k.len(), rows, out.len());
    match isa {
        // SAFETY: `Isa::Avx2` exists only when the CPU has AVX2 and FMA; `check` bounds every
        // row and the output.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 { .. } if heads.d.is_multiple_of(8) => unsafe {
            avx2::scores(heads, q, k, rows, scale, out)
        },
        _ => scores_scalar(heads, q, k, rows, scale, out),
    }
}

/// `out[h * d + c] = Σ_i w[h * n + i] · v[rows[i] + offset(h) + c]` for each head `h` of the
/// `out.len() / d` and each of the `n = rows.len()` rows (the output is overwritten).
///
/// # Panics
/// If a head's values reach past `v` in a row, or `w` is shorter than `out.len() / d * n`.
pub fn weighted_sum(isa: Isa, heads: Heads, w: &[f32], v: &[f32], rows: &[usize], out: &mut [f32]) {
    check(heads, out.len(), v.len(), rows, w.len());
    match isa {
        // SAFETY: as in `scores`.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 { .. } if heads.d.is_multiple_of(8) => unsafe {
            avx2::weighted_sum(heads, w, v, rows, out)
        },
        _ => weighted_sum_scalar(heads, w, v, rows, out),
    }
}

/// Heads of `d` in `heads_len` (a whole number), every head's values inside the cache in every
/// row, and a head's `rows.len()` values in the other buffer of `other`.
fn check(heads: Heads, heads_len: usize, cache_len: usize, rows: &[usize], other: usize) {
    let Heads { d, group } = heads;
    assert!(
        d > 0 && group > 0 && heads_len.is_multiple_of(d),
        "{heads_len} values are not heads of {d}"
    );
    let count = heads_len / d;
    assert!(
        other >= count * rows.len(),
        "a buffer of {other} for {count} heads"
    );
    let span = count.div_ceil(group) * d;
    assert!(
        rows.iter()
            .all(|&r| r.checked_add(span).is_some_and(|e| e <= cache_len)),
        "a row outside the cache of {cache_len}"
    );
}

/// The scalar reference of [`scores`].
pub fn scores_scalar(
    heads: Heads,
    q: &[f32],
    k: &[f32],
    rows: &[usize],
    scale: f32,
    out: &mut [f32],
) {
    let (d, n) = (heads.d, rows.len());
    for (h, qh) in q.chunks_exact(d).enumerate() {
        for (i, &r) in rows.iter().enumerate() {
            let at = r + heads.offset(h);
            let dot: f32 = qh.iter().zip(&k[at..at + d]).map(|(a, b)| a * b).sum();
            out[h * n + i] = dot * scale;
        }
    }
}

/// The scalar reference of [`weighted_sum`].
pub fn weighted_sum_scalar(heads: Heads, w: &[f32], v: &[f32], rows: &[usize], out: &mut [f32]) {
    let (d, n) = (heads.d, rows.len());
    for (h, oh) in out.chunks_exact_mut(d).enumerate() {
        oh.fill(0.0);
        for (i, &r) in rows.iter().enumerate() {
            let (wi, at) = (w[h * n + i], r + heads.offset(h));
            for (o, x) in oh.iter_mut().zip(&v[at..at + d]) {
                *o += wi * x;
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::Heads;

    /// Lanes of one register.
    const L: usize = 8;
    /// Registers of output a pass of `weighted_sum` keeps (64 values).
    const ACC: usize = 8;

    /// The sum of a register's lanes.
    #[target_feature(enable = "avx2,fma")]
    fn sum8(x: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
    }

    /// [`super::scores`]: four rows at a time for every head (the four slots, a few KB, stay in
    /// L1 for all the heads), each query register loaded once for the four rows, and the four
    /// sums reduced together.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA; `d` is a multiple of 8; every head's values are inside `k` in
    /// every row, and `out` holds `q.len() / d * rows.len()` values.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn scores(
        heads: Heads,
        q: &[f32],
        k: &[f32],
        rows: &[usize],
        scale: f32,
        out: &mut [f32],
    ) {
        let (d, n, count) = (heads.d, rows.len(), q.len() / heads.d);
        let (kp, qp, op) = (k.as_ptr(), q.as_ptr(), out.as_mut_ptr());
        let scale4 = _mm_set1_ps(scale);
        let mut i = 0;
        while i + 4 <= n {
            for h in 0..count {
                let off = heads.offset(h);
                // SAFETY: (all below) c + 8 <= d: inside query head h, and (by the caller)
                // inside each row's values for h; the four scores at h * n + i.. are in `out`.
                unsafe {
                    let qh = qp.add(h * d);
                    let (k0, k1, k2, k3) = (
                        kp.add(rows[i] + off),
                        kp.add(rows[i + 1] + off),
                        kp.add(rows[i + 2] + off),
                        kp.add(rows[i + 3] + off),
                    );
                    let (mut a0, mut a1, mut a2, mut a3) = (
                        _mm256_setzero_ps(),
                        _mm256_setzero_ps(),
                        _mm256_setzero_ps(),
                        _mm256_setzero_ps(),
                    );
                    for c in (0..d).step_by(L) {
                        let qv = _mm256_loadu_ps(qh.add(c));
                        a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0.add(c)), a0);
                        a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k1.add(c)), a1);
                        a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k2.add(c)), a2);
                        a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k3.add(c)), a3);
                    }
                    // Lane sums of the four: [a0 a1 a2 a3] in each half, then the halves added.
                    let s = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
                    let s = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
                    _mm_storeu_ps(op.add(h * n + i), _mm_mul_ps(s, scale4));
                }
            }
            i += 4;
        }
        for (i, &r) in rows.iter().enumerate().skip(i) {
            for h in 0..count {
                let mut acc = _mm256_setzero_ps();
                // SAFETY: as above.
                unsafe {
                    let (qh, kr) = (qp.add(h * d), kp.add(r + heads.offset(h)));
                    for c in (0..d).step_by(L) {
                        acc = _mm256_fmadd_ps(
                            _mm256_loadu_ps(qh.add(c)),
                            _mm256_loadu_ps(kr.add(c)),
                            acc,
                        );
                    }
                    *op.add(h * n + i) = sum8(acc) * scale;
                }
            }
        }
    }

    /// [`super::weighted_sum`]: 64 output values of one head at a time held in registers over
    /// all the rows (a KV head's values of the rows, a few KB, stay in L1 for its group's other
    /// query heads).
    ///
    /// # Safety
    /// As [`scores`], with `w` for `q` and `out` for the heads.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn weighted_sum(
        heads: Heads,
        w: &[f32],
        v: &[f32],
        rows: &[usize],
        out: &mut [f32],
    ) {
        let (d, n) = (heads.d, rows.len());
        let vp = v.as_ptr();
        for (h, oh) in out.chunks_exact_mut(d).enumerate() {
            let wh = &w[h * n..(h + 1) * n];
            let (op, vh) = (oh.as_mut_ptr(), vp.wrapping_add(heads.offset(h)));
            let mut c = 0;
            while c + ACC * L <= d {
                let mut acc = [_mm256_setzero_ps(); ACC];
                for (&wi, &r) in wh.iter().zip(rows) {
                    let wv = _mm256_set1_ps(wi);
                    for (j, a) in acc.iter_mut().enumerate() {
                        // SAFETY: c + 64 <= d, inside head h's values of each row (by the caller).
                        *a = _mm256_fmadd_ps(
                            wv,
                            unsafe { _mm256_loadu_ps(vh.add(r + c + j * L)) },
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
            while c < d {
                let mut acc = _mm256_setzero_ps();
                for (&wi, &r) in wh.iter().zip(rows) {
                    // SAFETY: c + 8 <= d, as above.
                    acc = _mm256_fmadd_ps(
                        _mm256_set1_ps(wi),
                        unsafe { _mm256_loadu_ps(vh.add(r + c)) },
                        acc,
                    );
                }
                // SAFETY: as above.
                unsafe { _mm256_storeu_ps(op.add(c), acc) };
                c += L;
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
    /// out of order in slots of 2 KV heads (and 1), 1 to 3 query heads a KV head: each ISA
    /// within a few ulp of the f64 sum.
    #[test]
    fn both_products_match_the_f64_sums() {
        for d in [8, 13, 64, 80, 96, 128, 256] {
            for n in [1, 3, 4, 5, 9, 16, 37] {
                for (count, group) in [(6, 3), (2, 1), (3, 3)] {
                    let heads = Heads { d, group };
                    let stride = count / group * d + 5;
                    let cache = values(stride * 50, (d * 1000 + n * 10 + count) as u64);
                    let rows: Vec<usize> = (0..n).map(|i| ((i * 17) % 50) * stride + 3).collect();
                    let q = values(count * d, 7 + d as u64);
                    let w = values(count * n, 11 + n as u64);
                    let at =
                        |h: usize, i: usize, c: usize| cache[rows[i] + h / group * d + c] as f64;
                    let want_s: Vec<f64> = (0..count * n)
                        .map(|x| {
                            let (h, i) = (x / n, x % n);
                            (0..d)
                                .map(|c| q[h * d + c] as f64 * at(h, i, c))
                                .sum::<f64>()
                                * 0.5
                        })
                        .collect();
                    let want_o: Vec<f64> = (0..count * d)
                        .map(|x| {
                            let (h, c) = (x / d, x % d);
                            (0..n).map(|i| w[h * n + i] as f64 * at(h, i, c)).sum()
                        })
                        .collect();
                    for isa in Isa::available() {
                        let mut s = vec![f32::NAN; count * n];
                        scores(isa, heads, &q, &cache, &rows, 0.5, &mut s);
                        let mut o = vec![f32::NAN; count * d];
                        weighted_sum(isa, heads, &w, &cache, &rows, &mut o);
                        let bound = 1e-5 * (d.max(n) as f64).sqrt();
                        let case = format!("{isa:?} d {d} n {n} heads {count}/{group}");
                        for (x, (got, want)) in s.iter().zip(&want_s).enumerate() {
                            assert!(
                                (*got as f64 - want).abs() < bound,
                                "{case} score {x}: {got} vs {want}"
                            );
                        }
                        for (x, (got, want)) in o.iter().zip(&want_o).enumerate() {
                            assert!(
                                (*got as f64 - want).abs() < bound,
                                "{case} out {x}: {got} vs {want}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// The last KV head's values of a row must be inside the cache.
    #[test]
    #[should_panic(expected = "outside the cache")]
    fn a_row_past_the_cache_is_refused() {
        let k = vec![0.0; 200];
        let mut out = vec![0.0; 4];
        let heads = Heads { d: 64, group: 1 };
        scores(
            Isa::detect(),
            heads,
            &[1.0; 128],
            &k,
            &[0, 100],
            1.0,
            &mut out,
        );
    }
}
