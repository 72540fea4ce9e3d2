//! The OpenAI-compatible HTTP front end: router, shared state, middleware (request ids, API keys,
//! CORS, body limit, panics as JSON), and serving with graceful shutdown.

pub mod anthropic;
pub mod chat_stream;
pub mod dashboard;
pub mod error;
pub mod generate;
pub mod harmony;
mod logprobs;
pub mod metrics;
pub mod openapi;
pub mod protocol;
pub mod reasoning;
pub mod responses;
pub mod responses_api;
pub mod routes;
pub mod sse;
pub mod structured;
pub mod tools;
pub mod unsupported;
pub mod utility;

use std::collections::HashSet;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::cors::{AllowOrigin, CorsLayer};

use crate::engine::handle::ModelInfo;
use crate::engine::replicas::Engines;
use error::ApiError;

/// Largest request body accepted.
pub const MAX_BODY_BYTES: usize = 32 << 20;

/// Server settings beyond the engine's.
#[derive(Clone, Debug, Default)]
pub struct ServerOptions {
    /// Names the model answers to (the first is reported).
    pub served_model_names: Vec<String>,
    /// Accepted Bearer keys; empty means no authentication.
    pub api_keys: Vec<String>,
    /// CORS origins (`*` for any); empty means no CORS headers.
    pub allowed_origins: Vec<String>,
    /// Sequences that may wait for the engine before new requests get 429 (0: no limit). The
    /// engine handles enforce it (each replica's own queue): give the same number to
    /// [`crate::engine::handle::EngineHandle::spawn`] or [`crate::engine::replicas::spawn`].
    pub max_num_queued_requests: usize,
    /// Interval of SSE keep-alive comments (default 15 s).
    pub sse_keepalive: Option<std::time::Duration>,
    /// Leave out `/dashboard` and its event stream (404).
    pub disable_dashboard: bool,
    /// Limits on requests' output constraints.
    pub structured_limits: structured::StructuredLimits,
    /// Tool calling: whether `auto` is honoured, and with which parser.
    pub tools: tools::ToolOptions,
    /// How chat answers' reasoning is split from their content, if it is.
    pub reasoning_parser: Option<reasoning::ReasoningParser>,
    /// Responses kept for `previous_response_id` and `GET /v1/responses/{id}` (None:
    /// [`responses_api::DEFAULT_STORE_SIZE`]; 0: none).
    pub responses_store_size: Option<usize>,
}

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    /// The engine replicas (one unless `--data-parallel-size`).
    pub engine: Arc<Engines>,
    /// Tokenizer, chat template, limits.
    pub info: ModelInfo,
    /// Names the model answers to.
    pub served_model_names: Arc<Vec<String>>,
    api_keys: Arc<Vec<String>>,
    /// Interval of SSE keep-alive comments.
    pub sse_keepalive: std::time::Duration,
    draining: Arc<AtomicBool>,
    unknown_fields_seen: Arc<Mutex<HashSet<String>>>,
    /// Unix time the server started.
    pub started_at: u64,
    /// Request counters and latencies.
    pub metrics: Arc<metrics::ServerMetrics>,
    /// Limits on requests' output constraints.
    pub structured_limits: structured::StructuredLimits,
    /// Tool calling settings.
    pub tool_options: tools::ToolOptions,
    /// The reasoning parser, if any.
    pub reasoning_parser: Option<reasoning::ReasoningParser>,
    /// Stored responses of /v1/responses.
    pub responses: responses_api::store::ResponseStore,
}

impl AppState {
    /// State over a running engine, or engine replicas ([`Engines`]).
    pub fn new(engine: impl Into<Engines>, info: ModelInfo, opts: &ServerOptions) -> Self {
        AppState {
            engine: Arc::new(engine.into()),
            info,
            served_model_names: Arc::new(opts.served_model_names.clone()),
            api_keys: Arc::new(opts.api_keys.clone()),
            sse_keepalive: opts
                .sse_keepalive
                .unwrap_or(std::time::Duration::from_secs(15)),
            draining: Arc::new(AtomicBool::new(false)),
            unknown_fields_seen: Arc::new(Mutex::new(HashSet::new())),
            metrics: Arc::new(metrics::ServerMetrics::default()),
            structured_limits: opts.structured_limits,
            tool_options: opts.tools,
            reasoning_parser: opts.reasoning_parser,
            responses: responses_api::store::ResponseStore::new(
                opts.responses_store_size
                    .unwrap_or(responses_api::DEFAULT_STORE_SIZE),
            ),
            started_at: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
        }
    }

