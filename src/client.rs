//! `pagewise chat` and `pagewise complete`: terminal clients of an OpenAI-compatible server, as
//! vLLM's `vllm chat` and `vllm complete`. Each line read is a user message (chat: the conversation
//! is kept and sent whole each turn) or a prompt (complete), streamed back token by token.
//! `/clear` forgets the conversation; `/exit`, `/quit` or the end of input stop. The binary starts
//! a server in-process when no `--url` is given (`main.rs`); this module only speaks HTTP.

use std::io::{BufRead, Write};

use futures_util::StreamExt;
use serde_json::{Value, json};

use crate::sse::SseEvents;

/// What the client sends, and to whom.
#[derive(Clone, Debug, Default)]
pub struct ClientSettings {
    /// The API's base URL, ending in `/v1`.
    pub url: String,
    /// The model to ask for; `None`: the first the server lists.
    pub model_name: Option<String>,
    /// Bearer key.
    pub api_key: Option<String>,
    /// A system message opening every conversation (chat only).
    pub system_prompt: Option<String>,
    /// `max_tokens` of each request (the server's default when `None`).
    pub max_tokens: Option<usize>,
    /// `temperature` of each request (the server's default when `None`).
    pub temperature: Option<f32>,
}

/// Which endpoint the lines go to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `/v1/chat/completions`, keeping the conversation.
    Chat,
    /// `/v1/completions`, each line alone.
    Complete,
}

/// A client failure: the server unreachable, or a request it refused.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server could not be reached.
    #[error(
        "cannot reach {url}: {cause} (is a server running there? Without --url, pagewise starts one)"
    )]
    Unreachable {
        /// The URL tried.
        url: String,
        /// Why.
        cause: String,
    },
    /// The server answered with an error.
    #[error("{0}")]
    Refused(String),
    /// Writing to the terminal failed.
    #[error("terminal: {0}")]
    Io(#[from] std::io::Error),
}

/// The running conversation and the HTTP client.
pub struct Client {
    settings: ClientSettings,
    model: String,
    http: reqwest::Client,
    messages: Vec<Value>,
}

impl Client {
    /// Connects: the model named, or the first the server lists (`GET /v1/models`).
    pub async fn connect(settings: ClientSettings) -> Result<Self, ClientError> {
        let http = reqwest::Client::new();
        let model = match &settings.model_name {
            Some(m) => m.clone(),
            None => {
                let url = format!("{}/models", settings.url);
                let v = send(with_key(http.get(&url), &settings.api_key), &url)
                    .await?
                    .json::<Value>()
                    .await
                    .map_err(|e| ClientError::Refused(format!("{url}: {e}")))?;
                v["data"][0]["id"]
                    .as_str()
                    .ok_or_else(|| ClientError::Refused(format!("{url} lists no model")))?
                    .to_string()
            }
        };
        let mut client = Client {
            settings,
            model,
            http,
            messages: Vec::new(),
        };
        client.clear();
        Ok(client)
    }

    /// The model the requests name.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// Forgets the conversation (the system prompt stays).
    pub fn clear(&mut self) {
        self.messages = match &self.settings.system_prompt {
            Some(s) => vec![json!({"role": "system", "content": s})],
            None => Vec::new(),
        };
    }

    /// Sends `text` (a user message or a prompt) and writes the answer to `out` as it streams;
    /// returns the whole answer. A chat turn the server refuses is not kept.
    pub async fn send(
        &mut self,
        mode: Mode,
        text: &str,
        out: &mut impl Write,
    ) -> Result<String, ClientError> {
        let (path, mut body) = match mode {
            Mode::Chat => {
                self.messages.push(json!({"role": "user", "content": text}));
                ("chat/completions", json!({"messages": self.messages}))
            }
            Mode::Complete => ("completions", json!({"prompt": text})),
        };
        body["model"] = json!(self.model);
        body["stream"] = json!(true);
        if let Some(n) = self.settings.max_tokens {
            body["max_tokens"] = json!(n);
        }
        if let Some(t) = self.settings.temperature {
            body["temperature"] = json!(t);
        }
        let url = format!("{}/{path}", self.settings.url);
        let answer = self.stream(&url, &body, mode, out).await;
        match (&answer, mode) {
            (Ok(a), Mode::Chat) => self
                .messages
                .push(json!({"role": "assistant", "content": a})),
            (Err(_), Mode::Chat) => {
                self.messages.pop();
            }
            _ => {}
        }
        answer
    }

