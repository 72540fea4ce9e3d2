//! Dense experts for a decode token or two in slices of their inner columns
//! (`csrc/moe_slices.cu`): a block computes a few columns of one chosen expert's gate/up rows and
//! then the same columns of its down rows, storing its weighted share of every output in an f32
//! scratch; a second grid sums each output's shares in a fixed order with the biases and the
//! residual. One grid streams all the experts' weights with no grid-wide wait between gate/up
//! and down, which is what short experts (Qwen3-MoE's 768 columns) need; long ones keep the two
//! row grids of [`crate::moe_experts_with`].

use std::ffi::c_void;

use candle_core::{DType, Result, Tensor, bail};

use crate::moe::{CheckedExperts, ExpertWeights};
use crate::moe_routing::MoeRoutes;
use crate::o_router::RouterLogits;
use crate::{check_launch, device_ptr, empty, ffi};

/// The inner columns a slice takes where [`crate::ExpertPlan::Auto`] picks slices, else 0: for
/// `tokens` tokens of `top_k` experts of `hidden` x `inter`. Where it is 0,
/// [`crate::moe_route_experts`] does not take [`RouterLogits::BeforeNorm`].
pub fn moe_slice_columns(tokens: usize, top_k: usize, inter: usize, hidden: usize) -> usize {
    let fits = |n: usize| i32::try_from(n).is_ok();
    if ![tokens, top_k, inter, hidden].into_iter().all(fits) {
        return 0;
    }
    // SAFETY: a pure function of its integer arguments.
    let cols = unsafe {
        ffi::pagewise_moe_slice_columns(tokens as i32, top_k as i32, inter as i32, hidden as i32)
    };
    cols.max(0) as usize
}

/// The experts of `x` in slices of `cols` inner columns, for the shapes and extras `c` checked.
/// With `route_from` = `(logits, renormalize)` (f32 `[tokens, experts]`, checked), the slices
/// route each token themselves, as [`crate::moe_route`] does (logits before the norm scaled by
/// its 1 / rms first, see [`RouterLogits`]), and write the picks into `routes`' buffers;
/// otherwise they read `routes`.
pub(crate) fn moe_slices(
    x: &Tensor,
    gate_up: &Tensor,
    down: &Tensor,
    routes: &MoeRoutes,
    c: &CheckedExperts,
    cols: usize,
    route_from: Option<(RouterLogits<'_>, bool)>,
) -> Result<Tensor> {
    let (tokens, hidden, inter, top_k) = (c.tokens, c.hidden, c.inter, c.top_k);
    if ![8, 16, 32, 64].contains(&cols) || !inter.is_multiple_of(cols) {
        bail!("moe_experts: slices of {cols} columns (8, 16, 32 or 64) must divide {inter}");
    }
    if hidden > 8192 {
        bail!("moe_experts: slices take a hidden width of at most 8192, got {hidden}");
    }
    let (gp, _) = ExpertWeights::Dense(gate_up).ptrs(x.dtype(), "gate_up")?;
    let (dp, _) = ExpertWeights::Dense(down).ptrs(x.dtype(), "down")?;
    let slices = top_k * inter / cols;
    let partial = empty((tokens, slices, hidden), DType::F32, x.device())?;
    let y = empty((tokens, hidden), x.dtype(), x.device())?;
    let (pp, stream) = device_ptr(&partial, "slice scratch")?;
    let (yp, _) = device_ptr(&y, "y")?;
    let (xp, _) = device_ptr(x, "x")?;
    let (ip, _) = device_ptr(routes.ids(), "ids")?;
    let (wp, _) = device_ptr(routes.weights(), "weights")?;
    let (lp, experts, renormalize, norm_scales) = match route_from {
        Some((logits, renormalize)) => {
            let before_norm = matches!(logits, RouterLogits::BeforeNorm(_));
            if before_norm && c.norm == 0 {
                bail!("moe_experts: logits before the norm need the norm (extras.input_norm)");
            }
            let l = logits.tensor();
            let experts = l.dims2()?.1;
            (
                device_ptr(l, "logits")?.0,
                experts,
                renormalize,
                before_norm,
            )
        }
        None => (0, 0, false, false),
    };
    if [xp, gp, dp, pp, c.norm].iter().any(|p| p % 16 != 0) {
        bail!("moe_experts: x and the weights must start on 16-byte boundaries");
    }
    // SAFETY: contiguous tensors of the shapes check_experts checked, in its dtype, on the
    // stream's device; every id is below `experts` (MoeRoutes comes only from moe_route, or the
    // kernel routes from the checked logits itself), so each expert's rows lie inside gate_up and
    // down; `partial` holds tokens x slices x hidden f32.
    let code = unsafe {
        ffi::pagewise_moe_slices(
            c.dtype,
            cols as i32,
            yp as *mut c_void,
            pp as *mut f32,
            xp as *const c_void,
            c.norm as *const c_void,
            c.eps,
            gp as *const c_void,
            c.gate_up_bias as *const c_void,
            dp as *const c_void,
            c.down_bias as *const c_void,
            c.residual as *const c_void,
            ip as *mut u32,
            wp as *mut f32,
            lp as *const f32,
            norm_scales as i32,
            experts as i32,
            renormalize as i32,
            tokens as i32,
            top_k as i32,
            inter as i32,
            hidden as i32,
            c.alpha,
            c.limit,
            stream,
        )
    };
    check_launch(code, "moe_experts (slices)")?;
    Ok(y)
}
