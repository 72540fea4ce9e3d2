//! OpenAI's Responses API: `POST /v1/responses` (streamed or not), `GET` and `DELETE
//! /v1/responses/{id}`.
//!
//! A request is translated into a chat request (`request.rs`) and resolved by the chat pipeline
//! (`super::routes::chat_job`: template, tools, structured outputs, reasoning parser), so both
//! APIs answer alike. The answer becomes output items (`output.rs`): reasoning, the message, the
//! function calls; streamed, typed events (`events.rs`). Stored responses (`store.rs`) carry
//! their conversation for `previous_response_id`.

pub mod events;
pub mod output;
pub mod request;
pub mod store;

use axum::extract::{Path, State};
use axum::http::StatusCode;
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
use events::EventWriter;
use output::{ResponseObject, ResponseUsage};
use request::ResponsesRequest;
use store::Stored;

/// Default of `--responses-store-size`.
pub const DEFAULT_STORE_SIZE: usize = 1024;

/// Where a finished response goes: the store, with the conversation up to its output.
type Keep = Option<(store::ResponseStore, Vec<Value>)>;

/// POST /v1/responses
pub async fn create(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<ResponsesRequest>,
) -> Result<Response, ApiError> {
    let arrived = std::time::Instant::now();
    state.note_unknown_fields(
        req.unknown
            .keys()
            .filter(|k| !SAMPLING_EXTENSIONS.contains(&k.as_str())),
    );
    let previous = match &req.previous_response_id {
        None => None,
        Some(id) => Some(state.responses.get(id).ok_or_else(|| {
            ApiError::invalid(
                "previous_response_id",
                format!(
                    "Previous response with id '{id}' not found (responses are kept in memory, \
                     the last --responses-store-size of them, and only with store true)."
                ),
            )
        })?),
    };
    let earlier = previous.as_ref().map_or(&[][..], |p| &p.conversation);
    let (chat, added) = request::to_chat(&req, earlier)?;
    let job = routes::chat_job(&state, &chat, arrived)
        .await
        .map_err(request::rename_param)?;
    let store = req.store.unwrap_or(true) && state.responses.is_enabled();
    let draft = ResponseObject::draft(&req, job.model.clone(), store);
    let keep: Keep = store.then(|| {
        let mut conversation = earlier.to_vec();
        conversation.extend(added);
        (state.responses.clone(), conversation)
    });
    if req.stream == Some(true) {
        return respond_sse(state, job, draft, keep).await;
    }
    let choice = generate::collect(&state, &job)
        .await?
        .into_iter()
        .next()
        .unwrap_or_default();
    let answer = read_answer(&job, choice.text, choice.finish);
    let cut = choice.finish == Some("length");
    let mut response = draft;
    let usage = ResponseUsage::new(prompt_len(&job), choice.tokens.len());
    response.finish(output::output_items(&answer, cut), choice.finish, usage);
    keep_response(keep, &response);
    Ok(axum::Json(response).into_response())
}

/// GET /v1/responses/{id}
pub async fn retrieve(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    match state.responses.get(&id) {
        Some(stored) => Ok(axum::Json(stored.response.clone()).into_response()),
        None => Err(not_found(&id)),
    }
}

/// DELETE /v1/responses/{id}
pub async fn delete(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    match state.responses.remove(&id) {
        true => Ok(axum::Json(output::ResponseDeleted {
            id,
            object: "response".into(),
            deleted: true,
        })
        .into_response()),
        false => Err(not_found(&id)),
    }
}

fn not_found(id: &str) -> ApiError {
    ApiError {
        param: Some("response_id".into()),
        ..ApiError::new(
            StatusCode::NOT_FOUND,
            format!("Response with id '{id}' not found."),
        )
    }
}

fn prompt_len(job: &ResolvedRequest) -> usize {
    job.prompts.iter().map(|p| p.ids.len()).sum()
}

fn keep_response(keep: Keep, response: &ResponseObject) {
    if let Some((store, mut conversation)) = keep {
        conversation.extend(output::as_messages(&response.output));
        store.put(Stored {
            response: response.clone(),
            conversation,
        });
    }
}

async fn respond_sse(
    state: AppState,
    job: ResolvedRequest,
    draft: ResponseObject,
    keep: Keep,
) -> Result<Response, ApiError> {
    let events = generate::submit_all(&state, &job).await?;
    let (tx, rx) = mpsc::channel::<Event>(64);
    let response = sse::sse_response(&state, rx);
    tokio::spawn(send_events(
        state,
        job,
        events,
        EventWriter::new(draft),
        keep,
        tx,
    ));
    Ok(response)
}

/// Sends each event of the answer as it comes, until it ends or the client goes away (then
/// dropping `events` aborts the sequence).
async fn send_events(
    state: AppState,
    job: ResolvedRequest,
    mut events: BoxStream<'static, ChoiceEvent>,
    mut writer: EventWriter,
    keep: Keep,
    tx: mpsc::Sender<Event>,
) {
    let send = |batch: Vec<Value>| sse::send_typed(&tx, batch);
    if !send(writer.start()).await {
        return;
    }
    let mut chat = ChatChoiceStream::new(&job);
    let mut timer = RequestTimer::new(job.arrived, 1);
    let (mut tokens, mut finished) = (0usize, None);
    while finished.is_none() {
        let next = tokio::select! {
            e = events.next() => e.ok_or(true),
            _ = tx.closed() => Err(false),
        };
        let batch = match next {
            Ok((_, StreamEvent::Token { text, finish, .. })) => {
                timer.token(&state.metrics, 0);
                tokens += 1;
                if let Some(f) = finish {
                    state.metrics.finished(f);
                    finished = Some(f.as_str());
                }
                writer.step(&chat.step(&text, finished))
            }
            Ok((_, StreamEvent::Error(failure))) => {
                let message = ApiError::from(failure).message;
                let _ = send(writer.fail(&message)).await;
                return;
            }
            // The engine's stream ended without a last token: it failed this request.
            Err(true) => {
                let _ = send(writer.fail("the engine ended the answer early")).await;
                return;
            }
            Err(false) => {
                // The client left: its sequence is aborted when `events` drops.
                sse::count_aborted(&state, &[false]);
                return;
            }
        };
        if !send(batch).await {
            sse::count_aborted(&state, &[finished.is_some()]);
            return;
        }
    }
    timer.done(&state.metrics);
    let usage = ResponseUsage::new(prompt_len(&job), tokens);
    let last = writer.finish(finished, usage);
    keep_response(keep, &writer.response);
    let _ = send(last).await;
}
