//! AVX2 dot products of one group of 8 interleaved Q2_K or Q3_K rows ([`super::q23k`]) against
//! `R` activation rows, as [`super::avx2`]'s: per activation block the 8 quads of unsigned
//! values, each multiplied into each activation row by one `vpmaddubsw` (a pair at most
//! 2 · 7 · 127 = 1778), four summed in 16 bits per half-block, times the half-blocks' scales in
//! one `vpmaddwd`; the offsets from the activations' 16-sums, one more `vpmaddwd`. With `V`, four
//! `vpdpbusd` a half-block instead (its sum is at most 16 · 7 · 127 = 14224, so the scale's
//! `vpmaddwd` still takes it from the low 16 bits of each 32-bit lane).

use std::arch::x86_64::*;

use super::act_k::ActK;
use super::avx2::{blocks_at, each_row, f16x8, half_block_scales, quad_bytes, quad_sums, store8};
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

/// Per activation row: `Σ sc q a` of each weight row (32-bit lanes), for the values `q` of part
/// `k` and the half-blocks' scales `sc` (16-bit lane `2r + h`).
#[target_feature(enable = "avx2")]
#[inline]
fn part_sums<const R: usize, const V: u8>(
    q: &[__m256i; 8],
    sc: __m256i,
    acts: [&ActK; R],
    k: usize,
) -> [__m256i; R] {
    // Not `acts.map`: see [`blocks_at`].
    let mut out = [_mm256_setzero_si256(); R];
    if V != NO_VNNI {
        // Row r's scales in the low 16 bits of 32-bit lane r, the high 16 bits zero.
        let (lo, hi) = (
            _mm256_and_si256(sc, _mm256_set1_epi32(0xFFFF)),
            _mm256_srli_epi32(sc, 16),
        );
        each_row!(R, r => {
            let qs = acts[r].sub(k);
            out[r] = _mm256_add_epi32(
                _mm256_madd_epi16(quad_sums::<V>(q, qs, 0..4), lo),
                _mm256_madd_epi16(quad_sums::<V>(q, qs, 4..8), hi),
            );
        });
        return out;
    }
    let (lo, hi) = half_block_scales(sc);
    each_row!(R, r => {
        let qs = acts[r].sub(k);
        let quad = |c: usize| _mm256_maddubs_epi16(q[c], quad_bytes(qs, c));
        let four = |c: usize| {
            _mm256_add_epi16(
                _mm256_add_epi16(quad(c), quad(c + 1)),
                _mm256_add_epi16(quad(c + 2), quad(c + 3)),
            )
        };
        out[r] = _mm256_add_epi32(
            _mm256_madd_epi16(four(0), lo),
            _mm256_madd_epi16(four(4), hi),
        );
    });
    out
}

/// `Σ m a16` of part `k` for the offsets `m` (16-bit lane `2r + h`) against the activation
/// super-block's half sums.
#[target_feature(enable = "avx2")]
#[inline]
fn part_offsets(m: __m256i, a: &ActK, k: usize) -> __m256i {
    let (h0, h1) = (a.sums16[2 * k], a.sums16[2 * k + 1]);
    _mm256_madd_epi16(
        m,
        _mm256_set1_epi32((h0 as u16 as i32) | ((h1 as u16 as i32) << 16)),
    )
}

/// The 8 interleaved Q2_K rows of `w` (one group, all its super-blocks) against each of the rows
/// `a` (one activation super-block a super-block): the parts' sums added in 32 bits (at most
/// 256 · 3 · 127 · 15), then the offsets in a second pass over the scales (the 8-row tile's
/// registers hold one total a row), converted to float once a super-block.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn dot_q2k8<const R: usize, const V: u8>(w: &[Q2K8], a: [&[ActK]; R]) -> [[f32; 8]; R] {
    for row in a {
        assert_eq!(row.len(), w.len());
    }
    let low = _mm256_set1_epi16(15);
    // SAFETY: 16 bytes; unaligned load.
    let scales = |s: &[u8; 16]| _mm256_cvtepu8_epi16(unsafe { _mm_loadu_si128(s.as_ptr().cast()) });
    let mut acc = [_mm256_setzero_ps(); R];
    for (b, g) in w.iter().enumerate() {
        let acts = blocks_at(a, b);
        let mut totals = [_mm256_setzero_si256(); R];
        for (k, part) in g.k.iter().enumerate() {
            let sc = _mm256_and_si256(scales(&part.scales), low);
            let sums = part_sums::<R, V>(&unpack2(&part.q), sc, acts, k);
            each_row!(R, r => {
                totals[r] = _mm256_add_epi32(totals[r], sums[r]);
            });
        }
        let d = f16x8(&g.d);
        each_row!(R, r => {
            let ad = _mm256_set1_ps(acts[r].d);
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(totals[r]), _mm256_mul_ps(d, ad), acc[r]);
            totals[r] = _mm256_setzero_si256();
        });
        for (k, part) in g.k.iter().enumerate() {
            let m = _mm256_srli_epi16(scales(&part.scales), 4);
            each_row!(R, r => {
                totals[r] = _mm256_add_epi32(totals[r], part_offsets(m, acts[r], k));
            });
        }
        let dmin = f16x8(&g.dmin);
        each_row!(R, r => {
            let ad = _mm256_set1_ps(acts[r].d);
            acc[r] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(totals[r]), _mm256_mul_ps(dmin, ad), acc[r]);
        });
    }
    store8(acc)
}

/// The 8 interleaved Q3_K rows of `w` (one group, all its super-blocks) against each of the rows
/// `a` (one activation super-block a super-block): the offsets are `4 sc`; the parts' centred sums
/// added in 32 bits (at most 256 · 7 · 127 · 32), converted to float once a super-block.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn dot_q3k8<const R: usize, const V: u8>(w: &[Q3K8], a: [&[ActK]; R]) -> [[f32; 8]; R] {
    for row in a {
        assert_eq!(row.len(), w.len());
    }
    let mut acc = [_mm256_setzero_ps(); R];
    for (b, g) in w.iter().enumerate() {
        let acts = blocks_at(a, b);
        let mut totals = [_mm256_setzero_si256(); R];
        for (k, part) in g.k.iter().enumerate() {
            // SAFETY: 16 bytes; unaligned load.
            let sc = _mm256_cvtepi8_epi16(unsafe { _mm_loadu_si128(part.sc.as_ptr().cast()) });
            let m = _mm256_slli_epi16(sc, 2);
            let sums = part_sums::<R, V>(&unpack3(&part.q, &part.h), sc, acts, k);
            each_row!(R, r => {
                let centred = _mm256_sub_epi32(sums[r], part_offsets(m, acts[r], k));
                totals[r] = _mm256_add_epi32(totals[r], centred);
            });
        }
        let d = f16x8(&g.d);
        each_row!(R, r => {
            let scale = _mm256_mul_ps(d, _mm256_set1_ps(acts[r].d));
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(totals[r]), scale, acc[r]);
        });
    }
    store8(acc)
}
