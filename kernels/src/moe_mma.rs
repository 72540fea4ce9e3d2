//! MXFP4 experts on tensor cores for steps of tens to hundreds of tokens (large decode batches):
//! the step's (token, expert) slots sorted by expert into tiles on the device, then each tile's
//! tokens multiplied by its expert's gate/up and down codes as they are (mma.sync, the codes
//! decoded to f16 in registers), then each token's slots summed with their routing weights.
//! Nothing is read back to the host, so the step runs inside a CUDA graph; each routed expert's
//! codes are read once a tile of up to 32 of its slots, where [`crate::moe_experts_with`] reads
//! them once a token, and the grouped GEMMs of prefill first write a dense copy of them.

use std::ffi::c_void;

use candle_core::{DType, Result, Tensor, bail};

use crate::moe::{ExpertExtras, ExpertWeights, check_experts};
use crate::moe_routing::MoeRoutes;
use crate::mxfp4::Mxfp4Stack;
use crate::{check_launch, device_ptr, empty, ffi};

/// [`crate::moe_experts_with`] over MXFP4 stacks, for any number of tokens (up to 65535), on
/// tensor cores: the same layer (biases, clamped SwiGLU or SiLU-and-mul, residual; not the input
/// norm), the same rounding of the gate/up outputs and of the activation, each token's weighted
/// sum in f32 as there; only the order of each dot product's sums differs.
pub fn moe_experts_fp4_mma(
    x: &Tensor,
    gate_up: &Mxfp4Stack,
    down: &Mxfp4Stack,
    routes: &MoeRoutes,
    extras: ExpertExtras<'_>,
) -> Result<Tensor> {
    if extras.input_norm.is_some() {
        bail!("moe_experts_fp4_mma: no input norm (apply it to x first)");
    }
    let c = check_experts(
        x,
        ExpertWeights::Mxfp4(gate_up),
        ExpertWeights::Mxfp4(down),
        routes,
        &extras,
    )?;
    // (check_experts bounds the tokens and, through the routes, the experts; MXFP4 stacks hold
    // whole runs of 32 columns, so hidden and inter are multiples of 32.)
    let (tokens, hidden, inter, top_k) = (c.tokens, c.hidden, c.inter, c.top_k);
    let dev = x.device();
    let y = empty((tokens, hidden), x.dtype(), dev)?;
    if tokens == 0 {
        return Ok(y);
    }
    let (mut sorted_len, mut tiles) = (0i32, 0i32);
    // SAFETY: a pure function of its integer arguments, writing the two locals.
    unsafe {
        ffi::pagewise_moe_fp4_mma_scratch(
            tokens as i32,
            top_k as i32,
            c.experts as i32,
            &mut sorted_len,
            &mut tiles,
        )
    };
    let slots = tokens * top_k;
    let act = empty((slots, inter), x.dtype(), dev)?;
    let ys = empty((slots, hidden), DType::F32, dev)?;
    // (i32 places, held as u32: the same bits.)
    let sorted = empty(sorted_len as usize, DType::U32, dev)?;
    let tile_expert = empty(tiles as usize, DType::U32, dev)?;
    let (yp, stream) = device_ptr(&y, "y")?;
    let (ap, _) = device_ptr(&act, "activations")?;
    let (ysp, _) = device_ptr(&ys, "expert outputs")?;
    let (sp, _) = device_ptr(&sorted, "sorted slots")?;
    let (tp, _) = device_ptr(&tile_expert, "tile experts")?;
    let (xp, _) = device_ptr(x, "x")?;
    let (gcp, gsp, _) = gate_up.ptrs()?;
    let (dcp, dsp, _) = down.ptrs()?;
    let (ip, _) = device_ptr(routes.ids(), "ids")?;
    let (wp, _) = device_ptr(routes.weights(), "weights")?;
    if [xp, ap].iter().any(|p| p % 16 != 0) {
        bail!("moe_experts_fp4_mma: x must start on a 16-byte boundary");
    }
    // SAFETY: contiguous tensors of the checked shapes and dtype on the stream's device; the MXFP4
    // stacks hold codes and scales of their checked dims (columns in whole runs of 32); every id
    // is below `experts` (MoeRoutes comes only from moe_route over `experts` logits); the scratch
    // is as large as pagewise_moe_fp4_mma_scratch asked, and the kernels write all of it before
    // they read it.
    let code = unsafe {
        ffi::pagewise_moe_fp4_mma(
            c.dtype,
            yp as *mut c_void,
            ap as *mut c_void,
            ysp as *mut f32,
            sp as *mut i32,
            tp as *mut i32,
            xp as *const c_void,
            gcp as *const u8,
            gsp as *const u8,
            c.gate_up_bias as *const c_void,
            dcp as *const u8,
            dsp as *const u8,
            c.down_bias as *const c_void,
            c.residual as *const c_void,
            ip as *const u32,
            wp as *const f32,
            tokens as i32,
            top_k as i32,
            c.experts as i32,
            inter as i32,
            hidden as i32,
            c.alpha,
            c.limit,
            stream,
        )
    };
    check_launch(code, "moe_experts_fp4_mma")?;
    Ok(y)
}
