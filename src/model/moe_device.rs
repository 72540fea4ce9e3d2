//! The device path of a mixture-of-experts layer: the experts' weights stacked once at load.
//! Small steps (decode) run `pagewise_kernels::moe_route` and `moe_experts` — routing, each
//! token's chosen experts and their weighted sum without reading anything back to the host, so
//! the step runs inside a CUDA graph; each token streams its own experts' weights, which is what a
//! few tokens need. Larger steps (prefill) route on the device too, read the chosen ids back to
//! sort the rows by expert, and run two grouped GEMMs, which read each chosen expert once.
//! gpt-oss's experts stay MXFP4 (4.25 bits a weight): steps of a few tokens stream them token by
//! token, steps of up to `MXFP4_DEVICE_TOKENS` sort their slots by expert on the device and read
//! the codes as they are on tensor cores (`moe_experts_fp4_mma`), still inside CUDA graphs; a
//! larger step dequantizes the experts it routes to into a scratch stack for the grouped GEMMs.

use std::sync::{Arc, Mutex, Weak};

use candle_core::{DType, Device, Tensor};
use pagewise_kernels::{
    AffineStack, ExpertWeights, GroupedGemm, MoeRoutes, Mxfp4Stack, RouterLogits,
};

use super::gpt_oss::Mxfp4Experts;
use super::layers::Linear;
use super::moe::{
    AFFINE_DEVICE_TOKENS, DEVICE_TOKENS, Expert, ExpertActivation, MXFP4_DEVICE_TOKENS,
    MXFP4_TOKEN_KERNEL_TOKENS, MoeSettings,
};
use super::moe_sorted::SortedRoutes;

/// One projection's stacked experts: dense, MXFP4, or integer codes.
enum Stack {
    Dense(Tensor),
    Mxfp4(Mxfp4Stack),
    Affine(AffineStack),
}

impl Stack {
    fn weights(&self) -> ExpertWeights<'_> {
        match self {
            Stack::Dense(t) => ExpertWeights::Dense(t),
            Stack::Mxfp4(s) => ExpertWeights::Mxfp4(s),
            Stack::Affine(s) => ExpertWeights::Affine(s),
        }
    }

    /// `(experts, rows, cols)`.
    fn dims3(&self) -> candle_core::Result<(usize, usize, usize)> {
        match self {
            Stack::Dense(t) => t.dims3(),
            Stack::Mxfp4(s) => Ok(s.dims3()),
            Stack::Affine(s) => Ok(s.dims3()),
        }
    }
}

/// A layer's expert weights stacked: gate/up `[experts, 2 * inter, hidden]` (gate rows first)
/// and down `[experts, hidden, inter]`, with their biases (gpt-oss) stacked the same way.
pub struct Stacked {
    /// Experts in the stack.
    experts: usize,
    /// Under expert parallelism, the global index of the stack's first expert (the rank holds
    /// a run of whole experts; the router scores them all).
    first: Option<usize>,
    gate_up: Stack,
    down: Stack,
    /// For MXFP4 stacks and stacks of codes: the dense stack (of the model dtype, as large as the
    /// larger projection) a grouped GEMM reads the step's experts from, shared by the layers on
    /// one stream.
    scratch: Option<Arc<Tensor>>,
    gate_up_bias: Option<Tensor>,
    down_bias: Option<Tensor>,
    activation: ExpertActivation,
    /// The cuBLAS handle of larger steps' grouped GEMMs, shared by the layers on one stream.
    grouped: Arc<GroupedGemm>,
}

/// The grouped-GEMM handle on `device`'s stream: the one the model's other layers hold, or a new
/// one. (A handle keeps its stream alive, so a live entry's stream is this one.)
fn grouped_handle(device: &Device) -> candle_core::Result<Arc<GroupedGemm>> {
    static HANDLES: Mutex<Vec<(usize, Weak<GroupedGemm>)>> = Mutex::new(Vec::new());
    let stream = device.as_cuda_device()?.cuda_stream().cu_stream() as usize;
    let mut handles = HANDLES.lock().unwrap_or_else(|e| e.into_inner());
    handles.retain(|(_, h)| h.strong_count() > 0);
    if let Some(h) = handles
        .iter()
        .find(|(s, _)| *s == stream)
        .and_then(|(_, h)| h.upgrade())
    {
        return Ok(h);
    }
    let h = Arc::new(GroupedGemm::new(device)?);
    handles.push((stream, Arc::downgrade(&h)));
    Ok(h)
}

