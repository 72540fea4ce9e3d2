//! Stacked experts of integer codes with an affine map per group, `w = s * q + b` (4-bit AWQ and
//! GPTQ experts with `b = -s * z`, and GGUF experts repacked at load): the expert kernels
//! ([`crate::moe_experts_with`]) read them as they are, and [`AffineStack::dequantize_into`]
//! expands the experts a grouped GEMM needs.

use std::ffi::c_void;

use candle_core::{DType, Result, Tensor, bail};

use crate::affine::{AffineMatrix, CodeBits};
use crate::{check_launch, device_ptr, dtype_code, ffi};

/// `experts` matrices `[rows, cols]` of codes on one GPU, each element `s * q + b` for its code
/// `q` and the f16 pair `(s, b)` of its row's group (see [`AffineMatrix`], whose layout each
/// expert has).
#[derive(Clone, Debug)]
pub struct AffineStack {
    /// u8 `[experts, rows, cols * bits / 8]`.
    codes: Tensor,
    /// f16 `[experts, rows, groups, 2]`.
    scale_offset: Tensor,
    group: usize,
    bits: CodeBits,
}

impl AffineStack {
    /// The stack of `codes` (u8 `[experts, rows, cols * bits / 8]`) and `scale_offset` (f16
    /// `[experts, rows, ceil(cols / group), 2]`), both contiguous on one GPU. The expert kernels
    /// take it when `cols` is a multiple of 32 (4-bit) or 16 (bytes) and the group whole rows or
    /// a power of two of at least that.
    pub fn new(codes: Tensor, scale_offset: Tensor, group: usize, bits: CodeBits) -> Result<Self> {
        let (experts, rows, bytes) = codes.dims3()?;
        let cols = bytes * 8 / bits.bits();
        if experts == 0 || rows == 0 || cols == 0 {
            bail!("affine experts: an empty stack {:?}", codes.dims());
        }
        let stack = AffineStack {
            codes,
            scale_offset,
            group,
            bits,
        };
        stack.check()?;
        if !stack.codes.device().is_cuda() {
            bail!("affine experts are read as they are on a GPU only");
        }
        Ok(stack)
    }

    /// `(experts, rows, cols)`.
    pub fn dims3(&self) -> (usize, usize, usize) {
        let (experts, rows, bytes) = self.codes.dims3().unwrap_or((0, 0, 0));
        (experts, rows, bytes * 8 / self.bits.bits())
    }

    /// The codes (u8 `[experts, rows, cols * bits / 8]`) and pairs (f16 `[experts, rows, groups,
    /// 2]`).
    pub fn parts(&self) -> (&Tensor, &Tensor) {
        (&self.codes, &self.scale_offset)
    }

    /// Columns a group.
    pub fn group(&self) -> usize {
        self.group
    }

    /// The codes' width.
    pub fn bits(&self) -> CodeBits {
        self.bits
    }

    /// That the parts agree (the experts' rows one after the other as one [`AffineMatrix`]) and
    /// that the expert kernels take them.
    fn check(&self) -> Result<()> {
        let (experts, rows, bytes) = self.codes.dims3()?;
        let pairs_dims = self.scale_offset.dims();
        if pairs_dims.len() != 4 || pairs_dims[..2] != [experts, rows] {
            bail!(
                "affine experts: pairs {pairs_dims:?} for codes {:?}",
                self.codes.dims()
            );
        }
        let codes = self.codes.reshape((experts * rows, bytes))?;
        let pairs = self
            .scale_offset
            .reshape((experts * rows, pairs_dims[2], 2))?;
        let m = AffineMatrix {
            codes: &codes,
            scale_offset: &pairs,
            group: self.group,
            bits: self.bits,
        };
        let (_, cols) = m.check("affine experts")?;
        if !m.gemv_fits() {
            bail!(
                "affine experts: {cols} columns in groups of {} do not fit the expert kernels \
                 ({}-bit codes)",
                self.group,
                self.bits.bits()
            );
        }
        Ok(())
    }

    /// The device addresses of the codes and the pairs.
    pub(crate) fn ptrs(&self) -> Result<(u64, u64)> {
        let (cp, _) = device_ptr(&self.codes, "affine expert codes")?;
        let (sp, _) = device_ptr(&self.scale_offset, "affine expert pairs")?;
        if cp % 16 != 0 || sp % 4 != 0 {
            bail!("affine experts: codes must start on 16-byte boundaries, pairs on 4");
        }
        Ok((cp, sp))
    }

    /// Writes the values of each expert in `experts` (each below the stack's experts) into its
    /// place in `out` (contiguous f16 or bf16 `[experts, rows, cols]` on this GPU: a dense stack,
    /// as the grouped GEMMs read it), each `s * q + b` in f32 rounded once. The other experts'
    /// places keep what they held. Runs of consecutive experts take one launch.
    pub fn dequantize_into(&self, out: &Tensor, experts: &[u32]) -> Result<()> {
        let (n, rows, cols) = self.dims3();
        if out.dims() != [n, rows, cols] || !out.is_contiguous() {
            bail!(
                "affine experts dequantize: out {:?} for [{n}, {rows}, {cols}]",
                out.dims()
            );
        }
        let dtype = dtype_code(out.dtype(), "affine experts dequantize")?;
        if dtype == 0 {
            bail!(
                "affine experts dequantize: to f16 or bf16, not {:?}",
                out.dtype()
            );
        }
        if let Some(e) = experts.iter().find(|&&e| e as usize >= n) {
            bail!("affine experts dequantize: expert {e} of {n}");
        }
        let (op, stream) = device_ptr(out, "affine experts dequantize output")?;
        let (cp, sp) = self.ptrs()?;
        if op % 16 != 0 {
            bail!("affine experts dequantize: out must start on a 16-byte boundary");
        }
        let groups = self.scale_offset.dim(2)?;
        let (code_bytes, elem) = (
            rows * cols * self.bits.bits() / 8,
            out.dtype().size_in_bytes(),
        );
        let mut sorted = experts.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        for run in sorted.chunk_by(|a, b| a + 1 == *b) {
            let (first, count) = (run[0] as usize, run.len());
            // SAFETY: `out` is [n, rows, cols] of the dtype on the stream's device and the stack
            // holds n matrices of rows x cols codes with rows x groups pairs each; experts
            // first..first + count lie inside both, so the kernel reads and writes only their
            // places.
            let code = unsafe {
                ffi::pagewise_affine_dequantize(
                    dtype,
                    (op as usize + first * rows * cols * elem) as *mut c_void,
                    (cp as usize + first * code_bytes) as *const c_void,
                    (sp as usize + first * rows * groups * 4) as *const c_void,
                    (count * rows) as i64,
                    cols as i32,
                    self.group.min(cols) as i32,
                    self.bits.bits() as i32,
                    stream,
                )
            };
            check_launch(code, "affine experts dequantize")?;
        }
        Ok(())
    }

    /// A dense stack `[experts, rows, cols]` of `dtype` (f16 or bf16) with every expert's values.
    pub fn dequantize(&self, dtype: DType) -> Result<Tensor> {
        let (n, rows, cols) = self.dims3();
        let out = crate::empty((n, rows, cols), dtype, self.codes.device())?;
        self.dequantize_into(&out, &(0..n as u32).collect::<Vec<_>>())?;
        Ok(out)
    }
}
