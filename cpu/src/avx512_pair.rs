//! Two interleaved groups (16 weight rows) at once in 512-bit lanes, for prefill tiles of 4 or 8
//! activation rows where the CPU has AVX-512: each broadcast activation quad feeds one 512-bit
//! `vpdpbusd` over 16 rows instead of a 256-bit one over 8, half the broadcasts a product (Zen 4
//! runs a 512-bit `vpdpbusd` as two 256-bit halves, so the products cost the same; the loads
//! were the bound). The groups' blocks are unpacked as the 8-row kernels unpack them and joined.
//! Decode rows stay on the 8-row kernels (one group's stream at a time). 64-row GMAC/s at
//! 8192 x 2048 on Zen 4, alternated runs: Q4_K 238-256 -> 270-277, Q5_K 216-241 -> 260-272,
//! Q6_K 167-172 -> 208-216, IQ4_XS 224-242 -> 239-256.

use std::arch::x86_64::*;

use super::act_k::ActK;
use super::avx2::{blocks_at, each_row, unpack5, unpack6, unpack8};
use super::avx2_signed::IQ4_OFFSET;
use super::iq4::Iq4Xs8;
use super::q4k::Q4K8;
use super::q5k::Q5K8;
use super::q6k::Q6K8;

/// The two groups' 8-row vectors side by side.
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")]
#[inline]
fn join(lo: __m256i, hi: __m256i) -> __m512i {
    _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1)
}

/// 16 rows' f16 values as floats.
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq,f16c")]
#[inline]
fn f16x16(lo: &[half::f16; 8], hi: &[half::f16; 8]) -> __m512 {
    // SAFETY: 16 bytes each; unaligned loads.
    let (a, b) = unsafe {
        (
            _mm_loadu_si128(lo.as_ptr().cast()),
            _mm_loadu_si128(hi.as_ptr().cast()),
        )
    };
    _mm512_cvtph_ps(_mm256_set_m128i(b, a))
}

/// 16 rows' unsigned bytes as 32-bit lanes.
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")]
#[inline]
fn bytes16(lo: &[u8; 8], hi: &[u8; 8]) -> __m512i {
    // SAFETY: 8 bytes each; unaligned loads.
    let (a, b) = unsafe {
        (
            _mm_loadl_epi64(lo.as_ptr().cast()),
            _mm_loadl_epi64(hi.as_ptr().cast()),
        )
    };
    _mm512_cvtepu8_epi32(_mm_unpacklo_epi64(a, b))
}

/// The body of [`dot_q4k16`] and [`dot_q5k16`]: `$unpack` gives a sub-block's values.
macro_rules! with_offsets16 {
    ($w0:ident, $w1:ident, $a:ident, $rows:ident, $unpack:ident($field:ident)) => {{
        let mut acc = [_mm512_setzero_ps(); $rows];
        for (b, (g0, g1)) in $w0.iter().zip($w1).enumerate() {
            let acts = blocks_at($a, b);
            let mut sums = [_mm512_setzero_si512(); $rows];
            for j in 0..8 {
                let (p0, p1) = (&g0.j[j], &g1.j[j]);
                let sc = bytes16(&p0.sc, &p1.sc);
                let (q0, q1) = ($unpack(&p0.$field), $unpack(&p1.$field));
                let mut q = [_mm512_setzero_si512(); 8];
                for k in 0..8 {
                    q[k] = join(q0[k], q1[k]);
                }
                each_row!($rows, r => {
                    let qs = acts[r].sub(j);
                    let mut two = [_mm512_setzero_si512(); 2];
                    for k in 0..8 {
                        // SAFETY: bytes 4k..4k + 4 of the 32; unaligned read.
                        let quad = unsafe { qs.as_ptr().add(4 * k).cast::<i32>().read_unaligned() };
                        two[k % 2] = _mm512_dpbusd_epi32(two[k % 2], q[k], _mm512_set1_epi32(quad));
                    }
                    let sum = _mm512_add_epi32(two[0], two[1]);
                    sums[r] = _mm512_add_epi32(sums[r], _mm512_mullo_epi32(sum, sc));
                });
            }
            // The offsets `Σ_j m_j Σ a_j`, after the products (their registers are free then).
            let mut offsets = [_mm512_setzero_si512(); $rows];
            for j in 0..8 {
                let m = bytes16(&g0.j[j].m, &g1.j[j].m);
                each_row!($rows, r => {
                    let a32 = _mm512_set1_epi32(acts[r].sums32[j] as i32);
                    offsets[r] = _mm512_add_epi32(offsets[r], _mm512_mullo_epi32(m, a32));
                });
            }
            let (d, dmin) = (f16x16(&g0.d, &g1.d), f16x16(&g0.dmin, &g1.dmin));
            each_row!($rows, r => {
                let da = _mm512_set1_ps(acts[r].d);
                let products = _mm512_cvtepi32_ps(sums[r]);
                acc[r] = _mm512_fmadd_ps(products, _mm512_mul_ps(d, da), acc[r]);
                let offsets = _mm512_cvtepi32_ps(offsets[r]);
                acc[r] = _mm512_fnmadd_ps(offsets, _mm512_mul_ps(dmin, da), acc[r]);
            });
        }
        store16(acc)
    }};
}

