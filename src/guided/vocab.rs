//! The model's vocabulary as llguidance sees it: every token id with the bytes it stands for, in a
//! [`TokTrie`], built from our own `tokenizers::Tokenizer` (a `tokenizer.json`, or the one rebuilt
//! from a GGUF's metadata). This is our small adapter instead of `toktrie_hf_tokenizers`, which
//! would pull a second `tokenizers` version into the build.
//!
//! A token's bytes follow its decoder: byte-level BPE (GPT-2, Llama 3, Qwen, SmolLM) maps each
//! character back to the byte it encodes; byte-fallback vocabularies (Llama 2, Mistral, Gemma)
//! spell raw bytes as `<0xAB>` and a space as `▁`. Special tokens get toktrie's special marker, so
//! a grammar never produces them as text. Ids the model has beyond the tokenizer's vocabulary
//! (padded embedding rows) are special placeholders, never allowed.

use std::collections::HashMap;
use std::sync::Arc;

use tokenizers::Tokenizer;
use toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

/// How a vocabulary spells bytes, read off the tokenizer's decoder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Spelling {
    /// GPT-2's byte-to-character table.
    ByteLevel,
    /// `<0xAB>` byte tokens, `▁` for a space.
    ByteFallback,
}

/// The token table of one model: the trie llguidance walks, and the tokenizer for the rare case
/// where llguidance tokenizes text itself.
pub struct Vocab {
    trie: TokTrie,
    tokenizer: Arc<Tokenizer>,
    canonical: bool,
}

impl Vocab {
    /// The table of `tokenizer` padded to the model's `vocab_size` ids, with `eos_ids` (the
    /// model's end-of-sequence ids; the first is llguidance's EOS) ending a finished grammar.
    pub fn new(
        tokenizer: Arc<Tokenizer>,
        vocab_size: usize,
        eos_ids: &[u32],
    ) -> Result<Vocab, String> {
        let spelling = spelling(&tokenizer)?;
        let words = token_bytes(&tokenizer, vocab_size, spelling);
        let eos = *eos_ids
            .first()
            .ok_or("the model has no end-of-sequence token to end a constrained output")?;
        let info = TokRxInfo::new(vocab_size as u32, eos);
        let mut trie = TokTrie::from(&info, &words);
        if eos_ids.len() > 1 {
            trie = trie.with_eos_tokens(eos_ids);
        }
        Ok(Vocab {
            trie,
            tokenizer,
            canonical: spelling == Spelling::ByteLevel,
        })
    }

    /// As llguidance's shared tokenizer environment.
    pub fn into_env(self) -> TokEnv {
        Arc::new(self)
    }
}

impl TokenizerEnv for Vocab {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        if !self.canonical {
            return self.trie.greedy_tokenize(s);
        }
        self.trie.tokenize_with_greedy_fallback(s, |text| {
            self.tokenizer
                .encode(text, false)
                .map(|e| e.get_ids().to_vec())
                .unwrap_or_else(|_| self.trie.greedy_tokenize(text.as_bytes()))
        })
    }

    fn tokenize_is_canonical(&self) -> bool {
        self.canonical
    }
}

/// Which spelling the tokenizer's decoder undoes (found in its JSON form, which names each
/// decoder of a sequence by type).
fn spelling(tokenizer: &Tokenizer) -> Result<Spelling, String> {
    let decoder = serde_json::to_value(tokenizer.get_decoder()).unwrap_or_default();
    let text = decoder.to_string();
    if text.contains("\"ByteLevel\"") {
        Ok(Spelling::ByteLevel)
    } else if text.contains("\"ByteFallback\"") || text.contains("\"Metaspace\"") {
        Ok(Spelling::ByteFallback)
    } else {
        Err(format!(
            "constrained decoding needs a byte-level or byte-fallback tokenizer; this one's \
             decoder is {text}"
        ))
    }
}

/// The bytes of every id below `vocab_size`.
fn token_bytes(tokenizer: &Tokenizer, vocab_size: usize, spelling: Spelling) -> Vec<Vec<u8>> {
    let added = tokenizer.get_added_tokens_decoder();
    let chars = byte_level_chars();
    (0..vocab_size as u32)
        .map(|id| {
            if let Some(token) = added.get(&id) {
                return if token.special {
                    special(&token.content)
                } else {
                    token.content.as_bytes().to_vec()
                };
            }
            match tokenizer.id_to_token(id) {
                None => special(&format!("<[{id}]>")),
                Some(piece) => match spelling {
                    Spelling::ByteLevel => piece
                        .chars()
                        .map(|c| chars.get(&c).copied())
                        .collect::<Option<Vec<u8>>>()
                        // A piece outside the byte alphabet cannot be spelled: never allowed.
                        .unwrap_or_else(|| special(&piece)),
                    Spelling::ByteFallback => fallback_bytes(&piece),
                },
            }
        })
        .collect()
}

/// A special token's entry: toktrie's marker byte, then its name.
fn special(name: &str) -> Vec<u8> {
    let mut bytes = vec![TokTrie::SPECIAL_TOKEN_MARKER];
    bytes.extend_from_slice(name.as_bytes());
    bytes
}

/// A byte-fallback piece: `<0xAB>` is that byte; otherwise the text with `▁` as a space.
fn fallback_bytes(piece: &str) -> Vec<u8> {
    if let Some(hex) = piece
        .strip_prefix("<0x")
        .and_then(|rest| rest.strip_suffix('>'))
        .filter(|h| h.len() == 2)
        && let Ok(byte) = u8::from_str_radix(hex, 16)
    {
        return vec![byte];
    }
    piece.replace('\u{2581}', " ").into_bytes()
}

/// GPT-2's table from the characters of byte-level pieces to the bytes they encode: printable
/// Latin-1 bytes stand for themselves, the other 68 bytes are shifted to U+0100 and up in order.
fn byte_level_chars() -> HashMap<char, u8> {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut next = 0x100u32;
    (0..=255u8)
        .map(|b| {
            if printable(b) {
                (char::from(b), b)
            } else {
                let c = char::from_u32(next).expect("U+0100.. are characters");
                next += 1;
                (c, b)
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_level_table_covers_every_byte_once() {
        let table = byte_level_chars();
        assert_eq!(table.len(), 256);
        assert_eq!(table[&'Ġ'], b' ');
        assert_eq!(table[&'Ċ'], b'\n');
        assert_eq!(table[&'a'], b'a');
        let mut bytes: Vec<u8> = table.values().copied().collect();
        bytes.sort_unstable();
        bytes.dedup();
        assert_eq!(bytes.len(), 256);
    }

    #[test]
    fn fallback_pieces_spell_bytes_and_spaces() {
        assert_eq!(fallback_bytes("<0x0A>"), b"\n");
        assert_eq!(fallback_bytes("\u{2581}the"), b" the");
        assert_eq!(fallback_bytes("<0xZZ>"), b"<0xZZ>");
    }
}