    async fn stream(
        &self,
        url: &str,
        body: &Value,
        mode: Mode,
        out: &mut impl Write,
    ) -> Result<String, ClientError> {
        let req = with_key(self.http.post(url).json(body), &self.settings.api_key);
        let mut stream = send(req, url).await?.bytes_stream();
        let (mut events, mut answer) = (SseEvents::default(), String::new());
        while let Some(piece) = stream.next().await {
            let piece =
                piece.map_err(|e| ClientError::Refused(format!("the stream broke: {e}")))?;
            for data in events.push(&piece) {
                if data == "[DONE]" {
                    writeln!(out)?;
                    return Ok(answer);
                }
                let v: Value = serde_json::from_str(&data)
                    .map_err(|e| ClientError::Refused(format!("a stream event: {e}")))?;
                if let Some(e) = v.get("error") {
                    return Err(ClientError::Refused(error_message(e)));
                }
                let choice = &v["choices"][0];
                let text = match mode {
                    Mode::Chat => choice["delta"]["content"].as_str(),
                    Mode::Complete => choice["text"].as_str(),
                };
                if let Some(t) = text {
                    write!(out, "{t}")?;
                    out.flush()?;
                    answer.push_str(t);
                }
            }
        }
        Err(ClientError::Refused(
            "the stream ended without [DONE]".into(),
        ))
    }
}

fn with_key(req: reqwest::RequestBuilder, key: &Option<String>) -> reqwest::RequestBuilder {
    match key {
        Some(k) => req.bearer_auth(k),
        None => req,
    }
}

/// Sends `req`; an answer that is not a success is its error message.
async fn send(req: reqwest::RequestBuilder, url: &str) -> Result<reqwest::Response, ClientError> {
    let resp = req.send().await.map_err(|e| ClientError::Unreachable {
        url: url.to_string(),
        cause: e.to_string(),
    })?;
    if resp.status().is_success() {
        return Ok(resp);
    }
    let status = resp.status();
    let text = resp.text().await.unwrap_or_default();
    let message = serde_json::from_str::<Value>(&text)
        .ok()
        .and_then(|v| v.get("error").map(error_message))
        .unwrap_or(text);
    Err(ClientError::Refused(format!("HTTP {status}: {message}")))
}

/// An OpenAI error object's message (or the object itself).
fn error_message(e: &Value) -> String {
    e["message"]
        .as_str()
        .map_or_else(|| e.to_string(), str::to_string)
}

/// Runs the loop: a prompt (`> `), a line, the streamed answer, until `/exit`, `/quit` or the end
/// of `input`. A refused request prints `error: …` and the loop goes on. With `quick`, sends only
/// that text and returns.
pub async fn run(
    settings: ClientSettings,
    mode: Mode,
    quick: Option<String>,
    input: &mut impl BufRead,
    out: &mut impl Write,
) -> Result<(), ClientError> {
    let mut client = Client::connect(settings).await?;
    if let Some(text) = quick {
        client.send(mode, &text, out).await?;
        return Ok(());
    }
    writeln!(
        out,
        "{} with {} ({}; /clear forgets, /exit or Ctrl-D ends)",
        match mode {
            Mode::Chat => "chatting",
            Mode::Complete => "completing",
        },
        client.model(),
        client.settings.url
    )?;
    loop {
        write!(out, "> ")?;
        out.flush()?;
        let mut line = String::new();
        if input.read_line(&mut line)? == 0 {
            writeln!(out)?;
            return Ok(());
        }
        match line.trim() {
            "" => continue,
            "/exit" | "/quit" => return Ok(()),
            "/clear" => {
                client.clear();
                continue;
            }
            _ => {}
        }
        let text = line.trim_end_matches(['\n', '\r']);
        if let Err(e) = client.send(mode, text, out).await {
            match e {
                ClientError::Io(e) => return Err(e.into()),
                other => writeln!(out, "error: {other}")?,
            }
        }
    }
}
