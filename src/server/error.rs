//! The one mapping from failures to HTTP: every error is OpenAI-shaped JSON
//! `{"error": {"message", "type", "param", "code"}}` with the matching status.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::responses::{ErrorDetail, ErrorResponse};
use crate::engine::args::EngineError;
use crate::engine::handle::{EngineFailure, SubmitError};
use crate::request::InvalidParam;

/// An error on its way to the client.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Human-readable message.
    pub message: String,
    /// The request field at fault, if any.
    pub param: Option<String>,
    /// Retry-After seconds, for 429/503.
    pub retry_after: Option<u32>,
}

impl ApiError {
    /// An error with `status` and `message`.
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            param: None,
            retry_after: None,
        }
    }

    /// 400 for `param`.
    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        ApiError {
            param: Some(param.to_string()),
            ..ApiError::new(StatusCode::BAD_REQUEST, message)
        }
    }

    /// 503 with Retry-After.
    pub fn unavailable(message: impl Into<String>) -> Self {
        ApiError {
            retry_after: Some(1),
            ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, message)
        }
    }

    /// OpenAI's error `type` for the status.
    pub fn kind(&self) -> &'static str {
        match self.status.as_u16() {
            400 | 413 | 415 | 422 => "invalid_request_error",
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            405 => "invalid_request_error",
            429 => "rate_limit_error",
            503 => "service_unavailable_error",
            _ => "internal_server_error",
        }
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        json!(ErrorResponse {
            error: ErrorDetail {
                message: self.message.clone(),
                kind: self.kind().into(),
                param: self.param.clone(),
                code: self.status.as_u16(),
            }
        })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(self.body())).into_response();
        if let Some(secs) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

impl From<InvalidParam> for ApiError {
    fn from(e: InvalidParam) -> Self {
        ApiError::invalid(e.param, e.message)
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::InvalidParam(p) => p.into(),
            EngineError::Schedule(s) => ApiError::new(StatusCode::BAD_REQUEST, s.to_string()),
            EngineError::Tokenizer(m) => ApiError::new(StatusCode::BAD_REQUEST, m),
            EngineError::Chat(c) => ApiError::new(StatusCode::BAD_REQUEST, c.0),
            other => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, other.to_string()),
        }
    }
}

impl From<SubmitError> for ApiError {
    fn from(e: SubmitError) -> Self {
        match e {
            SubmitError::QueueFull => ApiError {
                retry_after: Some(1),
                ..ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "The server is overloaded: too many requests are waiting. Retry later.",
                )
            },
            SubmitError::EngineDead => ApiError::unavailable("The engine has stopped."),
            SubmitError::Rejected(e) => e.into(),
        }
    }
}

impl From<EngineFailure> for ApiError {
    fn from(e: EngineFailure) -> Self {
        if e.engine_died {
            ApiError::unavailable(e.message)
        } else {
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.message)
        }
    }
}
