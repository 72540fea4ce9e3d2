//! HTTP handlers. Requests are validated and resolved here; the engine sees only token ids and
//! resolved parameters.

use axum::extract::{FromRequest, Request, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::AppState;
use super::error::ApiError;
use super::generate::{Endpoint, Prompt, PromptOut, ResolvedRequest, respond_json};
use super::protocol::{ChatRequest, CompletionRequest, PromptInput, Role, SamplingFields};
use super::sse::respond_sse;
use super::{structured, tools, unsupported};
use crate::request::{MAX_LOGPROBS, check_num_seqs};

/// `Json<T>` whose rejections are OpenAI-shaped errors (400 bad JSON or field, 413, 415).
pub struct ApiJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        use axum::extract::rejection::JsonRejection;
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(v)) => Ok(ApiJson(v)),
            Err(JsonRejection::MissingJsonContentType(_)) => Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "Expected request with `Content-Type: application/json`.",
            )),
            Err(JsonRejection::BytesRejection(e))
                if e.status() == StatusCode::PAYLOAD_TOO_LARGE =>
            {
                Err(ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "The request body is too large.",
                ))
            }
            Err(e) => Err(ApiError::new(StatusCode::BAD_REQUEST, e.body_text())),
        }
    }
}

/// Tokenizes off the async runtime.
pub(super) async fn encode(
    state: &AppState,
    text: String,
    special: bool,
) -> Result<Vec<u32>, ApiError> {
    let tokenizer = state.info.tokenizer.clone();
    tokio::task::spawn_blocking(move || {
        tokenizer
            .encode(text.as_str(), special)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| {
                ApiError::new(StatusCode::BAD_REQUEST, format!("tokenization failed: {e}"))
            })
    })
    .await
    .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
}

/// Output budget left after the prompt; 400 in vLLM's words when the prompt alone fills the context.
fn default_max_tokens(
    state: &AppState,
    prompt_len: usize,
    requested: Option<usize>,
) -> Result<usize, ApiError> {
    let max_len = state.info.max_model_len;
    let remaining = max_len.saturating_sub(prompt_len);
    let want = requested.unwrap_or(remaining);
    // Saturating: a `max_tokens` near usize::MAX must not wrap past the check.
    let total = prompt_len.saturating_add(want);
    if remaining == 0 || total > max_len {
        return Err(ApiError::invalid(
            "messages",
            format!(
                "This model's maximum context length is {max_len} tokens. However, you requested {total} tokens \
                 ({prompt_len} in the messages, {want} in the completion). Please reduce the length of the \
                 messages or completion."
            ),
        ));
    }
    Ok(want)
}

