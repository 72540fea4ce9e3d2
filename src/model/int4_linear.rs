//! Linear layers whose weights stay 4-bit on the GPU: the projections of an AWQ, GPTQ or
//! compressed-tensors W4A16 checkpoint ([`super::int_weights`] unpacks them), repacked at load
//! into an order the decode GEMVs read ([`super::int4_pack`]: rows, or tiles for the tensor-core
//! GEMV, which waits for its first GPU run before loads choose it) with one f16
//! (scale, zero point) pair per row and group. Steps of up to `pagewise_kernels::GEMV_MAX_ROWS`
//! rows stream the codes through the GEMVs (a quarter of bf16's bytes); larger steps multiply a
//! dequantized copy on cuBLAS. Everything else (the CPU, 8-bit codes, GPTQ's `desc_act` order,
//! groups the GEMVs do not take, experts, tensor-parallel slices) is dequantized at load.

use candle_core::{DType, Device, Tensor};

use super::ModelError;
use super::affine_linear::AffineLinear;
use super::fp8_linear::forward_rows;
use super::int_unpack::Unpacked;
use super::int_weights::{IntCheckpoint, Stored};
use super::int4_pack::{CodeOrder, pack_int4, unpack_int4};
use super::quantized::CheckpointQuant;
use super::weights::{Part, Weights};

/// A 4-bit weight `[out, in]` on a GPU (see `pagewise_kernels::Int4Matrix`), and an optional
/// bias.
#[derive(Clone, Debug)]
pub struct Int4Linear {
    /// u8 `[out, in / 2]`: the codes in `order`.
    codes: Tensor,
    order: CodeOrder,
    /// f16 `[out, groups, 2]`: each row's groups' (scale, zero point).
    scale_zero: Tensor,
    /// Input features a group (`in`: one group a row).
    group: usize,
    /// `[out]`, in the activations' dtype.
    bias: Option<Tensor>,
}

impl Int4Linear {
    /// `[out, in]`.
    pub fn dims(&self) -> (usize, usize) {
        let d = self.codes.dims();
        (d[0], 2 * d[1])
    }

    /// The bias, if any.
    pub fn bias(&self) -> Option<&Tensor> {
        self.bias.as_ref()
    }

    /// The layer with `bias` (`[out]`).
    pub fn with_bias(self, bias: Option<Tensor>) -> Self {
        Int4Linear { bias, ..self }
    }