/// A scratch of at least `elements` of `dtype` on `device`'s stream: the one the model's other
/// layers hold, or a new one. (The layers run one after the other on the stream, so each fills it
/// just before its grouped GEMM reads it.)
fn scratch(device: &Device, elements: usize, dtype: DType) -> candle_core::Result<Arc<Tensor>> {
    type Entry = (usize, DType, Weak<Tensor>);
    static SCRATCH: Mutex<Vec<Entry>> = Mutex::new(Vec::new());
    let stream = device.as_cuda_device()?.cuda_stream().cu_stream() as usize;
    let mut all = SCRATCH.lock().unwrap_or_else(|e| e.into_inner());
    all.retain(|(_, _, t)| t.strong_count() > 0);
    let found = all
        .iter()
        .find_map(|(s, d, t)| match *s == stream && *d == dtype {
            true => t.upgrade().filter(|t| t.elem_count() >= elements),
            false => None,
        });
    if let Some(t) = found {
        return Ok(t);
    }
    let t = Arc::new(pagewise_kernels::empty(elements, dtype, device)?);
    all.push((stream, dtype, Arc::downgrade(&t)));
    Ok(t)
}

impl Stacked {
    /// gpt-oss's experts as MXFP4 stacks on `device` (the model dtype `dtype`), with `top_k`
    /// experts a token, and the scratch their grouped GEMMs dequantize into.
    pub fn mxfp4(
        e: Mxfp4Experts,
        device: &Device,
        dtype: DType,
        activation: ExpertActivation,
    ) -> candle_core::Result<Stacked> {
        let upload = |h: &super::mxfp4::Mxfp4Host| {
            Mxfp4Stack::from_host(&h.codes, &h.scales, h.dims, device)
        };
        let (gate_up, down) = (upload(&e.gate_up)?, upload(&e.down)?);
        let (n, rows, cols) = e.gate_up.dims;
        let (_, drows, dcols) = e.down.dims;
        let elements = n * (rows * cols).max(drows * dcols);
        Ok(Stacked {
            experts: n,
            first: None,
            gate_up: Stack::Mxfp4(gate_up),
            down: Stack::Mxfp4(down),
            scratch: Some(scratch(device, elements, dtype)?),
            gate_up_bias: Some(e.gate_up_bias.to_dtype(dtype)?),
            down_bias: e.down_bias.map(|b| b.to_dtype(dtype)).transpose()?,
            activation,
            grouped: grouped_handle(device)?,
        })
    }

    /// This stack as the run of experts from `first` of a layer's `total` (expert parallelism);
    /// the whole layer when it holds all of them.
    pub fn holding(mut self, first: usize, total: usize) -> Stacked {
        self.first = (self.experts != total).then_some(first);
        self
    }

    /// Whether the stack holds only some of the layer's experts (expert parallelism).
    pub fn is_partial(&self) -> bool {
        self.first.is_some()
    }

    /// `routes` (over every expert) for this stack: as they are, or for a partial stack the
    /// slots of its experts only ([`MoeRoutes::held`]).
    fn held_routes(&self, routes: MoeRoutes) -> candle_core::Result<MoeRoutes> {
        match self.first {
            None => Ok(routes),
            Some(first) => routes.held(first, self.experts),
        }
    }

    /// The most tokens a step may have to take [`Stacked::forward`] rather than the grouped
    /// GEMMs: [`DEVICE_TOKENS`] for dense experts, [`AFFINE_DEVICE_TOKENS`] for codes,
    /// [`MXFP4_DEVICE_TOKENS`] for MXFP4 ones.
    pub fn device_tokens(&self) -> usize {
        match self.gate_up {
            Stack::Dense(_) => DEVICE_TOKENS,
            Stack::Affine(_) => AFFINE_DEVICE_TOKENS,
            Stack::Mxfp4(_) => MXFP4_DEVICE_TOKENS,
        }
    }

