//! A mixture-of-experts layer's routing on the device: the router's f32 logits ([`moe_router`],
//! the norm before it folded into its staging), each token's experts and weights from them
//! ([`moe_route`]), and both with the experts ([`moe_route_experts`]: where the expert slices take
//! the step, their blocks route their own token).

use std::ffi::c_void;

use candle_core::{DType, Result, Tensor, bail};

use crate::moe::{ExpertExtras, ExpertWeights, MOE_MAX_TOP_K, check_experts, moe_experts_with};
use crate::moe_slices::{moe_slice_columns, moe_slices};
use crate::o_router::RouterLogits;
use crate::{check_launch, device_ptr, dtype_code, empty, ffi};

/// Each token's chosen experts (`ids`, u32 `[tokens, top_k]`) and their weights (f32, same
/// shape), as [`moe_route`] makes them: every id is below `experts`, which is what lets
/// [`crate::moe_experts`] index the stacked weights with them safely.
#[derive(Clone, Debug)]
pub struct MoeRoutes {
    pub(crate) ids: Tensor,
    pub(crate) weights: Tensor,
    pub(crate) experts: usize,
}

impl MoeRoutes {
    /// The chosen experts, u32 `[tokens, top_k]`, the most probable first.
    pub fn ids(&self) -> &Tensor {
        &self.ids
    }

    /// Their weights, f32 `[tokens, top_k]`.
    pub fn weights(&self) -> &Tensor {
        &self.weights
    }

    /// These routes for a stack that holds only the `count` experts from `first` (expert
    /// parallelism: a rank's whole experts): a slot routed to a held expert keeps its weight
    /// and takes the expert's index in the stack; any other slot gets weight 0 and a valid index
    /// (the nearest end of the run), so the expert kernels run unchanged and add nothing for it.
    /// Device ops only (no copy from the host), so it runs inside a CUDA graph.
    pub fn held(&self, first: usize, count: usize) -> Result<MoeRoutes> {
        if count == 0 || first + count > self.experts {
            bail!(
                "MoeRoutes::held: experts {first}..{} of {}",
                first + count,
                self.experts
            );
        }
        let (shape, dev) = (self.ids.shape(), self.ids.device());
        let at = self
            .ids
            .to_dtype(DType::F32)?
            .affine(1.0, -(first as f64))?;
        let zero = Tensor::full(0f32, shape, dev)?;
        let last = Tensor::full((count - 1) as f32, shape, dev)?;
        let local = at.maximum(&zero)?.minimum(&last)?;
        let inside = at.eq(&local)?;
        Ok(MoeRoutes {
            ids: local.to_dtype(DType::U32)?,
            weights: inside.where_cond(&self.weights, &zero)?,
            experts: count,
        })
    }
}

/// The most experts [`moe_route`] takes.
pub fn moe_max_experts() -> usize {
    // SAFETY: a pure function of no arguments.
    unsafe { ffi::pagewise_moe_max_experts() as usize }
}

/// A router's f32 logits `[tokens, experts]` for `x` (`[tokens, hidden]`, f16 or bf16; taken
/// through the RMSNorm `norm` = `(weight [hidden], eps)` first, rounded to its dtype, when given)
/// and the router's f32 weight `w` (`[experts, hidden]`): one kernel, where a separate norm, a
/// cast and an f32 matmul take four. `hidden` a multiple of 8.
pub fn moe_router(x: &Tensor, w: &Tensor, norm: Option<(&Tensor, f32)>) -> Result<Tensor> {
    let (tokens, hidden) = x.dims2()?;
    let (experts, wk) = w.dims2()?;
    let dtype = dtype_code(x.dtype(), "moe_router")?;
    if dtype == 0 || w.dtype() != DType::F32 {
        bail!(
            "moe_router: x must be f16 or bf16 and the weight f32, got {:?} and {:?}",
            x.dtype(),
            w.dtype()
        );
    }
    // SAFETY: a pure function of no arguments.
    let most = unsafe { ffi::pagewise_moe_max_stage_bytes() } as usize;
    if wk != hidden || !hidden.is_multiple_of(8) || hidden * 2 > most {
        bail!(
            "moe_router: x {:?} and weight {:?} do not fit (hidden a multiple of 8, at most {})",
            x.dims(),
            w.dims(),
            most / 2
        );
    }
    let (np, eps) = match norm {
        Some((n, eps)) if n.dims() == [hidden] && n.dtype() == x.dtype() => {
            (device_ptr(n, "norm weight")?.0, eps)
        }
        Some((n, _)) => bail!(
            "moe_router: the norm weight must be {:?} [{hidden}], got {:?} {:?}",
            x.dtype(),
            n.dtype(),
            n.dims()
        ),
        None => (0, 0.0),
    };
    let logits = empty((tokens, experts), DType::F32, x.device())?;
    let (lp, stream) = device_ptr(&logits, "logits")?;
    let (xp, _) = device_ptr(x, "x")?;
    let (wp, _) = device_ptr(w, "router weight")?;
    if [xp, wp, np].iter().any(|p| p % 16 != 0) {
        bail!("moe_router: x, the norm and the weight must start on 16-byte boundaries");
    }
    // SAFETY: contiguous tensors of the checked shapes and dtypes on the stream's device: the
    // kernel reads tokens x hidden of x, hidden of the norm and experts x hidden f32 weights, and
    // writes tokens x experts logits.
    let code = unsafe {
        ffi::pagewise_moe_router(
            dtype,
            lp as *mut f32,
            xp as *const c_void,
            np as *const c_void,
            eps,
            wp as *const f32,
            tokens as i32,
            experts as i32,
            hidden as i32,
            stream,
        )
    };
    check_launch(code, "moe_router")?;
    Ok(logits)
}

