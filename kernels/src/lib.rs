//! CUDA kernels for pagewise, as safe candle operations: `reshape_and_cache` (write a step's K/V
//! into the paged cache at the slot mapping), paged attention (query rows read K/V through block
//! tables, GQA, split-KV) and sampling (argmax or a seeded Gumbel-max draw per row). Every dtype, shape, contiguity and device is
//! checked before a launch, with a message naming the argument at fault.
//!
//! Compiled only with the app's `cuda` feature; kernels/build.rs builds kernels/csrc with nvcc.

mod ffi;

use std::ffi::c_void;

use candle_core::cuda_backend::cudarc::driver::DevicePtr;
use candle_core::{DType, Result, Storage, Tensor, bail};

fn dtype_code(dtype: DType, what: &str) -> Result<i32> {
    Ok(match dtype {
        DType::F32 => 0,
        DType::F16 => 1,
        DType::BF16 => 2,
        other => bail!("{what}: dtype {other:?} is not supported (f32, f16, bf16)"),
    })
}

/// Device address of a contiguous CUDA tensor's first element, and the stream of its device.
fn device_ptr(t: &Tensor, what: &str) -> Result<(u64, *mut c_void)> {
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
        other => bail!("{what}: dtype {other:?} has no kernel"),
    };
    let offset = (layout.start_offset() * t.dtype().size_in_bytes()) as u64;
    Ok((base + offset, stream.cu_stream() as *mut c_void))
}

fn check_launch(code: i32, what: &str) -> Result<()> {
    if code != 0 {
        bail!("{what}: CUDA launch failed with error {code}");
    }
    Ok(())
}

/// Writes `key`, `value` (`[tokens, kv_heads, head_dim]`) into `k_cache`, `v_cache`
/// (`[num_blocks, block_size, kv_heads, head_dim]`) at `slot_mapping` (`[tokens]`, i64; a negative
/// slot skips its token). The caches are modified in place.
pub fn reshape_and_cache(
    key: &Tensor,
    value: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    slot_mapping: &Tensor,
) -> Result<()> {
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
    for (t, what) in [(value, "value"), (k_cache, "k_cache"), (v_cache, "v_cache")] {
        if t.dtype() != key.dtype() {
            bail!("{what} is {:?} but key is {:?}", t.dtype(), key.dtype());
        }
    }
    if slot_mapping.dtype() != DType::I64 || slot_mapping.dims() != [tokens] {
        bail!(
            "slot_mapping must be i64 [{tokens}], got {:?} {:?}",
            slot_mapping.dtype(),
            slot_mapping.dims()
        );
    }
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
            slots as *const i64,
            tokens as i32,
            (kv_heads * head_dim) as i32,
            stream,
        )
    };
    check_launch(code, "reshape_and_cache")
}

/// Below this many (sequence, KV head) blocks the GPU (132 SMs on an H200) is underfed, and the
/// context is split.
const SPLIT_BELOW: usize = 264;
/// Blocks a split plan aims for: every SM four times over, so a small batch keeps enough loads in
/// flight. `PAGEWISE_DECODE_TARGET_BLOCKS` overrides it (tuning).
const TARGET_BLOCKS: usize = 528;
/// Fewest context positions worth a split of their own.
const MIN_CHUNK: usize = 128;

fn target_blocks() -> usize {
    static TARGET: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *TARGET.get_or_init(|| {
        std::env::var("PAGEWISE_DECODE_TARGET_BLOCKS")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|&n| n > 0)
            .unwrap_or(TARGET_BLOCKS)
    })
}

/// How many splits of the context each (sequence, KV head) gets, and the positions per split:
/// enough blocks to fill the GPU when the batch is small, one split when it is large (measured on
/// the H200: a second split costs more than it brings once there are 2 blocks per SM).
pub fn split_plan(seqs: usize, kv_heads: usize, max_context_len: usize) -> (usize, usize) {
    let pairs = (seqs * kv_heads).max(1);
    if pairs >= SPLIT_BELOW {
        return (1, max_context_len.max(1));
    }
    let by_occupancy = target_blocks().div_ceil(pairs);
    let by_length = max_context_len.div_ceil(MIN_CHUNK).max(1);
    let splits = by_occupancy.min(by_length).max(1);
    (splits, max_context_len.div_ceil(splits).max(1))
}

