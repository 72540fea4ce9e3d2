//! Page-locked host memory the GPU writes results into (mapped: kernels store to it directly).

use candle_core::cuda_backend::cudarc::driver::sys;
use candle_core::{Result, bail};

use crate::check_driver;

/// Page-locked host memory for `u32` results (sampled token ids), mapped into the GPU's address
/// space: a kernel writes it directly ([`crate::sample_into`]), also from a CUDA graph, so a
/// replay ends with the ids already on the host and reading them costs no driver call.
pub struct PinnedIds {
    ptr: *mut u32,
    device: u64,
    len: usize,
}

// SAFETY: the allocation is owned by this value alone; the GPU writes it only through work the
// owner enqueues, and reads go through `&self` after the owner synchronized.
unsafe impl Send for PinnedIds {}

impl PinnedIds {
    /// Page-locked, mapped room for `len` ids, zeroed, in the CUDA context current on this
    /// thread (bind the device's context first: any kernel-crate call on its tensors does).
    pub fn new(len: usize) -> Result<Self> {
        let len = len.max(1);
        let mut ptr = std::ptr::null_mut();
        // SAFETY: writes the address of a fresh allocation of `len` u32s into `ptr`.
        let code =
            unsafe { sys::cuMemHostAlloc(&mut ptr, len * 4, sys::CU_MEMHOSTALLOC_DEVICEMAP) };
        check_driver(code, "PinnedIds::new")?;
        let mut device = 0;
        // SAFETY: `ptr` is a mapped allocation of this context.
        let code = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device, ptr, 0) };
        if let Err(e) = check_driver(code, "PinnedIds::new (device address)") {
            // SAFETY: allocated just above, not shared.
            unsafe { sys::cuMemFreeHost(ptr) };
            return Err(e);
        }
        let ptr = ptr.cast::<u32>();
        // SAFETY: `ptr` holds `len` u32s, just allocated and not yet shared.
        unsafe { std::ptr::write_bytes(ptr, 0, len) };
        Ok(PinnedIds { ptr, device, len })
    }

    /// Room, in ids.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there is no room (never: at least one id).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The GPU's address of the buffer, for kernels that write ids into it.
    pub(crate) fn device_ptr(&self) -> u64 {
        self.device
    }

    /// The first `n` ids as the last completed write left them. Call after synchronizing the
    /// stream the writes run on (or the whole device), else the values may be a step old.
    pub fn read(&self, n: usize) -> Result<Vec<u32>> {
        if n > self.len {
            bail!("PinnedIds: reading {n} of {} ids", self.len);
        }
        // SAFETY: `n` is within the allocation; a write still in flight can only make the values
        // stale (u32s are written whole), which the caller's synchronization rules out.
        Ok(unsafe { std::slice::from_raw_parts(self.ptr, n) }.to_vec())
    }
}

impl Drop for PinnedIds {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemHostAlloc in `new`, freed once. (A failure cannot be reported
        // from drop; the memory then stays page-locked until the process ends.)
        unsafe {
            sys::cuMemFreeHost(self.ptr.cast());
        }
    }
}
