//! Paged decode attention: query rows attend over their sequence's context through block tables,
//! split-KV with a log-sum-exp merge when the batch is too small to fill the GPU.

use std::ffi::c_void;

use candle_core::{DType, Result, Tensor, bail};

use crate::{
    PagedKv, check_attention, check_index_vector, check_launch, decode_slots, device_ptr,
    dtype_code, ffi, split_plan,
};

/// Where the kernel before the attention kernel on the stream may still be writing the caches.
/// On sm_90 the attention kernel starts before that kernel ends (programmatic dependent launch);
/// it reads K/V early only where that kernel cannot be writing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheWrites {
    /// Anywhere: no K/V is read before it ends (always safe).
    Anywhere,
    /// At most at each row's last context position: a decode step whose rows are its sequences'
    /// new tokens, written by the kernel just before. Earlier positions are copied at once.
    LastPosition,
}

impl CacheWrites {
    fn fresh_tail(self) -> i32 {
        match self {
            CacheWrites::Anywhere => -1,
            CacheWrites::LastPosition => 1,
        }
    }
}

/// Decode attention: `q` (`[seqs, heads, head_dim]`, one token per sequence) attends over the first
/// `context_lens[s]` positions of sequence `s`, read from the caches through `block_tables`
/// (`[seqs, max_blocks]`, i32). `max_context_len` bounds `context_lens` (it picks the split-KV plan
/// without reading the GPU). Returns `[seqs, heads, head_dim]` in `q`'s dtype.
///
/// # Safety
/// The kernel trusts the device-side indices it is given; their values are not checked (that
/// would cost a copy to the host each call). The caller guarantees that every block id a row
/// reads (the first `ceil(context_len / block_size)` entries of its block-table row) is below
/// the caches' `num_blocks`, that every context length is at most `max_blocks * block_size` of
/// the block tables, and that every row-to-sequence index is below the block tables' rows.
pub unsafe fn paged_decode_attention(
    q: &Tensor,
    kv: PagedKv<'_>,
    block_tables: &Tensor,
    context_lens: &Tensor,
    max_context_len: usize,
    scale: f32,
) -> Result<Tensor> {
    unsafe {
        paged_attention(
            q,
            kv,
            block_tables,
            None,
            context_lens,
            max_context_len,
            scale,
        )
    }
}

/// Scratch space of the split-KV path (per-split softmax statistics and partial outputs, f32),
/// reusable across calls and layers so a step allocates it once.
pub struct DecodeWorkspace {
    part_ml: Tensor,
    part_acc: Tensor,
}

impl DecodeWorkspace {
    /// Room for `rows × heads × splits` partials of width `head_dim`.
    pub fn new(
        rows: usize,
        heads: usize,
        splits: usize,
        head_dim: usize,
        device: &candle_core::Device,
    ) -> Result<Self> {
        let n = (rows * heads * splits).max(1);
        // Every split writes its partials (an empty one with a zero sum) before the merge reads.
        Ok(DecodeWorkspace {
            part_ml: crate::empty(n * 2, DType::F32, device)?,
            part_acc: crate::empty(n * head_dim, DType::F32, device)?,
        })
    }
}

/// The split plan for `q` (`[rows, heads, head_dim]`) over `k_cache`'s KV heads on this GPU.
pub fn plan_for(q: &Tensor, k_cache: &Tensor, max_context_len: usize) -> Result<(usize, usize)> {
    let (_, _, kv_heads, _) = k_cache.dims4()?;
    plan_for_rows(q.dtype(), q.dims3()?, kv_heads, max_context_len)
}

/// [`plan_for`] for query rows of `dtype` and shape `(rows, heads, head_dim)` not in a tensor (the
/// query of [`paged_attention_fresh`](crate::paged_attention_fresh) is still in its projection).
pub fn plan_for_rows(
    dtype: DType,
    (rows, heads, head_dim): (usize, usize, usize),
    kv_heads: usize,
    max_context_len: usize,
) -> Result<(usize, usize)> {
    let slots = decode_slots(dtype, head_dim, heads / kv_heads.max(1))?;
    Ok(split_plan(rows, kv_heads, max_context_len, slots))
}

