//! Tool calls in a streamed answer, as OpenAI streams them: the first delta of a call carries its
//! `index`, `id`, `type` and `function.name`, later deltas its `index` and `arguments` fragments.
//! Content before a call streams as it comes; the tail that may still begin a call waits.
//!
//! A named function streams its arguments as the model writes them. Parsed formats (`auto`) and
//! `required` lists are read whole: a call goes out when the answer ends, as one entry with its
//! name and arguments (a chunk holds at most one entry a call, as OpenAI and vLLM send them), and
//! text that turns out not to be a call goes out as content.

use serde_json::{Value, json};

use super::{ToolCalling, ToolMode};

/// What one choice's stream has become so far.
pub struct ToolStream {
    calling: ToolCalling,
    /// Text not sent yet: the undecided tail of content, or the calls being written.
    held: String,
    /// A call has started (everything from here on is calls).
    in_calls: bool,
    /// Calls sent.
    sent: usize,
}

impl ToolStream {
    /// The stream of one choice of a request calling tools as `calling`.
    pub fn new(calling: ToolCalling) -> Self {
        ToolStream {
            calling,
            held: String::new(),
            in_calls: false,
            sent: 0,
        }
    }

    /// Calls sent so far.
    pub fn num_calls(&self) -> usize {
        self.sent
    }

    /// The delta for newly generated `text`: `{"content": ...}` and/or `{"tool_calls": [...]}`,
    /// or `None` when everything is held back for now.
    pub fn push(&mut self, text: &str) -> Option<Value> {
        match self.calling.mode.clone() {
            ToolMode::Named(name) => {
                let mut call = json!({"index": 0, "function": {"arguments": text}});
                if self.sent == 0 {
                    self.sent = 1;
                    call["id"] = json!(super::super::generate::random_id("call_"));
                    call["type"] = json!("function");
                    call["function"]["name"] = json!(name);
                }
                Some(json!({"tool_calls": [call]}))
            }
            ToolMode::Required => {
                self.held.push_str(text);
                None
            }
            ToolMode::Auto(parser) => {
                self.held.push_str(text);
                if self.in_calls {
                    return None;
                }
                let out = match parser.call_start(&self.held) {
                    Some(start) => {
                        self.in_calls = true;
                        let content: String = self.held.drain(..start).collect();
                        content.trim_end().to_string()
                    }
                    None => {
                        let ready = self.held.len() - parser.undecided_tail(&self.held);
                        self.held.drain(..ready).collect()
                    }
                };
                (!out.is_empty()).then(|| json!({"content": out}))
            }
        }
    }

    /// The one delta for a token's `text` (and, on the answer's `last` token, what was held
    /// back): content and tool-call entries side by side, or `None` when all is held back.
    pub fn step(&mut self, text: &str, last: bool) -> Option<Value> {
        let mut parts: Vec<Value> = self.push(text).into_iter().collect();
        if last {
            parts.extend(self.finish());
        }
        let mut delta = json!({});
        for part in parts {
            if let Some(c) = part["content"].as_str() {
                let before = delta["content"].as_str().unwrap_or("").to_string();
                delta["content"] = json!(before + c);
            }
            if let Some(calls) = part["tool_calls"].as_array() {
                let all = delta["tool_calls"].as_array().cloned().unwrap_or_default();
                delta["tool_calls"] = json!([all, calls.clone()].concat());
            }
        }
        (delta != json!({})).then_some(delta)
    }

