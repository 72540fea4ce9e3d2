//! Tensors read in place on the CPU: the CPU paths that work on plain buffers (attention from the
//! projections, the residual add with its norm, the quantized matmuls) borrow an f32 tensor's
//! values instead of copying them out.

use candle_core::{DType, Storage, Tensor};

/// `f` on `t`'s values, when `t` is contiguous f32 in host memory; `None` otherwise.
pub fn with_f32<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> candle_core::Result<Option<R>> {
    with_f32s([t], |[values]| f(values))
}

/// `f` on the values of every tensor of `ts`, when all are contiguous f32 in host memory; `None`
/// otherwise.
pub fn with_f32s<const N: usize, R>(
    ts: [&Tensor; N],
    f: impl FnOnce([&[f32]; N]) -> R,
) -> candle_core::Result<Option<R>> {
    if ts
        .iter()
        .any(|t| t.dtype() != DType::F32 || !t.is_contiguous())
    {
        return Ok(None);
    }
    let guards = ts.map(|t| t.storage_and_layout());
    let mut values: [&[f32]; N] = [&[]; N];
    for ((t, (storage, layout)), v) in ts.iter().zip(&guards).zip(&mut values) {
        let Storage::Cpu(cpu) = &**storage else {
            return Ok(None);
        };
        *v = &cpu.as_slice::<f32>()?[layout.start_offset()..][..t.elem_count()];
    }
    Ok(Some(f(values)))
}
