//! A linear layer's GGUF-quantized weight on the CPU, multiplied without dequantizing: the
//! activations are quantized to 8 bits, and the weight rows are split between the [`Team`].

use std::borrow::Cow;

use candle_core::quantized::GgmlDType;

use super::act_k::{SUPER, quantize_row_k_with};
use super::bf16::bf16_pairs;
use super::blocks::{BLOCK, Nibbles, Nibbles8, quantize_row_with};
use super::fives::{Five, Fives8};
use super::halves::{Bf16x8, F16x8, HALF_COLS};
use super::iq4::{Iq4Nl8, Iq4Type, Iq4Xs8};
use super::kernels::{GroupBlock, Isa, dot_groups};
use super::q4k::Q4K8;
use super::q5k::Q5K8;
use super::q6k::Q6K8;
use super::q8::Bytes8;
use super::q23k::{Q2K8, Q3K8};
use super::team::Team;

/// The weight's blocks. Every format is interleaved 8 rows by 8 (group after group, each group's blocks in order); a last group short of 8 rows is padded
/// with zero rows, which no output reads.
#[derive(Clone, Debug)]
enum Blocks {
    /// Q4_0 and Q4_1.
    Nibbles8(Vec<Nibbles8>),
    /// Q5_0 and Q5_1.
    Fives8(Vec<Fives8>),
    /// Q8_0.
    Bytes8(Vec<Bytes8>),
    /// Q4_K.
    Q4K8(Vec<Q4K8>),
    /// Q5_K.
    Q5K8(Vec<Q5K8>),
    /// Q6_K.
    Q6K8(Vec<Q6K8>),
    /// IQ4_NL.
    Iq4Nl8(Vec<Iq4Nl8>),
    /// IQ4_XS.
    Iq4Xs8(Vec<Iq4Xs8>),
    /// Q2_K.
    Q2K8(Vec<Q2K8>),
    /// Q3_K.
    Q3K8(Vec<Q3K8>),
    /// F16 (multiplied by f32 activations).
    F16(Vec<F16x8>),
    /// BF16 (multiplied by f32 activations).
    Bf16(Vec<Bf16x8>),
}

