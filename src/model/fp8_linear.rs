//! Linear layers whose weights stay FP8 (e4m3) on the GPU: an FP8 checkpoint's projections
//! (per-tensor, per-channel or block scales, as [`super::fp8`] reads them) and, with
//! `--quantization fp8`, a 16-bit checkpoint's projections quantized at load with one scale per
//! output channel. Steps of up to `pagewise_kernels::GEMV_MAX_ROWS` rows stream the e4m3
//! bytes through the decode GEMVs (half the bytes of bf16; activations stay 16-bit); larger
//! steps of weights with one scale a row (or a tensor) run on the e4m3 tensor cores
//! (`pagewise_kernels::Fp8Gemm`: cuBLASLt, activations quantized per token, as vLLM's
//! `--quantization fp8` does), and block-scaled weights multiply a dequantized copy on cuBLAS.
//! On the CPU, FP8 weights are dequantized at load ([`fake_quantize_rows`] gives
//! `--quantization fp8` the same rounding there).

use candle_core::{DType, Device, Tensor};

use super::ModelError;
use super::fp8::{Fp8Checkpoint, Fp8Scales};
use super::layers::Linear;
use super::quantized::CheckpointQuant;
use super::weights::{Part, Weights};

/// The largest e4m3 magnitude.
const E4M3_MAX: f64 = 448.0;

/// An FP8 weight `[out, in]` on a GPU with its block scales (see `pagewise_kernels::Fp8Matrix`),
/// and an optional bias.
#[derive(Clone, Debug)]
pub struct Fp8Linear {
    /// u8 `[out, in]`: the e4m3 bytes.
    data: Tensor,
    /// f32 `[ceil(out / block.0), ceil(in / block.1)]`.
    scales: Tensor,
    /// Rows and columns one scale covers.
    block: (usize, usize),
    /// `[out]`, in the activations' dtype.
    bias: Option<Tensor>,
}

impl Fp8Linear {
    /// `[out, in]`.
    pub fn dims(&self) -> (usize, usize) {
        let d = self.data.dims();
        (d[0], d[1])
    }

    /// The bias, if any.
    pub fn bias(&self) -> Option<&Tensor> {
        self.bias.as_ref()
    }