/// Paged attention for a packed batch of query rows (decode tokens and prefill chunks alike): row
/// `r` of `q` (`[rows, heads, head_dim]`) attends over the first `context_lens[r]` positions of the
/// sequence whose block table is row `row_seq[r]` of `block_tables` (`[seqs, max_blocks]`). With
/// `context_lens[r]` = the row's position + 1 a chunk is causal over itself and full over its
/// cached prefix. Without `row_seq`, row `r` uses table `r`. Returns `[rows, heads, head_dim]`.
/// On sm_90 the kernel starts before the previous kernel on the stream ends and reads
/// `block_tables`, `row_seq` and `context_lens` before waiting for it: they must not be that
/// kernel's output (host uploads are fine; `q` and the caches are waited for).
///
/// # Safety
/// The kernel trusts the device-side indices it is given; their values are not checked (that
/// would cost a copy to the host each call). The caller guarantees that every block id a row
/// reads (the first `ceil(context_len / block_size)` entries of its block-table row) is below
/// the caches' `num_blocks`, that every context length is at most `max_blocks * block_size` of
/// the block tables, and that every row-to-sequence index is below the block tables' rows.
#[allow(clippy::too_many_arguments)]
pub unsafe fn paged_attention(
    q: &Tensor,
    kv: PagedKv<'_>,
    block_tables: &Tensor,
    row_seq: Option<&Tensor>,
    context_lens: &Tensor,
    max_context_len: usize,
    scale: f32,
) -> Result<Tensor> {
    unsafe {
        paged_attention_planned(
            q,
            kv,
            block_tables,
            row_seq,
            context_lens,
            plan_for(q, kv.k, max_context_len)?,
            CacheWrites::Anywhere,
            scale,
        )
    }
}

/// [`paged_attention`] with a given `(splits, chunk)` plan (see [`graph_split_plan`](crate::graph_split_plan)) instead of
/// one derived from the longest context (what a CUDA graph captures), for a stream where the
/// kernel before writes the caches only as `writes` says.
///
/// # Safety
/// The kernel trusts the device-side indices it is given; their values are not checked (that
/// would cost a copy to the host each call). The caller guarantees that every block id a row
/// reads (the first `ceil(context_len / block_size)` entries of its block-table row) is below
/// the caches' `num_blocks`, that every context length is at most `max_blocks * block_size` of
/// the block tables, and that every row-to-sequence index is below the block tables' rows.
#[allow(clippy::too_many_arguments)]
pub unsafe fn paged_attention_planned(
    q: &Tensor,
    kv: PagedKv<'_>,
    block_tables: &Tensor,
    row_seq: Option<&Tensor>,
    context_lens: &Tensor,
    plan: (usize, usize),
    writes: CacheWrites,
    scale: f32,
) -> Result<Tensor> {
    // SAFETY: the caller's contract.
    unsafe {
        decode_new(
            q,
            kv,
            block_tables,
            row_seq,
            context_lens,
            plan,
            writes,
            0,
            None,
            scale,
        )
    }
}

/// [`decode_into`] into a new output and workspace (the kernel writes every row: zeros for an
/// empty context).
#[allow(clippy::too_many_arguments)]
unsafe fn decode_new(
    q: &Tensor,
    kv: PagedKv<'_>,
    block_tables: &Tensor,
    row_seq: Option<&Tensor>,
    context_lens: &Tensor,
    plan: (usize, usize),
    writes: CacheWrites,
    window: usize,
    sinks: Option<&Tensor>,
    scale: f32,
) -> Result<Tensor> {
    let out = crate::empty(q.shape(), q.dtype(), q.device())?;
    let (rows, heads, head_dim) = q.dims3()?;
    let ws = DecodeWorkspace::new(rows, heads, plan.0, head_dim, q.device())?;
    // SAFETY: the caller's contract.
    unsafe {
        decode_into(
            &out,
            &ws,
            q,
            kv,
            block_tables,
            row_seq,
            context_lens,
            plan,
            writes,
            window,
            sinks,
            scale,
            None,
        )
    }?;
    Ok(out)
}

/// [`paged_attention_planned`] writing into `out` with caller-owned scratch space (`ws` must hold
/// the plan's splits).
///
/// # Safety
/// The kernel trusts the device-side indices it is given; their values are not checked (that
/// would cost a copy to the host each call). The caller guarantees that every block id a row
/// reads (the first `ceil(context_len / block_size)` entries of its block-table row) is below
/// the caches' `num_blocks`, that every context length is at most `max_blocks * block_size` of
/// the block tables, and that every row-to-sequence index is below the block tables' rows.
#[allow(clippy::too_many_arguments)]
pub unsafe fn paged_attention_planned_into(
    out: &Tensor,
    ws: &DecodeWorkspace,
    q: &Tensor,
    kv: PagedKv<'_>,
    block_tables: &Tensor,
    row_seq: Option<&Tensor>,
    context_lens: &Tensor,
    plan: (usize, usize),
    writes: CacheWrites,
    scale: f32,
) -> Result<()> {
    // SAFETY: the caller's contract.
    unsafe {
        decode_into(
            out,
            ws,
            q,
            kv,
            block_tables,
            row_seq,
            context_lens,
            plan,
            writes,
            0,
            None,
            scale,
            None,
        )
    }
}

