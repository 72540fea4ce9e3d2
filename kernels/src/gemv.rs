//! The weight-streaming matmul of small decode batches (up to [`GEMV_MAX_ROWS`] rows, f16/bf16),
//! optionally with the step before it (RMSNorm, SiLU-and-multiply or GeGLU's GELU-and-multiply;
//! or, [`gemv_add_normed`], Gemma's normalized residual add and then the next norm) folded into
//! its reading of `x` and the residual add after it folded into its stores: one kernel where the
//! unfused layer runs two or three, which is what a batch-1 decode step is made of.

use std::ffi::c_void;

use candle_core::{DType, Result, Tensor, bail};

use crate::{GemvWeight, check_launch, device_ptr, dtype_code, empty, ffi};

/// Most rows [`gemv`] takes.
pub const GEMV_MAX_ROWS: usize = 8;

/// What [`gemv_fused`] computes from `x` before the matmul.
#[derive(Clone, Copy, Debug)]
pub enum GemvInput<'a> {
    /// `x` itself (`[rows, k]`).
    Plain,
    /// `rms_norm(x) * weight` (`x`: `[rows, k]`, `weight`: `[k]`).
    RmsNorm {
        /// The norm's scale.
        weight: &'a Tensor,
        /// Its epsilon.
        eps: f32,
    },
    /// `silu(x[:, :k]) * x[:, k:]` (`x`: `[rows, 2k]`, gate columns first).
    SiluMul,
    /// `gelu_tanh(x[:, :k]) * x[:, k:]` (Gemma's GeGLU; `x`: `[rows, 2k]`, gate columns first;
    /// no residual). The GELU is rounded to the dtype before the product, as the separate GELU
    /// kernel stores it.
    GeluTanhMul,
}

impl GemvInput<'_> {
    fn code(&self) -> i32 {
        match self {
            GemvInput::Plain => 0,
            GemvInput::RmsNorm { .. } => 1,
            GemvInput::SiluMul => 2,
            GemvInput::GeluTanhMul => 3,
        }
    }

    /// The matmul's inner size `k` for an `x` of `x_cols` columns.
    fn inner(&self, x_cols: usize) -> usize {
        match self {
            GemvInput::SiluMul | GemvInput::GeluTanhMul => x_cols / 2,
            _ => x_cols,
        }
    }
}

/// Whether [`gemv_fused`] takes `rows` rows of inner size `k` in `dtype`: the kernel stages them
/// in shared memory, so `rows x k` is bounded (8 x 4096 and 2 x 14336 bf16 fit, 8 x 14336 does
/// not), and `k` must be a multiple of 8.
pub fn gemv_fits(rows: usize, k: usize, dtype: DType) -> bool {
    // SAFETY: a pure function of no arguments.
    let most = unsafe { ffi::pagewise_gemv_max_stage_bytes() } as usize;
    (1..=GEMV_MAX_ROWS).contains(&rows)
        && k.is_multiple_of(8)
        && rows * k * dtype.size_in_bytes() <= most
}

/// `x w^T` for `x` = `[rows, k]` with `rows <= GEMV_MAX_ROWS` and `w` = `[out, k]` (f16 or bf16, or FP8,
/// `k` a multiple of 8, contiguous). Returns `[rows, out]`.
pub fn gemv<'w>(x: &Tensor, w: impl Into<GemvWeight<'w>>) -> Result<Tensor> {
    gemv_fused(x, w, GemvInput::Plain, None)
}

