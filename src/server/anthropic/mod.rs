//! Anthropic's Messages API: `POST /v1/messages` (streamed or not) and `POST
//! /v1/messages/count_tokens`, authenticated by `x-api-key` as well as Bearer, with errors in
//! Anthropic's shape.
//!
//! A request is translated into a chat request (`request.rs`) and resolved by the chat pipeline
//! (`super::routes::chat_job`), so it is answered as a chat request is; the answer becomes
//! content blocks (`output.rs`) or, streamed, Anthropic's events (`events.rs`).

pub mod error;
pub mod events;
pub mod output;
pub mod request;

use axum::extract::State;
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use serde_json::Value;
use tokio::sync::mpsc;

use super::AppState;
use super::chat_stream::{ChatChoiceStream, read_answer};
use super::error::ApiError;
use super::generate::{self, ChoiceEvent, ResolvedRequest};
use super::metrics::RequestTimer;
use super::protocol::SAMPLING_EXTENSIONS;
use super::routes::{self, ApiJson};
use super::sse;
use crate::engine::handle::StreamEvent;
use error::AnthropicError;
use events::EventWriter;
use output::{MessageResponse, MessageUsage, TokenCount};
use request::MessagesRequest;

/// The request, checked and resolved into a job.
async fn job(
    state: &AppState,
    body: Result<ApiJson<MessagesRequest>, ApiError>,
) -> Result<(MessagesRequest, ResolvedRequest), AnthropicError> {
    let arrived = std::time::Instant::now();
    let ApiJson(req) = body?;
    state.note_unknown_fields(
        req.unknown
            .keys()
            .filter(|k| !SAMPLING_EXTENSIONS.contains(&k.as_str())),
    );
    let chat = request::to_chat(&req)?;
    let job = routes::chat_job(state, &chat, arrived)
        .await
        .map_err(request::rename_param)?;
    Ok((req, job))
}

/// POST /v1/messages
pub async fn create(
    State(state): State<AppState>,
    body: Result<ApiJson<MessagesRequest>, ApiError>,
) -> Result<Response, AnthropicError> {
    if let Ok(ApiJson(req)) = &body
        && req.max_tokens.is_none()
    {
        return Err(ApiError::invalid("max_tokens", "max_tokens: Field required.").into());
    }
    let (req, job) = job(&state, body).await?;
    let input_tokens = job.prompts[0].ids.len();
    if req.stream == Some(true) {
        let events = generate::submit_all(&state, &job).await?;
        let writer = EventWriter::new(job.model.clone(), input_tokens);
        let (tx, rx) = mpsc::channel::<Event>(64);
        let response = sse::sse_response(&state, rx);
        tokio::spawn(send_events(state, job, events, writer, tx));
        return Ok(response);
    }
    let choice = generate::collect(&state, &job)
        .await?
        .into_iter()
        .next()
        .unwrap_or_default();
    let answer = read_answer(&job, choice.text, choice.finish);
    let has_calls = !answer.calls.is_empty();
    let message = MessageResponse {
        id: generate::random_id("msg_"),
        kind: "message".into(),
        role: "assistant".into(),
        model: job.model.clone(),
        content: output::blocks(&answer.reasoning, answer.content.as_deref(), &answer.calls),
        stop_reason: Some(output::stop_reason(
            choice.finish,
            choice.stopped_on.as_deref(),
            has_calls,
        )),
        stop_sequence: choice.stopped_on,
        usage: MessageUsage::new(input_tokens, choice.tokens.len()),
    };
    Ok(axum::Json(message).into_response())
}

/// POST /v1/messages/count_tokens: the prompt's tokens, as /v1/messages would render it.
pub async fn count_tokens(
    State(state): State<AppState>,
    body: Result<ApiJson<MessagesRequest>, ApiError>,
) -> Result<Response, AnthropicError> {
    let (_, job) = job(&state, body).await?;
    let count = TokenCount {
        input_tokens: job.prompts[0].ids.len(),
    };
    Ok(axum::Json(count).into_response())
}

/// Sends each event of the answer as it comes, until it ends or the client goes away (then
/// dropping `events` aborts the sequence).
async fn send_events(
    state: AppState,
    job: ResolvedRequest,
    mut events: BoxStream<'static, ChoiceEvent>,
    mut writer: EventWriter,
    tx: mpsc::Sender<Event>,
) {
    let send = |batch: Vec<Value>| sse::send_typed(&tx, batch);
    if !send(writer.start()).await {
        return;
    }
    let mut chat = ChatChoiceStream::new(&job);
    let mut timer = RequestTimer::new(job.arrived, 1);
    let mut tokens = 0usize;
    loop {
        let next = tokio::select! {
            e = events.next() => e.ok_or(true),
            _ = tx.closed() => Err(false),
        };
        let (batch, last) = match next {
            Ok((
                _,
                StreamEvent::Token {
                    text,
                    finish,
                    stopped_on,
                    ..
                },
            )) => {
                timer.token(&state.metrics, 0);
                tokens += 1;
                let finish = finish.map(|f| {
                    state.metrics.finished(f);
                    f.as_str()
                });
                let mut batch = writer.step(&chat.step(&text, finish));
                if finish.is_some() {
                    batch.extend(writer.finish(finish, stopped_on, tokens));
                }
                (batch, finish.is_some())
            }
            Ok((_, StreamEvent::Error(failure))) => {
                let e = ApiError::from(failure);
                let _ = send(vec![error::body(e.status, &e.message)]).await;
                return;
            }
            Err(true) => {
                let e = ApiError::new(
                    axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                    "the engine ended the answer early",
                );
                let _ = send(vec![error::body(e.status, &e.message)]).await;
                return;
            }
            Err(false) => {
                // The client left: its sequence is aborted when `events` drops.
                sse::count_aborted(&state, &[false]);
                return;
            }
        };
        if !send(batch).await {
            sse::count_aborted(&state, &[last]);
            return;
        }
        if last {
            timer.done(&state.metrics);
            return;
        }
    }
}