/// Decode attention for every row, a prefill row as a decode row at its position: over the last
/// `window` positions of each row's context when `window` is given (sliding-window layers), and
/// with head `h`'s logit `sinks[h]` (f32 `[heads]`) in each softmax as one more score that
/// attends to nothing when `sinks` is given (gpt-oss).
///
/// # Safety
/// As [`paged_attention_planned_into`].
#[allow(clippy::too_many_arguments)]
pub unsafe fn paged_attention_rows(
    q: &Tensor,
    kv: PagedKv<'_>,
    block_tables: &Tensor,
    row_seq: Option<&Tensor>,
    context_lens: &Tensor,
    plan: (usize, usize),
    window: Option<usize>,
    sinks: Option<&Tensor>,
    scale: f32,
) -> Result<Tensor> {
    let heads = q.dim(1)?;
    if let Some(sinks) = sinks
        && (sinks.dtype() != DType::F32
            || sinks.dims() != [heads]
            || !sinks.device().same_device(q.device()))
    {
        bail!(
            "attention sinks must be f32 [{heads}] on the query's device, got {:?} {:?}",
            sinks.dtype(),
            sinks.dims()
        );
    }
    if window == Some(0) {
        bail!("a sliding window of no positions");
    }
    // SAFETY: the caller's contract.
    unsafe {
        decode_new(
            q,
            kv,
            block_tables,
            row_seq,
            context_lens,
            plan,
            CacheWrites::Anywhere,
            window.unwrap_or(0),
            sinks,
            scale,
        )
    }
}

/// The decode kernel over `q`'s rows (or, with `fresh`, rows of `q`'s shape read from the
/// projection) into `out`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn decode_into(
    out: &Tensor,
    ws: &DecodeWorkspace,
    q: &Tensor,
    kv: PagedKv<'_>,
    block_tables: &Tensor,
    row_seq: Option<&Tensor>,
    context_lens: &Tensor,
    (splits, chunk): (usize, usize),
    writes: CacheWrites,
    window: usize,
    sinks: Option<&Tensor>,
    scale: f32,
    fresh: Option<&ffi::FreshQkv>,
) -> Result<()> {
    let (seqs, heads, head_dim) = q.dims3()?;
    if splits == 0 || chunk == 0 || splits > crate::split::MAX_SPLITS {
        bail!(
            "a split plan needs 1 to {} splits and a chunk, got ({splits}, {chunk})",
            crate::split::MAX_SPLITS
        );
    }
    let (block_size, kv_heads) = check_attention(out, q, &kv)?;
    if heads / kv_heads > 8 {
        bail!("{heads} query heads cannot share {kv_heads} KV heads in groups of at most 8");
    }
    let (bt_seqs, max_blocks) = block_tables.dims2()?;
    if block_tables.dtype() != DType::I32 || (row_seq.is_none() && bt_seqs != seqs) {
        bail!(
            "block_tables must be i32 [{seqs}, _], got {:?} {:?}",
            block_tables.dtype(),
            block_tables.dims()
        );
    }
    if let Some(rs) = row_seq {
        check_index_vector(rs, DType::I32, seqs, "row_seq")?;
    }
    check_index_vector(context_lens, DType::I32, seqs, "context_lens")?;
    let dtype = dtype_code(q.dtype(), "paged_attention")?;
    if seqs == 0 {
        return Ok(());
    }
    let needed = seqs * heads * splits;
    if splits > 1
        && (ws.part_ml.elem_count() < needed * 2 || ws.part_acc.elem_count() < needed * head_dim)
    {
        bail!(
            "the decode workspace is too small for {seqs} rows x {heads} heads x {splits} splits"
        );
    }
    let (ml, _) = device_ptr(&ws.part_ml, "workspace")?;
    let (pa, _) = device_ptr(&ws.part_acc, "workspace")?;
    let (o, stream) = device_ptr(out, "out")?;
    // (With `fresh` the kernel reads the query from the projection; `q` only gave its shape.)
    let qp = match fresh {
        Some(_) => 0,
        None => device_ptr(q, "q")?.0,
    };
    let (kc, _) = device_ptr(kv.k, "k_cache")?;
    let (vc, _) = device_ptr(kv.v, "v_cache")?;
    let (bt, _) = device_ptr(block_tables, "block_tables")?;
    let rs = match row_seq {
        Some(rs) => device_ptr(rs, "row_seq")?.0,
        None => 0,
    };
    let (cl, _) = device_ptr(context_lens, "context_lens")?;
    let sk = match sinks {
        Some(s) => device_ptr(s, "sinks")?.0,
        None => 0,
    };
    // SAFETY: as in `reshape_and_cache`; block table entries, row_seq entries and context lengths
    // are the caller's contract (they must address blocks inside the caches).
    let code = unsafe {
        ffi::pagewise_paged_decode(
            dtype,
            o as *mut c_void,
            ml as *mut f32,
            pa as *mut f32,
            qp as *const c_void,
            kc as *const c_void,
            vc as *const c_void,
            kv.scales_ptr(),
            bt as *const i32,
            rs as *const i32,
            cl as *const i32,
            seqs as i32,
            max_blocks as i32,
            heads as i32,
            kv_heads as i32,
            head_dim as i32,
            block_size as i32,
            splits as i32,
            chunk as i32,
            writes.fresh_tail(),
            window.min(i32::MAX as usize) as i32,
            scale,
            sk as *const f32,
            fresh.map_or(std::ptr::null(), |f| f as *const ffi::FreshQkv),
            stream,
        )
    };
    check_launch(code, "paged_attention")
}
