//! The generation endpoints' shared machinery: submitting resolved prompts to the engine, then
//! either collecting every event (plain JSON) or turning them into SSE chunks as they come
//! (sse.rs).

use std::time::{SystemTime, UNIX_EPOCH};

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use futures_util::stream::{self, BoxStream};
use tokio::sync::mpsc;

use super::AppState;
use super::error::ApiError;
use super::logprobs::{chat_logprob, completion_logprobs, echoed_logprobs, prompt_logprobs};
use super::metrics::RequestTimer;
use super::reasoning::ReasoningParser;
use super::responses::{
    ChatChoice, ChatCompletionResponse, ChatLogprobs, ChatMessageOut, CompletionChoice,
    CompletionResponse, FunctionCallOut, ToolCallOut, Usage,
};
use crate::engine::handle::{GenerateRequest, StreamEvent};
use crate::request::SamplingParams;
use crate::sampler::Logprobs;

/// Which endpoint's JSON shapes to produce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// /v1/completions
    Completion,
    /// /v1/chat/completions
    Chat,
}

/// One prompt ready for the engine.
pub struct Prompt {
    /// Text to echo (completions with `echo`).
    pub echo: Option<String>,
    /// Token ids.
    pub ids: Vec<u32>,
}

/// A whole request, resolved.
pub struct ResolvedRequest {
    /// Response shapes.
    pub flavor: Endpoint,
    /// Model name to report.
    pub model: String,
    /// Prompts (completions may send several; chat one).
    pub prompts: Vec<Prompt>,
    /// Resolved parameters (shared by all prompts).
    pub params: SamplingParams,
    /// Prefix-cache salt.
    pub cache_salt: Option<String>,
    /// Streaming with a final usage chunk.
    pub include_usage: bool,
    /// When the request arrived.
    pub arrived: std::time::Instant,
    /// `params.structured_outputs`, compiled (each prompt's sequences get their own copies).
    pub guide: Option<crate::guided::Guide>,
    /// How tool calls come out of a chat answer, when the request calls tools.
    pub tools: Option<super::tools::ToolCalling>,
    /// How a chat answer's reasoning is split from its content, if it is.
    pub reasoning: Option<ReasoningParser>,
    /// What becomes of the prompt's logprobs (`params.prompt_logprobs`).
    pub prompt_out: PromptOut,
}

/// What a request does with its prompt's logprobs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PromptOut {
    /// The response's `prompt_logprobs` (vLLM's field).
    pub field: bool,
    /// Completions with `echo` and `logprobs`: the echoed prompt's tokens lead the logprobs.
    pub echoed: bool,
    /// Completions with `echo` and `max_tokens` 0: the prompt alone is answered (one token is
    /// generated and left out, as vLLM does).
    pub echo_only: bool,
}

/// A tagged event: which choice (`prompt * n + index`) and what happened.
pub type ChoiceEvent = (usize, StreamEvent);

impl ResolvedRequest {
    /// Whether the reasoning split keeps harmony's calls for the `openai` tool parser.
    pub fn harmony_calls(&self) -> bool {
        self.tools.as_ref().is_some_and(|t| t.reads_harmony())
    }
}

/// Seconds since the Unix epoch.
pub fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// A random hex id with `prefix`.
pub fn random_id(prefix: &str) -> String {
    let mut rng = crate::sampler::SeededRng::from_entropy();
    format!(
        "{prefix}{:016x}{:08x}",
        rng.next_u64(),
        rng.next_u64() as u32
    )
}

/// Submits every prompt of `job` to the engine: one stream of all its choices' events.
pub async fn submit_all(
    state: &AppState,
    job: &ResolvedRequest,
) -> Result<BoxStream<'static, ChoiceEvent>, ApiError> {
    let n = job.params.n;
    let mut streams = Vec::with_capacity(job.prompts.len());
    for (i, prompt) in job.prompts.iter().enumerate() {
        let rx: mpsc::UnboundedReceiver<StreamEvent> = state
            .engine
            .submit(GenerateRequest {
                prompt_token_ids: prompt.ids.clone(),
                params: job.params.clone(),
                cache_salt: job.cache_salt.clone(),
                guide: job.guide.clone(),
            })
            .await?;
        streams.push(
            stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|e| (e, rx)) })
                .map(move |e| {
                    let index = match &e {
                        StreamEvent::Token { index, .. } => i * n + index,
                        StreamEvent::Error(_) => i * n,
                    };
                    (index, e)
                })
                .boxed(),
        );
    }
    let prompt_tokens: usize = job.prompts.iter().map(|p| p.ids.len()).sum();
    state
        .metrics
        .prompt_tokens
        .fetch_add(prompt_tokens as u64, std::sync::atomic::Ordering::Relaxed);
    Ok(stream::select_all(streams).boxed())
}

/// One choice's whole completion.
#[derive(Default)]
pub struct Choice {
    /// The text.
    pub text: String,
    /// Its tokens.
    pub tokens: Vec<u32>,
    /// Their logprobs, when asked for.
    pub logprobs: Vec<Logprobs>,
    /// Why it ended.
    pub finish: Option<&'static str>,
    /// The stop string that ended it, if one did.
    pub stopped_on: Option<String>,
    /// The prompt's logprobs (of its tokens `1..`), when asked for.
    pub prompt_logprobs: Option<Vec<Logprobs>>,
}

