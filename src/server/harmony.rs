//! gpt-oss's harmony format in a generated answer, read with its special tokens kept.
//!
//! An answer is a run of messages, each a header then `<|message|>TEXT`, ended by `<|end|>` (then
//! `<|start|>ROLE` and the next message) or by a stop token, `<|return|>` or `<|call|>`. The
//! prompt ends in `<|start|>assistant`, so the first header's start is the answer's first text.
//! A header names the message's channel (`<|channel|>analysis`, `final`, `commentary`) and may
//! name a recipient (`to=functions.NAME`, in the role part or after the channel): a message to a
//! function is a tool call, its text the arguments (`<|constrain|>json` gives their format).
//!
//! [`split`] sends the `analysis` channel to reasoning and the others to content, and drops the
//! markers and headers. Asked to keep calls, it writes each message to a function into the
//! content in one fixed form, `<|start|>assistant to=functions.NAME<|message|>ARGS<|call|>`,
//! which [`calls`] (the `openai` tool parser) reads back.

use super::reasoning::Split;
use super::tools::ParsedCall;

const START: &str = "<|start|>";
const CHANNEL: &str = "<|channel|>";
const MESSAGE: &str = "<|message|>";
const CALL: &str = "<|call|>";
/// Every marker: each ends a message's text or a part of a header.
const MARKERS: [&str; 7] = [
    START,
    CHANNEL,
    MESSAGE,
    "<|end|>",
    "<|return|>",
    CALL,
    "<|constrain|>",
];
/// How a kept call begins in [`split`]'s content; the function's name follows.
pub const CALL_OPEN: &str = "<|start|>assistant to=functions.";

/// The header of the message being read.
#[derive(Default)]
struct Header {
    channel: String,
    recipient: Option<String>,
    /// A kept call's opening has been written and its close is owed.
    call_open: bool,
}

impl Header {
    /// Takes the recipient from a piece of header text (`... to=NAME ...`), if it names one.
    fn read_recipient(&mut self, part: &str) {
        if let Some(at) = part.find("to=") {
            let name = part[at + 3..].split_whitespace().next().unwrap_or("");
            self.recipient = Some(name.to_string());
        }
    }

    /// The function this message calls, if its recipient is one.
    fn function(&self) -> Option<&str> {
        self.recipient.as_deref()?.strip_prefix("functions.")
    }
}

/// Whether text before any marker is the first header's start (` to=functions.NAME`) rather
/// than an answer outside the format (content).
fn is_header(lead: &str) -> bool {
    lead.trim_start().starts_with("to=")
}

/// The reasoning and content of `text`, an answer or a prefix of one (a message not yet ended
/// runs to the end): the split of a longer prefix extends both parts of a shorter one's. With
/// `keep_calls`, messages to functions go to the content as kept calls (see the module's doc);
/// without, they go by their channel like any other.
pub fn split(text: &str, keep_calls: bool) -> Split {
    let mut out = Split::default();
    let mut header = Header::default();
    let lead_end = next_marker(text).map_or(text.len(), |(i, _)| i);
    let lead = &text[..lead_end];
    if is_header(lead) {
        header.read_recipient(lead);
    } else {
        out.content.push_str(lead);
    }
    let mut rest = &text[lead_end..];
    while let Some((i, marker)) = next_marker(rest) {
        rest = &rest[i + marker.len()..];
        let end = next_marker(rest).map_or(rest.len(), |(j, _)| j);
        let body = &rest[..end];
        match marker {
            START => {
                header = Header::default();
                header.read_recipient(body);
            }
            CHANNEL => {
                header.channel = body.split_whitespace().next().unwrap_or("").to_string();
                header.read_recipient(body);
            }
            MESSAGE => match header.function().filter(|_| keep_calls) {
                Some(name) => {
                    out.content
                        .push_str(&format!("{CALL_OPEN}{name}{MESSAGE}{body}"));
                    header.call_open = true;
                }
                None if header.channel == "analysis" => out.reasoning.push_str(body),
                None => out.content.push_str(body),
            },
            // (`<|constrain|>`'s format: not for the client.)
            "<|constrain|>" => {}
            // An end: the text after it, up to the next `<|start|>`, is not for the client.
            _ => {
                if header.call_open {
                    out.content.push_str(CALL);
                }
                header = Header::default();
            }
        }
        rest = &rest[end..];
    }
    out
}

/// How many trailing bytes of `text` must wait for more before [`split`] takes them: a marker
/// not yet whole, or an answer's start that may still be a header.
pub fn undecided_tail(text: &str) -> usize {
    if next_marker(text).is_none() && "to=".starts_with(text.trim_start()) {
        return text.len();
    }
    // (A header before its `<|message|>` is dropped whole: `split` splits a prefix that ends
    // in one the same as it will the whole.)
    super::reasoning::partial_marker(text, &MARKERS)
}

/// The first marker in `text`: its byte offset and which.
fn next_marker(text: &str) -> Option<(usize, &'static str)> {
    MARKERS
        .iter()
        .filter_map(|m| text.find(m).map(|i| (i, *m)))
        .min_by_key(|&(i, _)| i)
}

