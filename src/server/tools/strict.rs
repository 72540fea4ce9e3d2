//! `strict: true` under `tool_choice: "auto"`: the model still decides between text and calls, but
//! a call it starts must be one of the tools with valid arguments. A Lark grammar (llguidance's
//! dialect, with `%json` for the calls) of the parser's own format says so: free text that does
//! not begin a call, or calls whose JSON follows the tools' schemas (a strict tool's parameters;
//! any object for the others).

use serde_json::{Value, json};

use super::{Function, ToolParser};

/// The grammar of an answer in `parser`'s format whose calls follow `functions`; `None` for
/// harmony (`openai`), whose calls sit among special tokens a grammar of text does not write:
/// there `strict` is not enforced.
pub fn grammar(parser: ToolParser, functions: &[Function], parallel: bool) -> Option<String> {
    // Hermes and Mistral calls name their arguments `arguments`; Llama 3's `parameters`.
    let key = match parser {
        ToolParser::Llama3Json => "parameters",
        ToolParser::Hermes | ToolParser::Mistral => "arguments",
        ToolParser::Openai => return None,
    };
    let calls: Vec<Value> = functions
        .iter()
        .map(|f| {
            let params = if f.strict {
                f.parameters.clone()
            } else {
                json!({"type": "object"})
            };
            json!({
                "type": "object",
                "properties": {"name": {"const": f.name}, key: params},
                "required": ["name", key],
                "additionalProperties": false
            })
        })
        .collect();
    // Written compactly, as the JSON of `structured_outputs` is.
    let compact =
        json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "});
    let call = json!({"anyOf": calls, "x-guidance": compact});
    let more = if parallel { "*" } else { "" };
    Some(match parser {
        // Text, or text up to the first `<tool_call>` (a lazy lexeme: it ends where the tag
        // does) and calls after it.
        ToolParser::Hermes => format!(
            "start: TEXT | head call (NEXT call){more}\n\
             head[lazy]: TEXT \"<tool_call>\\n\"\n\
             call: %json {call} \"\\n</tool_call>\"\n\
             NEXT: /\\n*<tool_call>\\n/\n\
             TEXT: /(?s:.*)/\n"
        ),
        ToolParser::Llama3Json => format!(
            "start: TEXT | calls\n\
             calls: call (\"; \" call){more}\n\
             call: %json {call}\n\
             TEXT: /[^{{\\s](?s:.*)/\n"
        ),
        ToolParser::Mistral => {
            let items = json!({"anyOf": call["anyOf"]});
            let mut list =
                json!({"type": "array", "minItems": 1, "items": items, "x-guidance": compact});
            if !parallel {
                list["maxItems"] = json!(1);
            }
            format!(
                "start: TEXT | calls\n\
                 calls: %json {list}\n\
                 TEXT: /[^\\[\\s](?s:.*)/\n"
            )
        }
        ToolParser::Openai => return None,
    })
}
