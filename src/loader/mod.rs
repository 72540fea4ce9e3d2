//! Turns a model name into configuration, tokenizer, chat template and weights: a local Hugging Face
//! directory, a single GGUF file (or a directory holding one), or `--load-format dummy` random weights
//! from `config.json` alone.

pub mod gguf;
mod gguf_file;
mod gguf_tokenizer;
pub mod hub;

use std::path::{Path, PathBuf};

use candle_core::{DType, Device};
use candle_nn::VarBuilder;
use tokenizers::Tokenizer;

use crate::model::checkpoint::Checkpoint;
use crate::model::config::ModelConfig;
use crate::model::quantized::CheckpointQuant;
use crate::model::weights::{DummyBackend, Weights};

/// Why a model could not be loaded. Messages name the file or key at fault.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// Nothing usable at the given name.
    #[error("{0}")]
    NotFound(String),
    /// A file could not be read.
    #[error("I/O error: {0}")]
    Io(String),
    /// A file is malformed or uses something unsupported.
    #[error("{0}")]
    Format(String),
    /// The configuration is unusable.
    #[error(transparent)]
    Model(#[from] crate::model::ModelError),
}

/// How to read weights (vLLM's `--load-format`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LoadFormat {
    /// GGUF for a `.gguf` file, safetensors for a directory.
    #[default]
    Auto,
    /// `*.safetensors` in a Hugging Face directory.
    Safetensors,
    /// One GGUF file.
    Gguf,
    /// Seeded random weights of the right shapes, from `config.json` alone.
    Dummy,
}

/// `--quantization`: how a 16-bit checkpoint's weights are quantized at load.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Quantization {
    /// FP8 (e4m3) weights with one scale per output channel, for every projection of the
    /// decoder layers (not the embedding, the LM head or a router); activations stay 16-bit.
    Fp8,
}

/// How GGUF matmul weights are used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GgufMatmul {
    /// Quantized, except on the CPU for the weight types our CPU kernels lack (they take Q4_0,
    /// Q4_1, Q5_0, Q5_1, Q8_0, Q2_K to Q6_K, IQ4_NL, IQ4_XS, and F16 / BF16 as they are): those
    /// are dequantized there when the model's float weights would take at most 4 GiB.
    #[default]
    Auto,
    /// Quantized matmuls: on the CPU our kernels, activations quantized to 8 bits on the fly
    /// (f32 for F16 / BF16 weights; candle's kernels for the types ours lack); on a GPU with
    /// f16 or bf16 activations our GEMVs over the codes of Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K,
    /// Q5_K and Q6_K (other types dequantized at load; experts, and f32 activations, on candle's
    /// quantized matmuls).
    Quantized,
    /// Weights dequantized at load; float matmuls.
    Dequantized,
}

/// Loading settings.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Weight format.
    pub load_format: LoadFormat,
    /// Dtype of dense weights and activations.
    pub dtype: DType,
    /// Where the weights go.
    pub device: Device,
    /// GGUF only: quantized or dequantized matmuls.
    pub gguf_matmul: GgufMatmul,
    /// Seed of `--load-format dummy` weights.
    pub seed: u64,
    /// Weights quantized at load (`--quantization`).
    pub quantization: Option<Quantization>,
}

/// A model ready to build: configuration, tokenizer, chat template and weights.
pub struct LoadedModel {
    /// The configuration (EOS ids merged from every source).
    pub config: ModelConfig,
    /// The tokenizer.
    pub tokenizer: Tokenizer,
    /// The chat template, if the model has one.
    pub chat_template: Option<String>,
    /// The weights.
    pub weights: Weights,
}

/// Loads `model`: a GGUF file, a directory (Hugging Face layout, or holding one GGUF file).
pub fn load(model: &str, opts: &LoadOptions) -> Result<LoadedModel, LoadError> {
    let path = Path::new(model);
    if path.is_file() {
        return load_gguf(path, opts);
    }
    if path.is_dir() {
        if path.join("config.json").is_file() && opts.load_format != LoadFormat::Gguf {
            return load_hf_dir(path, opts);
        }
        if let Some(file) = single_gguf(path)? {
            return load_gguf(&file, opts);
        }
        let has_weights = read_dir(path)?
            .iter()
            .any(|p| p.extension().is_some_and(|e| e == "safetensors"));
        return Err(LoadError::NotFound(match has_weights {
            true => format!(
                "{} has safetensors weights but no config.json: put the model's config.json \
                 (and tokenizer.json) beside them, or pass its Hugging Face id",
                path.display()
            ),
            false => format!(
                "{} has neither config.json nor a single .gguf file",
                path.display()
            ),
        }));
    }
    if hub::is_repo_id(model) {
        let dir = hub::resolve(model)?;
        return load_hf_dir(&dir, opts);
    }
    Err(LoadError::NotFound(format!(
        "model {model:?} is neither a local file or directory nor a Hugging Face repo id (org/name)"
    )))
}

