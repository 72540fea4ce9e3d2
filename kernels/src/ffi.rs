//! The kernels' C entry points (kernels/csrc/*.cu). dtype: 0 = f32, 1 = f16, 2 = bf16. Each returns 0
//! on success or a CUDA error code (1 also for an unsupported dtype or head dim).

use std::ffi::{c_int, c_void};

use crate::KvScales;

mod experts;
pub use experts::*;

/// A step's new tokens as the fused projection left them, with the caches and where to rotate
/// them from: what the decode kernel takes to normalize, rotate and write them itself (`FreshQkv`
/// in decode_common.cuh), and the arguments `pagewise_rope_qkv_cache` takes one by one.
#[repr(C)]
pub struct FreshQkv {
    pub qkv: *const c_void,
    pub k_cache: *mut c_void,
    pub v_cache: *mut c_void,
    pub cos: *const c_void,
    pub sin: *const c_void,
    pub positions: *const u32,
    pub table_rows: c_int,
    pub slots: *const i64,
    pub q_norm: *const c_void,
    pub k_norm: *const c_void,
    pub eps: f32,
    pub interleaved: c_int,
}

unsafe extern "C" {
    pub fn pagewise_reshape_and_cache(
        dtype: c_int,
        key: *const c_void,
        value: *const c_void,
        k_cache: *mut c_void,
        v_cache: *mut c_void,
        kv_fp8: *const KvScales,
        slots: *const i64,
        num_tokens: c_int,
        width: c_int,
        stream: *mut c_void,
    ) -> c_int;

    pub fn pagewise_decode_occupancy(
        dtype: c_int,
        head_dim: c_int,
        group: c_int,
        blocks_per_sm: *mut c_int,
        sms: *mut c_int,
    ) -> c_int;

    pub fn pagewise_paged_decode(
        dtype: c_int,
        out: *mut c_void,
        part_ml: *mut f32,
        part_acc: *mut f32,
        q: *const c_void,
        k_cache: *const c_void,
        v_cache: *const c_void,
        kv_fp8: *const KvScales,
        block_tables: *const i32,
        row_seq: *const i32,
        context_lens: *const i32,
        num_seqs: c_int,
        max_blocks: c_int,
        num_heads: c_int,
        num_kv_heads: c_int,
        head_dim: c_int,
        block_size: c_int,
        num_splits: c_int,
        chunk: c_int,
        fresh_tail: c_int,
        window: c_int,
        scale: f32,
        sinks: *const f32,
        fresh: *const FreshQkv,
        stream: *mut c_void,
    ) -> c_int;

    pub fn pagewise_sample_chunks(vocab: c_int) -> c_int;

    pub fn pagewise_unpack_staged(
        staging: *const u32,
        fields: *const crate::staging::RawField,
        n: c_int,
        stream: *mut c_void,
    ) -> c_int;

    pub fn pagewise_sample(
        dtype: c_int,
        out: *mut u32,
        host_out: *mut u32,
        parts: *mut c_void,
        tickets: *mut u32,
        logits: *const c_void,
        logits_copy: *mut c_void,
        rows: c_int,
        vocab: c_int,
        temperatures: *const f32,
        min_ps: *const f32,
        seeds: *const u64,
        masks: *const u32,
        mask_words: c_int,
        stream: *mut c_void,
    ) -> c_int;

    pub fn pagewise_paged_prefill(
        dtype: c_int,
        out: *mut c_void,
        q: *const c_void,
        k_cache: *const c_void,
        v_cache: *const c_void,
        kv_fp8: *const KvScales,
        block_tables: *const i32,
        seq_table: *const i32,
        q_start: *const i32,
        q_len: *const i32,
        ctx_len: *const i32,
        num_seqs: c_int,
        max_q_len: c_int,
        max_blocks: c_int,
        num_heads: c_int,
        num_kv_heads: c_int,
        head_dim: c_int,
        block_size: c_int,
        scale: f32,
        stream: *mut c_void,
    ) -> c_int;

    pub fn pagewise_add_rms_norm(
        dtype: c_int,
        sum_out: *mut c_void,
        normed: *mut c_void,
        x: *const c_void,
        delta: *const c_void,
        weight: *const c_void,
        rows: c_int,
        hidden: c_int,
        eps: f32,
        stream: *mut c_void,
    ) -> c_int;

    pub fn pagewise_add_rms_normed(
        dtype: c_int,
        out: *mut c_void,
        x: *const c_void,
        delta: *const c_void,
        weight: *const c_void,
        rows: c_int,
        hidden: c_int,
        eps: f32,
        stream: *mut c_void,
    ) -> c_int;

    pub fn pagewise_ar_alloc(data_bytes: usize, ptr: *mut *mut c_void, handle: *mut u8) -> c_int;

    pub fn pagewise_ar_open(handle: *const u8, ptr: *mut *mut c_void) -> c_int;

    pub fn pagewise_ar_oneshot(
        dtype: c_int,
        regions: *const u64,
        rank: c_int,
        size: c_int,
        data_bytes: usize,
        input: *const c_void,
        out: *mut c_void,
        n: i64,
        stream: *mut c_void,
    ) -> c_int;

    pub fn pagewise_silu_mul(
        dtype: c_int,
        out: *mut c_void,
        gate_up: *const c_void,
        rows: i64,
        inter: c_int,
        stream: *mut c_void,
    ) -> c_int;

    pub fn pagewise_gemv(
        dtype: c_int,
        input: c_int,
        y: *mut c_void,
        x: *const c_void,
        norm_w: *const c_void,
        w: *const c_void,
        w_kind: c_int,
        scales: *const c_void,
        block_rows: c_int,
        block_cols: c_int,
        residual: *const c_void,
        rows: c_int,
        out_dim: c_int,
        k_dim: c_int,
        eps: f32,
        stream: *mut c_void,
    ) -> c_int;

    pub fn pagewise_gemv_add_normed(
        dtype: c_int,
        y: *mut c_void,
        stream_out: *mut c_void,
        delta: *const c_void,
        stream_in: *const c_void,
        delta_w: *const c_void,
        norm_w: *const c_void,
        w: *const c_void,
        w_kind: c_int,
        scales: *const c_void,
        block_rows: c_int,
        block_cols: c_int,
        rows: c_int,
        out_dim: c_int,
        k_dim: c_int,
        eps: f32,
        stream: *mut c_void,
    ) -> c_int;

    pub fn pagewise_gemv_max_stage_bytes() -> c_int;

    pub fn pagewise_fp8_dequantize(
        dtype: c_int,
        out: *mut c_void,
        w: *const c_void,
        scales: *const f32,
        out_dim: i64,
        k_dim: c_int,
        block_rows: c_int,
        block_cols: c_int,
        stream: *mut c_void,
    ) -> c_int;

    pub fn pagewise_int4_dequantize(
        dtype: c_int,
        out: *mut c_void,
        w: *const c_void,
        sz: *const c_void,
        out_dim: i64,
        k_dim: c_int,
        group: c_int,
        tiles: c_int,
        stream: *mut c_void,
    ) -> c_int;

    pub fn pagewise_affine_dequantize(
        dtype: c_int,
        out: *mut c_void,
        w: *const c_void,
        sb: *const c_void,
        out_dim: i64,
        k_dim: c_int,
        group: c_int,
        bits: c_int,
        stream: *mut c_void,
    ) -> c_int;

    pub fn pagewise_fp8_quantize_rows(
        dtype: c_int,
        q: *mut c_void,
        scales: *mut f32,
        w: *const c_void,
        out_dim: i64,
        k_dim: c_int,
        stream: *mut c_void,
    ) -> c_int;

    pub fn pagewise_gemv_rope(
        dtype: c_int,
        q_out: *mut c_void,
        k_cache: *mut c_void,
        v_cache: *mut c_void,
        cos: *const c_void,
        sin: *const c_void,
        positions: *const u32,
        table_rows: c_int,
        slots: *const i64,
        x: *const c_void,
        norm_w: *const c_void,
        w: *const c_void,
        w_kind: c_int,
        scales: *const c_void,
        block_rows: c_int,
        block_cols: c_int,
        rows: c_int,
        heads: c_int,
        kv_heads: c_int,
        head_dim: c_int,
        interleaved: c_int,
        k_dim: c_int,
        eps: f32,
        stream: *mut c_void,
    ) -> c_int;

    pub fn pagewise_rope_qkv_cache(
        dtype: c_int,
        q_out: *mut c_void,
        k_cache: *mut c_void,
        v_cache: *mut c_void,
        kv_fp8: *const KvScales,
        qkv: *const c_void,
        cos: *const c_void,
        sin: *const c_void,
        positions: *const u32,
        table_rows: c_int,
        slots: *const i64,
        q_norm: *const c_void,
        k_norm: *const c_void,
        eps: f32,
        tokens: c_int,
        heads: c_int,
        kv_heads: c_int,
        head_dim: c_int,
        interleaved: c_int,
        stream: *mut c_void,
    ) -> c_int;
}
