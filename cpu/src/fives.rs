//! GGUF's 5-bit formats, Q5_0 and Q5_1, interleaved 8 rows by 8 for the 8-row kernel, and the
//! layout of 5-bit values that Q5_K shares with them.
//!
//! A block holds 32 weights `d · q + m` with `q` in 0..=31: Q5_1 stores `m`, Q5_0's values are
//! centred on 16 (`m = −16 d`, exact in f16). The low 4 bits lie as in
//! [`Nibbles8`](super::blocks::Nibbles8), the fifth bits in one more 32-byte vector: bit `c` of
//! its byte `4r + t` is the fifth bit of the weight that byte `4r + t` of chunk `c` holds (chunks
//! 0..4 are the low nibbles of `qs[c]`: weights `4c + t`; chunks 4..8 the high nibbles of
//! `qs[c − 4]`: weights `16 + 4(c − 4) + t`). 5.75 bits a weight for Q5_1, 5.5 + 0.25 for Q5_0.

use half::f16;

use super::blocks::{Act, BLOCK};

/// The 5-bit values of 8 rows of one block of 32, interleaved.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Packed5 {
    /// Low 4 bits, as [`Nibbles8::qs`](super::blocks::Nibbles8::qs).
    pub qs: [[u8; 32]; 4],
    /// Fifth bits: bit `c` for chunk `c`.
    pub qh: [u8; 32],
}

impl Packed5 {
    /// Packs 32 values (0..=31) of each of 8 rows.
    pub fn pack(rows: [&[u8; 32]; 8]) -> Packed5 {
        let mut out = Packed5 {
            qs: [[0; 32]; 4],
            qh: [0; 32],
        };
        for (r, values) in rows.iter().enumerate() {
            for (j, &v) in values.iter().enumerate() {
                let (half, c, t) = (j / 16, j % 16 / 4, j % 4);
                out.qs[c][4 * r + t] |= (v & 0x0F) << (4 * half);
                out.qh[4 * r + t] |= (v >> 4 & 1) << (c + 4 * half);
            }
        }
        out
    }

    /// Row `r`'s value `j`.
    pub fn q(&self, r: usize, j: usize) -> u8 {
        let (half, c, t) = (j / 16, j % 16 / 4, j % 4);
        let low = self.qs[c][4 * r + t] >> (4 * half) & 0x0F;
        let high = self.qh[4 * r + t] >> (c + 4 * half) & 1;
        low | high << 4
    }
}

/// One row's block of a 5-bit format, parsed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Five {
    /// Scale.
    pub d: f16,
    /// Offset.
    pub m: f16,
    /// Values, 0..=31.
    pub q: [u8; 32],
}

/// The values of a GGUF 5-bit block from its fifth bits `qh` (little-endian u32, bit `j` for
/// weight `j`) and nibbles `qs` (weight `j` in byte `j % 16`, low half first).
fn values(qh: &[u8], qs: &[u8]) -> [u8; 32] {
    let high = u32::from_le_bytes(qh.try_into().expect("4 bytes"));
    std::array::from_fn(|j| (qs[j % 16] >> (4 * (j / 16)) & 0x0F) | ((high >> j & 1) as u8) << 4)
}

impl Five {
    /// Parses GGUF `Q5_0` blocks (22 bytes: d, 4 bytes of fifth bits, 16 of nibbles), or `None`
    /// when an offset `−16 d` overflows f16.
    pub fn parse_q5_0(bytes: &[u8]) -> Option<Vec<Five>> {
        bytes
            .chunks_exact(22)
            .map(|b| {
                let d = f16::from_le_bytes([b[0], b[1]]);
                let m = f16::from_f32(-16.0 * d.to_f32());
                m.is_finite().then(|| Five {
                    d,
                    m,
                    q: values(&b[2..6], &b[6..22]),
                })
            })
            .collect()
    }

    /// Parses GGUF `Q5_1` blocks (24 bytes: d, m, 4 bytes of fifth bits, 16 of nibbles).
    pub fn parse_q5_1(bytes: &[u8]) -> Vec<Five> {
        bytes
            .chunks_exact(24)
            .map(|b| Five {
                d: f16::from_le_bytes([b[0], b[1]]),
                m: f16::from_le_bytes([b[2], b[3]]),
                q: values(&b[4..8], &b[8..24]),
            })
            .collect()
    }
}

/// One block index of 8 consecutive rows of a 5-bit format.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fives8 {
    /// Scales of the 8 rows.
    pub d: [f16; 8],
    /// Offsets of the 8 rows.
    pub m: [f16; 8],
    /// The values.
    pub q: Packed5,
}

impl Fives8 {
    /// Interleaves `rows` (8 rows of `blocks` blocks each, row-major) by block index.
    pub fn interleave(rows: &[Five], blocks: usize) -> Vec<Fives8> {
        assert_eq!(rows.len(), 8 * blocks);
        (0..blocks)
            .map(|b| {
                let block = |r: usize| &rows[r * blocks + b];
                Fives8 {
                    d: std::array::from_fn(|r| block(r).d),
                    m: std::array::from_fn(|r| block(r).m),
                    q: Packed5::pack(std::array::from_fn(|r| &block(r).q)),
                }
            })
            .collect()
    }

    /// Row `r`'s weight `j`, as GGML dequantizes it.
    pub fn weight(&self, r: usize, j: usize) -> f32 {
        self.d[r].to_f32() * self.q.q(r, j) as f32 + self.m[r].to_f32()
    }
}

/// Scalar reference: the 8 rows of `w` (one group, all its blocks) against one activation row.
pub fn dot_fives8_scalar(w: &[Fives8], a: &[Act]) -> [f32; 8] {
    std::array::from_fn(|r| {
        w.iter()
            .zip(a)
            .map(|(g, act)| {
                let sum: i32 = (0..BLOCK)
                    .map(|j| g.q.q(r, j) as i32 * act.qs[j] as i32)
                    .sum();
                g.d[r].to_f32() * act.d * sum as f32 + g.m[r].to_f32() * act.s
            })
            .sum()
    })
}