/// `(tokens, experts)` of router `logits` that [`moe_route`] takes for `top_k`.
fn check_logits(logits: &Tensor, top_k: usize) -> Result<(usize, usize)> {
    let (tokens, experts) = logits.dims2()?;
    if logits.dtype() != DType::F32 {
        bail!("moe_route: logits must be f32, got {:?}", logits.dtype());
    }
    if experts > moe_max_experts() {
        bail!(
            "moe_route: {experts} experts (at most {})",
            moe_max_experts()
        );
    }
    if !(1..=MOE_MAX_TOP_K.min(experts)).contains(&top_k) {
        bail!("moe_route: top_k {top_k} must be 1..={MOE_MAX_TOP_K} and at most {experts} experts");
    }
    Ok((tokens, experts))
}

/// Routes each row of `logits` (f32 `[tokens, experts]`, a router's output) to its `top_k` most
/// probable experts under the softmax (ties to the lower expert), with the softmax probabilities
/// as weights, renormalized to sum to one over the chosen experts when `renormalize`. At most
/// [`moe_max_experts`] experts.
pub fn moe_route(logits: &Tensor, top_k: usize, renormalize: bool) -> Result<MoeRoutes> {
    let (tokens, experts) = check_logits(logits, top_k)?;
    let ids = empty((tokens, top_k), DType::U32, logits.device())?;
    let weights = empty((tokens, top_k), DType::F32, logits.device())?;
    let (lp, stream) = device_ptr(logits, "logits")?;
    let (ip, _) = device_ptr(&ids, "ids")?;
    let (wp, _) = device_ptr(&weights, "weights")?;
    // SAFETY: contiguous tensors of the checked shapes on the stream's device: the kernel reads
    // tokens x experts logits and writes tokens x top_k ids and weights.
    let code = unsafe {
        ffi::pagewise_moe_route(
            lp as *const f32,
            ip as *mut u32,
            wp as *mut f32,
            tokens as i32,
            experts as i32,
            top_k as i32,
            renormalize as i32,
            stream,
        )
    };
    check_launch(code, "moe_route")?;
    Ok(MoeRoutes {
        ids,
        weights,
        experts,
    })
}

/// [`moe_route`] then [`moe_experts_with`] for `x` and the router's f32 `logits`, the same
/// results bit for bit; where the slices take the step ([`crate::ExpertPlan::Auto`]: dense experts, one
/// or two tokens), their blocks route each token themselves, so no routing kernel runs between
/// the router and the experts. `logits` must be contiguous; `x` and the extras written before
/// them (see [`crate::moe_experts`]), except with [`RouterLogits::BeforeNorm`], which only the slices
/// take ([`crate::moe_slice_columns`] not 0), with `extras.input_norm`.
pub fn moe_route_experts<'a>(
    x: &Tensor,
    gate_up: impl Into<ExpertWeights<'a>>,
    down: impl Into<ExpertWeights<'a>>,
    router_logits: RouterLogits<'_>,
    (top_k, renormalize): (usize, bool),
    extras: ExpertExtras<'_>,
) -> Result<Tensor> {
    let (gate_up, down) = (gate_up.into(), down.into());
    let logits = router_logits.tensor();
    let (tokens, experts) = check_logits(logits, top_k)?;
    if let (ExpertWeights::Dense(g), ExpertWeights::Dense(d)) = (gate_up, down) {
        let (_, hidden, inter) = d.dims3()?;
        let cols = moe_slice_columns(tokens, top_k, inter, hidden);
        if cols > 0 && logits.is_contiguous() {
            let routes = MoeRoutes {
                ids: empty((tokens, top_k), DType::U32, logits.device())?,
                weights: empty((tokens, top_k), DType::F32, logits.device())?,
                experts,
            };
            let c = check_experts(x, gate_up, down, &routes, &extras)?;
            return moe_slices(
                x,
                g,
                d,
                &routes,
                &c,
                cols,
                Some((router_logits, renormalize)),
            );
        }
    }
    if let RouterLogits::BeforeNorm(_) = router_logits {
        bail!(
            "moe_route_experts: logits before the norm need the slices (dense experts, contiguous logits, moe_slice_columns not 0)"
        );
    }
    let routes = moe_route(logits, top_k, renormalize)?;
    moe_experts_with(x, gate_up, down, &routes, extras)
}
