//! FP8 (e4m3) weights on the GPU: [`Fp8Matrix`] (the bytes and their block scales, one of the
//! weights the decode GEMVs stream, see [`crate::GemvWeight`]), a weight's dequantized copy for
//! the steps that multiply on cuBLAS ([`fp8_dequantize`]), and the row-wise quantization of a
//! 16-bit weight ([`fp8_quantize_rows`], `--quantization fp8`).

use std::ffi::c_void;

use candle_core::{DType, Result, Tensor, bail};

use crate::{check_launch, device_ptr, dtype_code, empty, ffi};

/// An e4m3 weight `[out, k]` (its bytes, u8) with f32 scales, one per block of `block.0` rows x
/// `block.1` columns: `scales` is `[ceil(out / block.0), ceil(k / block.1)]` and element
/// `(o, c)` stands for `e4m3(data[o, c]) * scales[o / block.0, c / block.1]`. One scale per
/// tensor is the block `(out, k)`, one per row `(1, k)`.
#[derive(Clone, Copy, Debug)]
pub struct Fp8Matrix<'a> {
    /// The e4m3 bytes, u8 `[out, k]`.
    pub data: &'a Tensor,
    /// f32 `[ceil(out / block.0), ceil(k / block.1)]`.
    pub scales: &'a Tensor,
    /// Rows and columns a scale covers.
    pub block: (usize, usize),
}

impl Fp8Matrix<'_> {
    /// `[out, k]`.
    pub fn dims(&self) -> Result<(usize, usize)> {
        self.data.dims2()
    }

    /// That the parts agree: u8 data, f32 scales of the blocks' shape, both contiguous on one
    /// GPU.
    pub(crate) fn check(&self, what: &str) -> Result<(usize, usize)> {
        let (out, k) = self.dims()?;
        let (bn, bk) = self.block;
        if self.data.dtype() != DType::U8 || self.scales.dtype() != DType::F32 {
            bail!(
                "{what}: FP8 data must be u8 and its scales f32, got {:?} and {:?}",
                self.data.dtype(),
                self.scales.dtype()
            );
        }
        if bn == 0 || bk == 0 || self.scales.dims() != [out.div_ceil(bn), k.div_ceil(bk)] {
            bail!(
                "{what}: scales {:?} do not cover a [{out}, {k}] weight in blocks of {:?}",
                self.scales.dims(),
                self.block
            );
        }
        Ok((out, k))
    }
}

/// `m` with its scales applied, `[out, k]` in `dtype` (f16 or bf16): what cuBLAS multiplies for
/// the steps past the GEMVs' rows. `k` must be a multiple of 8, the blocks' columns a multiple
/// of 8 or whole rows.
pub fn fp8_dequantize(m: Fp8Matrix<'_>, dtype: DType) -> Result<Tensor> {
    let (out, k) = m.check("fp8_dequantize")?;
    if !k.is_multiple_of(8) || !(m.block.1.is_multiple_of(8) || m.block.1 >= k) {
        bail!(
            "fp8_dequantize: k {k} must be a multiple of 8 and the blocks {:?} whole rows or a \
             multiple of 8 columns",
            m.block
        );
    }
    let code = dtype_code(dtype, "fp8_dequantize")?;
    if code == 0 {
        bail!("fp8_dequantize: writes f16 or bf16, not f32");
    }
    let y = empty((out, k), dtype, m.data.device())?;
    let (yp, stream) = device_ptr(&y, "out")?;
    let (wp, _) = device_ptr(m.data, "w")?;
    let (sp, _) = device_ptr(m.scales, "scales")?;
    if wp % 8 != 0 {
        bail!("fp8_dequantize: the weight must start on an 8-byte boundary");
    }
    let int = |n: usize, what: &str| {
        i32::try_from(n).map_err(|_| {
            candle_core::Error::Msg(format!("fp8_dequantize: {what} {n} is too large"))
        })
    };
    // SAFETY: checked shapes and dtypes on one device: the kernel reads out x k bytes of w and
    // the scales' blocks, and writes out x k of y.
    let code = unsafe {
        ffi::pagewise_fp8_dequantize(
            code,
            yp as *mut c_void,
            wp as *const c_void,
            sp as *const f32,
            out as i64,
            int(k, "k")?,
            int(m.block.0.min(out.max(1)), "block rows")?,
            int(m.block.1.min(k), "block columns")?,
            stream,
        )
    };
    check_launch(code, "fp8_dequantize")?;
    Ok(y)
}

/// `w` (`[out, k]`, f16 or bf16, on a GPU) quantized to e4m3 with one scale a row (its largest
/// magnitude over 448; 1 for a row of zeros), values rounded to nearest even and saturated.
/// Returns the bytes (u8 `[out, k]`) and the scales (f32 `[out, 1]`): an [`Fp8Matrix`] of
/// blocks `(1, k)`.
pub fn fp8_quantize_rows(w: &Tensor) -> Result<(Tensor, Tensor)> {
    let (out, k) = w.dims2()?;
    let code = dtype_code(w.dtype(), "fp8_quantize_rows")?;
    if code == 0 {
        bail!("fp8_quantize_rows: takes f16 or bf16, not f32");
    }
    let q = empty((out, k), DType::U8, w.device())?;
    let s = empty((out, 1), DType::F32, w.device())?;
    let (qp, stream) = device_ptr(&q, "q")?;
    let (sp, _) = device_ptr(&s, "scales")?;
    let (wp, _) = device_ptr(w, "w")?;
    let k32 = i32::try_from(k)
        .map_err(|_| candle_core::Error::Msg(format!("fp8_quantize_rows: k {k} is too large")))?;
    // SAFETY: a contiguous [out, k] weight on the stream's device; the kernel reads it and writes
    // out x k bytes of q and out scales.
    let code = unsafe {
        ffi::pagewise_fp8_quantize_rows(
            code,
            qp as *mut c_void,
            sp as *mut f32,
            wp as *const c_void,
            out as i64,
            k32,
            stream,
        )
    };
    check_launch(code, "fp8_quantize_rows")?;
    Ok((q, s))
}
