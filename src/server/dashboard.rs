//! The live view of the page table: `GET /dashboard` (one page, its HTML, JS and CSS embedded in
//! the binary) and `GET /dashboard/events`, a server-sent event stream of the engine's page-table
//! snapshots (`engine::snapshot`, at most 10 a second) merged with the counters `/metrics`
//! reports. The first event carries every block's state; later ones only the runs of blocks that
//! changed, unless the whole pool is cheaper. A model with a window group (`kv::window`: the
//! sliding-window layers' own blocks) has its pool sent the same way, under `window`. Sequences
//! appear as ids, lengths and block tables: never tokens or text.
//!
//! Both sit behind `--api-key` when one is set. A browser cannot put a header on a page load or
//! an `EventSource`, so here the key may also come as `?key=KEY` (the page passes its own on).
//! `--disable-dashboard` leaves both out (404). A viewer's stream ends when the server starts
//! shutting down: an open page never holds a shutdown up (graceful shutdown waits for every
//! connection to close).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Response};
use futures_util::stream;
use serde_json::{Value, json};

use super::AppState;
use super::error::ApiError;
use crate::engine::snapshot::{PoolSnapshot, PoolWatch};
use crate::runner::step_times::Phase;

/// The page.
const PAGE: &str = include_str!("dashboard.html");

/// Unchanged blocks shorter than this between two changed runs are sent as changed (one run
/// instead of two).
const RUN_GAP: usize = 16;

/// How often an idle viewer's stream looks whether the server is shutting down.
const DRAIN_CHECK: std::time::Duration = std::time::Duration::from_millis(100);

/// `?key=` on the dashboard's URLs, and `?engine=` (which replica under
/// `--data-parallel-size`; 0 by default).
#[derive(serde::Deserialize)]
pub struct KeyQuery {
    key: Option<String>,
    engine: Option<usize>,
}

/// Whether the request may see the dashboard: no keys configured, a Bearer key, or `?key=`.
fn allowed(state: &AppState, headers: &HeaderMap, query: &KeyQuery) -> bool {
    state.accepts_key(super::bearer_key(headers).or(query.key.as_deref()))
}

fn refused() -> Response {
    ApiError::new(StatusCode::UNAUTHORIZED, "Invalid or missing API key.").into_response()
}

/// GET /dashboard
pub async fn page(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(query): Query<KeyQuery>,
) -> Response {
    if !allowed(&state, &headers, &query) {
        return refused();
    }
    Html(PAGE).into_response()
}

/// GET /dashboard/events
pub async fn events(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(query): Query<KeyQuery>,
) -> Response {
    if !allowed(&state, &headers, &query) {
        return refused();
    }
    let keepalive = state.sse_keepalive;
    let replica = query.engine.unwrap_or(0);
    let Some(engine) = state.engine.replicas().get(replica) else {
        let n = state.engine.replicas().len();
        let message = format!(
            "There is no engine {replica}: this server runs engines 0 to {}.",
            n - 1
        );
        return ApiError::new(StatusCode::NOT_FOUND, message).into_response();
    };
    let viewer = Viewer {
        watch: engine.watch_pool(),
        replica,
        state,
        sent: None,
        sent_window: None,
        started: std::time::Instant::now(),
    };
    let body = stream::unfold(viewer, |mut v| async move {
        loop {
            if v.state.is_draining() {
                return None;
            }
            tokio::select! {
                // A closed channel: the engine thread has ended; so does the stream.
                changed = v.watch.changed() => {
                    changed.ok()?;
                    break;
                }
                _ = tokio::time::sleep(DRAIN_CHECK) => {}
            }
        }
        let snapshot = v.watch.borrow_and_update().clone();
        let frame = v.frame(&snapshot);
        Some((Ok::<_, std::convert::Infallible>(frame), v))
    });
    Sse::new(body)
        .keep_alive(KeepAlive::new().interval(keepalive))
        .into_response()
}

/// One viewer's stream: what it has been sent so far.
struct Viewer {
    watch: PoolWatch,
    /// The replica watched.
    replica: usize,
    state: AppState,
    /// Block states as last sent.
    sent: Option<Vec<u8>>,
    /// The window group's block states as last sent.
    sent_window: Option<Vec<u8>>,
    started: std::time::Instant,
}

