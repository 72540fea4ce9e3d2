//! CUDA kernels for pagewise, as safe candle operations: `reshape_and_cache` (write a step's K/V
//! into the paged cache at the slot mapping), paged decode attention (`decode.rs`: query rows read
//! K/V through block tables, GQA, split-KV), varlen prefill attention on tensor cores
//! (`prefill.rs`) and sampling (`sampling.rs`: argmax or a seeded Gumbel-max draw per row). Every
//! dtype, shape, contiguity and device is checked before a launch, with a message naming the
//! argument at fault. What cannot be checked without copying it to the host, the values of
//! device-side indices (slot mappings, block tables, context lengths, positions), is the caller's
//! promise: the functions that take them are `unsafe fn`, each with its contract under "Safety".
//!
//! Compiled only with the app's `cuda` feature; kernels/build.rs builds kernels/csrc with nvcc.

mod affine;
pub mod allreduce;
mod decode;
mod decode_fresh;
mod ffi;
mod fp8;
mod fp8_gemm;
mod fused;
mod gemv;
mod gemv_rope;
mod gemv_weight;
mod grouped;
mod int4;
mod moe;
mod moe_affine;
mod moe_mma;
mod moe_routing;
mod moe_slices;
mod mxfp4;
mod o_router;
mod pinned;
mod prefill;
mod rope;
mod sampling;
mod split;
mod staging;

pub use affine::{AffineMatrix, CodeBits, affine_dequantize};
pub use decode::{
    CacheWrites, DecodeWorkspace, paged_attention, paged_attention_planned,
    paged_attention_planned_into, paged_attention_rows, paged_decode_attention, plan_for,
    plan_for_rows,
};
pub use decode_fresh::paged_attention_fresh;
pub use fp8::{Fp8Matrix, fp8_dequantize, fp8_quantize_rows};
pub use fp8_gemm::{Fp8Gemm, fp8_gemm};
pub use fused::{add_rms_norm, add_rms_normed, silu_mul};
pub use gemv::{GEMV_MAX_ROWS, GemvInput, gemv, gemv_add_normed, gemv_fits, gemv_fused};
pub use gemv_rope::{RopeCacheTarget, gemv_rope_cache};
pub use gemv_weight::{AFFINE_GEMV_MAX_ROWS, GemvWeight};
pub use grouped::GroupedGemm;
pub use int4::{Int4Layout, Int4Matrix, int4_dequantize};
pub use moe::{
    ExpertExtras, ExpertPlan, ExpertWeights, MOE_MAX_TOP_K, moe_experts, moe_experts_by,
    moe_experts_with, moe_fits, moe_stacks_fit,
};
pub use moe_affine::AffineStack;
pub use moe_mma::moe_experts_fp4_mma;
pub use moe_routing::{MoeRoutes, moe_max_experts, moe_route, moe_route_experts, moe_router};
pub use moe_slices::moe_slice_columns;
pub use mxfp4::{MXFP4_MAX_SCALE, Mxfp4Stack};
pub use o_router::{RouterLogits, fold_router, o_router};
pub use pinned::PinnedIds;
pub use prefill::{PrefillSeqs, paged_prefill_attention};
pub use rope::{HeadNorms, MAX_NORM_HEADS, QkvRope, rope_qkv_cache};
pub use sampling::{SampleOutputs, sample, sample_into, sample_masked, sample_workspace_len};
pub use split::{MIN_CHUNK, decode_slots, decode_tile_rows, graph_split_plan, split_plan};
pub use staging::{MAX_STAGED_FIELDS, StagedField, Staging};

use std::ffi::c_void;

use candle_core::cuda_backend::cudarc::driver::DevicePtr;
use candle_core::{DType, Result, Storage, Tensor, bail};

pub(crate) fn dtype_code(dtype: DType, what: &str) -> Result<i32> {
    Ok(match dtype {
        DType::F32 => 0,
        DType::F16 => 1,
        DType::BF16 => 2,
        other => bail!("{what}: dtype {other:?} is not supported (f32, f16, bf16)"),
    })
}

/// Device address of a contiguous CUDA tensor's first element, and the stream of its device.
pub(crate) fn device_ptr(t: &Tensor, what: &str) -> Result<(u64, *mut c_void)> {
    if !t.is_contiguous() {
        bail!("{what} must be contiguous, got strides {:?}", t.stride());
    }
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cuda(cs) = &*storage else {
        bail!("{what} must be on a CUDA device, it is on {:?}", t.device());
    };
    let stream = cs.device.cuda_stream();
    let base = match t.dtype() {
        DType::F32 => cs.as_cuda_slice::<f32>()?.device_ptr(&stream).0,
        DType::F16 => cs.as_cuda_slice::<half::f16>()?.device_ptr(&stream).0,
        DType::BF16 => cs.as_cuda_slice::<half::bf16>()?.device_ptr(&stream).0,
        DType::I64 => cs.as_cuda_slice::<i64>()?.device_ptr(&stream).0,
        DType::U32 => cs.as_cuda_slice::<u32>()?.device_ptr(&stream).0,
        DType::I32 => cs.as_cuda_slice::<i32>()?.device_ptr(&stream).0,
        DType::U8 => cs.as_cuda_slice::<u8>()?.device_ptr(&stream).0,
        other => bail!("{what}: dtype {other:?} has no kernel"),
    };
    let offset = (layout.start_offset() * t.dtype().size_in_bytes()) as u64;
    Ok((base + offset, stream.cu_stream() as *mut c_void))
}

