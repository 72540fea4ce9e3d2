//! A linear layer's GGUF-quantized weight on the CPU, multiplied without dequantizing: the
//! activations are quantized to 8 bits, and the weight rows are split between the [`Team`].

use candle_core::quantized::GgmlDType;

use super::blocks::{BLOCK, Bytes, Nibbles, Nibbles8, quantize_row};
use super::kernels::{Isa, WeightBlock, dot_groups, dot_range};
use super::kquant::KRows;
use super::q4k::Q4K8;
use super::q6k::Q6K8;
use super::team::Team;

/// The weight's blocks, row after row.
#[derive(Clone, Debug)]
enum Blocks {
    /// 4-bit rows, row after row (when the rows are not a multiple of 8).
    Nibbles(Vec<Nibbles>),
    /// 4-bit rows interleaved 8 by 8: group after group, each group's blocks in order.
    Nibbles8(Vec<Nibbles8>),
    /// 8-bit rows, row after row.
    Bytes(Vec<Bytes>),
    /// Q4_K rows interleaved 8 by 8: group after group, each group's super-blocks in order.
    Q4K8(Vec<Q4K8>),
    /// Q6_K rows interleaved 8 by 8.
    Q6K8(Vec<Q6K8>),
    /// k-quant rows, row after row.
    K(KRows),
}

/// A quantized weight `[rows, cols]` (`rows` outputs of `cols` inputs each).
#[derive(Clone, Debug)]
pub struct QLinear {
    rows: usize,
    cols: usize,
    blocks: Blocks,
}

/// Where every member of the team writes its rows of the output.
struct Out(*mut f32);
// SAFETY: members write disjoint elements (their own weight rows), and the buffer outlives the
// job (`Team::run` returns after every member has).
unsafe impl Sync for Out {}

impl Out {
    /// Writes `v` at `index`.
    ///
    /// # Safety
    /// `index` is inside the buffer, and no other thread writes or reads it during the job.
    unsafe fn write(&self, index: usize, v: f32) {
        // SAFETY: the caller's promise.
        unsafe { *self.0.add(index) = v };
    }
}

impl QLinear {
    /// Whether the kernels take GGUF tensors of `dtype`.
    pub fn supports(dtype: GgmlDType) -> bool {
        use GgmlDType::*;
        matches!(dtype, Q4_0 | Q4_1 | Q8_0 | Q2K | Q3K | Q4K | Q5K | Q6K)
    }

    /// The weight `[rows, cols]` from a GGUF tensor's bytes, or `None` when its type is not
    /// supported, `cols` is not a multiple of its block or the bytes are not `rows * cols`
    /// weights.
    pub fn from_gguf(dtype: GgmlDType, bytes: &[u8], rows: usize, cols: usize) -> Option<Self> {
        let block = dtype.block_size();
        if !cols.is_multiple_of(block) || bytes.len() != rows * cols / block * dtype.type_size() {
            return None;
        }
        if matches!(dtype, GgmlDType::Q4K | GgmlDType::Q6K) && rows.is_multiple_of(8) {
            let groups = bytes.chunks_exact(8 * cols / 256 * dtype.type_size());
            let blocks = if dtype == GgmlDType::Q4K {
                Blocks::Q4K8(
                    groups
                        .flat_map(|g| Q4K8::interleave(g, cols / 256))
                        .collect(),
                )
            } else {
                Blocks::Q6K8(
                    groups
                        .flat_map(|g| Q6K8::interleave(g, cols / 256))
                        .collect(),
                )
            };
            return Some(QLinear { rows, cols, blocks });
        }
        if let Some(k) = KRows::from_gguf(dtype, bytes) {
            return Some(QLinear {
                rows,
                cols,
                blocks: Blocks::K(k),
            });
        }
        let blocks = match dtype {
            GgmlDType::Q4_0 => Self::nibble_blocks(Nibbles::parse_q4_0(bytes), rows, cols),
            GgmlDType::Q4_1 => Self::nibble_blocks(Nibbles::parse_q4_1(bytes), rows, cols),
            GgmlDType::Q8_0 => Blocks::Bytes(Bytes::parse_q8_0(bytes)),
            _ => return None,
        };
        Some(QLinear { rows, cols, blocks })
    }

    /// 4-bit rows (plain layout) interleaved 8 by 8 when their number allows.
    fn nibble_blocks(plain: Vec<Nibbles>, rows: usize, cols: usize) -> Blocks {
        if !rows.is_multiple_of(8) {
            return Blocks::Nibbles(plain);
        }
        let blocks = cols / BLOCK;
        Blocks::Nibbles8(
            plain
                .chunks_exact(8 * blocks)
                .flat_map(|g| Nibbles8::interleave(g, blocks))
                .collect(),
        )
    }

