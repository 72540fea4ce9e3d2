//! Q4_K and Q5_K (the k-quants with offsets), and IQ4_XS, against super-block activations
//! ([`ActK`]) on AVX2: per sub-block and activation row, the 8 rows' integer sums (`vpdpbusd`, or
//! `vpmaddubsw` without VNNI) times their 6-bit scales (`vpmulld`) added in 32 bits; per
//! super-block, the offsets `Σ_j m_j Σ a` in four `vpmaddwd`, and one conversion to float for
//! each. With activations scaled per 32, every sub-block took a conversion and two float
//! multiply-adds a row. 64-row GMAC/s at 8192 x 2048 on Zen 4 (the `bandwidth` test), before ->
//! after: Q4_K 201-206 -> 250-259, Q5_K 194-195 -> 231-241 (its 8-row tile with two `vpdpbusd`
//! accumulators a row: the tile's rows keep the unit busy); without VNNI 122 -> 191 and
//! 138 -> 158-162. The activations are then GGML's, and so are the products (candle's to
//! float rounding, `k_quants_match_candles_quantized_matmul`).

use std::arch::x86_64::*;

use super::act_k::ActK;
use super::avx2::{
    blocks_at, each_row, f16x8, quad_bytes, quad_sums, store8, sums16, unpack5, unpack8,
};
use super::q4k::Q4K8;
use super::q5k::Q5K8;
use super::vnni::{NO_VNNI, vnni};

/// The 8 rows' offsets of the 8 sub-blocks as `vpmaddwd` takes them: vector `p` holds row `r`'s
/// offsets of sub-blocks `2p` and `2p + 1` in its 16-bit lanes `2r` and `2r + 1`.
#[target_feature(enable = "avx2")]
#[inline]
fn offset_pairs(m: [&[u8; 8]; 8]) -> [__m256i; 4] {
    let mut pairs = [_mm256_setzero_si256(); 4];
    for (p, pair) in pairs.iter_mut().enumerate() {
        // SAFETY: 8 bytes each; unaligned loads.
        let (even, odd) = unsafe {
            (
                _mm_loadl_epi64(m[2 * p].as_ptr().cast()),
                _mm_loadl_epi64(m[2 * p + 1].as_ptr().cast()),
            )
        };
        *pair = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(even, odd));
    }
    pairs
}

/// Each row's `Σ_j m_j Σ a_j` over a super-block: the offsets [`offset_pairs`] made times the
/// activations' sums per 32, pair by pair.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) fn offset_sums(pairs: &[__m256i; 4], a: &ActK) -> __m256i {
    let sums = |p: usize| {
        let (lo, hi) = (a.sums32[2 * p], a.sums32[2 * p + 1]);
        _mm256_set1_epi32((lo as u16 as i32) | ((hi as u16 as i32) << 16))
    };
    _mm256_add_epi32(
        _mm256_add_epi32(
            _mm256_madd_epi16(pairs[0], sums(0)),
            _mm256_madd_epi16(pairs[1], sums(1)),
        ),
        _mm256_add_epi32(
            _mm256_madd_epi16(pairs[2], sums(2)),
            _mm256_madd_epi16(pairs[3], sums(3)),
        ),
    )
}

/// The 8 rows' scales of one sub-block, in 32 bits.
#[target_feature(enable = "avx2")]
#[inline]
fn scales32(sc: &[u8; 8]) -> __m256i {
    // SAFETY: 8 bytes; unaligned load.
    _mm256_cvtepu8_epi32(unsafe { _mm_loadl_epi64(sc.as_ptr().cast()) })
}

/// The body of [`dot_q4k8`] and [`dot_q5k8`]: `$unpack` gives a sub-block's values (4-bit, or
/// 5-bit with `$five`: their 16-bit sums without VNNI are made two by two).
macro_rules! with_offsets {
    ($w:ident, $a:ident, $rows:ident, $v:ident, $five:literal, $unpack:ident($field:ident)) => {{
        for row in $a {
            assert_eq!(row.len(), $w.len());
        }
        let mut acc = [_mm256_setzero_ps(); $rows];
        for (b, g) in $w.iter().enumerate() {
            let acts = blocks_at($a, b);
            let mut sums = [_mm256_setzero_si256(); $rows];
            for (j, part) in g.j.iter().enumerate() {
                let (sc, q) = (scales32(&part.sc), $unpack(&part.$field));
                each_row!($rows, r => {
                    let qs = acts[r].sub(j);
                    let sum = if $v != NO_VNNI && $rows < 8 {
                        quad_sums::<$v>(&q, qs, 0..8)
                    } else if $v != NO_VNNI {
                        let mut two = [_mm256_setzero_si256(); 2];
                        for k in 0..8 {
                            two[k % 2] = vnni::<$v>(two[k % 2], q[k], quad_bytes(qs, k));
                        }
                        _mm256_add_epi32(two[0], two[1])
                    } else {
                        sums16::<$five>(&q, qs)
                    };
                    sums[r] = _mm256_add_epi32(sums[r], _mm256_mullo_epi32(sum, sc));
                });
            }
            let j = &g.j;
            let pairs = offset_pairs([
                &j[0].m, &j[1].m, &j[2].m, &j[3].m, &j[4].m, &j[5].m, &j[6].m, &j[7].m,
            ]);
            let (d, dmin) = (f16x8(&g.d), f16x8(&g.dmin));
            each_row!($rows, r => {
                let da = _mm256_set1_ps(acts[r].d);
                let offsets = _mm256_cvtepi32_ps(offset_sums(&pairs, acts[r]));
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[r]), _mm256_mul_ps(d, da), acc[r]);
                acc[r] = _mm256_fnmadd_ps(offsets, _mm256_mul_ps(dmin, da), acc[r]);
            });
        }
        store8(acc)
    }};
}

/// The 8 interleaved Q4_K rows of `w` (one group, all its super-blocks) against each of the rows
/// `a` (one activation super-block a super-block).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn dot_q4k8<const R: usize, const V: u8>(w: &[Q4K8], a: [&[ActK]; R]) -> [[f32; 8]; R] {
    with_offsets!(w, a, R, V, false, unpack8(qs))
}

/// The 8 interleaved Q5_K rows of `w` (one group, all its super-blocks) against each of the rows
/// `a` (one activation super-block a super-block).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn dot_q5k8<const R: usize, const V: u8>(w: &[Q5K8], a: [&[ActK]; R]) -> [[f32; 8]; R] {
    with_offsets!(w, a, R, V, true, unpack5(q))
}

/// [`offset_pairs`] of signed scales.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) fn scale_pairs(sc: [&[i8; 8]; 8]) -> [__m256i; 4] {
    let mut pairs = [_mm256_setzero_si256(); 4];
    for (p, pair) in pairs.iter_mut().enumerate() {
        // SAFETY: 8 bytes each; unaligned loads.
        let (even, odd) = unsafe {
            (
                _mm_loadl_epi64(sc[2 * p].as_ptr().cast()),
                _mm_loadl_epi64(sc[2 * p + 1].as_ptr().cast()),
            )
        };
        *pair = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(even, odd));
    }
    pairs
}
