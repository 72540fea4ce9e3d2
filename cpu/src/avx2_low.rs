//! AVX2 dot products of one group of 8 interleaved Q2_K or Q3_K rows ([`super::q23k`]) against
//! `R` activation rows, as [`super::avx2`]'s: per activation block the 8 quads of unsigned
//! values, each multiplied into each activation row by one `vpmaddubsw` (a pair at most
//! 2 · 7 · 127 = 1778), four summed in 16 bits per half-block, times the half-blocks' scales in
//! one `vpmaddwd`; the offsets from the activations' 16-sums, one more `vpmaddwd`. With `V`, four
//! `vpdpbusd` a half-block instead (its sum is at most 16 · 7 · 127 = 14224, so the scale's
//! `vpmaddwd` still takes it from the low 16 bits of each 32-bit lane).

use std::arch::x86_64::*;

use super::avx2::{
    act_half_sums, act_quad, blocks_at, each_row, f16x8, half_block_scales, quad_sums, store8,
};
use super::blocks::Act;
use super::q23k::{Q2K8, Q3K8};
use super::vnni::NO_VNNI;

/// The 8 quads of two-bit values of one part (`q[k / 4]`, bits `2 (k % 4)..`), each a byte.
#[target_feature(enable = "avx2")]
#[inline]
fn unpack2(q: &[[u8; 32]; 2]) -> [__m256i; 8] {
    let three = _mm256_set1_epi8(3);
    // SAFETY: 32 bytes each; unaligned loads.
    let v = unsafe {
        [
            _mm256_loadu_si256(q[0].as_ptr().cast()),
            _mm256_loadu_si256(q[1].as_ptr().cast()),
        ]
    };
    [
        _mm256_and_si256(v[0], three),
        _mm256_and_si256(_mm256_srli_epi16(v[0], 2), three),
        _mm256_and_si256(_mm256_srli_epi16(v[0], 4), three),
        _mm256_and_si256(_mm256_srli_epi16(v[0], 6), three),
        _mm256_and_si256(v[1], three),
        _mm256_and_si256(_mm256_srli_epi16(v[1], 2), three),
        _mm256_and_si256(_mm256_srli_epi16(v[1], 4), three),
        _mm256_and_si256(_mm256_srli_epi16(v[1], 6), three),
    ]
}

/// [`unpack2`] with Q3_K's high bits (bit `k` of `h` for quad `k`) moved to bit 2 (within each
/// byte: the shifts are by at most 5).
#[target_feature(enable = "avx2")]
#[inline]
fn unpack3(q: &[[u8; 32]; 2], h: &[u8; 32]) -> [__m256i; 8] {
    let mut v = unpack2(q);
    // SAFETY: 32 bytes; unaligned load.
    let h = unsafe { _mm256_loadu_si256(h.as_ptr().cast()) };
    let four = _mm256_set1_epi8(4);
    let moved = [
        _mm256_slli_epi16(h, 2),
        _mm256_slli_epi16(h, 1),
        h,
        _mm256_srli_epi16(h, 1),
        _mm256_srli_epi16(h, 2),
        _mm256_srli_epi16(h, 3),
        _mm256_srli_epi16(h, 4),
        _mm256_srli_epi16(h, 5),
    ];
    for (vk, m) in v.iter_mut().zip(moved) {
        *vk = _mm256_or_si256(*vk, _mm256_and_si256(m, four));
    }
    v
}

