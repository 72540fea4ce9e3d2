//! Token sampling on the GPU: argmax, or a seeded Gumbel-max draw per row (each row cut into
//! chunks that blocks search in parallel).

use std::ffi::c_void;

use candle_core::{DType, Result, Tensor, bail};

use crate::{check_launch, device_ptr, ffi};

/// Picks one token per row of `logits` (`[rows, vocab]`, f32) on the GPU; returns `[rows]` u32.
/// Row `r` takes the argmax when `temperatures[r]` <= 0, else draws from
/// softmax(logits / temperature) over the tokens whose probability is at least `min_ps[r]` times
/// the most likely one's, with randomness from `seeds[r]` alone (i64 holding the seed's bits).
pub fn sample(
    logits: &Tensor,
    temperatures: &Tensor,
    min_ps: &Tensor,
    seeds: &Tensor,
) -> Result<Tensor> {
    let (rows, vocab) = logits.dims2()?;
    if logits.dtype() != DType::F32 {
        bail!("logits must be f32, got {:?}", logits.dtype());
    }
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
    // Every row's id is written by the last kernel.
    let out = crate::empty(rows, DType::U32, logits.device())?;
    if rows == 0 || vocab == 0 {
        return Ok(out);
    }
    // SAFETY: a pure function of its argument.
    let chunks = unsafe { ffi::pagewise_sample_chunks(vocab as i32) } as usize;
    // Each chunk's best logit and best draw (16 bytes), written before they are read.
    let parts = crate::empty(rows * chunks * 4, DType::F32, logits.device())?;
    let (o, stream) = device_ptr(&out, "out")?;
    let (p, _) = device_ptr(&parts, "parts")?;
    let (l, _) = device_ptr(logits, "logits")?;
    let (t, _) = device_ptr(temperatures, "temperatures")?;
    let (m, _) = device_ptr(min_ps, "min_ps")?;
    let (s, _) = device_ptr(seeds, "seeds")?;
    // SAFETY: dtypes, shapes and contiguity are checked above; all tensors live on the stream's
    // device and outlive the launch.
    let code = unsafe {
        ffi::pagewise_sample(
            o as *mut u32,
            p as *mut c_void,
            l as *const f32,
            rows as i32,
            vocab as i32,
            t as *const f32,
            m as *const f32,
            s as *const u64,
            stream,
        )
    };
    check_launch(code, "sample")?;
    Ok(out)
}