/// Q4_K, groups `w0` and `w1` against the rows `a`, as [`super::avx2_k`]'s `dot_q4k8`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")]
#[inline]
pub(super) fn dot_q4k16<const R: usize>(
    w0: &[Q4K8],
    w1: &[Q4K8],
    a: [&[ActK]; R],
) -> [[f32; 16]; R] {
    with_offsets16!(w0, w1, a, R, unpack8(qs))
}

/// Q5_K, groups `w0` and `w1` against the rows `a`, as [`super::avx2_k`]'s `dot_q5k8`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")]
#[inline]
pub(super) fn dot_q5k16<const R: usize>(
    w0: &[Q5K8],
    w1: &[Q5K8],
    a: [&[ActK]; R],
) -> [[f32; 16]; R] {
    with_offsets16!(w0, w1, a, R, unpack5(q))
}

/// Stores 16 floats a row.
#[target_feature(enable = "avx512f")]
#[inline]
fn store16<const R: usize>(acc: [__m512; R]) -> [[f32; 16]; R] {
    let mut out = [[0f32; 16]; R];
    each_row!(R, r => {
        // SAFETY: 16 floats; unaligned store.
        unsafe { _mm512_storeu_ps(out[r].as_mut_ptr(), acc[r]) };
    });
    out
}

/// IQ4_XS, groups `w0` and `w1` against the rows `a`, as [`super::avx2_signed`]'s `dot_iq4xs8`
/// with `vpdpbusd`: the looked-up values plus 128 against the activations, `128 Σ_j sc_j Σ a_j`
/// off once a super-block.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")]
#[inline]
pub(super) fn dot_iq4xs16<const R: usize>(
    w0: &[Iq4Xs8],
    w1: &[Iq4Xs8],
    a: [&[ActK]; R],
) -> [[f32; 16]; R] {
    // SAFETY: 16 bytes; unaligned load.
    let table = _mm512_broadcast_i32x4(unsafe { _mm_loadu_si128(IQ4_OFFSET.as_ptr().cast()) });
    let mut acc = [_mm512_setzero_ps(); R];
    for (b, (g0, g1)) in w0.iter().zip(w1).enumerate() {
        let acts = blocks_at(a, b);
        let mut sums = [_mm512_setzero_si512(); R];
        let mut centre = [_mm512_setzero_si512(); R];
        for j in 0..8 {
            let (p0, p1) = (&g0.j[j], &g1.j[j]);
            // SAFETY: 8 bytes each; unaligned loads.
            let sc = _mm512_cvtepi8_epi32(unsafe {
                _mm_unpacklo_epi64(
                    _mm_loadl_epi64(p0.sc.as_ptr().cast()),
                    _mm_loadl_epi64(p1.sc.as_ptr().cast()),
                )
            });
            let (c0, c1) = (unpack8(&p0.qs), unpack8(&p1.qs));
            let mut q = [_mm512_setzero_si512(); 8];
            for k in 0..8 {
                q[k] = _mm512_shuffle_epi8(table, join(c0[k], c1[k]));
            }
            each_row!(R, r => {
                let qs = acts[r].sub(j);
                let mut two = [_mm512_setzero_si512(); 2];
                for k in 0..8 {
                    // SAFETY: bytes 4k..4k + 4 of the 32; unaligned read.
                    let quad = unsafe { qs.as_ptr().add(4 * k).cast::<i32>().read_unaligned() };
                    two[k % 2] = _mm512_dpbusd_epi32(two[k % 2], q[k], _mm512_set1_epi32(quad));
                }
                let sum = _mm512_add_epi32(two[0], two[1]);
                sums[r] = _mm512_add_epi32(sums[r], _mm512_mullo_epi32(sum, sc));
                let a32 = _mm512_set1_epi32(acts[r].sums32[j] as i32);
                centre[r] = _mm512_add_epi32(centre[r], _mm512_mullo_epi32(sc, a32));
            });
        }
        let d = f16x16(&g0.d, &g1.d);
        each_row!(R, r => {
            let exact = _mm512_sub_epi32(sums[r], _mm512_slli_epi32(centre[r], 7));
            let scale = _mm512_mul_ps(d, _mm512_set1_ps(acts[r].d));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(exact), scale, acc[r]);
        });
    }
    store16(acc)
}

