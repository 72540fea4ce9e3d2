//! pagewise's CPU fast path for GGUF-quantized models: matmuls that read the 4- and 8-bit weights as
//! they are (a quarter to half the bytes of f32), with integer SIMD dot products, on a team of
//! threads that stay awake between the matmuls of a step.
//!
//! - [`blocks`]: Q4_0 / Q4_1 blocks and the activation blocks, with their scalar reference;
//! - [`fives`], [`q8`], [`q4k`], [`q5k`], [`q6k`]: Q5_0 / Q5_1, Q8_0, Q4_K, Q5_K and Q6_K
//!   interleaved 8 rows by 8 for the 8-row kernels, each with its scalar reference; Q4_K and
//!   Q5_K multiply activations quantized 256 at a time ([`act_k`], `avx2_k`; Q4_K to Q6_K and
//!   IQ4_XS two groups at once in 512-bit lanes for prefill where the CPU has AVX-512,
//!   `avx512_pair`);
//! - `avx2`: the SIMD dot products (x86-64, detected at run time), with `vnni`'s `vpdpbusd`
//!   where the CPU has one;
//! - [`kernels`]: the choice between them, over a range of weight groups;
//! - [`iq4`]: IQ4_NL and IQ4_XS (a 4-bit code picks one of 16 values), interleaved likewise;
//! - [`q23k`]: Q2_K and Q3_K (16-weight sub-blocks), interleaved likewise (`avx2_low`);
//! - [`halves`]: F16 and BF16 weights, interleaved likewise, F16 multiplied by f32 activations
//!   (its own AVX2 kernel), BF16 by activations rounded to BF16 ([`bf16`]: `vdpbf16ps` where
//!   the CPU has AVX512-BF16);
//! - [`activations`] (and `avx2_math`): the gated MLPs' SiLU and GELU-tanh, vectorized;
//! - [`attend`]: the two products of paged attention (scores and the weighted sum of V rows),
//!   vectorized;
//! - [`exp`]: the sampler's unnormalized probabilities over a vocabulary, vectorized;
//! - [`team`]: the threads;
//! - [`memory`]: the allocator's settings for CPU steps;
//! - [`QLinear`]: a layer's weight, and its matmul.

pub mod act_k;
pub mod activations;
pub mod attend;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx2_k;
#[cfg(target_arch = "x86_64")]
mod avx2_low;
#[cfg(target_arch = "x86_64")]
mod avx2_math;
#[cfg(target_arch = "x86_64")]
mod avx2_quantize;
#[cfg(target_arch = "x86_64")]
mod avx2_signed;
#[cfg(target_arch = "x86_64")]
mod avx512_pair;
pub mod bf16;
pub mod blocks;
pub mod exp;
pub mod fives;
pub mod halves;
pub mod iq4;
pub mod kernels;
pub mod memory;
pub mod q23k;
pub mod q4k;
pub mod q5k;
pub mod q6k;
pub mod q8;
mod qlinear;
pub mod team;
#[cfg(target_arch = "x86_64")]
mod vnni;

pub use qlinear::QLinear;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_halves;
#[cfg(test)]
mod tests_iq4;
#[cfg(test)]
mod tests_pairs;
#[cfg(test)]
mod tests_quantize;
