//! Fused elementwise kernels of the decoder layer: residual add + RMSNorm, the residual add of a
//! normalized output, and SiLU-and-multiply over a fused gate/up projection. Each replaces two or three candle kernels (and their
//! intermediate tensors) with one pass.

use std::ffi::c_void;

use candle_core::{Result, Tensor, bail};

use crate::{check_launch, device_ptr, dtype_code, empty, ffi};

/// The rows, width and dtype code of a residual add with a norm (`what`): `x` and `delta`
/// `[rows, hidden]`, `weight` `[hidden]`, all one dtype the kernels take.
fn add_norm_shape(
    what: &str,
    x: &Tensor,
    delta: &Tensor,
    weight: &Tensor,
) -> Result<(usize, usize, i32)> {
    let (rows, hidden) = x.dims2()?;
    if delta.dims() != x.dims() || weight.dims() != [hidden] {
        bail!(
            "{what}: x {:?}, delta {:?} and weight {:?} do not match",
            x.dims(),
            delta.dims(),
            weight.dims()
        );
    }
    if delta.dtype() != x.dtype() || weight.dtype() != x.dtype() {
        bail!("{what}: x, delta and weight must share one dtype");
    }
    Ok((rows, hidden, dtype_code(x.dtype(), what)?))
}

/// `sum = x + delta` and `normed = rms_norm(sum) * weight` in one pass over `[rows, hidden]`
/// (`weight`: `[hidden]`; all one dtype, contiguous, on one GPU). Returns `(sum, normed)`.
pub fn add_rms_norm(
    x: &Tensor,
    delta: &Tensor,
    weight: &Tensor,
    eps: f32,
) -> Result<(Tensor, Tensor)> {
    let (rows, hidden, dtype) = add_norm_shape("add_rms_norm", x, delta, weight)?;
    let sum = empty(x.shape(), x.dtype(), x.device())?;
    let normed = empty(x.shape(), x.dtype(), x.device())?;
    let (s, stream) = device_ptr(&sum, "sum")?;
    let (n, _) = device_ptr(&normed, "normed")?;
    let (xp, _) = device_ptr(x, "x")?;
    let (dp, _) = device_ptr(delta, "delta")?;
    let (wp, _) = device_ptr(weight, "weight")?;
    // SAFETY: every pointer addresses a contiguous tensor of the checked shape and dtype on this
    // stream's device; the kernel reads and writes `rows * hidden` elements (`hidden` of weight).
    let code = unsafe {
        ffi::pagewise_add_rms_norm(
            dtype,
            s as *mut c_void,
            n as *mut c_void,
            xp as *const c_void,
            dp as *const c_void,
            wp as *const c_void,
            rows as i32,
            hidden as i32,
            eps,
            stream,
        )
    };
    check_launch(code, "add_rms_norm")?;
    Ok((sum, normed))
}

/// `x + rms_norm(delta) * weight` over `[rows, hidden]` (`weight`: `[hidden]`; all one dtype,
/// contiguous, on one GPU): Gemma's residual add of a normalized attention or MLP output, in one
/// kernel. The normalized delta is rounded to the dtype before the add, as the separate norm
/// stores it.
pub fn add_rms_normed(x: &Tensor, delta: &Tensor, weight: &Tensor, eps: f32) -> Result<Tensor> {
    let (rows, hidden, dtype) = add_norm_shape("add_rms_normed", x, delta, weight)?;
    let out = empty(x.shape(), x.dtype(), x.device())?;
    let (o, stream) = device_ptr(&out, "out")?;
    let (xp, _) = device_ptr(x, "x")?;
    let (dp, _) = device_ptr(delta, "delta")?;
    let (wp, _) = device_ptr(weight, "weight")?;
    // SAFETY: every pointer addresses a contiguous tensor of the checked shape and dtype on this
    // stream's device; the kernel reads `rows * hidden` elements of x and delta, `hidden` of
    // weight, and writes `rows * hidden` of out.
    let code = unsafe {
        ffi::pagewise_add_rms_normed(
            dtype,
            o as *mut c_void,
            xp as *const c_void,
            dp as *const c_void,
            wp as *const c_void,
            rows as i32,
            hidden as i32,
            eps,
            stream,
        )
    };
    check_launch(code, "add_rms_normed")?;
    Ok(out)
}

/// `silu(gate) * up` for `gate_up` = `[rows, 2 * inter]` (gate columns first, as a fused gate/up
/// projection writes them); returns `[rows, inter]`.
pub fn silu_mul(gate_up: &Tensor) -> Result<Tensor> {
    let (rows, width) = gate_up.dims2()?;
    if width % 2 != 0 {
        bail!("silu_mul: gate_up needs an even width, got {width}");
    }
    let inter = width / 2;
    let dtype = dtype_code(gate_up.dtype(), "silu_mul")?;
    let out = empty((rows, inter), gate_up.dtype(), gate_up.device())?;
    let (o, stream) = device_ptr(&out, "out")?;
    let (g, _) = device_ptr(gate_up, "gate_up")?;
    // SAFETY: `out` holds `rows * inter` and `gate_up` `rows * 2 * inter` elements of the dtype.
    let code = unsafe {
        ffi::pagewise_silu_mul(
            dtype,
            o as *mut c_void,
            g as *const c_void,
            rows as i64,
            inter as i32,
            stream,
        )
    };
    check_launch(code, "silu_mul")?;
    Ok(out)
}