/// The calls kept in [`split`]'s content (from the first [`CALL_OPEN`] on) and the text around
/// them (preambles between calls; `None` when there is none). A call's arguments are its message
/// text as the model wrote it, trimmed (`{}` when empty); a last call the answer ended inside
/// (its stop token is not in the text) runs to the end.
pub fn calls(text: &str) -> (Vec<ParsedCall>, Option<String>) {
    let mut calls = Vec::new();
    let mut between = String::new();
    let mut rest = text;
    while let Some(open) = rest.find(CALL_OPEN) {
        between.push_str(&rest[..open]);
        let after = &rest[open + CALL_OPEN.len()..];
        let (head, body) = after.split_once(MESSAGE).unwrap_or((after, ""));
        let (args, next) = body.split_once(CALL).unwrap_or((body, ""));
        let args = args.trim();
        calls.push(ParsedCall {
            name: head.trim().to_string(),
            arguments: if args.is_empty() { "{}" } else { args }.to_string(),
        });
        rest = next;
    }
    between.push_str(rest);
    let between = between.trim().to_string();
    (calls, Some(between).filter(|b| !b.is_empty()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(reasoning: &str, content: &str) -> Split {
        Split {
            reasoning: reasoning.into(),
            content: content.into(),
        }
    }

    /// A call as gpt-oss writes it: reasoning, then a message to a function whose recipient
    /// is in the role part (after the prompt's `<|start|>assistant`).
    const CALL_IN_ROLE: &str = "<|channel|>analysis<|message|>Need weather.<|end|>\
        <|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json\
        <|message|>{\"city\": \"Paris\"}<|call|>";

    #[test]
    fn channels_go_to_their_sides_and_calls_are_kept_when_asked() {
        assert_eq!(
            split(
                "<|channel|>analysis<|message|>2+2.<|end|><|start|>assistant<|channel|>final<|message|>4",
                false
            ),
            parts("2+2.", "4")
        );
        assert_eq!(split("plain", true), parts("", "plain"));
        // Not kept: the arguments go by their channel (commentary: content).
        assert_eq!(
            split(CALL_IN_ROLE, false),
            parts("Need weather.", "{\"city\": \"Paris\"}")
        );
        let kept = split(CALL_IN_ROLE, true);
        assert_eq!(kept.reasoning, "Need weather.");
        assert_eq!(
            kept.content,
            "<|start|>assistant to=functions.get_weather<|message|>{\"city\": \"Paris\"}<|call|>"
        );
        // The recipient after the channel, and a first message that calls at once (its header
        // starts the answer); the stop token is not in the text.
        let text = " to=functions.f<|channel|>commentary json<|message|>{}";
        assert_eq!(
            split(text, true).content,
            format!("{CALL_OPEN}f<|message|>{{}}")
        );
        let text = "<|channel|>commentary to=functions.g <|constrain|>json<|message|>{\"a\":1}";
        let (calls, content) = calls(&split(text, true).content);
        assert_eq!((calls[0].name.as_str(), content), ("g", None));
        assert_eq!(calls[0].arguments, "{\"a\":1}");
        // A built-in tool's message (not `functions.`) is no call.
        let text = "<|channel|>analysis to=browser.search<|message|>{\"q\":1}<|end|>";
        assert_eq!(split(text, true), parts("{\"q\":1}", ""));
    }

    #[test]
    fn kept_calls_read_back_with_the_preambles_between_them() {
        let text = "<|channel|>commentary<|message|>Checking both.<|end|>\
            <|start|>assistant to=functions.a<|channel|>commentary json<|message|>{\"x\": 1}<|call|>\
            <|start|>assistant to=functions.b<|channel|>commentary json<|message|> <|call|>";
        let (got, content) = calls(&split(text, true).content);
        let got: Vec<(&str, &str)> = got
            .iter()
            .map(|c| (c.name.as_str(), c.arguments.as_str()))
            .collect();
        assert_eq!(got, [("a", "{\"x\": 1}"), ("b", "{}")]);
        assert_eq!(content.as_deref(), Some("Checking both."));
    }

    /// Streamed in pieces of every size (each piece held back by [`undecided_tail`]), the parts
    /// put back together equal the whole split, and no marker leaks outside a kept call.
    #[test]
    fn prefixes_split_into_prefixes_of_the_whole() {
        for keep in [false, true] {
            for text in [
                CALL_IN_ROLE,
                " to=functions.f<|channel|>commentary<|message|>{}",
                " hi",
            ] {
                let whole = split(text, keep);
                for cut in 0..=text.len() {
                    if !text.is_char_boundary(cut) {
                        continue;
                    }
                    let prefix = &text[..cut];
                    let part = split(&prefix[..prefix.len() - undecided_tail(prefix)], keep);
                    assert!(
                        whole.reasoning.starts_with(&part.reasoning)
                            && whole.content.starts_with(&part.content),
                        "{text:?} cut at {cut}: {part:?} is not a prefix of {whole:?}"
                    );
                    if !keep {
                        assert!(!part.content.contains("<|"), "{text:?} at {cut}: {part:?}");
                    }
                }
            }
        }
    }
}
