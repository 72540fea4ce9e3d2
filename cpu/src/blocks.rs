//! GGUF's 4-bit blocks (Q4_0, Q4_1) as the CPU kernels read them, activations quantized to 8
//! bits, and the scalar reference dot products that the SIMD kernels are tested against.
//!
//! A block holds 32 weights with one scale `d` and an offset `m`: weight `j` of a block is
//! `d * q[j] + m`. Activations are quantized the same way, 32 at a
//! time, to `d * q[j]` with `q` in -127..=127, so a block's dot product is one integer sum:
//! `Σ (d_w q_w + m_w)(d_a q_a) = d_w d_a Σ q_w q_a + m_w (d_a Σ q_a)`.

use half::f16;

/// Weights (and activations) per block.
pub const BLOCK: usize = 32;

/// 32 weights of 4 bits: GGUF's `Q4_1` as is, and `Q4_0` with its implicit offset of -8 made an
/// explicit `m = -8 d`. Nibble `j` (low halves first) is `qs[j % 16] >> (4 * (j / 16)) & 15`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Nibbles {
    /// Scale.
    pub d: f16,
    /// Offset.
    pub m: f16,
    /// Packed 4-bit values.
    pub qs: [u8; 16],
}

/// 32 activations quantized to 8 bits, with `s = d Σ q` for the offset term of 4-bit weights
/// and the halves' sums for Q6_K's centring.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Act {
    /// Scale.
    pub d: f32,
    /// `d` times the sum of `qs`.
    pub s: f32,
    /// The sums of `qs[..16]` and `qs[16..]`.
    pub sums: [i16; 2],
    /// Signed values.
    pub qs: [i8; 32],
}

impl Nibbles {
    /// Parses GGUF `Q4_1` blocks (20 bytes: d, m, 16 bytes of nibbles).
    pub fn parse_q4_1(bytes: &[u8]) -> Vec<Nibbles> {
        bytes
            .chunks_exact(20)
            .map(|b| Nibbles {
                d: f16::from_le_bytes([b[0], b[1]]),
                m: f16::from_le_bytes([b[2], b[3]]),
                qs: b[4..20].try_into().expect("16 bytes"),
            })
            .collect()
    }

    /// Parses GGUF `Q4_0` blocks (18 bytes: d, 16 bytes of nibbles centred on 8).
    pub fn parse_q4_0(bytes: &[u8]) -> Vec<Nibbles> {
        bytes
            .chunks_exact(18)
            .map(|b| {
                let d = f16::from_le_bytes([b[0], b[1]]);
                Nibbles {
                    d,
                    // Exact: a power-of-two multiple of an f16.
                    m: f16::from_f32(-8.0 * d.to_f32()),
                    qs: b[2..18].try_into().expect("16 bytes"),
                }
            })
            .collect()
    }

    /// The 4-bit value of weight `j`.
    pub fn q(&self, j: usize) -> u8 {
        (self.qs[j % 16] >> (4 * (j / 16))) & 15
    }
}

/// Quantizes `x` (a multiple of 32 long) to 8-bit blocks, appending them to `out`: with AVX2
/// where the CPU has it, bit for bit [`quantize_row_scalar`].
pub fn quantize_row(x: &[f32], out: &mut Vec<Act>) {
    quantize_row_with(super::kernels::Isa::detect(), x, out)
}

/// [`quantize_row`] with the given instruction set (the scalar one for references).
pub fn quantize_row_with(isa: super::kernels::Isa, x: &[f32], out: &mut Vec<Act>) {
    match isa {
        // SAFETY: `Isa::Avx2` exists only when the CPU has AVX2.
        #[cfg(target_arch = "x86_64")]
        super::kernels::Isa::Avx2 { .. } => unsafe { super::avx2_quantize::quantize_row(x, out) },
        super::kernels::Isa::Scalar => quantize_row_scalar(x, out),
    }
}

