//! MXFP4 (the OCP microscaling format), as gpt-oss ships its experts' weights: each run of 32
//! values is 16 bytes of FP4 (E2M1) codes, two a byte (the low nibble first), and one E8M0 scale
//! byte (`2^(s - 127)`). Safetensors checkpoints store a tensor `[.., rows, cols]` as
//! `NAME_blocks` (`[.., rows, cols / 32, 16]`, u8) and `NAME_scales` (`[.., rows, cols / 32]`).
//! llama.cpp's GGUF files store them as ggml's MXFP4 blocks ([`dequantize_ggml`]). On a GPU in
//! f16/bf16, pagewise keeps them as they are ([`Mxfp4Host`], uploaded as the expert kernels'
//! `Mxfp4Stack`: 4.25 bits a weight); elsewhere it dequantizes them at load to the model dtype.

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};
use std::ops::Range;
use std::path::PathBuf;

use candle_core::{DType, Device, Tensor};

use super::ModelError;
use super::weights::Weights;

/// The FP4 (E2M1) code points.
const FP4: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

/// Bytes of one of ggml's MXFP4 blocks (32 values).
pub const GGML_BLOCK_BYTES: usize = 17;

/// The values of ggml's MXFP4 blocks (`GGML_BLOCK_BYTES` each: the E8M0 scale, then 16 bytes
/// whose low nibbles are the block's values 0..16 and high nibbles its values 16..32), appended
/// to `out`. (Safetensors checkpoints pair the codes differently: [`dequantize`].)
pub fn dequantize_ggml(blocks: &[u8], out: &mut Vec<f32>) {
    for block in blocks.chunks_exact(GGML_BLOCK_BYTES) {
        let scale = 2f32.powi(i32::from(block[0]) - 127);
        let codes = &block[1..];
        let value = |code: u8| FP4[usize::from(code)] * scale;
        out.extend(codes.iter().map(|&b| value(b & 15)));
        out.extend(codes.iter().map(|&b| value(b >> 4)));
    }
}

/// Appends the values of `blocks` (16 bytes a block) scaled by their `scales` to `out`.
pub fn dequantize(blocks: &[u8], scales: &[u8], out: &mut Vec<f32>) {
    for (block, &scale) in blocks.chunks_exact(16).zip(scales) {
        let s = 2f32.powi(i32::from(scale) - 127);
        for &b in block {
            out.push(FP4[usize::from(b & 15)] * s);
            out.push(FP4[usize::from(b >> 4)] * s);
        }
    }
}

/// The stacked MXFP4 tensor `name` (`name_blocks` and `name_scales`) of `experts` matrices
/// `[rows, cols]` as they are, when the weights are safetensors that hold it; `None` otherwise.
pub fn safetensors_host(
    w: &Weights,
    name: &str,
    experts: usize,
    (rows, cols): (usize, usize),
) -> Result<Option<Mxfp4Host>, ModelError> {
    let Weights::Safetensors { files, .. } = w else {
        return Ok(None);
    };
    let (blocks_name, scales_name) = (format!("{name}_blocks"), format!("{name}_scales"));
    let (Ok(blocks), Ok(scales)) = (files.get(&blocks_name), files.get(&scales_name)) else {
        return Ok(None);
    };
    let groups = cols / 32;
    if !cols.is_multiple_of(32)
        || blocks.shape() != [experts, rows, groups, 16]
        || scales.shape() != [experts, rows, groups]
    {
        return Err(ModelError::Config(format!(
            "MXFP4 {name}: blocks {:?} and scales {:?} for {experts} experts of [{rows}, {cols}]",
            blocks.shape(),
            scales.shape()
        )));
    }
    Ok(Some(Mxfp4Host {
        codes: blocks.data().to_vec(),
        scales: scales.data().to_vec(),
        dims: (experts, rows, cols),
    }))
}

/// The stacked MXFP4 tensor `name` of `experts` matrices `[rows, cols]`, one tensor per expert in
/// the model dtype, when the weights are safetensors that hold it; `None` otherwise.
pub fn experts(
    w: &Weights,
    name: &str,
    experts: usize,
    dims: (usize, usize),
) -> Result<Option<Vec<Tensor>>, ModelError> {
    let Some(host) = safetensors_host(w, name, experts, dims)? else {
        return Ok(None);
    };
    (0..experts)
        .map(|e| {
            Ok(
                Tensor::from_vec(host.dequantize_expert(e), dims, &Device::Cpu)?
                    .to_dtype(w.dtype())?
                    .to_device(w.device())?,
            )
        })
        .collect::<Result<Vec<_>, ModelError>>()
        .map(Some)
}

/// A GGUF tensor's ggml blocks, read from the file, and its shape.
type Blocks<'a> = (Vec<u8>, &'a [usize]);

/// The MXFP4 tensors of a GGUF file (ggml's blocks), each read from the file when the model asks
/// for it: loading then holds one layer's experts on the host at a time, not all of them
/// (gpt-oss-120b's are 61 GB).
#[derive(Debug, Default)]
pub struct GgufMxfp4 {
    path: PathBuf,
    /// By GGUF name: the shape (outermost first) and the absolute offset of the blocks.
    tensors: HashMap<String, (Vec<usize>, u64)>,
}

