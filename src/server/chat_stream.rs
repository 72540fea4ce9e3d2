//! One chat answer read as the chat endpoint reads it: the reasoning split first
//! (`super::reasoning`), then tool calls out of what it passes on (`super::tools`). Whole
//! ([`read_answer`]) or streamed token by token ([`ChatChoiceStream`]); /v1/chat/completions
//! turns each step into a chunk's `delta`, /v1/responses and /v1/messages into their typed
//! events.

use serde_json::Value;

use super::generate::{ResolvedRequest, chat_answer};
use super::reasoning::ReasoningStream;
use super::tools::ToolCalling;
use super::tools::stream::ToolStream;

/// What one token adds to a chat answer.
#[derive(Debug, Default)]
pub struct ChatDelta {
    /// New reasoning text (empty: none).
    pub reasoning: String,
    /// New content, if any.
    pub content: Option<String>,
    /// Tool-call entries (OpenAI's streamed shape: `index`, then `id`, `type` and
    /// `function.name` on a call's first entry, `function.arguments` pieces).
    pub tool_calls: Vec<Value>,
    /// The answer's finish reason, on its last token (`tool_calls` for an answer with calls).
    pub finish: Option<&'static str>,
}

/// The state of one streamed chat answer.
pub struct ChatChoiceStream {
    reasoning: Option<ReasoningStream>,
    tools: Option<(ToolCalling, ToolStream)>,
}

impl ChatChoiceStream {
    /// The stream of one choice of `job`.
    pub fn new(job: &ResolvedRequest) -> Self {
        let harmony_calls = job.harmony_calls();
        ChatChoiceStream {
            reasoning: job
                .reasoning
                .map(|p| ReasoningStream::keeping_calls(p, harmony_calls)),
            tools: job.tools.clone().map(|t| (t.clone(), ToolStream::new(t))),
        }
    }

    /// Takes the next token's `text`; `finish` on the answer's last token.
    pub fn step(&mut self, text: &str, finish: Option<&'static str>) -> ChatDelta {
        // The reasoning parser takes the text first; its content goes on.
        // Without a parser every token has its chunk, even one whose text is held back by the
        // detokenizer (empty); the reasoning split sends content only when there is some.
        let (reasoning, content) = match &mut self.reasoning {
            Some(r) => {
                let split = r.step(text, finish.is_some());
                (
                    split.reasoning,
                    Some(split.content).filter(|c| !c.is_empty()),
                )
            }
            None => (String::new(), Some(text.to_string())),
        };
        let Some((calling, tools)) = &mut self.tools else {
            return ChatDelta {
                reasoning,
                content,
                tool_calls: Vec::new(),
                finish,
            };
        };
        let text = content.unwrap_or_default();
        let delta = tools.step(&text, finish.is_some()).unwrap_or_default();
        ChatDelta {
            reasoning,
            content: delta["content"].as_str().map(str::to_string),
            tool_calls: delta["tool_calls"].as_array().cloned().unwrap_or_default(),
            finish: calling.finish_reason(tools.num_calls() > 0, finish),
        }
    }
}

/// A whole chat answer: reasoning, content and calls (name, arguments).
#[derive(Debug, Default)]
pub struct Answer {
    /// Reasoning text (empty: none).
    pub reasoning: String,
    /// Content, if any (never empty).
    pub content: Option<String>,
    /// Calls: name and arguments.
    pub calls: Vec<(String, String)>,
}

/// Reads a whole answer `text` of `job` that ended with `finish`.
pub fn read_answer(job: &ResolvedRequest, text: String, finish: Option<&'static str>) -> Answer {
    let (reasoning, text) = match job.reasoning {
        Some(parser) => {
            let split = parser.split_keeping_calls(&text, job.harmony_calls());
            (split.reasoning, split.content)
        }
        None => (String::new(), text),
    };
    let (content, calls, _) = chat_answer(job, text, finish);
    Answer {
        reasoning,
        content: content.filter(|c| !c.is_empty()),
        calls: calls
            .into_iter()
            .map(|c| (c.function.name, c.function.arguments))
            .collect(),
    }
}