/// `$body` with `$w` bound to the interleaved blocks of `$blocks`, whatever their format; with
/// `floats => $float, supers => $super`, those instead for the 16-bit float formats and for the
/// formats that take activations 256 to a scale.
macro_rules! each_format {
    ($blocks:expr, $w:ident => $body:expr) => {
        each_format!(@quantized $blocks, $w => $body,
            Blocks::Q4K8($w) => $body,
            Blocks::Q5K8($w) => $body,
            Blocks::Q6K8($w) => $body,
            Blocks::Iq4Xs8($w) => $body,
            Blocks::Q2K8($w) => $body,
            Blocks::Q3K8($w) => $body,
            Blocks::F16($w) => $body,
            Blocks::Bf16($w) => $body,
        )
    };
    ($blocks:expr, $w:ident => $body:expr, floats => $float:expr, supers => $super:expr) => {
        each_format!(@quantized $blocks, $w => $body,
            Blocks::Q2K8(_)
            | Blocks::Q3K8(_)
            | Blocks::Q4K8(_)
            | Blocks::Q5K8(_)
            | Blocks::Q6K8(_)
            | Blocks::Iq4Xs8(_) => $super,
            Blocks::F16(_) | Blocks::Bf16(_) => $float,
        )
    };
    (@quantized $blocks:expr, $w:ident => $body:expr, $($others:tt)*) => {
        match $blocks {
            Blocks::Nibbles8($w) => $body,
            Blocks::Fives8($w) => $body,
            Blocks::Bytes8($w) => $body,
            Blocks::Iq4Nl8($w) => $body,
            $($others)*
        }
    };
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
        matches!(
            dtype,
            Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q2K | Q3K | Q4K | Q5K | Q6K | F16 | BF16
        )
    }

    /// The weight `[rows, cols]` from a GGUF tensor's bytes, or `None` when its type is not
    /// supported, `cols` is not a multiple of its block or the bytes are not `rows * cols`
    /// weights.
    pub fn from_gguf(dtype: GgmlDType, bytes: &[u8], rows: usize, cols: usize) -> Option<Self> {
        use GgmlDType::*;
        // 16-bit floats are interleaved in blocks of 32 columns.
        let block = dtype.block_size().max(HALF_COLS);
        let row_bytes = cols * dtype.type_size() / dtype.block_size();
        if !Self::supports(dtype) || !cols.is_multiple_of(block) || bytes.len() != rows * row_bytes
        {
            return None;
        }
        let groups = padded_groups(bytes, rows, row_bytes);
        let (subs, supers) = (cols / BLOCK, cols / 256);
        let blocks = match dtype {
            Q4_0 => Blocks::Nibbles8(each(groups, |g| {
                Nibbles8::interleave(&Nibbles::parse_q4_0(g), subs)
            })),
            Q4_1 => Blocks::Nibbles8(each(groups, |g| {
                Nibbles8::interleave(&Nibbles::parse_q4_1(g), subs)
            })),
            Q5_0 => Blocks::Fives8(
                groups
                    .iter()
                    .map(|g| Some(Fives8::interleave(&Five::parse_q5_0(g)?, subs)))
                    .collect::<Option<Vec<_>>>()?
                    .concat(),
            ),
            Q5_1 => Blocks::Fives8(each(groups, |g| {
                Fives8::interleave(&Five::parse_q5_1(g), subs)
            })),
            Q8_0 => Blocks::Bytes8(each(groups, |g| Bytes8::interleave(g, subs))),
            Q4K => Blocks::Q4K8(each(groups, |g| Q4K8::interleave(g, supers))),
            Q5K => Blocks::Q5K8(each(groups, |g| Q5K8::interleave(g, supers))),
            Q6K => Blocks::Q6K8(each(groups, |g| Q6K8::interleave(g, supers))),
            Q2K => Blocks::Q2K8(each(groups, |g| Q2K8::interleave(g, supers))),
            Q3K => Blocks::Q3K8(each(groups, |g| Q3K8::interleave(g, supers))),
            F16 => Blocks::F16(each(groups, |g| F16x8::interleave(g, cols / HALF_COLS))),
            BF16 => Blocks::Bf16(each(groups, |g| Bf16x8::interleave(g, cols / HALF_COLS))),
            _ => return None,
        };
        Some(QLinear { rows, cols, blocks })
    }

    /// The weight `[rows, cols]` from the bytes of a GGUF tensor of an IQ4 type, or `None` when
    /// `cols` is not a multiple of its block or the bytes are not `rows * cols` weights.
    pub fn from_iq4(ty: Iq4Type, bytes: &[u8], rows: usize, cols: usize) -> Option<Self> {
        let row_bytes = ty.bytes_of(cols)?;
        if bytes.len() != rows * row_bytes {
            return None;
        }
        let groups = padded_groups(bytes, rows, row_bytes);
        let blocks = match ty {
            Iq4Type::Nl => Blocks::Iq4Nl8(each(groups, |g| Iq4Nl8::interleave(g, cols / 32))),
            Iq4Type::Xs => Blocks::Iq4Xs8(each(groups, |g| Iq4Xs8::interleave(g, cols / 256))),
        };
        Some(QLinear { rows, cols, blocks })
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
    /// differ in format or input width, or a part other than the last has a padded group.
    pub fn concat(parts: &[&QLinear]) -> Option<QLinear> {
        let first = parts.first()?;
        let (_, rest) = parts.split_last()?;
        if parts.iter().any(|p| p.cols != first.cols)
            || rest.iter().any(|p| !p.rows.is_multiple_of(8))
        {
            return None;
        }
        /// The `$variant` blocks of every part one after the other, or `None`.
        macro_rules! stacked {
            ($variant:ident) => {
                Blocks::$variant(stack(parts, |p| match &p.blocks {
                    Blocks::$variant(b) => Some(b),
                    _ => None,
                })?)
            };
        }
        let blocks = match &first.blocks {
            Blocks::Nibbles8(_) => stacked!(Nibbles8),
            Blocks::Fives8(_) => stacked!(Fives8),
            Blocks::Bytes8(_) => stacked!(Bytes8),
            Blocks::Q4K8(_) => stacked!(Q4K8),
            Blocks::Q5K8(_) => stacked!(Q5K8),
            Blocks::Q6K8(_) => stacked!(Q6K8),
            Blocks::Iq4Nl8(_) => stacked!(Iq4Nl8),
            Blocks::Iq4Xs8(_) => stacked!(Iq4Xs8),
            Blocks::Q2K8(_) => stacked!(Q2K8),
            Blocks::Q3K8(_) => stacked!(Q3K8),
            Blocks::F16(_) => stacked!(F16),
            Blocks::Bf16(_) => stacked!(Bf16),
        };
        Some(QLinear {
            rows: parts.iter().map(|p| p.rows).sum(),
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
        // `cols` is a multiple of 32 (of 256 for the k-quants): no block spans two rows. F16
        // weights take the activations as they are, BF16 ones rounded to BF16, the rest
        // quantized to 8 bits (the k-quants and IQ4_XS 256 to a scale, the others 32).
        let (mut acts, mut supers, mut pairs) = (Vec::new(), Vec::new(), Vec::new());
        match self.blocks {
            Blocks::F16(_) => {}
            Blocks::Bf16(_) => {
                pairs.reserve(x.len() / 2);
                bf16_pairs(x, &mut pairs);
            }
            Blocks::Q2K8(_)
            | Blocks::Q3K8(_)
            | Blocks::Q4K8(_)
            | Blocks::Q5K8(_)
            | Blocks::Q6K8(_)
            | Blocks::Iq4Xs8(_) => {
                supers.reserve(x.len() / SUPER);
                quantize_row_k_with(isa, x, &mut supers);
            }
            _ => {
                acts.reserve(x.len() / BLOCK);
                quantize_row_with(isa, x, &mut acts);
            }
        }
        let mut out = vec![0f32; m * self.rows];
        let dst = Out(out.as_mut_ptr());
        let (rows, cols, shares) = (self.rows, self.cols, team.shares());
        let groups = rows.div_ceil(8);
        let job = |share: usize| {
            let share = groups * share / shares..groups * (share + 1) / shares;
            let store = |i: usize, r: usize, v: f32| {
                debug_assert!(i < m);
                if r < rows {
                    // SAFETY: `i < m` and `r < rows`, so inside the `m * rows` buffer, and row
                    // `r` belongs to this share alone.
                    unsafe { dst.write(i * rows + r, v) };
                }
            };
            match &self.blocks {
                Blocks::F16(w) => dot_groups(isa, w, x, cols, share, store),
                Blocks::Bf16(w) => dot_groups(isa, w, &pairs, cols, share, store),
                Blocks::Q4K8(w) => dot_groups(isa, w, &supers, cols, share, store),
                Blocks::Q5K8(w) => dot_groups(isa, w, &supers, cols, share, store),
                Blocks::Q6K8(w) => dot_groups(isa, w, &supers, cols, share, store),
                Blocks::Iq4Xs8(w) => dot_groups(isa, w, &supers, cols, share, store),
                Blocks::Q2K8(w) => dot_groups(isa, w, &supers, cols, share, store),
                Blocks::Q3K8(w) => dot_groups(isa, w, &supers, cols, share, store),
                other => each_format!(
                    other,
                    w => dot_groups(isa, w, &acts, cols, share, store),
                    floats => unreachable!("16-bit floats are matched above"),
                    supers => unreachable!("the k-quants and IQ4_XS are matched above")
                ),
            }
        };
        team.run(&job);
        out
    }

    /// The dequantized weight, row-major `[rows, cols]` (for references in tests).
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = each_format!(&self.blocks, w => dequantize_groups(w, self.cols));
        out.truncate(self.rows * self.cols);
        out
    }

    /// Rows `ids` dequantized, one after the other (an embedding lookup).
    pub fn dequantize_rows(&self, ids: &[usize]) -> Vec<f32> {
        let cols = self.cols;
        assert!(ids.iter().all(|&r| r < self.rows), "row out of range");
        each_format!(&self.blocks, w => gather_rows(w, cols, ids))
    }

    /// The scalar reference `x W^T`: the formats' scalar dot products, one thread.
    pub fn matmul_reference(&self, x: &[f32], m: usize) -> Vec<f32> {
        self.matmul_with(Isa::Scalar, &Team::new(1), x, m)
    }
}

/// The bytes of `rows` rows of `row_bytes` each, as groups of 8 rows: a last group short of 8
/// padded with zero bytes, which are zero weights in every format (a scale of 0).
fn padded_groups(bytes: &[u8], rows: usize, row_bytes: usize) -> Vec<Cow<'_, [u8]>> {
    let whole = rows / 8 * 8 * row_bytes;
    let mut groups: Vec<Cow<'_, [u8]>> = bytes[..whole]
        .chunks_exact(8 * row_bytes)
        .map(Cow::Borrowed)
        .collect();
    if whole < bytes.len() {
        let mut last = bytes[whole..].to_vec();
        last.resize(8 * row_bytes, 0);
        groups.push(Cow::Owned(last));
    }
    groups
}