    /// Output features.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input features.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The weights of `parts` stacked (their rows one after the other), or `None` when they
    /// differ in format or input width.
    pub fn concat(parts: &[&QLinear]) -> Option<QLinear> {
        let first = parts.first()?;
        if parts.iter().any(|p| p.cols != first.cols) {
            return None;
        }
        let rows = parts.iter().map(|p| p.rows).sum();
        let blocks = match &first.blocks {
            Blocks::Q4K8(_) => Blocks::Q4K8(stack(parts, |p| match &p.blocks {
                Blocks::Q4K8(b) => Some(b),
                _ => None,
            })?),
            Blocks::Q6K8(_) => Blocks::Q6K8(stack(parts, |p| match &p.blocks {
                Blocks::Q6K8(b) => Some(b),
                _ => None,
            })?),
            Blocks::K(_) => Blocks::K(KRows::concat(
                &parts
                    .iter()
                    .map(|p| match &p.blocks {
                        Blocks::K(k) => Some(k),
                        _ => None,
                    })
                    .collect::<Option<Vec<_>>>()?,
            )?),
            Blocks::Bytes(_) => Blocks::Bytes(stack(parts, |p| match &p.blocks {
                Blocks::Bytes(b) => Some(b),
                _ => None,
            })?),
            _ => {
                let plain = parts
                    .iter()
                    .map(|p| p.plain_nibbles())
                    .collect::<Option<Vec<_>>>()?
                    .concat();
                Self::nibble_blocks(plain, rows, first.cols)
            }
        };
        Some(QLinear {
            rows,
            cols: first.cols,
            blocks,
        })
    }

