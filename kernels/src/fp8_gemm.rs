//! FP8 matmuls on Hopper's tensor cores through cuBLASLt, for the steps past the decode GEMVs'
//! rows: the activations are quantized to e4m3 per token (dynamic scales, [`fp8_quantize_rows`]),
//! the weight is e4m3 with one scale per output channel, and cuBLASLt applies both scale vectors
//! (its outer-vector scaling) as it writes bf16 or f16. What vLLM's `--quantization fp8` computes.
//! The model's FP8 layers call it for steps past the decode GEMVs' rows; kernels/tests/fp8.rs
//! checks it against the host (`fp8_gemm_matches_the_host_products_of_quantized_activations`) and
//! times it against cuBLAS bf16 (`fp8_gemm_speed`).

use std::ffi::c_void;
use std::mem::size_of;
use std::sync::{Arc, OnceLock};

use candle_core::cuda_backend::cudarc::cublaslt::{result, sys};
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use candle_core::{DType, Result, Tensor, bail};

use crate::{Fp8Matrix, device_ptr, empty, fp8_quantize_rows};

/// cuBLASLt's handle and workspace for one device (shared by a model's FP8 layers, which run in
/// order on the device's stream).
pub struct Fp8Gemm {
    handle: sys::cublasLtHandle_t,
    workspace: CudaSlice<u8>,
}

// SAFETY: the handle is not tied to a thread; the layers using it run one at a time on one stream.
unsafe impl Send for Fp8Gemm {}
// SAFETY: as above; `matmul` takes `&self` but every call is ordered on the device's stream.
unsafe impl Sync for Fp8Gemm {}

/// Workspace cuBLASLt may use (NVIDIA's recommendation for Hopper).
const WORKSPACE: usize = 32 << 20;

impl Fp8Gemm {
    /// A handle and workspace on `device`, if cuBLASLt runs an e4m3 matmul with per-row and
    /// per-column scales there (Hopper and later with cuBLAS 12.9+): checked with a small
    /// product.
    pub fn new(device: &candle_core::Device) -> Option<Self> {
        let candle_core::Device::Cuda(d) = device else {
            return None;
        };
        let handle = result::create_handle().ok()?;
        // SAFETY: an allocation the matmuls only use as scratch.
        let workspace = unsafe { d.cuda_stream().alloc::<u8>(WORKSPACE) }.ok()?;
        let gemm = Fp8Gemm { handle, workspace };
        let x = Tensor::ones((16, 16), DType::BF16, device).ok()?;
        let data = Tensor::zeros((16, 16), DType::U8, device).ok()?;
        let scales = Tensor::ones((16, 1), DType::F32, device).ok()?;
        let w = Fp8Matrix {
            data: &data,
            scales: &scales,
            block: (1, 16),
        };
        gemm.matmul(&x, w).ok()?;
        Some(gemm)
    }

    /// `x w^T` for `x` = `[m, k]` (f16 or bf16) and `w` one scale per output row (`[n, k]`,
    /// blocks `(1, k)`): `x` is quantized per row to e4m3, then one cuBLASLt matmul with both
    /// scale vectors. Returns `[m, n]` in `x`'s dtype. `k` a multiple of 16.
    pub fn matmul(&self, x: &Tensor, w: Fp8Matrix<'_>) -> Result<Tensor> {
        let (m, k) = x.dims2()?;
        let (n, wk) = w.dims()?;
        if wk != k || w.block != (1, k) || w.scales.dims() != [n, 1] {
            bail!(
                "fp8 matmul: x {:?} and w [{n}, {wk}] with blocks {:?} (one scale a row needed)",
                x.dims(),
                w.block
            );
        }
        let out_type = match x.dtype() {
            DType::BF16 => sys::cudaDataType::CUDA_R_16BF,
            DType::F16 => sys::cudaDataType::CUDA_R_16F,
            other => bail!("fp8 matmul: activations must be f16 or bf16, got {other:?}"),
        };
        if !k.is_multiple_of(16) || m == 0 || n == 0 {
            bail!("fp8 matmul: k {k} must be a multiple of 16, m {m} and n {n} positive");
        }
        let (xq, xs) = fp8_quantize_rows(&x.contiguous()?)?;
        let y = empty((m, n), x.dtype(), x.device())?;
        let (yp, stream) = device_ptr(&y, "y")?;
        let (xp, _) = device_ptr(&xq, "x")?;
        let (xsp, _) = device_ptr(&xs, "x scales")?;
        let (wp, _) = device_ptr(w.data, "w")?;
        let (wsp, _) = device_ptr(w.scales, "w scales")?;
        let cu_stream = stream as sys::cudaStream_t;
        let cuda = candle_stream(x)?;
        let (ws, _guard) = self.workspace.device_ptr(&cuda);
        // SAFETY: every pointer is a live device allocation of the checked shape on the stream's
        // device: op(A) = w [n, k] (stored k-major: cuBLAS's [k, n] transposed), B = xq (cuBLAS's
        // [k, m]), D = y (cuBLAS's [n, m], i.e. row-major [m, n]); scale vectors of n and m f32;
        // the descriptors are destroyed before returning.
        unsafe {
            let desc = Desc::new()?;
            desc.set(
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                &candle_core::cuda_backend::cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_T,
            )?;
            desc.set(
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSB,
                &candle_core::cuda_backend::cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_N,
            )?;
            let outer =
                sys::cublasLtMatmulMatrixScale_t::CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
            desc.set(
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_A_SCALE_MODE,
                &outer,
            )?;
            desc.set(
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_B_SCALE_MODE,
                &outer,
            )?;
            desc.set(
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                &(wsp as *const c_void),
            )?;
            desc.set(
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                &(xsp as *const c_void),
            )?;
            let e4m3 = sys::cudaDataType::CUDA_R_8F_E4M3;
            let a = Layout::new(e4m3, k, n)?;
            let b = Layout::new(e4m3, k, m)?;
            let d = Layout::new(out_type, n, m)?;
            let pref = Pref::new()?;
            let heuristic =
                result::get_matmul_algo_heuristic(self.handle, desc.0, a.0, b.0, d.0, d.0, pref.0)
                    .map_err(|e| {
                        candle_core::Error::Msg(format!("fp8 matmul: no cuBLASLt algorithm: {e:?}"))
                    })?;
            let (alpha, beta) = (1f32, 0f32);
            result::matmul(
                self.handle,
                desc.0,
                (&alpha) as *const f32 as *const c_void,
                (&beta) as *const f32 as *const c_void,
                wp as *const c_void,
                a.0,
                xp as *const c_void,
                b.0,
                yp as *const c_void,
                d.0,
                yp as *mut c_void,
                d.0,
                &heuristic.algo,
                ws as *mut c_void,
                WORKSPACE,
                cu_stream,
            )
            .map_err(|e| candle_core::Error::Msg(format!("fp8 matmul: {e:?}")))?;
        }
        // (xq and xs stay alive until here: the matmul is ordered on the stream before any later
        // reuse of their memory.)
        drop((xq, xs));
        Ok(y)
    }
}

