//! AVX2 dot products of one group of 8 interleaved weight rows against `R` activation rows (1 to
//! 4): each weight block is unpacked once and multiplied into every activation row, 32 byte
//! products (4 weights of each of the 8 rows) in one `vpmaddubsw`; with `V` (AVX-VNNI or
//! AVX512-VNNI), in one `vpdpbusd`, which also sums them into 32 bits. [`super::kernels`]
//! instantiates these inside its entry points, which enable AVX2, FMA and F16C and are called only
//! after `is_x86_feature_detected!` found them (and `V`'s instruction); the formats' scalar
//! functions are the reference they are tested against.

use std::arch::x86_64::*;

use super::act_k::ActK;
pub(super) use super::avx2_k::{dot_q4k8, dot_q5k8};
pub(super) use super::avx2_low::{dot_q2k8, dot_q3k8};
pub(super) use super::avx2_signed::{dot_bytes8, dot_iq4nl8, dot_iq4xs8};
use super::blocks::{Act, Nibbles8};
use super::fives::{Fives8, Packed5};
use super::q6k::Q6K8;
use super::vnni::{NO_VNNI, vnni};

/// `$body` once for each activation row `$r` of the `$rows` (at most 8) of a tile, written out
/// rather than looped: the tile's accumulators stay in registers only where every index is a
/// constant, and LLVM leaves an 8-row loop rolled (Q5_K's 8-row tile kept them on the stack).
macro_rules! each_row {
    ($rows:expr, $r:ident => $body:block) => {{
        const { assert!($rows <= 8) };
        if 0 < $rows {
            let $r: usize = 0;
            $body
        }
        if 1 < $rows {
            let $r: usize = 1;
            $body
        }
        if 2 < $rows {
            let $r: usize = 2;
            $body
        }
        if 3 < $rows {
            let $r: usize = 3;
            $body
        }
        if 4 < $rows {
            let $r: usize = 4;
            $body
        }
        if 5 < $rows {
            let $r: usize = 5;
            $body
        }
        if 6 < $rows {
            let $r: usize = 6;
            $body
        }
        if 7 < $rows {
            let $r: usize = 7;
            $body
        }
    }};
}
pub(super) use each_row;

/// The 8 vectors of 4 weights of each of 8 rows that one interleaved block holds (`packed[c]`'s
/// low nibbles are weights `4c..4c + 4` of each row, its high nibbles weights `16 + 4c..`).
#[target_feature(enable = "avx2")]
#[inline]
pub(super) fn unpack8(packed: &[[u8; 32]; 4]) -> [__m256i; 8] {
    let low = _mm256_set1_epi8(0x0F);
    let mut q = [_mm256_setzero_si256(); 8];
    for c in 0..4 {
        // SAFETY: 32 bytes; unaligned load.
        let v = unsafe { _mm256_loadu_si256(packed[c].as_ptr().cast()) };
        q[c] = _mm256_and_si256(v, low);
        q[c + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
    }
    q
}

/// Adds one block of 8 rows (`q` from [`unpack8`] or [`unpack5`], the rows' `scale` and
/// `offset`) times each activation block of `acts` to `acc`: per activation row 8 `vpmaddubsw`
/// against broadcast activation quads, summed in 16 bits (4-bit values: at most
/// 8 · 2 · 15 · 127 = 30480; 5-bit ones, `FIVE`: two sums of 4, at most 4 · 2 · 31 · 127 = 31496),
/// then widened; with `V`, 8 `vpdpbusd` straight into 32 bits.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn block8<const R: usize, const FIVE: bool, const V: u8>(
    q: &[__m256i; 8],
    scale: __m256,
    offset: __m256,
    acts: [&Act; R],
    acc: &mut [__m256; R],
) {
    each_row!(R, r => {
        let ab = acts[r];
        let sum = if V != NO_VNNI {
            quad_sums::<V>(q, &ab.qs, 0..8)
        } else {
            sums16::<FIVE>(q, &ab.qs)
        };
        let products = _mm256_cvtepi32_ps(sum);
        acc[r] = _mm256_fmadd_ps(products, _mm256_mul_ps(scale, _mm256_set1_ps(ab.d)), acc[r]);
        acc[r] = _mm256_fmadd_ps(offset, _mm256_set1_ps(ab.s), acc[r]);
    });
}

