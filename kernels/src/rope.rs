//! Rotary embedding and the KV-cache write in one kernel, reading a fused q/k/v projection: what
//! would be two rotary launches, two copies to contiguous q/k and `reshape_and_cache`.

use std::ffi::c_void;

use candle_core::{DType, Result, Tensor, bail};

use crate::{PagedKv, check_index_vector, device_ptr, dtype_code, empty, ffi};

/// The fused q/k/v projection of a step and how to rotate it.
pub struct QkvRope<'a> {
    /// `[tokens, (heads + 2 * kv_heads) * head_dim]`: q heads, then k heads, then v heads.
    pub qkv: &'a Tensor,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Rotary cos and sin at each token's position, `[tokens, head_dim / 2]`; or, with
    /// `positions`, the whole table `[max_positions, head_dim / 2]`.
    pub cos: &'a Tensor,
    /// See `cos`.
    pub sin: &'a Tensor,
    /// Each token's position (u32 `[tokens]`), when `cos` and `sin` are whole tables (a position
    /// past the table reads its last row).
    pub positions: Option<&'a Tensor>,
    /// Pairs (2i, 2i + 1) instead of rotate-half's (i, i + head_dim / 2).
    pub interleaved: bool,
    /// Qwen3's and Gemma 3's per-head RMSNorm of q and k before rotation, if the model has it.
    pub head_norms: Option<HeadNorms<'a>>,
}

/// The RMSNorm of each query head and each key head (`[head_dim]` weights, in the projection's
/// dtype), applied before rotary; the normalized values are rounded to the dtype, as a separate
/// norm kernel would store them.
#[derive(Clone, Copy)]
pub struct HeadNorms<'a> {
    /// The query heads' weight.
    pub q: &'a Tensor,
    /// The key heads' weight.
    pub k: &'a Tensor,
    /// The norm's epsilon.
    pub eps: f32,
}

/// Most query + key heads a token may have with [`HeadNorms`] (the kernel keeps one inverse
/// RMS each in shared memory).
pub const MAX_NORM_HEADS: usize = 512;

/// Rotates q and k of `x` (normalized first by `x.head_norms`, if any), writes the rotated k and
/// the v of each token into the paged caches `kv` (`[blocks, block_size, kv_heads, head_dim]`,
/// 16-bit or FP8) at its slot (`slot_mapping`, i64, -1 = skip), and returns the rotated q,
/// `[tokens, heads, head_dim]`.
///
/// # Safety
/// The kernel trusts the device-side indices it is given; their values are not checked (that
/// would cost a copy to the host each call). The caller guarantees that every slot in the slot
/// mapping is -1 or below `num_blocks * block_size` of the caches, that no two tokens of one
/// call share a slot, and, without `positions`, that `cos` and `sin` hold a row per token.
pub unsafe fn rope_qkv_cache(
    x: &QkvRope<'_>,
    kv: PagedKv<'_>,
    slot_mapping: &Tensor,
) -> Result<Tensor> {
    let (a, tokens, d) = qkv_rope_args("rope_qkv_cache", x, &kv, slot_mapping)?;
    let dtype = dtype_code(x.qkv.dtype(), "rope_qkv_cache")?;
    let q = empty((tokens, x.heads, d), x.qkv.dtype(), x.qkv.device())?;
    let (qo, stream) = device_ptr(&q, "q")?;
    // SAFETY: shapes and dtypes checked above; slots address rows inside the caches by the
    // caller's contract (the block manager's slot mapping), as for `reshape_and_cache`; a
    // position past the tables reads their last row (clamped in the kernel).
    let code = unsafe {
        ffi::pagewise_rope_qkv_cache(
            dtype,
            qo as *mut c_void,
            a.k_cache,
            a.v_cache,
            kv.scales_ptr(),
            a.qkv,
            a.cos,
            a.sin,
            a.positions,
            a.table_rows,
            a.slots,
            a.q_norm,
            a.k_norm,
            a.eps,
            tokens as i32,
            x.heads as i32,
            x.kv_heads as i32,
            d as i32,
            a.interleaved,
            stream,
        )
    };
    crate::check_launch(code, "rope_qkv_cache")?;
    Ok(q)
}

