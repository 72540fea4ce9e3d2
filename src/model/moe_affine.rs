//! A mixture of experts' weights kept as integer codes on a GPU (AWQ and GPTQ experts, GGUF
//! experts of the types `gguf_affine` repacks): each expert's layers as [`AffineLinear`]s are
//! stacked into one [`AffineStack`] a projection, which the expert kernels read as it is.

use candle_core::Tensor;
use pagewise_kernels::{AffineStack, CodeBits};

use super::affine_linear::AffineLinear;
use super::layers::Linear;
use super::moe::Expert;

/// The gate/up and down stacks of `experts` when every expert's two layers are codes without a
/// bias, alike (bits and group) across the experts within each projection and as the expert
/// kernels take them; each expert's layers become views of the stacks (so the codes are held
/// once). `None` otherwise.
pub(super) fn affine_stacks(
    experts: &mut [Expert],
) -> candle_core::Result<Option<(AffineStack, AffineStack)>> {
    let layers = |pick: fn(&Expert) -> &Linear| -> Option<Vec<&AffineLinear>> {
        let all: Option<Vec<&AffineLinear>> = experts
            .iter()
            .map(|e| match pick(e) {
                Linear::Affine(l) if l.bias().is_none() => Some(l),
                _ => None,
            })
            .collect();
        let all = all.filter(|a| !a.is_empty())?;
        let (_, _, bits, group) = all[0].parts();
        let alike = all.iter().all(|l| {
            let (_, _, b, g) = l.parts();
            (b, g, l.dims()) == (bits, group, all[0].dims())
        });
        alike.then_some(all)
    };
    let (Some(gate_up), Some(down)) = (layers(|e| &e.gate_up), layers(|e| &e.down)) else {
        return Ok(None);
    };
    let (Some(gate_up), Some(down)) = (stack(&gate_up)?, stack(&down)?) else {
        return Ok(None);
    };
    for (e, expert) in experts.iter_mut().enumerate() {
        expert.gate_up = view(&gate_up, e)?;
        expert.down = view(&down, e)?;
    }
    Ok(Some((gate_up, down)))
}

/// `layers` (alike) as one stack, or `None` when the expert kernels do not take them.
fn stack(layers: &[&AffineLinear]) -> candle_core::Result<Option<AffineStack>> {
    let (_, _, bits, group) = layers[0].parts();
    let codes: Vec<&Tensor> = layers.iter().map(|l| l.parts().0).collect();
    let pairs: Vec<&Tensor> = layers.iter().map(|l| l.parts().1).collect();
    let bits = match bits {
        4 => CodeBits::Four,
        _ => CodeBits::Eight,
    };
    let (codes, pairs) = (Tensor::stack(&codes, 0)?, Tensor::stack(&pairs, 0)?);
    Ok(AffineStack::new(codes, pairs, group, bits).ok())
}

/// Expert `e`'s layer: a view of the stack.
fn view(s: &AffineStack, e: usize) -> candle_core::Result<Linear> {
    let (codes, pairs) = s.parts();
    Ok(Linear::Affine(AffineLinear::from_parts(
        codes.get(e)?,
        pairs.get(e)?,
        s.bits().bits(),
        s.group(),
    )))
}