/// The activation block's bytes `4k..4k + 4` in every 32-bit lane.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) fn act_bytes(a: &Act, k: usize) -> __m256i {
    quad_bytes(&a.qs, k)
}

/// Bytes `4k..4k + 4` of 32 activations in every 32-bit lane.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) fn quad_bytes(qs: &[i8; 32], k: usize) -> __m256i {
    assert!(k < 8);
    // SAFETY: bytes 4k..4k + 4 of the 32; unaligned read.
    _mm256_set1_epi32(unsafe { qs.as_ptr().add(4 * k).cast::<i32>().read_unaligned() })
}

/// With a `vpdpbusd` (`V`): in each 32-bit lane (a weight row), the products of the row's
/// unsigned values `q[k]` and the activation block's bytes `4k..4k + 4`, summed over the quads
/// `ks`: over 8 quads in four accumulators (a `vpdpbusd` waits 4-5 cycles for the one before it
/// into the same register: Q4_0 and Q5_0 +6-11% over two on Zen 4), over 4 in two (Q2_K and
/// Q3_K's half-blocks: four measured 5-30% slower).
#[target_feature(enable = "avx2")]
#[inline]
pub(super) fn quad_sums<const V: u8>(
    q: &[__m256i; 8],
    a: &[i8; 32],
    ks: std::ops::Range<usize>,
) -> __m256i {
    if ks.len() > 4 {
        let mut four = [_mm256_setzero_si256(); 4];
        for k in ks {
            four[k % 4] = vnni::<V>(four[k % 4], q[k], quad_bytes(a, k));
        }
        return _mm256_add_epi32(
            _mm256_add_epi32(four[0], four[1]),
            _mm256_add_epi32(four[2], four[3]),
        );
    }
    let mut two = [_mm256_setzero_si256(); 2];
    for k in ks {
        two[k % 2] = vnni::<V>(two[k % 2], q[k], quad_bytes(a, k));
    }
    _mm256_add_epi32(two[0], two[1])
}

/// [`block8`]'s integer sums without AVX-VNNI: `vpmaddubsw` per quad, summed in 16 bits, widened.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) fn sums16<const FIVE: bool>(q: &[__m256i; 8], ab: &[i8; 32]) -> __m256i {
    let ones = _mm256_set1_epi16(1);
    let quad = |k: usize| _mm256_maddubs_epi16(q[k], quad_bytes(ab, k));
    let sum16 = |ks: std::ops::Range<usize>| {
        let first = quad(ks.start);
        ks.skip(1).fold(first, |s, k| _mm256_add_epi16(s, quad(k)))
    };
    if FIVE {
        _mm256_add_epi32(
            _mm256_madd_epi16(sum16(0..4), ones),
            _mm256_madd_epi16(sum16(4..8), ones),
        )
    } else {
        _mm256_madd_epi16(sum16(0..8), ones)
    }
}

/// The 8 vectors of 4 unsigned 5-bit weights of each of 8 rows: [`unpack8`]'s low 4 bits with
/// bit `c` of `qh` moved to bit 4 in chunk `c` (within each byte: the shifts are by at most 4).
#[target_feature(enable = "avx2")]
#[inline]
pub(super) fn unpack5(p: &Packed5) -> [__m256i; 8] {
    let mut q = unpack8(&p.qs);
    // SAFETY: 32 bytes; unaligned load.
    let qh = unsafe { _mm256_loadu_si256(p.qh.as_ptr().cast()) };
    let bit4 = _mm256_set1_epi8(0x10);
    let moved = [
        _mm256_slli_epi16(qh, 4),
        _mm256_slli_epi16(qh, 3),
        _mm256_slli_epi16(qh, 2),
        _mm256_slli_epi16(qh, 1),
        qh,
        _mm256_srli_epi16(qh, 1),
        _mm256_srli_epi16(qh, 2),
        _mm256_srli_epi16(qh, 3),
    ];
    for (qc, m) in q.iter_mut().zip(moved) {
        *qc = _mm256_or_si256(*qc, _mm256_and_si256(m, bit4));
    }
    q
}