/// `f` of every group, one group's blocks after the other's.
fn each<T>(groups: Vec<Cow<'_, [u8]>>, f: impl Fn(&[u8]) -> Vec<T>) -> Vec<T> {
    groups.iter().flat_map(|g| f(g)).collect()
}

/// Rows `ids` of interleaved groups of `cols` weights a row, dequantized one after the other.
fn gather_rows<B: GroupBlock>(w: &[B], cols: usize, ids: &[usize]) -> Vec<f32> {
    let per_group = cols / B::WEIGHTS;
    let mut out = Vec::with_capacity(ids.len() * cols);
    for &r in ids {
        for b in &w[r / 8 * per_group..][..per_group] {
            out.extend((0..B::WEIGHTS).map(|i| b.weight(r % 8, i)));
        }
    }
    out
}

/// Interleaved groups of `cols` weights a row dequantized, row-major (8 rows a group).
fn dequantize_groups<B: GroupBlock>(w: &[B], cols: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(w.len() * 8 * B::WEIGHTS);
    for g in w.chunks_exact(cols / B::WEIGHTS) {
        for r in 0..8 {
            out.extend(
                g.iter()
                    .flat_map(|b| (0..B::WEIGHTS).map(move |i| b.weight(r, i))),
            );
        }
    }
    out
}

/// The blocks `pick` finds in every one of `parts`, one part's after the other's, or `None` when
/// it finds none in some part (the parts differ in format).
fn stack<P, T: Clone>(parts: &[P], pick: impl Fn(&P) -> Option<&Vec<T>>) -> Option<Vec<T>> {
    Some(
        parts
            .iter()
            .map(|p| pick(p).map(Vec::as_slice))
            .collect::<Option<Vec<&[T]>>>()?
            .concat(),
    )
}