    /// The weight as the GPU kernels take it.
    #[cfg(feature = "cuda")]
    pub fn matrix(&self) -> pagewise_kernels::Int4Matrix<'_> {
        pagewise_kernels::Int4Matrix {
            codes: &self.codes,
            scale_zero: &self.scale_zero,
            group: self.group,
            layout: match self.order {
                CodeOrder::Rows => pagewise_kernels::Int4Layout::Rows,
                CodeOrder::Tiles => pagewise_kernels::Int4Layout::Tiles,
            },
        }
    }

    /// The order of the codes.
    pub fn order(&self) -> CodeOrder {
        self.order
    }

    /// The layer with its codes in `order` (repacked through the host when they are in another,
    /// once, at load): rows for the qkv GEMV with rotary ([`super::layers::Linear::in_rows`]).
    /// Tiles need the shape [`CodeOrder::best_for`] gives them to.
    pub fn with_order(self, order: CodeOrder) -> candle_core::Result<Self> {
        if self.order == order {
            return Ok(self);
        }
        let (out, inp) = self.dims();
        if order == CodeOrder::Tiles && CodeOrder::best_for((out, inp), self.group) != order {
            candle_core::bail!(
                "a [{out}, {inp}] 4-bit weight in groups of {} cannot be laid out in tiles",
                self.group
            );
        }
        let bytes = self.codes.flatten_all()?.to_vec1::<u8>()?;
        let q = unpack_int4(&bytes, inp, self.order);
        let codes = Tensor::from_vec(pack_int4(&q, inp, order), (out, inp / 2), &Device::Cpu)?;
        Ok(Int4Linear {
            codes: codes.to_device(self.codes.device())?,
            order,
            ..self
        })
    }

    /// `u` (4-bit codes) repacked on `device`, or `None` when the GEMVs cannot take it: input
    /// features not a multiple of 32, features out of their groups' order (`desc_act`), groups
    /// not whole rows or a power of two of at least 32, or a scale f16 cannot hold exactly.
    pub fn from_unpacked(u: &Unpacked, device: &Device) -> Result<Option<Self>, ModelError> {
        let group = u.inp / u.groups.max(1);
        let fits = u.inp.is_multiple_of(32)
            && u.group_of.is_none()
            && (u.groups == 1 || (group >= 32 && group.is_power_of_two()))
            && u.codes.iter().all(|&q| q < 16);
        if !fits {
            return Ok(None);
        }
        let pairs: Vec<f32> = u
            .scales
            .iter()
            .zip(&u.zeros)
            .flat_map(|(&s, &z)| [s, z as f32])
            .collect();
        let shape = (u.out, u.groups, 2);
        let host = Tensor::from_vec(pairs.clone(), shape, &Device::Cpu)?.to_dtype(DType::F16)?;
        let back = host.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
        if back != pairs {
            return Ok(None);
        }
        let group = if u.groups == 1 { u.inp } else { group };
        let order = CodeOrder::best_for((u.out, u.inp), group);
        let codes = Tensor::from_vec(
            pack_int4(&u.codes, u.inp, order),
            (u.out, u.inp / 2),
            &Device::Cpu,
        )?;
        Ok(Some(Int4Linear {
            codes: codes.to_device(device)?,
            order,
            scale_zero: host.to_device(device)?,
            group,
            bias: None,
        }))
    }

    /// Seeded random codes of `[out, in]` on `device` (`--load-format dummy` with a 4-bit
    /// checkpoint's config): uniform codes about a zero point of 8, scaled so that the values'
    /// spread is the dummy dense weights' (0.02).
    pub fn dummy(
        (out, inp): (usize, usize),
        group: usize,
        device: &Device,
    ) -> Result<Self, ModelError> {
        let group = group.min(inp);
        let groups = inp.div_ceil(group);
        // Random bytes: two uniform codes each.
        let codes = (Tensor::rand(0f32, 256f32, (out, inp / 2), device)?.floor()?)
            .clamp(0f32, 255f32)?
            .to_dtype(DType::U8)?;
        // Uniform codes 0..15 have a standard deviation of 4.6.
        let pair = Tensor::new(&[0.02f32 / 4.6, 8.0], device)?;
        let scale_zero = pair
            .reshape((1, 1, 2))?
            .broadcast_as((out, groups, 2))?
            .contiguous()?
            .to_dtype(DType::F16)?;
        Ok(Int4Linear {
            codes,
            // (Random codes: any order reads them as random.)
            order: CodeOrder::best_for((out, inp), group),
            scale_zero,
            group,
            bias: None,
        })
    }

    /// Applies the layer to `[.., in]` (f16 or bf16 on the weight's GPU).
    pub fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        forward_rows(x, self.dims(), self.bias.as_ref(), |x2| self.matmul(x2))
    }

    #[cfg(feature = "cuda")]
    fn matmul(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        super::fp8_linear::gemv_or_dequantized(x, self.matrix().into(), || {
            pagewise_kernels::int4_dequantize(self.matrix(), x.dtype())
        })
    }

    #[cfg(not(feature = "cuda"))]
    fn matmul(&self, _x: &Tensor) -> candle_core::Result<Tensor> {
        candle_core::bail!("4-bit weights are kept only on a GPU (a CUDA build)")
    }

    /// One layer computing all of `parts` side by side (weights stacked along the output
    /// dimension), or `None` when their inputs, groups or code orders differ, or only some have a
    /// bias. (Tiles stack as rows do: a part's tiles hold whole rows of it.)
    pub fn concat(parts: &[&Int4Linear]) -> candle_core::Result<Option<Int4Linear>> {
        let Some(first) = parts.first() else {
            return Ok(None);
        };
        let alike = |p: &&Int4Linear| {
            p.dims().1 == first.dims().1 && p.group == first.group && p.order == first.order
        };
        if !parts.iter().all(alike) {
            return Ok(None);
        }
        let biases: Vec<&Tensor> = parts.iter().filter_map(|p| p.bias.as_ref()).collect();
        let bias = match biases.len() {
            0 => None,
            n if n == parts.len() => Some(Tensor::cat(&biases, 0)?),
            _ => return Ok(None),
        };
        let codes: Vec<&Tensor> = parts.iter().map(|p| &p.codes).collect();
        let pairs: Vec<&Tensor> = parts.iter().map(|p| &p.scale_zero).collect();
        Ok(Some(Int4Linear {
            codes: Tensor::cat(&codes, 0)?,
            order: first.order,
            scale_zero: Tensor::cat(&pairs, 0)?,
            group: first.group,
            bias,
        }))
    }
}

