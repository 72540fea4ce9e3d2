//! A mixture-of-experts layer for decode batches, on the device end to end: `moe_route`
//! (`moe_routing.rs`) picks
//! each token's experts and weights from the router's logits, [`moe_experts`] streams just those
//! experts' weights (GEMVs over the stacked expert tensors, the expert index read on the device)
//! and sums their outputs. Nothing is read back to the host, so a decode step with experts can be
//! captured in a CUDA graph. Each token reads its experts' weights itself: the right shape for a
//! few tokens, not for prefill.

use std::ffi::c_void;

use candle_core::{DType, Result, Tensor, bail};

use crate::moe_affine::AffineStack;
use crate::moe_routing::MoeRoutes;
use crate::moe_slices::{moe_slice_columns, moe_slices};
use crate::mxfp4::Mxfp4Stack;
use crate::{check_launch, device_ptr, dtype_code, empty, ffi};

/// Most experts a token may take.
pub const MOE_MAX_TOP_K: usize = 16;

/// Whether [`moe_experts`] takes `top_k` experts of inner width `inter` in `dtype`: the down
/// projection stages a token's `top_k` activations in shared memory (8 x 1536 and 2 x 14336 bf16
/// fit), and `inter` must be a multiple of 8.
pub fn moe_fits(top_k: usize, inter: usize, dtype: DType) -> bool {
    // SAFETY: a pure function of no arguments.
    let most = unsafe { ffi::pagewise_moe_max_stage_bytes() } as usize;
    (1..=MOE_MAX_TOP_K).contains(&top_k)
        && inter.is_multiple_of(8)
        && top_k * inter * dtype.size_in_bytes() <= most
}

/// Whether the expert kernels take `gate_up` and `down` (as [`moe_experts_with`] reads them)
/// for `top_k` experts a token with activations of `dtype`: [`moe_fits`], and for stacks of codes
/// their staged inputs (twice the input, piece-major, and each run's sum) within the staging
/// space too.
pub fn moe_stacks_fit(
    gate_up: ExpertWeights<'_>,
    down: ExpertWeights<'_>,
    top_k: usize,
    dtype: DType,
) -> bool {
    let (Ok((_, _, hidden)), Ok((_, _, inter))) = (gate_up.dims3(), down.dims3()) else {
        return false;
    };
    // SAFETY: a pure function of no arguments.
    let most = unsafe { ffi::pagewise_moe_max_stage_bytes() } as usize;
    let e = dtype.size_in_bytes();
    let gate_up_fits = match gate_up {
        ExpertWeights::Affine(s) => 2 * hidden * e + hidden / s.bits().lane_columns() * 4 <= most,
        _ => true,
    };
    let down_fits = match down {
        ExpertWeights::Affine(s) => {
            top_k * inter * e + top_k * inter / s.bits().lane_columns() * 4 <= most
        }
        _ => true,
    };
    moe_fits(top_k, inter, dtype) && gate_up_fits && down_fits
}

/// What experts compute beyond [`moe_experts`]'s SwiGLU without biases (gpt-oss's experts).
#[derive(Clone, Copy, Debug, Default)]
pub struct ExpertExtras<'a> {
    /// Each expert's gate/up bias, `[experts, 2 * inter]` (gate first), in the weights' dtype.
    pub gate_up_bias: Option<&'a Tensor>,
    /// Each expert's down bias, `[experts, hidden]`.
    pub down_bias: Option<&'a Tensor>,
    /// gpt-oss's clamped SwiGLU `(alpha, limit)`: `g = min(gate, limit)`,
    /// `u = clamp(up, -limit, limit)`, `(u + 1) * g * sigmoid(alpha * g)`; `None`: SiLU-and-mul.
    pub clamped_swiglu: Option<(f32, f32)>,
    /// An RMSNorm `(weight [hidden], eps)` the experts take `x` through first (rounded to the
    /// dtype, as a separate norm stores it).
    pub input_norm: Option<(&'a Tensor, f32)>,
    /// A residual `[tokens, hidden]` added to the experts' weighted sum before it is rounded.
    pub residual: Option<&'a Tensor>,
}

/// The experts' part of the layer for `x` (`[tokens, hidden]`): for each token, the sum over its
/// routed experts `e` of weight × `down[e] · (silu(g) * u)` where `g, u` are the halves of
/// `gate_up[e] · x` (`gate_up`: `[experts, 2 * inter, hidden]`, gate rows first; `down`:
/// `[experts, hidden, inter]`). f16 or bf16, contiguous, on one GPU; `hidden` a multiple of 8 and
/// [`moe_fits`]. Two kernels: gate/up with the activation (a warp takes a column's gate and up
/// rows), then down with the weighted sum. The gate/up outputs and the SiLU-and-mul are rounded
/// to the dtype as separate kernels store them; each token's weighted sum is taken in f32.
/// Returns `[tokens, hidden]`. `x` (and the extras) must be written before the `routes` are
/// ([`crate::moe_route`]): the slices ([`ExpertPlan::Slices`]) stage `x` while the routing may still run.
pub fn moe_experts(
    x: &Tensor,
    gate_up: &Tensor,
    down: &Tensor,
    routes: &MoeRoutes,
) -> Result<Tensor> {
    moe_experts_with(x, gate_up, down, routes, ExpertExtras::default())
}