/// A layer's K and V scales in an FP8 KV cache: a K value `x` is stored as e4m3(`x / k`)
/// (saturated to ±448, rounded to nearest even) and read back as `e4m3 * k` rounded to the
/// model's 16-bit dtype; V likewise with `v`. (`KvScales` in kernels/csrc/kv_fp8.cuh.)
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KvScales {
    /// K's scale.
    pub k: f32,
    /// V's scale.
    pub v: f32,
}

impl KvScales {
    /// Scales of 1: vLLM's default where a checkpoint has none.
    pub const ONE: KvScales = KvScales { k: 1.0, v: 1.0 };
}

/// A layer's paged K and V caches (`[num_blocks, block_size, kv_heads, head_dim]` each), as the
/// kernels that write and read them take them.
#[derive(Clone, Copy, Debug)]
pub struct PagedKv<'a> {
    /// The K cache.
    pub k: &'a Tensor,
    /// The V cache, of `k`'s shape and dtype.
    pub v: &'a Tensor,
    /// `None`: the caches hold the model's dtype. `Some`: they hold e4m3 bytes (`U8` tensors)
    /// with these scales (f16 and bf16 models; the tensor-core kernels only).
    pub fp8: Option<KvScales>,
}

impl<'a> PagedKv<'a> {
    /// Caches of the model's dtype.
    pub fn new(k: &'a Tensor, v: &'a Tensor) -> Self {
        PagedKv { k, v, fp8: None }
    }

    /// Caches of e4m3 bytes with `scales`.
    pub fn fp8(k: &'a Tensor, v: &'a Tensor, scales: KvScales) -> Self {
        PagedKv {
            k,
            v,
            fp8: Some(scales),
        }
    }

    /// The scales as the C entry points take them (null: 16-bit caches). The pointer borrows
    /// `self`.
    pub(crate) fn scales_ptr(&self) -> *const KvScales {
        self.fp8
            .as_ref()
            .map_or(std::ptr::null(), |s| s as *const KvScales)
    }

    /// That both caches hold `dtype` (`op`'s values), or e4m3 bytes for f16 and bf16 values
    /// with positive, finite scales.
    pub(crate) fn check_dtype(&self, dtype: DType, op: &str) -> Result<()> {
        let want = match self.fp8 {
            None => dtype,
            Some(s) => {
                if !matches!(dtype, DType::F16 | DType::BF16) {
                    bail!("{op}: an FP8 KV cache takes f16 or bf16 values, not {dtype:?}");
                }
                if !(s.k.is_finite() && s.k > 0.0 && s.v.is_finite() && s.v > 0.0) {
                    bail!("{op}: FP8 KV scales must be positive and finite, got {s:?}");
                }
                DType::U8
            }
        };
        for (t, what) in [(self.k, "k_cache"), (self.v, "v_cache")] {
            if t.dtype() != want {
                bail!(
                    "{op}: {what} is {:?} but must be {want:?}{}",
                    t.dtype(),
                    if self.fp8.is_some() { " (FP8 KV)" } else { "" }
                );
            }
        }
        Ok(())
    }
}

/// The checks every attention kernel needs: `out` has `q`'s shape and dtype, the two caches
/// match each other and `q`'s head dim (64, 128 or 256) and dtype (or are FP8 caches), and the
/// query heads share the KV heads evenly. Returns the caches' (block_size, kv_heads).
pub(crate) fn check_attention(
    out: &Tensor,
    q: &Tensor,
    kv: &PagedKv<'_>,
) -> Result<(usize, usize)> {
    let (k_cache, v_cache) = (kv.k, kv.v);
    let (_, heads, head_dim) = q.dims3()?;
    let (_, block_size, kv_heads, cd) = k_cache.dims4()?;
    if out.dims() != q.dims() || out.dtype() != q.dtype() {
        bail!("out {:?} must match q {:?}", out.dims(), q.dims());
    }
    if cd != head_dim || v_cache.dims() != k_cache.dims() {
        bail!(
            "caches {:?}/{:?} do not match q's head_dim {head_dim}",
            k_cache.dims(),
            v_cache.dims()
        );
    }
    if kv_heads == 0 || heads % kv_heads != 0 {
        bail!("{heads} query heads cannot share {kv_heads} KV heads evenly");
    }
    if ![64, 128, 256].contains(&head_dim) {
        bail!("head_dim {head_dim} is not supported (64, 128, 256)");
    }
    kv.check_dtype(q.dtype(), "paged attention")?;
    Ok((block_size, kv_heads))
}