/// Block `i` of each activation row. A plain loop: an array's `map` takes its closure through
/// generic code that LLVM may leave out of line, and an out-of-line closure is compiled without
/// the kernel's target features (a call per block, vectors through memory: Q2_K/Q3_K prefill
/// ran at a fifth of its speed so).
#[inline(always)]
pub(super) fn blocks_at<T, const R: usize>(a: [&[T]; R], i: usize) -> [&T; R] {
    let mut out = [&a[0][i]; R];
    for r in 1..R {
        out[r] = &a[r][i];
    }
    out
}

/// Stores 8 floats a row.
#[target_feature(enable = "avx")]
pub(super) fn store8<const R: usize>(acc: [__m256; R]) -> [[f32; 8]; R] {
    let mut out = [[0f32; 8]; R];
    each_row!(R, r => {
        // SAFETY: 8 floats; unaligned store.
        unsafe { _mm256_storeu_ps(out[r].as_mut_ptr(), acc[r]) };
    });
    out
}

/// Each row's two 16-bit half-block scales (row r's in 16-bit lanes 2r, 2r + 1 of `pair`) spread
/// over the row's 32 bits for `vpmaddwd`: the first scale twice, and the second twice.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) fn half_block_scales(pair: __m256i) -> (__m256i, __m256i) {
    let first = _mm256_setr_epi8(
        0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13, 0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12,
        13, 12, 13,
    );
    let second = _mm256_add_epi8(first, _mm256_set1_epi8(2));
    (
        _mm256_shuffle_epi8(pair, first),
        _mm256_shuffle_epi8(pair, second),
    )
}

/// The 8 rows' f16 values as floats.
#[target_feature(enable = "avx2,f16c")]
#[inline]
pub(super) fn f16x8(v: &[half::f16; 8]) -> __m256 {
    // SAFETY: 8 f16 are 16 bytes; unaligned load.
    unsafe { _mm256_cvtph_ps(_mm_loadu_si128(v.as_ptr().cast())) }
}

/// The 8 interleaved rows of `w` (one group, all its blocks) against each of the rows `a`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn dot_nibbles8<const R: usize, const V: u8>(
    w: &[Nibbles8],
    a: [&[Act]; R],
) -> [[f32; 8]; R] {
    for row in a {
        assert_eq!(row.len(), w.len());
    }
    let mut acc = [_mm256_setzero_ps(); R];
    for (b, g) in w.iter().enumerate() {
        let (d, m) = (f16x8(&g.d), f16x8(&g.m));
        block8::<R, false, V>(&unpack8(&g.qs), d, m, blocks_at(a, b), &mut acc);
    }
    store8(acc)
}

/// The 8 vectors of 4 unsigned 6-bit weights of each of 8 rows of one activation block of a
/// [`Q6K8`] group: [`unpack8`]'s low 4 bits with the high 2 bits of `qh` moved to bits 4 and 5.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) fn unpack6(ql: &[[u8; 32]; 4], qh: &[[u8; 32]; 2]) -> [__m256i; 8] {
    let mut q = unpack8(ql);
    for h in 0..2 {
        // SAFETY: 32 bytes; unaligned load.
        let v = unsafe { _mm256_loadu_si256(qh[h].as_ptr().cast()) };
        let bits = |c: i32| _mm256_and_si256(v, _mm256_set1_epi8(3 << (2 * c)));
        // Bit pair `c` to bits 4..6, each within its byte.
        let high = [
            _mm256_slli_epi16(bits(0), 4),
            _mm256_slli_epi16(bits(1), 2),
            bits(2),
            _mm256_srli_epi16(bits(3), 2),
        ];
        for (c, hc) in high.into_iter().enumerate() {
            q[4 * h + c] = _mm256_or_si256(q[4 * h + c], hc);
        }
    }
    q
}