/// Which kernels [`moe_experts_by`] runs dense experts with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpertPlan {
    /// What [`moe_experts_with`] picks: slices for one or two tokens (of 16, 32 or 64 columns,
    /// the narrowest that fill the GPU about three blocks an SM), rows for more tokens or where
    /// even 64 columns make more slices than that.
    Auto,
    /// Two grids of rows: gate/up with the activation, then down with the weighted sum.
    Rows,
    /// Slices of this many inner columns (8, 16, 32 or 64, dividing the inner width) of one
    /// chosen expert a block: gate/up then down in one grid, and a grid that sums the slices.
    Slices(usize),
}

/// A stack of experts' weights as the expert kernels read it: dense in the activations' dtype,
/// MXFP4, or integer codes with an affine map per group.
#[derive(Clone, Copy, Debug)]
pub enum ExpertWeights<'a> {
    /// `[experts, rows, cols]`, f16 or bf16.
    Dense(&'a Tensor),
    /// `[experts, rows, cols]` in MXFP4 (cols a multiple of 32).
    Mxfp4(&'a Mxfp4Stack),
    /// `[experts, rows, cols]` as 4-bit or byte codes with `(scale, offset)` pairs.
    Affine(&'a AffineStack),
}

impl<'a> From<&'a Tensor> for ExpertWeights<'a> {
    fn from(t: &'a Tensor) -> Self {
        ExpertWeights::Dense(t)
    }
}

impl<'a> From<&'a Mxfp4Stack> for ExpertWeights<'a> {
    fn from(s: &'a Mxfp4Stack) -> Self {
        ExpertWeights::Mxfp4(s)
    }
}

impl<'a> From<&'a AffineStack> for ExpertWeights<'a> {
    fn from(s: &'a AffineStack) -> Self {
        ExpertWeights::Affine(s)
    }
}

impl ExpertWeights<'_> {
    fn dims3(&self) -> Result<(usize, usize, usize)> {
        match self {
            ExpertWeights::Dense(t) => t.dims3(),
            ExpertWeights::Mxfp4(s) => Ok(s.dims3()),
            ExpertWeights::Affine(s) => Ok(s.dims3()),
        }
    }

    /// The weights' (or codes') address and the scales' (0 for dense weights), checked against
    /// the activations' dtype `dtype`.
    pub(crate) fn ptrs(&self, dtype: DType, what: &str) -> Result<(u64, u64)> {
        match self {
            ExpertWeights::Dense(t) if t.dtype() == dtype => Ok((device_ptr(t, what)?.0, 0)),
            ExpertWeights::Dense(t) => bail!(
                "moe_experts: {what} is {:?}, the activations {dtype:?}",
                t.dtype()
            ),
            ExpertWeights::Mxfp4(s) => {
                let (cp, sp, _) = s.ptrs()?;
                Ok((cp, sp))
            }
            ExpertWeights::Affine(s) => s.ptrs(),
        }
    }
}

/// [`moe_experts`] with `extras`: biases after either projection (the down bias inside the
/// weighting), the clamped SwiGLU in place of SiLU-and-mul, an input RMSNorm and a residual.
/// Either stack may be MXFP4 ([`Mxfp4Stack`]): the kernels read its codes as they are, and sum
/// the same products in the same order as the row kernels over the dequantized stack
/// ([`ExpertPlan::Rows`]), so those results are the same bit for bit. Either may be integer codes
/// ([`AffineStack`]): the kernels read them as they are, each load as `s * sum(q x) + b *
/// sum(x)`, so within f32 rounding of the dequantized stack's results (not bit for bit).
pub fn moe_experts_with<'a>(
    x: &Tensor,
    gate_up: impl Into<ExpertWeights<'a>>,
    down: impl Into<ExpertWeights<'a>>,
    routes: &MoeRoutes,
    extras: ExpertExtras<'_>,
) -> Result<Tensor> {
    moe_experts_by(x, gate_up, down, routes, extras, ExpertPlan::Auto)
}

