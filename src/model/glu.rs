//! The gated MLPs' activations, `act(gate) * up` with SiLU or GELU's tanh form: on the CPU in f32
//! the vectorized kernels of [`crate::cpu::activations`] (libm's `exp` and `tanh` a value cost a
//! seventh of a Gemma 3 prefill), on CUDA our fused SiLU kernel, elsewhere candle's ops.

use candle_core::{CpuStorage, CustomOp1, CustomOp2, DType, Layout, Shape, Tensor, bail};

pub use crate::cpu::activations::Glu;

/// `act(gate) * up` over `[tokens, 2 * intermediate]` (gate columns first).
pub fn glu(kind: Glu, gate_up: &Tensor) -> candle_core::Result<Tensor> {
    if on_cpu_kernels(gate_up) {
        return gate_up.apply_op1_no_bwd(&Fused(kind));
    }
    #[cfg(feature = "cuda")]
    if kind == Glu::Silu && gate_up.device().is_cuda() && gate_up.is_contiguous() {
        return pagewise_kernels::silu_mul(gate_up);
    }
    let i = gate_up.dim(1)? / 2;
    candle_act(kind, &gate_up.narrow(1, 0, i)?)? * gate_up.narrow(1, i, i)?
}

/// `act(gate) * up` for `gate` and `up` of the same `[tokens, intermediate]`.
pub fn glu_split(kind: Glu, gate: &Tensor, up: &Tensor) -> candle_core::Result<Tensor> {
    if on_cpu_kernels(gate) && on_cpu_kernels(up) && gate.dims() == up.dims() {
        return gate.apply_op2_no_bwd(up, &Split(kind));
    }
    candle_act(kind, gate)? * up
}

/// `silu(gate) * up` over `[tokens, 2 * intermediate]` (gate columns first).
pub fn silu_mul(gate_up: &Tensor) -> candle_core::Result<Tensor> {
    glu(Glu::Silu, gate_up)
}

/// Whether the CPU kernels take `t`: f32 rows, contiguous, on the CPU.
fn on_cpu_kernels(t: &Tensor) -> bool {
    t.device().is_cpu() && t.dtype() == DType::F32 && t.rank() == 2 && t.is_contiguous()
}

/// candle's activation of `gate`.
fn candle_act(kind: Glu, gate: &Tensor) -> candle_core::Result<Tensor> {
    match kind {
        Glu::Silu => candle_nn::ops::silu(gate),
        Glu::GeluTanh => gate.gelu(),
    }
}

/// The f32 elements of a contiguous CPU tensor.
fn floats<'a>(s: &'a CpuStorage, l: &Layout) -> candle_core::Result<&'a [f32]> {
    let (CpuStorage::F32(v), Some((start, end))) = (s, l.contiguous_offsets()) else {
        bail!("glu: f32, contiguous input only")
    };
    Ok(&v[start..end])
}

/// The op on `[tokens, 2 * intermediate]`.
struct Fused(Glu);

impl CustomOp1 for Fused {
    fn name(&self) -> &'static str {
        "glu"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let (rows, cols) = l.shape().dims2()?;
        let out = crate::cpu::activations::glu(self.0, floats(s, l)?, None, cols / 2);
        Ok((CpuStorage::F32(out), Shape::from((rows, cols / 2))))
    }
}

/// The op on separate gate and up.
struct Split(Glu);

impl CustomOp2 for Split {
    fn name(&self) -> &'static str {
        "glu-split"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (rows, cols) = l1.shape().dims2()?;
        let (gate, up) = (floats(s1, l1)?, floats(s2, l2)?);
        let out = crate::cpu::activations::glu(self.0, gate, Some(up), cols);
        Ok((CpuStorage::F32(out), Shape::from((rows, cols))))
    }
}
