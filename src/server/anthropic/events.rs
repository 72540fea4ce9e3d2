//! A streamed message: Anthropic's server-sent events. `message_start` (the message with no
//! content) and a `ping`; for each block `content_block_start`, its `content_block_delta`s
//! (`thinking_delta`, `text_delta`, `input_json_delta`) and `content_block_stop`; then
//! `message_delta` (stop reason, output tokens) and `message_stop`. An engine failure sends an
//! `error` event and ends the stream.

use serde_json::{Value, json};

use super::output::{MessageResponse, MessageUsage, stop_reason};
use crate::server::chat_stream::ChatDelta;
use crate::server::generate::random_id;

/// The kind of the open block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Block {
    Thinking,
    Text,
    ToolUse,
}

/// Turns a chat answer's deltas into one message's events.
pub struct EventWriter {
    message: MessageResponse,
    /// Blocks started so far.
    num_blocks: usize,
    open: Option<Block>,
    has_calls: bool,
}

impl EventWriter {
    /// The writer of a message answering a prompt of `input_tokens`.
    pub fn new(model: String, input_tokens: usize) -> Self {
        EventWriter {
            message: MessageResponse {
                id: random_id("msg_"),
                kind: "message".into(),
                role: "assistant".into(),
                model,
                content: Vec::new(),
                stop_reason: None,
                stop_sequence: None,
                usage: MessageUsage::new(input_tokens, 0),
            },
            num_blocks: 0,
            open: None,
            has_calls: false,
        }
    }

    /// `message_start` and a `ping`.
    pub fn start(&self) -> Vec<Value> {
        vec![
            json!({"type": "message_start", "message": self.message}),
            json!({"type": "ping"}),
        ]
    }

    /// The events of one token's delta.
    pub fn step(&mut self, delta: &ChatDelta) -> Vec<Value> {
        let mut out = Vec::new();
        if !delta.reasoning.is_empty() {
            self.open_as(
                Block::Thinking,
                json!({"thinking": "", "signature": ""}),
                &mut out,
            );
            self.delta(
                json!({"type": "thinking_delta", "thinking": delta.reasoning}),
                &mut out,
            );
        }
        if let Some(text) = delta.content.as_ref().filter(|t| !t.is_empty()) {
            self.open_as(Block::Text, json!({"text": ""}), &mut out);
            self.delta(json!({"type": "text_delta", "text": text}), &mut out);
        }
        for entry in &delta.tool_calls {
            if let Some(name) = entry.pointer("/function/name").and_then(Value::as_str) {
                self.close(&mut out);
                self.has_calls = true;
                let block = json!({"id": random_id("toolu_"), "name": name, "input": {}});
                self.open_as(Block::ToolUse, block, &mut out);
            }
            if let Some(args) = entry.pointer("/function/arguments").and_then(Value::as_str)
                && !args.is_empty()
                && self.open == Some(Block::ToolUse)
            {
                self.delta(
                    json!({"type": "input_json_delta", "partial_json": args}),
                    &mut out,
                );
            }
        }
        out
    }

    /// The last events: the open block's stop, `message_delta` and `message_stop`.
    pub fn finish(
        &mut self,
        finish: Option<&str>,
        stopped_on: Option<String>,
        output_tokens: usize,
    ) -> Vec<Value> {
        let mut out = Vec::new();
        if self.num_blocks == 0 {
            self.open_as(Block::Text, json!({"text": ""}), &mut out);
        }
        self.close(&mut out);
        let reason = stop_reason(finish, stopped_on.as_deref(), self.has_calls);
        out.push(json!({"type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": stopped_on},
            "usage": {"output_tokens": output_tokens}}));
        out.push(json!({"type": "message_stop"}));
        out
    }

    fn open_as(&mut self, kind: Block, mut block: Value, out: &mut Vec<Value>) {
        if self.open == Some(kind) && kind != Block::ToolUse {
            return;
        }
        self.close(out);
        block["type"] = json!(match kind {
            Block::Thinking => "thinking",
            Block::Text => "text",
            Block::ToolUse => "tool_use",
        });
        out.push(
            json!({"type": "content_block_start", "index": self.num_blocks,
                        "content_block": block}),
        );
        self.num_blocks += 1;
        self.open = Some(kind);
    }

    fn delta(&self, delta: Value, out: &mut Vec<Value>) {
        out.push(
            json!({"type": "content_block_delta", "index": self.num_blocks - 1,
                        "delta": delta}),
        );
    }

    fn close(&mut self, out: &mut Vec<Value>) {
        if self.open.take().is_some() {
            out.push(json!({"type": "content_block_stop", "index": self.num_blocks - 1}));
        }
    }
}