/// Per activation row: `Σ sc q a` of each weight row (32-bit lanes), for the values `q` of one
/// part and the half-blocks' scales `sc` (16-bit lane `2r + h`), and `Σ m a16` for the offsets
/// `m` (likewise) against the row's half sums.
#[target_feature(enable = "avx2")]
#[inline]
fn part_sums<const R: usize, const V: u8>(
    q: &[__m256i; 8],
    sc: __m256i,
    m: __m256i,
    acts: [&Act; R],
) -> [(__m256i, __m256i); R] {
    // Not `acts.map`: see [`blocks_at`].
    let mut out = [(_mm256_setzero_si256(), _mm256_setzero_si256()); R];
    if V != NO_VNNI {
        // Row r's scales in the low 16 bits of 32-bit lane r, the high 16 bits zero.
        let (lo, hi) = (
            _mm256_and_si256(sc, _mm256_set1_epi32(0xFFFF)),
            _mm256_srli_epi32(sc, 16),
        );
        each_row!(R, r => {
            let a = acts[r];
            let sum = _mm256_add_epi32(
                _mm256_madd_epi16(quad_sums::<V>(q, &a.qs, 0..4), lo),
                _mm256_madd_epi16(quad_sums::<V>(q, &a.qs, 4..8), hi),
            );
            out[r] = (sum, _mm256_madd_epi16(m, act_half_sums(a)));
        });
        return out;
    }
    let (lo, hi) = half_block_scales(sc);
    each_row!(R, r => {
        let a = acts[r];
        let quad = |k: usize| act_quad(q[k], a, k);
        let four = |k: usize| {
            _mm256_add_epi16(
                _mm256_add_epi16(quad(k), quad(k + 1)),
                _mm256_add_epi16(quad(k + 2), quad(k + 3)),
            )
        };
        let sum = _mm256_add_epi32(
            _mm256_madd_epi16(four(0), lo),
            _mm256_madd_epi16(four(4), hi),
        );
        out[r] = (sum, _mm256_madd_epi16(m, act_half_sums(a)));
    });
    out
}

/// The 8 interleaved Q2_K rows of `w` (one group, all its super-blocks) against each of the rows
/// `a` (8 activation blocks a super-block).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn dot_q2k8<const R: usize, const V: u8>(w: &[Q2K8], a: [&[Act]; R]) -> [[f32; 8]; R] {
    for row in a {
        assert_eq!(row.len(), 8 * w.len());
    }
    let low = _mm256_set1_epi16(15);
    let mut acc = [_mm256_setzero_ps(); R];
    for (b, g) in w.iter().enumerate() {
        let (d, dmin) = (f16x8(&g.d), f16x8(&g.dmin));
        for (k, part) in g.k.iter().enumerate() {
            // SAFETY: 16 bytes; unaligned load.
            let packed =
                _mm256_cvtepu8_epi16(unsafe { _mm_loadu_si128(part.scales.as_ptr().cast()) });
            let (sc, m) = (_mm256_and_si256(packed, low), _mm256_srli_epi16(packed, 4));
            let sums = part_sums::<R, V>(&unpack2(&part.q), sc, m, blocks_at(a, 8 * b + k));
            each_row!(R, r => {
                let ad = _mm256_set1_ps(a[r][8 * b + k].d);
                let (sum, offset) = sums[r];
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(d, ad), acc[r]);
                acc[r] =
                    _mm256_fnmadd_ps(_mm256_cvtepi32_ps(offset), _mm256_mul_ps(dmin, ad), acc[r]);
            });
        }
    }
    store8(acc)
}

/// The 8 interleaved Q3_K rows of `w` (one group, all its super-blocks) against each of the rows
/// `a` (8 activation blocks a super-block): the offsets are `4 sc`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn dot_q3k8<const R: usize, const V: u8>(w: &[Q3K8], a: [&[Act]; R]) -> [[f32; 8]; R] {
    for row in a {
        assert_eq!(row.len(), 8 * w.len());
    }
    let mut acc = [_mm256_setzero_ps(); R];
    for (b, g) in w.iter().enumerate() {
        let d = f16x8(&g.d);
        for (k, part) in g.k.iter().enumerate() {
            // SAFETY: 16 bytes; unaligned load.
            let sc = _mm256_cvtepi8_epi16(unsafe { _mm_loadu_si128(part.sc.as_ptr().cast()) });
            let m = _mm256_slli_epi16(sc, 2);
            let sums =
                part_sums::<R, V>(&unpack3(&part.q, &part.h), sc, m, blocks_at(a, 8 * b + k));
            each_row!(R, r => {
                let (sum, offset) = sums[r];
                let scale = _mm256_mul_ps(d, _mm256_set1_ps(a[r][8 * b + k].d));
                acc[r] = _mm256_fmadd_ps(
                    _mm256_cvtepi32_ps(_mm256_sub_epi32(sum, offset)),
                    scale,
                    acc[r],
                );
            });
        }
    }
    store8(acc)
}