/// A tensor whose memory is allocated but not initialized, for outputs a kernel fully writes.
pub fn empty(
    shape: impl Into<candle_core::Shape>,
    dtype: DType,
    device: &candle_core::Device,
) -> Result<Tensor> {
    use candle_core::cuda_backend::CudaStorage;
    let shape = shape.into();
    let n = shape.elem_count().max(1);
    let Ok(dev) = device.as_cuda_device().cloned() else {
        bail!("kernel outputs must be on a CUDA device, got {device:?}");
    };
    // SAFETY: the memory goes only to kernels that write every element before anything reads it.
    let storage = unsafe {
        match dtype {
            DType::F32 => CudaStorage::wrap_cuda_slice(dev.alloc::<f32>(n)?, dev.clone()),
            DType::F16 => CudaStorage::wrap_cuda_slice(dev.alloc::<half::f16>(n)?, dev.clone()),
            DType::BF16 => CudaStorage::wrap_cuda_slice(dev.alloc::<half::bf16>(n)?, dev.clone()),
            DType::U32 => CudaStorage::wrap_cuda_slice(dev.alloc::<u32>(n)?, dev.clone()),
            DType::U8 => CudaStorage::wrap_cuda_slice(dev.alloc::<u8>(n)?, dev.clone()),
            other => bail!("empty: dtype {other:?} is not supported"),
        }
    };
    Ok(Tensor::from_storage(
        Storage::Cuda(storage),
        shape,
        candle_core::op::BackpropOp::none(),
        false,
    ))
}

/// A CUDA driver call's result as an error naming `what`.
pub(crate) fn check_driver(
    code: candle_core::cuda_backend::cudarc::driver::sys::CUresult,
    what: &str,
) -> Result<()> {
    if code != candle_core::cuda_backend::cudarc::driver::sys::CUresult::CUDA_SUCCESS {
        bail!("{what}: {code:?}");
    }
    Ok(())
}

/// That `t` is a vector of `len` elements of `dtype` (an index input: slots, lengths,
/// positions), or an error "`what` must be `<dtype>` `[len]`, got ...".
pub(crate) fn check_index_vector(t: &Tensor, dtype: DType, len: usize, what: &str) -> Result<()> {
    if t.dtype() != dtype || t.dims() != [len] {
        bail!(
            "{what} must be {} [{len}], got {:?} {:?}",
            dtype.as_str(),
            t.dtype(),
            t.dims()
        );
    }
    Ok(())
}

pub(crate) fn check_launch(code: i32, what: &str) -> Result<()> {
    if code != 0 {
        bail!("{what}: CUDA launch failed with error {code}");
    }
    Ok(())
}

/// Writes `key`, `value` (`[tokens, kv_heads, head_dim]`) into the caches `kv`
/// (`[num_blocks, block_size, kv_heads, head_dim]`) at `slot_mapping` (`[tokens]`, i64; a negative
/// slot skips its token). The caches are modified in place.
///
/// # Safety
/// The kernel trusts the device-side indices it is given; their values are not checked (that
/// would cost a copy to the host each call). The caller guarantees that every slot in
/// `slot_mapping` is -1 or below `num_blocks * block_size` of the caches, and that no two tokens
/// of one call share a slot.
pub unsafe fn reshape_and_cache(
    key: &Tensor,
    value: &Tensor,
    kv: PagedKv<'_>,
    slot_mapping: &Tensor,
) -> Result<()> {
    let (k_cache, v_cache) = (kv.k, kv.v);
    let (tokens, kv_heads, head_dim) = key.dims3()?;
    if value.dims() != key.dims() {
        bail!(
            "value {:?} must have key's shape {:?}",
            value.dims(),
            key.dims()
        );
    }
    let (_, _, ckh, cd) = k_cache.dims4()?;
    if (ckh, cd) != (kv_heads, head_dim) || v_cache.dims() != k_cache.dims() {
        bail!(
            "caches {:?}/{:?} do not match key [_, {kv_heads}, {head_dim}]",
            k_cache.dims(),
            v_cache.dims()
        );
    }
    if value.dtype() != key.dtype() {
        bail!("value is {:?} but key is {:?}", value.dtype(), key.dtype());
    }
    kv.check_dtype(key.dtype(), "reshape_and_cache")?;
    check_index_vector(slot_mapping, DType::I64, tokens, "slot_mapping")?;
    let dtype = dtype_code(key.dtype(), "reshape_and_cache")?;
    let (k, stream) = device_ptr(key, "key")?;
    let (v, _) = device_ptr(value, "value")?;
    let (kc, _) = device_ptr(k_cache, "k_cache")?;
    let (vc, _) = device_ptr(v_cache, "v_cache")?;
    let (slots, _) = device_ptr(slot_mapping, "slot_mapping")?;
    // SAFETY: shapes, dtypes and contiguity are checked above; the tensors outlive the launch,
    // which is ordered on the device's stream like candle's own kernels.
    let code = unsafe {
        ffi::pagewise_reshape_and_cache(
            dtype,
            k as *const c_void,
            v as *const c_void,
            kc as *mut c_void,
            vc as *mut c_void,
            kv.scales_ptr(),
            slots as *const i64,
            tokens as i32,
            (kv_heads * head_dim) as i32,
            stream,
        )
    };
    check_launch(code, "reshape_and_cache")
}