/// How the weights layer reads integer checkpoints (`Weights::linear_part`, `slice_safetensors`).
impl Weights {
    /// The integer checkpoint weight `name` (`[out, in]`) kept 4-bit when a GPU takes it
    /// ([`Int4Linear::from_unpacked`]): 4-bit codes, f16 or bf16 activations, the whole tensor
    /// (one rank), not an expert's (the grouped expert kernels read 16-bit weights). Under
    /// `--load-format dummy` with a 4-bit checkpoint's config, random codes
    /// ([`Int4Linear::dummy`]).
    pub(super) fn kept_int4(
        &self,
        name: &str,
        shape: (usize, usize),
        part: &Part,
    ) -> Result<Option<Int4Linear>, ModelError> {
        let kept_here = |device: &Device, dtype: DType| {
            device.is_cuda()
                && matches!(dtype, DType::BF16 | DType::F16)
                && *part == Part::Whole
                && !name.contains(".experts.")
        };
        match self {
            Weights::Safetensors {
                files,
                dtype,
                device,
                quantization: Some(CheckpointQuant::Int(q)),
                ..
            } if q.bits == 4 && kept_here(device, *dtype) => {
                if !files.has(&q.packed_name(name)) {
                    return Ok(None);
                }
                let u = self.unpacked_int(name, q, shape)?;
                Int4Linear::from_unpacked(&u, device)
            }
            Weights::Dense {
                vb,
                dummy_int4: Some(group),
                ..
            } if kept_here(vb.device(), vb.dtype())
                && super::fp8_linear::quantizes(name.strip_suffix(".weight").unwrap_or(name))
                && shape.1.is_multiple_of(32) =>
            {
                Ok(Some(Int4Linear::dummy(shape, *group, vb.device())?))
            }
            _ => Ok(None),
        }
    }

    /// The integer checkpoint weight `name` (`[out, in]`) of an expert kept as codes for the
    /// expert kernels when a GPU takes it ([`AffineLinear::from_unpacked`]): 4- or 8-bit codes,
    /// f16 or bf16 activations, the whole tensor (one rank). Under `--load-format dummy` with a
    /// 4-bit checkpoint's config, random codes ([`AffineLinear::dummy`]).
    pub(super) fn kept_affine_expert(
        &self,
        name: &str,
        shape: (usize, usize),
        part: &Part,
    ) -> Result<Option<AffineLinear>, ModelError> {
        let kept_here = |device: &Device, dtype: DType| {
            device.is_cuda()
                && matches!(dtype, DType::BF16 | DType::F16)
                && *part == Part::Whole
                && name.contains(".experts.")
        };
        match self {
            Weights::Safetensors {
                files,
                dtype,
                device,
                quantization: Some(CheckpointQuant::Int(q)),
                ..
            } if kept_here(device, *dtype) => {
                if !files.has(&q.packed_name(name)) {
                    return Ok(None);
                }
                let u = self.unpacked_int(name, q, shape)?;
                Ok(AffineLinear::from_unpacked(&u, q.bits as usize, device)?)
            }
            Weights::Dense {
                vb,
                dummy_int4: Some(group),
                ..
            } if kept_here(vb.device(), vb.dtype()) && shape.1.is_multiple_of(32) => {
                Ok(Some(AffineLinear::dummy(shape, *group, vb.device())?))
            }
            _ => Ok(None),
        }
    }