    /// The weight as the GPU kernels take it.
    #[cfg(feature = "cuda")]
    pub fn matrix(&self) -> pagewise_kernels::Fp8Matrix<'_> {
        pagewise_kernels::Fp8Matrix {
            data: &self.data,
            scales: &self.scales,
            block: self.block,
        }
    }

    /// `w` (`[out, in]`, f16 or bf16, on a GPU) quantized with one scale per output channel.
    #[cfg(feature = "cuda")]
    pub fn quantize(w: &Tensor, bias: Option<Tensor>) -> candle_core::Result<Self> {
        let (data, scales) = pagewise_kernels::fp8_quantize_rows(w)?;
        let block = (1, w.dim(1)?);
        Ok(Fp8Linear {
            data,
            scales,
            block,
            bias,
        })
    }

    /// The layer with `bias` (`[out]`).
    pub fn with_bias(self, bias: Option<Tensor>) -> Self {
        Fp8Linear { bias, ..self }
    }

    /// Applies the layer to `[.., in]` (f16 or bf16 on the weight's GPU).
    pub fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        forward_rows(x, self.dims(), self.bias.as_ref(), |x2| self.matmul(x2))
    }

    #[cfg(feature = "cuda")]
    fn matmul(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let (rows, k) = x.dims2()?;
        // Past the GEMVs' rows, one scale a row takes the e4m3 tensor cores (activations
        // quantized per token); blocks of columns, which cuBLASLt scales only on later GPUs,
        // a dequantized copy.
        if rows > pagewise_kernels::GEMV_MAX_ROWS
            && self.block == (1, k)
            && let Some(gemm) = tensor_core_gemm(x.device())
        {
            return gemm.matmul(x, self.matrix());
        }
        gemv_or_dequantized(x, self.matrix().into(), || {
            pagewise_kernels::fp8_dequantize(self.matrix(), x.dtype())
        })
    }

    #[cfg(not(feature = "cuda"))]
    fn matmul(&self, _x: &Tensor) -> candle_core::Result<Tensor> {
        candle_core::bail!("FP8 weights are kept only on a GPU (a CUDA build)")
    }

    /// One layer computing all of `parts` side by side (weights stacked along the output
    /// dimension), or `None` when their scales cannot be stacked: one scale per tensor or per
    /// row stack as per-row scales; blocks stack when they are alike and every part's rows fill
    /// whole blocks. Biases: all or none.
    pub fn concat(parts: &[&Fp8Linear]) -> candle_core::Result<Option<Fp8Linear>> {
        let Some(first) = parts.first() else {
            return Ok(None);
        };
        let k = first.dims().1;
        if parts.iter().any(|p| p.dims().1 != k) {
            return Ok(None);
        }
        let rowwise = |p: &Fp8Linear| p.block.1 >= k && (p.block.0 == 1 || p.block.0 >= p.dims().0);
        let (scales, block) = if parts.iter().all(|p| rowwise(p)) {
            let per_row = parts
                .iter()
                .map(|p| p.scales.broadcast_as((p.dims().0, 1))?.contiguous())
                .collect::<candle_core::Result<Vec<_>>>()?;
            (Tensor::cat(&per_row, 0)?, (1, k))
        } else if parts
            .iter()
            .all(|p| p.block == first.block && p.dims().0.is_multiple_of(p.block.0))
        {
            let s: Vec<&Tensor> = parts.iter().map(|p| &p.scales).collect();
            (Tensor::cat(&s, 0)?, first.block)
        } else {
            return Ok(None);
        };
        let biases: Vec<&Tensor> = parts.iter().filter_map(|p| p.bias.as_ref()).collect();
        let bias = match biases.len() {
            0 => None,
            n if n == parts.len() => Some(Tensor::cat(&biases, 0)?),
            _ => return Ok(None),
        };
        let data: Vec<&Tensor> = parts.iter().map(|p| &p.data).collect();
        Ok(Some(Fp8Linear {
            data: Tensor::cat(&data, 0)?,
            scales,
            block,
            bias,
        }))
    }
}

/// `x` (`[rows, k]`) times the quantized weight `w`: the decode GEMV for up to
/// `pagewise_kernels::GEMV_MAX_ROWS` rows when it takes `w`, else cuBLAS on the weight
/// `dequantized` gives in `x`'s dtype.
#[cfg(feature = "cuda")]
pub(super) fn gemv_or_dequantized(
    x: &Tensor,
    w: pagewise_kernels::GemvWeight<'_>,
    dequantized: impl FnOnce() -> candle_core::Result<Tensor>,
) -> candle_core::Result<Tensor> {
    use pagewise_kernels::{GEMV_MAX_ROWS, GemvInput};
    let (rows, k) = x.dims2()?;
    if rows <= GEMV_MAX_ROWS.min(w.max_rows())
        && w.takes(x.dtype())
        && pagewise_kernels::gemv_fits(rows, k, x.dtype())
    {
        return pagewise_kernels::gemv_fused(&x.contiguous()?, w, GemvInput::Plain, None);
    }
    x.matmul(&dequantized()?.t()?)
}

/// cuBLASLt's e4m3 matmul on `device`, shared by every FP8 layer of the process (its handle and
/// workspace made at the first large step): `None` where cuBLASLt has no e4m3 matmul with scale
/// vectors, or on a GPU other than the one it was made for (a process drives one GPU).
#[cfg(feature = "cuda")]
fn tensor_core_gemm(device: &Device) -> Option<&'static pagewise_kernels::Fp8Gemm> {
    use std::sync::OnceLock;
    static GEMM: OnceLock<(
        candle_core::DeviceLocation,
        Option<pagewise_kernels::Fp8Gemm>,
    )> = OnceLock::new();
    let (made_on, gemm) =
        GEMM.get_or_init(|| (device.location(), pagewise_kernels::Fp8Gemm::new(device)));
    (*made_on == device.location())
        .then_some(gemm.as_ref())
        .flatten()
}

