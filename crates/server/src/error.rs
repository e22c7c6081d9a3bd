//! API errors, rendered in the OpenAI or the Anthropic shape.

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// Which API's error shape to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    /// `{"error": {"message", "type", "param", "code"}}`
    OpenAi,
    /// `{"type": "error", "error": {"type", "message"}}`
    Anthropic,
}

/// An error answered to the client.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// What went wrong, for a person.
    pub message: String,
    /// The request field concerned.
    pub param: Option<String>,
    /// A machine-readable code (OpenAI `code`).
    pub code: Option<&'static str>,
    /// Seconds for `Retry-After` (429/503).
    pub retry_after: Option<u64>,
}

impl ApiError {
    /// A 400 about `param`.
    pub fn bad(param: impl Into<Option<String>>, message: impl Into<String>) -> Self {
        ApiError { status: StatusCode::BAD_REQUEST, message: message.into(), param: param.into(), code: None, retry_after: None }
    }
    /// A 400 about field `param`.
    pub fn field(param: &str, message: impl Into<String>) -> Self {
        Self::bad(Some(param.to_string()), message)
    }
    /// Any status.
    pub fn status(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError { status, message: message.into(), param: None, code: None, retry_after: None }
    }
    /// With a machine-readable code.
    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }
    /// With `Retry-After`.
    pub fn retry_after(mut self, secs: u64) -> Self {
        self.retry_after = Some(secs);
        self
    }

    /// OpenAI's error types: a 404 (an unknown model, `code` model_not_found) is an
    /// `invalid_request_error` there, as every other 4xx but 401, 403 and 429.
    fn openai_type(&self) -> &'static str {
        match self.status.as_u16() {
            401 => "authentication_error",
            403 => "permission_error",
            429 => "rate_limit_error",
            500..=599 => "server_error",
            _ => "invalid_request_error",
        }
    }

    fn anthropic_type(&self) -> &'static str {
        match self.status.as_u16() {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            503 | 529 => "overloaded_error",
            500..=599 => "api_error",
            _ => "invalid_request_error",
        }
    }

    /// The JSON body in `flavor`'s shape.
    pub fn body(&self, flavor: Flavor) -> serde_json::Value {
        match flavor {
            Flavor::OpenAi => json!({"error": {
                "message": self.message,
                "type": self.openai_type(),
                "param": self.param,
                "code": self.code,
            }}),
            // Anthropic's error object has no `param`: the field leads the message, as its own
            // API writes it ("tools.0.name: …").
            Flavor::Anthropic => {
                let message = match &self.param {
                    Some(p) => format!("{p}: {}", self.message),
                    None => self.message.clone(),
                };
                json!({"type": "error", "error": {"type": self.anthropic_type(), "message": message}})
            }
        }
    }

    /// The HTTP response in `flavor`'s shape.
    pub fn response(&self, flavor: Flavor) -> Response {
        let mut r = (self.status, axum::Json(self.body(flavor))).into_response();
        if let Some(s) = self.retry_after {
            if let Ok(v) = HeaderValue::from_str(&s.to_string()) {
                r.headers_mut().insert("retry-after", v);
            }
        }
        r
    }
}

/// An error bound to a flavor (what handlers return).
pub struct Failure(pub ApiError, pub Flavor);

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        self.0.response(self.1)
    }
}