/// Scalar reference of [`quantize_row`]: per block of 32, `d` = the largest magnitude / 127, each
/// value `round(x / d)` (half away from zero).
pub fn quantize_row_scalar(x: &[f32], out: &mut Vec<Act>) {
    for chunk in x.chunks_exact(BLOCK) {
        let amax = chunk.iter().fold(0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
        let mut qs = [0i8; 32];
        for (q, &v) in qs.iter_mut().zip(chunk) {
            *q = (v * inv).round() as i8;
        }
        let half = |h: usize| {
            qs[16 * h..16 * h + 16]
                .iter()
                .map(|&q| q as i16)
                .sum::<i16>()
        };
        let sums = [half(0), half(1)];
        out.push(Act {
            d,
            s: d * (sums[0] + sums[1]) as f32,
            sums,
            qs,
        });
    }
}

/// Scalar reference: `Σ_blocks` of one 4-bit weight row against one activation row.
pub fn dot_nibbles_scalar(w: &[Nibbles], a: &[Act]) -> f32 {
    w.iter()
        .zip(a)
        .map(|(w, a)| {
            let sum: i32 = (0..BLOCK).map(|j| w.q(j) as i32 * a.qs[j] as i32).sum();
            w.d.to_f32() * a.d * sum as f32 + w.m.to_f32() * a.s
        })
        .sum()
}

/// The blocks at one block index of 8 consecutive 4-bit rows, interleaved for the 8-row kernel:
/// `qs[c]` holds, at bytes `4r..4r + 4`, row `r`'s packed bytes `4c..4c + 4` (weights `4c + j`
/// in the low nibbles, `16 + 4c + j` in the high ones). One 32-byte load then gives 4 weights of
/// each of the 8 rows, to multiply by the same 4 activations.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Nibbles8 {
    /// Scales of the 8 rows.
    pub d: [f16; 8],
    /// Offsets of the 8 rows.
    pub m: [f16; 8],
    /// Interleaved packed values.
    pub qs: [[u8; 32]; 4],
}

impl Nibbles8 {
    /// Interleaves `rows` (8 rows of `blocks` blocks each, row-major) group by block index:
    /// the result's block `b` holds the rows' blocks `b`.
    pub fn interleave(rows: &[Nibbles], blocks: usize) -> Vec<Nibbles8> {
        assert_eq!(rows.len(), 8 * blocks);
        (0..blocks)
            .map(|b| {
                let block = |r: usize| &rows[r * blocks + b];
                let mut qs = [[0u8; 32]; 4];
                for (c, chunk) in qs.iter_mut().enumerate() {
                    for r in 0..8 {
                        chunk[4 * r..4 * r + 4].copy_from_slice(&block(r).qs[4 * c..4 * c + 4]);
                    }
                }
                Nibbles8 {
                    d: std::array::from_fn(|r| block(r).d),
                    m: std::array::from_fn(|r| block(r).m),
                    qs,
                }
            })
            .collect()
    }

    /// Row `r`'s weight `j`, as GGML dequantizes it.
    pub fn weight(&self, r: usize, j: usize) -> f32 {
        let b = self.row(r);
        b.d.to_f32() * b.q(j) as f32 + b.m.to_f32()
    }

    /// Row `r`'s block, back in the plain layout.
    pub fn row(&self, r: usize) -> Nibbles {
        let mut qs = [0u8; 16];
        for c in 0..4 {
            qs[4 * c..4 * c + 4].copy_from_slice(&self.qs[c][4 * r..4 * r + 4]);
        }
        Nibbles {
            d: self.d[r],
            m: self.m[r],
            qs,
        }
    }
}

/// Scalar reference: the 8 rows of `w` (one group, all its blocks) against one activation row.
pub fn dot_nibbles8_scalar(w: &[Nibbles8], a: &[Act]) -> [f32; 8] {
    std::array::from_fn(|r| {
        let row: Vec<Nibbles> = w.iter().map(|g| g.row(r)).collect();
        dot_nibbles_scalar(&row, a)
    })
}
