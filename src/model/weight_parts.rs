//! Reading part of a weight: which rows or columns of a 2-D tensor a tensor-parallel rank takes
//! ([`Part`]), and the safetensors reads that copy out only those bytes (FP8 and packed integer
//! tensors dequantized whole first).

use std::ops::Range;

use candle_core::{DType, Device, Tensor};

use super::ModelError;
use super::fp8::{self, Fp8Checkpoint};
use super::int_weights::IntCheckpoint;
use super::quantized::CheckpointQuant;
use super::weights::Weights;

/// Which part of a 2-D tensor `[rows, cols]` a rank reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Part {
    /// All of it.
    Whole,
    /// These rows (a column-parallel layer's output features, or vocabulary rows).
    Rows(Range<usize>),
    /// These columns (a row-parallel layer's input features).
    Cols(Range<usize>),
}

impl Part {
    /// The shape of this part of a `[rows, cols]` tensor.
    pub(super) fn shape(&self, (rows, cols): (usize, usize)) -> (usize, usize) {
        match self {
            Part::Whole => (rows, cols),
            Part::Rows(r) => (r.len(), cols),
            Part::Cols(c) => (rows, c.len()),
        }
    }

    /// This part of a `[rows, cols]` tensor, as [`Part::Whole`] when it covers all of it (a
    /// single rank's "share"), so every weight format reads it the unsharded way.
    pub(super) fn within(&self, (rows, cols): (usize, usize)) -> Part {
        match self {
            Part::Rows(r) if *r == (0..rows) => Part::Whole,
            Part::Cols(c) if *c == (0..cols) => Part::Whole,
            other => other.clone(),
        }
    }

    /// This part of a vector of `len` (a bias): its rows for [`Part::Rows`], else all of it.
    pub(super) fn of_vector(&self, len: usize) -> Part {
        match self {
            Part::Rows(r) => Part::Rows(r.clone()),
            _ => Part::Rows(0..len),
        }
    }
}

impl Weights {
    /// Reads `part` of safetensors tensor `name`, whose shape must be `full`: only the bytes of
    /// that part are copied out of the mapping (`[rows, cols]` row-major).
    pub(super) fn slice_safetensors(
        &self,
        name: &str,
        full: &[usize],
        part: &Part,
    ) -> Result<Tensor, ModelError> {
        let Weights::Safetensors {
            files,
            dtype,
            device,
            quantization,
            ..
        } = self
        else {
            unreachable!("slice_safetensors is only called on safetensors weights")
        };
        let view = match (files.get(name), quantization) {
            (Ok(view), _) => view,
            (Err(_), Some(CheckpointQuant::Int(q))) if files.get(&q.packed_name(name)).is_ok() => {
                let whole = self.dequantized_int(name, q, full)?;
                return Ok(part_of(whole, part)?.to_dtype(*dtype)?);
            }
            (Err(e), _) => return Err(missing_or(name, e)),
        };
        let stored = view.shape();
        let same = stored == full || (full.first() == Some(&1) && stored == &full[1..]);
        if !same {
            return Err(ModelError::Config(format!(
                "tensor {name} has shape {stored:?}, expected {full:?}"
            )));
        }
        let file_dtype = DType::try_from(view.dtype())?;
        if file_dtype == DType::F8E4M3 {
            let fp8 = match quantization {
                Some(CheckpointQuant::Fp8(c)) => Some(c),
                _ => None,
            };
            let whole = self.dequantized_fp8(name, fp8, full)?;
            return Ok(part_of(whole, part)?.to_dtype(*dtype)?);
        }
        let data = view.data();
        let (bytes, shape): (std::borrow::Cow<'_, [u8]>, Vec<usize>) = match (part, full) {
            (Part::Whole, _) => (data.into(), full.to_vec()),
            (_, &[rows, cols]) => {
                let es = file_dtype.size_in_bytes();
                let (r, c) = part.shape((rows, cols));
                let bytes = match part {
                    Part::Rows(range) => {
                        data[range.start * cols * es..range.end * cols * es].into()
                    }
                    Part::Cols(range) => {
                        let mut out = Vec::with_capacity(rows * range.len() * es);
                        for row in data.chunks_exact(cols * es) {
                            out.extend_from_slice(&row[range.start * es..range.end * es]);
                        }
                        out.into()
                    }
                    Part::Whole => unreachable!("handled above"),
                };
                (bytes, vec![r, c])
            }
            _ => {
                return Err(ModelError::Config(format!(
                    "tensor {name}: only 2-D tensors are sharded"
                )));
            }
        };
        let t = Tensor::from_raw_buffer(&bytes, file_dtype, &shape, &Device::Cpu)?;
        Ok(t.to_device(device)?.to_dtype(*dtype)?)
    }

    /// FP8 (e4m3) safetensors tensor `name` of shape `full`, times its scale, in f32 on the
    /// weights' device.
    pub(super) fn dequantized_fp8(
        &self,
        name: &str,
        fp8: Option<&Fp8Checkpoint>,
        full: &[usize],
    ) -> Result<Tensor, ModelError> {
        let Weights::Safetensors { files, device, .. } = self else {
            unreachable!("dequantized_fp8 is only called on safetensors weights")
        };
        let Some(fp8) = fp8 else {
            return Err(ModelError::Unsupported(format!(
                "tensor {name} is stored in FP8 (e4m3) but config.json has no \
                 quantization_config saying how it is scaled"
            )));
        };
        let read = |n: &str| -> Result<Tensor, ModelError> {
            let t = files.load(n, &Device::Cpu).map_err(|e| missing_or(n, e))?;
            Ok(t)
        };
        let weight = read(name)?;
        let weight = match full {
            [1, n] if weight.dims() == [*n] => weight.reshape((1, *n))?,
            _ => weight,
        };
        let scale_name = fp8.scale_name(name);
        let scale = read(&scale_name)?;
        fp8::dequantize(name, &weight, &scale, fp8.scales, device)
    }

    /// Packed integer weight `name` of shape `full` (`[out, in]`), unpacked with its scales and
    /// zero points, in f32 on the weights' device.
    pub(super) fn dequantized_int(
        &self,
        name: &str,
        q: &IntCheckpoint,
        full: &[usize],
    ) -> Result<Tensor, ModelError> {
        let &[out, inp] = full else {
            return Err(ModelError::Config(format!(
                "{} holds a packed weight of shape {full:?}: only matrices are read",
                q.packed_name(name)
            )));
        };
        let values = self.unpacked_int(name, q, (out, inp))?.values();
        Ok(Tensor::from_vec(values, (out, inp), &Device::Cpu)?.to_device(self.device())?)
    }
}

/// `part` of a whole 2-D tensor.
pub(super) fn part_of(whole: Tensor, part: &Part) -> Result<Tensor, ModelError> {
    Ok(match part {
        Part::Whole => whole,
        Part::Rows(r) => whole.narrow(0, r.start, r.len())?.contiguous()?,
        Part::Cols(c) => whole.narrow(1, c.start, c.len())?.contiguous()?,
    })
}

pub(super) fn missing_or(name: &str, e: candle_core::Error) -> ModelError {
    let text = e.to_string();
    if text.contains("cannot find tensor") || text.contains("not found") {
        ModelError::MissingTensor(name.to_string())
    } else {
        ModelError::Candle(e)
    }
}