/// Q6_K, groups `w0` and `w1` against the rows `a`, as [`super::avx2`]'s `dot_q6k8` with
/// `vpdpbusd`: each half-block's sums times its scale, less `32 Σ sc Σ a`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")]
#[inline]
pub(super) fn dot_q6k16<const R: usize>(
    w0: &[Q6K8],
    w1: &[Q6K8],
    a: [&[ActK]; R],
) -> [[f32; 16]; R] {
    let mut acc = [_mm512_setzero_ps(); R];
    for (b, (g0, g1)) in w0.iter().zip(w1).enumerate() {
        let acts = blocks_at(a, b);
        let mut sums = [_mm512_setzero_si512(); R];
        for k in 0..8 {
            let (p0, p1) = (&g0.k[k], &g1.k[k]);
            // SAFETY: 16 bytes each; unaligned loads. Row r's two scales in 16-bit lanes 2r, 2r + 1.
            let pair = unsafe {
                join(
                    _mm256_cvtepi8_epi16(_mm_loadu_si128(p0.sc.as_ptr().cast())),
                    _mm256_cvtepi8_epi16(_mm_loadu_si128(p1.sc.as_ptr().cast())),
                )
            };
            let (lo, hi) = (
                _mm512_srai_epi32(_mm512_slli_epi32(pair, 16), 16),
                _mm512_srai_epi32(pair, 16),
            );
            let (q0, q1) = (unpack6(&p0.ql, &p0.qh), unpack6(&p1.ql, &p1.qh));
            let mut q = [_mm512_setzero_si512(); 8];
            for c in 0..8 {
                q[c] = join(q0[c], q1[c]);
            }
            each_row!(R, r => {
                let qs = acts[r].sub(k);
                let mut half = [_mm512_setzero_si512(); 2];
                for c in 0..8 {
                    // SAFETY: bytes 4c..4c + 4 of the 32; unaligned read.
                    let quad = unsafe { qs.as_ptr().add(4 * c).cast::<i32>().read_unaligned() };
                    half[c / 4] = _mm512_dpbusd_epi32(half[c / 4], q[c], _mm512_set1_epi32(quad));
                }
                let sum = _mm512_add_epi32(
                    _mm512_mullo_epi32(half[0], lo),
                    _mm512_mullo_epi32(half[1], hi),
                );
                let (h0, h1) = (acts[r].sums16[2 * k], acts[r].sums16[2 * k + 1]);
                let halves = _mm512_set1_epi32((h0 as u16 as i32) | ((h1 as u16 as i32) << 16));
                let centre = _mm512_slli_epi32(_mm512_madd_epi16(pair, halves), 5);
                sums[r] = _mm512_add_epi32(sums[r], _mm512_sub_epi32(sum, centre));
            });
        }
        let d = f16x16(&g0.d, &g1.d);
        each_row!(R, r => {
            let scale = _mm512_mul_ps(d, _mm512_set1_ps(acts[r].d));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[r]), scale, acc[r]);
        });
    }
    store16(acc)
}