    /// The delta that ends the answer: what was held back, as calls if it reads as calls, else
    /// as content.
    pub fn finish(&mut self) -> Option<Value> {
        let held = std::mem::take(&mut self.held);
        if held.is_empty() {
            return None;
        }
        let parsed = self.calling.extract(&held);
        let mut delta = json!({});
        if let Some(content) = parsed.content {
            delta["content"] = json!(content);
        }
        if !parsed.calls.is_empty() {
            let mut calls = Vec::new();
            for call in parsed.calls {
                let index = self.sent;
                self.sent += 1;
                calls.push(json!({"index": index,
                    "id": super::super::generate::random_id("call_"), "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments}}));
            }
            delta["tool_calls"] = json!(calls);
        }
        Some(delta)
    }
}

#[cfg(test)]
mod tests {
    use super::super::ToolParser;
    use super::*;

    fn run(mode: ToolMode, pieces: &[&str]) -> (String, Vec<Value>) {
        let mut s = ToolStream::new(ToolCalling {
            mode,
            parallel: true,
        });
        let mut deltas: Vec<Value> = pieces.iter().filter_map(|p| s.push(p)).collect();
        deltas.extend(s.finish());
        let content: String = deltas
            .iter()
            .filter_map(|d| d["content"].as_str())
            .collect();
        let calls = deltas
            .iter()
            .filter_map(|d| d["tool_calls"].as_array())
            .flatten()
            .cloned()
            .collect();
        (content, calls)
    }

    /// Calls put back together as the OpenAI SDK does: by index, names and arguments appended.
    fn assemble(calls: &[Value]) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = Vec::new();
        for c in calls {
            let i = c["index"].as_u64().unwrap() as usize;
            if i == out.len() {
                assert!(c["id"].as_str().unwrap().starts_with("call_"), "{c}");
                assert_eq!(c["type"], "function");
                out.push((
                    c["function"]["name"].as_str().unwrap().into(),
                    String::new(),
                ));
            } else {
                assert!(
                    c.get("id").is_none(),
                    "only a call's first delta has its id"
                );
            }
            out[i]
                .1
                .push_str(c["function"]["arguments"].as_str().unwrap_or(""));
        }
        out
    }

    #[test]
    fn hermes_content_streams_and_calls_come_whole() {
        let pieces = [
            "Checking",
            " now. <tool",
            "_call>\n{\"name\": \"f\", ",
            "\"arguments\": {\"a\": 1}}\n</tool_call>",
        ];
        let (content, calls) = run(ToolMode::Auto(ToolParser::Hermes), &pieces);
        assert_eq!(content, "Checking now.");
        assert_eq!(assemble(&calls), vec![("f".into(), r#"{"a":1}"#.into())]);
        let (content, calls) = run(ToolMode::Auto(ToolParser::Hermes), &["a <tool", "box> b"]);
        assert_eq!((content.as_str(), calls.len()), ("a <toolbox> b", 0));
        // A broken call is content in the end.
        let (content, calls) = run(ToolMode::Auto(ToolParser::Hermes), &["<tool_call>{\"oops"]);
        assert_eq!((content.as_str(), calls.len()), ("<tool_call>{\"oops", 0));
    }

    #[test]
    fn a_chunk_holds_one_entry_a_call_and_cut_lists_still_call() {
        let mut s = ToolStream::new(ToolCalling {
            mode: ToolMode::Required,
            parallel: true,
        });
        assert!(
            s.step("[{\"name\": \"a\", \"parameters\": {}}, ", false)
                .is_none()
        );
        let d = s.step("{\"name\": \"b\", \"parameters\": {\"x\": 2}}]", true);
        let entries = d.unwrap()["tool_calls"].as_array().unwrap().clone();
        let indices: Vec<u64> = entries
            .iter()
            .map(|e| e["index"].as_u64().unwrap())
            .collect();
        assert_eq!(indices, vec![0, 1]);
        assert_eq!(entries[1]["function"]["name"], "b");
        assert_eq!(entries[1]["function"]["arguments"], r#"{"x":2}"#);

        // Cut short by max_tokens: the calls whose names are whole.
        let (content, calls) = run(
            ToolMode::Required,
            &["[{\"name\": \"a\", \"param", "eters\": {\"x\": [1"],
        );
        assert_eq!(content, "");
        assert_eq!(assemble(&calls), vec![("a".into(), r#"{"x": [1"#.into())]);
    }

    #[test]
    fn named_functions_stream_arguments_and_required_lists_come_whole() {
        let (content, calls) = run(
            ToolMode::Named("get".into()),
            &["{\"city\"", ": \"Paris\"}"],
        );
        assert_eq!(content, "");
        assert_eq!(
            assemble(&calls),
            vec![("get".into(), r#"{"city": "Paris"}"#.into())]
        );
        let list = [
            "[{\"name\": \"a\", \"parameters\": {}}, ",
            "{\"name\": \"b\", \"parameters\": {\"x\": 2}}]",
        ];
        let (_, calls) = run(ToolMode::Required, &list);
        assert_eq!(
            assemble(&calls),
            vec![("a".into(), "{}".into()), ("b".into(), r#"{"x":2}"#.into())]
        );
    }
}
