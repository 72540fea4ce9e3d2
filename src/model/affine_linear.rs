//! Linear layers of a GGUF file on a GPU, kept as integer codes with one f16 `(scale, offset)`
//! pair per row and group ([`super::gguf_affine`] repacks the blocks at load): 4-bit codes for
//! Q4_0, Q4_1 and Q4_K, bytes for Q5_0, Q5_1, Q5_K, Q6_K and Q8_0. Integer checkpoints' experts
//! (AWQ, GPTQ) take the same form, stacked for the expert kernels (`moe_affine.rs`). Steps of up to
//! `pagewise_kernels::AFFINE_GEMV_MAX_ROWS` rows (the fused decode steps') stream the codes
//! through the decode GEMVs; larger steps multiply a dequantized copy on cuBLAS, as 4-bit
//! checkpoints do ([`super::int4_linear`]).

use candle_core::{DType, Device, Tensor};

use super::fp8_linear::forward_rows;
use super::gguf_affine::AffineCodes;
use super::int_unpack::Unpacked;
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

    /// An integer checkpoint's weight `u` (AWQ, GPTQ or compressed-tensors codes of `bits`, 4 or 8,
    /// `w = s * (q - z)`) as codes with the pairs `(s, -s * z)` on `device`, or `None` when the
    /// expert kernels cannot take it: features out of their groups' order (`desc_act`), input
    /// features not whole runs of a load (32 4-bit codes, 16 bytes), groups neither whole rows
    /// nor a power of two of at least a run, or a pair f16 cannot hold. (Experts: the dense
    /// layers keep AWQ's own layout, [`super::int4_linear`].)
    pub fn from_unpacked(
        u: &Unpacked,
        bits: usize,
        device: &Device,
    ) -> candle_core::Result<Option<Self>> {
        if !(bits == 4 || bits == 8) || u.codes.iter().any(|&q| usize::from(q) >> bits != 0) {
            return Ok(None);
        }
        let group = u.inp / u.groups.max(1);
        let run = if bits == 4 { 32 } else { 16 };
        let fits = u.group_of.is_none()
            && u.inp.is_multiple_of(run)
            && (u.groups == 1 || (group >= run && group.is_power_of_two()));
        if !fits {
            return Ok(None);
        }
        let pairs = u
            .scales
            .iter()
            .zip(&u.zeros)
            .flat_map(|(&s, &z)| [s, -s * z as f32])
            .collect();
        let a = AffineCodes {
            out: u.out,
            inp: u.inp,
            bits,
            group,
            codes: u.codes.clone(),
            pairs,
        };
        AffineLinear::new(&a, device)
    }

    /// Seeded random 4-bit codes of `[out, in]` in groups of `group` on `device`
    /// (`--load-format dummy` with a 4-bit checkpoint's config, for experts): uniform codes about
    /// an offset of -8 scales, their spread the dummy dense weights' (0.02).
    pub fn dummy(
        (out, inp): (usize, usize),
        group: usize,
        device: &Device,
    ) -> candle_core::Result<Self> {
        let group = group.min(inp);
        let groups = inp.div_ceil(group);
        // Random bytes: two uniform codes each.
        let codes = (Tensor::rand(0f32, 256f32, (out, inp / 2), device)?.floor()?)
            .clamp(0f32, 255f32)?
            .to_dtype(DType::U8)?;
        // Uniform codes 0..15 have a standard deviation of 4.6.
        let s = 0.02f32 / 4.6;
        let scale_offset = Tensor::new(&[s, -8.0 * s], device)?
            .reshape((1, 1, 2))?
            .broadcast_as((out, groups, 2))?
            .contiguous()?
            .to_dtype(DType::F16)?;
        Ok(AffineLinear {
            codes,
            bits: 4,
            scale_offset,
            group,
            bias: None,
        })
    }

    /// The layer of `codes`, `pairs`, `bits` and `group` as [`AffineLinear::parts`] gives them
    /// (views of a stack of experts), without a bias.
    pub fn from_parts(codes: Tensor, scale_offset: Tensor, bits: usize, group: usize) -> Self {
        AffineLinear {
            codes,
            bits,
            scale_offset,
            group,
            bias: None,
        }
    }

    /// The codes (u8 `[out, in * bits / 8]`), the pairs (f16 `[out, groups, 2]`), bits a code and
    /// columns a group.
    pub fn parts(&self) -> (&Tensor, &Tensor, usize, usize) {
        (&self.codes, &self.scale_offset, self.bits, self.group)
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

    /// AWQ/GPTQ codes become `s * q + b` with `b = -s * z`: each value `s * (q - z)` within the
    /// f16 rounding of the pair; what the expert kernels cannot take is refused.
    #[test]
    fn integer_checkpoint_codes_keep_their_values() {
        let (out, inp, groups) = (3, 64, 2);
        let u = Unpacked {
            out,
            inp,
            codes: (0..out * inp).map(|i| (i * 7 % 16) as u8).collect(),
            zeros: (0..out * groups).map(|g| (g % 9) as i32).collect(),
            scales: (0..out * groups).map(|g| 0.01 + g as f32 * 1e-3).collect(),
            groups,
            group_of: None,
        };
        let l = AffineLinear::from_unpacked(&u, 4, &Device::Cpu)
            .unwrap()
            .unwrap();
        assert_eq!((l.dims(), l.bits, l.group), ((out, inp), 4, 32));
        let h = l.host().unwrap();
        for i in 0..out * inp {
            let g = (i / inp) * groups + (i % inp) / 32;
            let want = u.scales[g] * (f32::from(u.codes[i]) - u.zeros[g] as f32);
            assert!(
                (h.value(i) - want).abs() <= 2e-3 * want.abs().max(0.05),
                "{i}"
            );
        }
        // 8-bit codes per channel take bytes.
        let eight = Unpacked {
            codes: (0..out * inp).map(|i| (i * 37 % 256) as u8).collect(),
            zeros: vec![128; out],
            scales: vec![0.002; out],
            groups: 1,
            ..u.clone()
        };
        let l8 = AffineLinear::from_unpacked(&eight, 8, &Device::Cpu)
            .unwrap()
            .unwrap();
        assert_eq!((l8.bits, l8.group), (8, inp));
        // Features out of order, groups of 16 4-bit codes, and codes past the bits are refused.
        let refused = |u: &Unpacked, bits| {
            AffineLinear::from_unpacked(u, bits, &Device::Cpu)
                .unwrap()
                .is_none()
        };
        let shuffled = Unpacked {
            group_of: Some((0..inp).map(|i| i % groups).collect()),
            ..u.clone()
        };
        assert!(refused(&shuffled, 4));
        let small = Unpacked {
            zeros: vec![0; out * 4],
            scales: vec![0.01; out * 4],
            groups: 4,
            ..u.clone()
        };
        assert!(refused(&small, 4));
        assert!(refused(&eight, 4));
    }

    #[test]
    fn pairs_past_f16_are_refused() {
        let mut a = codes(8, 16, 1, 3);
        a.pairs[0] = 1e6;
        assert!(AffineLinear::new(&a, &Device::Cpu).unwrap().is_none());
    }
}