/// POST /v1/completions
pub async fn completions(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<CompletionRequest>,
) -> Result<Response, ApiError> {
    let arrived = std::time::Instant::now();
    let model = state.check_model(req.model.as_deref())?;
    unsupported::refuse_unhonoured(&req.unknown)?;
    state.note_unknown_fields(req.unknown.keys());
    let prompts: Vec<(Option<String>, Option<Vec<u32>>)> = match req.prompt {
        PromptInput::Text(t) => vec![(Some(t), None)],
        PromptInput::Texts(ts) => ts.into_iter().map(|t| (Some(t), None)).collect(),
        PromptInput::Tokens(ids) => vec![(None, Some(ids))],
        PromptInput::TokenLists(lists) => lists.into_iter().map(|ids| (None, Some(ids))).collect(),
    };
    if prompts.is_empty() {
        return Err(ApiError::invalid("prompt", "prompt must not be empty."));
    }
    check_n(&state, &req.sampling, req.best_of, prompts.len())?;
    let mut resolved = Vec::with_capacity(prompts.len());
    for (text, ids) in prompts {
        let ids = match (ids, &text) {
            (Some(ids), _) => ids,
            (None, Some(t)) => encode(&state, t.clone(), true).await?,
            (None, None) => unreachable!("a prompt is text or ids"),
        };
        if ids.is_empty() {
            return Err(ApiError::invalid("prompt", "prompt must not be empty."));
        }
        let echo = if req.echo {
            Some(
                text.unwrap_or_else(|| state.info.tokenizer.decode(&ids, true).unwrap_or_default()),
            )
        } else {
            None
        };
        resolved.push(Prompt { echo, ids });
    }
    let longest = resolved.iter().map(|p| p.ids.len()).max().unwrap_or(0);
    // `echo` with `max_tokens` 0 answers the prompt alone (its logprobs: how evaluation
    // harnesses score text); one token is generated and left out, as vLLM does.
    let echo_only = req.echo && req.sampling.max_tokens == Some(0);
    let requested = if echo_only {
        Some(1)
    } else {
        req.sampling.max_tokens
    };
    let max_tokens = default_max_tokens(&state, longest, requested)?;
    let mut params = req
        .sampling
        .resolve(Some(max_tokens), req.logprobs, max_tokens)?;
    let prompt_out = PromptOut {
        field: check_prompt_logprobs(&req.sampling)?,
        echoed: req.echo && req.logprobs.is_some(),
        echo_only,
    };
    if prompt_out.echoed {
        let k = req
            .logprobs
            .unwrap_or(0)
            .max(params.prompt_logprobs.unwrap_or(0));
        params.prompt_logprobs = Some(k);
    }
    params.validate(Some(state.info.vocab_size))?;
    let guide = match &params.structured_outputs {
        Some(c) => Some(structured::compile(&state, c).await?),
        None => None,
    };
    let job = ResolvedRequest {
        flavor: Endpoint::Completion,
        model,
        prompts: resolved,
        params,
        cache_salt: req.sampling.cache_salt.clone(),
        include_usage: req.sampling.include_usage(),
        arrived,
        guide,
        tools: None,
        reasoning: None,
        prompt_out,
    };
    respond(state, job, req.sampling.is_stream()).await
}

/// POST /v1/chat/completions
pub async fn chat_completions(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<ChatRequest>,
) -> Result<Response, ApiError> {
    let stream = req.sampling.is_stream();
    let job = chat_job(&state, &req, std::time::Instant::now()).await?;
    respond(state, job, stream).await
}