/// [`moe_experts_with`] by the kernels `plan` names ([`ExpertPlan::Auto`]: as
/// [`moe_experts_with`] picks them). The plans compute the same products; the slices sum each
/// output's in another order.
pub fn moe_experts_by<'a>(
    x: &Tensor,
    gate_up: impl Into<ExpertWeights<'a>>,
    down: impl Into<ExpertWeights<'a>>,
    routes: &MoeRoutes,
    extras: ExpertExtras<'_>,
    plan: ExpertPlan,
) -> Result<Tensor> {
    let (gate_up, down) = (gate_up.into(), down.into());
    let c = check_experts(x, gate_up, down, routes, &extras)?;
    let (tokens, hidden, inter, top_k) = (c.tokens, c.hidden, c.inter, c.top_k);
    let dense = match (gate_up, down) {
        (ExpertWeights::Dense(g), ExpertWeights::Dense(d)) => Some((g, d)),
        _ => None,
    };
    let cols = match plan {
        ExpertPlan::Rows => 0,
        ExpertPlan::Slices(n) => n,
        ExpertPlan::Auto if dense.is_some() => moe_slice_columns(tokens, top_k, inter, hidden),
        ExpertPlan::Auto => 0,
    };
    if cols > 0 {
        let Some((g, d)) = dense else {
            bail!("moe_experts: slices take dense experts only");
        };
        return moe_slices(x, g, d, routes, &c, cols, None);
    }
    if !moe_stacks_fit(gate_up, down, top_k, x.dtype()) {
        bail!("moe_experts: {top_k} x {inter} must fit the staging space");
    }
    let mid = empty((tokens * top_k, inter), x.dtype(), x.device())?;
    let y = empty((tokens, hidden), x.dtype(), x.device())?;
    let (mp, stream) = device_ptr(&mid, "gate_up output")?;
    let (yp, _) = device_ptr(&y, "y")?;
    let (xp, _) = device_ptr(x, "x")?;
    let (gp, gsp) = gate_up.ptrs(x.dtype(), "gate_up")?;
    let (dp, dsp) = down.ptrs(x.dtype(), "down")?;
    let (ip, _) = device_ptr(&routes.ids, "ids")?;
    let (wp, _) = device_ptr(&routes.weights, "weights")?;
    // 16-byte loads: rows start 16-byte aligned when the tensors do (widths are multiples of 8).
    if [xp, gp, dp, mp, c.norm].iter().any(|p| p % 16 != 0) {
        bail!("moe_experts: x and the weights must start on 16-byte boundaries");
    }
    // Both launches: contiguous tensors of the checked shapes and dtype on the stream's device
    // (an MXFP4 stack: codes and scales of its checked dims, columns in whole runs of 32; a stack
    // of codes: codes and pairs of its checked dims, columns in whole runs, groups the kernels
    // take); every id is below `experts` (MoeRoutes comes only from moe_route over `experts`
    // logits), so each expert's rows lie inside gate_up and down.
    let code = match gate_up {
        // SAFETY: as said above.
        ExpertWeights::Affine(s) => unsafe {
            ffi::pagewise_moe_affine_gate_up(
                c.dtype,
                mp as *mut c_void,
                xp as *const c_void,
                c.norm as *const c_void,
                c.eps,
                gp as *const c_void,
                gsp as *const c_void,
                s.group() as i32,
                s.bits().bits() as i32,
                c.gate_up_bias as *const c_void,
                ip as *const u32,
                tokens as i32,
                top_k as i32,
                inter as i32,
                hidden as i32,
                c.alpha,
                c.limit,
                stream,
            )
        },
        // SAFETY: as said above.
        _ => unsafe {
            ffi::pagewise_moe_gate_up(
                c.dtype,
                mp as *mut c_void,
                xp as *const c_void,
                c.norm as *const c_void,
                c.eps,
                gp as *const c_void,
                gsp as *const u8,
                c.gate_up_bias as *const c_void,
                ip as *const u32,
                tokens as i32,
                top_k as i32,
                inter as i32,
                hidden as i32,
                c.alpha,
                c.limit,
                stream,
            )
        },
    };
    check_launch(code, "moe_experts (gate/up)")?;
    // Both launches: as above; `mid` holds tokens x top_k rows of inter activations.
    let code = match down {
        // SAFETY: as said above.
        ExpertWeights::Affine(s) => unsafe {
            ffi::pagewise_moe_affine_down(
                c.dtype,
                yp as *mut c_void,
                mp as *const c_void,
                dp as *const c_void,
                dsp as *const c_void,
                s.group() as i32,
                s.bits().bits() as i32,
                c.down_bias as *const c_void,
                c.residual as *const c_void,
                ip as *const u32,
                wp as *const f32,
                tokens as i32,
                top_k as i32,
                hidden as i32,
                inter as i32,
                stream,
            )
        },
        // SAFETY: as said above.
        _ => unsafe {
            ffi::pagewise_moe_down(
                c.dtype,
                yp as *mut c_void,
                mp as *const c_void,
                dp as *const c_void,
                dsp as *const u8,
                c.down_bias as *const c_void,
                c.residual as *const c_void,
                ip as *const u32,
                wp as *const f32,
                tokens as i32,
                top_k as i32,
                hidden as i32,
                inter as i32,
                stream,
            )
        },
    };
    check_launch(code, "moe_experts (down)")?;
    Ok(y)
}

