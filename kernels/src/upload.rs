//! Host-to-device copies into existing tensors: what a replayed CUDA graph reads must sit at the
//! addresses it was captured with, so each step's inputs are written in place.

use candle_core::cuda_backend::cudarc::driver::sys;
use candle_core::{Result, Storage, Tensor, WithDType, bail};

use crate::device_ptr;

fn check_code(code: sys::CUresult, what: &str) -> Result<()> {
    if code != sys::CUresult::CUDA_SUCCESS {
        bail!("{what}: copy to the GPU failed with {code:?}");
    }
    Ok(())
}

/// Binds `t`'s CUDA context to this thread; returns its first element's address and stream.
fn target<T: WithDType>(t: &Tensor, what: &str) -> Result<(u64, sys::CUstream)> {
    if t.dtype() != T::DTYPE {
        bail!(
            "{what}: writing {:?} into a {:?} tensor",
            T::DTYPE,
            t.dtype()
        );
    }
    {
        let (storage, _) = t.storage_and_layout();
        let Storage::Cuda(cs) = &*storage else {
            bail!("{what} must be on a CUDA device, it is on {:?}", t.device());
        };
        cs.device
            .cuda_stream()
            .context()
            .bind_to_thread()
            .map_err(|e| candle_core::Error::Msg(format!("{what}: {e:?}")))?;
    }
    let (ptr, stream) = device_ptr(t, what)?;
    Ok((ptr, stream as sys::CUstream))
}

/// Writes `src` over the first `src.len()` elements of the contiguous CUDA tensor `dst`, ordered on
/// its device's stream (the host buffer may be dropped when this returns).
pub fn upload<T: WithDType>(dst: &Tensor, src: &[T]) -> Result<()> {
    if src.len() > dst.elem_count() {
        bail!(
            "upload: {} elements do not fit a tensor of {}",
            src.len(),
            dst.elem_count()
        );
    }
    if src.is_empty() {
        return Ok(());
    }
    let (ptr, stream) = target::<T>(dst, "upload")?;
    // SAFETY: `ptr` addresses at least `src.len()` elements of `dst` (checked above); the copy is
    // staged out of `src` before the call returns (pageable host memory).
    let code = unsafe {
        sys::cuMemcpyHtoDAsync_v2(ptr, src.as_ptr().cast(), std::mem::size_of_val(src), stream)
    };
    check_code(code, "upload")
}

/// Writes `rows` rows of `width` elements (`src`, row-major) into the first columns of the first
/// rows of the contiguous 2-D CUDA tensor `dst` (`[_, cols]`, `width <= cols`), in one copy.
pub fn upload_rows<T: WithDType>(dst: &Tensor, src: &[T], rows: usize, width: usize) -> Result<()> {
    let (dst_rows, cols) = dst.dims2()?;
    if src.len() != rows * width || rows > dst_rows || width > cols {
        bail!(
            "upload_rows: {rows} x {width} from {} elements into {:?}",
            src.len(),
            dst.dims()
        );
    }
    if src.is_empty() {
        return Ok(());
    }
    let (ptr, stream) = target::<T>(dst, "upload_rows")?;
    let size = std::mem::size_of::<T>();
    let copy = sys::CUDA_MEMCPY2D {
        srcXInBytes: 0,
        srcY: 0,
        srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_HOST,
        srcHost: src.as_ptr().cast(),
        srcDevice: 0,
        srcArray: std::ptr::null_mut(),
        srcPitch: width * size,
        dstXInBytes: 0,
        dstY: 0,
        dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        dstHost: std::ptr::null_mut(),
        dstDevice: ptr,
        dstArray: std::ptr::null_mut(),
        dstPitch: cols * size,
        WidthInBytes: width * size,
        Height: rows,
    };
    // SAFETY: the copy stays inside `dst` (rows and width checked against its shape) and reads
    // exactly `src`; pageable host memory is staged before the call returns.
    let code = unsafe { sys::cuMemcpy2DAsync_v2(&copy, stream) };
    check_code(code, "upload_rows")
}

/// Page-locked host memory for `u32` results (sampled token ids), mapped into the GPU's address
/// space: a kernel writes it directly ([`crate::sample_into`]), or a stream copies into it
/// ([`PinnedIds::copy_from`]); either can be captured in a CUDA graph, so a replay ends with the
/// ids already on the host and reading them costs no driver call.
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
        check_code(code, "PinnedIds::new")?;
        let mut device = 0;
        // SAFETY: `ptr` is a mapped allocation of this context.
        let code = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device, ptr, 0) };
        if let Err(e) = check_code(code, "PinnedIds::new (device address)") {
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

    /// Enqueues a copy of `src` (a contiguous u32 CUDA tensor of at most `len` elements) into the
    /// first elements, on `src`'s stream. The values are readable once that stream is synchronized.
    pub fn copy_from(&mut self, src: &Tensor) -> Result<()> {
        let n = src.elem_count();
        if n > self.len {
            bail!("PinnedIds: {n} ids do not fit {}", self.len);
        }
        let (ptr, stream) = target::<u32>(src, "PinnedIds::copy_from")?;
        // SAFETY: `src` holds `n` u32s at `ptr` (dtype checked by `target`), and `self.ptr` has
        // room for them; `&mut self` keeps host reads away until the owner synchronizes.
        let code = unsafe { sys::cuMemcpyDtoHAsync_v2(self.ptr.cast(), ptr, n * 4, stream) };
        check_code(code, "PinnedIds::copy_from")
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