/// The 8 interleaved Q6_K rows of `w` (one group, all its super-blocks) against each of the rows
/// `a` (one activation super-block a super-block). Per 32 weights and row: 8 `vpmaddubsw` of the
/// unsigned values, summed two by two in 16 bits (at most 2 · 2 · 63 · 127 = 32004), times the
/// half-blocks' scales in one `vpmaddwd` each (with `V`: `vpdpbusd`, then `vpmulld`), less
/// `32 Σ sc Σ a` from the activations' 16-sums, added in 32 bits (at most 256 · 128 · 63 · 127
/// < 2³¹); one conversion to float a super-block. (With activations scaled per 32, one every 32
/// weights: as fast at 64 rows on Zen 4, 160-172 GMAC/s against 166-171; the activations'
/// broadcasts bound it. Per 256, the products are GGML's.)
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn dot_q6k8<const R: usize, const V: u8>(w: &[Q6K8], a: [&[ActK]; R]) -> [[f32; 8]; R] {
    for row in a {
        assert_eq!(row.len(), w.len());
    }
    let mut acc = [_mm256_setzero_ps(); R];
    for (b, g) in w.iter().enumerate() {
        let acts = blocks_at(a, b);
        let mut sums = [_mm256_setzero_si256(); R];
        for (k, part) in g.k.iter().enumerate() {
            // SAFETY: 16 bytes; unaligned load. Row r's two scales in 16-bit lanes 2r, 2r + 1.
            let pair = _mm256_cvtepi8_epi16(unsafe { _mm_loadu_si128(part.sc.as_ptr().cast()) });
            let (lo, hi) = half_block_scales(pair);
            // (For `V`: row r's two scales in 32-bit lane r.)
            let (lo32, hi32) = (
                _mm256_srai_epi32(_mm256_slli_epi32(pair, 16), 16),
                _mm256_srai_epi32(pair, 16),
            );
            let q = unpack6(&part.ql, &part.qh);
            each_row!(R, r => {
                let ab = acts[r];
                let qs = ab.sub(k);
                let sum = if V != NO_VNNI {
                    _mm256_add_epi32(
                        _mm256_mullo_epi32(quad_sums::<V>(&q, qs, 0..4), lo32),
                        _mm256_mullo_epi32(quad_sums::<V>(&q, qs, 4..8), hi32),
                    )
                } else {
                    let quad = |c: usize| _mm256_maddubs_epi16(q[c], quad_bytes(qs, c));
                    let two = |c: usize| _mm256_add_epi16(quad(c), quad(c + 1));
                    _mm256_add_epi32(
                        _mm256_add_epi32(
                            _mm256_madd_epi16(two(0), lo),
                            _mm256_madd_epi16(two(2), lo),
                        ),
                        _mm256_add_epi32(
                            _mm256_madd_epi16(two(4), hi),
                            _mm256_madd_epi16(two(6), hi),
                        ),
                    )
                };
                let (h0, h1) = (ab.sums16[2 * k], ab.sums16[2 * k + 1]);
                let halves = _mm256_set1_epi32((h0 as u16 as i32) | ((h1 as u16 as i32) << 16));
                let centre = _mm256_madd_epi16(pair, halves);
                sums[r] = _mm256_add_epi32(sums[r], _mm256_sub_epi32(sum, _mm256_slli_epi32(centre, 5)));
            });
        }
        let d = f16x8(&g.d);
        each_row!(R, r => {
            let scale = _mm256_mul_ps(d, _mm256_set1_ps(acts[r].d));
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[r]), scale, acc[r]);
        });
    }
    store8(acc)
}

/// The 8 interleaved 5-bit rows of `w` (one group, all its blocks) against each of the rows `a`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn dot_fives8<const R: usize, const V: u8>(
    w: &[Fives8],
    a: [&[Act]; R],
) -> [[f32; 8]; R] {
    for row in a {
        assert_eq!(row.len(), w.len());
    }
    let mut acc = [_mm256_setzero_ps(); R];
    for (b, g) in w.iter().enumerate() {
        let (d, m) = (f16x8(&g.d), f16x8(&g.m));
        block8::<R, true, V>(&unpack5(&g.q), d, m, blocks_at(a, b), &mut acc);
    }
    store8(acc)
}
