//! The tokenizer of a GGUF file, rebuilt from `tokenizer.ggml.*` as a Hugging Face tokenizer:
//! byte-level BPE (`gpt2`: Llama 3, Qwen, SmolLM2, Phi-4) from its merges, and SentencePiece BPE
//! (`llama`: Llama 2, Mistral, Phi-3, Gemma) from its pieces' scores.

use candle_core::quantized::gguf_file::Content;
use serde_json::{Value, json};
use tokenizers::Tokenizer;

use super::LoadError;
use super::gguf::{md, md_strings, md_u32};

/// llama.cpp's token types.
const NORMAL: i64 = 1;
const UNKNOWN: i64 = 2;
const CONTROL: i64 = 3;
const USER_DEFINED: i64 = 4;

/// SentencePiece's whitespace mark.
const SPACE: &str = "\u{2581}";

/// The tokenizer of `ct`, whose vocabulary is `tokens`.
pub(super) fn tokenizer_from_gguf(ct: &Content, tokens: &[String]) -> Result<Tokenizer, LoadError> {
    let model = md(ct, "tokenizer.ggml.model")?
        .to_string()
        .map_err(|e| LoadError::Format(e.to_string()))?;
    let types: Vec<i64> = match ct.metadata.get("tokenizer.ggml.token_type") {
        Some(v) => v
            .to_vec()
            .map_err(|e| LoadError::Format(e.to_string()))?
            .iter()
            .map(|t| t.to_i32().map(i64::from).unwrap_or(NORMAL))
            .collect(),
        None => vec![NORMAL; tokens.len()],
    };
    if types.len() != tokens.len() {
        return Err(LoadError::Format(format!(
            "GGUF tokenizer: {} token types for {} tokens",
            types.len(),
            tokens.len()
        )));
    }
    let (pre_tokenizer, normalizer, decoder, model) = match model.as_str() {
        "gpt2" => byte_level_bpe(ct, tokens)?,
        "llama" => sentencepiece_bpe(ct, tokens, &types)?,
        other => {
            return Err(LoadError::Format(format!(
                "GGUF tokenizer model {other:?} is not supported (supported: gpt2 byte-level \
                 BPE, llama SentencePiece BPE)"
            )));
        }
    };
    // Control (3) and user-defined (4) tokens are matched whole, and SentencePiece's unknown
    // piece; control and unknown tokens are special.
    let added: Vec<Value> = types
        .iter()
        .enumerate()
        .filter(|&(_, &t)| t == CONTROL || t == USER_DEFINED || t == UNKNOWN)
        .map(|(i, &t)| {
            json!({"id": i, "content": tokens[i], "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": t != USER_DEFINED})
        })
        .collect();
    let flag = |key: &str| {
        ct.metadata
            .get(key)
            .and_then(|v| v.to_bool().ok())
            .unwrap_or(false)
    };
    let bos = md_u32(ct, "tokenizer.ggml.bos_token_id").ok();
    let post_processor = match (flag("tokenizer.ggml.add_bos_token"), bos) {
        (true, Some(id)) if (id as usize) < tokens.len() => {
            let bos = &tokens[id as usize];
            json!({"type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                         {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {bos: {"id": bos, "ids": [id], "tokens": [bos]}}})
        }
        _ => Value::Null,
    };
    let spec = json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": added,
        "normalizer": normalizer,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": post_processor,
        "decoder": decoder,
        "model": model,
    });
    Tokenizer::from_bytes(spec.to_string())
        .map_err(|e| LoadError::Format(format!("GGUF tokenizer: {e}")))
}

/// Every token as the BPE model's vocabulary (token → id).
fn vocab(tokens: &[String]) -> serde_json::Map<String, Value> {
    tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), json!(i)))
        .collect()
}

/// The (pre-tokenizer, normalizer, decoder, model) of a byte-level BPE (`gpt2`).
fn byte_level_bpe(
    ct: &Content,
    tokens: &[String],
) -> Result<(Value, Value, Value, Value), LoadError> {
    // (A vocabulary of bytes alone has no merges; writers then leave the key out.)
    let merges = match ct.metadata.get("tokenizer.ggml.merges") {
        Some(_) => md_strings(ct, "tokenizer.ggml.merges")?,
        None => Vec::new(),
    };
    let pre = ct
        .metadata
        .get("tokenizer.ggml.pre")
        .and_then(|v| v.to_string().ok().cloned())
        .unwrap_or_default();
    Ok((
        pre_tokenizer(&pre),
        Value::Null,
        json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}),
        json!({"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
               "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
               "ignore_merges": false, "vocab": vocab(tokens), "merges": merges}),
    ))
}

