//! Linear layers of a GGUF file on a GPU, kept as integer codes with one f16 `(scale, offset)`
//! pair per row and group ([`super::gguf_affine`] repacks the blocks at load): 4-bit codes for
//! Q4_0, Q4_1 and Q4_K, bytes for Q5_0, Q5_1, Q5_K, Q6_K and Q8_0. Steps of up to
//! `pagewise_kernels::AFFINE_GEMV_MAX_ROWS` rows (the fused decode steps') stream the codes
//! through the decode GEMVs; larger steps multiply a dequantized copy on cuBLAS, as 4-bit
//! checkpoints do ([`super::int4_linear`]).

use candle_core::{DType, Device, Tensor};

use super::fp8_linear::forward_rows;
use super::gguf_affine::AffineCodes;
use super::int4_pack::{CodeOrder, pack_int4, unpack_int4};

/// An `[out, in]` weight of codes on a GPU (see `pagewise_kernels::AffineMatrix`), and an
/// optional bias.
#[derive(Clone, Debug)]
pub struct AffineLinear {
    /// u8 `[out, in * bits / 8]`: 4-bit codes in `CodeOrder::Rows`, or a byte a code.
    codes: Tensor,
    /// 4 or 8.
    bits: usize,
    /// f16 `[out, groups, 2]`: each row's groups' (scale, offset).
    scale_offset: Tensor,
    /// Input features a group.
    group: usize,
    /// `[out]`, in the activations' dtype.
    bias: Option<Tensor>,
}

impl AffineLinear {
    /// `a` on `device`, or `None` when an f16 pair would not be finite (the layer is then
    /// dequantized).
    pub fn new(a: &AffineCodes, device: &Device) -> candle_core::Result<Option<Self>> {
        let groups = a.inp / a.group;
        let pairs = Tensor::from_vec(a.pairs.clone(), (a.out, groups, 2), &Device::Cpu)?
            .to_dtype(DType::F16)?;
        let back = pairs
            .to_dtype(DType::F32)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        if back.iter().any(|v| !v.is_finite()) {
            return Ok(None);
        }
        let bytes = match a.bits {
            4 => pack_int4(&a.codes, a.inp, CodeOrder::Rows),
            _ => a.codes.clone(),
        };
        let codes = Tensor::from_vec(bytes, (a.out, a.inp * a.bits / 8), &Device::Cpu)?;
        Ok(Some(AffineLinear {
            codes: codes.to_device(device)?,
            bits: a.bits,
            scale_offset: pairs.to_device(device)?,
            group: a.group,
            bias: None,
        }))
    }

    /// `[out, in]`.
    pub fn dims(&self) -> (usize, usize) {
        let d = self.codes.dims();
        (d[0], d[1] * 8 / self.bits)
    }

    /// Bits a code.
    pub fn bits(&self) -> usize {
        self.bits
    }

    /// The bias, if any.
    pub fn bias(&self) -> Option<&Tensor> {
        self.bias.as_ref()
    }

    /// The layer with `bias` (`[out]`).
    pub fn with_bias(self, bias: Option<Tensor>) -> Self {
        AffineLinear { bias, ..self }
    }

