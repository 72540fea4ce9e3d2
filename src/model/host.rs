//! Tensors read in place on the CPU: the CPU paths that work on plain buffers (attention from the
//! projections, the residual add with its norm, the quantized matmuls) borrow an f32 tensor's
//! values instead of copying them out.

use candle_core::{DType, Storage, Tensor};

/// `f` on `t`'s values, when `t` is contiguous f32 in host memory; `None` otherwise.
pub fn with_f32<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> candle_core::Result<Option<R>> {
    if t.dtype() != DType::F32 || !t.is_contiguous() {
        return Ok(None);
    }
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cpu(cpu) = &*storage else {
        return Ok(None);
    };
    let values = &cpu.as_slice::<f32>()?[layout.start_offset()..][..t.elem_count()];
    Ok(Some(f(values)))
}