/// The pre-tokenizer llama.cpp's `tokenizer.ggml.pre` names, in tokenizers' JSON form.
fn pre_tokenizer(pre: &str) -> Value {
    const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    const QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    let byte_level = |use_regex: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex});
    let split = |regex: &str| json!({"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": false});
    match pre {
        "smollm" => json!({"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true}, byte_level(true)]}),
        "llama-bpe" | "llama3" | "smaug-bpe" => {
            json!({"type": "Sequence", "pretokenizers": [split(LLAMA3), byte_level(false)]})
        }
        "qwen2" => json!({"type": "Sequence", "pretokenizers": [split(QWEN2), byte_level(false)]}),
        _ => byte_level(true),
    }
}

/// The (pre-tokenizer, normalizer, decoder, model) of a SentencePiece BPE vocabulary (`llama`):
/// spaces become `▁` (with one in front of each run of text between special tokens unless
/// `add_space_prefix` is false, as llama.cpp and transformers' legacy normalizer add it), then
/// BPE whose merges rank by the merged piece's score, highest first: what SentencePiece's and
/// llama.cpp's greedy merging of the best-scoring adjacent pair computes. Characters outside the
/// vocabulary fall back to the `<0xNN>` byte pieces.
fn sentencepiece_bpe(
    ct: &Content,
    tokens: &[String],
    types: &[i64],
) -> Result<(Value, Value, Value, Value), LoadError> {
    let bad =
        |e: candle_core::Error| LoadError::Format(format!("GGUF `tokenizer.ggml.scores`: {e}"));
    let scores: Vec<f32> = md(ct, "tokenizer.ggml.scores")?
        .to_vec()
        .map_err(bad)?
        .iter()
        .map(|v| v.to_f32().map_err(bad))
        .collect::<Result<_, _>>()?;
    if scores.len() != tokens.len() {
        return Err(LoadError::Format(format!(
            "GGUF tokenizer: {} scores for {} tokens",
            scores.len(),
            tokens.len()
        )));
    }
    let merges = merges_by_score(tokens, types, &scores);
    let prefix = ct
        .metadata
        .get("tokenizer.ggml.add_space_prefix")
        .and_then(|v| v.to_bool().ok())
        .unwrap_or(true);
    let mut normalizers =
        vec![json!({"type": "Replace", "pattern": {"String": " "}, "content": SPACE})];
    let mut decoders = vec![
        json!({"type": "Replace", "pattern": {"String": SPACE}, "content": " "}),
        json!({"type": "ByteFallback"}),
        json!({"type": "Fuse"}),
    ];
    if prefix {
        normalizers.insert(0, json!({"type": "Prepend", "prepend": SPACE}));
        decoders.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
    }
    let unk = md_u32(ct, "tokenizer.ggml.unknown_token_id")
        .ok()
        .and_then(|id| tokens.get(id as usize))
        .or_else(|| types.iter().position(|&t| t == UNKNOWN).map(|i| &tokens[i]));
    Ok((
        Value::Null,
        json!({"type": "Sequence", "normalizers": normalizers}),
        json!({"type": "Sequence", "decoders": decoders}),
        json!({"type": "BPE", "dropout": null, "unk_token": unk, "continuing_subword_prefix": null,
               "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true,
               "ignore_merges": false, "vocab": vocab(tokens), "merges": merges}),
    ))
}

/// Every split of each normal piece into two normal pieces, as BPE merges ranked by the whole
/// piece's score (highest first; ties by id).
fn merges_by_score(tokens: &[String], types: &[i64], scores: &[f32]) -> Vec<(String, String)> {
    let normal: std::collections::HashMap<&str, usize> = tokens
        .iter()
        .enumerate()
        .filter(|&(i, _)| types[i] == NORMAL)
        .map(|(i, t)| (t.as_str(), i))
        .collect();
    let mut ranked: Vec<(f32, usize, &str, &str)> = Vec::new();
    for (&piece, &id) in &normal {
        for (at, _) in piece.char_indices().skip(1) {
            let (left, right) = piece.split_at(at);
            if normal.contains_key(left) && normal.contains_key(right) {
                ranked.push((scores[id], id, left, right));
            }
        }
    }
    ranked.sort_by(|a, b| {
        b.0.total_cmp(&a.0)
            .then(a.1.cmp(&b.1))
            .then(a.2.len().cmp(&b.2.len()))
    });
    ranked
        .into_iter()
        .map(|(_, _, l, r)| (l.to_string(), r.to_string()))
        .collect()
}
