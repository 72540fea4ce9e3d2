//! Token sampling on the GPU: argmax, or a seeded Gumbel-max draw per row (each row cut into
//! chunks that blocks search in parallel).

use std::ffi::c_void;

use candle_core::{DType, Result, Tensor, bail};

use crate::{PinnedIds, check_launch, device_ptr, dtype_code, ffi};

/// Picks one token per row of `logits` (`[rows, vocab]`: f32, f16 or bf16) on the GPU; returns
/// `[rows]` u32. Row `r` takes the argmax when `temperatures[r]` <= 0, else draws from
/// softmax(logits / temperature) over the tokens whose probability is at least `min_ps[r]` times
/// the most likely one's, with randomness from `seeds[r]` alone (i64 holding the seed's bits).
/// Comparisons are made in f32, so half-precision logits pick what their f32 cast would.
pub fn sample(
    logits: &Tensor,
    temperatures: &Tensor,
    min_ps: &Tensor,
    seeds: &Tensor,
) -> Result<Tensor> {
    let (rows, vocab) = logits.dims2()?;
    // Every row's id is written by the last kernel; the parts before they are read.
    let out = crate::empty(rows, DType::U32, logits.device())?;
    let parts = crate::empty(
        sample_workspace_len(rows, vocab).max(1),
        DType::F32,
        logits.device(),
    )?;
    sample_into(&out, None, &parts, logits, temperatures, min_ps, seeds)?;
    Ok(out)
}

/// f32 elements of scratch that [`sample_into`] needs for `rows` rows of `vocab` logits.
pub fn sample_workspace_len(rows: usize, vocab: usize) -> usize {
    // SAFETY: a pure function of its argument.
    let chunks = unsafe { ffi::pagewise_sample_chunks(vocab.min(i32::MAX as usize) as i32) };
    // 16 bytes per (row, chunk), then a 4-byte counter per row.
    rows * (chunks.max(0) as usize * 4 + 1)
}

/// [`sample`] into the first `rows` elements of `out` (u32) and, when given, of `host_out` too
/// (written by the kernel, readable once the stream is synchronized), with `parts` (f32, at least
/// [`sample_workspace_len`] elements) as scratch: no allocation, so a CUDA graph can capture it.
pub fn sample_into(
    out: &Tensor,
    host_out: Option<&PinnedIds>,
    parts: &Tensor,
    logits: &Tensor,
    temperatures: &Tensor,
    min_ps: &Tensor,
    seeds: &Tensor,
) -> Result<()> {
    let (rows, vocab) = logits.dims2()?;
    let code = dtype_code(logits.dtype(), "sample")?;
    for (t, what, dtype) in [
        (temperatures, "temperatures", DType::F32),
        (min_ps, "min_ps", DType::F32),
        (seeds, "seeds", DType::I64),
    ] {
        if t.dtype() != dtype || t.dims() != [rows] {
            bail!(
                "{what} must be {dtype:?} [{rows}], got {:?} {:?}",
                t.dtype(),
                t.dims()
            );
        }
    }
    if out.dtype() != DType::U32 || out.elem_count() < rows {
        bail!(
            "sample: out must be u32 with room for {rows} ids, got {:?} {:?}",
            out.dtype(),
            out.dims()
        );
    }
    let need = sample_workspace_len(rows, vocab);
    if parts.dtype() != DType::F32 || parts.elem_count() < need {
        bail!(
            "sample: the workspace must be f32 with {need} elements, got {:?} {:?}",
            parts.dtype(),
            parts.dims()
        );
    }
    if let Some(h) = host_out
        && h.len() < rows
    {
        bail!(
            "sample: {rows} ids do not fit the host buffer of {}",
            h.len()
        );
    }
    if rows == 0 || vocab == 0 {
        return Ok(());
    }
    let (o, stream) = device_ptr(out, "out")?;
    let h = host_out.map_or(std::ptr::null_mut(), |h| h.device_ptr() as *mut u32);
    let (p, _) = device_ptr(parts, "parts")?;
    let (l, _) = device_ptr(logits, "logits")?;
    let (t, _) = device_ptr(temperatures, "temperatures")?;
    let (m, _) = device_ptr(min_ps, "min_ps")?;
    let (s, _) = device_ptr(seeds, "seeds")?;
    // SAFETY: dtypes, shapes and contiguity are checked above (`out` and `parts` hold at least
    // what the kernels write); all tensors live on the stream's device and outlive the launch.
    let code = unsafe {
        ffi::pagewise_sample(
            code,
            o as *mut u32,
            h,
            p as *mut c_void,
            l as *const c_void,
            rows as i32,
            vocab as i32,
            t as *const f32,
            m as *const f32,
            s as *const u64,
            stream,
        )
    };
    check_launch(code, "sample")
}
