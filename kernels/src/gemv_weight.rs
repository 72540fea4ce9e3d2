//! The weights the decode GEMVs stream ([`GemvWeight`]): in the activations' dtype, FP8 with
//! block scales ([`Fp8Matrix`]), 4-bit integers with group scales and zero points
//! ([`Int4Matrix`]), or 4- and 8-bit codes with group scales and offsets ([`AffineMatrix`]);
//! csrc/gemv_weight.cuh has the kernels' side.

use std::ffi::c_void;

use candle_core::{DType, Result, Tensor, bail};

use crate::{AffineMatrix, CodeBits, Fp8Matrix, Int4Layout, Int4Matrix, device_ptr};

/// The most rows the GEMVs take with affine codes ([`AffineMatrix`]): the fused decode steps'.
/// Each kind of weight instantiates every GEMV entry point for each row count it takes, and the
/// binaries travel to the GPU machine under a size limit; larger steps multiply a dequantized
/// copy ([`crate::affine_dequantize`]). csrc/gemv_affine.cuh's `kAffineMaxRows`.
pub const AFFINE_GEMV_MAX_ROWS: usize = 2;

/// A weight the decode GEMVs stream. FP8 rows need `k` a multiple of 16 and scale blocks of
/// whole rows or a power of two of at least 16 columns (128 in the published block-FP8
/// checkpoints); 4-bit rows `k` a multiple of 32 and groups of whole rows or a power of two of at
/// least 32 columns (4-bit tiles: see [`crate::Int4Layout::Tiles`]).
#[derive(Clone, Copy, Debug)]
pub enum GemvWeight<'a> {
    /// `[out, k]` in the activations' dtype.
    Dense(&'a Tensor),
    /// e4m3 with block scales.
    Fp8(Fp8Matrix<'a>),
    /// 4-bit codes with group scales and zero points.
    Int4(Int4Matrix<'a>),
    /// 4- or 8-bit codes with group scales and offsets.
    Affine(AffineMatrix<'a>),
}

impl<'a> From<&'a Tensor> for GemvWeight<'a> {
    fn from(t: &'a Tensor) -> Self {
        GemvWeight::Dense(t)
    }
}

impl<'a> From<Fp8Matrix<'a>> for GemvWeight<'a> {
    fn from(m: Fp8Matrix<'a>) -> Self {
        GemvWeight::Fp8(m)
    }
}

impl<'a> From<AffineMatrix<'a>> for GemvWeight<'a> {
    fn from(m: AffineMatrix<'a>) -> Self {
        GemvWeight::Affine(m)
    }
}

impl<'a> From<Int4Matrix<'a>> for GemvWeight<'a> {
    fn from(m: Int4Matrix<'a>) -> Self {
        GemvWeight::Int4(m)
    }
}

/// A weight's pointers as the GEMV entry points take them: the weight, its kind (0 dense, 1 FP8,
/// 2 4-bit rows, 3 4-bit tiles, 4 and 5 affine 4- and 8-bit codes: csrc's `WeightKind`), its
/// scales (null when dense), and the scale blocks' rows and columns (an integer weight's: 1 and
/// its group).
pub(crate) struct WeightPointers {
    pub w: u64,
    pub kind: i32,
    pub scales: *const c_void,
    pub block_rows: i32,
    pub block_cols: i32,
}

impl GemvWeight<'_> {
    /// `[out, k]`.
    pub fn dims(&self) -> Result<(usize, usize)> {
        match self {
            GemvWeight::Dense(t) => t.dims2(),
            GemvWeight::Fp8(m) => m.dims(),
            GemvWeight::Int4(m) => m.dims(),
            GemvWeight::Affine(m) => m.dims(),
        }
    }

    /// Whether the GEMVs take this weight with activations of `dtype`: a dense weight of that
    /// dtype, contiguous; FP8 parts that agree, `k` a multiple of 16, blocks of whole rows or a
    /// power of two of at least 16 columns; 4-bit parts that agree (f16 or bf16 activations), `k`
    /// a multiple of 32, groups of whole rows or a power of two of at least 32 columns (tiles:
    /// what [`crate::Int4Layout::tiles_fit`] says); affine codes (f16 or bf16 activations) with
    /// `k` a multiple of a lane's columns ([`CodeBits::lane_columns`]) and groups of whole rows
    /// or a power of two of at least that.
    pub fn takes(&self, dtype: DType) -> bool {
        match self {
            GemvWeight::Dense(t) => t.dtype() == dtype && t.is_contiguous(),
            GemvWeight::Fp8(m) => m.check("gemv").is_ok_and(|(_, k)| {
                k.is_multiple_of(16)
                    && (m.block.1 >= k || (m.block.1 >= 16 && m.block.1.is_power_of_two()))
                    && m.data.is_contiguous()
                    && m.scales.is_contiguous()
            }),
            GemvWeight::Int4(m) => {
                matches!(dtype, DType::F16 | DType::BF16)
                    && m.check("gemv").is_ok_and(|(_, k)| {
                        k.is_multiple_of(32)
                            && (m.group >= k || (m.group >= 32 && m.group.is_power_of_two()))
                    })
            }
            GemvWeight::Affine(m) => matches!(dtype, DType::F16 | DType::BF16) && m.gemv_fits(),
        }
    }

    /// The most rows a GEMV takes with this weight: [`crate::GEMV_MAX_ROWS`], or
    /// [`AFFINE_GEMV_MAX_ROWS`] for affine codes.
    pub fn max_rows(&self) -> usize {
        match self {
            GemvWeight::Affine(_) => AFFINE_GEMV_MAX_ROWS,
            _ => crate::GEMV_MAX_ROWS,
        }
    }

    /// The pointers of a weight [`GemvWeight::takes`] for `dtype` and `rows` rows, or an error
    /// naming `what`.
    pub(crate) fn pointers(&self, dtype: DType, rows: usize, what: &str) -> Result<WeightPointers> {
        if !self.takes(dtype) {
            bail!("{what}: the weight {self:?} does not fit the GEMV with {dtype:?} activations");
        }
        if rows > self.max_rows() {
            bail!(
                "{what}: {rows} rows, past the {} this weight's GEMV takes",
                self.max_rows()
            );
        }
        let too_big = |n: usize| i32::try_from(n).unwrap_or(i32::MAX);
        Ok(match self {
            GemvWeight::Dense(t) => WeightPointers {
                w: device_ptr(t, "w")?.0,
                kind: 0,
                scales: std::ptr::null(),
                block_rows: 0,
                block_cols: 0,
            },
            GemvWeight::Fp8(m) => WeightPointers {
                w: device_ptr(m.data, "w")?.0,
                kind: 1,
                scales: device_ptr(m.scales, "w scales")?.0 as *const c_void,
                block_rows: too_big(m.block.0),
                block_cols: too_big(m.block.1),
            },
            GemvWeight::Int4(m) => WeightPointers {
                w: device_ptr(m.codes, "w codes")?.0,
                kind: match m.layout {
                    Int4Layout::Rows => 2,
                    Int4Layout::Tiles => 3,
                },
                scales: device_ptr(m.scale_zero, "w scales")?.0 as *const c_void,
                block_rows: 1,
                block_cols: too_big(m.group),
            },
            GemvWeight::Affine(m) => WeightPointers {
                w: device_ptr(m.codes, "w codes")?.0,
                kind: match m.bits {
                    CodeBits::Four => 4,
                    CodeBits::Eight => 5,
                },
                scales: device_ptr(m.scale_offset, "w scales")?.0 as *const c_void,
                block_rows: 1,
                block_cols: too_big(m.group),
            },
        })
    }
}