impl Drop for Fp8Gemm {
    fn drop(&mut self) {
        // SAFETY: the handle was created by `new` and is destroyed once.
        let _ = unsafe { result::destroy_handle(self.handle) };
    }
}

/// The stream of `x`'s device.
fn candle_stream(x: &Tensor) -> Result<Arc<CudaStream>> {
    match x.device() {
        candle_core::Device::Cuda(d) => Ok(d.cuda_stream()),
        other => bail!("fp8 matmul: x must be on a GPU, it is on {other:?}"),
    }
}

/// Each device's [`Fp8Gemm`], made the first time it is asked for (`None` where cuBLASLt has no
/// scaled e4m3 matmul).
pub fn fp8_gemm(device: &candle_core::Device) -> Option<&'static Fp8Gemm> {
    static GEMMS: [OnceLock<Option<Fp8Gemm>>; 16] = [const { OnceLock::new() }; 16];
    let candle_core::Device::Cuda(d) = device else {
        return None;
    };
    let ordinal = d.cuda_stream().context().ordinal();
    GEMMS
        .get(ordinal)?
        .get_or_init(|| Fp8Gemm::new(device))
        .as_ref()
}

/// A matmul descriptor (f32 compute and scales), destroyed on drop.
struct Desc(sys::cublasLtMatmulDesc_t);

impl Desc {
    fn new() -> Result<Self> {
        result::create_matmul_desc(
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            sys::cudaDataType::CUDA_R_32F,
        )
        .map(Desc)
        .map_err(|e| candle_core::Error::Msg(format!("fp8 matmul: {e:?}")))
    }

    /// # Safety
    /// `T` must be the attribute's type.
    unsafe fn set<T>(&self, attr: sys::cublasLtMatmulDescAttributes_t, value: &T) -> Result<()> {
        // SAFETY: the caller's contract; the descriptor is live.
        unsafe {
            result::set_matmul_desc_attribute(
                self.0,
                attr,
                value as *const T as *const c_void,
                size_of::<T>(),
            )
        }
        .map_err(|e| candle_core::Error::Msg(format!("fp8 matmul: {attr:?}: {e:?}")))
    }
}

impl Drop for Desc {
    fn drop(&mut self) {
        // SAFETY: created by `new`, destroyed once.
        let _ = unsafe { result::destroy_matmul_desc(self.0) };
    }
}

/// A column-major matrix layout `[rows, cols]` with leading dimension `rows`.
struct Layout(sys::cublasLtMatrixLayout_t);

impl Layout {
    fn new(t: sys::cudaDataType, rows: usize, cols: usize) -> Result<Self> {
        result::create_matrix_layout(t, rows as u64, cols as u64, rows as i64)
            .map(Layout)
            .map_err(|e| candle_core::Error::Msg(format!("fp8 matmul: {e:?}")))
    }
}

impl Drop for Layout {
    fn drop(&mut self) {
        // SAFETY: created by `new`, destroyed once.
        let _ = unsafe { result::destroy_matrix_layout(self.0) };
    }
}

/// A matmul preference allowing [`WORKSPACE`] bytes.
struct Pref(sys::cublasLtMatmulPreference_t);

impl Pref {
    fn new() -> Result<Self> {
        let pref = result::create_matmul_pref()
            .map_err(|e| candle_core::Error::Msg(format!("fp8 matmul: {e:?}")))?;
        let pref = Pref(pref);
        let bytes = WORKSPACE;
        // SAFETY: the attribute is a size_t; the preference is live.
        unsafe {
            result::set_matmul_pref_attribute(
                pref.0,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&bytes) as *const usize as *const c_void,
                size_of::<usize>(),
            )
        }
        .map_err(|e| candle_core::Error::Msg(format!("fp8 matmul: {e:?}")))?;
        Ok(pref)
    }
}

impl Drop for Pref {
    fn drop(&mut self) {
        // SAFETY: created by `new`, destroyed once.
        let _ = unsafe { result::destroy_matmul_pref(self.0) };
    }
}
