//! NCCL collectives (feature `nccl`): one communicator per rank on its device's stream, so the
//! all-reduces run in order with the model's kernels and are captured into the decode CUDA
//! graphs like them. Each collective is a candle op writing a fresh tensor (allocated on the
//! stream, as every other activation).

use std::sync::Arc;

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{CudaStream, DevicePtr};
use candle_core::cuda_backend::cudarc::nccl::{result, sys};
use candle_core::{CudaStorage, CustomOp1, DType, Device, Layout, Shape, Tensor};

use super::collective::Collective;
use super::shard::TpRank;

/// A fresh NCCL unique id (rank 0 makes it; the rendezvous hands it to the others).
pub fn unique_id() -> Result<Vec<u8>, String> {
    let id = result::get_uniqueid().map_err(|e| format!("ncclGetUniqueId: {e:?}"))?;
    Ok(id.internal.iter().map(|&c| c as u8).collect())
}

/// One rank's NCCL communicator, on its device's stream.
pub struct NcclComm {
    comm: sys::ncclComm_t,
    stream: Arc<CudaStream>,
    size: usize,
}

// SAFETY: an NCCL communicator may be used from any thread; calls on it are never concurrent
// here (only the engine thread's forward pass issues them, one after another).
unsafe impl Send for NcclComm {}
// SAFETY: as above: shared references only issue collectives from the one forward pass.
unsafe impl Sync for NcclComm {}

impl NcclComm {
    /// Joins the group `rank` belongs to on `device` (every rank calls this with the same `id`;
    /// it returns once all have).
    pub fn new(device: &Device, rank: TpRank, id: &[u8]) -> Result<Self, String> {
        let cuda = device
            .as_cuda_device()
            .map_err(|e| format!("NCCL needs a CUDA device: {e}"))?;
        let internal: [std::ffi::c_char; 128] = id
            .iter()
            .map(|&b| b as std::ffi::c_char)
            .collect::<Vec<_>>()
            .try_into()
            .map_err(|_| format!("an NCCL id is 128 bytes, got {}", id.len()))?;
        let mut comm = std::mem::MaybeUninit::uninit();
        // SAFETY: `comm` is written by NCCL on success before it is read; the id is 128 bytes.
        let comm = unsafe {
            result::comm_init_rank(
                comm.as_mut_ptr(),
                rank.size as i32,
                sys::ncclUniqueId { internal },
                rank.rank as i32,
            )
            .map_err(|e| {
                format!(
                    "ncclCommInitRank (rank {} of {}): {e:?}",
                    rank.rank, rank.size
                )
            })?;
            comm.assume_init()
        };
        Ok(NcclComm {
            comm,
            stream: cuda.cuda_stream(),
            size: rank.size,
        })
    }
}

// No Drop: the communicator is left to the process's exit. On the H200 pair, ncclCommAbort after
// the decode graphs had run never returned, on either rank, so a server could not stop; a
// communicator lives as long as its engine, which is the process in practice.

enum Op {
    AllReduce,
    AllGather,
}

struct NcclOp<'a> {
    comm: &'a NcclComm,
    op: Op,
}

fn nccl_dtype(dtype: DType) -> candle_core::Result<sys::ncclDataType_t> {
    Ok(match dtype {
        DType::BF16 => sys::ncclDataType_t::ncclBfloat16,
        DType::F16 => sys::ncclDataType_t::ncclFloat16,
        DType::F32 => sys::ncclDataType_t::ncclFloat32,
        other => candle_core::bail!("NCCL collectives take bf16, f16 or f32, not {other:?}"),
    })
}

impl CustomOp1 for NcclOp<'_> {
    fn name(&self) -> &'static str {
        match self.op {
            Op::AllReduce => "nccl-all-reduce",
            Op::AllGather => "nccl-all-gather",
        }
    }

    fn cpu_fwd(
        &self,
        _: &candle_core::CpuStorage,
        _: &Layout,
    ) -> candle_core::Result<(candle_core::CpuStorage, Shape)> {
        candle_core::bail!("NCCL collectives run on CUDA tensors")
    }

    fn cuda_fwd(&self, s: &CudaStorage, l: &Layout) -> candle_core::Result<(CudaStorage, Shape)> {
        let Some((start, end)) = l.contiguous_offsets() else {
            candle_core::bail!("{}: the input must be contiguous", self.name());
        };
        let n = end - start;
        let (out_len, shape) = match self.op {
            Op::AllReduce => (n, l.shape().clone()),
            Op::AllGather => {
                let mut dims = vec![self.comm.size];
                dims.extend_from_slice(l.dims());
                (n * self.comm.size, Shape::from(dims))
            }
        };
        let dev = s.device.clone();
        let stream = &self.comm.stream;
        macro_rules! run {
            ($t:ty) => {{
                let src = s.as_cuda_slice::<$t>()?.slice(start..end);
                // SAFETY: every element of `dst` is written by the collective before it is read.
                let dst = unsafe { dev.alloc::<$t>(out_len)? };
                let (src_ptr, _g1) = src.device_ptr(stream);
                let (dst_ptr, _g2) = dst.device_ptr(stream);
                let dtype = nccl_dtype(s.dtype())?;
                // SAFETY: both buffers live on this communicator's device and stream, `src` holds
                // `n` elements and `dst` `out_len`, and the call is ordered on the model's stream.
                let status = unsafe {
                    match self.op {
                        Op::AllReduce => result::all_reduce(
                            src_ptr as *const _,
                            dst_ptr as *mut _,
                            n,
                            dtype,
                            sys::ncclRedOp_t::ncclSum,
                            self.comm.comm,
                            stream.cu_stream() as _,
                        ),
                        Op::AllGather => result::all_gather(
                            src_ptr as *const _,
                            dst_ptr as *mut _,
                            n,
                            dtype,
                            self.comm.comm,
                            stream.cu_stream() as _,
                        ),
                    }
                };
                status.map_err(|e| candle_core::Error::Msg(format!("{}: {e:?}", self.name())))?;
                drop((_g1, _g2));
                CudaStorage::wrap_cuda_slice(dst, dev.clone())
            }};
        }
        let out = match s.dtype() {
            DType::BF16 => run!(half::bf16),
            DType::F16 => run!(half::f16),
            DType::F32 => run!(f32),
            other => candle_core::bail!("NCCL collectives take bf16, f16 or f32, not {other:?}"),
        };
        Ok((out, shape))
    }
}

impl Collective for NcclComm {
    fn all_reduce(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        x.apply_op1_no_bwd(&NcclOp {
            comm: self,
            op: Op::AllReduce,
        })
    }

    fn all_gather(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        x.apply_op1_no_bwd(&NcclOp {
            comm: self,
            op: Op::AllGather,
        })
    }
}
