//! Activations for the k-quants: 256 at a time quantized to 8 bits with one scale (GGML's Q8_K,
//! which llama.cpp multiplies its k-quants by). A k-quant super-block's sub-block scales are
//! small integers under one float scale, so with one activation scale a super-block the whole
//! super-block's dot product is one integer sum, `Σ_j sc_j Σ q a`, scaled once: the kernels keep
//! the sub-blocks' sums in 32-bit lanes and convert once per 256 weights, where activations
//! scaled per 32 ([`Act`](super::blocks::Act)) take a float multiply-add per sub-block.

/// Weights (and activations) per super-block.
pub const SUPER: usize = 256;

/// 256 activations quantized to 8 bits with one scale, and their sums per 32 (the k-quants'
/// offsets: `Σ_j m_j Σ a`) and per 16 (Q6_K's centring).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ActK {
    /// Scale: `x ≈ d · q`.
    pub d: f32,
    /// The sums of `qs[32 j..32 j + 32]`.
    pub sums32: [i16; 8],
    /// The sums of `qs[16 h..16 h + 16]`.
    pub sums16: [i16; 16],
    /// Signed values, in order.
    pub qs: [i8; SUPER],
}

impl ActK {
    /// Sub-block `j`'s 32 values.
    pub fn sub(&self, j: usize) -> &[i8; 32] {
        self.qs[32 * j..32 * j + 32].try_into().expect("32 bytes")
    }

    /// The super-block of `qs` (values already quantized) with its sums.
    pub(crate) fn new(d: f32, qs: [i8; SUPER]) -> ActK {
        let sum = |n: usize, i: usize| qs[n * i..n * i + n].iter().map(|&q| q as i16).sum();
        ActK {
            d,
            sums32: std::array::from_fn(|j| sum(32, j)),
            sums16: std::array::from_fn(|h| sum(16, h)),
            qs,
        }
    }
}

/// Quantizes `x` (a multiple of 256 long) to super-blocks, appending them to `out`: with AVX2
/// where `isa` has it, bit for bit [`quantize_row_k_scalar`].
pub fn quantize_row_k_with(isa: super::kernels::Isa, x: &[f32], out: &mut Vec<ActK>) {
    match isa {
        // SAFETY: `Isa::Avx2` exists only when the CPU has AVX2.
        #[cfg(target_arch = "x86_64")]
        super::kernels::Isa::Avx2 { .. } => unsafe { super::avx2_quantize::quantize_row_k(x, out) },
        super::kernels::Isa::Scalar => quantize_row_k_scalar(x, out),
    }
}

/// Scalar reference of [`quantize_row_k_with`]: per 256, `d` = the largest magnitude / 127,
/// each value `round(x / d)` (half away from zero), as
/// [`quantize_row_scalar`](super::blocks::quantize_row_scalar) per 32.
pub fn quantize_row_k_scalar(x: &[f32], out: &mut Vec<ActK>) {
    for chunk in x.chunks_exact(SUPER) {
        let amax = chunk.iter().fold(0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
        let mut qs = [0i8; SUPER];
        for (q, &v) in qs.iter_mut().zip(chunk) {
            *q = (v * inv).round() as i8;
        }
        out.push(ActK::new(d, qs));
    }
}
