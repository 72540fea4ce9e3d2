//! Stop strings, matched on the detokenized text of one sequence.
//!
//! Text is emitted as soon as it can no longer be the start of a stop string; only a tail that is a
//! proper prefix of some stop string is held back. On a match the output ends right before the stop
//! string (or right after it with `include_stop_str_in_output`), and nothing past it is ever emitted.

/// The output text of one sequence and what of it has been handed out.
#[derive(Clone, Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    include_stop: bool,
    longest: usize,
    text: String,
    num_emitted: usize,
}

/// What appending text produced.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TextDelta {
    /// Text safe to hand out now.
    pub text: String,
    /// The stop string that matched; the sequence must finish.
    pub stopped_on: Option<String>,
}

impl StopMatcher {
    /// A matcher for `stops` (empty: no stop strings, nothing held back).
    pub fn new(stops: Vec<String>, include_stop_str_in_output: bool) -> Self {
        let longest = stops.iter().map(String::len).max().unwrap_or(0);
        StopMatcher {
            stops,
            include_stop: include_stop_str_in_output,
            longest,
            ..Default::default()
        }
    }

    /// All output text so far (after a match: up to the cut).
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Appends newly decoded text; returns what can be emitted and whether a stop string matched.
    pub fn push(&mut self, delta: &str) -> TextDelta {
        let old_len = self.text.len();
        self.text.push_str(delta);
        if self.stops.is_empty() {
            return self.emit_to(self.text.len(), None);
        }
        // A new match must end inside the new text, so it starts at most `longest - 1` bytes earlier.
        let mut from = old_len.saturating_sub(self.longest.saturating_sub(1));
        while !self.text.is_char_boundary(from) {
            from -= 1;
        }
        let found = self
            .stops
            .iter()
            .filter_map(|s| self.text[from..].find(s.as_str()).map(|at| (from + at, s)))
            .min_by_key(|&(at, s)| (at, std::cmp::Reverse(s.len())));
        if let Some((at, stop)) = found {
            let stop = stop.clone();
            let cut = if self.include_stop {
                at + stop.len()
            } else {
                at
            };
            self.text.truncate(cut);
            return self.emit_to(cut, Some(stop));
        }
        let held = self.partial_match_len();
        self.emit_to(self.text.len() - held, None)
    }

    /// Hands out whatever was held back (the sequence ended for another reason).
    pub fn flush(&mut self) -> String {
        self.emit_to(self.text.len(), None).text
    }

    /// Length of the longest suffix of the text that is a proper prefix of a stop string.
    fn partial_match_len(&self) -> usize {
        self.stops
            .iter()
            .flat_map(|s| {
                (1..s.len())
                    .rev()
                    .filter(|&k| s.is_char_boundary(k))
                    .find(|&k| self.text.ends_with(&s[..k]))
            })
            .max()
            .unwrap_or(0)
    }

    fn emit_to(&mut self, end: usize, stopped_on: Option<String>) -> TextDelta {
        let start = self.num_emitted.min(end);
        let text = self.text[start..end].to_string();
        self.num_emitted = self.num_emitted.max(end);
        TextDelta { text, stopped_on }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(
        stops: &[&str],
        include: bool,
        pieces: &[&str],
    ) -> (Vec<String>, Option<String>, String) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect(), include);
        let mut out = Vec::new();
        for p in pieces {
            let d = m.push(p);
            out.push(d.text);
            if d.stopped_on.is_some() {
                return (out, d.stopped_on, m.text().to_string());
            }
        }
        out.push(m.flush());
        (out, None, m.text().to_string())
    }

    #[test]
    fn stop_string_split_across_tokens_is_cut_and_never_emitted() {
        let (out, stop, text) = run(
            &["\n\nUser:"],
            false,
            &["Hi", " there", "\n", "\nUs", "er:", " more"],
        );
        assert_eq!(stop.as_deref(), Some("\n\nUser:"));
        assert_eq!(text, "Hi there");
        assert_eq!(out, vec!["Hi", " there", "", "", ""]);
    }

    #[test]
    fn held_text_is_released_when_it_stops_matching() {
        let (out, stop, _) = run(&["STOP"], false, &["a S", "T", "x", "y"]);
        assert_eq!(stop, None);
        assert_eq!(out, vec!["a ", "", "STx", "y", ""]);
        // Held back at the end, then flushed when the sequence ends for another reason.
        let (out, _, _) = run(&["STOP"], false, &["go ST"]);
        assert_eq!(out, vec!["go ", "ST"]);
    }

    #[test]
    fn include_stop_str_and_earliest_match_wins() {
        let (out, stop, text) = run(&["cd", "b"], true, &["abcd"]);
        assert_eq!(stop.as_deref(), Some("b"));
        assert_eq!(text, "ab");
        assert_eq!(out, vec!["ab"]);
        let (_, stop, text) = run(&["lo w", "wor"], false, &["hel", "lo ", "world"]);
        assert_eq!(stop.as_deref(), Some("lo w"));
        assert_eq!(text, "hel");
    }

    #[test]
    fn no_stops_emits_everything_and_multibyte_stops_hold_whole_chars() {
        let (out, _, _) = run(&[], false, &["a", "b"]);
        assert_eq!(out, vec!["a", "b", ""]);
        let (out, stop, text) = run(&["世界"], false, &["你好世", "界!"]);
        assert_eq!(out, vec!["你好", ""]);
        assert_eq!(stop.as_deref(), Some("世界"));
        assert_eq!(text, "你好");
    }
}
