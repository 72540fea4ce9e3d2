//! GGUF's 2- and 3-bit k-quants (Q2_K, Q3_K: 256 weights a super-block, scales per 16): rows
//! multiplied with candle's dot products for them (SIMD on x86-64 and ARM) against activations
//! quantized to its `Q8_K`, the rows split between the [`Team`](super::team::Team) like the other formats.

use candle_core::quantized::GgmlDType;
use candle_core::quantized::k_quants::{BlockQ2K, BlockQ3K, BlockQ8K, GgmlType, QK_K};

use super::qlinear::stack;

/// Rows of one k-quant format, row after row.
#[derive(Clone, Debug)]
pub enum KRows {
    /// Q2_K.
    Q2K(Vec<BlockQ2K>),
    /// Q3_K.
    Q3K(Vec<BlockQ3K>),
}

/// GGML blocks read from a GGUF tensor's bytes.
fn blocks_from<T: GgmlType>(bytes: &[u8]) -> Vec<T> {
    let size = std::mem::size_of::<T>();
    let n = bytes.len() / size;
    let mut out = vec![T::zeros(); n];
    // SAFETY: GGML blocks are `repr(C)` plain data (f16s, f32s and integer arrays: every bit
    // pattern is a value), `out` holds `n * size` bytes, and the source has at least as many.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), out.as_mut_ptr().cast::<u8>(), n * size)
    };
    out
}

impl KRows {
    /// The rows of a GGUF tensor of `dtype`, or `None` when it is not a k-quant this takes.
    pub fn from_gguf(dtype: GgmlDType, bytes: &[u8]) -> Option<KRows> {
        Some(match dtype {
            GgmlDType::Q2K => KRows::Q2K(blocks_from(bytes)),
            GgmlDType::Q3K => KRows::Q3K(blocks_from(bytes)),
            _ => return None,
        })
    }

    /// Weights a block (and so the multiple `cols` must be).
    pub const BLOCK: usize = QK_K;

    /// The activations' blocks: `x` (rows of `cols`) quantized to `Q8_K`.
    pub fn quantize(x: &[f32], cols: usize) -> Vec<BlockQ8K> {
        let mut out = vec![BlockQ8K::zeros(); x.len() / QK_K];
        for (row, dst) in x.chunks_exact(cols).zip(out.chunks_exact_mut(cols / QK_K)) {
            BlockQ8K::from_float(row, dst);
        }
        out
    }

    /// The dot product of weight row `r` (of `cols`) with one activation row.
    pub fn dot(&self, r: usize, cols: usize, act: &[BlockQ8K]) -> f32 {
        let blocks = cols / QK_K;
        fn row<T: GgmlType<VecDotType = BlockQ8K>>(
            w: &[T],
            r: usize,
            blocks: usize,
            cols: usize,
            act: &[BlockQ8K],
        ) -> f32 {
            T::vec_dot(cols, &w[r * blocks..(r + 1) * blocks], act)
        }
        match self {
            KRows::Q2K(w) => row(w, r, blocks, cols, act),
            KRows::Q3K(w) => row(w, r, blocks, cols, act),
        }
    }

    /// The rows of `parts` one after the other, or `None` when their formats differ.
    pub fn concat(parts: &[&KRows]) -> Option<KRows> {
        Some(match parts.first()? {
            KRows::Q2K(_) => KRows::Q2K(stack(parts, |p| match p {
                KRows::Q2K(b) => Some(b),
                _ => None,
            })?),
            KRows::Q3K(_) => KRows::Q3K(stack(parts, |p| match p {
                KRows::Q3K(b) => Some(b),
                _ => None,
            })?),
        })
    }

    /// Row `r` (of `cols`) dequantized.
    pub fn dequantize_row(&self, r: usize, cols: usize) -> Vec<f32> {
        fn floats<T: GgmlType>(w: &[T], r: usize, cols: usize) -> Vec<f32> {
            let blocks = cols / T::BLCK_SIZE;
            let mut out = vec![0f32; cols];
            T::to_float(&w[r * blocks..(r + 1) * blocks], &mut out);
            out
        }
        match self {
            KRows::Q2K(w) => floats(w, r, cols),
            KRows::Q3K(w) => floats(w, r, cols),
        }
    }

    /// The dequantized rows, row-major (for references in tests).
    pub fn dequantize(&self) -> Vec<f32> {
        fn floats<T: GgmlType>(w: &[T]) -> Vec<f32> {
            let mut out = vec![0f32; w.len() * T::BLCK_SIZE];
            T::to_float(w, &mut out);
            out
        }
        match self {
            KRows::Q2K(w) => floats(w),
            KRows::Q3K(w) => floats(w),
        }
    }
}