/// A step's fused projection `x`, the caches and its slot mapping as every kernel that rotates
/// it into the caches takes them (`ffi::FreshQkv`), with the step's tokens and the head dim,
/// after the checks those kernels share (`op`, named in the messages).
pub(crate) fn qkv_rope_args(
    op: &str,
    x: &QkvRope<'_>,
    kv: &PagedKv<'_>,
    slot_mapping: &Tensor,
) -> Result<(ffi::FreshQkv, usize, usize)> {
    let (k_cache, v_cache) = (kv.k, kv.v);
    let (tokens, width) = x.qkv.dims2()?;
    let (_, _, kv_heads, d) = k_cache.dims4()?;
    if kv_heads != x.kv_heads || width != (x.heads + 2 * kv_heads) * d || d % 2 != 0 {
        bail!(
            "{op}: qkv {:?} does not hold {} + 2 x {} heads of the caches' {:?}",
            x.qkv.dims(),
            x.heads,
            x.kv_heads,
            k_cache.dims()
        );
    }
    check_rope_inputs(
        op,
        tokens,
        (x.cos, x.sin, x.positions),
        (k_cache, v_cache),
        slot_mapping,
    )?;
    kv.check_dtype(x.qkv.dtype(), op)?;
    let mut same_dtype = vec![(x.cos, "cos"), (x.sin, "sin")];
    if let Some(n) = &x.head_norms {
        for (w, what) in [(n.q, "q norm"), (n.k, "k norm")] {
            if w.dims() != [d] || !w.is_contiguous() {
                bail!(
                    "{op}: the {what} weight must be contiguous [{d}], got {:?}",
                    w.dims()
                );
            }
            same_dtype.push((w, what));
        }
        if x.heads + kv_heads > MAX_NORM_HEADS {
            bail!(
                "{op}: {} + {kv_heads} normalized heads are past the kernel's {MAX_NORM_HEADS}",
                x.heads
            );
        }
    }
    for (t, what) in same_dtype {
        if t.dtype() != x.qkv.dtype() {
            bail!(
                "{op}: {what} is {:?} but qkv is {:?}",
                t.dtype(),
                x.qkv.dtype()
            );
        }
    }
    let (q_norm, k_norm, eps) = match &x.head_norms {
        Some(n) => (
            device_ptr(n.q, "q norm")?.0 as *const c_void,
            device_ptr(n.k, "k norm")?.0 as *const c_void,
            n.eps,
        ),
        None => (std::ptr::null(), std::ptr::null(), 0.0),
    };
    let args = ffi::FreshQkv {
        qkv: device_ptr(x.qkv, "qkv")?.0 as *const c_void,
        k_cache: device_ptr(k_cache, "k_cache")?.0 as *mut c_void,
        v_cache: device_ptr(v_cache, "v_cache")?.0 as *mut c_void,
        cos: device_ptr(x.cos, "cos")?.0 as *const c_void,
        sin: device_ptr(x.sin, "sin")?.0 as *const c_void,
        positions: match x.positions {
            Some(p) => device_ptr(p, "positions")?.0 as *const u32,
            None => std::ptr::null(),
        },
        table_rows: i32::try_from(x.cos.dim(0)?).unwrap_or(i32::MAX),
        slots: device_ptr(slot_mapping, "slot_mapping")?.0 as *const i64,
        q_norm,
        k_norm,
        eps,
        interleaved: i32::from(x.interleaved),
    };
    Ok((args, tokens, d))
}

/// The checks both kernels that rotate and write the cache (`op`, named in the messages) make
/// of their step's `tokens` rows: the two caches alike (`[blocks, block_size, kv_heads,
/// head_dim]`), cos and sin `[tokens, head_dim / 2]` (with `positions`, whole tables of any
/// length read at u32 `positions [tokens]`), the slot mapping i64 `[tokens]`.
pub(crate) fn check_rope_inputs(
    op: &str,
    tokens: usize,
    (cos, sin, positions): (&Tensor, &Tensor, Option<&Tensor>),
    (k_cache, v_cache): (&Tensor, &Tensor),
    slot_mapping: &Tensor,
) -> Result<()> {
    let (_, _, _, d) = k_cache.dims4()?;
    if v_cache.dims() != k_cache.dims() {
        bail!(
            "{op}: caches {:?}/{:?} differ",
            k_cache.dims(),
            v_cache.dims()
        );
    }
    if let Some(p) = positions {
        check_index_vector(p, DType::U32, tokens, &format!("{op}: positions"))?;
    }
    let rows = match positions {
        Some(_) => cos.dim(0)?.max(1),
        None => tokens,
    };
    for (t, what) in [(cos, "cos"), (sin, "sin")] {
        if t.dims() != [rows, d / 2] {
            bail!(
                "{op}: {what} must be [{rows}, {}], got {:?}",
                d / 2,
                t.dims()
            );
        }
    }
    check_index_vector(
        slot_mapping,
        DType::I64,
        tokens,
        &format!("{op}: slot_mapping"),
    )
}