/// Decode attention: `q` (`[seqs, heads, head_dim]`, one token per sequence) attends over the first
/// `context_lens[s]` positions of sequence `s`, read from the caches through `block_tables`
/// (`[seqs, max_blocks]`, i32). `max_context_len` bounds `context_lens` (it picks the split-KV plan
/// without reading the GPU). Returns `[seqs, heads, head_dim]` in `q`'s dtype.
pub fn paged_decode_attention(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    block_tables: &Tensor,
    context_lens: &Tensor,
    max_context_len: usize,
    scale: f32,
) -> Result<Tensor> {
    paged_attention(
        q,
        k_cache,
        v_cache,
        block_tables,
        None,
        context_lens,
        max_context_len,
        scale,
    )
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
        Ok(DecodeWorkspace {
            part_ml: Tensor::zeros(n * 2, DType::F32, device)?,
            part_acc: Tensor::zeros(n * head_dim, DType::F32, device)?,
        })
    }

    /// A workspace large enough for `q` (`[rows, heads, head_dim]`) at `max_context_len` over
    /// `kv_heads` KV heads.
    pub fn for_query(q: &Tensor, kv_heads: usize, max_context_len: usize) -> Result<Self> {
        let (rows, heads, head_dim) = q.dims3()?;
        let (splits, _) = split_plan(rows, kv_heads, max_context_len);
        Self::new(rows, heads, splits, head_dim, q.device())
    }
}

/// Paged attention for a packed batch of query rows (decode tokens and prefill chunks alike): row
/// `r` of `q` (`[rows, heads, head_dim]`) attends over the first `context_lens[r]` positions of the
/// sequence whose block table is row `row_seq[r]` of `block_tables` (`[seqs, max_blocks]`). With
/// `context_lens[r]` = the row's position + 1 a chunk is causal over itself and full over its
/// cached prefix. Without `row_seq`, row `r` uses table `r`. Returns `[rows, heads, head_dim]`.
#[allow(clippy::too_many_arguments)]
pub fn paged_attention(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    block_tables: &Tensor,
    row_seq: Option<&Tensor>,
    context_lens: &Tensor,
    max_context_len: usize,
    scale: f32,
) -> Result<Tensor> {
    let out = Tensor::zeros(q.shape(), q.dtype(), q.device())?;
    let (_, _, kv_heads, _) = k_cache.dims4()?;
    let ws = DecodeWorkspace::for_query(q, kv_heads, max_context_len)?;
    paged_attention_into(
        &out,
        &ws,
        q,
        k_cache,
        v_cache,
        block_tables,
        row_seq,
        context_lens,
        max_context_len,
        scale,
    )?;
    Ok(out)
}

/// [`paged_attention`] writing into `out` (`q`'s shape and dtype) with caller-owned scratch space.
#[allow(clippy::too_many_arguments)]
pub fn paged_attention_into(
    out: &Tensor,
    ws: &DecodeWorkspace,
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    block_tables: &Tensor,
    row_seq: Option<&Tensor>,
    context_lens: &Tensor,
    max_context_len: usize,
    scale: f32,
) -> Result<()> {
    let (seqs, heads, head_dim) = q.dims3()?;
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
    if kv_heads == 0 || heads % kv_heads != 0 || heads / kv_heads > 8 {
        bail!("{heads} query heads cannot share {kv_heads} KV heads evenly in groups of at most 8");
    }
    if ![64, 128, 256].contains(&head_dim) {
        bail!("head_dim {head_dim} is not supported (64, 128, 256)");
    }
    for (t, what) in [(k_cache, "k_cache"), (v_cache, "v_cache")] {
        if t.dtype() != q.dtype() {
            bail!("{what} is {:?} but q is {:?}", t.dtype(), q.dtype());
        }
    }
    let (bt_seqs, max_blocks) = block_tables.dims2()?;
    if block_tables.dtype() != DType::I32 || (row_seq.is_none() && bt_seqs != seqs) {
        bail!(
            "block_tables must be i32 [{seqs}, _], got {:?} {:?}",
            block_tables.dtype(),
            block_tables.dims()
        );
    }
    if let Some(rs) = row_seq
        && (rs.dtype() != DType::I32 || rs.dims() != [seqs])
    {
        bail!(
            "row_seq must be i32 [{seqs}], got {:?} {:?}",
            rs.dtype(),
            rs.dims()
        );
    }
    if context_lens.dtype() != DType::I32 || context_lens.dims() != [seqs] {
        bail!(
            "context_lens must be i32 [{seqs}], got {:?} {:?}",
            context_lens.dtype(),
            context_lens.dims()
        );
    }
    let dtype = dtype_code(q.dtype(), "paged_attention")?;
    if seqs == 0 {
        return Ok(());
    }
    let (splits, chunk) = split_plan(seqs, kv_heads, max_context_len);
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
    let (qp, _) = device_ptr(q, "q")?;
    let (kc, _) = device_ptr(k_cache, "k_cache")?;
    let (vc, _) = device_ptr(v_cache, "v_cache")?;
    let (bt, _) = device_ptr(block_tables, "block_tables")?;
    let rs = match row_seq {
        Some(rs) => device_ptr(rs, "row_seq")?.0,
        None => 0,
    };
    let (cl, _) = device_ptr(context_lens, "context_lens")?;
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
            scale,
            stream,
        )
    };
    check_launch(code, "paged_attention")
}

