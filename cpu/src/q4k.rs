//! GGUF's Q4_K interleaved 8 rows by 8 for the 8-row kernel: 256 weights a super-block, in 8
//! sub-blocks of 32 with 6-bit scales and offsets.

use half::f16;

use super::act_k::ActK;
use super::blocks::{BLOCK, Nibbles};

/// One Q4_K super-block index (256 weights a row: 8 sub-blocks of 32) of 8 consecutive rows,
/// interleaved like [`Nibbles8`](super::blocks::Nibbles8): weight `i` of sub-block `j` of row `r` is
/// `d[r] · sc[r] · q − dmin[r] · m[r]` of `j[j]`, with `q` laid out in its `qs` as a `Nibbles8` lays
/// out its block. GGUF's 6-bit packed scales are unpacked to bytes (4.6 bits a weight, against
/// Q4_K's 4.5).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Q4K8 {
    /// Super-block scales of the 8 rows.
    pub d: [f16; 8],
    /// Super-block offset scales of the 8 rows.
    pub dmin: [f16; 8],
    /// The sub-blocks, each contiguous (the order the kernel reads them in: one stream of
    /// bytes, which the hardware prefetcher follows better than three).
    pub j: [Q4Part; 8],
}

/// One sub-block of a [`Q4K8`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Q4Part {
    /// `sc[r]`: the scale in row `r` (6 bits).
    pub sc: [u8; 8],
    /// `m[r]`: the offset in row `r` (6 bits).
    pub m: [u8; 8],
    /// The values, interleaved as in [`Nibbles8::qs`](super::blocks::Nibbles8::qs).
    pub qs: [[u8; 32]; 4],
}

/// One row's Q4_K super-block, unpacked.
struct Q4kRow {
    d: f16,
    dmin: f16,
    /// Each sub-block's 6-bit `(sc, m)`.
    scales: [(u8, u8); 8],
    /// Each sub-block's values in the [`Nibbles`] packing (byte `i`: value `i` low, `i + 16`
    /// high).
    subs: [[u8; 16]; 8],
}

/// The 8 sub-blocks' 6-bit `(sc, m)` from the 12 packed bytes Q4_K and Q5_K share.
pub(crate) fn k4_scales(s: &[u8]) -> [(u8, u8); 8] {
    std::array::from_fn(|j| {
        if j < 4 {
            (s[j] & 63, s[j + 4] & 63)
        } else {
            (
                (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4),
                (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
            )
        }
    })
}

/// GGUF's Q4_K super-block (144 bytes: d, dmin, 12 bytes of 6-bit scales, 128 of nibbles).
fn q4k_sub_blocks(b: &[u8]) -> Q4kRow {
    let d = f16::from_le_bytes([b[0], b[1]]);
    let dmin = f16::from_le_bytes([b[2], b[3]]);
    let q = &b[16..144];
    let mut subs = [[0u8; 16]; 8];
    for c in 0..4 {
        let chunk = &q[32 * c..32 * c + 32];
        for i in 0..16 {
            subs[2 * c][i] = (chunk[i] & 15) | ((chunk[i + 16] & 15) << 4);
            subs[2 * c + 1][i] = (chunk[i] >> 4) | ((chunk[i + 16] >> 4) << 4);
        }
    }
    Q4kRow {
        d,
        dmin,
        scales: k4_scales(&b[4..16]),
        subs,
    }
}

impl Q4K8 {
    /// Interleaves GGUF Q4_K bytes of 8 rows of `blocks` super-blocks each (row-major).
    pub fn interleave(bytes: &[u8], blocks: usize) -> Vec<Q4K8> {
        assert_eq!(bytes.len(), 8 * blocks * 144);
        (0..blocks)
            .map(|b| {
                let rows: [_; 8] = std::array::from_fn(|r| {
                    q4k_sub_blocks(&bytes[(r * blocks + b) * 144..][..144])
                });
                let mut out = Q4K8 {
                    d: std::array::from_fn(|r| rows[r].d),
                    dmin: std::array::from_fn(|r| rows[r].dmin),
                    j: [Q4Part {
                        sc: [0; 8],
                        m: [0; 8],
                        qs: [[0; 32]; 4],
                    }; 8],
                };
                for (r, row) in rows.iter().enumerate() {
                    let (scales, subs) = (&row.scales, &row.subs);
                    for j in 0..8 {
                        (out.j[j].sc[r], out.j[j].m[r]) = scales[j];
                        for c in 0..4 {
                            out.j[j].qs[c][4 * r..4 * r + 4]
                                .copy_from_slice(&subs[j][4 * c..4 * c + 4]);
                        }
                    }
                }
                out
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
        let q = self.sub_block(r, j).q(i % BLOCK);
        self.scale(r, j) * q as f32 - self.offset(r, j)
    }

    /// Row `r`'s sub-block `j` as a plain 4-bit block (its scales rounded to f16; for the
    /// scalar reference and tests).
    pub fn sub_block(&self, r: usize, j: usize) -> Nibbles {
        let mut qs = [0u8; 16];
        for c in 0..4 {
            qs[4 * c..4 * c + 4].copy_from_slice(&self.j[j].qs[c][4 * r..4 * r + 4]);
        }
        Nibbles {
            d: f16::from_f32(self.scale(r, j)),
            m: f16::from_f32(-self.offset(r, j)),
            qs,
        }
    }
}

/// Scalar reference: the 8 rows of `w` (one group, all its super-blocks) against one activation
/// row (one activation super-block a super-block): per super-block `d · d_a Σ_j sc_j Σ q a −
/// dmin · d_a Σ_j m_j Σ a`, the sums exact in integers.
pub fn dot_q4k8_scalar(w: &[Q4K8], a: &[ActK]) -> [f32; 8] {
    std::array::from_fn(|r| {
        let mut total = 0f32;
        for (g, act) in w.iter().zip(a) {
            let (mut sums, mut offsets) = (0i32, 0i32);
            for j in 0..8 {
                let sub = g.sub_block(r, j);
                let sum: i32 = (0..BLOCK)
                    .map(|i| sub.q(i) as i32 * act.qs[BLOCK * j + i] as i32)
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
