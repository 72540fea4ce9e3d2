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
    sample_new(logits, temperatures, min_ps, seeds, None)
}

/// f32 elements of scratch that [`sample_into`] needs for `rows` rows of `vocab` logits.
pub fn sample_workspace_len(rows: usize, vocab: usize) -> usize {
    rows * per_row(vocab)
}

/// f32 elements of the workspace per row of `vocab` logits: a 4-byte counter, 16 bytes per
/// chunk of the kernel's.
fn per_row(vocab: usize) -> usize {
    // SAFETY: a pure function of its argument.
    let chunks = unsafe { ffi::pagewise_sample_chunks(vocab.min(i32::MAX as usize) as i32) };
    chunks.max(0) as usize * 4 + 1
}

/// Where [`sample_into`] writes.
pub struct SampleOutputs<'a> {
    /// The ids: the first `rows` elements of a u32 tensor.
    pub ids: &'a Tensor,
    /// Also the ids, in mapped host memory (readable once the stream is synchronized).
    pub host_ids: Option<&'a PinnedIds>,
    /// A copy of the logits, made as the kernel reads them: the first `rows` rows of a
    /// `[_, vocab]` tensor of the logits' dtype.
    pub logits_copy: Option<&'a Tensor>,
    /// Scratch: f32, at least [`sample_workspace_len`] elements, zeroed before its first use
    /// (`Tensor::zeros`); each call leaves it ready for the next (its counters back at zero).
    pub workspace: &'a Tensor,
}

/// [`sample`] with each row restricted to the tokens its row of `masks` allows (constrained
/// decoding): `masks` is u32 `[rows, words]`, `words >= ceil(vocab / 32)`, bit `i % 32` of word
/// `i / 32` set for an allowed token `i`. A row whose mask allows nothing gets token 0.
pub fn sample_masked(
    logits: &Tensor,
    temperatures: &Tensor,
    min_ps: &Tensor,
    seeds: &Tensor,
    masks: &Tensor,
) -> Result<Tensor> {
    sample_new(logits, temperatures, min_ps, seeds, Some(masks))
}

/// [`sample_with`] into a fresh ids tensor and workspace.
fn sample_new(
    logits: &Tensor,
    temperatures: &Tensor,
    min_ps: &Tensor,
    seeds: &Tensor,
    masks: Option<&Tensor>,
) -> Result<Tensor> {
    let (rows, vocab) = logits.dims2()?;
    // Every row's id is written by the kernel; the workspace's counters start at zero.
    let out = crate::empty(rows, DType::U32, logits.device())?;
    let parts = Tensor::zeros(
        sample_workspace_len(rows, vocab).max(1),
        DType::F32,
        logits.device(),
    )?;
    let to = SampleOutputs {
        ids: &out,
        host_ids: None,
        logits_copy: None,
        workspace: &parts,
    };
    sample_with(&to, logits, temperatures, min_ps, seeds, masks)?;
    Ok(out)
}

/// [`sample`] into `to`'s fixed buffers: no allocation, so a CUDA graph can capture it.
pub fn sample_into(
    to: &SampleOutputs<'_>,
    logits: &Tensor,
    temperatures: &Tensor,
    min_ps: &Tensor,
    seeds: &Tensor,
) -> Result<()> {
    sample_with(to, logits, temperatures, min_ps, seeds, None)
}

fn sample_with(
    to: &SampleOutputs<'_>,
    logits: &Tensor,
    temperatures: &Tensor,
    min_ps: &Tensor,
    seeds: &Tensor,
    masks: Option<&Tensor>,
) -> Result<()> {
    let (rows, vocab) = logits.dims2()?;
    if let Some(m) = masks {
        let fits = m.dims2().is_ok_and(|(r, w)| r == rows && w * 32 >= vocab);
        if !fits || m.dtype() != DType::U32 {
            bail!(
                "sample: masks must be u32 [{rows}, >= {}], got {:?} {:?}",
                vocab.div_ceil(32),
                m.dtype(),
                m.dims()
            );
        }
    }
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
    let (out, parts) = (to.ids, to.workspace);
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
    if let Some(h) = to.host_ids
        && h.len() < rows
    {
        bail!(
            "sample: {rows} ids do not fit the host buffer of {}",
            h.len()
        );
    }
    if let Some(c) = to.logits_copy {
        let fits = c.dims2().is_ok_and(|(r, v)| r >= rows && v == vocab);
        if !fits || c.dtype() != logits.dtype() {
            bail!(
                "sample: the logits copy must be {:?} [>= {rows}, {vocab}], got {:?} {:?}",
                logits.dtype(),
                c.dtype(),
                c.dims()
            );
        }
    }
    if rows == 0 || vocab == 0 {
        return Ok(());
    }
    let (o, stream) = device_ptr(out, "out")?;
    let h = to
        .host_ids
        .map_or(std::ptr::null_mut(), |h| h.device_ptr() as *mut u32);
    let c = match to.logits_copy {
        Some(c) => device_ptr(c, "logits_copy")?.0 as *mut c_void,
        None => std::ptr::null_mut(),
    };
    // The workspace serves `capacity` rows, whatever this call's: its counters first (at the
    // same addresses for every call sharing it), then the parts.
    let capacity = parts.elem_count() / per_row(vocab);
    let (tickets, _) = device_ptr(parts, "parts")?;
    let p = tickets + (capacity * 4) as u64;
    let (l, _) = device_ptr(logits, "logits")?;
    let (t, _) = device_ptr(temperatures, "temperatures")?;
    let (m, _) = device_ptr(min_ps, "min_ps")?;
    let (s, _) = device_ptr(seeds, "seeds")?;
    let (mask_ptr, mask_words) = match masks {
        Some(m) => (device_ptr(m, "masks")?.0 as *const u32, m.dims2()?.1 as i32),
        None => (std::ptr::null(), 0),
    };
    // SAFETY: dtypes, shapes and contiguity are checked above (`out` and `parts` hold at least
    // what the kernels write); all tensors live on the stream's device and outlive the launch.
    let code = unsafe {
        ffi::pagewise_sample(
            code,
            o as *mut u32,
            h,
            p as *mut c_void,
            tickets as *mut u32,
            l as *const c_void,
            c,
            rows as i32,
            vocab as i32,
            t as *const f32,
            m as *const f32,
            s as *const u64,
            mask_ptr,
            mask_words,
            stream,
        )
    };
    check_launch(code, "sample")
}