    /// The weight as the GPU kernels take it.
    #[cfg(feature = "cuda")]
    pub fn matrix(&self) -> pagewise_kernels::AffineMatrix<'_> {
        pagewise_kernels::AffineMatrix {
            codes: &self.codes,
            scale_offset: &self.scale_offset,
            group: self.group,
            bits: match self.bits {
                4 => pagewise_kernels::CodeBits::Four,
                _ => pagewise_kernels::CodeBits::Eight,
            },
        }
    }

    /// Applies the layer to `[.., in]` (f16 or bf16 on the weight's GPU).
    pub fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        forward_rows(x, self.dims(), self.bias.as_ref(), |x2| self.matmul(x2))
    }

    #[cfg(feature = "cuda")]
    fn matmul(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        super::fp8_linear::gemv_or_dequantized(x, self.matrix().into(), || {
            pagewise_kernels::affine_dequantize(self.matrix(), x.dtype())
        })
    }

    #[cfg(not(feature = "cuda"))]
    fn matmul(&self, _x: &Tensor) -> candle_core::Result<Tensor> {
        candle_core::bail!("GGUF codes are kept only on a GPU (a CUDA build)")
    }

    /// The codes and pairs back on the host.
    fn host(&self) -> candle_core::Result<AffineCodes> {
        let (out, inp) = self.dims();
        let bytes = self.codes.flatten_all()?.to_vec1::<u8>()?;
        Ok(AffineCodes {
            out,
            inp,
            bits: self.bits,
            group: self.group,
            codes: match self.bits {
                4 => unpack_int4(&bytes, inp, CodeOrder::Rows),
                _ => bytes,
            },
            pairs: self
                .scale_offset
                .to_dtype(DType::F32)?
                .flatten_all()?
                .to_vec1::<f32>()?,
        })
    }

    /// One layer computing all of `parts` side by side (weights stacked along the output
    /// dimension), or `None` when their inputs differ or only some have a bias. Parts of
    /// different widths or groups meet at the widest codes and the smallest group (a Q4_K_M
    /// file's Q4_K q and k with its Q6_K v: bytes in groups of 16), which hold every part's
    /// values exactly; then the parts go through the host once, at load.
    pub fn concat(parts: &[&AffineLinear]) -> candle_core::Result<Option<AffineLinear>> {
        let Some(first) = parts.first() else {
            return Ok(None);
        };
        if parts.iter().any(|p| p.dims().1 != first.dims().1) {
            return Ok(None);
        }
        let biases: Vec<&Tensor> = parts.iter().filter_map(|p| p.bias.as_ref()).collect();
        let bias = match biases.len() {
            0 => None,
            n if n == parts.len() => Some(Tensor::cat(&biases, 0)?),
            _ => return Ok(None),
        };
        let bits = parts.iter().map(|p| p.bits).max().unwrap_or(4);
        let group = parts.iter().map(|p| p.group).min().unwrap_or(first.group);
        if parts.iter().all(|p| p.bits == bits && p.group == group) {
            let codes: Vec<&Tensor> = parts.iter().map(|p| &p.codes).collect();
            let pairs: Vec<&Tensor> = parts.iter().map(|p| &p.scale_offset).collect();
            return Ok(Some(AffineLinear {
                codes: Tensor::cat(&codes, 0)?,
                bits,
                scale_offset: Tensor::cat(&pairs, 0)?,
                group,
                bias,
            }));
        }
        let inp = first.dims().1;
        let mut all = AffineCodes {
            out: 0,
            inp,
            bits,
            group,
            codes: Vec::new(),
            pairs: Vec::new(),
        };
        for p in parts {
            let h = p.host()?;
            all.out += h.out;
            all.codes.extend_from_slice(&h.codes);
            // Each of the part's groups repeated over the smaller groups it covers.
            let repeat = h.group / group;
            for pair in h.pairs.chunks_exact(2) {
                for _ in 0..repeat {
                    all.pairs.extend_from_slice(pair);
                }
            }
        }
        let device = first.codes.device();
        let joined = AffineLinear::new(&all, device)?.ok_or_else(|| {
            candle_core::Error::Msg("joined GGUF codes have pairs f16 cannot hold".into())
        })?;
        Ok(Some(joined.with_bias(bias)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn codes(bits: usize, group: usize, out: usize, seed: u8) -> AffineCodes {
        let inp = 64;
        AffineCodes {
            out,
            inp,
            bits,
            group,
            codes: (0..out * inp)
                .map(|i| (i as u8).wrapping_mul(seed) % (1 << bits.min(7)) as u8)
                .collect(),
            pairs: (0..2 * out * inp / group)
                .map(|i| {
                    if i % 2 == 0 {
                        0.5 + i as f32
                    } else {
                        -(i as f32)
                    }
                })
                .collect(),
        }
    }

    #[test]
    fn parts_of_different_widths_and_groups_join_with_their_values() {
        let cpu = Device::Cpu;
        let (a, b) = (codes(4, 32, 3, 7), codes(8, 16, 2, 5));
        let (la, lb) = (
            AffineLinear::new(&a, &cpu).unwrap().unwrap(),
            AffineLinear::new(&b, &cpu).unwrap().unwrap(),
        );
        let joined = AffineLinear::concat(&[&la, &lb]).unwrap().unwrap();
        assert_eq!((joined.dims(), joined.bits, joined.group), ((5, 64), 8, 16));
        let h = joined.host().unwrap();
        let want: Vec<f32> = (0..3 * 64)
            .map(|i| a.value(i))
            .chain((0..2 * 64).map(|i| b.value(i)))
            .collect();
        let got: Vec<f32> = (0..5 * 64).map(|i| h.value(i)).collect();
        assert_eq!(got, want);
        // Alike parts stack as they are; the 4-bit codes survive the round trip.
        let same = AffineLinear::concat(&[&la, &la]).unwrap().unwrap();
        assert_eq!((same.dims(), same.bits, same.group), ((6, 64), 4, 32));
        assert_eq!(la.host().unwrap(), a);
    }

    #[test]
    fn pairs_past_f16_are_refused() {
        let mut a = codes(8, 16, 1, 3);
        a.pairs[0] = 1e6;
        assert!(AffineLinear::new(&a, &Device::Cpu).unwrap().is_none());
    }
}