/// Only the tokenizer of `model` (same forms as [`load`]), without loading weights.
pub fn load_tokenizer(model: &str) -> Result<Tokenizer, LoadError> {
    let path = Path::new(model);
    let dir = if path.is_file() {
        return gguf::load_tokenizer(path);
    } else if path.is_dir() {
        path.to_path_buf()
    } else if hub::is_repo_id(model) {
        hub::resolve(model)?
    } else {
        return Err(LoadError::NotFound(format!("no tokenizer at {model:?}")));
    };
    let file = dir.join("tokenizer.json");
    if file.is_file() {
        return Tokenizer::from_file(&file)
            .map_err(|e| LoadError::Format(format!("{}: {e}", file.display())));
    }
    match single_gguf(&dir)? {
        Some(g) => gguf::load_tokenizer(&g),
        None => Err(LoadError::NotFound(format!(
            "{} is missing",
            file.display()
        ))),
    }
}

fn single_gguf(dir: &Path) -> Result<Option<PathBuf>, LoadError> {
    let mut found: Vec<PathBuf> = read_dir(dir)?
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "gguf"))
        .collect();
    Ok(if found.len() == 1 { found.pop() } else { None })
}

fn read_dir(dir: &Path) -> Result<Vec<PathBuf>, LoadError> {
    let io = |e: std::io::Error| LoadError::Io(format!("{}: {e}", dir.display()));
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io)?
        .map(|e| e.map(|e| e.path()).map_err(io))
        .collect::<Result<_, _>>()?;
    out.sort();
    Ok(out)
}

fn load_gguf(path: &Path, opts: &LoadOptions) -> Result<LoadedModel, LoadError> {
    if !matches!(opts.load_format, LoadFormat::Auto | LoadFormat::Gguf) {
        return Err(LoadError::Format(format!(
            "{} is a GGUF file but --load-format is {:?}",
            path.display(),
            opts.load_format
        )));
    }
    if let Some(q) = opts.quantization {
        return Err(LoadError::Format(format!(
            "--quantization {q:?} quantizes a Hugging Face checkpoint at load; {} is a GGUF file,              whose weights are quantized already",
            path.display()
        )));
    }
    let m = gguf::load(path, &opts.device, opts.dtype, opts.gguf_matmul)?;
    Ok(LoadedModel {
        config: m.config,
        tokenizer: m.tokenizer,
        chat_template: m.chat_template,
        weights: m.weights,
    })
}

/// Whether `--quantization fp8` quantizes this checkpoint's projections at load: not for an FP8
/// checkpoint (already e4m3), refused for other quantized checkpoints and for mixtures of experts
/// (the grouped expert kernels read 16-bit weights).
fn quantize_fp8(config: &ModelConfig, opts: &LoadOptions) -> Result<bool, LoadError> {
    let Some(Quantization::Fp8) = opts.quantization else {
        return Ok(false);
    };
    match &config.quantization {
        Some(CheckpointQuant::Fp8(_)) => return Ok(false),
        Some(other) => {
            return Err(LoadError::Format(format!(
                "--quantization fp8 quantizes a 16-bit checkpoint; this one is quantized already \
                 ({}): leave --quantization out",
                other.describe()
            )));
        }
        None => {}
    }
    if config.moe.is_some() {
        return Err(LoadError::Format(
            "--quantization fp8 is not implemented for mixtures of experts yet (the expert \
             kernels read 16-bit weights); serve the model without it, or an FP8 checkpoint"
                .into(),
        ));
    }
    tracing::info!(
        "--quantization fp8: the decoder layers' projections quantized to e4m3 at load, one \
         scale per output channel; activations stay {:?}",
        opts.dtype
    );
    Ok(true)
}

fn read_text(path: &Path) -> Result<String, LoadError> {
    std::fs::read_to_string(path).map_err(|e| LoadError::Io(format!("{}: {e}", path.display())))
}

fn read_json(path: &Path) -> Result<Option<serde_json::Value>, LoadError> {
    if !path.is_file() {
        return Ok(None);
    }
    serde_json::from_str(&read_text(path)?)
        .map(Some)
        .map_err(|e| LoadError::Format(format!("{}: {e}", path.display())))
}

fn token_ids(v: Option<&serde_json::Value>) -> Vec<u32> {
    match v {
        Some(serde_json::Value::Number(n)) => {
            n.as_u64().map(|t| vec![t as u32]).unwrap_or_default()
        }
        Some(serde_json::Value::Array(a)) => a
            .iter()
            .filter_map(|x| x.as_u64())
            .map(|t| t as u32)
            .collect(),
        _ => Vec::new(),
    }
}

/// `chat_template` of tokenizer_config.json: a string, or a list of named templates.
fn chat_template(cfg: &serde_json::Value) -> Option<String> {
    match cfg.get("chat_template")? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Array(list) => list
            .iter()
            .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
            .or_else(|| list.first())
            .and_then(|t| t.get("template")?.as_str().map(str::to_string)),
        _ => None,
    }
}

