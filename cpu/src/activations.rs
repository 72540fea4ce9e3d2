//! The gated MLPs' activations on the CPU: `act(gate) * up` for SiLU (Llama, Qwen, Mistral) and
//! GELU's tanh form (Gemma's GeGLU), with a vectorized `exp` instead of libm's one call a value.
//!
//! Both are `x · σ(k(x))`: SiLU is `x / (1 + e^−x)`, and GELU-tanh's `½ x (1 + tanh u)` is
//! `x / (1 + e^−2u)` with `u = √(2/π) (x + 0.044715 x³)`.

use super::kernels::Isa;
use super::team::Team;

/// A gated activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Glu {
    /// `silu(gate) * up`.
    Silu,
    /// `gelu_tanh(gate) * up`.
    GeluTanh,
}

/// `√(2/π)`.
const SQRT_2_OVER_PI: f32 = 0.797_884_6;

/// The argument `k(x)` whose `σ` scales `x`.
#[inline]
fn sigmoid_arg(kind: Glu, x: f32) -> f32 {
    match kind {
        Glu::Silu => x,
        Glu::GeluTanh => 2.0 * SQRT_2_OVER_PI * (x + 0.044715 * x * x * x),
    }
}

/// Scalar reference: `act(gate[j]) * up[j]` into `out`.
fn glu_scalar(kind: Glu, gate: &[f32], up: &[f32], out: &mut [f32]) {
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = g / (1.0 + (-sigmoid_arg(kind, g)).exp()) * u;
    }
}

/// `act(gate) * up` over rows of `width` (`gate` and `up` each `rows × width`, row-major, or
/// one buffer of rows `[gate | up]` when `up` is `None`): `rows × width`, the rows split between
/// the team.
pub fn glu(kind: Glu, gate: &[f32], up: Option<&[f32]>, width: usize) -> Vec<f32> {
    glu_with(Isa::detect(), Team::global(), kind, gate, up, width)
}

/// [`glu`] with the given kernels and team (tests compare them).
pub fn glu_with(
    isa: Isa,
    team: &Team,
    kind: Glu,
    gate: &[f32],
    up: Option<&[f32]>,
    width: usize,
) -> Vec<f32> {
    let stride = if up.is_some() { width } else { 2 * width };
    let rows = gate.len() / stride.max(1);
    assert_eq!(gate.len(), rows * stride, "gate is not rows of the width");
    if let Some(up) = up {
        assert_eq!(up.len(), gate.len(), "gate and up differ in length");
    }
    let mut out = vec![0f32; rows * width];
    // Rows a piece: the whole step for a decode row, shares of a prompt's rows.
    let chunk = rows.div_ceil(team.shares()).max(1) * width;
    team.for_each_chunk(&mut out, chunk.max(1), &|piece, dst| {
        for (j, o) in dst.chunks_exact_mut(width).enumerate() {
            let row = piece * chunk / width + j;
            let (g, u) = match up {
                Some(up) => (&gate[row * width..][..width], &up[row * width..][..width]),
                None => (
                    &gate[row * stride..][..width],
                    &gate[row * stride + width..][..width],
                ),
            };
            match isa {
                // SAFETY: `Isa::Avx2` exists only when the CPU has AVX2, FMA and F16C.
                #[cfg(target_arch = "x86_64")]
                Isa::Avx2 { .. } => unsafe { super::avx2_math::glu(kind, g, u, o) },
                Isa::Scalar => glu_scalar(kind, g, u, o),
            }
        }
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The activations as candle and transformers write them.
    fn reference(kind: Glu, g: f32) -> f32 {
        match kind {
            Glu::Silu => g / (1.0 + (-g as f64).exp() as f32),
            Glu::GeluTanh => {
                let g = g as f64;
                let u = (2.0 / std::f64::consts::PI).sqrt() * (g + 0.044715 * g * g * g);
                (0.5 * g * (1.0 + u.tanh())) as f32
            }
        }
    }

    #[test]
    fn every_isa_matches_the_textbook_activations() {
        // Values across the ranges where exp saturates, rounds and underflows.
        let width = 200;
        let gate: Vec<f32> = (0..3 * 2 * width)
            .map(|i| (i as f32 * 0.37).sin() * 30.0 * ((i % 7) as f32 / 7.0))
            .collect();
        let (rows, up) = (3, vec![1.5f32; 3 * width]);
        for kind in [Glu::Silu, Glu::GeluTanh] {
            for isa in [Isa::Scalar, Isa::detect()] {
                for size in [1, 2, 3] {
                    let team = Team::new(size);
                    let split = glu_with(isa, &team, kind, &gate[..rows * width], Some(&up), width);
                    let fused = glu_with(isa, &team, kind, &gate, None, width);
                    for r in 0..rows {
                        for j in 0..width {
                            let g = gate[r * width + j];
                            let want = reference(kind, g) * 1.5;
                            let got = split[r * width + j];
                            assert!(
                                (got - want).abs() <= 2e-6 * want.abs().max(1e-3),
                                "{kind:?} {isa:?} team {size}: act({g}) * 1.5 = {got}, want {want}"
                            );
                            let (fg, fu) =
                                (gate[r * 2 * width + j], gate[r * 2 * width + width + j]);
                            let want = reference(kind, fg) * fu;
                            let got = fused[r * width + j];
                            assert!(
                                (got - want).abs() <= 2e-6 * want.abs().max(1e-3),
                                "{kind:?} {isa:?} fused: {got} vs {want}"
                            );
                        }
                    }
                }
            }
        }
    }
}