impl Viewer {
    fn frame(&mut self, s: &Arc<PoolSnapshot>) -> Event {
        let pool = encode(&mut self.sent, &s.states);
        let window = s.window_states.as_ref().map(|states| {
            json!({
                "window": s.window_tokens,
                "num_blocks": states.len(),
                "pool": encode(&mut self.sent_window, states),
                "counts": counts(states),
            })
        });
        let t = s.taken_at.map_or(0.0, |at| {
            at.saturating_duration_since(self.started).as_secs_f64()
        });
        let data = json!({
            "serial": s.serial,
            "t": t,
            "block_size": s.block_size,
            "num_blocks": s.states.len(),
            "pool": pool,
            "counts": counts(&s.states),
            "window": window,
            "seqs": s.seqs.iter().map(|q| json!({
                "id": q.id,
                "running": q.running,
                "prompt": q.prompt_tokens,
                "output": q.output_tokens,
                "computed": q.computed_tokens,
                "cached": q.cached_tokens,
                "preemptions": q.preemptions,
                "blocks": q.blocks,
                "window_blocks": q.window_blocks,
            })).collect::<Vec<_>>(),
            "stats": stats(&self.state.engine.replicas()[self.replica]),
            "gpu_memory": s.gpu_memory.map(|(used, total)| json!({"used": used, "total": total})),
        });
        Event::default().event("snapshot").data(data.to_string())
    }
}

/// The counters `/metrics` reports for `engine`, read now.
fn stats(engine: &crate::engine::handle::EngineHandle) -> Value {
    let s = engine.stats();
    let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    let phases: serde_json::Map<String, Value> = Phase::ALL
        .iter()
        .zip(&s.phase_micros)
        .map(|((_, name), micros)| (name.to_string(), json!(get(micros) as f64 / 1e6)))
        .collect();
    json!({
        "running": s.num_running.load(Ordering::Acquire),
        "waiting": s.num_waiting.load(Ordering::Acquire),
        "kv_usage": get(&s.kv_usage_ppm) as f64 / 1e6,
        "kv_window_usage": get(&s.kv_window_usage_ppm) as f64 / 1e6,
        "prefix_queries": get(&s.prefix_cache_queries),
        "prefix_hits": get(&s.prefix_cache_hits),
        "generated_tokens": get(&s.num_generated_tokens),
        "preemptions": get(&s.num_preemptions),
        "steps": get(&s.steps),
        "graph_steps": get(&s.graph_steps),
        "graph_forward_seconds": get(&s.graph_forward_micros) as f64 / 1e6,
        "phase_seconds": phases,
        "spec_tokens": get(&s.spec.num_speculative_tokens),
        "spec_draft_tokens": get(&s.spec.num_draft_tokens),
        "spec_accepted_tokens": get(&s.spec.num_accepted_tokens),
    })
}

/// A pool's states for a viewer that was last sent `sent`: the runs that changed, or the whole
/// pool when that is cheaper or nothing of its size was sent; `sent` becomes `states`.
fn encode(sent: &mut Option<Vec<u8>>, states: &[u8]) -> Value {
    let value = match sent.as_deref() {
        Some(old) if old.len() == states.len() => {
            let runs = changed_runs(old, states);
            let bytes: usize = runs.iter().map(|(_, r)| r.len() + 12).sum();
            if bytes < states.len() / 2 {
                json!({ "runs": runs })
            } else {
                json!({ "full": digits(states) })
            }
        }
        _ => json!({ "full": digits(states) }),
    };
    *sent = Some(states.to_vec());
    value
}

/// Blocks of each state.
fn counts(states: &[u8]) -> Value {
    let mut counts = [0usize; 4];
    for &b in states {
        counts[usize::from(b.min(3))] += 1;
    }
    json!({"free": counts[0], "used": counts[1], "cached": counts[2], "shared": counts[3]})
}

/// Block states as a string of digits, one a block.
fn digits(states: &[u8]) -> String {
    states
        .iter()
        .map(|&b| char::from(b'0' + b.min(9)))
        .collect()
}

/// The runs of `new` that differ from `old` (same length), as (first block index, digits);
/// changed runs closer than [`RUN_GAP`] are joined.
fn changed_runs(old: &[u8], new: &[u8]) -> Vec<(usize, String)> {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for (i, _) in old.iter().zip(new).enumerate().filter(|(_, (a, b))| a != b) {
        match runs.last_mut() {
            Some((_, end)) if i - *end <= RUN_GAP => *end = i + 1,
            _ => runs.push((i, i + 1)),
        }
    }
    runs.into_iter()
        .map(|(start, end)| (start, digits(&new[start..end])))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_cover_exactly_the_changes_joining_near_ones() {
        let old = vec![0u8; 100];
        let mut new = old.clone();
        new[3] = 1;
        new[5] = 2;
        new[60] = 3;
        let runs = changed_runs(&old, &new);
        assert_eq!(runs, vec![(3, "102".to_string()), (60, "3".to_string())]);
        // Applying the runs to the old states gives the new ones.
        let mut applied = digits(&old).into_bytes();
        for (start, r) in &runs {
            applied[*start..start + r.len()].copy_from_slice(r.as_bytes());
        }
        assert_eq!(String::from_utf8(applied).unwrap(), digits(&new));
        assert!(changed_runs(&new, &new).is_empty());
    }
}