/// A layer of weight `[out, k]` applied to `x` (`[.., k]`): `matmul` of its rows as one
/// `[rows, k]` matrix, plus `bias`, in `x`'s leading dimensions.
pub(super) fn forward_rows(
    x: &Tensor,
    (out, k): (usize, usize),
    bias: Option<&Tensor>,
    matmul: impl FnOnce(&Tensor) -> candle_core::Result<Tensor>,
) -> candle_core::Result<Tensor> {
    let dims = x.dims().to_vec();
    if dims.last() != Some(&k) {
        candle_core::bail!("input {dims:?} does not end in {k} features");
    }
    let rows = x.elem_count() / k;
    let y = matmul(&x.reshape((rows, k))?)?;
    let y = match bias {
        Some(b) => y.broadcast_add(b)?,
        None => y,
    };
    let mut out_dims = dims;
    *out_dims.last_mut().expect("at least one dimension") = out;
    y.reshape(out_dims)
}

/// The FP8 weight `name` (`[out, in]`) of a checkpoint as it is stored, with its scales, when it
/// can stay FP8: stored e4m3, on a GPU with f16 or bf16 activations, read whole (one rank), `in`
/// a multiple of 16 and blocks of whole rows or a power of two of at least 16 columns (what the
/// GEMVs take), and not an expert's
/// (the grouped expert kernels read 16-bit weights). `None`: read it dequantized.
pub(super) fn read_kept(
    files: &super::checkpoint::Checkpoint,
    name: &str,
    fp8: &Fp8Checkpoint,
    (out, k): (usize, usize),
    (device, dtype): (&Device, DType),
) -> Result<Option<Fp8Linear>, ModelError> {
    let Ok(view) = files.get(name) else {
        return Ok(None);
    };
    let kept_here = device.is_cuda() && matches!(dtype, DType::BF16 | DType::F16);
    let stored_fp8 = DType::try_from(view.dtype()).ok() == Some(DType::F8E4M3);
    if !kept_here || !stored_fp8 || view.shape() != [out, k] || name.contains(".experts.") {
        return Ok(None);
    }
    let block = match fp8.scales {
        // (One scale a tensor is read as the same scale on every row: the layout the e4m3
        // matmuls take.)
        Fp8Scales::PerTensor | Fp8Scales::PerRow => (1, k),
        Fp8Scales::Blocks { rows, cols } => (rows, cols),
    };
    if !k.is_multiple_of(16) || !(block.1 >= k || (block.1 >= 16 && block.1.is_power_of_two())) {
        return Ok(None);
    }
    let shape = (out.div_ceil(block.0), k.div_ceil(block.1));
    let scale_name = fp8.scale_name(name);
    let mut scales = files
        .load(&scale_name, &Device::Cpu)
        .map_err(|e| ModelError::MissingTensor(format!("{scale_name}: {e}")))?
        .to_dtype(DType::F32)?;
    if fp8.scales == Fp8Scales::PerTensor && scales.elem_count() == 1 {
        scales = scales.reshape((1, 1))?.broadcast_as(shape)?.contiguous()?;
    }
    if scales.elem_count() != shape.0 * shape.1 {
        return Err(ModelError::Config(format!(
            "the scale of FP8 tensor {name} has shape {:?}; {:?} scales of a [{out}, {k}] \
             weight are {shape:?}",
            scales.dims(),
            fp8.scales
        )));
    }
    let data = Tensor::from_raw_buffer(view.data(), DType::U8, &[out, k], &Device::Cpu)?;
    Ok(Some(Fp8Linear {
        data: data.to_device(device)?,
        scales: scales.reshape(shape)?.to_device(device)?,
        block,
        bias: None,
    }))
}

