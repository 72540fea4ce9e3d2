//! The mixture-of-experts kernels' C entry points (kernels/csrc/moe*.cu, o_router.cu,
//! mxfp4.cu), as [`super`] declares the others.

use std::ffi::{c_int, c_void};

unsafe extern "C" {
    pub fn pagewise_moe_route(
        logits: *const f32,
        ids: *mut u32,
        weights: *mut f32,
        tokens: c_int,
        experts: c_int,
        top_k: c_int,
        renormalize: c_int,
        stream: *mut c_void,
    ) -> c_int;

    pub fn pagewise_moe_router(
        dtype: c_int,
        logits: *mut f32,
        x: *const c_void,
        norm_w: *const c_void,
        eps: f32,
        w: *const f32,
        tokens: c_int,
        experts: c_int,
        k_dim: c_int,
        stream: *mut c_void,
    ) -> c_int;

    pub fn pagewise_moe_affine_gate_up(
        dtype: c_int,
        a: *mut c_void,
        x: *const c_void,
        norm_w: *const c_void,
        eps: f32,
        codes: *const c_void,
        pairs: *const c_void,
        group: c_int,
        bits: c_int,
        bias: *const c_void,
        ids: *const u32,
        tokens: c_int,
        top_k: c_int,
        inner: c_int,
        k_dim: c_int,
        alpha: f32,
        limit: f32,
        stream: *mut c_void,
    ) -> c_int;

    pub fn pagewise_moe_affine_down(
        dtype: c_int,
        y: *mut c_void,
        a: *const c_void,
        codes: *const c_void,
        pairs: *const c_void,
        group: c_int,
        bits: c_int,
        bias: *const c_void,
        residual: *const c_void,
        ids: *const u32,
        weights: *const f32,
        tokens: c_int,
        top_k: c_int,
        out_dim: c_int,
        k_dim: c_int,
        stream: *mut c_void,
    ) -> c_int;

    pub fn pagewise_moe_gate_up(
        dtype: c_int,
        a: *mut c_void,
        x: *const c_void,
        norm_w: *const c_void,
        eps: f32,
        w: *const c_void,
        scales: *const u8,
        bias: *const c_void,
        ids: *const u32,
        tokens: c_int,
        top_k: c_int,
        inner: c_int,
        k_dim: c_int,
        alpha: f32,
        limit: f32,
        stream: *mut c_void,
    ) -> c_int;

    pub fn pagewise_moe_down(
        dtype: c_int,
        y: *mut c_void,
        a: *const c_void,
        w: *const c_void,
        scales: *const u8,
        bias: *const c_void,
        residual: *const c_void,
        ids: *const u32,
        weights: *const f32,
        tokens: c_int,
        top_k: c_int,
        out_dim: c_int,
        k_dim: c_int,
        stream: *mut c_void,
    ) -> c_int;

    pub fn pagewise_moe_slice_columns(
        tokens: c_int,
        top_k: c_int,
        inner: c_int,
        hidden: c_int,
    ) -> c_int;

    pub fn pagewise_moe_slices(
        dtype: c_int,
        cols: c_int,
        y: *mut c_void,
        partial: *mut f32,
        x: *const c_void,
        norm_w: *const c_void,
        eps: f32,
        gu: *const c_void,
        gu_bias: *const c_void,
        down: *const c_void,
        down_bias: *const c_void,
        residual: *const c_void,
        ids: *mut u32,
        weights: *mut f32,
        logits: *const f32,
        norm_scales: c_int,
        experts: c_int,
        renormalize: c_int,
        tokens: c_int,
        top_k: c_int,
        inner: c_int,
        hidden: c_int,
        alpha: f32,
        limit: f32,
        stream: *mut c_void,
    ) -> c_int;

    pub fn pagewise_o_router(
        dtype: c_int,
        y: *mut c_void,
        logits: *mut f32,
        a: *const c_void,
        w: *const c_void,
        residual: *const c_void,
        router: *const f32,
        rows: c_int,
        experts: c_int,
        out_dim: c_int,
        k_dim: c_int,
        stream: *mut c_void,
    ) -> c_int;

    pub fn pagewise_moe_fp4_mma_scratch(
        tokens: c_int,
        top_k: c_int,
        experts: c_int,
        sorted_len: *mut c_int,
        tiles: *mut c_int,
    );

    pub fn pagewise_moe_fp4_mma(
        dtype: c_int,
        y: *mut c_void,
        act: *mut c_void,
        ys: *mut f32,
        sorted: *mut i32,
        tile_expert: *mut i32,
        x: *const c_void,
        gu_codes: *const u8,
        gu_scales: *const u8,
        gu_bias: *const c_void,
        d_codes: *const u8,
        d_scales: *const u8,
        d_bias: *const c_void,
        residual: *const c_void,
        ids: *const u32,
        weights: *const f32,
        tokens: c_int,
        top_k: c_int,
        experts: c_int,
        inner: c_int,
        hidden: c_int,
        alpha: f32,
        limit: f32,
        stream: *mut c_void,
    ) -> c_int;

    pub fn pagewise_moe_max_stage_bytes() -> c_int;

    pub fn pagewise_moe_max_experts() -> c_int;

    pub fn pagewise_mxfp4_dequant(
        dtype: c_int,
        out: *mut c_void,
        codes: *const u8,
        scales: *const u8,
        experts: *const u32,
        count: c_int,
        per_expert: i64,
        stream: *mut c_void,
    ) -> c_int;
}
