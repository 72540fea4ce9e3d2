//! Page-locked host memory mapped into the GPU's address space: kernels read and write it in
//! place. [`PinnedIds`] takes the sampled ids; [`crate::Staging`] carries a step's inputs.

use candle_core::cuda_backend::cudarc::driver::sys;
use candle_core::{Result, bail};

use crate::check_driver;

/// `len` 32-bit words of page-locked, mapped host memory, zeroed, and their GPU address.
pub(crate) struct MappedWords {
    ptr: *mut u32,
    device: u64,
    len: usize,
}

// SAFETY: the allocation is owned by this value alone; host access goes through `&self` /
// `&mut self`, and its owner orders GPU access by synchronizing.
unsafe impl Send for MappedWords {}

impl MappedWords {
    /// Allocates at least one word in the CUDA context current on this thread (bind the device's
    /// context first: any kernel-crate call on its tensors does); `what` names it in errors.
    pub(crate) fn new(len: usize, what: &str) -> Result<Self> {
        let len = len.max(1);
        let mut ptr = std::ptr::null_mut();
        // SAFETY: writes the address of a fresh allocation of `len` u32s into `ptr`.
        let code =
            unsafe { sys::cuMemHostAlloc(&mut ptr, len * 4, sys::CU_MEMHOSTALLOC_DEVICEMAP) };
        check_driver(code, what)?;
        let mut device = 0;
        // SAFETY: `ptr` is a mapped allocation of this context.
        let code = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device, ptr, 0) };
        if let Err(e) = check_driver(code, &format!("{what} (device address)")) {
            // SAFETY: allocated just above, not shared.
            unsafe { sys::cuMemFreeHost(ptr) };
            return Err(e);
        }
        let ptr = ptr.cast::<u32>();
        // SAFETY: `ptr` holds `len` u32s, just allocated and not yet visible to any kernel.
        unsafe { std::ptr::write_bytes(ptr, 0, len) };
        Ok(MappedWords { ptr, device, len })
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The GPU's address of the first word.
    pub(crate) fn device_ptr(&self) -> u64 {
        self.device
    }

    /// The words as the host sees them. A GPU write still in flight can only make a value stale
    /// (u32s are written whole); the owner synchronizes before it relies on them.
    pub(crate) fn as_slice(&self) -> &[u32] {
        // SAFETY: `len` u32s owned by `self`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The words, for the host to write while no kernel reads them (the owner synchronized).
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u32] {
        // SAFETY: `len` u32s owned by `self`; `&mut self` excludes other host access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for MappedWords {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemHostAlloc in `new`, freed once. (A failure cannot be reported
        // from drop; the memory then stays page-locked until the process ends.)
        unsafe {
            sys::cuMemFreeHost(self.ptr.cast());
        }
    }
}

/// Page-locked host memory for `u32` results (sampled token ids), mapped into the GPU's address
/// space: a kernel writes it directly ([`crate::sample_into`]), also from a CUDA graph, so a
/// replay ends with the ids already on the host and reading them costs no driver call.
pub struct PinnedIds {
    mem: MappedWords,
}

impl PinnedIds {
    /// Page-locked, mapped room for `len` ids, zeroed, in the CUDA context current on this
    /// thread (bind the device's context first: any kernel-crate call on its tensors does).
    pub fn new(len: usize) -> Result<Self> {
        Ok(PinnedIds {
            mem: MappedWords::new(len, "PinnedIds::new")?,
        })
    }

    /// Room, in ids.
    pub fn len(&self) -> usize {
        self.mem.len()
    }

    /// Whether there is no room (never: at least one id).
    pub fn is_empty(&self) -> bool {
        self.mem.len() == 0
    }

    /// The GPU's address of the buffer, for kernels that write ids into it.
    pub(crate) fn device_ptr(&self) -> u64 {
        self.mem.device_ptr()
    }

    /// The first `n` ids as the last completed write left them. Call after synchronizing the
    /// stream the writes run on (or the whole device), else the values may be a step old.
    pub fn read(&self, n: usize) -> Result<Vec<u32>> {
        if n > self.len() {
            bail!("PinnedIds: reading {n} of {} ids", self.len());
        }
        Ok(self.mem.as_slice()[..n].to_vec())
    }
}
