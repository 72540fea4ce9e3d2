//! One-shot all-reduce over peer memory (csrc/allreduce.cu) for the tensor-parallel ranks of one
//! node: each rank allocates a region, shares its CUDA IPC handle, opens the others', and every
//! call sums the ranks' inputs through those regions in one kernel.

use std::ffi::c_void;

use candle_core::{Result, Tensor, bail};

use crate::{check_launch, device_ptr, dtype_code, empty, ffi};

/// This rank's region: its device address and the IPC handle other processes open it with.
pub struct Region {
    /// Device address in this process.
    pub ptr: u64,
    /// The CUDA IPC handle (64 bytes).
    pub handle: [u8; 64],
}

/// Allocates this rank's region (zeroed) on the current device, with `data_bytes` of staging
/// for each of its two halves: calls of up to `data_bytes` take the one-shot path. Never freed
/// (it lives as long as the process's tensor-parallel group).
pub fn alloc_region(data_bytes: usize) -> Result<Region> {
    let mut ptr: *mut c_void = std::ptr::null_mut();
    let mut handle = [0u8; 64];
    // SAFETY: both out-pointers are valid for the writes the function makes.
    let code = unsafe { ffi::pagewise_ar_alloc(data_bytes, &mut ptr, handle.as_mut_ptr()) };
    if code != 0 {
        bail!("all-reduce region of {data_bytes} bytes: CUDA error (step {code})");
    }
    Ok(Region {
        ptr: ptr as u64,
        handle,
    })
}

/// Opens another rank's region from its IPC handle (a process on the same node).
pub fn open_region(handle: &[u8; 64]) -> Result<u64> {
    let mut ptr: *mut c_void = std::ptr::null_mut();
    // SAFETY: `handle` is 64 bytes and `ptr` a valid out-pointer.
    let code = unsafe { ffi::pagewise_ar_open(handle.as_ptr(), &mut ptr) };
    if code != 0 {
        bail!("cannot open a peer's all-reduce region (CUDA IPC; is it on this node?)");
    }
    Ok(ptr as u64)
}

/// The sum over the ranks of `x` (contiguous, f32/f16/bf16, at most `data_bytes`), every rank
/// calling with its own `x` in the same order of calls.
///
/// # Safety
/// `regions[r]` must be rank `r`'s region (this rank's own at `rank`), each allocated by
/// [`alloc_region`] with the same `data_bytes`, and every rank must make the same sequence of
/// calls (or the kernel waits for a peer forever).
pub unsafe fn all_reduce_oneshot(
    x: &Tensor,
    regions: &[u64],
    rank: usize,
    data_bytes: usize,
) -> Result<Tensor> {
    let bytes = x.elem_count() * x.dtype().size_in_bytes();
    if bytes > data_bytes {
        bail!("one-shot all-reduce: {bytes} bytes is past the {data_bytes} staged");
    }
    if regions.len() > 8 || rank >= regions.len() {
        bail!(
            "one-shot all-reduce: rank {rank} of {} (at most 8)",
            regions.len()
        );
    }
    let dtype = dtype_code(x.dtype(), "all_reduce_oneshot")?;
    let out = empty(x.shape().clone(), x.dtype(), x.device())?;
    let (src, stream) = device_ptr(x, "x")?;
    let (dst, _) = device_ptr(&out, "out")?;
    // SAFETY: the caller guarantees the regions; `x` and `out` hold `elem_count` elements.
    let code = unsafe {
        ffi::pagewise_ar_oneshot(
            dtype,
            regions.as_ptr(),
            rank as i32,
            regions.len() as i32,
            data_bytes,
            src as *const c_void,
            dst as *mut c_void,
            x.elem_count() as i64,
            stream,
        )
    };
    check_launch(code, "all_reduce_oneshot")?;
    Ok(out)
}
