//! A single GGUF file as a model: configuration, tokenizer and chat template from its metadata,
//! weights kept quantized (or dequantized at load on request).

use std::collections::HashMap;
use std::path::Path;
use std::time::Instant;

use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::{DType, Device};
use tokenizers::Tokenizer;

use super::gguf_file;
use super::gguf_tokenizer::tokenizer_from_gguf;
use super::{GgufMatmul, LoadError};
use crate::cpu::iq4::Iq4Type;
use crate::model::checkpoint::Progress;
use crate::model::config::ModelConfig;
use crate::model::gguf_config::GgufMeta;
use crate::model::gguf_weights::Iq4Tensor;
use crate::model::mxfp4::GgufMxfp4;
use crate::model::weights::{Dequantize, Weights};

/// What a GGUF file provides besides weights.
pub struct GgufModel {
    /// The model configuration.
    pub config: ModelConfig,
    /// The tokenizer rebuilt from `tokenizer.ggml.*`.
    pub tokenizer: Tokenizer,
    /// `tokenizer.chat_template`, if present.
    pub chat_template: Option<String>,
    /// The tensors.
    pub weights: Weights,
}

pub(super) fn md<'a>(ct: &'a Content, key: &str) -> Result<&'a Value, LoadError> {
    ct.metadata
        .get(key)
        .ok_or_else(|| LoadError::Format(format!("GGUF metadata has no `{key}`")))
}

pub(super) fn md_u32(ct: &Content, key: &str) -> Result<u32, LoadError> {
    let v = md(ct, key)?;
    v.to_u32()
        .or_else(|_| v.to_u64().map(|x| x as u32))
        .or_else(|_| v.to_i32().map(|x| x as u32))
        .map_err(|e| LoadError::Format(format!("GGUF `{key}`: {e}")))
}

pub(super) fn md_strings(ct: &Content, key: &str) -> Result<Vec<String>, LoadError> {
    let bad = |e: candle_core::Error| LoadError::Format(format!("GGUF `{key}`: {e}"));
    md(ct, key)?
        .to_vec()
        .map_err(bad)?
        .iter()
        .map(|v| v.to_string().cloned().map_err(bad))
        .collect()
}

/// Reads `path`; tensors go to `device`, dense ones (norms, embeddings) in `dtype`.
pub fn load(
    path: &Path,
    device: &Device,
    dtype: DType,
    matmul: GgufMatmul,
) -> Result<GgufModel, LoadError> {
    let io = |e: std::io::Error| LoadError::Io(format!("{}: {e}", path.display()));
    let mut file = std::io::BufReader::new(std::fs::File::open(path).map_err(io)?);
    let header = gguf_file::read(&mut file)
        .map_err(|e| LoadError::Format(format!("{}: {e}", path.display())))?;
    let ct = &header.content;
    let config = ModelConfig::from_gguf(&mut GgufMeta::new(ct, &mut file)?)?;
    let tokens = md_strings(ct, "tokenizer.ggml.tokens")?;
    let tokenizer = tokenizer_from_gguf(ct, &tokens)?;
    let chat_template = ct
        .metadata
        .get("tokenizer.chat_template")
        .and_then(|v| v.to_string().ok().cloned());

    let mxfp4 = GgufMxfp4::new(path.to_path_buf(), ct.tensor_data_offset, &header.mxfp4);
    let iq4 = read_iq4(&mut file, ct.tensor_data_offset, &header.iq4)
        .map_err(|e| LoadError::Format(format!("{}: {e}", path.display())))?;
    let num_params: usize = ct
        .tensor_infos
        .values()
        .map(|t| t.shape.elem_count())
        .sum::<usize>()
        + mxfp4.num_params()
        + iq4
            .values()
            .map(|t| t.dims.iter().product::<usize>())
            .sum::<usize>();
    let dequantize = match matmul {
        GgufMatmul::Quantized => Dequantize::Nothing,
        GgufMatmul::Dequantized => Dequantize::All,
        GgufMatmul::Auto if device.is_cpu() && num_params * 4 <= 4 << 30 => {
            Dequantize::WithoutCpuKernel
        }
        GgufMatmul::Auto => Dequantize::Nothing,
    };
    tracing::info!(num_params, ?dequantize, "GGUF weights");
    let tensor_bytes = ct
        .tensor_infos
        .values()
        .map(|t| {
            (t.shape.elem_count() / t.ggml_dtype.block_size() * t.ggml_dtype.type_size()) as u64
        })
        .sum();
    let progress = Progress::new(tensor_bytes);
    let mut tensors = HashMap::new();
    for name in ct.tensor_infos.keys() {
        let t = ct
            .tensor(&mut file, name, device)
            .map_err(|e| LoadError::Format(format!("GGUF tensor {name}: {e}")))?;
        if let Some(line) = progress.read(name, t.storage_size_in_bytes() as u64, Instant::now()) {
            tracing::info!("{line}");
        }
        tensors.insert(name.clone(), t);
    }
    // MXFP4 tensors (gpt-oss's experts) are read as the model asks for them, a layer at a time.
    Ok(GgufModel {
        config,
        tokenizer,
        chat_template,
        weights: Weights::Gguf {
            tensors,
            dtype,
            device: device.clone(),
            dequantize,
            mxfp4,
            iq4,
        },
    })
}

/// The IQ4 tensors `listed` (type, shape, offset from `data_offset`), read from `file`.
fn read_iq4(
    file: &mut (impl std::io::Read + std::io::Seek),
    data_offset: u64,
    listed: &HashMap<String, (Iq4Type, Vec<usize>, u64)>,
) -> Result<HashMap<String, Iq4Tensor>, String> {
    let mut out = HashMap::new();
    for (name, (ty, dims, offset)) in listed {
        let values: usize = dims.iter().product();
        let len = ty
            .bytes_of(values)
            .filter(|_| dims.last().is_some_and(|d| d % ty.block() == 0))
            .ok_or_else(|| {
                format!(
                    "{} tensor {name} {dims:?}: rows of whole {}-weight blocks",
                    ty.name(),
                    ty.block()
                )
            })?;
        let mut bytes = vec![0u8; len];
        file.seek(std::io::SeekFrom::Start(data_offset + offset))
            .and_then(|_| file.read_exact(&mut bytes))
            .map_err(|e| format!("{} tensor {name}: {e}", ty.name()))?;
        let (ty, dims) = (*ty, dims.clone());
        out.insert(name.clone(), Iq4Tensor { ty, dims, bytes });
    }
    Ok(out)
}

/// Only the tokenizer of a GGUF file (reads the metadata, not the tensors).
pub fn load_tokenizer(path: &Path) -> Result<Tokenizer, LoadError> {
    let io = |e: std::io::Error| LoadError::Io(format!("{}: {e}", path.display()));
    let mut file = std::io::BufReader::new(std::fs::File::open(path).map_err(io)?);
    let header = gguf_file::read(&mut file)
        .map_err(|e| LoadError::Format(format!("{}: {e}", path.display())))?;
    let tokens = md_strings(&header.content, "tokenizer.ggml.tokens")?;
    tokenizer_from_gguf(&header.content, &tokens)
}
