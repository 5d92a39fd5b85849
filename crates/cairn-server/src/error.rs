//! The one error shape of the API: `{"error": {"code", "message", ...}}`
//! with a fitting status, so every client can read every failure the same way.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use cairn_engine::EngineError;

/// An API failure: status, a stable machine code and a message for people.
#[derive(Debug)]
pub(crate) struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    pub details: Option<Value>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            details: None,
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }

    /// The JSON body, also used for WebSocket replies.
    pub fn body(&self) -> Value {
        let mut e = json!({"code": self.code, "message": self.message});
        if let Some(d) = &self.details {
            e["details"] = d.clone();
        }
        e
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": self.body()});
        (self.status, axum::Json(body)).into_response()
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        let status =
            StatusCode::from_u16(e.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let code = match &e {
            EngineError::Workflow(_) => "invalid_workflow",
            EngineError::Input(_) => "invalid_input",
            EngineError::NotFound(_) => "not_found",
            EngineError::Conflict(_) => "conflict",
            EngineError::BadRequest(_) => "bad_request",
            EngineError::ShuttingDown => "shutting_down",
            EngineError::Store(_) if status == StatusCode::CONFLICT => "conflict",
            EngineError::Store(_) => "store",
        };
        let details = match &e {
            EngineError::Workflow(w) => Some(Value::Array(
                w.problems
                    .iter()
                    .map(|p| {
                        json!({
                            "file": p.file.display().to_string(),
                            "line": p.line,
                            "column": p.column,
                            "field": p.field,
                            "message": p.message,
                            "hint": p.hint,
                        })
                    })
                    .collect(),
            )),
            EngineError::Input(i) => Some(Value::Array(
                i.violations
                    .iter()
                    .map(|v| json!({"pointer": v.pointer, "message": v.message}))
                    .collect(),
            )),
            _ => None,
        };
        ApiError {
            status,
            code,
            message: e.to_string(),
            details,
        }
    }
}

impl From<cairn_store::StoreError> for ApiError {
    fn from(e: cairn_store::StoreError) -> Self {
        use cairn_store::StoreError as S;
        match &e {
            S::NotFound(_) => ApiError::not_found(e.to_string()),
            S::InvalidRunId(_) => {
                ApiError::new(StatusCode::BAD_REQUEST, "invalid_run_id", e.to_string())
            }
            S::RunExists(_) | S::Busy { .. } => {
                ApiError::new(StatusCode::CONFLICT, "conflict", e.to_string())
            }
            S::Closed => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                e.to_string(),
            ),
            _ => ApiError::internal(e.to_string()),
        }
    }
}
