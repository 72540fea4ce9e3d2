//! A mixture-of-experts layer's o projection with its router folded in (`csrc/o_router.cu`), for
//! the fused decode path: the router scores `RMSNorm(h) * g` for the stream `h = residual +
//! o(a)`, and as the norm scales a row by one number, `1 / rms(h)`, its logits are that number
//! times `[A | B] [a | residual]` with `B = W_r diag(g)` and `A = B W_o` ([`fold_router`], made
//! at load). [`o_router`] scores them in blocks of the o projection's own grid, so no router
//! kernel waits for `h`; the expert slices scale them as they stage the norm
//! ([`RouterLogits::BeforeNorm`]).

use std::ffi::c_void;

use candle_core::{D, DType, Result, Tensor, bail};

use crate::{check_launch, device_ptr, dtype_code, empty, ffi};

/// Where the expert slices' routing logits come from (f32 `[tokens, experts]`).
#[derive(Clone, Copy, Debug)]
pub enum RouterLogits<'a> {
    /// The router's logits of the experts' input ([`crate::moe_router`]).
    Normed(&'a Tensor),
    /// [`o_router`]'s, of the stream before its norm's `1 / rms`: the slices scale each token's
    /// by it as they stage the norm.
    BeforeNorm(&'a Tensor),
}

impl<'a> RouterLogits<'a> {
    /// The logits.
    pub fn tensor(&self) -> &'a Tensor {
        match *self {
            RouterLogits::Normed(t) | RouterLogits::BeforeNorm(t) => t,
        }
    }
}

/// `[W_r diag(g) W_o | W_r diag(g)]` (f32 `[experts, k + hidden]`) for the router's f32 weight
/// `router` (`[experts, hidden]`), the norm weight `g` before it (`[hidden]`) and the o
/// projection `o` (`[hidden, k]`): what [`o_router`] scores `[a | residual]` against. Made in f32
/// on `o`'s device.
pub fn fold_router(router: &Tensor, g: &Tensor, o: &Tensor) -> Result<Tensor> {
    let (_, hidden) = router.dims2()?;
    let (o_out, _) = o.dims2()?;
    if router.dtype() != DType::F32 || g.dims() != [hidden] || o_out != hidden {
        bail!(
            "fold_router: the router (f32 [experts, hidden]) {:?} {:?}, norm weight {:?} and o {:?} do not fit",
            router.dtype(),
            router.dims(),
            g.dims(),
            o.dims()
        );
    }
    let b = router
        .to_device(o.device())?
        .broadcast_mul(&g.to_dtype(DType::F32)?.reshape((1, hidden))?)?;
    let a = b.matmul(&o.to_dtype(DType::F32)?)?;
    Tensor::cat(&[&a, &b], D::Minus1)?.contiguous()
}

/// `(residual + a o^T, logits)` for the attention output `a` (`[rows, k]`, 1 or 2 rows), the o
/// projection `o` (`[hidden, k]`), the residual stream `residual` (`[rows, hidden]`, all f16 or
/// all bf16) and `folded` = [`fold_router`]'s (f32 `[experts, k + hidden]`): the stream bit for
/// bit as [`crate::gemv_fused`] computes it with the residual, and the router's f32 logits of its
/// norm before the norm's `1 / rms` (`[rows, experts]`; [`RouterLogits::BeforeNorm`]). Those are
/// the logits of the stream before it is rounded and normalized: they differ from
/// [`crate::moe_router`]'s by about that rounding.
pub fn o_router(
    a: &Tensor,
    o: &Tensor,
    residual: &Tensor,
    folded: &Tensor,
) -> Result<(Tensor, Tensor)> {
    let (rows, k) = a.dims2()?;
    let (hidden, ok) = o.dims2()?;
    let (experts, fk) = folded.dims2()?;
    let dtype = dtype_code(a.dtype(), "o_router")?;
    if dtype == 0 || o.dtype() != a.dtype() || residual.dtype() != a.dtype() {
        bail!(
            "o_router: a, o and the residual must all be f16 or bf16, got {:?}, {:?} and {:?}",
            a.dtype(),
            o.dtype(),
            residual.dtype()
        );
    }
    if !(1..=2).contains(&rows)
        || ok != k
        || residual.dims() != [rows, hidden]
        || folded.dtype() != DType::F32
        || fk != k + hidden
        || !k.is_multiple_of(8)
        || !hidden.is_multiple_of(8)
        || experts == 0
    {
        bail!(
            "o_router: a {:?}, o {:?}, residual {:?} and the folded router {:?} {:?} do not fit (1 or 2 rows, f32 [experts, k + hidden], k and hidden multiples of 8)",
            a.dims(),
            o.dims(),
            residual.dims(),
            folded.dtype(),
            folded.dims()
        );
    }
    let (a, o, residual, folded) = (
        a.contiguous()?,
        o.contiguous()?,
        residual.contiguous()?,
        folded.contiguous()?,
    );
    let y = empty((rows, hidden), a.dtype(), a.device())?;
    let logits = empty((rows, experts), DType::F32, a.device())?;
    let (yp, stream) = device_ptr(&y, "y")?;
    let (lp, _) = device_ptr(&logits, "logits")?;
    let (ap, _) = device_ptr(&a, "a")?;
    let (op, _) = device_ptr(&o, "o")?;
    let (rp, _) = device_ptr(&residual, "residual")?;
    let (fp, _) = device_ptr(&folded, "folded router")?;
    if [ap, op, rp, fp].iter().any(|p| p % 16 != 0) {
        bail!("o_router: every input must start on a 16-byte boundary");
    }
    // SAFETY: contiguous tensors of the checked shapes and dtypes on the stream's device; y and
    // logits are fresh, of [rows, hidden] and f32 [rows, experts].
    let code = unsafe {
        ffi::pagewise_o_router(
            dtype,
            yp as *mut c_void,
            lp as *mut f32,
            ap as *const c_void,
            op as *const c_void,
            rp as *const c_void,
            fp as *const f32,
            rows as i32,
            experts as i32,
            hidden as i32,
            k as i32,
            stream,
        )
    };
    check_launch(code, "o_router")?;
    Ok((y, logits))
}
