//! CUDA kernels for pagewise: paged attention, `reshape_and_cache` and fused ops.
//!
//! This crate is compiled only with the app's `cuda` feature. The kernels themselves arrive with the
//! CUDA backend issue; until then the crate is an empty shell so the workspace layout is final.
