//! The qkv projection of a small decode batch with what follows it folded into its stores: the
//! GEMV of `rms_norm(x)` (as [`crate::gemv_fused`] with [`crate::GemvInput::RmsNorm`]) whose q and
//! k outputs are rotated and whose k and v outputs go straight into the paged caches (as
//! [`crate::rope_qkv_cache`] would, with the same rounding). One kernel instead of two a layer.

use std::ffi::c_void;

use candle_core::{DType, Result, Tensor, bail};

use crate::{GemvWeight, Int4Layout, check_launch, device_ptr, dtype_code, empty, ffi, gemv_fits};

/// Where [`gemv_rope_cache`] puts the projection, and how it rotates it.
pub struct RopeCacheTarget<'a> {
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Rotary cos at each row's position, `[rows, head_dim / 2]`; or, with `positions`, the
    /// whole table `[max_positions, head_dim / 2]`.
    pub cos: &'a Tensor,
    /// See `cos`.
    pub sin: &'a Tensor,
    /// Each row's position (u32 `[rows]`), when `cos` and `sin` are whole tables: the kernel
    /// reads them there (a position past the table reads its last row), so the step needs no
    /// gather of its own.
    pub positions: Option<&'a Tensor>,
    /// Pairs (2i, 2i + 1) instead of rotate-half's (i, i + head_dim / 2).
    pub interleaved: bool,
    /// `[blocks, block_size, kv_heads, head_dim]`.
    pub k_cache: &'a Tensor,
    /// Same shape as `k_cache`.
    pub v_cache: &'a Tensor,
    /// Each row's cache slot (i64 `[rows]`; -1 writes no K/V).
    pub slot_mapping: &'a Tensor,
}

/// `rms_norm(x) * norm_weight` projected by `w` (`[(heads + 2 * kv_heads) * head_dim, k]`: q
/// rows, then k, then v), with q and k rotated, k and v written into the caches at each row's
/// slot, and the rotated q returned (`[rows, heads, head_dim]`). `x` is `[rows, k]`; all f16 or
/// bf16 (`w` also FP8, see [`GemvWeight`]), contiguous, on one GPU, and within [`gemv_fits`].
///
/// # Safety
/// The kernel trusts the device-side indices it is given; their values are not checked (that
/// would cost a copy to the host each call). The caller guarantees that every slot in the slot
/// mapping is -1 or below `num_blocks * block_size` of the caches, that no two tokens of one
/// call share a slot, and that every position is below the rows of the rotary tables.
pub unsafe fn gemv_rope_cache<'w>(
    x: &Tensor,
    w: impl Into<GemvWeight<'w>>,
    norm_weight: &Tensor,
    eps: f32,
    t: &RopeCacheTarget<'_>,
) -> Result<Tensor> {
    let w = w.into();
    let (rows, k) = x.dims2()?;
    let (_, _, kv_heads, d) = t.k_cache.dims4()?;
    let width = (t.heads + 2 * t.kv_heads) * d;
    if kv_heads != t.kv_heads || w.dims()? != (width, k) || d % 2 != 0 {
        bail!(
            "gemv_rope_cache: w {:?} is not {} + 2 x {} heads of the caches' {:?} over k = {k}",
            w.dims()?,
            t.heads,
            t.kv_heads,
            t.k_cache.dims()
        );
    }
    crate::rope::check_rope_inputs(
        "gemv_rope_cache",
        rows,
        (t.cos, t.sin, t.positions),
        (t.k_cache, t.v_cache),
        t.slot_mapping,
    )?;
    if norm_weight.dims() != [k] {
        bail!(
            "gemv_rope_cache: the norm weight must be [{k}], got {:?}",
            norm_weight.dims()
        );
    }
    if !matches!(x.dtype(), DType::BF16 | DType::F16) {
        bail!(
            "gemv_rope_cache: x must be f16 or bf16, got {:?}",
            x.dtype()
        );
    }
    if !w.takes(x.dtype()) {
        bail!("gemv_rope_cache: w {w:?} is neither x's dtype nor FP8 the GEMV takes");
    }
    if matches!(w, GemvWeight::Int4(m) if m.layout == Int4Layout::Tiles) {
        bail!("gemv_rope_cache: reads 4-bit weights row by row (Int4Layout::Rows), not in tiles");
    }
    for (a, what) in [
        (norm_weight, "norm weight"),
        (t.cos, "cos"),
        (t.sin, "sin"),
        (t.k_cache, "k_cache"),
        (t.v_cache, "v_cache"),
    ] {
        if a.dtype() != x.dtype() {
            bail!(
                "gemv_rope_cache: {what} is {:?} but x is {:?}",
                a.dtype(),
                x.dtype()
            );
        }
    }
    if !gemv_fits(rows, k, x.dtype()) {
        bail!("gemv_rope_cache: {rows} rows of {k} do not fit the GEMV's staging space");
    }
    let dtype = dtype_code(x.dtype(), "gemv_rope_cache")?;
    let q = empty((rows, t.heads, d), x.dtype(), x.device())?;
    let (qp, stream) = device_ptr(&q, "q")?;
    let (kc, _) = device_ptr(t.k_cache, "k_cache")?;
    let (vc, _) = device_ptr(t.v_cache, "v_cache")?;
    let (c, _) = device_ptr(t.cos, "cos")?;
    let (s, _) = device_ptr(t.sin, "sin")?;
    let positions = match t.positions {
        Some(p) => device_ptr(p, "positions")?.0 as *const u32,
        None => std::ptr::null(),
    };
    let table_rows = i32::try_from(t.cos.dim(0)?).unwrap_or(i32::MAX);
    let (slots, _) = device_ptr(t.slot_mapping, "slot_mapping")?;
    let (xp, _) = device_ptr(x, "x")?;
    let (np, _) = device_ptr(norm_weight, "norm weight")?;
    let wt = w.pointers(x.dtype(), rows, "gemv_rope_cache")?;
    let wp = wt.w;
    if xp % 16 != 0 || wp % 16 != 0 || np % 16 != 0 {
        bail!("gemv_rope_cache: x, w and the norm weight must start on 16-byte boundaries");
    }
    // SAFETY: shapes and dtypes checked above; the kernel reads rows x k of x, k of the norm
    // weight, width x k of w, rows x d/2 of cos and sin (or table rows at the positions, clamped
    // to the table by the kernel), rows slots, and writes rows x heads x d
    // of q and the caches' rows at the slots, which address rows inside the caches by the
    // caller's contract (the block manager's slot mapping), as for `rope_qkv_cache`.
    let code = unsafe {
        ffi::pagewise_gemv_rope(
            dtype,
            qp as *mut c_void,
            kc as *mut c_void,
            vc as *mut c_void,
            c as *const c_void,
            s as *const c_void,
            positions,
            table_rows,
            slots as *const i64,
            xp as *const c_void,
            np as *const c_void,
            wp as *const c_void,
            wt.kind,
            wt.scales,
            wt.block_rows,
            wt.block_cols,
            rows as i32,
            t.heads as i32,
            kv_heads as i32,
            d as i32,
            i32::from(t.interleaved),
            k as i32,
            eps,
            stream,
        )
    };
    check_launch(code, "gemv_rope_cache")?;
    Ok(q)
}