    /// The dense stack a grouped GEMM reads for `stack`: itself, or (MXFP4, codes) the scratch
    /// with the step's `used` experts dequantized into it.
    fn gemm_weights(&self, stack: &Stack, used: &[u32]) -> candle_core::Result<Tensor> {
        if let Stack::Dense(t) = stack {
            return Ok(t.clone());
        }
        let Some(scratch) = &self.scratch else {
            candle_core::bail!("experts of codes without a scratch");
        };
        let (n, rows, cols) = stack.dims3()?;
        let view = scratch
            .narrow(0, 0, n * rows * cols)?
            .reshape((n, rows, cols))?;
        match stack {
            Stack::Mxfp4(s) => s.dequantize_into(&view, used)?,
            Stack::Affine(s) => s.dequantize_into(&view, used)?,
            Stack::Dense(_) => unreachable!("dense stacks returned above"),
        }
        Ok(view)
    }

    /// Experts kept as codes (`super::moe_affine`) stacked for the expert kernels (with `top_k`
    /// experts a token and activations of `dtype`), with the scratch their grouped GEMMs
    /// dequantize into; `None` when they are not all codes alike or the kernels do not take them.
    fn take_affine(
        experts: &mut [Expert],
        top_k: usize,
        dtype: DType,
        activation: ExpertActivation,
    ) -> candle_core::Result<Option<Stacked>> {
        let Some(first) = experts.first() else {
            return Ok(None);
        };
        let Linear::Affine(l) = &first.gate_up else {
            return Ok(None);
        };
        let device = l.parts().0.device().clone();
        if experts.len() > pagewise_kernels::moe_max_experts() {
            return Ok(None);
        }
        let Some((gate_up, down)) = super::moe_affine::affine_stacks(experts)? else {
            return Ok(None);
        };
        let (gw, dw) = (
            ExpertWeights::Affine(&gate_up),
            ExpertWeights::Affine(&down),
        );
        if !pagewise_kernels::moe_stacks_fit(gw, dw, top_k, dtype) {
            return Ok(None);
        }
        let (n, rows, cols) = gate_up.dims3();
        let (_, drows, dcols) = down.dims3();
        let elements = n * (rows * cols).max(drows * dcols);
        Ok(Some(Stacked {
            experts: n,
            first: None,
            gate_up: Stack::Affine(gate_up),
            down: Stack::Affine(down),
            scratch: Some(scratch(&device, elements, dtype)?),
            gate_up_bias: None,
            down_bias: None,
            activation,
            grouped: grouped_handle(&device)?,
        }))
    }

    /// Stacks the experts' weights when they are dense f16/bf16 on a GPU, or codes
    /// ([`Linear::Affine`], for activations of `dtype`), and fit the kernels (with `top_k`
    /// experts a token), and makes each expert's layers views of the stacks (so the weights are
    /// held once). Biases come along when every expert has them.
    pub fn take(
        experts: &mut [Expert],
        top_k: usize,
        dtype: DType,
        activation: ExpertActivation,
    ) -> candle_core::Result<Option<Stacked>> {
        if let Some(s) = Self::take_affine(experts, top_k, dtype, activation)? {
            return Ok(Some(s));
        }
        type Parts = (Tensor, Option<Tensor>);
        let weights: Option<Vec<(Parts, Parts)>> = experts
            .iter()
            .map(|e| {
                let (gu, gub) = e.gate_up.dense_parts()?;
                let (d, db) = e.down.dense_parts()?;
                Some(((gu.clone(), gub.cloned()), (d.clone(), db.cloned())))
            })
            .collect();
        let Some(weights) = weights.filter(|w| !w.is_empty()) else {
            return Ok(None);
        };
        let ((gate_up, _), (down, _)) = &weights[0];
        let (hidden, inter) = (down.dim(0)?, down.dim(1)?);
        if gate_up.device().is_cpu()
            || !matches!(gate_up.dtype(), DType::BF16 | DType::F16)
            || !hidden.is_multiple_of(8)
            || weights.len() > pagewise_kernels::moe_max_experts()
            || !pagewise_kernels::moe_fits(top_k, inter, gate_up.dtype())
        {
            return Ok(None);
        }
        let stack = |pick: &dyn Fn(&(Parts, Parts)) -> &Parts| -> candle_core::Result<_> {
            let w = Tensor::stack(&weights.iter().map(|p| &pick(p).0).collect::<Vec<_>>(), 0)?;
            let b: Option<Vec<&Tensor>> = weights.iter().map(|p| pick(p).1.as_ref()).collect();
            let b = b.map(|b| Tensor::stack(&b, 0)).transpose()?;
            Ok((w, b))
        };
        let (gate_up, gate_up_bias) = stack(&|p| &p.0)?;
        let (down, down_bias) = stack(&|p| &p.1)?;
        drop(weights);
        let grouped = grouped_handle(gate_up.device())?;
        let row = |b: &Option<Tensor>, e: usize| b.as_ref().map(|b| b.get(e)).transpose();
        for (e, expert) in experts.iter_mut().enumerate() {
            expert.gate_up = Linear::dense(gate_up.get(e)?, row(&gate_up_bias, e)?);
            expert.down = Linear::dense(down.get(e)?, row(&down_bias, e)?);
        }
        Ok(Some(Stacked {
            experts: experts.len(),
            first: None,
            gate_up: Stack::Dense(gate_up),
            down: Stack::Dense(down),
            scratch: None,
            gate_up_bias,
            down_bias,
            activation,
            grouped,
        }))
    }

