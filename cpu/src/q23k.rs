//! GGUF's 2- and 3-bit k-quants interleaved 8 rows by 8 for the 8-row kernels. Both hold 256
//! weights a super-block in 16 sub-blocks of 16, each with its own scale:
//! - Q2_K: values `q` in 0..=3, a 4-bit scale `sc` and a 4-bit offset `m` a sub-block, weight
//!   `d · sc · q − dmin · m` (84 bytes a super-block, 2.625 bits a weight; interleaved the same);
//! - Q3_K: values `q` in 0..=7 (two low bits and a high bit apart), a signed 6-bit scale `sc`,
//!   weight `d · sc · (q − 4)` (110 bytes; interleaved 3.56 bits a weight, the scales a byte each).
//!
//! The values stay unsigned (what `vpmaddubsw` multiplies); the offsets are paid once per
//! activation half-block from its 16-sums ([`ActK::sums16`]): `Σ sc q a − m Σ a` (Q3_K: `m = 4 sc`).
//!
//! In a part (the weights of one activation block: 32 a row, two sub-blocks), the two low bits
//! of the block's weight `4k + t` of row `r` are bits `2 (k % 4)..` of byte `4r + t` of
//! `q[k / 4]`; Q3_K's high bit is bit `k` of byte `4r + t` of `h`.

use half::f16;

use super::act_k::ActK;
use super::blocks::BLOCK;

/// Bytes of one GGUF Q2_K super-block (`scales[16]`, `qs[64]`, `d`, `dmin`).
pub const Q2K_BYTES: usize = 84;
/// Bytes of one GGUF Q3_K super-block (`hmask[32]`, `qs[64]`, `scales[12]`, `d`).
pub const Q3K_BYTES: usize = 110;

/// One Q2_K super-block index of 8 consecutive rows.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Q2K8 {
    /// Super-block scales of the 8 rows.
    pub d: [f16; 8],
    /// Super-block offset scales of the 8 rows.
    pub dmin: [f16; 8],
    /// The activation blocks' parts, each contiguous.
    pub k: [Q2Part; 8],
}

/// The weights of one activation block in a [`Q2K8`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Q2Part {
    /// Byte `2r + h`: row `r`'s scale (low 4 bits) and offset (high 4 bits) of the block's
    /// weights `16h..16h + 16`, as GGUF packs them.
    pub scales: [u8; 16],
    /// The values, interleaved.
    pub q: [[u8; 32]; 2],
}

/// One Q3_K super-block index of 8 consecutive rows.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Q3K8 {
    /// Super-block scales of the 8 rows.
    pub d: [f16; 8],
    /// The activation blocks' parts, each contiguous.
    pub k: [Q3Part; 8],
}

/// The weights of one activation block in a [`Q3K8`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Q3Part {
    /// `sc[2r + h]`: row `r`'s scale (−32..=31) of the block's weights `16h..16h + 16`.
    pub sc: [i8; 16],
    /// The values' two low bits, interleaved.
    pub q: [[u8; 32]; 2],
    /// The values' high bits, interleaved.
    pub h: [u8; 32],
}

/// Puts value `v` (0..=7) of row `r`'s weight `i` (0..32) of an activation block into the
/// interleaved planes.
fn put(q: &mut [[u8; 32]; 2], h: Option<&mut [u8; 32]>, r: usize, i: usize, v: u8) {
    let (k, t) = (i / 4, i % 4);
    q[k / 4][4 * r + t] |= (v & 3) << (2 * (k % 4));
    if let Some(h) = h {
        h[4 * r + t] |= (v >> 2) << k;
    }
}

/// Row `r`'s value of weight `i` (0..32) of an activation block, from the interleaved planes.
fn get(q: &[[u8; 32]; 2], h: Option<&[u8; 32]>, r: usize, i: usize) -> u8 {
    let (k, t) = (i / 4, i % 4);
    let low = (q[k / 4][4 * r + t] >> (2 * (k % 4))) & 3;
    low | h.map_or(0, |h| ((h[4 * r + t] >> k) & 1) << 2)
}

/// GGUF's two-bit values of a super-block in weight order: weight `128n + 32j + l` is bits
/// `2j..2j + 2` of `qs[32n + l]`.
fn low_bits(qs: &[u8]) -> [u8; 256] {
    std::array::from_fn(|i| {
        let (n, j, l) = (i / 128, i % 128 / 32, i % 32);
        (qs[32 * n + l] >> (2 * j)) & 3
    })
}

/// A Q3_K super-block's 16 signed scales from its 12 packed bytes (6 bits each: low 4 bits in
/// the first 8 bytes' nibbles, high 2 bits in the last 4 bytes' bit pairs).
fn q3k_scales(s: &[u8]) -> [i8; 16] {
    std::array::from_fn(|j| {
        let low = (s[j % 8] >> (4 * (j / 8))) & 15;
        let high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        (low | high << 4) as i8 - 32
    })
}

