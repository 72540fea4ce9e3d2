//! The kernels' tests, one binary (`cargo test -p pagewise-kernels --test gpu`): each module
//! checks one kernel family against a host reference and needs a CUDA GPU; the `#[ignore]`d ones
//! are the bandwidth and speed tables (scripts/gpu/run.sh runs both). One binary, because every
//! test binary links the whole of candle's and our kernels' code.

mod common;

mod affine;
mod decode_fresh;
mod fp8;
mod fused;
mod int4;
mod kv_fp8;
mod moe;
mod moe_mma;
mod paged_attention;
mod paged_prefill;
mod rope;
mod sampling;
