//! Chat templates: the model's Jinja template rendered the way Hugging Face transformers renders it
//! (`trim_blocks` and `lstrip_blocks` on, Python string methods, `raise_exception`, and a `tojson`
//! that writes what Python's `json.dumps` writes, `strftime_now`, `tools` and `documents` always
//! defined). tests/chat_templates.rs holds pagewise to transformers on real families' templates.

mod pyjson;
mod strftime;

use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::value::Value;
use minijinja::{Environment, ErrorKind, syntax::SyntaxConfig};
use serde::{Deserialize, Serialize};

/// One chat message, as the OpenAI API and `Llm::chat` take it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, `tool`...
    pub role: String,
    /// The text.
    pub content: String,
}

impl ChatMessage {
    /// A message of `role` with `content`.
    pub fn new(role: &str, content: &str) -> Self {
        ChatMessage {
            role: role.to_string(),
            content: content.to_string(),
        }
    }
}

/// A chat template could not be compiled or rendered.
#[derive(Debug, Clone, thiserror::Error)]
#[error("chat template error: {0}")]
pub struct ChatError(pub String);

impl From<minijinja::Error> for ChatError {
    fn from(e: minijinja::Error) -> Self {
        // `raise_exception` messages are the template author's words: pass them through alone.
        match e.kind() {
            ErrorKind::InvalidOperation => ChatError(e.detail().unwrap_or_default().to_string()),
            _ => ChatError(format!("{e:#}")),
        }
    }
}

/// A compiled chat template with the special tokens it may refer to.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
    /// What `strftime_now` reads as now, in seconds since the Unix epoch; `None`: the clock.
    fixed_time: Option<i64>,
}

fn raise_exception(message: String) -> Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
}

impl ChatTemplate {
    /// Compiles `source`; `bos_token` / `eos_token` are the strings the template may print.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self, ChatError> {
        let mut env = Environment::new();
        env.set_syntax(
            SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()
                .map_err(|e| ChatError(e.to_string()))?,
        );
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", pyjson::tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_template_owned("chat", source.to_string())?;
        Ok(ChatTemplate {
            env,
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
            fixed_time: None,
        })
    }

    /// Renders as if now were `unix_seconds` (UTC) for templates that print today's date, so a
    /// prompt can be reproduced.
    pub fn with_fixed_time(mut self, unix_seconds: i64) -> Self {
        self.fixed_time = Some(unix_seconds);
        self
    }

    /// Renders `messages` (a JSON array of message objects). `extra` holds `tools` and the
    /// `chat_template_kwargs` (they may not override `messages`). As in transformers, `tools` and
    /// `documents` are none when not given, and `strftime_now(format)` formats the current time.
    pub fn render(
        &self,
        messages: &serde_json::Value,
        add_generation_prompt: bool,
        extra: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String, ChatError> {
        let mut ctx = extra.clone();
        ctx.insert("bos_token".into(), self.bos_token.clone().into());
        ctx.insert("eos_token".into(), self.eos_token.clone().into());
        ctx.insert("add_generation_prompt".into(), add_generation_prompt.into());
        ctx.insert("messages".into(), messages.clone());
        for name in ["tools", "documents"] {
            ctx.entry(name).or_insert(serde_json::Value::Null);
        }
        let now = self.fixed_time.unwrap_or_else(|| {
            let since = SystemTime::now().duration_since(UNIX_EPOCH);
            since.map_or(0, |d| d.as_secs() as i64)
        });
        let strftime_now =
            Value::from_function(move |format: String| strftime::strftime(&format, now));
        let template = self.env.get_template("chat")?;
        Ok(template.render(minijinja::context! {
            strftime_now => strftime_now,
            ..Value::from(minijinja::value::Serde(&ctx))
        })?)
    }

    /// Renders plain role/content messages with the generation prompt.
    pub fn render_messages(&self, messages: &[ChatMessage]) -> Result<String, ChatError> {
        let json = serde_json::to_value(messages).map_err(|e| ChatError(e.to_string()))?;
        self.render(&json, true, &serde_json::Map::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn chatml_renders_like_transformers() {
        let t = ChatTemplate::new(CHATML, "<s>", "</s>").unwrap();
        let out = t
            .render_messages(&[
                ChatMessage::new("system", "Be brief."),
                ChatMessage::new("user", "Hi!"),
            ])
            .unwrap();
        assert_eq!(
            out,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn trim_and_lstrip_blocks_python_methods_and_special_tokens() {
        let src = "{{ bos_token }}\n{% for m in messages %}\n    {% if m.role == 'user' %}\n[{{ m.content.strip().upper() }}]\n    {% endif %}\n{% endfor %}\n{{ eos_token }}";
        let t = ChatTemplate::new(src, "<s>", "</s>").unwrap();
        let out = t
            .render(
                &json!([{"role": "user", "content": "  hi  "}]),
                false,
                &Default::default(),
            )
            .unwrap();
        assert_eq!(out, "<s>\n[HI]\n</s>");
    }

    #[test]
    fn raise_exception_and_kwargs_and_python_tojson() {
        let src = "{% if messages[0].role != 'user' %}{{ raise_exception('Conversation must start with user') }}{% endif %}{{ tools | tojson }}|{{ tools | tojson(indent=2) }}|{{ flag }}";
        let t = ChatTemplate::new(src, "", "").unwrap();
        let err = t
            .render(
                &json!([{"role": "assistant", "content": "x"}]),
                true,
                &Default::default(),
            )
            .unwrap_err();
        assert_eq!(err.0, "Conversation must start with user");
        let mut kw = serde_json::Map::new();
        kw.insert(
            "tools".into(),
            json!([{"name": "f<x>", "n": 1, "list": [1.5, "é"]}]),
        );
        kw.insert("flag".into(), json!(true));
        let out = t
            .render(&json!([{"role": "user", "content": "x"}]), true, &kw)
            .unwrap();
        assert_eq!(
            out,
            "[{\"name\": \"f<x>\", \"n\": 1, \"list\": [1.5, \"é\"]}]|[\n  {\n    \"name\": \"f<x>\",\n    \"n\": 1,\n    \"list\": [\n      1.5,\n      \"é\"\n    ]\n  }\n]|True"
        );
    }

    #[test]
    fn a_broken_template_fails_at_load() {
        assert!(ChatTemplate::new("{% for x in %}", "", "").is_err());
    }
}
