//! A streamed response: OpenAI's typed server-sent events, in the order its SDK expects.
//!
//! `response.created` and `response.in_progress` first; then for each output item
//! `response.output_item.added`, its part's `response.content_part.added`, the deltas
//! (`response.reasoning_text.delta`, `response.output_text.delta`,
//! `response.function_call_arguments.delta`), their `.done` events and
//! `response.output_item.done`; last `response.completed` (or `response.incomplete` when
//! `max_output_tokens` cut it) with the whole response. Every event carries `sequence_number`,
//! counting from 0. An engine failure sends an `error` event, then `response.failed`.

use serde_json::{Value, json};

use super::output::{OutputItem, OutputText, ReasoningText, ResponseError, ResponseObject};
use super::output::{ResponseUsage, message_item, reasoning_item};
use crate::server::chat_stream::ChatDelta;
use crate::server::generate::random_id;

/// What the open item is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Open {
    Reasoning,
    Message,
    Call,
}

/// Turns a chat answer's deltas into the events of one response.
pub struct EventWriter {
    /// The response (its output grows as items close).
    pub response: ResponseObject,
    sequence: u64,
    items: Vec<OutputItem>,
    open: Option<Open>,
}

impl EventWriter {
    /// The writer of `draft`'s events.
    pub fn new(draft: ResponseObject) -> Self {
        EventWriter {
            response: draft,
            sequence: 0,
            items: Vec::new(),
            open: None,
        }
    }