    /// The layer for a larger step (prefill), from its router's f32 `logits` (`[tokens,
    /// experts]`): routed on the device (`moe_route`), then only the chosen experts' ids are read
    /// back, to sort the tokens' rows by expert (a counting sort) and to give the grouped GEMMs
    /// their row counts; two grouped GEMMs over the stacked weights (gate/up, then down after the
    /// activation) take every expert at once; each token gathers its rows back and sums them,
    /// weighted by the routing's weights, which stay on the device. (Routing 8192 tokens on the
    /// host took about 40 ms a Qwen3-30B-A3B layer; a gather and a sum, not `index_add`: candle's
    /// scatter runs on a handful of blocks, 49 µs a layer for 16 tokens on the H200.)
    pub fn forward_grouped(
        &self,
        x: &Tensor,
        logits: &Tensor,
        s: &MoeSettings,
    ) -> candle_core::Result<Tensor> {
        let routes = pagewise_kernels::moe_route(&logits.contiguous()?, s.top_k, s.renormalize)?;
        let (tokens, top_k) = routes.ids().dims2()?;
        let ids = routes.ids().flatten_all()?.to_vec1::<u32>()?;
        let held = self.first.unwrap_or(0)..self.first.unwrap_or(0) + self.experts;
        let sorted = SortedRoutes::new(&ids, held, top_k);
        let used: Vec<u32> = sorted
            .groups
            .iter()
            .filter(|g| g.1 > 0)
            .map(|g| g.0 as u32)
            .collect();
        let (n, rows) = (ids.len(), sorted.token_of.len());
        if rows == 0 {
            // No token of the step chose this rank's experts.
            return x.zeros_like();
        }
        let dev = x.device();
        let xs = x
            .index_select(&Tensor::from_vec(sorted.token_of, rows, dev)?, 0)?
            .contiguous()?;
        // Each sorted row's expert, for the biases (gpt-oss): the groups' runs.
        let sorted_expert = match self.gate_up_bias.is_some() || self.down_bias.is_some() {
            true => {
                let ids = sorted
                    .groups
                    .iter()
                    .flat_map(|&(e, rows)| std::iter::repeat_n(e as u32, rows));
                Some(Tensor::from_iter(ids, dev)?)
            }
            false => None,
        };
        let bias_rows = |b: &Option<Tensor>| match (b, &sorted_expert) {
            (Some(b), Some(ids)) => b.index_select(ids, 0).map(Some),
            _ => Ok(None),
        };
        let gate_up = self.gemm_weights(&self.gate_up, &used)?;
        let mut mid = self.grouped.matmul(&xs, &gate_up, &sorted.groups)?;
        if let Some(b) = bias_rows(&self.gate_up_bias)? {
            mid = (mid + b)?;
        }
        let act = self.activation.apply(&mid)?.contiguous()?;
        let down = self.gemm_weights(&self.down, &used)?;
        let mut ys = self.grouped.matmul(&act, &down, &sorted.groups)?;
        if let Some(b) = bias_rows(&self.down_bias)? {
            ys = (ys + b)?;
        }
        let hidden = ys.dim(1)?;
        if rows < n {
            // The slots of other ranks' experts read a row of zeros after the held ones.
            ys = Tensor::cat(&[&ys, &ys.narrow(0, 0, 1)?.zeros_like()?], 0)?;
        }
        let gathered = ys
            .index_select(&Tensor::from_vec(sorted.position, n, dev)?, 0)?
            .reshape((tokens, top_k, hidden))?;
        let weights = routes.weights().reshape((tokens, top_k, 1))?;
        gathered
            .broadcast_mul(&weights.to_dtype(gathered.dtype())?)?
            .sum(1)
    }

