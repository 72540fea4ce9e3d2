//! Errors in Anthropic's shape: `{"type": "error", "error": {"type", "message"}}`, with the same
//! statuses (and `Retry-After`) as the OpenAI-shaped [`ApiError`] they come from.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::server::error::ApiError;

/// An [`ApiError`] answered in Anthropic's shape.
#[derive(Debug)]
pub struct AnthropicError(pub ApiError);

impl From<ApiError> for AnthropicError {
    fn from(e: ApiError) -> Self {
        AnthropicError(e)
    }
}

/// Anthropic's error type for `status`.
pub fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 | 415 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        _ => "api_error",
    }
}

/// Anthropic's error body: `{"type": "error", "error": {"type", "message"}}`.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct AnthropicErrorBody {
    /// Always `error`.
    #[serde(rename = "type")]
    pub kind: String,
    /// What went wrong.
    pub error: AnthropicErrorDetail,
}

/// The error of an [`AnthropicErrorBody`].
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct AnthropicErrorDetail {
    /// `invalid_request_error`, `authentication_error`, `not_found_error`, `request_too_large`,
    /// `rate_limit_error`, `overloaded_error` or `api_error`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Human-readable message.
    pub message: String,
}

/// The body of an error event or response.
pub fn body(status: StatusCode, message: &str) -> serde_json::Value {
    json!(AnthropicErrorBody {
        kind: "error".into(),
        error: AnthropicErrorDetail {
            kind: error_type(status).into(),
            message: message.into(),
        },
    })
}

impl IntoResponse for AnthropicError {
    fn into_response(self) -> Response {
        let mut message = self.0.message.clone();
        if let Some(param) = self.0.param.as_deref().filter(|p| !message.contains(p)) {
            message = format!("{param}: {message}");
        }
        let status = self.0.status;
        let mut response = self.0.into_response();
        *response.body_mut() = axum::body::Body::from(body(status, &message).to_string());
        response
    }
}
