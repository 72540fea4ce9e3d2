//! GGUF blocks as integer codes with an affine map per group, `w = s * q + b`: what the GPU's
//! decode GEMVs stream for a GGUF file ([`super::affine_linear::AffineLinear`]). Each type keeps
//! its own codes and groups: Q4_0, Q4_1 and Q4_K become 4-bit codes in groups of 32; Q5_0, Q5_1,
//! Q5_K and Q8_0 bytes in groups of 32, Q6_K bytes in groups of 16. The pair of a group is the
//! block's arithmetic (Q4_K: `s = d * sc`, `b = -dmin * m`), so `s * q + b` is the value llama.cpp
//! dequantizes, before the pairs are rounded to f16 on the device.

use candle_core::quantized::GgmlDType;
use half::f16;

/// A `[out, inp]` weight as codes (one a byte here, whatever their width) and `(s, b)` pairs, one
/// per row and group of `group` columns, in row-major order.
#[derive(Clone, Debug, PartialEq)]
pub struct AffineCodes {
    /// Rows.
    pub out: usize,
    /// Columns.
    pub inp: usize,
    /// 4 or 8: how wide the codes are.
    pub bits: usize,
    /// Columns a group.
    pub group: usize,
    /// `out * inp` codes, each below `1 << bits`.
    pub codes: Vec<u8>,
    /// `out * inp / group` pairs `(s, b)`, flattened.
    pub pairs: Vec<f32>,
}

impl AffineCodes {
    /// Element `i` (row-major) as the pairs make it.
    pub fn value(&self, i: usize) -> f32 {
        let at = 2 * (i / self.group);
        self.pairs[at] * f32::from(self.codes[i]) + self.pairs[at + 1]
    }
}

/// Whether [`affine_codes`] repacks GGUF type `ty`.
pub fn repacks(ty: GgmlDType) -> bool {
    block_shape(ty).is_some()
}

/// (weights a block, bytes a block, code bits, columns a group) of a type [`affine_codes`] takes.
fn block_shape(ty: GgmlDType) -> Option<(usize, usize, usize, usize)> {
    Some(match ty {
        GgmlDType::Q4_0 => (32, 18, 4, 32),
        GgmlDType::Q4_1 => (32, 20, 4, 32),
        GgmlDType::Q5_0 => (32, 22, 8, 32),
        GgmlDType::Q5_1 => (32, 24, 8, 32),
        GgmlDType::Q8_0 => (32, 34, 8, 32),
        GgmlDType::Q4K => (256, 144, 4, 32),
        GgmlDType::Q5K => (256, 176, 8, 32),
        GgmlDType::Q6K => (256, 210, 8, 16),
        _ => return None,
    })
}

/// The `[out, inp]` matrix of GGUF type `ty` stored in `bytes` as codes and pairs; `None` for a
/// type it does not take, or bytes that are not `out` rows of whole blocks.
pub fn affine_codes(
    ty: GgmlDType,
    bytes: &[u8],
    (out, inp): (usize, usize),
) -> Option<AffineCodes> {
    let (block, block_bytes, bits, group) = block_shape(ty)?;
    if !inp.is_multiple_of(block) || bytes.len() != out * inp / block * block_bytes {
        return None;
    }
    let mut codes = Vec::with_capacity(out * inp);
    let mut pairs = Vec::with_capacity(2 * out * inp / group);
    for b in bytes.chunks_exact(block_bytes) {
        let start = codes.len();
        codes.resize(start + block, 0);
        unpack_block(ty, b, &mut codes[start..], &mut pairs);
    }
    Some(AffineCodes {
        out,
        inp,
        bits,
        group,
        codes,
        pairs,
    })
}

fn half(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// One block `b` of type `ty`: its codes into `q` (a block's worth) and its groups' pairs onto
/// `pairs`.
fn unpack_block(ty: GgmlDType, b: &[u8], q: &mut [u8], pairs: &mut Vec<f32>) {
    match ty {
        GgmlDType::Q4_0 | GgmlDType::Q4_1 => {
            let (d, rest) = (half(b, 0), if ty == GgmlDType::Q4_0 { 2 } else { 4 });
            let offset = match ty {
                GgmlDType::Q4_0 => -8.0 * d,
                _ => half(b, 2),
            };
            for (j, &byte) in b[rest..rest + 16].iter().enumerate() {
                q[j] = byte & 0xF;
                q[j + 16] = byte >> 4;
            }
            pairs.extend([d, offset]);
        }
        GgmlDType::Q5_0 | GgmlDType::Q5_1 => {
            let d = half(b, 0);
            let (offset, at) = match ty {
                GgmlDType::Q5_0 => (-16.0 * d, 2),
                _ => (half(b, 2), 4),
            };
            let qh = u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
            for (j, &byte) in b[at + 4..at + 20].iter().enumerate() {
                q[j] = (byte & 0xF) | (((qh >> j) & 1) << 4) as u8;
                q[j + 16] = (byte >> 4) | (((qh >> (j + 16)) & 1) << 4) as u8;
            }
            pairs.extend([d, offset]);
        }
        GgmlDType::Q8_0 => {
            let d = half(b, 0);
            for (j, &byte) in b[2..34].iter().enumerate() {
                q[j] = (byte as i8 as i16 + 128) as u8;
            }
            pairs.extend([d, -128.0 * d]);
        }
        GgmlDType::Q4K | GgmlDType::Q5K => {
            let (d, dmin) = (half(b, 0), half(b, 2));
            let scales = &b[4..16];
            let (qh, qs) = match ty {
                GgmlDType::Q5K => (Some(&b[16..48]), &b[48..176]),
                _ => (None, &b[16..144]),
            };
            for j in 0..8 {
                let (sc, m) = scale_min_k4(j, scales);
                pairs.extend([d * f32::from(sc), -dmin * f32::from(m)]);
                // Sub-blocks 2i and 2i + 1: the low and high nibbles of bytes 32i..32i + 32.
                let (i, shift) = (j / 2, 4 * (j % 2));
                for l in 0..32 {
                    let low = (qs[32 * i + l] >> shift) & 0xF;
                    let high = qh.map_or(0, |h| ((h[l] >> j) & 1) << 4);
                    q[32 * j + l] = low | high;
                }
            }
        }
        GgmlDType::Q6K => {
            let (ql, qh, sc, d) = (&b[0..128], &b[128..192], &b[192..208], half(b, 208));
            for &s in sc {
                let s = d * f32::from(s as i8);
                pairs.extend([s, -32.0 * s]);
            }
            for n in 0..2 {
                let (ql, qh, q) = (&ql[64 * n..], &qh[32 * n..], &mut q[128 * n..]);
                for l in 0..32 {
                    q[l] = (ql[l] & 0xF) | ((qh[l] & 3) << 4);
                    q[l + 32] = (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4);
                    q[l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
                    q[l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
                }
            }
        }
        _ => unreachable!("block_shape admits only the types above"),
    }
}

/// The 6-bit (scale, min) of sub-block `j` of a Q4_K or Q5_K block's 12 scale bytes.
fn scale_min_k4(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

#[cfg(test)]
#[path = "tests_gguf_affine.rs"]
mod tests;