    /// Packed integer weight `name` (`[out, in]`) unpacked with its scales and zero points.
    pub(super) fn unpacked_int(
        &self,
        name: &str,
        q: &IntCheckpoint,
        (out, inp): (usize, usize),
    ) -> Result<Unpacked, ModelError> {
        let Weights::Safetensors { files, .. } = self else {
            unreachable!("unpacked_int is only called on safetensors weights")
        };
        let read = |n: &str, dtype: DType| -> Result<Option<Tensor>, ModelError> {
            match files.get(n) {
                Ok(_) => Ok(Some(files.load(n, &Device::Cpu)?.to_dtype(dtype)?)),
                Err(_) => Ok(None),
            }
        };
        let read_i32 = |n: &str| -> Result<Stored<i32>, ModelError> {
            read(n, DType::I32)?
                .map(|t| Ok((t.dims().to_vec(), t.flatten_all()?.to_vec1::<i32>()?)))
                .transpose()
        };
        let read_f32 = |n: &str| -> Result<Stored<f32>, ModelError> {
            read(n, DType::F32)?
                .map(|t| Ok((t.dims().to_vec(), t.flatten_all()?.to_vec1::<f32>()?)))
                .transpose()
        };
        q.unpack(name, (out, inp), &read_i32, &read_f32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_repack_between_rows_and_tiles() {
        let u = Unpacked {
            out: 32,
            inp: 128,
            codes: (0..32 * 128)
                .map(|i| ((i * 7 + i / 128) % 16) as u8)
                .collect(),
            zeros: vec![8; 32],
            scales: vec![0.5; 32],
            groups: 1,
            group_of: None,
        };
        let layer = Int4Linear::from_unpacked(&u, &Device::Cpu)
            .unwrap()
            .unwrap();
        let bytes = |l: &Int4Linear| l.codes.flatten_all().unwrap().to_vec1::<u8>().unwrap();
        let tiled = layer.with_order(CodeOrder::Tiles).unwrap();
        assert_eq!(tiled.order(), CodeOrder::Tiles);
        assert_eq!(bytes(&tiled), pack_int4(&u.codes, 128, CodeOrder::Tiles));
        let rows = tiled.with_order(CodeOrder::Rows).unwrap();
        assert_eq!(rows.order(), CodeOrder::Rows);
        assert_eq!(bytes(&rows), pack_int4(&u.codes, 128, CodeOrder::Rows));
        // Two rows cannot make a tile.
        let two = Int4Linear::from_unpacked(&unpacked(256, 2, 0.5), &Device::Cpu)
            .unwrap()
            .unwrap();
        assert!(two.with_order(CodeOrder::Tiles).is_err());
    }

    fn unpacked(inp: usize, groups: usize, scale: f32) -> Unpacked {
        Unpacked {
            out: 2,
            inp,
            codes: (0..2 * inp).map(|i| (i % 16) as u8).collect(),
            zeros: vec![8; 2 * groups],
            scales: vec![scale; 2 * groups],
            groups,
            group_of: None,
        }
    }

    #[test]
    fn only_what_the_gemvs_take_is_kept() {
        let cpu = Device::Cpu;
        let kept = Int4Linear::from_unpacked(&unpacked(256, 2, 0.5), &cpu)
            .unwrap()
            .unwrap();
        assert_eq!((kept.dims(), kept.group), ((2, 256), 128));
        assert_eq!(kept.scale_zero.dims(), [2, 2, 2]);
        let per_channel = Int4Linear::from_unpacked(&unpacked(96, 1, 0.5), &cpu)
            .unwrap()
            .unwrap();
        assert_eq!(per_channel.group, 96);
        // Groups of 48 (not a power of two), of 16 (below a lane's 32 columns), features not a
        // multiple of 32, a scale f16 rounds, features out of order, 8-bit codes: dequantized.
        let mut refused = vec![
            unpacked(96, 2, 0.5),
            unpacked(64, 4, 0.5),
            unpacked(48, 1, 0.5),
            unpacked(64, 1, 0.1),
        ];
        let mut shuffled = unpacked(64, 2, 0.5);
        shuffled.group_of = Some((0..64).map(|i| i % 2).collect());
        refused.push(shuffled);
        let mut eight_bit = unpacked(64, 2, 0.5);
        eight_bit.codes[3] = 200;
        refused.push(eight_bit);
        for u in refused {
            assert!(
                Int4Linear::from_unpacked(&u, &cpu).unwrap().is_none(),
                "{u:?}"
            );
        }
    }
}
