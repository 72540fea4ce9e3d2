//! Integer codes with an affine map per group, `w = s * q + b` (the GGUF types repacked at load
//! on a GPU): [`AffineMatrix`] (one of the weights the decode GEMVs stream, see
//! [`crate::GemvWeight`]) and its dequantized copy for the steps that multiply on cuBLAS
//! ([`affine_dequantize`]).

use std::ffi::c_void;

use candle_core::{DType, Result, Tensor, bail};

use crate::{check_launch, device_ptr, dtype_code, empty, ffi};

/// How wide an [`AffineMatrix`]'s codes are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CodeBits {
    /// 4-bit codes, 8 a little-endian 32-bit word in [`crate::Int4Layout::Rows`]' order
    /// (columns `8j + 2i` and `8j + 2i + 1` in nibbles `i` and `4 + i` of word `j`).
    Four,
    /// One byte a code, row-major.
    Eight,
}

impl CodeBits {
    /// Bits a code.
    pub fn bits(self) -> usize {
        match self {
            CodeBits::Four => 4,
            CodeBits::Eight => 8,
        }
    }

    /// The fewest columns the decode GEMVs take a lane load, so a group's least size and what
    /// `k` must be a multiple of.
    pub fn lane_columns(self) -> usize {
        match self {
            CodeBits::Four => 32,
            CodeBits::Eight => 16,
        }
    }
}

/// An `[out, k]` weight of integer codes: element `(o, c)` stands for `s * q + b`, `q` its code
/// and `(s, b)` the f16 pair of row `o`'s group `c / group`.
#[derive(Clone, Copy, Debug)]
pub struct AffineMatrix<'a> {
    /// u8 `[out, k * bits / 8]`: the codes.
    pub codes: &'a Tensor,
    /// f16 `[out, ceil(k / group), 2]`: each row's groups' (scale, offset).
    pub scale_offset: &'a Tensor,
    /// Columns a group (`k` or more: one group a row).
    pub group: usize,
    /// The codes' width.
    pub bits: CodeBits,
}

impl AffineMatrix<'_> {
    /// `[out, k]`.
    pub fn dims(&self) -> Result<(usize, usize)> {
        let (out, bytes) = self.codes.dims2()?;
        Ok((out, bytes * 8 / self.bits.bits()))
    }

    /// That the parts agree: u8 codes, f16 pairs of the groups' shape, both contiguous.
    pub(crate) fn check(&self, what: &str) -> Result<(usize, usize)> {
        let (out, k) = self.dims()?;
        if self.codes.dtype() != DType::U8 || self.scale_offset.dtype() != DType::F16 {
            bail!(
                "{what}: codes must be u8 and their scales f16, got {:?} and {:?}",
                self.codes.dtype(),
                self.scale_offset.dtype()
            );
        }
        if self.group == 0 || self.scale_offset.dims() != [out, k.div_ceil(self.group), 2] {
            bail!(
                "{what}: scales {:?} do not cover a [{out}, {k}] weight in groups of {}",
                self.scale_offset.dims(),
                self.group
            );
        }
        if !self.codes.is_contiguous() || !self.scale_offset.is_contiguous() {
            bail!("{what}: codes and scales must be contiguous");
        }
        Ok((out, k))
    }

    /// Whether the decode GEMVs take it: `k` a multiple of a lane's columns, groups of whole
    /// rows or a power of two of at least a lane's columns.
    pub(crate) fn gemv_fits(&self) -> bool {
        let lane = self.bits.lane_columns();
        self.check("gemv").is_ok_and(|(_, k)| {
            k.is_multiple_of(lane)
                && (self.group >= k || (self.group >= lane && self.group.is_power_of_two()))
        })
    }
}

/// `m` with its scales and offsets applied, `[out, k]` in `dtype` (f16 or bf16): each element
/// `s * q + b` in f32, rounded once. What cuBLAS multiplies for the steps past the GEMVs' rows.
/// `k` must be a multiple of 8, the group a multiple of 8 or whole rows.
pub fn affine_dequantize(m: AffineMatrix<'_>, dtype: DType) -> Result<Tensor> {
    let (out, k) = m.check("affine_dequantize")?;
    if !k.is_multiple_of(8) || !(m.group.is_multiple_of(8) || m.group >= k) {
        bail!(
            "affine_dequantize: k {k} must be a multiple of 8 and the group {} whole rows or a \
             multiple of 8 columns",
            m.group
        );
    }
    let code = dtype_code(dtype, "affine_dequantize")?;
    if code == 0 {
        bail!("affine_dequantize: writes f16 or bf16, not f32");
    }
    let y = empty((out, k), dtype, m.codes.device())?;
    let (yp, stream) = device_ptr(&y, "out")?;
    let (wp, _) = device_ptr(m.codes, "codes")?;
    let (sp, _) = device_ptr(m.scale_offset, "scales")?;
    if wp % 8 != 0 || sp % 4 != 0 {
        bail!("affine_dequantize: codes must start on 8-byte boundaries, scales on 4");
    }
    let int = |n: usize, what: &str| {
        i32::try_from(n).map_err(|_| {
            candle_core::Error::Msg(format!("affine_dequantize: {what} {n} is too large"))
        })
    };
    // SAFETY: checked shapes and dtypes on one device: the kernel reads out x k x bits / 8 bytes
    // of codes and out x groups pairs, and writes out x k of y.
    let code = unsafe {
        ffi::pagewise_affine_dequantize(
            code,
            yp as *mut c_void,
            wp as *const c_void,
            sp as *const c_void,
            out as i64,
            int(k, "k")?,
            int(m.group.min(k), "group")?,
            m.bits.bits() as i32,
            stream,
        )
    };
    check_launch(code, "affine_dequantize")?;
    Ok(y)
}