    /// The reported model name, or 404 for a model this server does not serve.
    pub fn check_model(&self, requested: Option<&str>) -> Result<String, ApiError> {
        self.check_accepting()?;
        match requested {
            None => Ok(self.served_model_names[0].clone()),
            Some(m) if self.served_model_names.iter().any(|n| n == m) => Ok(m.to_string()),
            Some(m) => Err(ApiError {
                param: Some("model".into()),
                ..ApiError::new(
                    StatusCode::NOT_FOUND,
                    format!("The model `{m}` does not exist."),
                )
            }),
        }
    }

    /// 503 while draining or when the engine has died.
    pub fn check_accepting(&self) -> Result<(), ApiError> {
        self.check_alive()?;
        if self.draining.load(Ordering::Acquire) {
            return Err(ApiError::unavailable("The server is shutting down."));
        }
        Ok(())
    }

    /// 503 once the engine has died, with the reason.
    pub fn check_alive(&self) -> Result<(), ApiError> {
        match self.engine.death_reason() {
            None => Ok(()),
            Some(reason) => Err(ApiError::unavailable(format!(
                "The engine has stopped: {reason}"
            ))),
        }
    }

    /// Whether the server is shutting down (draining).
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// Stops accepting new requests (/ready turns 503).
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::Release);
    }

    /// Logs each unknown request field once per server (not the sampling fields a request's
    /// `unknown` map also receives: `protocol::is_sampling_field`).
    pub fn note_unknown_fields<'a>(&self, fields: impl Iterator<Item = &'a String>) {
        let Ok(mut seen) = self.unknown_fields_seen.lock() else {
            return;
        };
        for f in fields.filter(|f| !protocol::is_sampling_field(f)) {
            if seen.insert(f.clone()) {
                tracing::warn!(field = %f, "ignoring unknown request field");
            }
        }
    }
}

/// Equal-length-independent constant-time comparison of two secrets.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = a.len() ^ b.len();
    for i in 0..a.len().max(b.len()) {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= usize::from(x ^ y);
    }
    diff == 0
}

impl AppState {
    /// Whether `presented` opens the API: any key when none is configured, else one of them
    /// (compared in constant time).
    pub fn accepts_key(&self, presented: Option<&str>) -> bool {
        if self.api_keys.is_empty() {
            return true;
        }
        let presented = presented.unwrap_or("");
        self.api_keys.iter().fold(false, |ok, key| {
            ok | constant_time_eq(key.as_bytes(), presented.as_bytes())
        })
    }
}

/// The API key a request presents: `Authorization: Bearer KEY`, or Anthropic's `x-api-key: KEY`.
pub fn bearer_key(headers: &axum::http::HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok()))
}

async fn require_api_key(State(state): State<AppState>, req: Request, next: Next) -> Response {
    if req.method() == Method::OPTIONS {
        return next.run(req).await;
    }
    if state.accepts_key(bearer_key(req.headers())) {
        next.run(req).await
    } else {
        let e = ApiError::new(StatusCode::UNAUTHORIZED, "Invalid or missing API key.");
        let is_anthropic = req.uri().path().starts_with("/v1/messages");
        // Read the body (up to 1 MiB) before answering: a client still writing it would
        // otherwise meet a closed connection (a broken pipe) instead of the 401.
        let _ = axum::body::to_bytes(req.into_body(), 1 << 20).await;
        match is_anthropic {
            true => anthropic::error::AnthropicError(e).into_response(),
            false => e.into_response(),
        }
    }
}

async fn request_id(req: Request, next: Next) -> Response {
    let id = req
        .headers()
        .get("x-request-id")
        .cloned()
        .unwrap_or_else(|| {
            HeaderValue::from_str(&generate::random_id("")).expect("hex is a valid header")
        });
    let mut response = next.run(req).await;
    response.headers_mut().insert("x-request-id", id);
    response
}

fn panic_response(_: Box<dyn std::any::Any + Send + 'static>) -> Response {
    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "Internal server error.").into_response()
}

