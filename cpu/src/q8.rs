//! GGUF's Q8_0 interleaved 8 rows by 8 for the 8-row kernel: 32 signed bytes a block and one f16
//! scale, weight `j` = `d · q[j]`.

use half::f16;

use super::blocks::{Act, BLOCK};

/// One block index of 8 consecutive Q8_0 rows: chunk `c` holds, at bytes `4r..4r + 4`, row `r`'s
/// weights `4c..4c + 4`. One 32-byte load gives 4 weights of each of the 8 rows, to multiply by
/// the same 4 activations. 8.5 bits a weight, as Q8_0.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bytes8 {
    /// Scales of the 8 rows.
    pub d: [f16; 8],
    /// Signed values, interleaved.
    pub qs: [[i8; 32]; 8],
}

/// Bytes of one GGUF Q8_0 block (d, 32 signed bytes).
pub const Q8_0_BYTES: usize = 34;

impl Bytes8 {
    /// Interleaves GGUF Q8_0 bytes of 8 rows of `blocks` blocks each (row-major).
    pub fn interleave(bytes: &[u8], blocks: usize) -> Vec<Bytes8> {
        assert_eq!(bytes.len(), 8 * blocks * Q8_0_BYTES);
        (0..blocks)
            .map(|b| {
                let block = |r: usize| &bytes[(r * blocks + b) * Q8_0_BYTES..][..Q8_0_BYTES];
                let mut qs = [[0i8; 32]; 8];
                for (c, chunk) in qs.iter_mut().enumerate() {
                    for r in 0..8 {
                        for t in 0..4 {
                            chunk[4 * r + t] = block(r)[2 + 4 * c + t] as i8;
                        }
                    }
                }
                Bytes8 {
                    d: std::array::from_fn(|r| f16::from_le_bytes([block(r)[0], block(r)[1]])),
                    qs,
                }
            })
            .collect()
    }

    /// Row `r`'s value `j`.
    pub fn q(&self, r: usize, j: usize) -> i8 {
        self.qs[j / 4][4 * r + j % 4]
    }

    /// Row `r`'s weight `j`, as GGML dequantizes it.
    pub fn weight(&self, r: usize, j: usize) -> f32 {
        self.d[r].to_f32() * self.q(r, j) as f32
    }
}

/// Scalar reference: the 8 rows of `w` (one group, all its blocks) against one activation row.
pub fn dot_bytes8_scalar(w: &[Bytes8], a: &[Act]) -> [f32; 8] {
    std::array::from_fn(|r| {
        w.iter()
            .zip(a)
            .map(|(g, act)| {
                let sum: i32 = (0..BLOCK)
                    .map(|j| g.q(r, j) as i32 * act.qs[j] as i32)
                    .sum();
                g.d[r].to_f32() * act.d * sum as f32
            })
            .sum()
    })
}