    /// The layer for `x` (`[tokens, hidden]`, at most [`Stacked::device_tokens`]) from its router's f32
    /// `logits` (`[tokens, experts]`).
    pub fn forward(
        &self,
        x: &Tensor,
        logits: &Tensor,
        s: &MoeSettings,
    ) -> candle_core::Result<Tensor> {
        // x before the routing: the expert kernels may read it while the routing still runs.
        let x = x.contiguous()?;
        let routes = pagewise_kernels::moe_route(&logits.contiguous()?, s.top_k, s.renormalize)?;
        let routes = self.held_routes(routes)?;
        if let (Stack::Mxfp4(gate_up), Stack::Mxfp4(down)) = (&self.gate_up, &self.down)
            && x.dim(0)? > MXFP4_TOKEN_KERNEL_TOKENS
        {
            return pagewise_kernels::moe_experts_fp4_mma(
                &x,
                gate_up,
                down,
                &routes,
                self.extras(),
            );
        }
        pagewise_kernels::moe_experts_with(
            &x,
            self.gate_up.weights(),
            self.down.weights(),
            &routes,
            self.extras(),
        )
    }

    /// The fused decode path's layer: `x + experts(norm(x))` for the residual stream `x`
    /// (`[tokens, hidden]`, at most [`Stacked::device_tokens`]), the router's f32 `router`
    /// weight (`[experts, hidden]`) and the layer's RMSNorm `(weight, eps)`: the router (the
    /// norm folded into its staging; or `before_norm`, the logits `o_router` scored for the
    /// slices to scale), then `moe_route_experts` — for one or two tokens the
    /// expert slices, which route each token in their blocks and fold the norm into their
    /// staging, and their sum with the residual; otherwise the routing and the expert kernels.
    pub fn forward_fused(
        &self,
        x: &Tensor,
        router: &Tensor,
        before_norm: Option<&Tensor>,
        norm: (&Tensor, f32),
        s: &MoeSettings,
    ) -> candle_core::Result<Tensor> {
        let normed;
        let logits = match before_norm {
            Some(l) => RouterLogits::BeforeNorm(l),
            None => {
                normed = pagewise_kernels::moe_router(x, router, Some(norm))?;
                RouterLogits::Normed(&normed)
            }
        };
        let extras = pagewise_kernels::ExpertExtras {
            input_norm: Some(norm),
            residual: Some(x),
            ..self.extras()
        };
        let (gate_up, down) = (self.gate_up.weights(), self.down.weights());
        let routing = (s.top_k, s.renormalize);
        pagewise_kernels::moe_route_experts(x, gate_up, down, logits, routing, extras)
    }

    /// Whether the expert slices route a step of `rows` tokens themselves, so they take logits
    /// before the norm (`RouterLogits::BeforeNorm`).
    pub fn routes_in_slices(&self, rows: usize, top_k: usize) -> bool {
        let Stack::Dense(down) = &self.down else {
            return false;
        };
        let Ok((_, hidden, inter)) = down.dims3() else {
            return false;
        };
        pagewise_kernels::moe_slice_columns(rows, top_k, inter, hidden) > 0
    }

    /// The biases and activation of this layer's experts.
    fn extras(&self) -> pagewise_kernels::ExpertExtras<'_> {
        pagewise_kernels::ExpertExtras {
            gate_up_bias: self.gate_up_bias.as_ref(),
            down_bias: self.down_bias.as_ref(),
            clamped_swiglu: match self.activation {
                ExpertActivation::SiluMul => None,
                ExpertActivation::ClampedSwiglu { alpha, limit } => Some((alpha, limit)),
            },
            ..Default::default()
        }
    }
}