/// The full router.
pub fn router(state: AppState, opts: &ServerOptions) -> Router {
    let guarded = Router::new()
        .route("/v1/completions", post(routes::completions))
        .route("/v1/chat/completions", post(routes::chat_completions))
        .route("/v1/responses", post(responses_api::create))
        .route(
            "/v1/responses/{id}",
            get(responses_api::retrieve).delete(responses_api::delete),
        )
        .route("/v1/messages", post(anthropic::create))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route("/v1/models", get(utility::models))
        .route("/tokenize", post(utility::tokenize))
        .route("/detokenize", post(utility::detokenize))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            require_api_key,
        ));
    let mut open = Router::new()
        .route("/health", get(utility::health))
        .route("/ready", get(utility::ready))
        .route("/version", get(utility::version))
        .route("/openapi.json", get(utility::openapi))
        .route("/metrics", get(metrics::metrics));
    if !opts.disable_dashboard {
        // (They check the API key themselves: a browser may only be able to pass it as ?key=.)
        open = open
            .route("/dashboard", get(dashboard::page))
            .route("/dashboard/events", get(dashboard::events));
    }
    let mut app = guarded
        .merge(open)
        .fallback(utility::not_found)
        .method_not_allowed_fallback(utility::method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(CatchPanicLayer::custom(panic_response))
        .layer(middleware::from_fn(request_id))
        .with_state(state);
    if !opts.allowed_origins.is_empty() {
        let origins = if opts.allowed_origins.iter().any(|o| o == "*") {
            AllowOrigin::any()
        } else {
            AllowOrigin::list(
                opts.allowed_origins
                    .iter()
                    .filter_map(|o| HeaderValue::from_str(o).ok()),
            )
        };
        app = app.layer(
            CorsLayer::new()
                .allow_origin(origins)
                .allow_methods([Method::GET, Method::POST, Method::OPTIONS])
                .allow_headers([
                    header::AUTHORIZATION,
                    header::CONTENT_TYPE,
                    "x-request-id".parse().expect("valid"),
                ]),
        );
    }
    app
}

/// While the model loads: /health 200 (the process is alive), everything else 503.
pub async fn serve_loading(
    listener: tokio::net::TcpListener,
    loaded: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    async fn loading() -> ApiError {
        ApiError::unavailable("The model is still loading.")
    }
    let app = Router::new()
        .route("/health", get(|| async { StatusCode::OK }))
        .fallback(loading)
        .layer(middleware::from_fn(request_id));
    axum::serve(listener, app)
        .with_graceful_shutdown(loaded)
        .await
}

/// How long a server whose engine died keeps answering (503) before it exits, so in-flight
/// responses deliver their errors and health probes see the failure.
pub const DEATH_LINGER: std::time::Duration = std::time::Duration::from_secs(1);

/// Serves `app` on `listener` until `shutdown` resolves or the engine dies.
///
/// On `shutdown`: stops accepting (`/ready` and new requests 503), lets in-flight requests finish
/// up to `drain_timeout`, and returns `Ok`. When the engine dies: the engine has already failed
/// every request in flight; `/health`, `/ready` and new requests answer 503 for [`DEATH_LINGER`]
/// (at most `drain_timeout`) while those errors are delivered, then this returns an error, so the
/// process exits non-zero and a supervisor restarts it.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    opts: &ServerOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
    drain_timeout: std::time::Duration,
) -> std::io::Result<()> {
    let app = router(state.clone(), opts);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let drain_state = state.clone();
    let watcher = tokio::spawn(async move {
        let death = tokio::select! {
            _ = shutdown => None,
            reason = drain_state.engine.died() => Some(reason),
        };
        drain_state.start_draining();
        match &death {
            None => {
                tracing::info!("shutting down: no new requests, draining in-flight ones");
                drain(&drain_state, drain_timeout).await;
            }
            Some(reason) => {
                tracing::error!("the engine died ({reason}): answering 503, then exiting");
                tokio::time::sleep(DEATH_LINGER.min(drain_timeout)).await;
            }
        }
        let _ = stop_tx.send(());
        death
    });
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            let _ = stop_rx.await;
        })
        .await?;
    match watcher.await {
        Ok(None) => Ok(()),
        Ok(Some(reason)) => Err(std::io::Error::other(format!("the engine died: {reason}"))),
        Err(e) => Err(std::io::Error::other(e)),
    }
}

/// Waits until no sequence runs or waits, or ends the rest when `timeout` passes.
async fn drain(state: &AppState, timeout: std::time::Duration) {
    let deadline = tokio::time::Instant::now() + timeout;
    while !state.engine.is_idle() {
        if !state.engine.is_alive() {
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            tracing::warn!("shutdown timeout: ending the remaining requests");
            state
                .engine
                .abort_all("The server is shutting down and this request ran out of time.")
                .await;
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::constant_time_eq;

    #[test]
    fn constant_time_eq_compares_exactly() {
        assert!(constant_time_eq(b"sk-abc", b"sk-abc"));
        assert!(!constant_time_eq(b"sk-abc", b"sk-abd"));
        assert!(!constant_time_eq(b"sk-abc", b"sk-ab"));
        assert!(!constant_time_eq(b"", b"x"));
    }
}