    fn event(&mut self, kind: &str, mut body: Value) -> Value {
        body["type"] = json!(kind);
        body["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        body
    }

    /// `response.created` and `response.in_progress`.
    pub fn start(&mut self) -> Vec<Value> {
        let response = json!({"response": self.response});
        vec![
            self.event("response.created", response.clone()),
            self.event("response.in_progress", response),
        ]
    }

    /// The events of one token's delta.
    pub fn step(&mut self, delta: &ChatDelta) -> Vec<Value> {
        let mut out = Vec::new();
        if !delta.reasoning.is_empty() {
            self.open_as(Open::Reasoning, &mut out);
            self.append(&delta.reasoning, &mut out);
        }
        if let Some(content) = delta.content.as_ref().filter(|c| !c.is_empty()) {
            self.open_as(Open::Message, &mut out);
            self.append(content, &mut out);
        }
        for entry in &delta.tool_calls {
            if let Some(name) = entry.pointer("/function/name").and_then(Value::as_str) {
                self.close(false, &mut out);
                let call_id = entry["id"]
                    .as_str()
                    .map_or_else(|| random_id("call_"), str::to_string);
                let item = OutputItem::FunctionCall {
                    id: random_id("fc_"),
                    call_id,
                    name: name.to_string(),
                    arguments: String::new(),
                    status: "in_progress".into(),
                };
                self.add(item, Open::Call, &mut out);
            }
            if let Some(arguments) = entry.pointer("/function/arguments").and_then(Value::as_str)
                && !arguments.is_empty()
                && self.open == Some(Open::Call)
            {
                self.append(arguments, &mut out);
            }
        }
        out
    }

    /// The last events: the open item closed (`incomplete` when `cut`), an empty message if the
    /// answer said nothing, then `response.completed` or `response.incomplete`.
    pub fn finish(&mut self, finish: Option<&str>, usage: ResponseUsage) -> Vec<Value> {
        let mut out = Vec::new();
        let cut = finish == Some("length");
        if self.items.is_empty() {
            self.open_as(Open::Message, &mut out);
        }
        self.close(cut, &mut out);
        self.response
            .finish(std::mem::take(&mut self.items), finish, usage);
        let kind = if cut {
            "response.incomplete"
        } else {
            "response.completed"
        };
        let response = json!({"response": self.response});
        out.push(self.event(kind, response));
        out
    }

    /// The events of a failure: `error`, then `response.failed`.
    pub fn fail(&mut self, message: &str) -> Vec<Value> {
        let error = self.event(
            "error",
            json!({"code": "server_error", "message": message, "param": null}),
        );
        self.response.status = "failed".into();
        self.response.output = std::mem::take(&mut self.items);
        self.response.error = Some(ResponseError {
            code: "server_error".into(),
            message: message.into(),
        });
        let response = json!({"response": self.response});
        vec![error, self.event("response.failed", response)]
    }

    /// Makes the open item one of `kind`, closing another and opening a new one as needed.
    fn open_as(&mut self, kind: Open, out: &mut Vec<Value>) {
        if self.open == Some(kind) {
            return;
        }
        self.close(false, out);
        let item = match kind {
            Open::Reasoning => reasoning_item(random_id("rs_"), "", "in_progress"),
            _ => message_item(random_id("msg_"), "", "in_progress"),
        };
        self.add(item, kind, out);
        let part = match kind {
            Open::Reasoning => json!({"type": "reasoning_text", "text": ""}),
            _ => json!({"type": "output_text", "text": "", "annotations": []}),
        };
        let body = self.located(json!({"content_index": 0, "part": part}));
        out.push(self.event("response.content_part.added", body));
    }

    fn add(&mut self, item: OutputItem, kind: Open, out: &mut Vec<Value>) {
        let body = json!({"output_index": self.items.len(), "item": item});
        self.items.push(item);
        self.open = Some(kind);
        out.push(self.event("response.output_item.added", body));
    }

    /// `body` with the open item's `item_id` and `output_index`.
    fn located(&self, mut body: Value) -> Value {
        let index = self.items.len() - 1;
        body["item_id"] = json!(item_id(&self.items[index]));
        body["output_index"] = json!(index);
        body
    }

    /// Appends `text` to the open item, with its delta event.
    fn append(&mut self, text: &str, out: &mut Vec<Value>) {
        let (kind, body) = match self.items.last_mut() {
            Some(OutputItem::Reasoning { content, .. }) => {
                match content.first_mut() {
                    Some(part) => part.text.push_str(text),
                    None => content.push(ReasoningText::new(text)),
                }
                let d = json!({"content_index": 0, "delta": text});
                ("response.reasoning_text.delta", d)
            }
            Some(OutputItem::Message { content, .. }) => {
                match content.first_mut() {
                    Some(part) => part.text.push_str(text),
                    None => content.push(OutputText::new(text)),
                }
                let d = json!({"content_index": 0, "delta": text, "logprobs": []});
                ("response.output_text.delta", d)
            }
            Some(OutputItem::FunctionCall { arguments, .. }) => {
                arguments.push_str(text);
                (
                    "response.function_call_arguments.delta",
                    json!({"delta": text}),
                )
            }
            None => return,
        };
        let body = self.located(body);
        out.push(self.event(kind, body));
    }

    /// Closes the open item (`incomplete` when `cut`, else `completed`) with its done events.
    fn close(&mut self, cut: bool, out: &mut Vec<Value>) {
        let Some(kind) = self.open.take() else {
            return;
        };
        let status = if cut && kind != Open::Reasoning {
            "incomplete"
        } else {
            "completed"
        };
        let last = self.items.len() - 1;
        let done: Vec<(&str, Value)> = match &mut self.items[last] {
            OutputItem::Reasoning {
                content, status: s, ..
            } => {
                *s = status.into();
                let text = content.first().map_or("", |p| p.text.as_str()).to_string();
                let part = json!({"type": "reasoning_text", "text": text});
                vec![
                    (
                        "response.reasoning_text.done",
                        json!({"content_index": 0, "text": text}),
                    ),
                    (
                        "response.content_part.done",
                        json!({"content_index": 0, "part": part}),
                    ),
                ]
            }
            OutputItem::Message {
                content, status: s, ..
            } => {
                *s = status.into();
                if content.is_empty() {
                    content.push(OutputText::new(""));
                }
                let part = json!(content[0]);
                let text = content[0].text.clone();
                vec![
                    (
                        "response.output_text.done",
                        json!({"content_index": 0, "text": text, "logprobs": []}),
                    ),
                    (
                        "response.content_part.done",
                        json!({"content_index": 0, "part": part}),
                    ),
                ]
            }
            OutputItem::FunctionCall {
                name,
                arguments,
                status: s,
                ..
            } => {
                *s = status.into();
                let body = json!({"arguments": arguments, "name": name});
                vec![("response.function_call_arguments.done", body)]
            }
        };
        for (kind, body) in done {
            let body = self.located(body);
            out.push(self.event(kind, body));
        }
        let body = json!({"output_index": last, "item": self.items[last]});
        out.push(self.event("response.output_item.done", body));
    }
}

fn item_id(item: &OutputItem) -> &str {
    match item {
        OutputItem::Reasoning { id, .. }
        | OutputItem::Message { id, .. }
        | OutputItem::FunctionCall { id, .. } => id,
    }
}