/// Runs `job` to completion: every choice, in order (`prompt * n + index`).
pub async fn collect(state: &AppState, job: &ResolvedRequest) -> Result<Vec<Choice>, ApiError> {
    let mut events = submit_all(state, job).await?;
    let mut choices: Vec<Choice> = (0..job.prompts.len() * job.params.n)
        .map(|_| Choice::default())
        .collect();
    let mut timer = RequestTimer::new(job.arrived, choices.len());
    while let Some((index, event)) = events.next().await {
        match event {
            StreamEvent::Token {
                text,
                token_id,
                logprobs,
                finish,
                stopped_on,
                prompt_logprobs,
                ..
            } => {
                timer.token(&state.metrics, index);
                if let Some(f) = finish {
                    state.metrics.finished(f);
                }
                let c = &mut choices[index];
                c.stopped_on = stopped_on;
                c.text.push_str(&text);
                c.tokens.push(token_id);
                c.logprobs.extend(logprobs);
                c.finish = finish.map(|f| f.as_str());
                if prompt_logprobs.is_some() {
                    c.prompt_logprobs = prompt_logprobs;
                }
            }
            StreamEvent::Error(e) => return Err(e.into()),
        }
    }
    timer.done(&state.metrics);
    Ok(choices)
}

/// Runs the job to completion and answers with one JSON body.
pub async fn respond_json(state: &AppState, job: ResolvedRequest) -> Result<Response, ApiError> {
    let mut choices = collect(state, &job).await?;
    let n = job.params.n;
    let prompt_tokens: usize = job.prompts.iter().map(|p| p.ids.len()).sum();
    if job.prompt_out.echo_only {
        for c in &mut choices {
            (c.text, c.tokens, c.logprobs) = Default::default();
        }
    }
    let completion_tokens: usize = choices.iter().map(|c| c.tokens.len()).sum();
    // Each choice's prompt logprobs, in vLLM's shape.
    let vllm_prompt: Vec<_> = choices
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let lps = c.prompt_logprobs.as_deref().unwrap_or_default();
            job.prompt_out
                .field
                .then(|| prompt_logprobs(state, &job.prompts[i / n].ids, lps))
        })
        .collect();
    let usage = Usage::new(prompt_tokens, completion_tokens);
    let want_logprobs = job.params.logprobs.is_some();
    let body = match job.flavor {
        Endpoint::Chat => {
            let choices = choices
                .into_iter()
                .enumerate()
                .map(|(index, c)| {
                    let (reasoning, text) = match job.reasoning {
                        Some(parser) => {
                            let split = parser.split_keeping_calls(&c.text, job.harmony_calls());
                            (Some(split.reasoning), split.content)
                        }
                        None => (None, c.text),
                    };
                    let (content, tool_calls, finish) = chat_answer(&job, text, c.finish);
                    ChatChoice {
                        index,
                        message: ChatMessageOut {
                            role: "assistant".into(),
                            content,
                            reasoning_content: reasoning.filter(|r| !r.is_empty()),
                            tool_calls,
                        },
                        logprobs: want_logprobs.then(|| ChatLogprobs {
                            content: c
                                .tokens
                                .iter()
                                .zip(&c.logprobs)
                                .map(|(&t, lp)| chat_logprob(state, t, lp))
                                .collect(),
                        }),
                        finish_reason: finish.map(str::to_string),
                    }
                })
                .collect();
            serde_json::to_value(ChatCompletionResponse {
                id: random_id("chatcmpl-"),
                object: "chat.completion".into(),
                created: now_secs(),
                model: job.model,
                choices,
                usage,
                prompt_logprobs: vllm_prompt.into_iter().next().flatten(),
            })
        }
        Endpoint::Completion => {
            let choices = choices
                .into_iter()
                .enumerate()
                .map(|(index, c)| {
                    let prompt = &job.prompts[index / n];
                    let echo = prompt.echo.clone().unwrap_or_default();
                    let logprobs = want_logprobs.then(|| {
                        let after = completion_logprobs(
                            state,
                            &c.tokens,
                            &c.logprobs,
                            echo.chars().count(),
                        );
                        match (job.prompt_out.echoed, &c.prompt_logprobs) {
                            (true, Some(lps)) => echoed_logprobs(state, &prompt.ids, lps, after),
                            _ => after,
                        }
                    });
                    CompletionChoice {
                        index,
                        text: format!("{echo}{}", c.text),
                        logprobs,
                        finish_reason: c.finish.map(str::to_string),
                        prompt_logprobs: vllm_prompt[index].clone(),
                    }
                })
                .collect();
            serde_json::to_value(CompletionResponse {
                id: random_id("cmpl-"),
                object: "text_completion".into(),
                created: now_secs(),
                model: job.model,
                choices,
                usage,
            })
        }
    };
    let body = body.map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    Ok(axum::Json(body).into_response())
}

/// A chat answer's content, tool calls and finish reason: the text as it is, or, for a request
/// calling tools, the calls read out of it (`super::tools`).
pub fn chat_answer(
    job: &ResolvedRequest,
    text: String,
    finish: Option<&'static str>,
) -> (Option<String>, Vec<ToolCallOut>, Option<&'static str>) {
    let Some(calling) = &job.tools else {
        return (Some(text), Vec::new(), finish);
    };
    let parsed = calling.extract(&text);
    let calls: Vec<ToolCallOut> = parsed
        .calls
        .into_iter()
        .map(|c| ToolCallOut {
            id: random_id("call_"),
            kind: "function".into(),
            function: FunctionCallOut {
                name: c.name,
                arguments: c.arguments,
            },
        })
        .collect();
    let finish = calling.finish_reason(!calls.is_empty(), finish);
    (parsed.content, calls, finish)
}
