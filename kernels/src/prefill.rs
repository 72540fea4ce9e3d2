//! Varlen prefill attention over the paged cache on tensor cores.

use std::ffi::c_void;

use candle_core::{DType, Result, Tensor, bail};

use crate::{PagedKv, check_attention, check_launch, device_ptr, ffi};

/// The varlen prefill batch of [`paged_prefill_attention`]: per prefill sequence (all i32
/// `[num_seqs]`), where its query rows start in `q`, how many there are, how many of its tokens the
/// cache holds including them, and its row of the block tables.
pub struct PrefillSeqs<'a> {
    /// First query row of each sequence.
    pub q_start: &'a Tensor,
    /// Query rows of each sequence.
    pub q_len: &'a Tensor,
    /// Tokens in the cache after this step, per sequence.
    pub ctx_len: &'a Tensor,
    /// Each sequence's row in the block tables.
    pub table_row: &'a Tensor,
    /// The largest `q_len` (sizes the grid without reading the GPU).
    pub max_q_len: usize,
}

/// Prefill attention on tensor cores (f16/bf16): each sequence's query rows attend causally within
/// the chunk and fully over its cached prefix, reading K/V (already written by
/// [`reshape_and_cache`](crate::reshape_and_cache)) through `block_tables`. Writes those rows of `out` (`q`'s shape,
/// `[tokens, heads, head_dim]`) in place and leaves the other rows alone. FlashAttention-2 style
/// (kernels/csrc/prefill_mma.cuh), head dims 64, 128 and 256. The caches may be FP8 ([`PagedKv`]).
///
/// # Safety
/// The kernel trusts the device-side indices it is given; their values are not checked (that
/// would cost a copy to the host each call). The caller guarantees that every block id a row
/// reads (the first `ceil(context_len / block_size)` entries of its block-table row) is below
/// the caches' `num_blocks`, that every context length is at most `max_blocks * block_size` of
/// the block tables, and that every row-to-sequence index is below the block tables' rows.
pub unsafe fn paged_prefill_attention(
    out: &Tensor,
    q: &Tensor,
    kv: PagedKv<'_>,
    block_tables: &Tensor,
    seqs: &PrefillSeqs<'_>,
    scale: f32,
) -> Result<()> {
    let (_, heads, head_dim) = q.dims3()?;
    let (block_size, kv_heads) = check_attention(out, q, &kv)?;
    let dtype = match q.dtype() {
        DType::F16 => 1,
        DType::BF16 => 2,
        other => bail!("prefill attention runs on tensor cores: f16 or bf16, not {other:?}"),
    };
    let (_, max_blocks) = block_tables.dims2()?;
    let num_seqs = seqs.q_start.dims1()?;
    for (t, what) in [
        (block_tables, "block_tables"),
        (seqs.q_start, "q_start"),
        (seqs.q_len, "q_len"),
        (seqs.ctx_len, "ctx_len"),
        (seqs.table_row, "table_row"),
    ] {
        if t.dtype() != DType::I32 {
            bail!("{what} must be i32, got {:?}", t.dtype());
        }
        if what != "block_tables" && t.dims() != [num_seqs] {
            bail!("{what} must be [{num_seqs}], got {:?}", t.dims());
        }
    }
    if num_seqs == 0 {
        return Ok(());
    }
    let (o, stream) = device_ptr(out, "out")?;
    let (qp, _) = device_ptr(q, "q")?;
    let (kc, _) = device_ptr(kv.k, "k_cache")?;
    let (vc, _) = device_ptr(kv.v, "v_cache")?;
    let (bt, _) = device_ptr(block_tables, "block_tables")?;
    let (tr, _) = device_ptr(seqs.table_row, "table_row")?;
    let (qs, _) = device_ptr(seqs.q_start, "q_start")?;
    let (ql, _) = device_ptr(seqs.q_len, "q_len")?;
    let (cl, _) = device_ptr(seqs.ctx_len, "ctx_len")?;
    // SAFETY: dtypes, shapes and contiguity are checked above; the per-sequence metadata must
    // address rows of `q`/`out` and blocks inside the caches (the caller's contract).
    let code = unsafe {
        ffi::pagewise_paged_prefill(
            dtype,
            o as *mut c_void,
            qp as *const c_void,
            kc as *const c_void,
            vc as *const c_void,
            kv.scales_ptr(),
            bt as *const i32,
            tr as *const i32,
            qs as *const i32,
            ql as *const i32,
            cl as *const i32,
            num_seqs as i32,
            seqs.max_q_len as i32,
            max_blocks as i32,
            heads as i32,
            kv_heads as i32,
            head_dim as i32,
            block_size as i32,
            scale,
            stream,
        )
    };
    check_launch(code, "paged_prefill_attention")
}
