//! GBNF (llama.cpp's grammar format) to llguidance's Lark dialect, so a request can send either.
//!
//! GBNF: `name ::= body` rules (a new rule starts at `name ::=`, bodies may span lines), strings
//! in double quotes, character classes in brackets, `.` for any character, `( )`, `|`, `* + ?`
//! and `{m,n}`, `#` comments, and `root` as the start rule. Lark wants lowercase rule names
//! without `-`, one rule per line here, regexes between slashes, and `start` as the start rule.

/// One lexical element of a GBNF grammar.
#[derive(Debug, PartialEq)]
enum Token {
    Name(String),
    Define,
    /// A string literal, unescaped.
    Literal(String),
    /// A character class, brackets included, as written.
    Class(String),
    Any,
    /// Punctuation passed through: `( ) | * + ?` and `{m,n}`.
    Op(String),
}

/// Translates a GBNF grammar to Lark, or says where it could not read it.
pub fn to_lark(gbnf: &str) -> Result<String, String> {
    let tokens = lex(gbnf)?;
    let mut rules: Vec<(String, Vec<String>)> = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        let starts_rule = matches!(tokens.get(i + 1), Some(Token::Define));
        match &tokens[i] {
            Token::Name(name) if starts_rule => {
                rules.push((rule_name(name), Vec::new()));
                i += 2;
                continue;
            }
            Token::Define => return Err("GBNF: `::=` without a rule name before it".into()),
            _ => {}
        }
        let Some((_, body)) = rules.last_mut() else {
            return Err("GBNF: text before the first `name ::=` rule".into());
        };
        body.push(match &tokens[i] {
            Token::Name(n) => rule_name(n),
            Token::Literal(s) => serde_json::to_string(s).expect("strings serialize"),
            Token::Class(c) => format!("/{}/", c.replace('/', "\\/")),
            Token::Any => "/(?s:.)/".to_string(),
            Token::Op(op) => op.clone(),
            Token::Define => unreachable!("handled above"),
        });
        i += 1;
    }
    if !rules.iter().any(|(name, _)| name == "root") {
        return Err("GBNF: the grammar has no `root` rule".into());
    }
    let mut lark = String::from("start: root\n");
    for (name, body) in rules {
        let body = if body.is_empty() {
            "\"\"".to_string()
        } else {
            body.join(" ")
        };
        lark.push_str(&format!("{name}: {body}\n"));
    }
    Ok(lark)
}

/// A GBNF rule name as a Lark rule name.
fn rule_name(name: &str) -> String {
    name.to_lowercase().replace('-', "_")
}

fn lex(src: &str) -> Result<Vec<Token>, String> {
    let chars: Vec<char> = src.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    let err = |i: usize, what: &str| {
        let line = chars[..i.min(chars.len())]
            .iter()
            .filter(|&&c| c == '\n')
            .count()
            + 1;
        format!("GBNF: {what} on line {line}")
    };
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c == '#' {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if src_at(&chars, i, "::=") {
            tokens.push(Token::Define);
            i += 3;
        } else if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || "-_".contains(chars[i])) {
                i += 1;
            }
            tokens.push(Token::Name(chars[start..i].iter().collect()));
        } else if c == '"' {
            let mut text = String::new();
            i += 1;
            loop {
                match chars.get(i) {
                    None => return Err(err(i, "unterminated string")),
                    Some('"') => break,
                    Some('\\') => {
                        let (ch, used) = unescape(&chars[i + 1..]).ok_or(err(i, "bad escape"))?;
                        text.push(ch);
                        i += 1 + used;
                    }
                    Some(&ch) => {
                        text.push(ch);
                        i += 1;
                    }
                }
            }
            i += 1;
            tokens.push(Token::Literal(text));
        } else if c == '[' {
            let start = i;
            i += 1;
            while i < chars.len() && chars[i] != ']' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            if i >= chars.len() {
                return Err(err(start, "unterminated character class"));
            }
            i += 1;
            tokens.push(Token::Class(chars[start..i].iter().collect()));
        } else if c == '.' {
            tokens.push(Token::Any);
            i += 1;
        } else if c == '{' {
            let start = i;
            while i < chars.len() && chars[i] != '}' {
                i += 1;
            }
            if i >= chars.len() {
                return Err(err(start, "unterminated repetition"));
            }
            i += 1;
            tokens.push(Token::Op(chars[start..i].iter().collect()));
        } else if "()|*+?".contains(c) {
            tokens.push(Token::Op(c.to_string()));
            i += 1;
        } else {
            return Err(err(i, &format!("unexpected {c:?}")));
        }
    }
    Ok(tokens)
}

fn src_at(chars: &[char], i: usize, s: &str) -> bool {
    s.chars()
        .enumerate()
        .all(|(k, c)| chars.get(i + k) == Some(&c))
}

/// The character an escape (after its backslash) stands for, and how many characters it used.
fn unescape(rest: &[char]) -> Option<(char, usize)> {
    let hex = |n: usize| -> Option<(char, usize)> {
        let digits: String = rest.get(1..=n)?.iter().collect();
        let code = u32::from_str_radix(&digits, 16).ok()?;
        Some((char::from_u32(code)?, 1 + n))
    };
    match rest.first()? {
        'n' => Some(('\n', 1)),
        't' => Some(('\t', 1)),
        'r' => Some(('\r', 1)),
        'x' => hex(2),
        'u' => hex(4),
        'U' => hex(8),
        &other => Some((other, 1)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn translates_rules_strings_classes_and_repetitions() {
        let gbnf =
            "# yes or no\nroot ::= answer \"\\n\"\nanswer ::= (\"yes\" | \"no\")\n   [a-z/]{0,3} .";
        let lark = to_lark(gbnf).unwrap();
        assert_eq!(
            lark,
            "start: root\nroot: answer \"\\n\"\nanswer: ( \"yes\" | \"no\" ) /[a-z\\/]/ {0,3} /(?s:.)/\n"
        );
    }

    #[test]
    fn names_what_it_cannot_read() {
        assert!(
            to_lark("root ::= \"open")
                .unwrap_err()
                .contains("unterminated string")
        );
        assert!(
            to_lark("answer ::= \"x\"")
                .unwrap_err()
                .contains("no `root` rule")
        );
        assert!(
            to_lark("root ::= @")
                .unwrap_err()
                .contains("unexpected '@' on line 1")
        );
    }
}