/// How the weights layer reads FP8 projections (`Weights::linear_part`).
impl Weights {
    /// The FP8 checkpoint weight `name` (`[out, in]`) as it is stored, when a GPU keeps it so
    /// ([`read_kept`]; whole tensors only).
    pub(super) fn kept_fp8(
        &self,
        name: &str,
        shape: (usize, usize),
        part: &Part,
    ) -> Result<Option<Fp8Linear>, ModelError> {
        match (self, part) {
            (
                Weights::Safetensors {
                    files,
                    dtype,
                    device,
                    quantization: Some(CheckpointQuant::Fp8(fp8)),
                    ..
                },
                Part::Whole,
            ) => read_kept(files, name, fp8, shape, (device, *dtype)),
            _ => Ok(None),
        }
    }

    /// Whether `--quantization fp8` quantizes the projection `prefix` at load.
    pub(super) fn quantizes_fp8(&self, prefix: &str) -> bool {
        let on = match self {
            Weights::Dense { quantize_fp8, .. } | Weights::Safetensors { quantize_fp8, .. } => {
                *quantize_fp8
            }
            Weights::Gguf { .. } => false,
        };
        on && quantizes(prefix)
    }
}

/// Whether `--quantization fp8` quantizes the projection `prefix` (a decoder layer's attention
/// and MLP projections; not the embedding, the LM head or a router).
pub(super) fn quantizes(prefix: &str) -> bool {
    prefix.contains("layers.")
        && !prefix.ends_with(".gate")
        && !prefix.contains("router")
        && !prefix.contains(".experts.")
}

/// The `--quantization fp8` layer of weight `w` (`[out, in]`, in the model dtype): e4m3 bytes
/// and per-row scales on a GPU with f16 or bf16 activations, else `w` rounded as they would
/// round it ([`fake_quantize_rows`]), dense.
pub(super) fn quantized(w: &Tensor, bias: Option<Tensor>) -> Result<Linear, ModelError> {
    #[cfg(feature = "cuda")]
    if w.device().is_cuda() && matches!(w.dtype(), DType::BF16 | DType::F16) {
        return Ok(Linear::Fp8(Fp8Linear::quantize(w, bias)?));
    }
    Ok(Linear::dense(fake_quantize_rows(w)?, bias))
}

/// `w` (`[out, in]`) rounded as `--quantization fp8` rounds it, in its own dtype and device: each
/// row divided by its scale (its largest magnitude over 448; 1 for a row of zeros) in f32,
/// rounded to e4m3 (nearest even), and multiplied back. What the CPU serves for an FP8-quantized
/// layer; the GPU keeps the e4m3 bytes and scales instead (`Fp8Linear::quantize`, CUDA builds).
pub fn fake_quantize_rows(w: &Tensor) -> candle_core::Result<Tensor> {
    let (dtype, device) = (w.dtype(), w.device().clone());
    let w32 = w.to_device(&Device::Cpu)?.to_dtype(DType::F32)?;
    let absmax = w32.abs()?.max_keepdim(1)?;
    let max = Tensor::new(E4M3_MAX as f32, &Device::Cpu)?;
    let scale = (absmax.gt(0.0)?).where_cond(
        &absmax.broadcast_div(&max)?,
        &Tensor::ones_like(&w32.narrow(1, 0, 1)?)?,
    )?;
    let q = w32
        .broadcast_div(&scale)?
        .clamp(-E4M3_MAX, E4M3_MAX)?
        .to_dtype(DType::F8E4M3)?
        .to_dtype(DType::F32)?;
    q.broadcast_mul(&scale)?.to_dtype(dtype)?.to_device(&device)
}
