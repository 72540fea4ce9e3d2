//! Tool calls out of a model's text, in the formats of vLLM's `--tool-call-parser` names. The
//! text is what the client would otherwise get (special tokens skipped). A parse failure is never
//! an error: the text comes back as content.

use serde_json::Value;

use super::super::harmony;

/// A tool-call format (vLLM's parser names).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ToolParser {
    /// Hermes / Qwen2.5 / Qwen3: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`,
    /// one block per call, after any content.
    Hermes,
    /// Llama 3.1 / 3.2 JSON calls: the whole answer is `{"name": ..., "parameters": {...}}`
    /// (after `<|python_tag|>` when the template asks for it), several separated by `;`.
    #[value(name = "llama3_json")]
    Llama3Json,
    /// Mistral: `[TOOL_CALLS]` then a JSON list of `{"name": ..., "arguments": {...}}`.
    Mistral,
    /// gpt-oss: harmony messages to `functions.NAME` (`super::super::harmony`). Needs
    /// `--reasoning-parser openai_gptoss`, which reads the format and keeps the calls for it.
    Openai,
}

/// One call found in the text: the function's name and its arguments as JSON text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParsedCall {
    /// The function.
    pub name: String,
    /// Its arguments, a JSON object serialized.
    pub arguments: String,
}

/// Content and calls of one answer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Parsed {
    /// Text outside the calls (`None` when there is none).
    pub content: Option<String>,
    /// The calls, in order.
    pub calls: Vec<ParsedCall>,
}

impl Parsed {
    fn text(text: &str) -> Parsed {
        Parsed {
            content: Some(text.to_string()).filter(|t| !t.is_empty()),
            calls: Vec::new(),
        }
    }
}

const HERMES_OPEN: &str = "<tool_call>";
const HERMES_CLOSE: &str = "</tool_call>";
const MISTRAL_MARK: &str = "[TOOL_CALLS]";
const PYTHON_TAG: &str = "<|python_tag|>";

impl ToolParser {
    /// Where the calls of `text` begin, as far as this prefix tells: `Some(i)` once a call has
    /// started at byte `i`, `None` while `text` is plain content so far. Streaming holds back
    /// what may still turn out to start a call ([`ToolParser::undecided_tail`]).
    pub fn call_start(self, text: &str) -> Option<usize> {
        match self {
            ToolParser::Hermes => text.find(HERMES_OPEN),
            ToolParser::Openai => text.find(harmony::CALL_OPEN),
            ToolParser::Llama3Json => {
                let start = text.len() - text.trim_start().len();
                let rest = &text[start..];
                (rest.starts_with('{') || rest.starts_with(PYTHON_TAG)).then_some(start)
            }
            ToolParser::Mistral => text.find(MISTRAL_MARK).or_else(|| {
                let start = text.len() - text.trim_start().len();
                text[start..].starts_with("[{").then_some(start)
            }),
        }
    }

    /// How many trailing bytes of `text` (which has no call yet) might begin one, and must wait
    /// for more text before they go out as content.
    pub fn undecided_tail(self, text: &str) -> usize {
        match self {
            ToolParser::Hermes => partial_suffix(text, HERMES_OPEN),
            ToolParser::Openai => partial_suffix(text, harmony::CALL_OPEN),
            ToolParser::Mistral if text.trim().is_empty() => text.len(),
            ToolParser::Mistral if text.trim_start() == "[" => text.len(),
            ToolParser::Mistral => partial_suffix(text, MISTRAL_MARK),
            // Only the answer's start decides: leading whitespace waits.
            ToolParser::Llama3Json if text.trim().is_empty() => text.len(),
            ToolParser::Llama3Json => 0,
        }
    }

    /// The content and calls of a whole answer.
    pub fn parse(self, text: &str) -> Parsed {
        let Some(start) = self.call_start(text) else {
            return Parsed::text(text);
        };
        let calls = match self {
            ToolParser::Openai => {
                // (Preambles between calls are content too.)
                let (calls, between) = harmony::calls(&text[start..]);
                let before = text[..start].trim_end();
                let content = [before, between.as_deref().unwrap_or("")]
                    .into_iter()
                    .filter(|c| !c.is_empty())
                    .collect::<Vec<_>>()
                    .join("\n\n");
                return Parsed {
                    content: Some(content).filter(|c| !c.is_empty()),
                    calls,
                };
            }
            ToolParser::Hermes => hermes_calls(&text[start..]),
            ToolParser::Llama3Json => llama3_calls(&text[start..]),
            ToolParser::Mistral => mistral_calls(&text[start..]),
        };
        match calls {
            Some(calls) if !calls.is_empty() => Parsed {
                content: Some(text[..start].trim_end().to_string()).filter(|c| !c.is_empty()),
                calls,
            },
            _ => Parsed::text(text),
        }
    }
}

/// The longest proper prefix of `marker` that `text` ends with, with the whitespace before it
/// (content before a call is trimmed at its end), in bytes.
fn partial_suffix(text: &str, marker: &str) -> usize {
    let k = (1..marker.len())
        .rev()
        .find(|&k| text.ends_with(&marker[..k]))
        .unwrap_or(0);
    let before = &text[..text.len() - k];
    k + before.len() - before.trim_end().len()
}

/// A call object: `name` and its arguments under `arguments` or `parameters` (an object, or a
/// string holding one).
fn call_of(v: &Value) -> Option<ParsedCall> {
    let name = v.get("name")?.as_str()?.to_string();
    let args = v.get("arguments").or_else(|| v.get("parameters"));
    let arguments = match args {
        None | Some(Value::Null) => "{}".to_string(),
        Some(Value::String(s)) => {
            serde_json::from_str::<Value>(s).ok()?;
            s.clone()
        }
        Some(obj @ Value::Object(_)) => obj.to_string(),
        Some(_) => return None,
    };
    Some(ParsedCall { name, arguments })
}

fn hermes_calls(text: &str) -> Option<Vec<ParsedCall>> {
    let mut calls = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find(HERMES_OPEN) {
        if !rest[..open].trim().is_empty() {
            return None; // text between calls: not a clean call block
        }
        let body = &rest[open + HERMES_OPEN.len()..];
        // A missing close tag on the last call (the answer ended) is tolerated.
        let (json, after) = match body.find(HERMES_CLOSE) {
            Some(close) => (&body[..close], &body[close + HERMES_CLOSE.len()..]),
            None => (body, ""),
        };
        calls.push(call_of(&serde_json::from_str(json.trim()).ok()?)?);
        rest = after;
    }
    rest.trim().is_empty().then_some(calls)
}

fn llama3_calls(text: &str) -> Option<Vec<ParsedCall>> {
    let text = text.trim();
    let mut text = text.strip_prefix(PYTHON_TAG).unwrap_or(text).trim_start();
    let mut calls = Vec::new();
    while !text.is_empty() {
        let mut values = serde_json::Deserializer::from_str(text).into_iter::<Value>();
        calls.push(call_of(&values.next()?.ok()?)?);
        // Calls are separated by `;`.
        let rest = text[values.byte_offset()..].trim_start();
        text = match rest.strip_prefix(';') {
            Some(after) => after.trim_start(),
            None if rest.is_empty() => rest,
            None => return None,
        };
    }
    Some(calls)
}

fn mistral_calls(text: &str) -> Option<Vec<ParsedCall>> {
    let text = text
        .trim()
        .strip_prefix(MISTRAL_MARK)
        .unwrap_or(text)
        .trim();
    let list: Vec<Value> = serde_json::from_str(text).ok()?;
    list.iter().map(call_of).collect()
}

#[cfg(test)]
mod tests;