    /// `x W^T` for `x` of `m` rows of `cols()` (row-major): `m` rows of `rows()`.
    pub fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        self.matmul_with(Isa::detect(), Team::global(), x, m)
    }

    /// [`QLinear::matmul`] with the given kernels and team (tests compare them).
    pub fn matmul_with(&self, isa: Isa, team: &Team, x: &[f32], m: usize) -> Vec<f32> {
        assert_eq!(x.len(), m * self.cols, "input is not [m, cols]");
        if let Blocks::K(k) = &self.blocks {
            return self.matmul_k(k, team, x, m);
        }
        // `cols` is a multiple of 32: no block spans two rows.
        let mut acts = Vec::with_capacity(x.len() / BLOCK);
        quantize_row(x, &mut acts);
        let mut out = vec![0f32; m * self.rows];
        let dst = Out(out.as_mut_ptr());
        let (rows, cols, members) = (self.rows, self.cols, team.size());
        let blocks = cols / BLOCK;
        let job = |member: usize| {
            let share = |n: usize| n * member / members..n * (member + 1) / members;
            let store = |i: usize, r: usize, v: f32| {
                debug_assert!(i < m && r < rows);
                // SAFETY: `i < m` and `r < rows`, so inside the `m * rows` buffer, and row `r`
                // belongs to this member alone.
                unsafe { dst.write(i * rows + r, v) };
            };
            match &self.blocks {
                Blocks::Nibbles(w) => dot_range(isa, w, &acts, blocks, share(rows), store),
                Blocks::Nibbles8(w) => dot_groups(isa, w, &acts, cols, share(rows / 8), store),
                Blocks::Q4K8(w) => dot_groups(isa, w, &acts, cols, share(rows / 8), store),
                Blocks::Q6K8(w) => dot_groups(isa, w, &acts, cols, share(rows / 8), store),
                Blocks::Bytes(w) => dot_range(isa, w, &acts, blocks, share(rows), store),
                Blocks::K(_) => unreachable!("k-quants take matmul_k"),
            }
        };
        team.run(&job);
        out
    }

    /// [`QLinear::matmul_with`] for k-quant rows: candle's dot products (it picks their SIMD).
    fn matmul_k(&self, k: &KRows, team: &Team, x: &[f32], m: usize) -> Vec<f32> {
        let (rows, cols, members) = (self.rows, self.cols, team.size());
        let acts = KRows::quantize(x, cols);
        let per_row = cols / KRows::BLOCK;
        let mut out = vec![0f32; m * rows];
        let dst = Out(out.as_mut_ptr());
        team.run(&|member: usize| {
            for r in rows * member / members..rows * (member + 1) / members {
                for (i, act) in acts.chunks_exact(per_row).enumerate() {
                    // SAFETY: `i < m` and `r < rows`, inside the buffer; row `r` is this
                    // member's alone.
                    unsafe { dst.write(i * rows + r, k.dot(r, cols, act)) };
                }
            }
        });
        out
    }

    /// The dequantized weight, row-major `[rows, cols]` (for references in tests).
    pub fn dequantize(&self) -> Vec<f32> {
        match (&self.blocks, self.plain_nibbles()) {
            (Blocks::K(k), _) => k.dequantize(),
            (Blocks::Q4K8(groups), _) => self.dequantize_q4k8(groups),
            (Blocks::Q6K8(groups), _) => self.dequantize_q6k8(groups),
            (Blocks::Bytes(b), _) => super::blocks::dequantize_bytes(b),
            (_, Some(b)) => super::blocks::dequantize_nibbles(&b),
            (_, None) => unreachable!("4-bit blocks have a plain layout"),
        }
    }

    /// Interleaved Q4_K rows dequantized with their exact f32 scales, row-major.
    fn dequantize_q4k8(&self, groups: &[Q4K8]) -> Vec<f32> {
        let per_group = self.cols / 256;
        let mut out = Vec::with_capacity(self.rows * self.cols);
        for g in groups.chunks_exact(per_group) {
            for r in 0..8 {
                for sb in g {
                    for j in 0..8 {
                        let (sub, scale, offset) =
                            (sb.sub_block(r, j), sb.scale(r, j), sb.offset(r, j));
                        out.extend((0..BLOCK).map(|i| scale * sub.q(i) as f32 - offset));
                    }
                }
            }
        }
        out
    }

    /// Interleaved Q6_K rows dequantized as GGML does, row-major.
    fn dequantize_q6k8(&self, groups: &[Q6K8]) -> Vec<f32> {
        let per_group = self.cols / 256;
        let mut out = Vec::with_capacity(self.rows * self.cols);
        for g in groups.chunks_exact(per_group) {
            for r in 0..8 {
                out.extend(
                    g.iter()
                        .flat_map(|sb| (0..256).map(move |i| sb.weight(r, i))),
                );
            }
        }
        out
    }

    /// 4-bit weights in the plain row-after-row layout.
    fn plain_nibbles(&self) -> Option<Vec<Nibbles>> {
        let blocks = self.cols / BLOCK;
        match &self.blocks {
            Blocks::Nibbles(b) => Some(b.clone()),
            Blocks::Nibbles8(groups) => Some(
                groups
                    .chunks_exact(blocks)
                    .flat_map(|g| (0..8).flat_map(move |r| g.iter().map(move |b| b.row(r))))
                    .collect(),
            ),
            Blocks::Bytes(_) | Blocks::K(_) | Blocks::Q4K8(_) | Blocks::Q6K8(_) => None,
        }
    }

    /// The scalar reference `x W^T`, one dot product at a time.
    pub fn matmul_reference(&self, x: &[f32], m: usize) -> Vec<f32> {
        match &self.blocks {
            Blocks::K(k) => return self.matmul_k(k, &Team::new(1), x, m),
            Blocks::Q4K8(_) | Blocks::Q6K8(_) => {
                return self.matmul_with(Isa::Scalar, &Team::new(1), x, m);
            }
            _ => {}
        }
        let blocks = self.cols / BLOCK;
        let mut acts = Vec::new();
        quantize_row(x, &mut acts);
        let plain = self.plain_nibbles();
        let mut out = Vec::with_capacity(m * self.rows);
        for a in acts.chunks_exact(blocks) {
            for r in 0..self.rows {
                out.push(match (&self.blocks, &plain) {
                    (Blocks::Bytes(w), _) => Bytes::dot_scalar(&w[r * blocks..][..blocks], a),
                    (_, Some(w)) => Nibbles::dot_scalar(&w[r * blocks..][..blocks], a),
                    (_, None) => unreachable!("4-bit blocks have a plain layout"),
                });
            }
        }
        out
    }
}

/// The blocks `pick` finds in every one of `parts`, one part's after the other's, or `None` when
/// it finds none in some part (the parts differ in format).
pub(crate) fn stack<P, T: Clone>(
    parts: &[P],
    pick: impl Fn(&P) -> Option<&Vec<T>>,
) -> Option<Vec<T>> {
    Some(
        parts
            .iter()
            .map(|p| pick(p).map(Vec::as_slice))
            .collect::<Option<Vec<&[T]>>>()?
            .concat(),
    )
}