impl GgufMxfp4 {
    /// The tensors `tensors` (shape, offset from `data_offset`) of the GGUF file at `path`.
    pub fn new(
        path: PathBuf,
        data_offset: u64,
        tensors: &HashMap<String, (Vec<usize>, u64)>,
    ) -> Self {
        let tensors = tensors
            .iter()
            .map(|(name, (dims, offset))| (name.clone(), (dims.clone(), data_offset + offset)))
            .collect();
        GgufMxfp4 { path, tensors }
    }

    /// Whether `name` (a GGUF name) is one of the file's MXFP4 tensors.
    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// The values of all the tensors.
    pub fn num_params(&self) -> usize {
        self.tensors
            .values()
            .map(|(d, _)| d.iter().product::<usize>())
            .sum()
    }

    /// Tensor `name`'s blocks and shape, read from the file; `None` when it is not MXFP4.
    fn blocks(&self, name: &str) -> Result<Option<Blocks<'_>>, ModelError> {
        let Some((dims, offset)) = self.tensors.get(name) else {
            return Ok(None);
        };
        if dims.last().is_none_or(|d| d % 32 != 0) {
            return Err(ModelError::Config(format!(
                "MXFP4 tensor {name} {dims:?}: rows of whole 32-value blocks"
            )));
        }
        let values: usize = dims.iter().product();
        let mut bytes = vec![0u8; values / 32 * GGML_BLOCK_BYTES];
        std::fs::File::open(&self.path)
            .and_then(|mut f| {
                f.seek(SeekFrom::Start(*offset))?;
                f.read_exact(&mut bytes)
            })
            .map_err(|e| {
                ModelError::Config(format!(
                    "MXFP4 tensor {name} of {}: {e}",
                    self.path.display()
                ))
            })?;
        Ok(Some((bytes, dims)))
    }

    /// Tensor `name`, a stack of matrices (`[experts, rows, cols]`; a 2-D tensor is one
    /// matrix), as it is; `None` when it is not MXFP4.
    pub fn host(&self, name: &str) -> Result<Option<Mxfp4Host>, ModelError> {
        let Some((bytes, dims)) = self.blocks(name)? else {
            return Ok(None);
        };
        let stack = match *dims {
            [n, rows, cols] => (n, rows, cols),
            [rows, cols] => (1, rows, cols),
            _ => {
                return Err(ModelError::Config(format!(
                    "MXFP4 tensor {name} {dims:?}: not a stack of matrices"
                )));
            }
        };
        Ok(Some(Mxfp4Host::from_ggml(&bytes, stack)))
    }

    /// Tensor `name` dequantized to `dtype` on `device`; `None` when it is not MXFP4.
    pub fn dequantized(
        &self,
        name: &str,
        dtype: DType,
        device: &Device,
    ) -> Result<Option<Tensor>, ModelError> {
        let Some((bytes, dims)) = self.blocks(name)? else {
            return Ok(None);
        };
        let mut values = Vec::with_capacity(dims.iter().product());
        dequantize_ggml(&bytes, &mut values);
        drop(bytes);
        let t = Tensor::from_vec(values, dims, &Device::Cpu)?;
        Ok(Some(t.to_dtype(dtype)?.to_device(device)?))
    }
}

/// Stacked MXFP4 matrices on the host, in the layout the GPU kernels read: `codes`
/// `[experts, rows, cols / 2]` (a row's values 2i and 2i + 1 in byte i's low and high nibble, as
/// safetensors checkpoints pair them) and `scales` `[experts, rows, cols / 32]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Mxfp4Host {
    pub codes: Vec<u8>,
    pub scales: Vec<u8>,
    /// `(experts, rows, cols)`.
    pub dims: (usize, usize, usize),
}

impl Mxfp4Host {
    /// From ggml's MXFP4 blocks of `dims` (in row order), whose codes are paired otherwise
    /// (low nibbles the block's values 0..16, high nibbles 16..32).
    pub fn from_ggml(blocks: &[u8], dims: (usize, usize, usize)) -> Mxfp4Host {
        let runs = blocks.len() / GGML_BLOCK_BYTES;
        let mut codes = Vec::with_capacity(runs * 16);
        let mut scales = Vec::with_capacity(runs);
        for block in blocks.chunks_exact(GGML_BLOCK_BYTES) {
            scales.push(block[0]);
            let value = |v: usize| match v < 16 {
                true => block[1 + v] & 15,
                false => block[1 + v - 16] >> 4,
            };
            codes.extend((0..16).map(|i| value(2 * i) | (value(2 * i + 1) << 4)));
        }
        Mxfp4Host {
            codes,
            scales,
            dims,
        }
    }