impl Q2K8 {
    /// Interleaves GGUF Q2_K bytes of 8 rows of `blocks` super-blocks each (row-major).
    pub fn interleave(bytes: &[u8], blocks: usize) -> Vec<Q2K8> {
        assert_eq!(bytes.len(), 8 * blocks * Q2K_BYTES);
        (0..blocks)
            .map(|b| {
                let block = |r: usize| &bytes[(r * blocks + b) * Q2K_BYTES..][..Q2K_BYTES];
                let f16_at =
                    |r: usize, at: usize| f16::from_le_bytes([block(r)[at], block(r)[at + 1]]);
                let mut k = [Q2Part {
                    scales: [0; 16],
                    q: [[0; 32]; 2],
                }; 8];
                for r in 0..8 {
                    let values = low_bits(&block(r)[16..80]);
                    for (j, part) in k.iter_mut().enumerate() {
                        part.scales[2 * r] = block(r)[2 * j];
                        part.scales[2 * r + 1] = block(r)[2 * j + 1];
                        for i in 0..BLOCK {
                            put(&mut part.q, None, r, i, values[32 * j + i]);
                        }
                    }
                }
                Q2K8 {
                    d: std::array::from_fn(|r| f16_at(r, 80)),
                    dmin: std::array::from_fn(|r| f16_at(r, 82)),
                    k,
                }
            })
            .collect()
    }

    /// Row `r`'s weight `i` (0..256) of this super-block, as ggml dequantizes it.
    pub fn weight(&self, r: usize, i: usize) -> f32 {
        let part = &self.k[i / BLOCK];
        let s = part.scales[2 * r + i % BLOCK / 16];
        let q = get(&part.q, None, r, i % BLOCK);
        self.d[r].to_f32() * (s & 15) as f32 * q as f32 - self.dmin[r].to_f32() * (s >> 4) as f32
    }
}

impl Q3K8 {
    /// Interleaves GGUF Q3_K bytes of 8 rows of `blocks` super-blocks each (row-major).
    pub fn interleave(bytes: &[u8], blocks: usize) -> Vec<Q3K8> {
        assert_eq!(bytes.len(), 8 * blocks * Q3K_BYTES);
        (0..blocks)
            .map(|b| {
                let block = |r: usize| &bytes[(r * blocks + b) * Q3K_BYTES..][..Q3K_BYTES];
                let mut k = [Q3Part {
                    sc: [0; 16],
                    q: [[0; 32]; 2],
                    h: [0; 32],
                }; 8];
                for r in 0..8 {
                    let (hmask, low) = (&block(r)[..32], low_bits(&block(r)[32..96]));
                    let sc = q3k_scales(&block(r)[96..108]);
                    for (j, part) in k.iter_mut().enumerate() {
                        part.sc[2 * r] = sc[2 * j];
                        part.sc[2 * r + 1] = sc[2 * j + 1];
                        for i in 0..BLOCK {
                            // Weight 32j + i: its high bit is bit j of hmask[i].
                            let high = (hmask[i] >> j) & 1;
                            put(
                                &mut part.q,
                                Some(&mut part.h),
                                r,
                                i,
                                low[32 * j + i] | high << 2,
                            );
                        }
                    }
                }
                Q3K8 {
                    d: std::array::from_fn(|r| f16::from_le_bytes([block(r)[108], block(r)[109]])),
                    k,
                }
            })
            .collect()
    }

    /// Row `r`'s weight `i` (0..256) of this super-block, as ggml dequantizes it.
    pub fn weight(&self, r: usize, i: usize) -> f32 {
        let part = &self.k[i / BLOCK];
        let sc = part.sc[2 * r + i % BLOCK / 16];
        let q = get(&part.q, Some(&part.h), r, i % BLOCK);
        self.d[r].to_f32() * sc as f32 * (q as i32 - 4) as f32
    }
}

/// `Σ q a` of row `r`'s values `q` of part `k` (weights `32k..32k + 32`) against the activation
/// super-block `a`, by half (16 weights each).
fn half_dots(q: &[[u8; 32]; 2], h: Option<&[u8; 32]>, r: usize, a: &ActK, k: usize) -> [i32; 2] {
    let qs = a.sub(k);
    std::array::from_fn(|half| {
        (16 * half..16 * half + 16)
            .map(|i| get(q, h, r, i) as i32 * qs[i] as i32)
            .sum()
    })
}

/// Scalar reference: the 8 rows of `w` (one group, all its super-blocks) against one activation
/// row (one activation super-block a super-block), the sums exact in integers.
pub fn dot_q2k8_scalar(w: &[Q2K8], a: &[ActK]) -> [f32; 8] {
    std::array::from_fn(|r| {
        let mut total = 0f32;
        for (g, act) in w.iter().zip(a) {
            let (mut sum, mut offset) = (0i32, 0i32);
            for (k, part) in g.k.iter().enumerate() {
                let dots = half_dots(&part.q, None, r, act, k);
                for (half, dot) in dots.into_iter().enumerate() {
                    let s = part.scales[2 * r + half];
                    sum += (s & 15) as i32 * dot;
                    offset += (s >> 4) as i32 * act.sums16[2 * k + half] as i32;
                }
            }
            total += act.d * (g.d[r].to_f32() * sum as f32 - g.dmin[r].to_f32() * offset as f32);
        }
        total
    })
}

/// Scalar reference for Q3_K, as [`dot_q2k8_scalar`].
pub fn dot_q3k8_scalar(w: &[Q3K8], a: &[ActK]) -> [f32; 8] {
    std::array::from_fn(|r| {
        let mut total = 0f32;
        for (g, act) in w.iter().zip(a) {
            let mut sum = 0i32;
            for (k, part) in g.k.iter().enumerate() {
                let dots = half_dots(&part.q, Some(&part.h), r, act, k);
                for (half, dot) in dots.into_iter().enumerate() {
                    let centred = dot - 4 * act.sums16[2 * k + half] as i32;
                    sum += part.sc[2 * r + half] as i32 * centred;
                }
            }
            total += g.d[r].to_f32() * act.d * sum as f32;
        }
        total
    })
}