/// `input(x) w^T (+ residual)`: `w` = `[out, k]` (dense or FP8, see [`GemvWeight`]), `x` as
/// [`GemvInput`] says, `residual` = `[rows, out]`; all f16 or bf16, contiguous, on one GPU, and
/// [`gemv_fits`]. The staged input and the product before the residual add are rounded to the
/// dtype, as the unfused kernels store them. Returns `[rows, out]`.
pub fn gemv_fused<'w>(
    x: &Tensor,
    w: impl Into<GemvWeight<'w>>,
    input: GemvInput<'_>,
    residual: Option<&Tensor>,
) -> Result<Tensor> {
    let w = w.into();
    let (rows, x_cols) = x.dims2()?;
    let k = input.inner(x_cols);
    let (out_dim, wk) = w.dims()?;
    let gated = matches!(input, GemvInput::SiluMul | GemvInput::GeluTanhMul);
    if wk != k || (gated && x_cols != 2 * k) {
        bail!(
            "gemv: x {:?} ({input:?}) does not fit w {:?}",
            x.dims(),
            (out_dim, wk)
        );
    }
    if !matches!(x.dtype(), DType::BF16 | DType::F16) || !w.takes(x.dtype()) {
        bail!(
            "gemv: x must be f16 or bf16 and w the same dtype or FP8, got {:?} and {w:?}",
            x.dtype(),
        );
    }
    if !gemv_fits(rows, k, x.dtype()) {
        bail!(
            "gemv: {rows} rows of {k} (a multiple of 8) do not fit its staging space or its {GEMV_MAX_ROWS} rows"
        );
    }
    let norm = match input {
        GemvInput::RmsNorm { weight, .. } => {
            if weight.dims() != [k] || weight.dtype() != x.dtype() {
                bail!(
                    "gemv: the norm weight must be {:?} [{k}], got {:?} {:?}",
                    x.dtype(),
                    weight.dtype(),
                    weight.dims()
                );
            }
            Some(weight)
        }
        _ => None,
    };
    if residual.is_some() && matches!(input, GemvInput::GeluTanhMul) {
        bail!("gemv: GeluTanhMul takes no residual");
    }
    if let Some(r) = residual
        && (r.dims() != [rows, out_dim] || r.dtype() != x.dtype())
    {
        bail!(
            "gemv: the residual must be {:?} [{rows}, {out_dim}], got {:?} {:?}",
            x.dtype(),
            r.dtype(),
            r.dims()
        );
    }
    let dtype = dtype_code(x.dtype(), "gemv")?;
    let y = empty((rows, out_dim), x.dtype(), x.device())?;
    let (yp, stream) = device_ptr(&y, "y")?;
    let (xp, _) = device_ptr(x, "x")?;
    let wt = w.pointers(x.dtype(), rows, "gemv")?;
    let wp = wt.w;
    let np = match norm {
        Some(n) => device_ptr(n, "norm weight")?.0,
        None => 0,
    };
    let rp = match residual {
        Some(r) => device_ptr(r, "residual")?.0,
        None => 0,
    };
    // 16-byte loads: every row starts 16-byte aligned when the tensor does (k is a multiple of
    // 8 elements; candle's allocations are 256-byte aligned, views are checked here).
    if xp % 16 != 0 || wp % 16 != 0 || np % 16 != 0 {
        bail!("gemv: x, w and the norm weight must start on 16-byte boundaries");
    }
    let eps = match input {
        GemvInput::RmsNorm { eps, .. } => eps,
        _ => 0.0,
    };
    // SAFETY: contiguous tensors of the checked shapes and dtype on the stream's device; the
    // kernel reads rows x k (2k for the gated inputs) of x, out x k of w, k of the norm weight, rows x out
    // of the residual, and writes rows x out of y.
    let code = unsafe {
        ffi::pagewise_gemv(
            dtype,
            input.code(),
            yp as *mut c_void,
            xp as *const c_void,
            np as *const c_void,
            wp as *const c_void,
            wt.kind,
            wt.scales,
            wt.block_rows,
            wt.block_cols,
            rp as *const c_void,
            rows as i32,
            out_dim as i32,
            k as i32,
            eps,
            stream,
        )
    };
    check_launch(code, "gemv")?;
    Ok(y)
}

