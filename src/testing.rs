//! Helpers for tests and benchmarks that need real components without downloading anything.

use serde_json::json;
use tokenizers::Tokenizer;

/// GPT-2's printable stand-in character for each byte, as byte-level BPE vocabularies spell them.
fn byte_to_char(b: u8) -> char {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    if printable(b) {
        char::from(b)
    } else {
        let rank = (0..b).filter(|&x| !printable(x)).count() as u32;
        char::from_u32(256 + rank).expect("valid code point")
    }
}

/// A real byte-level BPE tokenizer (GPT-2 style pre-tokenizer and decoder) over the 256 bytes plus
/// the given merges, with `<eos>` as a special token after them. Every byte is a token, so any text
/// round-trips and multi-byte characters split across tokens unless merged.
pub fn byte_level_tokenizer(merges: &[(&str, &str)]) -> Tokenizer {
    let mut vocab = serde_json::Map::new();
    for b in 0..=255u8 {
        vocab.insert(byte_to_char(b).to_string(), json!(b));
    }
    let mut next = 256u32;
    for (a, b) in merges {
        vocab.insert(format!("{a}{b}"), json!(next));
        next += 1;
    }
    let merges: Vec<String> = merges.iter().map(|(a, b)| format!("{a} {b}")).collect();
    let byte_level = json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true});
    let spec = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [{"id": next, "content": "<eos>", "single_word": false, "lstrip": false,
                          "rstrip": false, "normalized": false, "special": true}],
        "normalizer": null,
        "pre_tokenizer": byte_level,
        "post_processor": null,
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "vocab": vocab, "merges": merges}
    });
    Tokenizer::from_bytes(spec.to_string()).expect("a well-formed tokenizer spec")
}
