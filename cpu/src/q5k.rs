//! GGUF's Q5_K interleaved 8 rows by 8 for the 8-row kernel: Q4_K's super-block of 8
//! sub-blocks of 32 with 6-bit scales and offsets, and a fifth bit a weight.

use half::f16;

use super::act_k::ActK;
use super::blocks::BLOCK;
use super::fives::Packed5;
use super::q4k::k4_scales;

/// One Q5_K super-block index of 8 consecutive rows: weight `i` of sub-block `j` of row `r` is
/// `d[r] · sc[r] · q − dmin[r] · m[r]` of `j[j]`, `q` in 0..=31 laid out as [`Packed5`] lays
/// out a block. 5.6 bits a weight, against Q5_K's 5.5.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Q5K8 {
    /// Super-block scales of the 8 rows.
    pub d: [f16; 8],
    /// Super-block offset scales of the 8 rows.
    pub dmin: [f16; 8],
    /// The sub-blocks, each contiguous.
    pub j: [Q5Part; 8],
}

/// One sub-block of a [`Q5K8`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Q5Part {
    /// `sc[r]`: the scale in row `r` (6 bits).
    pub sc: [u8; 8],
    /// `m[r]`: the offset in row `r` (6 bits).
    pub m: [u8; 8],
    /// The values.
    pub q: Packed5,
}

/// Bytes of one GGUF Q5_K super-block (d, dmin, 12 bytes of scales, 32 of fifth bits, 128 of
/// nibbles).
pub const Q5K_BYTES: usize = 176;

/// One row's Q5_K super-block, unpacked.
struct Q5kRow {
    d: f16,
    dmin: f16,
    /// Each sub-block's 6-bit `(sc, m)`.
    scales: [(u8, u8); 8],
    /// Each sub-block's 32 values, 0..=31.
    values: [[u8; 32]; 8],
}

/// One GGUF Q5_K super-block. Sub-block `j` takes the low (`j` even) or high nibbles of
/// `qs[32 (j / 2)..][..32]` and bit `j` of the 32 `qh` bytes.
fn q5k_row(b: &[u8]) -> Q5kRow {
    let (qh, qs) = (&b[16..48], &b[48..176]);
    let values = std::array::from_fn(|j| {
        std::array::from_fn(|l| {
            let low = qs[32 * (j / 2) + l] >> (4 * (j % 2)) & 0x0F;
            low | (qh[l] >> j & 1) << 4
        })
    });
    Q5kRow {
        d: f16::from_le_bytes([b[0], b[1]]),
        dmin: f16::from_le_bytes([b[2], b[3]]),
        scales: k4_scales(&b[4..16]),
        values,
    }
}

impl Q5K8 {
    /// Interleaves GGUF Q5_K bytes of 8 rows of `blocks` super-blocks each (row-major).
    pub fn interleave(bytes: &[u8], blocks: usize) -> Vec<Q5K8> {
        assert_eq!(bytes.len(), 8 * blocks * Q5K_BYTES);
        (0..blocks)
            .map(|b| {
                let rows: [_; 8] = std::array::from_fn(|r| {
                    q5k_row(&bytes[(r * blocks + b) * Q5K_BYTES..][..Q5K_BYTES])
                });
                Q5K8 {
                    d: std::array::from_fn(|r| rows[r].d),
                    dmin: std::array::from_fn(|r| rows[r].dmin),
                    j: std::array::from_fn(|j| Q5Part {
                        sc: std::array::from_fn(|r| rows[r].scales[j].0),
                        m: std::array::from_fn(|r| rows[r].scales[j].1),
                        q: Packed5::pack(std::array::from_fn(|r| &rows[r].values[j])),
                    }),
                }
            })
            .collect()
    }

    /// Row `r`'s exact scale of sub-block `j`: `d · sc`.
    pub fn scale(&self, r: usize, j: usize) -> f32 {
        self.d[r].to_f32() * self.j[j].sc[r] as f32
    }

    /// Row `r`'s exact offset of sub-block `j`, to subtract: `dmin · m`.
    pub fn offset(&self, r: usize, j: usize) -> f32 {
        self.dmin[r].to_f32() * self.j[j].m[r] as f32
    }

    /// Row `r`'s weight `i` (0..256) of this super-block, as GGML dequantizes it.
    pub fn weight(&self, r: usize, i: usize) -> f32 {
        let j = i / BLOCK;
        self.scale(r, j) * self.j[j].q.q(r, i % BLOCK) as f32 - self.offset(r, j)
    }
}

/// Scalar reference: the 8 rows of `w` (one group, all its super-blocks) against one activation
/// row (one activation super-block a super-block): per super-block `d · d_a Σ_j sc_j Σ q a −
/// dmin · d_a Σ_j m_j Σ a`, the sums exact in integers.
pub fn dot_q5k8_scalar(w: &[Q5K8], a: &[ActK]) -> [f32; 8] {
    std::array::from_fn(|r| {
        let mut total = 0f32;
        for (g, act) in w.iter().zip(a) {
            let (mut sums, mut offsets) = (0i32, 0i32);
            for j in 0..8 {
                let sum: i32 = (0..BLOCK)
                    .map(|i| g.j[j].q.q(r, i) as i32 * act.qs[BLOCK * j + i] as i32)
                    .sum();
                sums += g.j[j].sc[r] as i32 * sum;
                offsets += g.j[j].m[r] as i32 * act.sums32[j] as i32;
            }
            total +=
                g.d[r].to_f32() * act.d * sums as f32 - g.dmin[r].to_f32() * act.d * offsets as f32;
        }
        total
    })
}