/// Picks one token per row of `logits` (`[rows, vocab]`, f32) on the GPU; returns `[rows]` u32.
/// Row `r` takes the argmax when `temperatures[r]` <= 0, else draws from
/// softmax(logits / temperature) over the tokens whose probability is at least `min_ps[r]` times
/// the most likely one's, with randomness from `seeds[r]` alone (i64 holding the seed's bits).
pub fn sample(
    logits: &Tensor,
    temperatures: &Tensor,
    min_ps: &Tensor,
    seeds: &Tensor,
) -> Result<Tensor> {
    let (rows, vocab) = logits.dims2()?;
    if logits.dtype() != DType::F32 {
        bail!("logits must be f32, got {:?}", logits.dtype());
    }
    for (t, what, dtype) in [
        (temperatures, "temperatures", DType::F32),
        (min_ps, "min_ps", DType::F32),
        (seeds, "seeds", DType::I64),
    ] {
        if t.dtype() != dtype || t.dims() != [rows] {
            bail!(
                "{what} must be {dtype:?} [{rows}], got {:?} {:?}",
                t.dtype(),
                t.dims()
            );
        }
    }
    let out = Tensor::zeros(rows, DType::U32, logits.device())?;
    if rows == 0 {
        return Ok(out);
    }
    let (o, stream) = device_ptr(&out, "out")?;
    let (l, _) = device_ptr(logits, "logits")?;
    let (t, _) = device_ptr(temperatures, "temperatures")?;
    let (m, _) = device_ptr(min_ps, "min_ps")?;
    let (s, _) = device_ptr(seeds, "seeds")?;
    // SAFETY: dtypes, shapes and contiguity are checked above; all tensors live on the stream's
    // device and outlive the launch.
    let code = unsafe {
        ffi::pagewise_sample(
            o as *mut u32,
            l as *const f32,
            rows as i32,
            vocab as i32,
            t as *const f32,
            m as *const f32,
            s as *const u64,
            stream,
        )
    };
    check_launch(code, "sample")?;
    Ok(out)
}

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
/// [`reshape_and_cache`]) through `block_tables`. Writes those rows of `out` (`q`'s shape,
/// `[tokens, heads, head_dim]`) in place and leaves the other rows alone.
pub fn paged_prefill_attention(
    out: &Tensor,
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    block_tables: &Tensor,
    seqs: &PrefillSeqs<'_>,
    scale: f32,
) -> Result<()> {
    let (_, heads, head_dim) = q.dims3()?;
    let (_, block_size, kv_heads, cd) = k_cache.dims4()?;
    if out.dims() != q.dims() || out.dtype() != q.dtype() {
        bail!("out {:?} must match q {:?}", out.dims(), q.dims());
    }
    if cd != head_dim || v_cache.dims() != k_cache.dims() {
        bail!(
            "caches {:?} do not match q's head_dim {head_dim}",
            k_cache.dims()
        );
    }
    if kv_heads == 0 || heads % kv_heads != 0 {
        bail!("{heads} query heads cannot share {kv_heads} KV heads evenly");
    }
    if ![64, 128, 256].contains(&head_dim) {
        bail!("head_dim {head_dim} is not supported (64, 128, 256)");
    }
    let dtype = match q.dtype() {
        DType::F16 => 1,
        DType::BF16 => 2,
        other => bail!("prefill attention runs on tensor cores: f16 or bf16, not {other:?}"),
    };
    for (t, what) in [(k_cache, "k_cache"), (v_cache, "v_cache")] {
        if t.dtype() != q.dtype() {
            bail!("{what} is {:?} but q is {:?}", t.dtype(), q.dtype());
        }
    }
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
    let (kc, _) = device_ptr(k_cache, "k_cache")?;
    let (vc, _) = device_ptr(v_cache, "v_cache")?;
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