/// A chat request, resolved into a job: checked, rendered through the chat template,
/// tokenized, its tools and output constraint resolved and compiled (`super::responses_api`
/// resolves its requests through this too).
pub async fn chat_job(
    state: &AppState,
    req: &ChatRequest,
    arrived: std::time::Instant,
) -> Result<ResolvedRequest, ApiError> {
    let state = state.clone();
    let model = state.check_model(req.model.as_deref())?;
    unsupported::refuse_unhonoured(&req.unknown)?;
    let tool_calling = tools::resolve(
        req.tools.as_ref(),
        req.tool_choice.as_ref(),
        req.parallel_tool_calls,
        &state.tool_options,
    )?;
    state.note_unknown_fields(req.unknown.keys());
    check_messages(&req.messages)?;
    check_n(&state, &req.sampling, None, 1)?;
    if req.top_logprobs.is_some_and(|k| k > MAX_LOGPROBS) {
        return Err(ApiError::invalid(
            "top_logprobs",
            format!("top_logprobs must be at most {MAX_LOGPROBS}."),
        ));
    }
    if req.top_logprobs.is_some_and(|k| k > 0) && !req.logprobs {
        return Err(ApiError::invalid(
            "top_logprobs",
            "when using `top_logprobs`, `logprobs` must be set to true.",
        ));
    }
    let template = state.info.chat_template.clone().ok_or_else(|| {
        ApiError::invalid(
            "messages",
            state.info.chat_template_error.clone().unwrap_or_default(),
        )
    })?;
    let mut extra = req.chat_template_kwargs.clone().unwrap_or_default();
    if let Some(tools) = &req.tools {
        extra.insert("tools".into(), tools.clone());
    }
    let messages = Value::Array(req.messages.iter().map(normalize_message).collect());
    let rendered = template
        .render(&messages, req.add_generation_prompt.unwrap_or(true), &extra)
        .map_err(|e| ApiError::invalid("messages", e.0))?;
    let ids = encode(&state, rendered, false).await?;
    let requested = req.max_completion_tokens.or(req.sampling.max_tokens);
    let max_tokens = default_max_tokens(&state, ids.len(), requested)?;
    let logprobs = req.logprobs.then_some(req.top_logprobs.unwrap_or(0));
    let mut params = req
        .sampling
        .resolve(Some(max_tokens), logprobs, max_tokens)?;
    params.validate(Some(state.info.vocab_size))?;
    if state
        .reasoning_parser
        .is_some_and(|p| p.needs_special_tokens())
    {
        // (Its markers are special tokens; the parser keeps them from the client.)
        params.skip_special_tokens = false;
    }
    let tool_calling = match tool_calling {
        Some((calling, constraint)) => {
            if constraint.is_some() && params.structured_outputs.is_some() {
                return Err(ApiError::invalid(
                    "tool_choice",
                    "tool_choice \"required\", a named function, or a strict tool under \"auto\" \
                     constrains the output already: leave response_format and structured_outputs \
                     out.",
                ));
            }
            params.structured_outputs = constraint.or(params.structured_outputs);
            Some(calling)
        }
        None => None,
    };
    let guide = match &params.structured_outputs {
        Some(c) => Some(structured::compile(&state, c).await?),
        None => None,
    };
    let job = ResolvedRequest {
        flavor: Endpoint::Chat,
        model,
        prompts: vec![Prompt { echo: None, ids }],
        params,
        cache_salt: req.sampling.cache_salt.clone(),
        include_usage: req.sampling.include_usage(),
        arrived,
        guide,
        tools: tool_calling,
        reasoning: state.reasoning_parser,
        prompt_out: PromptOut {
            field: check_prompt_logprobs(&req.sampling)?,
            ..PromptOut::default()
        },
    };
    Ok(job)
}

/// Whether the request asks for vLLM's `prompt_logprobs` field, which a stream has no place
/// for (vLLM refuses it there too).
fn check_prompt_logprobs(sampling: &SamplingFields) -> Result<bool, ApiError> {
    match (sampling.prompt_logprobs, sampling.is_stream()) {
        (Some(_), true) => Err(ApiError::invalid(
            "prompt_logprobs",
            "prompt_logprobs are not available when stream is true: send the request without \
             streaming.",
        )),
        (asked, _) => Ok(asked.is_some()),
    }
}

/// `n` (and `best_of`) against what the engine runs at once: a request's sequences, `n` for each
/// of its prompts, must fit in one batch of `--max-num-seqs`.
fn check_n(
    state: &AppState,
    sampling: &SamplingFields,
    best_of: Option<usize>,
    num_prompts: usize,
) -> Result<(), ApiError> {
    let n = sampling.n.unwrap_or(1);
    if n == 0 {
        return Err(ApiError::invalid("n", "n must be at least 1, got 0."));
    }
    if let Some(best_of) = best_of
        && best_of != n
    {
        return Err(ApiError::invalid(
            "best_of",
            format!("best_of must equal n ({n}) here: ranking extra completions is not supported."),
        ));
    }
    check_num_seqs(n.saturating_mul(num_prompts), state.info.max_num_seqs)?;
    Ok(())
}

/// Most messages in one conversation.
pub const MAX_MESSAGES: usize = 2048;

