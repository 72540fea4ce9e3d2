//! AVX2 dot products of the formats whose values are signed bytes, Q8_0 and IQ4_NL / IQ4_XS (a
//! 4-bit code looked up as a signed value), split from [`super::avx2`]: without a `vpdpbusd`,
//! the weights' signs move onto the activations; Q8_0 with one offsets its weights to unsigned
//! bytes instead.

use std::arch::x86_64::*;

use super::act_k::ActK;
use super::avx2::{act_bytes, blocks_at, each_row, f16x8, quad_bytes, store8, unpack8};
use super::avx2_k::{offset_sums, scale_pairs};
use super::blocks::Act;
use super::iq4::{IQ4_VALUES, Iq4Nl8, Iq4Xs8};
use super::q8::Bytes8;
use super::vnni::{NO_VNNI, vnni};

/// `sums` plus, in each 32-bit lane, the four products of `magnitude`'s bytes and `signed`'s
/// (the weights' magnitudes, the activations carrying the weights' signs): `vpmaddubsw` (a pair at
/// most 2 · 128 · 127 = 32512) widened by `vpmaddwd`; with `V`, one `vpdpbusd`.
#[target_feature(enable = "avx2")]
#[inline]
fn signed_quads<const V: u8>(sums: __m256i, magnitude: __m256i, signed: __m256i) -> __m256i {
    if V != NO_VNNI {
        vnni::<V>(sums, magnitude, signed)
    } else {
        let pairs = _mm256_maddubs_epi16(magnitude, signed);
        _mm256_add_epi32(sums, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
    }
}

/// The 8 interleaved Q8_0 rows of `w` (one group, all its blocks) against each of the rows `a`.
/// Without a `vpdpbusd`: `vpmaddubsw` multiplies unsigned by signed bytes, so the weights'
/// magnitudes go by the activations with the weights' signs moved onto them (a pair at most
/// 2 · 128 · 127 = 32512), widened per chunk. With one ([`bytes8_vnni`]): the weights offset to
/// unsigned bytes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn dot_bytes8<const R: usize, const V: u8>(
    w: &[Bytes8],
    a: [&[Act]; R],
) -> [[f32; 8]; R] {
    for row in a {
        assert_eq!(row.len(), w.len());
    }
    if V != NO_VNNI {
        return bytes8_vnni::<R, V>(w, a);
    }
    let mut acc = [_mm256_setzero_ps(); R];
    for (b, g) in w.iter().enumerate() {
        let d = f16x8(&g.d);
        let mut sums = [_mm256_setzero_si256(); R];
        for (c, chunk) in g.qs.iter().enumerate() {
            // SAFETY: 32 bytes; unaligned load.
            let q = unsafe { _mm256_loadu_si256(chunk.as_ptr().cast()) };
            let magnitude = _mm256_sign_epi8(q, q);
            each_row!(R, r => {
                let signed = _mm256_sign_epi8(act_bytes(&a[r][b], c), q);
                sums[r] = signed_quads::<V>(sums[r], magnitude, signed);
            });
        }
        each_row!(R, r => {
            let scale = _mm256_mul_ps(d, _mm256_set1_ps(a[r][b].d));
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[r]), scale, acc[r]);
        });
    }
    store8(acc)
}

