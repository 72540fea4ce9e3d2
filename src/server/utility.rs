//! The utility endpoints: `/v1/models`, `/tokenize`, `/detokenize`, `/health`, `/ready`,
//! `/version`, `/openapi.json`, and the OpenAI-shaped 404 and 405 answers.

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use super::AppState;
use super::error::ApiError;
use super::responses::{
    DetokenizeRequest, DetokenizeResponse, ModelCard, ModelList, TokenizeRequest, TokenizeResponse,
    VersionResponse,
};
use super::routes::{ApiJson, check_messages, encode, normalize_message};

/// GET /v1/models
pub async fn models(State(state): State<AppState>) -> Response {
    let data = state
        .served_model_names
        .iter()
        .map(|name| ModelCard {
            id: name.clone(),
            object: "model".into(),
            created: state.started_at,
            owned_by: "pagewise".into(),
            root: state.served_model_names[0].clone(),
            max_model_len: state.info.max_model_len,
        })
        .collect();
    axum::Json(ModelList {
        object: "list".into(),
        data,
    })
    .into_response()
}

/// GET /health: 200 while the engine thread lives, 503 once it has died (then the process exits
/// after delivering what it can; a supervisor should restart it).
pub async fn health(State(state): State<AppState>) -> Response {
    match state.check_alive() {
        Ok(()) => StatusCode::OK.into_response(),
        Err(e) => e.into_response(),
    }
}

/// GET /ready: 200 when accepting requests.
pub async fn ready(State(state): State<AppState>) -> Response {
    match state.check_accepting() {
        Ok(()) => StatusCode::OK.into_response(),
        Err(e) => e.into_response(),
    }
}

/// GET /version
pub async fn version() -> Response {
    axum::Json(VersionResponse {
        version: env!("CARGO_PKG_VERSION").into(),
    })
    .into_response()
}

/// GET /openapi.json
pub async fn openapi(State(state): State<AppState>) -> Response {
    axum::Json(super::openapi::document(
        &state.info,
        &state.served_model_names,
    ))
    .into_response()
}

/// POST /tokenize: `{"prompt": "..."}` or `{"messages": [...]}`.
pub async fn tokenize(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<TokenizeRequest>,
) -> Result<Response, ApiError> {
    let (text, special_default) = match (req.prompt, &req.messages) {
        (Some(p), _) => (p, true),
        (None, Some(messages)) => {
            check_messages(messages)?;
            let template = state.info.chat_template.clone().ok_or_else(|| {
                ApiError::invalid(
                    "messages",
                    state.info.chat_template_error.clone().unwrap_or_default(),
                )
            })?;
            let msgs = Value::Array(messages.iter().map(normalize_message).collect());
            let gen_prompt = req.add_generation_prompt.unwrap_or(true);
            let text = template
                .render(&msgs, gen_prompt, &Default::default())
                .map_err(|e| ApiError::invalid("messages", e.0))?;
            (text, false)
        }
        (None, None) => {
            return Err(ApiError::invalid(
                "prompt",
                "Give `prompt` (a string) or `messages`.",
            ));
        }
    };
    let special = req.add_special_tokens.unwrap_or(special_default);
    let tokens = encode(&state, text, special).await?;
    Ok(axum::Json(TokenizeResponse {
        count: tokens.len(),
        max_model_len: state.info.max_model_len,
        tokens,
    })
    .into_response())
}

/// POST /detokenize: `{"tokens": [...]}`.
pub async fn detokenize(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<DetokenizeRequest>,
) -> Result<Response, ApiError> {
    if req
        .tokens
        .iter()
        .any(|&t| t as usize >= state.info.vocab_size)
    {
        return Err(ApiError::invalid(
            "tokens",
            "`tokens` must be token ids of this model's vocabulary.",
        ));
    }
    let prompt = state
        .info
        .tokenizer
        .decode(&req.tokens, false)
        .map_err(|e| ApiError::invalid("tokens", e.to_string()))?;
    Ok(axum::Json(DetokenizeResponse { prompt }).into_response())
}

/// Unknown route.
pub async fn not_found(req: Request) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("No route for {} {}.", req.method(), req.uri().path()),
    )
}

/// Known route, wrong method.
pub async fn method_not_allowed(req: Request) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!(
            "Method {} is not allowed for {}.",
            req.method(),
            req.uri().path()
        ),
    )
}
