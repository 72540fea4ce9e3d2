//! `--device`: where the model runs (`auto`, `cpu`, `cuda`, `cuda:N`), and what a GPU says about its
//! memory.

use std::fmt;
use std::str::FromStr;

use candle_core::Device;

use super::args::EngineError;

/// Where the model runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DeviceArg {
    /// The first GPU when this build has CUDA and one is present, else the CPU.
    #[default]
    Auto,
    /// The CPU.
    Cpu,
    /// CUDA GPU number N.
    Cuda(usize),
}

impl FromStr for DeviceArg {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(DeviceArg::Auto),
            "cpu" => Ok(DeviceArg::Cpu),
            "cuda" | "gpu" => Ok(DeviceArg::Cuda(0)),
            other => other
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(DeviceArg::Cuda)
                .ok_or_else(|| format!("`{s}` is not a device: use auto, cpu, cuda or cuda:N")),
        }
    }
}

impl fmt::Display for DeviceArg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceArg::Auto => f.write_str("auto"),
            DeviceArg::Cpu => f.write_str("cpu"),
            DeviceArg::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

impl DeviceArg {
    /// Opens the device.
    pub fn open(self) -> Result<Device, EngineError> {
        match self {
            DeviceArg::Cpu => Ok(Device::Cpu),
            DeviceArg::Cuda(n) if cfg!(feature = "cuda") => Device::new_cuda(n).map_err(|e| {
                EngineError::Config(format!(
                    "cannot open cuda:{n} ({e}): no usable NVIDIA GPU there (check nvidia-smi \
                     and the driver), or run on the CPU with --device cpu"
                ))
            }),
            DeviceArg::Cuda(_) => Err(EngineError::Config(
                "this pagewise was built without GPU support; rebuild with `--features cuda`"
                    .into(),
            )),
            DeviceArg::Auto if cfg!(feature = "cuda") => match Device::new_cuda(0) {
                Ok(d) => Ok(d),
                Err(e) => {
                    tracing::warn!("no usable GPU ({e}); running on the CPU");
                    Ok(Device::Cpu)
                }
            },
            DeviceArg::Auto => Ok(Device::Cpu),
        }
    }
}

/// Memory figures of a GPU, in bytes.
#[derive(Clone, Copy, Debug)]
pub struct GpuMemory {
    /// Free on the device now.
    pub free: u64,
    /// The device's total.
    pub total: u64,
    /// Most bytes our allocations held at once since the last `reset_peak` (CUDA builds).
    pub pool_peak: u64,
    /// Bytes our allocations hold now.
    pub pool_used: u64,
}

#[cfg(feature = "cuda")]
use candle_core::cuda_backend::cudarc::driver::{CudaContext, sys};

/// Waits for `device`'s queued work, binds its context to this thread and looks up its default
/// memory pool (where candle's stream-ordered allocations come from), if the driver reports one.
#[cfg(feature = "cuda")]
fn default_pool(
    device: &Device,
) -> candle_core::Result<(std::sync::Arc<CudaContext>, Option<sys::CUmemoryPool>)> {
    device.synchronize()?;
    let ctx = device.as_cuda_device()?.cuda_stream().context().clone();
    ctx.bind_to_thread()
        .map_err(|e| candle_core::Error::Msg(format!("binding the CUDA context: {e}")))?;
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: the context is bound; the call writes only to `pool`.
    let found = unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device()) }
        == sys::CUresult::CUDA_SUCCESS;
    Ok((ctx, found.then_some(pool)))
}

/// What the GPU behind `device` reports (waits for its queued work first).
#[cfg(feature = "cuda")]
pub fn gpu_memory(device: &Device) -> candle_core::Result<GpuMemory> {
    let (ctx, pool) = default_pool(device)?;
    let (free, total) = ctx
        .mem_get_info()
        .map_err(|e| candle_core::Error::Msg(format!("cuMemGetInfo: {e}")))?;
    let attr = |a: sys::CUmemPool_attribute| -> u64 {
        let mut value = 0u64;
        if let Some(pool) = pool {
            // SAFETY: `pool` belongs to the bound context; the call writes only to `value`, and
            // a failure leaves it 0.
            unsafe { sys::cuMemPoolGetAttribute(pool, a, (&mut value as *mut u64).cast()) };
        }
        value
    };
    Ok(GpuMemory {
        free: free as u64,
        total: total as u64,
        pool_peak: attr(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH),
        pool_used: attr(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT),
    })
}

/// The GPU's (used, total) bytes now, without waiting for its queued work (one driver call; for
/// the live view). `None` on the CPU, or if the driver does not answer.
pub fn memory_now(device: &Device) -> Option<(u64, u64)> {
    #[cfg(feature = "cuda")]
    if let Ok(cuda) = device.as_cuda_device() {
        let ctx = cuda.cuda_stream().context().clone();
        let (free, total) = ctx.mem_get_info().ok()?;
        return Some(((total - free) as u64, total as u64));
    }
    let _ = device;
    None
}

/// Restarts the peak of [`GpuMemory::pool_peak`] from the current use.
#[cfg(feature = "cuda")]
pub fn reset_peak(device: &Device) -> candle_core::Result<()> {
    if let (_ctx, Some(pool)) = default_pool(device)? {
        let mut zero = 0u64;
        // SAFETY: as in `gpu_memory`; setting USED_MEM_HIGH to 0 resets it to the current use.
        unsafe {
            sys::cuMemPoolSetAttribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
                (&mut zero as *mut u64).cast(),
            )
        };
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_names_parse_and_print_back() {
        for (s, d) in [
            ("auto", DeviceArg::Auto),
            ("cpu", DeviceArg::Cpu),
            ("cuda:3", DeviceArg::Cuda(3)),
        ] {
            assert_eq!(s.parse::<DeviceArg>().unwrap(), d);
            assert_eq!(d.to_string(), s);
        }
        assert_eq!("CUDA".parse::<DeviceArg>().unwrap(), DeviceArg::Cuda(0));
        let err = "tpu".parse::<DeviceArg>().unwrap_err();
        assert!(err.contains("auto, cpu, cuda or cuda:N"), "{err}");
        assert!("cuda:x".parse::<DeviceArg>().is_err());
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn a_gpu_on_a_cpu_build_is_a_clear_error() {
        let err = DeviceArg::Cuda(0).open().unwrap_err().to_string();
        assert!(err.contains("--features cuda"), "{err}");
        assert!(DeviceArg::Auto.open().unwrap().is_cpu());
    }
}
