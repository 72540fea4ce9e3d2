//! Grouped GEMMs for a mixture of experts' prefill and large steps: the step's (token, expert)
//! rows sorted by expert, then one cuBLAS grouped GEMM (`cublasGemmGroupedBatchedEx`) multiplies
//! each expert's run of rows by that expert's slice of the stacked weights, all experts in one
//! call, where a loop over the experts would launch a handful of kernels each.

use candle_core::cuda_backend::cudarc::cublas::{CudaBlas, sys};
use candle_core::{DType, Device, Result, Tensor, bail};

use crate::{device_ptr, empty};

/// A cuBLAS handle on a device's stream, for [`GroupedGemm::matmul`].
#[derive(Debug)]
pub struct GroupedGemm {
    blas: CudaBlas,
}

impl GroupedGemm {
    /// A handle on `device`'s stream (a CUDA device).
    pub fn new(device: &Device) -> Result<Self> {
        let stream = device.as_cuda_device()?.cuda_stream();
        let blas = CudaBlas::new(stream).map_err(|e| candle_core::Error::Msg(e.to_string()))?;
        Ok(GroupedGemm { blas })
    }

    /// `y` (`[rows, n]`) with, for each `(expert, count)` of `groups` in turn, the next `count`
    /// rows of `x` (`[rows, k]`) times `w[expert]` transposed (`w`: `[experts, n, k]`, as a
    /// linear layer stores its weight). The counts must add up to `rows`; f16 or bf16,
    /// contiguous, on this handle's device. Sums in f32.
    pub fn matmul(&self, x: &Tensor, w: &Tensor, groups: &[(usize, usize)]) -> Result<Tensor> {
        let (rows, k) = x.dims2()?;
        let (experts, n, wk) = w.dims3()?;
        if wk != k || w.dtype() != x.dtype() {
            bail!(
                "grouped matmul: x {:?} {:?} and w {:?} {:?} do not fit",
                x.dtype(),
                x.dims(),
                w.dtype(),
                w.dims()
            );
        }
        if groups.iter().map(|g| g.1).sum::<usize>() != rows
            || groups.iter().any(|&(e, _)| e >= experts)
        {
            bail!(
                "grouped matmul: groups {groups:?} do not cover {rows} rows of {experts} experts"
            );
        }
        let data_type = match x.dtype() {
            DType::BF16 => sys::cudaDataType_t::CUDA_R_16BF,
            DType::F16 => sys::cudaDataType_t::CUDA_R_16F,
            other => bail!("grouped matmul: f16 or bf16, got {other:?}"),
        };
        if !x.is_contiguous() || !w.is_contiguous() {
            bail!("grouped matmul: x and w must be contiguous");
        }
        let y = empty((rows, n), x.dtype(), x.device())?;
        let groups: Vec<(usize, usize)> = groups.iter().copied().filter(|g| g.1 > 0).collect();
        if groups.is_empty() {
            return Ok(y);
        }
        let (xp, _) = device_ptr(x, "x")?;
        let (wp, _) = device_ptr(w, "w")?;
        let (yp, _) = device_ptr(&y, "y")?;
        let es = x.dtype().size_in_bytes() as u64;
        // Column-major, each group computes y_g^T (n x count) = W_e (k x n, transposed) times
        // x_g^T (k x count).
        let (mut a, mut b, mut c) = (Vec::new(), Vec::new(), Vec::new());
        let mut row = 0u64;
        for &(e, count) in &groups {
            a.push(wp + e as u64 * (n * k) as u64 * es);
            b.push(xp + row * k as u64 * es);
            c.push(yp + row * n as u64 * es);
            row += count as u64;
        }
        let g = groups.len();
        // (Pointers as i64: the dtype candle has of their width.)
        let on_device = |v: Vec<u64>| {
            Tensor::from_vec(v.into_iter().map(|p| p as i64).collect(), g, x.device())
        };
        let (a, b, c) = (on_device(a)?, on_device(b)?, on_device(c)?);
        let (ap, _) = device_ptr(&a, "pointers")?;
        let (bp, _) = device_ptr(&b, "pointers")?;
        let (cp, _) = device_ptr(&c, "pointers")?;
        let int = |v: usize| -> Result<i32> {
            i32::try_from(v).map_err(|_| candle_core::Error::Msg(format!("{v} exceeds i32")))
        };
        let transa = vec![sys::cublasOperation_t::CUBLAS_OP_T; g];
        let transb = vec![sys::cublasOperation_t::CUBLAS_OP_N; g];
        let ms = vec![int(n)?; g];
        let ns = groups
            .iter()
            .map(|gr| int(gr.1))
            .collect::<Result<Vec<_>>>()?;
        let ks = vec![int(k)?; g];
        let (alpha, beta) = (vec![1f32; g], vec![0f32; g]);
        let (lda, ldb, ldc) = (vec![int(k)?; g], vec![int(k)?; g], vec![int(n)?; g]);
        let sizes = vec![1i32; g];
        // SAFETY: the handle is on x's stream; every pointer addresses a whole matrix inside x, w
        // or y (the groups were checked to cover x's rows and name experts of w); the pointer
        // arrays are device tensors of `g` entries, alive until the call is enqueued (cuBLAS
        // reads them on the stream, before a later drop's free, which is stream-ordered).
        let status = unsafe {
            sys::cublasGemmGroupedBatchedEx(
                *self.blas.handle(),
                transa.as_ptr(),
                transb.as_ptr(),
                ms.as_ptr(),
                ns.as_ptr(),
                ks.as_ptr(),
                alpha.as_ptr().cast(),
                ap as *const *const std::ffi::c_void,
                data_type,
                lda.as_ptr(),
                bp as *const *const std::ffi::c_void,
                data_type,
                ldb.as_ptr(),
                beta.as_ptr().cast(),
                cp as *const *mut std::ffi::c_void,
                data_type,
                ldc.as_ptr(),
                int(g)?,
                sizes.as_ptr(),
                sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            )
        };
        if status != sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            bail!("grouped matmul: cuBLAS {status:?}");
        }
        Ok(y)
    }
}
