//! Server-sent events of the completion endpoints: a job's token chunks as OpenAI streams them
//! (`respond_sse`), the response that carries any event stream with keep-alives, and the typed
//! events of the Responses and Messages APIs.

use std::convert::Infallible;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use futures_util::stream::{self, BoxStream};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::AppState;
use super::chat_stream::ChatChoiceStream;
use super::error::ApiError;
use super::generate::{ChoiceEvent, Endpoint, ResolvedRequest, now_secs, random_id, submit_all};
use super::logprobs::{StreamPiece, chat_logprob};
use super::metrics::RequestTimer;
use super::responses::{ChatLogprobs, Usage};
use crate::engine::handle::StreamEvent;

/// Streams the job as server-sent events: one chunk per token, then usage (if asked), then `[DONE]`.
pub async fn respond_sse(state: AppState, job: ResolvedRequest) -> Result<Response, ApiError> {
    let events = submit_all(&state, &job).await?;
    let (tx, rx) = mpsc::channel::<Event>(64);
    let response = sse_response(&state, rx);
    tokio::spawn(send_chunks(state, job, events, tx));
    Ok(response)
}

/// A server-sent-events response of what `rx` receives, with keep-alive comments.
pub fn sse_response(state: &AppState, rx: mpsc::Receiver<Event>) -> Response {
    let keepalive = KeepAlive::new()
        .interval(state.sse_keepalive)
        .text("keep-alive");
    let body = stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|e| (Ok::<_, Infallible>(e), rx))
    });
    Sse::new(body).keep_alive(keepalive).into_response()
}

/// Sends `batch` as typed events (each event named by its body's `type`, as the Responses and
/// Messages APIs stream them); false once the client is gone.
pub async fn send_typed(tx: &mpsc::Sender<Event>, batch: Vec<Value>) -> bool {
    for body in batch {
        let kind = body["type"].as_str().unwrap_or("").to_string();
        if tx
            .send(Event::default().event(kind).data(body.to_string()))
            .await
            .is_err()
        {
            return false;
        }
    }
    true
}

/// Formats engine events into SSE chunks until done or until the client goes away (then dropping
/// `events` aborts the sequences).
async fn send_chunks(
    state: AppState,
    job: ResolvedRequest,
    mut events: BoxStream<'static, ChoiceEvent>,
    tx: mpsc::Sender<Event>,
) {
    let id = random_id(if job.flavor == Endpoint::Chat {
        "chatcmpl-"
    } else {
        "cmpl-"
    });
    let created = now_secs();
    let object = if job.flavor == Endpoint::Chat {
        "chat.completion.chunk"
    } else {
        "text_completion"
    };
    let chunk = |choices: Value| json!({"id": id, "object": object, "created": created, "model": job.model, "choices": choices});
    let n = job.params.n;
    let num_choices = job.prompts.len() * n;
    let mut started = vec![false; num_choices];
    // Characters of each completion choice's text sent so far: where its next token's
    // `text_offset` is.
    let mut sent_chars = vec![0usize; num_choices];
    let mut finished = vec![false; num_choices];
    let mut chat_streams: Vec<ChatChoiceStream> = (0..num_choices)
        .map(|_| ChatChoiceStream::new(&job))
        .collect();
    let mut timer = RequestTimer::new(job.arrived, num_choices);
    let mut completion_tokens = 0usize;
    let send = |v: Value| {
        let tx = tx.clone();
        async move { tx.send(Event::default().data(v.to_string())).await.is_ok() }
    };
    loop {
        let next = tokio::select! {
            e = events.next() => e,
            _ = tx.closed() => {
                // The client left: its unfinished sequences are aborted when `events` drops.
                count_aborted(&state, &finished);
                return;
            }
        };
        let Some((index, event)) = next else { break };
        let body = match event {
            StreamEvent::Error(failure) => {
                let err = ApiError::from(failure);
                let _ = send(err.body()).await;
                let _ = tx.send(Event::default().data("[DONE]")).await;
                return;
            }
            StreamEvent::Token {
                token_id,
                text,
                logprobs,
                finish,
                prompt_logprobs,
                ..
            } => {
                timer.token(&state.metrics, index);
                if let Some(f) = finish {
                    finished[index] = true;
                    state.metrics.finished(f);
                }
                completion_tokens += usize::from(!job.prompt_out.echo_only);
                let finish = finish.map(|f| f.as_str());
                match job.flavor {
                    Endpoint::Chat => {
                        let step = chat_streams[index].step(&text, finish);
                        let finish = step.finish;
                        let mut delta = json!({});
                        if let Some(content) = step.content {
                            delta["content"] = json!(content);
                        }
                        if !step.tool_calls.is_empty() {
                            delta["tool_calls"] = json!(step.tool_calls);
                        }
                        if !step.reasoning.is_empty() {
                            delta["reasoning_content"] = json!(step.reasoning);
                        }
                        // Held back: nothing to say unless the choice starts or ends.
                        if delta == json!({})
                            && started[index]
                            && finish.is_none()
                            && logprobs.is_none()
                        {
                            continue;
                        }
                        if !started[index] {
                            delta["role"] = json!("assistant");
                        }
                        let lp = logprobs.map(|lp| ChatLogprobs {
                            content: vec![chat_logprob(&state, token_id, &lp)],
                        });
                        chunk(
                            json!([{"index": index, "delta": delta, "logprobs": lp, "finish_reason": finish}]),
                        )
                    }
                    Endpoint::Completion => {
                        let piece = StreamPiece {
                            prompt: &job.prompts[index / n],
                            out: job.prompt_out,
                            first: !started[index],
                        };
                        let token = (token_id, text, logprobs, prompt_logprobs);
                        let (text, lp) = piece.text(&state, &mut sent_chars[index], token);
                        chunk(
                            json!([{"index": index, "text": text, "logprobs": lp, "finish_reason": finish}]),
                        )
                    }
                }
            }
        };
        started[index] = true;
        if !send(body).await {
            // The client left while this chunk was on its way (the same as `tx.closed()` above).
            count_aborted(&state, &finished);
            return;
        }
    }
    timer.done(&state.metrics);
    if job.include_usage {
        let prompt_tokens: usize = job.prompts.iter().map(|p| p.ids.len()).sum();
        let mut last = chunk(json!([]));
        last["usage"] = json!(Usage::new(prompt_tokens, completion_tokens));
        if !send(last).await {
            return;
        }
    }
    let _ = tx.send(Event::default().data("[DONE]")).await;
}

/// Counts the choices a client left unfinished as aborted (their sequences are aborted when the
/// stream's event receiver drops).
pub fn count_aborted(state: &AppState, finished: &[bool]) {
    for _ in finished.iter().filter(|f| !**f) {
        state.metrics.finished(crate::request::FinishReason::Abort);
    }
}