/// [`dot_bytes8`] with `V`'s `vpdpbusd`: each chunk's weights `q` become the unsigned `q + 128`
/// (one `vpxor` with 0x80, shared by the `R` activation rows), multiplied by the activations as
/// they are, and `128 · Σ a` (the activation block's integer sum) comes off each block's sums:
/// exact in 32 bits (at most 32 · 255 · 128 a block). Two accumulators per activation row, so
/// that a `vpdpbusd` (4 cycles' latency on Zen 4) does not wait on the one before it.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn bytes8_vnni<const R: usize, const V: u8>(w: &[Bytes8], a: [&[Act]; R]) -> [[f32; 8]; R] {
    let flip = _mm256_set1_epi8(-128);
    let mut acc = [_mm256_setzero_ps(); R];
    for (b, g) in w.iter().enumerate() {
        // Even and odd chunks in separate arrays: one array indexed by the parity would live in
        // memory.
        let (mut even, mut odd) = ([_mm256_setzero_si256(); R], [_mm256_setzero_si256(); R]);
        for c in (0..8).step_by(2) {
            // SAFETY: 32 bytes each; unaligned loads.
            let (q0, q1) = unsafe {
                (
                    _mm256_loadu_si256(g.qs[c].as_ptr().cast()),
                    _mm256_loadu_si256(g.qs[c + 1].as_ptr().cast()),
                )
            };
            let (q0, q1) = (_mm256_xor_si256(q0, flip), _mm256_xor_si256(q1, flip));
            each_row!(R, r => {
                even[r] = vnni::<V>(even[r], q0, act_bytes(&a[r][b], c));
                odd[r] = vnni::<V>(odd[r], q1, act_bytes(&a[r][b], c + 1));
            });
        }
        let d = f16x8(&g.d);
        each_row!(R, r => {
            let act = &a[r][b];
            let offset = _mm256_set1_epi32(128 * (act.sums[0] as i32 + act.sums[1] as i32));
            let sum = _mm256_sub_epi32(_mm256_add_epi32(even[r], odd[r]), offset);
            let scale = _mm256_mul_ps(d, _mm256_set1_ps(act.d));
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), scale, acc[r]);
        });
    }
    store8(acc)
}

/// [`iq4_sums`] before the correction, for `$acts` (`[&[i8; 32]; $rows]`): with `$v`'s
/// `vpdpbusd`, the sums of the values plus 128 (the caller takes `128 Σ a` off); without, the
/// exact sums. A macro: as a function LLVM left it out of line in the IQ4_XS kernel, its sums
/// through memory (prefill at half speed). With the lookup table a constant (it was built per
/// call) and IQ4_XS on super-block activations ([`dot_iq4xs8`]), 64-row GMAC/s on Zen 4, best of
/// 10 alternated runs on a noisy VM: IQ4_NL 172 -> 208, IQ4_XS 213 -> 232.
macro_rules! iq4_quads {
    ($rows:ident, $v:ident, $packed:expr, $acts:ident) => {{
        let mut sums = [_mm256_setzero_si256(); $rows];
        if $v != NO_VNNI {
            // SAFETY: 16 bytes; unaligned load.
            let table =
                _mm256_broadcastsi128_si256(unsafe { _mm_loadu_si128(IQ4_OFFSET.as_ptr().cast()) });
            let mut values = unpack8($packed);
            for v in &mut values {
                *v = _mm256_shuffle_epi8(table, *v);
            }
            // Even and odd quads in separate arrays, so that consecutive `vpdpbusd` of a row do
            // not wait on each other.
            let mut odd = [_mm256_setzero_si256(); $rows];
            for k in (0..8).step_by(2) {
                each_row!($rows, r => {
                    sums[r] = vnni::<$v>(sums[r], values[k], quad_bytes($acts[r], k));
                    odd[r] = vnni::<$v>(odd[r], values[k + 1], quad_bytes($acts[r], k + 1));
                });
            }
            each_row!($rows, r => {
                sums[r] = _mm256_add_epi32(sums[r], odd[r]);
            });
        } else {
            // SAFETY: 16 bytes; unaligned load.
            let table =
                _mm256_broadcastsi128_si256(unsafe { _mm_loadu_si128(IQ4_VALUES.as_ptr().cast()) });
            let mut values = unpack8($packed);
            for v in &mut values {
                *v = _mm256_shuffle_epi8(table, *v);
            }
            for (k, v) in values.iter().enumerate() {
                let magnitude = _mm256_sign_epi8(*v, *v);
                each_row!($rows, r => {
                    let signed = _mm256_sign_epi8(quad_bytes($acts[r], k), *v);
                    sums[r] = signed_quads::<$v>(sums[r], magnitude, signed);
                });
            }
        }
        sums
    }};
}

/// The IQ4 values plus 128, as unsigned bytes (`vpdpbusd`'s).
pub(super) const IQ4_OFFSET: [u8; 16] = {
    let mut out = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        out[i] = (IQ4_VALUES[i] as i16 + 128) as u8;
        i += 1;
    }
    out
};

