//! pagewise's CPU fast path for GGUF-quantized models: matmuls that read the 4- and 8-bit weights as
//! they are (a quarter to half the bytes of f32), with integer SIMD dot products, on a team of
//! threads that stay awake between the matmuls of a step.
//!
//! - [`blocks`]: the weight and activation block formats, and the scalar reference;
//! - `avx2`: the SIMD dot products (x86-64, detected at run time);
//! - [`kernels`]: the choice between them, over a range of weight rows;
//! - [`q4k`], [`q6k`]: Q4_K and Q6_K interleaved for the 8-row kernel;
//! - [`kquant`]: the other k-quants (Q2_K to Q6_K), through candle's dot products;
//! - [`team`]: the threads;
//! - [`memory`]: the allocator's settings for CPU steps;
//! - [`QLinear`]: a layer's weight, and its matmul.

#[cfg(target_arch = "x86_64")]
mod avx2;
pub mod blocks;
pub mod kernels;
pub mod kquant;
pub mod memory;
pub mod q4k;
pub mod q6k;
mod qlinear;
pub mod team;

pub use qlinear::QLinear;

#[cfg(test)]
mod tests;