/// What the expert kernels' callers checked: the shapes, and the extras' device addresses (0 for
/// none).
pub(crate) struct CheckedExperts {
    pub tokens: usize,
    pub hidden: usize,
    pub inter: usize,
    pub experts: usize,
    pub top_k: usize,
    pub dtype: i32,
    pub gate_up_bias: u64,
    pub down_bias: u64,
    pub norm: u64,
    pub eps: f32,
    pub residual: u64,
    pub alpha: f32,
    pub limit: f32,
}

/// Checks `x`, the stacks, the routes and the extras against one another, as the expert kernels
/// take them.
pub(crate) fn check_experts(
    x: &Tensor,
    gate_up: ExpertWeights<'_>,
    down: ExpertWeights<'_>,
    routes: &MoeRoutes,
    extras: &ExpertExtras<'_>,
) -> Result<CheckedExperts> {
    let (tokens, hidden) = x.dims2()?;
    let (experts, width, gk) = gate_up.dims3()?;
    let (de, dh, inter) = down.dims3()?;
    let (rt, top_k) = routes.ids.dims2()?;
    if experts != routes.experts || de != experts || rt != tokens {
        bail!(
            "moe_experts: {experts} and {de} experts in the weights and {} routed, {rt} routed \
             tokens for {tokens}",
            routes.experts
        );
    }
    if gk != hidden || dh != hidden || width != 2 * inter {
        bail!(
            "moe_experts: x {:?}, gate_up {:?} and down {:?} do not fit",
            x.dims(),
            (experts, width, gk),
            (de, dh, inter)
        );
    }
    if !hidden.is_multiple_of(8) || !inter.is_multiple_of(8) {
        bail!("moe_experts: hidden {hidden} and inner width {inter} must be multiples of 8");
    }
    if tokens > 65535 {
        bail!("moe_experts: {tokens} tokens (at most 65535)");
    }
    let dtype = dtype_code(x.dtype(), "moe_experts")?;
    if dtype == 0 {
        bail!("moe_experts: f16 or bf16 only");
    }
    let bias_ptr = |b: Option<&Tensor>, width: usize, what: &str| -> Result<u64> {
        let Some(b) = b else { return Ok(0) };
        if b.dims() != [experts, width] || b.dtype() != x.dtype() || !b.is_contiguous() {
            bail!(
                "moe_experts: the {what} bias must be contiguous {:?} [{experts}, {width}], got {:?} {:?}",
                x.dtype(),
                b.dtype(),
                b.dims()
            );
        }
        Ok(device_ptr(b, what)?.0)
    };
    let gbp = bias_ptr(extras.gate_up_bias, width, "gate/up")?;
    let dbp = bias_ptr(extras.down_bias, hidden, "down")?;
    let (np, eps) = match extras.input_norm {
        Some((w, eps)) => {
            if w.dims() != [hidden] || w.dtype() != x.dtype() || !w.is_contiguous() {
                bail!(
                    "moe_experts: the input norm's weight must be contiguous {:?} [{hidden}], got {:?} {:?}",
                    x.dtype(),
                    w.dtype(),
                    w.dims()
                );
            }
            (device_ptr(w, "input norm")?.0, eps)
        }
        None => (0, 0.0),
    };
    let rp = match extras.residual {
        Some(r) => {
            if r.dims() != [tokens, hidden] || r.dtype() != x.dtype() || !r.is_contiguous() {
                bail!(
                    "moe_experts: the residual must be contiguous {:?} [{tokens}, {hidden}], got {:?} {:?}",
                    x.dtype(),
                    r.dtype(),
                    r.dims()
                );
            }
            device_ptr(r, "residual")?.0
        }
        None => 0,
    };
    let (alpha, limit) = match extras.clamped_swiglu {
        Some((a, l)) if a > 0.0 => (a, l),
        Some((a, _)) => bail!("moe_experts: a clamped SwiGLU needs alpha > 0, got {a}"),
        None => (0.0, 0.0),
    };
    Ok(CheckedExperts {
        tokens,
        hidden,
        inter,
        experts,
        top_k,
        dtype,
        gate_up_bias: gbp,
        down_bias: dbp,
        norm: np,
        eps,
        residual: rp,
        alpha,
        limit,
    })
}