/// Every message an object with a role OpenAI knows ([`Role`]); at most [`MAX_MESSAGES`] of them.
pub(super) fn check_messages(messages: &[Value]) -> Result<(), ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid("messages", "messages must not be empty."));
    }
    if messages.len() > MAX_MESSAGES {
        return Err(ApiError::invalid(
            "messages",
            format!(
                "Invalid 'messages': array too long. Expected an array with maximum length \
                 {MAX_MESSAGES}, but got an array with length {}.",
                messages.len()
            ),
        ));
    }
    for (i, m) in messages.iter().enumerate() {
        let param = format!("messages[{i}].role");
        let role = match m.get("role") {
            Some(Value::String(role)) => role,
            _ if !m.is_object() => {
                return Err(ApiError::invalid(
                    &format!("messages[{i}]"),
                    format!("Invalid 'messages[{i}]': expected an object."),
                ));
            }
            _ => {
                return Err(ApiError::invalid(
                    &param,
                    format!("Missing required parameter: 'messages[{i}].role'."),
                ));
            }
        };
        // `Role` (the schema's enum) is the one list of the roles OpenAI accepts.
        if serde_json::from_value::<Role>(Value::String(role.clone())).is_err() {
            return Err(ApiError::invalid(
                &param,
                format!(
                    "Invalid value: '{role}'. Supported values are: 'system', 'assistant', \
                     'user', 'function', 'tool', and 'developer'."
                ),
            ));
        }
        match m.get("content") {
            None | Some(Value::Null | Value::String(_)) => {}
            Some(Value::Array(parts)) => check_parts(i, parts)?,
            Some(_) => {
                return Err(ApiError::invalid(
                    &format!("messages[{i}].content"),
                    format!(
                        "Invalid type for 'messages[{i}].content': expected a string or an \
                         array of content parts."
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// Message `i`'s content parts: text (`{"type": "text", "text": ...}`, or an assistant's
/// `{"type": "refusal", "refusal": ...}`); images, audio and files are refused by name, as the
/// models served read text only.
fn check_parts(i: usize, parts: &[Value]) -> Result<(), ApiError> {
    for (j, part) in parts.iter().enumerate() {
        let param = format!("messages[{i}].content[{j}]");
        let kind = part.get("type").and_then(Value::as_str);
        let field = match kind {
            Some("text") => "text",
            Some("refusal") => "refusal",
            Some(other) => {
                return Err(ApiError::invalid(
                    &format!("{param}.type"),
                    format!(
                        "Content parts of type '{other}' are not supported: the model reads \
                         text only. Send 'text' parts."
                    ),
                ));
            }
            None => {
                return Err(ApiError::invalid(
                    &format!("{param}.type"),
                    format!("Missing required parameter: '{param}.type'."),
                ));
            }
        };
        if !part.get(field).is_some_and(Value::is_string) {
            return Err(ApiError::invalid(
                &format!("{param}.{field}"),
                format!("Invalid '{param}': a '{field}' part needs a string '{field}'."),
            ));
        }
    }
    Ok(())
}

async fn respond(
    state: AppState,
    job: ResolvedRequest,
    stream: bool,
) -> Result<Response, ApiError> {
    if stream {
        respond_sse(state, job).await
    } else {
        respond_json(&state, job).await
    }
}

/// OpenAI content parts (`[{"type": "text", "text": ...}]`, an assistant's `refusal` parts too) joined into one string, as templates
/// written for plain strings expect.
pub(super) fn normalize_message(m: &Value) -> Value {
    let mut m = m.clone();
    if let Some(parts) = m.get("content").and_then(Value::as_array) {
        let text: String = parts
            .iter()
            .filter_map(|p| p.get("text").or(p.get("refusal")).and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n");
        m["content"] = Value::String(text);
    }
    if m.get("content").is_none_or(Value::is_null) {
        m["content"] = Value::String(String::new());
    }
    // OpenAI sends a call's arguments as JSON text; templates (as transformers renders them)
    // expect the object.
    if let Some(calls) = m.get_mut("tool_calls").and_then(Value::as_array_mut) {
        for call in calls {
            if let Some(args) = call.pointer_mut("/function/arguments")
                && let Some(parsed) = args.as_str().and_then(|s| serde_json::from_str(s).ok())
            {
                *args = parsed;
            }
        }
    }
    m
}
