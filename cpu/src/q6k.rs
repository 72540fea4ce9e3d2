//! GGUF's Q6_K interleaved 8 rows by 8, as [`Q4K8`](super::q4k::Q4K8) interleaves Q4_K, so
//! that the 8-row kernel multiplies it into a tile of activation rows.
//!
//! A Q6_K super-block holds 256 weights of 6 bits, `q` in 0..=63, in 16 sub-blocks of 16 with a
//! signed 8-bit scale each: weight `i` is `d · sc[i / 16] · (q − 32)`. The values stay unsigned
//! here (the form `vpmaddubsw` multiplies), and the `− 32` is paid once per activation half-block
//! from the activations' 16-sums ([`ActK::sums16`]):
//! `Σ sc (q − 32) a = Σ sc (Σ q a − 32 Σ a)`.

use half::f16;

use super::act_k::{ActK, SUPER};

/// One Q6_K super-block index of 8 consecutive rows. For activation block `k` (weights
/// `32k..32k + 32` of the super-block), the low 4 bits of the values lie in `k[k].ql` as
/// [`Nibbles8::qs`](super::blocks::Nibbles8::qs) lays out a block, and the high 2 bits in
/// `k[k].qh`: bits `2c..2c + 2` of `qh[h]` byte `4r + t` are the high bits of the block's weight
/// `16h + 4c + t` of row `r`. 6.56 bits a weight, as Q6_K.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Q6K8 {
    /// Super-block scales of the 8 rows.
    pub d: [f16; 8],
    /// The activation blocks' parts, each contiguous, in the order the kernel reads them.
    pub k: [Q6Part; 8],
}

/// The weights of one activation block in a [`Q6K8`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Q6Part {
    /// `sc[2r + h]`: the scale of the block's weights `16h..16h + 16` of row `r`.
    pub sc: [i8; 16],
    /// Low 4 bits, interleaved.
    pub ql: [[u8; 32]; 4],
    /// High 2 bits, interleaved.
    pub qh: [[u8; 32]; 2],
}

/// Bytes of one GGUF Q6_K super-block (`ql[128]`, `qh[64]`, `scales[16]`, `d`).
pub const Q6K_BYTES: usize = 210;

/// One GGUF Q6_K super-block: its scale, 16 sub-block scales and 256 unsigned 6-bit values.
fn q6k_values(b: &[u8]) -> (f16, [i8; 16], [u8; 256]) {
    let (ql, qh, sc) = (&b[..128], &b[128..192], &b[192..208]);
    let q = std::array::from_fn(|i| {
        // Halves of 128; in each, quarters of 32 take the low then high nibbles of two runs of
        // 32 `ql` bytes, and successive bit pairs of the same 32 `qh` bytes.
        let (half, quarter, l) = (i / 128, i % 128 / 32, i % 32);
        let low = ql[64 * half + 32 * (quarter % 2) + l] >> (4 * (quarter / 2)) & 0x0F;
        let high = qh[32 * half + l] >> (2 * quarter) & 3;
        low | high << 4
    });
    (
        f16::from_le_bytes([b[208], b[209]]),
        std::array::from_fn(|j| sc[j] as i8),
        q,
    )
}

impl Q6K8 {
    /// Interleaves GGUF Q6_K bytes of 8 rows of `blocks` super-blocks each (row-major).
    pub fn interleave(bytes: &[u8], blocks: usize) -> Vec<Q6K8> {
        assert_eq!(bytes.len(), 8 * blocks * Q6K_BYTES);
        (0..blocks)
            .map(|b| {
                let rows: [_; 8] = std::array::from_fn(|r| {
                    q6k_values(&bytes[(r * blocks + b) * Q6K_BYTES..][..Q6K_BYTES])
                });
                let mut out = Q6K8 {
                    d: rows.map(|(d, _, _)| d),
                    k: [Q6Part {
                        sc: [0; 16],
                        ql: [[0; 32]; 4],
                        qh: [[0; 32]; 2],
                    }; 8],
                };
                for (r, (_, sc, q)) in rows.iter().enumerate() {
                    for k in 0..8 {
                        out.k[k].sc[2 * r] = sc[2 * k];
                        out.k[k].sc[2 * r + 1] = sc[2 * k + 1];
                        for (i, &v) in q[32 * k..32 * k + 32].iter().enumerate() {
                            let (h, c, t) = (i / 16, i % 16 / 4, i % 4);
                            out.k[k].ql[c][4 * r + t] |= (v & 0x0F) << (4 * h);
                            out.k[k].qh[h][4 * r + t] |= (v >> 4) << (2 * c);
                        }
                    }
                }
                out
            })
            .collect()
    }

    /// Row `r`'s unsigned 6-bit value of weight `i` (0..256) of this super-block.
    pub fn q(&self, r: usize, i: usize) -> u8 {
        let (k, h, c, t) = (i / 32, i % 32 / 16, i % 16 / 4, i % 4);
        let low = self.k[k].ql[c][4 * r + t] >> (4 * h) & 0x0F;
        let high = self.k[k].qh[h][4 * r + t] >> (2 * c) & 3;
        low | high << 4
    }

    /// Row `r`'s scale of weight `i`.
    pub fn sc(&self, r: usize, i: usize) -> i8 {
        self.k[i / 32].sc[2 * r + i % 32 / 16]
    }

    /// Row `r`'s weight `i`, as GGML dequantizes it.
    pub fn weight(&self, r: usize, i: usize) -> f32 {
        self.d[r].to_f32() * self.sc(r, i) as f32 * (self.q(r, i) as i32 - 32) as f32
    }
}

/// Scalar reference: the 8 rows of `w` (one group, all its super-blocks) against one activation
/// row (one activation super-block a super-block), one exact integer sum per super-block.
pub fn dot_q6k8_scalar(w: &[Q6K8], a: &[ActK]) -> [f32; 8] {
    std::array::from_fn(|r| {
        let mut total = 0f32;
        for (g, act) in w.iter().zip(a) {
            let sum: i32 = (0..SUPER)
                .map(|j| g.sc(r, j) as i32 * (g.q(r, j) as i32 - 32) * act.qs[j] as i32)
                .sum();
            total += g.d[r].to_f32() * act.d * sum as f32;
        }
        total
    })
}
