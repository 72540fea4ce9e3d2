//! GGUF's non-linear 4-bit types, interleaved 8 rows by 8 for the 8-row kernels. A 4-bit code
//! picks one of 16 signed bytes ([`IQ4_VALUES`], denser near zero than a linear grid), times the
//! scales:
//! - IQ4_NL: blocks of 32 weights with one f16 scale `d` (18 bytes);
//! - IQ4_XS: super-blocks of 256 with one f16 `d` and a 6-bit scale `ls` per 32, weight
//!   `d · (ls − 32) · value` (136 bytes).
//!
//! Both store a block's codes as Q4_0 does (byte `i`: code `i` low, code `i + 16` high), so the
//! interleaving is [`Nibbles8`](super::blocks::Nibbles8)'s.

use half::f16;

use super::act_k::ActK;
use super::blocks::{Act, BLOCK};

/// The 16 values a code stands for (ggml's `kvalues_iq4nl`).
pub const IQ4_VALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// The two types, by their ggml type ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Iq4Type {
    /// IQ4_NL (ggml type 20).
    Nl,
    /// IQ4_XS (ggml type 23).
    Xs,
}

impl Iq4Type {
    /// The type of ggml type id `id`, if it is one of the two.
    pub fn from_ggml_id(id: u32) -> Option<Self> {
        match id {
            20 => Some(Iq4Type::Nl),
            23 => Some(Iq4Type::Xs),
            _ => None,
        }
    }

    /// GGUF's name of the type.
    pub fn name(self) -> &'static str {
        match self {
            Iq4Type::Nl => "IQ4_NL",
            Iq4Type::Xs => "IQ4_XS",
        }
    }

    /// Weights a block.
    pub fn block(self) -> usize {
        match self {
            Iq4Type::Nl => 32,
            Iq4Type::Xs => 256,
        }
    }

    /// Bytes a block.
    pub fn block_bytes(self) -> usize {
        match self {
            Iq4Type::Nl => 18,
            Iq4Type::Xs => 136,
        }
    }

    /// Bytes of `values` weights (a multiple of [`Iq4Type::block`]), or `None`.
    pub fn bytes_of(self, values: usize) -> Option<usize> {
        values
            .is_multiple_of(self.block())
            .then(|| values / self.block() * self.block_bytes())
    }
}

/// The weights of GGUF `ty` blocks `bytes`, as ggml dequantizes them, appended to `out`.
pub fn dequantize(ty: Iq4Type, bytes: &[u8], out: &mut Vec<f32>) {
    let value = |code: u8| IQ4_VALUES[code as usize] as f32;
    let sub_block = |scale: f32, qs: &[u8], out: &mut Vec<f32>| {
        out.extend(qs.iter().map(|&b| scale * value(b & 15)));
        out.extend(qs.iter().map(|&b| scale * value(b >> 4)));
    };
    for b in bytes.chunks_exact(ty.block_bytes()) {
        let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
        match ty {
            Iq4Type::Nl => sub_block(d, &b[2..18], out),
            Iq4Type::Xs => {
                let scales = xs_scales(b);
                for (j, sc) in scales.into_iter().enumerate() {
                    sub_block(d * sc as f32, &b[8 + 16 * j..][..16], out);
                }
            }
        }
    }
}

/// An IQ4_XS super-block's 8 scales `ls − 32` (6 bits each: low 4 in `scales_l`, high 2 in
/// `scales_h`).
fn xs_scales(b: &[u8]) -> [i8; 8] {
    let high = u16::from_le_bytes([b[2], b[3]]);
    std::array::from_fn(|j| {
        let low = (b[4 + j / 2] >> (4 * (j % 2))) & 15;
        let ls = low | ((((high >> (2 * j)) & 3) as u8) << 4);
        ls as i8 - 32
    })
}

/// Interleaves the 16 code bytes of 8 rows' blocks (`row(r)`) as
/// [`Nibbles8::qs`](super::blocks::Nibbles8::qs).
fn interleave_codes<'a>(row: impl Fn(usize) -> &'a [u8]) -> [[u8; 32]; 4] {
    let mut qs = [[0u8; 32]; 4];
    for (c, chunk) in qs.iter_mut().enumerate() {
        for r in 0..8 {
            chunk[4 * r..4 * r + 4].copy_from_slice(&row(r)[4 * c..4 * c + 4]);
        }
    }
    qs
}

/// Row `r`'s code `j` (0..32) of interleaved codes.
fn code(qs: &[[u8; 32]; 4], r: usize, j: usize) -> u8 {
    (qs[(j % 16) / 4][4 * r + j % 4] >> (4 * (j / 16))) & 15
}

/// One IQ4_NL block index of 8 consecutive rows.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Iq4Nl8 {
    /// Scales of the 8 rows.
    pub d: [f16; 8],
    /// The codes, interleaved.
    pub qs: [[u8; 32]; 4],
}

