//! Stacked MXFP4 matrices on the GPU (gpt-oss's experts as its checkpoints ship them: 4.25 bits a
//! weight where bf16 takes 16): the expert kernels ([`crate::moe_experts_with`]) read them as
//! they are, and [`Mxfp4Stack::dequantize_into`] expands the experts a grouped GEMM needs.

use std::ffi::c_void;

use candle_core::{DType, Device, Result, Tensor, bail};

use crate::{check_launch, device_ptr, dtype_code, ffi};

/// The largest E8M0 scale byte taken: 2^113. Real checkpoints' scales are far below; weights past
/// it (6 x 2^113) would leave f32 sums little room before they overflow.
pub const MXFP4_MAX_SCALE: u8 = 240;

/// `experts` matrices `[rows, cols]` in MXFP4 on one GPU: `codes` u8 `[experts, rows, cols / 2]`
/// (values 2i and 2i + 1 of a row in byte i's low and high nibble, FP4 E2M1) and `scales` u8
/// `[experts, rows, cols / 32]` (one E8M0 scale for each run of 32 values of a row).
#[derive(Clone, Debug)]
pub struct Mxfp4Stack {
    codes: Tensor,
    scales: Tensor,
    cols: usize,
}

impl Mxfp4Stack {
    /// Uploads `codes` and `scales` (laid out as the type says) of `experts` matrices
    /// `[rows, cols]` to `device` (a GPU). `cols` a multiple of 32; every scale at most
    /// [`MXFP4_MAX_SCALE`].
    pub fn from_host(
        codes: &[u8],
        scales: &[u8],
        (experts, rows, cols): (usize, usize, usize),
        device: &Device,
    ) -> Result<Self> {
        if !cols.is_multiple_of(32)
            || codes.len() != experts * rows * cols / 2
            || scales.len() != experts * rows * cols / 32
        {
            bail!(
                "MXFP4: {} code bytes and {} scales for {experts} matrices of [{rows}, {cols}] \
                 (columns in whole runs of 32)",
                codes.len(),
                scales.len()
            );
        }
        if let Some(s) = scales.iter().find(|&&s| s > MXFP4_MAX_SCALE) {
            bail!(
                "MXFP4: a scale of 2^{} (at most 2^113)",
                i32::from(*s) - 127
            );
        }
        if !device.is_cuda() {
            bail!("MXFP4 weights are read as they are on a GPU only");
        }
        Ok(Mxfp4Stack {
            codes: Tensor::from_slice(codes, (experts, rows, cols / 2), device)?,
            scales: Tensor::from_slice(scales, (experts, rows, cols / 32), device)?,
            cols,
        })
    }

    /// `(experts, rows, cols)`.
    pub fn dims3(&self) -> (usize, usize, usize) {
        let (experts, rows, _) = self.codes.dims3().unwrap_or((0, 0, 0));
        (experts, rows, self.cols)
    }

    /// The device addresses of the codes and the scales, and the stream.
    pub(crate) fn ptrs(&self) -> Result<(u64, u64, *mut c_void)> {
        let (cp, stream) = device_ptr(&self.codes, "MXFP4 codes")?;
        let (sp, _) = device_ptr(&self.scales, "MXFP4 scales")?;
        Ok((cp, sp, stream))
    }

    /// Writes the values of each expert in `experts` (each below the stack's experts) into its
    /// place in `out` (contiguous f16 or bf16 `[experts, rows, cols]` on this GPU: a dense stack,
    /// as the grouped GEMMs read it), exactly (each value is a code times a power of two). The
    /// other experts' places keep what they held. `out` is written in place: the caller owns it
    /// (a scratch stack, read by the kernels queued after this one on the same stream).
    pub fn dequantize_into(&self, out: &Tensor, experts: &[u32]) -> Result<()> {
        let (n, rows, cols) = self.dims3();
        if out.dims() != [n, rows, cols] || !out.is_contiguous() {
            bail!(
                "MXFP4 dequantize: out {:?} for [{n}, {rows}, {cols}]",
                out.dims()
            );
        }
        let dtype = dtype_code(out.dtype(), "MXFP4 dequantize")?;
        if dtype == 0 {
            bail!("MXFP4 dequantize: to f16 or bf16, not {:?}", out.dtype());
        }
        if let Some(e) = experts.iter().find(|&&e| e as usize >= n) {
            bail!("MXFP4 dequantize: expert {e} of {n}");
        }
        if experts.is_empty() {
            return Ok(());
        }
        let ids = Tensor::from_slice(experts, experts.len(), out.device())?;
        let (op, stream) = device_ptr(out, "MXFP4 dequantize output")?;
        let (ip, _) = device_ptr(&ids, "expert ids")?;
        let (cp, sp, _) = self.ptrs()?;
        if op % 16 != 0 {
            bail!("MXFP4 dequantize: out must start on a 16-byte boundary");
        }
        // SAFETY: `out` is [n, rows, cols] of the dtype on the stream's device, the stack holds n
        // matrices of rows x cols (cols a multiple of 32), every listed expert is below n; the
        // kernel writes only the listed experts' values.
        let code = unsafe {
            ffi::pagewise_mxfp4_dequant(
                dtype,
                op as *mut c_void,
                cp as *const u8,
                sp as *const u8,
                ip as *const u32,
                experts.len() as i32,
                (rows * cols) as i64,
                stream,
            )
        };
        check_launch(code, "MXFP4 dequantize")
    }

    /// A dense stack `[experts, rows, cols]` of `dtype` (f16 or bf16) with every expert's values.
    pub fn dequantize(&self, dtype: DType) -> Result<Tensor> {
        let (n, rows, cols) = self.dims3();
        let out = crate::empty((n, rows, cols), dtype, self.codes.device())?;
        self.dequantize_into(&out, &(0..n as u32).collect::<Vec<_>>())?;
        Ok(out)
    }
}
