//! Seeded random weights of a config's shapes (`--load-format dummy`), for benchmarks and for
//! tests that need no real weights.

use candle_core::{DType, Device, Shape, Tensor};

use crate::sampler::SeededRng;

/// Seeded random weights with the right shapes (`--load-format dummy`): N(0, 0.02) for matrices,
/// ones for norm scales, zeros for biases. Each tensor's values depend only on the seed and its
/// name, so the same model is produced on every run.
pub struct DummyBackend {
    /// Base seed.
    pub seed: u64,
}

impl candle_nn::var_builder::SimpleBackend for DummyBackend {
    fn get(
        &self,
        shape: Shape,
        name: &str,
        _hints: candle_nn::Init,
        dtype: DType,
        device: &Device,
    ) -> candle_core::Result<Tensor> {
        let n = shape.elem_count();
        let is_random = !name.ends_with(".bias") && !name.contains("norm");
        if is_random && !device.is_cpu() {
            // A GPU draws its own: an 8B model's weights take seconds instead of minutes. Seeded
            // per tensor, so a run reproduces (the values differ from the CPU's stream).
            let mut h = std::hash::DefaultHasher::new();
            std::hash::Hash::hash(name, &mut h);
            device.set_seed(self.seed ^ std::hash::Hasher::finish(&h))?;
            return Tensor::randn(0f32, 0.02, shape, device)?.to_dtype(dtype);
        }
        let values: Vec<f32> = if name.ends_with(".bias") {
            vec![0.0; n]
        } else if name.contains("norm") {
            vec![1.0; n]
        } else {
            let mut h = std::hash::DefaultHasher::new();
            std::hash::Hash::hash(name, &mut h);
            let mut rng = SeededRng::new(self.seed, std::hash::Hasher::finish(&h));
            (0..n).map(|_| 0.02 * standard_normal(&mut rng)).collect()
        };
        Tensor::from_vec(values, shape, &Device::Cpu)?
            .to_dtype(dtype)?
            .to_device(device)
    }

    fn get_unchecked(
        &self,
        name: &str,
        _dtype: DType,
        _dev: &Device,
    ) -> candle_core::Result<Tensor> {
        candle_core::bail!("dummy weights need a shape for {name}")
    }

    fn contains_tensor(&self, _name: &str) -> bool {
        true
    }
}

/// One standard normal draw (Box-Muller).
fn standard_normal(rng: &mut SeededRng) -> f32 {
    let u1 = rng.next_f64().max(f64::MIN_POSITIVE);
    let u2 = rng.next_f64();
    ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_nn::VarBuilder;

    #[test]
    fn dummy_weights_are_seeded_and_shaped() {
        let vb = |seed| {
            VarBuilder::from_backend(Box::new(DummyBackend { seed }), DType::F32, Device::Cpu)
        };
        let a = vb(1)
            .get((4, 8), "model.layers.0.mlp.up_proj.weight")
            .unwrap();
        let b = vb(1)
            .get((4, 8), "model.layers.0.mlp.up_proj.weight")
            .unwrap();
        let c = vb(2)
            .get((4, 8), "model.layers.0.mlp.up_proj.weight")
            .unwrap();
        let (a, b, c) = (
            a.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            b.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            c.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
        );
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert!(a.iter().all(|x| x.abs() < 0.2));
        let norm = vb(1)
            .get(8, "model.norm.weight")
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        assert_eq!(norm, vec![1.0; 8]);
    }
}