impl Iq4Nl8 {
    /// Interleaves GGUF IQ4_NL bytes of 8 rows of `blocks` blocks each (row-major).
    pub fn interleave(bytes: &[u8], blocks: usize) -> Vec<Iq4Nl8> {
        const B: usize = 18;
        assert_eq!(bytes.len(), 8 * blocks * B);
        (0..blocks)
            .map(|b| {
                let block = |r: usize| &bytes[(r * blocks + b) * B..][..B];
                Iq4Nl8 {
                    d: std::array::from_fn(|r| f16::from_le_bytes([block(r)[0], block(r)[1]])),
                    qs: interleave_codes(|r| &block(r)[2..]),
                }
            })
            .collect()
    }

    /// Row `r`'s value (of [`IQ4_VALUES`]) `j`.
    pub fn value(&self, r: usize, j: usize) -> i8 {
        IQ4_VALUES[code(&self.qs, r, j) as usize]
    }

    /// Row `r`'s weight `j`, as ggml dequantizes it.
    pub fn weight(&self, r: usize, j: usize) -> f32 {
        self.d[r].to_f32() * self.value(r, j) as f32
    }
}

/// One IQ4_XS super-block index (256 weights a row) of 8 consecutive rows: the scale `d` of each
/// row, then the 8 sub-blocks of 32, each with its rows' scales `ls − 32` (a byte each, 4.3 bits a
/// weight against IQ4_XS's 4.25) and codes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Iq4Xs8 {
    /// Super-block scales of the 8 rows.
    pub d: [f16; 8],
    /// The sub-blocks.
    pub j: [Iq4XsPart; 8],
}

/// One sub-block of an [`Iq4Xs8`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Iq4XsPart {
    /// Row `r`'s scale `ls − 32` (−32..=31).
    pub sc: [i8; 8],
    /// The codes, interleaved.
    pub qs: [[u8; 32]; 4],
}

impl Iq4Xs8 {
    /// Interleaves GGUF IQ4_XS bytes of 8 rows of `blocks` super-blocks each (row-major).
    pub fn interleave(bytes: &[u8], blocks: usize) -> Vec<Iq4Xs8> {
        const B: usize = 136;
        assert_eq!(bytes.len(), 8 * blocks * B);
        (0..blocks)
            .map(|b| {
                let block = |r: usize| &bytes[(r * blocks + b) * B..][..B];
                let scales: [[i8; 8]; 8] = std::array::from_fn(|r| xs_scales(block(r)));
                Iq4Xs8 {
                    d: std::array::from_fn(|r| f16::from_le_bytes([block(r)[0], block(r)[1]])),
                    j: std::array::from_fn(|j| Iq4XsPart {
                        sc: std::array::from_fn(|r| scales[r][j]),
                        qs: interleave_codes(|r| &block(r)[8 + 16 * j..][..16]),
                    }),
                }
            })
            .collect()
    }

    /// Row `r`'s exact scale of sub-block `j`: `d · (ls − 32)`.
    pub fn scale(&self, r: usize, j: usize) -> f32 {
        self.d[r].to_f32() * self.j[j].sc[r] as f32
    }

    /// Row `r`'s weight `i` (0..256) of this super-block, as ggml dequantizes it.
    pub fn weight(&self, r: usize, i: usize) -> f32 {
        let (j, k) = (i / BLOCK, i % BLOCK);
        self.scale(r, j) * IQ4_VALUES[code(&self.j[j].qs, r, k) as usize] as f32
    }
}

/// Row `r`'s integer dot product of codes `qs` with activation block `a`.
fn codes_dot(qs: &[[u8; 32]; 4], r: usize, a: &Act) -> i32 {
    (0..BLOCK)
        .map(|j| IQ4_VALUES[code(qs, r, j) as usize] as i32 * a.qs[j] as i32)
        .sum()
}

/// Scalar reference: the 8 rows of `w` (one group, all its blocks) against one activation row.
pub fn dot_iq4nl8_scalar(w: &[Iq4Nl8], a: &[Act]) -> [f32; 8] {
    std::array::from_fn(|r| {
        w.iter()
            .zip(a)
            .map(|(g, act)| g.d[r].to_f32() * act.d * codes_dot(&g.qs, r, act) as f32)
            .sum()
    })
}

/// Scalar reference: the 8 rows of `w` (one group, all its super-blocks) against one activation
/// row (one activation super-block a super-block), one exact integer sum a super-block.
pub fn dot_iq4xs8_scalar(w: &[Iq4Xs8], a: &[ActK]) -> [f32; 8] {
    std::array::from_fn(|r| {
        let mut total = 0f32;
        for (g, act) in w.iter().zip(a) {
            let sum: i32 = (0..8)
                .map(|j| {
                    let dot: i32 = (0..BLOCK)
                        .map(|i| {
                            let value = IQ4_VALUES[code(&g.j[j].qs, r, i) as usize] as i32;
                            value * act.sub(j)[i] as i32
                        })
                        .sum();
                    g.j[j].sc[r] as i32 * dot
                })
                .sum();
            total += g.d[r].to_f32() * act.d * sum as f32;
        }
        total
    })
}