fn load_hf_dir(dir: &Path, opts: &LoadOptions) -> Result<LoadedModel, LoadError> {
    let mut config = ModelConfig::from_hf_json(&read_text(&dir.join("config.json"))?)?;
    let tokenizer_path = dir.join("tokenizer.json");
    if !tokenizer_path.is_file() {
        return Err(LoadError::NotFound(format!(
            "{} is missing",
            tokenizer_path.display()
        )));
    }
    let tokenizer = Tokenizer::from_file(&tokenizer_path)
        .map_err(|e| LoadError::Format(format!("{}: {e}", tokenizer_path.display())))?;

    let tok_cfg = read_json(&dir.join("tokenizer_config.json"))?;
    let chat_template = tok_cfg.as_ref().and_then(chat_template);
    let mut eos = config.eos_token_ids.clone();
    if let Some(gen_cfg) = read_json(&dir.join("generation_config.json"))? {
        eos.extend(token_ids(gen_cfg.get("eos_token_id")));
    }
    let eos_token = tok_cfg
        .as_ref()
        .and_then(|c| c.get("eos_token"))
        .and_then(|t| match t {
            serde_json::Value::String(s) => Some(s.clone()),
            other => other.get("content")?.as_str().map(str::to_string),
        });
    if let Some(id) = eos_token.and_then(|t| tokenizer.token_to_id(&t)) {
        eos.push(id);
    }
    eos.sort_unstable();
    eos.dedup();
    config.eos_token_ids = eos;

    let quantize_fp8 = quantize_fp8(&config, opts)?;
    let weights = match opts.load_format {
        LoadFormat::Dummy => Weights::Dense {
            vb: VarBuilder::from_backend(
                Box::new(DummyBackend { seed: opts.seed }),
                opts.dtype,
                opts.device.clone(),
            ),
            quantize_fp8,
            dummy_int4: match &config.quantization {
                Some(CheckpointQuant::Int(q)) if q.bits == 4 => {
                    tracing::info!(
                        "{}: random 4-bit projections on a GPU with 16-bit activations (dense \
                         elsewhere)",
                        q.describe()
                    );
                    Some(q.group_size.unwrap_or(usize::MAX))
                }
                _ => None,
            },
        },
        LoadFormat::Auto | LoadFormat::Safetensors => {
            let paths = safetensors_files(dir)?;
            // SAFETY: the files are memory-mapped read-only; pagewise never writes them, and a
            // model directory being rewritten underneath a running server is outside our contract.
            let files = unsafe { Checkpoint::open(&paths) }
                .map_err(|e| LoadError::Format(format!("safetensors in {}: {e}", dir.display())))?;
            if let Some(quant) = &config.quantization {
                let kept = opts.device.is_cuda() && matches!(opts.dtype, DType::BF16 | DType::F16);
                let how = match (quant, kept) {
                    (CheckpointQuant::Fp8(_), true) => {
                        "FP8 projections kept in e4m3 on the GPU (experts dequantized)"
                    }
                    (CheckpointQuant::Int(q), true) if q.bits == 4 => {
                        "4-bit projections kept packed on the GPU (experts, desc_act orders, \
                         groups other than a power of two of at least 32, and scales f16 cannot \
                         hold dequantized)"
                    }
                    _ => "weights dequantized at load",
                };
                tracing::info!(
                    "{}: {how}, activations in {:?} (activation scales are not used)",
                    quant.describe(),
                    opts.dtype
                );
            }
            Weights::Safetensors {
                files,
                dtype: opts.dtype,
                device: opts.device.clone(),
                quantization: config.quantization.clone(),
                quantize_fp8,
            }
        }
        LoadFormat::Gguf => {
            return Err(LoadError::Format(format!(
                "--load-format gguf needs a .gguf file, {} is a Hugging Face directory",
                dir.display()
            )));
        }
    };
    Ok(LoadedModel {
        config,
        tokenizer,
        chat_template,
        weights,
    })
}

/// The safetensors shards: those named by `model.safetensors.index.json`, else every `*.safetensors`.
pub(crate) fn safetensors_files(dir: &Path) -> Result<Vec<PathBuf>, LoadError> {
    if let Some(index) = read_json(&dir.join("model.safetensors.index.json"))? {
        let map = index
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| {
                LoadError::Format("model.safetensors.index.json has no weight_map".into())
            })?;
        let mut files: Vec<PathBuf> = map
            .values()
            .filter_map(|v| v.as_str())
            .map(|f| dir.join(f))
            .collect();
        files.sort();
        files.dedup();
        if let Some(missing) = files.iter().find(|f| !f.is_file()) {
            return Err(LoadError::NotFound(format!(
                "{} is missing",
                missing.display()
            )));
        }
        return Ok(files);
    }
    let files: Vec<PathBuf> = read_dir(dir)?
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    if files.is_empty() {
        return Err(LoadError::NotFound(format!(
            "no *.safetensors weights in {} (use --load-format dummy for random weights)",
            dir.display()
        )));
    }
    Ok(files)
}