    /// Random codes and scales (2^-7 to 2^-4: weights up to 0.375) of `dims`, from `seed`: the
    /// dummy weights of a checkpoint that ships MXFP4.
    pub fn random(dims: (usize, usize, usize), seed: u64) -> Mxfp4Host {
        let (n, rows, cols) = dims;
        let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let codes = (0..n * rows * cols / 16)
            .flat_map(|_| next().to_le_bytes())
            .collect();
        let scales = (0..n * rows * cols / 32)
            .map(|_| 120 + (next() % 4) as u8)
            .collect();
        Mxfp4Host {
            codes,
            scales,
            dims,
        }
    }

    /// Each matrix's `rows` rows, row `r` being old row `from(r)`.
    fn rows_from(&self, rows: usize, from: impl Fn(usize) -> usize) -> Mxfp4Host {
        let (n, old_rows, cols) = self.dims;
        let (cb, sb) = (cols / 2, cols / 32);
        let mut out = Mxfp4Host {
            codes: Vec::with_capacity(n * rows * cb),
            scales: Vec::with_capacity(n * rows * sb),
            dims: (n, rows, cols),
        };
        for e in 0..n {
            for r in 0..rows {
                let src = e * old_rows + from(r);
                out.codes
                    .extend_from_slice(&self.codes[src * cb..(src + 1) * cb]);
                out.scales
                    .extend_from_slice(&self.scales[src * sb..(src + 1) * sb]);
            }
        }
        out
    }

    /// Rows interleaved gate, up, gate, up (gpt-oss's checkpoints) as the gate rows, then the up
    /// rows.
    pub fn halves_from_interleaved(&self) -> Mxfp4Host {
        let half = self.dims.1 / 2;
        self.rows_from(2 * half, |r| match r < half {
            true => 2 * r,
            false => 2 * (r - half) + 1,
        })
    }

    /// A tensor-parallel rank's part of a gate/up stack (gate rows, then as many up rows): the
    /// rows `part` of each half.
    pub fn halves_part(&self, part: &Range<usize>) -> Mxfp4Host {
        let (half, len) = (self.dims.1 / 2, part.len());
        self.rows_from(2 * len, |r| match r < len {
            true => part.start + r,
            false => half + part.start + r - len,
        })
    }

    /// Matrices (experts) `part` of the stack.
    pub fn experts_part(&self, part: &Range<usize>) -> Mxfp4Host {
        let (n, rows, cols) = self.dims;
        assert!(part.end <= n);
        let (cb, sb) = (rows * cols / 2, rows * cols / 32);
        Mxfp4Host {
            codes: self.codes[part.start * cb..part.end * cb].to_vec(),
            scales: self.scales[part.start * sb..part.end * sb].to_vec(),
            dims: (part.len(), rows, cols),
        }
    }

    /// Columns `part` of each matrix (whole runs: `part` starts and ends at multiples of 32).
    pub fn cols_part(&self, part: &Range<usize>) -> Mxfp4Host {
        let (n, rows, cols) = self.dims;
        assert!(part.start.is_multiple_of(32) && part.len().is_multiple_of(32) && part.end <= cols);
        let (cb, sb) = (cols / 2, cols / 32);
        let mut out = Mxfp4Host {
            codes: Vec::with_capacity(n * rows * part.len() / 2),
            scales: Vec::with_capacity(n * rows * part.len() / 32),
            dims: (n, rows, part.len()),
        };
        for r in 0..n * rows {
            out.codes
                .extend_from_slice(&self.codes[r * cb + part.start / 2..r * cb + part.end / 2]);
            out.scales
                .extend_from_slice(&self.scales[r * sb + part.start / 32..r * sb + part.end / 32]);
        }
        out
    }

    /// Each matrix of `a` with the same matrix of `b` below it (the same experts and columns).
    pub fn stack_rows(a: &Mxfp4Host, b: &Mxfp4Host) -> Mxfp4Host {
        let ((n, ra, cols), (_, rb, _)) = (a.dims, b.dims);
        let (cb, sb) = (cols / 2, cols / 32);
        let mut out = Mxfp4Host {
            codes: Vec::with_capacity(a.codes.len() + b.codes.len()),
            scales: Vec::with_capacity(a.scales.len() + b.scales.len()),
            dims: (n, ra + rb, cols),
        };
        for e in 0..n {
            out.codes
                .extend_from_slice(&a.codes[e * ra * cb..(e + 1) * ra * cb]);
            out.codes
                .extend_from_slice(&b.codes[e * rb * cb..(e + 1) * rb * cb]);
            out.scales
                .extend_from_slice(&a.scales[e * ra * sb..(e + 1) * ra * sb]);
            out.scales
                .extend_from_slice(&b.scales[e * rb * sb..(e + 1) * rb * sb]);
        }
        out
    }

    /// Matrix `e`'s values `[rows, cols]`.
    pub fn dequantize_expert(&self, e: usize) -> Vec<f32> {
        let (_, rows, cols) = self.dims;
        let (per_c, per_s) = (rows * cols / 2, rows * cols / 32);
        let mut out = Vec::with_capacity(rows * cols);
        dequantize(
            &self.codes[e * per_c..(e + 1) * per_c],
            &self.scales[e * per_s..(e + 1) * per_s],
            &mut out,
        );
        out
    }
}

#[cfg(test)]
#[path = "tests_mxfp4.rs"]
mod tests;