/// Gemma's normalized residual add folded into the next projection: with
/// `s = stream + rms_norm(delta) * delta_norm` (the normalized delta rounded to the dtype before
/// the add, as [`crate::add_rms_normed`] computes it), returns `(rms_norm(s) * norm w^T, s)`:
/// the projection of the next norm's output, and the residual stream the layer goes on with.
/// `delta` and `stream` are `[rows, k]`, both norm weights `[k]` (one `eps`), `w` `[out, k]`
/// (dense or FP8); all f16 or bf16, contiguous, on one GPU, and [`gemv_fits`]. One kernel
/// instead of two.
pub fn gemv_add_normed<'w>(
    delta: &Tensor,
    stream: &Tensor,
    delta_norm: &Tensor,
    norm: &Tensor,
    eps: f32,
    w: impl Into<GemvWeight<'w>>,
) -> Result<(Tensor, Tensor)> {
    let w = w.into();
    let (rows, k) = delta.dims2()?;
    let (out_dim, wk) = w.dims()?;
    let dt = delta.dtype();
    if wk != k || stream.dims() != [rows, k] {
        bail!(
            "gemv_add_normed: delta {:?} and stream {:?} do not fit w {:?}",
            delta.dims(),
            stream.dims(),
            (out_dim, wk)
        );
    }
    if !w.takes(dt) {
        bail!("gemv_add_normed: w {w:?} is neither {dt:?} nor FP8 the GEMV takes");
    }
    for (name, t) in [
        ("stream", stream),
        ("delta_norm", delta_norm),
        ("norm", norm),
    ] {
        if t.dtype() != dt {
            bail!("gemv_add_normed: {name} is {:?}, delta {dt:?}", t.dtype());
        }
    }
    if delta_norm.dims() != [k] || norm.dims() != [k] {
        bail!(
            "gemv_add_normed: the norm weights must be [{k}], got {:?} and {:?}",
            delta_norm.dims(),
            norm.dims()
        );
    }
    if !matches!(dt, DType::BF16 | DType::F16) || !gemv_fits(rows, k, dt) {
        bail!(
            "gemv_add_normed: {rows} rows of {k} {dt:?} do not fit the GEMV (f16 or bf16, k a multiple of 8, at most {GEMV_MAX_ROWS} rows within its staging space)"
        );
    }
    if out_dim == 0 {
        // (No block would run to store the stream: an empty projection is not a layer's.)
        bail!("gemv_add_normed: w has no rows");
    }
    let dtype = dtype_code(dt, "gemv_add_normed")?;
    let y = empty((rows, out_dim), dt, delta.device())?;
    let sum = empty((rows, k), dt, delta.device())?;
    let (yp, cuda_stream) = device_ptr(&y, "y")?;
    let (sp, _) = device_ptr(&sum, "stream out")?;
    let (dp, _) = device_ptr(delta, "delta")?;
    let (ip, _) = device_ptr(stream, "stream")?;
    let (dwp, _) = device_ptr(delta_norm, "delta norm")?;
    let (np, _) = device_ptr(norm, "norm")?;
    let wt = w.pointers(dt, rows, "gemv_add_normed")?;
    let wp = wt.w;
    if [dp, ip, dwp, np, wp].iter().any(|p| p % 16 != 0) {
        bail!("gemv_add_normed: its inputs must start on 16-byte boundaries");
    }
    // SAFETY: contiguous tensors of the checked shapes and dtype on the stream's device; the
    // kernel reads rows x k of delta and stream, k of each norm weight and out x k of w, and
    // writes rows x out of y and rows x k of sum (a fresh tensor, apart from every input).
    let code = unsafe {
        ffi::pagewise_gemv_add_normed(
            dtype,
            yp as *mut c_void,
            sp as *mut c_void,
            dp as *const c_void,
            ip as *const c_void,
            dwp as *const c_void,
            np as *const c_void,
            wp as *const c_void,
            wt.kind,
            wt.scales,
            wt.block_rows,
            wt.block_cols,
            rows as i32,
            out_dim as i32,
            k as i32,
            eps,
            cuda_stream,
        )
    };
    check_launch(code, "gemv_add_normed")?;
    Ok((y, sum))
}
