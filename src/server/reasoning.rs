//! Reasoning outputs (`--reasoning-parser`, vLLM's names): a chat answer's reasoning goes to
//! `reasoning_content`, the rest to `content`, whole or streamed (`delta.reasoning_content`,
//! then `delta.content`).
//!
//! - `deepseek_r1`: the template opens `<think>` in the prompt; everything up to `</think>` is
//!   reasoning (all of it while no `</think>` has come).
//! - `qwen3`: an answer that starts with `<think>` reasons up to `</think>`; any other is content
//!   (thinking switched off).
//! - `openai_gptoss`: gpt-oss's harmony format (`super::harmony`): the `analysis` channel is
//!   reasoning, `final` and `commentary` are content. The markers are special tokens, so this
//!   parser asks the engine to keep special tokens in the text (they never reach the client).

use super::harmony;

/// A reasoning format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ReasoningParser {
    /// DeepSeek-R1 and its distills: `...</think>answer` (`<think>` in the prompt).
    #[value(name = "deepseek_r1")]
    DeepSeekR1,
    /// Qwen3: `<think>...</think>answer`, or just the answer with thinking off.
    Qwen3,
    /// gpt-oss: harmony channels (`analysis` is reasoning).
    #[value(name = "openai_gptoss")]
    GptOss,
}

/// An answer's reasoning and content (either may be empty).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Split {
    /// What goes to `reasoning_content`.
    pub reasoning: String,
    /// What goes to `content`.
    pub content: String,
}

const THINK_OPEN: &str = "<think>";
const THINK_CLOSE: &str = "</think>";

impl ReasoningParser {
    /// Whether the engine must keep special tokens in the text for this parser to see its
    /// markers.
    pub fn needs_special_tokens(self) -> bool {
        self == ReasoningParser::GptOss
    }

    /// The reasoning and content of `text`, an answer or a prefix of one: the split of a longer
    /// prefix extends both parts of a shorter one's, so streaming sends their growth.
    pub fn split(self, text: &str) -> Split {
        self.split_keeping_calls(text, false)
    }

    /// [`ReasoningParser::split`], with harmony's messages to functions kept in the content for
    /// the `openai` tool parser when `keep_calls` (`super::harmony`; other formats have none).
    pub fn split_keeping_calls(self, text: &str, keep_calls: bool) -> Split {
        match self {
            ReasoningParser::DeepSeekR1 => {
                let text = text.strip_prefix(THINK_OPEN).unwrap_or(text);
                match text.split_once(THINK_CLOSE) {
                    Some((r, c)) => parts(r, c),
                    None => parts(text, ""),
                }
            }
            ReasoningParser::Qwen3 => match text.strip_prefix(THINK_OPEN) {
                Some(rest) => match rest.split_once(THINK_CLOSE) {
                    Some((r, c)) => parts(r, c),
                    None => parts(rest, ""),
                },
                None => parts("", text),
            },
            ReasoningParser::GptOss => harmony::split(text, keep_calls),
        }
    }

    /// How many trailing bytes of `text` must wait for more before they are split: a marker (or
    /// the start of the answer, for `qwen3`) not yet whole.
    pub fn undecided_tail(self, text: &str) -> usize {
        let markers: &[&str] = match self {
            ReasoningParser::DeepSeekR1 => &[THINK_OPEN, THINK_CLOSE],
            ReasoningParser::Qwen3 => {
                if THINK_OPEN.starts_with(text) {
                    return text.len();
                }
                &[THINK_CLOSE]
            }
            ReasoningParser::GptOss => return harmony::undecided_tail(text),
        };
        partial_marker(text, markers)
    }
}

/// The length of the longest proper prefix of any of `markers` that `text` ends with: bytes
/// that may yet turn out to start a marker.
pub(super) fn partial_marker(text: &str, markers: &[&str]) -> usize {
    markers
        .iter()
        .map(|m| {
            (1..m.len())
                .rev()
                .find(|&n| text.ends_with(&m[..n]))
                .unwrap_or(0)
        })
        .max()
        .unwrap_or(0)
}

fn parts(reasoning: &str, content: &str) -> Split {
    Split {
        reasoning: reasoning.to_string(),
        content: content.to_string(),
    }
}

