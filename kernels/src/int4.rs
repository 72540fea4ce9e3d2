//! 4-bit integer weights on the GPU (AWQ, GPTQ and compressed-tensors W4A16 checkpoints, repacked
//! at load): [`Int4Matrix`] (the codes in the decode GEMVs' order and their group scales and zero
//! points, one of the weights they stream, see [`crate::GemvWeight`]) and a weight's dequantized
//! copy for the steps that multiply on cuBLAS ([`int4_dequantize`]).

use std::ffi::c_void;

use candle_core::{DType, Result, Tensor, bail};

use crate::{check_launch, device_ptr, dtype_code, empty, ffi};

/// A 4-bit weight `[out, k]`: element `(o, c)` stands for `s * (q - z)`, `q` its code (0..15) and
/// `(s, z)` the f16 pair of row `o`'s group `c / group`.
#[derive(Clone, Copy, Debug)]
pub struct Int4Matrix<'a> {
    /// u8 `[out, k / 2]`: each row's codes, 8 columns a little-endian 32-bit word, column
    /// `8j + 2i` in word `j`'s nibble `i` and column `8j + 2i + 1` in its nibble `4 + i`
    /// (AutoAWQ's order: one mask gives two neighbouring columns as the halves of an f16 pair).
    pub codes: &'a Tensor,
    /// f16 `[out, ceil(k / group), 2]`: each row's groups' (scale, zero point).
    pub scale_zero: &'a Tensor,
    /// Columns a group (`k` or more: one group a row).
    pub group: usize,
}

impl Int4Matrix<'_> {
    /// `[out, k]`.
    pub fn dims(&self) -> Result<(usize, usize)> {
        let (out, half) = self.codes.dims2()?;
        Ok((out, 2 * half))
    }

    /// That the parts agree: u8 codes, f16 pairs of the groups' shape, both contiguous.
    pub(crate) fn check(&self, what: &str) -> Result<(usize, usize)> {
        let (out, k) = self.dims()?;
        if self.codes.dtype() != DType::U8 || self.scale_zero.dtype() != DType::F16 {
            bail!(
                "{what}: 4-bit codes must be u8 and their scales f16, got {:?} and {:?}",
                self.codes.dtype(),
                self.scale_zero.dtype()
            );
        }
        if self.group == 0 || self.scale_zero.dims() != [out, k.div_ceil(self.group), 2] {
            bail!(
                "{what}: scales {:?} do not cover a [{out}, {k}] weight in groups of {}",
                self.scale_zero.dims(),
                self.group
            );
        }
        if !self.codes.is_contiguous() || !self.scale_zero.is_contiguous() {
            bail!("{what}: 4-bit codes and scales must be contiguous");
        }
        Ok((out, k))
    }
}

/// `m` with its scales and zero points applied, `[out, k]` in `dtype` (f16 or bf16): each
/// element `s * (q - z)` in f32, rounded once. What cuBLAS multiplies for the steps past the
/// GEMVs' rows. `k` must be a multiple of 8, the group a multiple of 8 or whole rows.
pub fn int4_dequantize(m: Int4Matrix<'_>, dtype: DType) -> Result<Tensor> {
    let (out, k) = m.check("int4_dequantize")?;
    if !k.is_multiple_of(8) || !(m.group.is_multiple_of(8) || m.group >= k) {
        bail!(
            "int4_dequantize: k {k} must be a multiple of 8 and the group {} whole rows or a \
             multiple of 8 columns",
            m.group
        );
    }
    let code = dtype_code(dtype, "int4_dequantize")?;
    if code == 0 {
        bail!("int4_dequantize: writes f16 or bf16, not f32");
    }
    let y = empty((out, k), dtype, m.codes.device())?;
    let (yp, stream) = device_ptr(&y, "out")?;
    let (wp, _) = device_ptr(m.codes, "codes")?;
    let (sp, _) = device_ptr(m.scale_zero, "scales")?;
    if wp % 4 != 0 || sp % 4 != 0 {
        bail!("int4_dequantize: codes and scales must start on 4-byte boundaries");
    }
    let int = |n: usize, what: &str| {
        i32::try_from(n).map_err(|_| {
            candle_core::Error::Msg(format!("int4_dequantize: {what} {n} is too large"))
        })
    };
    // SAFETY: checked shapes and dtypes on one device: the kernel reads out x k / 2 bytes of
    // codes and out x groups pairs, and writes out x k of y.
    let code = unsafe {
        ffi::pagewise_int4_dequantize(
            code,
            yp as *mut c_void,
            wp as *const c_void,
            sp as *const c_void,
            out as i64,
            int(k, "k")?,
            int(m.group.min(k), "group")?,
            stream,
        )
    };
    check_launch(code, "int4_dequantize")?;
    Ok(y)
}