/// The integer dot products of one interleaved IQ4 block of 8 rows (`packed`) with each
/// activation block of `acts`, one 32-bit lane a weight row: the codes become their signed values
/// by a `vpshufb` lookup, then as [`dot_bytes8`] (magnitudes times the activations carrying the
/// values' signs). With `V`'s `vpdpbusd`, the lookup gives the values plus 128 (unsigned bytes),
/// multiplied by the activations as they are, and `128 Σ a` comes off each row's sum (as
/// [`bytes8_vnni`]): no sign moves per activation row (IQ4_XS prefill 160-167 -> 207 GMAC/s on
/// Zen 4).
#[target_feature(enable = "avx2")]
#[inline]
fn iq4_sums<const R: usize, const V: u8>(packed: &[[u8; 32]; 4], acts: [&Act; R]) -> [__m256i; R] {
    let mut qs = [&acts[0].qs; R];
    for r in 1..R {
        qs[r] = &acts[r].qs;
    }
    let mut sums = iq4_quads!(R, V, packed, qs);
    if V != NO_VNNI {
        each_row!(R, r => {
            let total = acts[r].sums[0] as i32 + acts[r].sums[1] as i32;
            sums[r] = _mm256_sub_epi32(sums[r], _mm256_set1_epi32(128 * total));
        });
    }
    sums
}

/// The 8 interleaved IQ4_NL rows of `w` (one group, all its blocks) against each of the rows `a`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn dot_iq4nl8<const R: usize, const V: u8>(
    w: &[Iq4Nl8],
    a: [&[Act]; R],
) -> [[f32; 8]; R] {
    for row in a {
        assert_eq!(row.len(), w.len());
    }
    let mut acc = [_mm256_setzero_ps(); R];
    for (b, g) in w.iter().enumerate() {
        let d = f16x8(&g.d);
        let sums = iq4_sums::<R, V>(&g.qs, blocks_at(a, b));
        each_row!(R, r => {
            let scale = _mm256_mul_ps(d, _mm256_set1_ps(a[r][b].d));
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[r]), scale, acc[r]);
        });
    }
    store8(acc)
}

/// The 8 interleaved IQ4_XS rows of `w` (one group, all its super-blocks) against each of the
/// rows `a` (one activation super-block a super-block): per sub-block the rows' integer sums
/// ([`iq4_quads`]) times their scales `ls − 32`; with `V` (values offset by 128), `128 Σ_j sc_j
/// Σ a_j` off each row once a super-block, in four `vpmaddwd` as [`offset_sums`](super::avx2_k).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn dot_iq4xs8<const R: usize, const V: u8>(
    w: &[Iq4Xs8],
    a: [&[ActK]; R],
) -> [[f32; 8]; R] {
    for row in a {
        assert_eq!(row.len(), w.len());
    }
    let mut acc = [_mm256_setzero_ps(); R];
    for (b, g) in w.iter().enumerate() {
        let acts = blocks_at(a, b);
        let mut sums = [_mm256_setzero_si256(); R];
        for (j, part) in g.j.iter().enumerate() {
            // SAFETY: 8 bytes; unaligned load.
            let sc = _mm256_cvtepi8_epi32(unsafe { _mm_loadl_epi64(part.sc.as_ptr().cast()) });
            let mut qs = [acts[0].sub(j); R];
            for r in 1..R {
                qs[r] = acts[r].sub(j);
            }
            let quads = iq4_quads!(R, V, &part.qs, qs);
            each_row!(R, r => {
                sums[r] = _mm256_add_epi32(sums[r], _mm256_mullo_epi32(quads[r], sc));
            });
        }
        if V != NO_VNNI {
            let j = &g.j;
            let pairs = scale_pairs([
                &j[0].sc, &j[1].sc, &j[2].sc, &j[3].sc, &j[4].sc, &j[5].sc, &j[6].sc, &j[7].sc,
            ]);
            each_row!(R, r => {
                let centre = offset_sums(&pairs, acts[r]);
                sums[r] = _mm256_sub_epi32(sums[r], _mm256_slli_epi32(centre, 7));
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