/// A streamed choice's reasoning split: the text so far, and how much of each part has gone
/// out.
#[derive(Clone, Debug)]
pub struct ReasoningStream {
    parser: ReasoningParser,
    keep_calls: bool,
    text: String,
    sent: Split,
}

impl ReasoningStream {
    /// A fresh stream.
    pub fn new(parser: ReasoningParser) -> Self {
        Self::keeping_calls(parser, false)
    }

    /// A fresh stream that keeps harmony's calls for the `openai` tool parser when `keep_calls`
    /// ([`ReasoningParser::split_keeping_calls`]).
    pub fn keeping_calls(parser: ReasoningParser, keep_calls: bool) -> Self {
        ReasoningStream {
            parser,
            keep_calls,
            text: String::new(),
            sent: Split::default(),
        }
    }

    /// Takes the next piece of text (`last` at the end of the answer) and returns what it adds
    /// to the reasoning and to the content.
    pub fn step(&mut self, piece: &str, last: bool) -> Split {
        self.text.push_str(piece);
        let held = match last {
            true => 0,
            false => self.parser.undecided_tail(&self.text),
        };
        let now = self
            .parser
            .split_keeping_calls(&self.text[..self.text.len() - held], self.keep_calls);
        let grow = |now: &str, sent: &mut String| -> String {
            match now.strip_prefix(sent.as_str()) {
                Some(more) => {
                    let more = more.to_string();
                    sent.push_str(&more);
                    more
                }
                None => String::new(),
            }
        };
        Split {
            reasoning: grow(&now.reasoning, &mut self.sent.reasoning),
            content: grow(&now.content, &mut self.sent.content),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GPT_OSS: &str = "<|channel|>analysis<|message|>User asks 2+2. Easy.<|end|>\
        <|start|>assistant<|channel|>final<|message|>It is 4.";

    #[test]
    fn whole_answers_split_by_format() {
        let r1 = ReasoningParser::DeepSeekR1;
        assert_eq!(r1.split("hmm</think>\n\nYes."), parts("hmm", "\n\nYes."));
        assert_eq!(r1.split("<think>hmm</think>Yes."), parts("hmm", "Yes."));
        assert_eq!(r1.split("still thinking"), parts("still thinking", ""));
        let q = ReasoningParser::Qwen3;
        assert_eq!(
            q.split("<think>\nhmm\n</think>\n\nYes."),
            parts("\nhmm\n", "\n\nYes.")
        );
        assert_eq!(q.split("Yes, no thinking."), parts("", "Yes, no thinking."));
        let g = ReasoningParser::GptOss;
        assert_eq!(g.split(GPT_OSS), parts("User asks 2+2. Easy.", "It is 4."));
        // A commentary preamble is content; an answer outside the format is content.
        assert_eq!(
            g.split("<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant<|channel|>final<|message|>Done.<|return|>"),
            parts("", "Checking.Done.")
        );
        assert_eq!(g.split("plain"), parts("", "plain"));
    }

    /// Streamed in pieces of every size, the parts put back together equal the whole split,
    /// and no marker or header leaks into either.
    #[test]
    fn streamed_pieces_add_up_to_the_whole_split() {
        let cases = [
            (ReasoningParser::GptOss, GPT_OSS),
            (
                ReasoningParser::Qwen3,
                "<think>a < b </thi</think>so <think> yes",
            ),
            (ReasoningParser::Qwen3, "<thin is not a tag"),
            (ReasoningParser::DeepSeekR1, "x</think>y"),
        ];
        for (parser, text) in cases {
            let whole = parser.split(text);
            for size in 1..=text.len() {
                let mut stream = ReasoningStream::new(parser);
                let mut got = Split::default();
                let chars: Vec<char> = text.chars().collect();
                let pieces: Vec<String> = chars.chunks(size).map(|c| c.iter().collect()).collect();
                for (i, piece) in pieces.iter().enumerate() {
                    let d = stream.step(piece, i + 1 == pieces.len());
                    for part in [&d.reasoning, &d.content] {
                        assert!(!part.contains("<|"), "{parser:?} size {size}: {part:?}");
                    }
                    got.reasoning.push_str(&d.reasoning);
                    got.content.push_str(&d.content);
                }
                assert_eq!(got, whole, "{parser:?} in pieces of {size}: {text:?}");
            }
        }
    }
}
