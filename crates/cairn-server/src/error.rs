//! The one error shape of the API: `{"error": {"code", "message", ...}}`
//! with a fitting status, so every client can read every failure the same way.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use cairn_api::{ErrorBody, ErrorInfo, InputViolation};
use serde_json::{json, Value};

use cairn_engine::EngineError;
use cairn_store::StoreError;

/// An API failure: status, a stable machine code and a message for people.
#[derive(Debug)]
pub(crate) struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    pub details: Option<Value>,
    /// Seconds for a `Retry-After` header: the failure passes by itself.
    pub retry_after: Option<u16>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            details: None,
            retry_after: None,
        }
    }

    /// The process is out of file descriptors (or near enough that a new
    /// run would run out): a 503 the client retries, never a cause of its
    /// own request.
    pub fn out_of_descriptors(detail: impl std::fmt::Display) -> Self {
        ApiError {
            retry_after: Some(1),
            ..Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "out_of_descriptors",
                format!(
                    "the server is out of file descriptors for new runs ({detail}); try again shortly"
                ),
            )
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    /// The same failure under another machine code.
    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = code;
        self
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }

    /// What the body says (see [`ErrorBody`]).
    pub fn info(&self) -> ErrorInfo {
        ErrorInfo {
            code: self.code.to_string(),
            message: self.message.clone(),
            details: self.details.clone(),
        }
    }

    /// The body's `error`, also used for WebSocket replies.
    pub fn body(&self) -> Value {
        serde_json::to_value(self.info()).expect("an error serializes to JSON")
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody { error: self.info() };
        let mut resp = (self.status, axum::Json(body)).into_response();
        if let Some(secs) = self.retry_after {
            resp.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from(secs),
            );
        }
        resp
    }
}

/// A run id from a request that names no run at all: the engine's refusal
/// of it, so that it reads the same wherever it is found.
impl From<cairn_events::InvalidRunId> for ApiError {
    fn from(e: cairn_events::InvalidRunId) -> Self {
        ApiError::from(EngineError::InvalidRunId(e))
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        if let EngineError::Store(s) = &e {
            if out_of_descriptors(s) {
                return ApiError::out_of_descriptors(s);
            }
        }
        let (status, code) = engine_status(&e);
        let details = match &e {
            // A problem's message can quote the file; only its place is told.
            EngineError::Workflow(w) => Some(crate::workflows::problem_locations(
                w,
                &w.problems
                    .first()
                    .and_then(|p| p.file.file_name())
                    .map(|f| f.to_string_lossy().into_owned())
                    .unwrap_or_default(),
            )),
            EngineError::Input(i) => Some(json!(i
                .violations
                .iter()
                .map(|v| InputViolation {
                    pointer: v.pointer.clone(),
                    message: v.message.clone(),
                })
                .collect::<Vec<_>>())),
            _ => None,
        };
        let message = match &e {
            EngineError::Workflow(w) => format!(
                "the run's workflow is not valid ({} problem{}; the server's log says what they are)",
                w.problems.len(),
                if w.problems.len() == 1 { "" } else { "s" }
            ),
            _ => e.to_string(),
        };
        // What the client is not told, the server's operator still needs.
        if let EngineError::Workflow(w) = &e {
            eprintln!("cairn serve: workflow problems:\n{w}");
        }
        ApiError {
            status,
            code,
            message,
            details,
            retry_after: None,
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        if out_of_descriptors(&e) {
            return ApiError::out_of_descriptors(&e);
        }
        let (status, code) = store_status(&e);
        ApiError::new(status, code, e.to_string())
    }
}

/// The status and code of an engine error.
///
/// What names nothing there is 404 (a run, node, question or workflow); a
/// request that does not fit the run's state is 409 (a node not waiting, a
/// question answered, a run ended or driven by another process, a command
/// the driver refused or did not take, files that cannot be put back
/// now); a request malformed in itself is 400 (a run id, an answer that
/// breaks its schema, a revert or fork point the run does not have). A
/// store that no longer matches its run's log is 409 `integrity`.
/// The match is exhaustive so that a new engine error must be placed here.
fn engine_status(e: &EngineError) -> (StatusCode, &'static str) {
    use cairn_engine::RevertRefusal;
    match e {
        EngineError::Workflow(_) => (StatusCode::BAD_REQUEST, "invalid_workflow"),
        EngineError::Input(_) => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_input"),
        EngineError::Secret { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "secret_unreadable"),
        EngineError::Store(s) => store_status(s),
        EngineError::ShuttingDown => (StatusCode::SERVICE_UNAVAILABLE, "shutting_down"),
        EngineError::InvalidRunId(_) => (StatusCode::BAD_REQUEST, "invalid_run_id"),
        EngineError::WorkflowNotFound { .. }
        | EngineError::RunNotFound { .. }
        | EngineError::NodeNotFound { .. }
        | EngineError::QuestionNotFound { .. } => (StatusCode::NOT_FOUND, "not_found"),
        // A dry run while a revert waits to be finished: the run's state.
        EngineError::RevertRefused {
            reason: RevertRefusal::OpenRevert { .. },
        } => (StatusCode::CONFLICT, "conflict"),
        EngineError::AnswerInvalid { .. }
        | EngineError::ForkRefused { .. }
        | EngineError::RevertRefused { .. } => (StatusCode::BAD_REQUEST, "bad_request"),
        EngineError::NodeNotWaiting { .. }
        | EngineError::QuestionAnswered { .. }
        | EngineError::RunEnded { .. }
        | EngineError::RunEndedFirst { .. }
        | EngineError::CommandNotTaken { .. }
        | EngineError::CommandRefused { .. }
        | EngineError::NotHijackable { .. }
        | EngineError::LeaseHeld { .. }
        | EngineError::ResumeRefused { .. }
        | EngineError::NoSnapshots
        | EngineError::ReplayRefused { .. }
        | EngineError::SnapshotsUnavailable { .. }
        | EngineError::Workspace(_)
        | EngineError::Files { .. } => (StatusCode::CONFLICT, "conflict"),
        EngineError::Integrity { .. } => (StatusCode::CONFLICT, "integrity"),
    }
}

/// Whether an error is the process (or the system) running out of file
/// descriptors, `EMFILE` or `ENFILE`, anywhere in its chain of causes or,
/// for errors that carry a cause only as text (a database driver's), in
/// its message.
pub(crate) fn out_of_descriptors(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(e);
    while let Some(c) = cause {
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            if io_out_of_descriptors(io) {
                return true;
            }
        }
        let text = c.to_string();
        if text.contains("Too many open files")
            || text.contains("os error 24)")
            || text.contains("os error 23)")
        {
            return true;
        }
        cause = c.source();
    }
    false
}

/// `EMFILE` or `ENFILE`.
pub(crate) fn io_out_of_descriptors(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
}

/// The status and code of a store failure, whether the store reported it
/// directly or through the engine.
///
/// The split follows who can act on it. What the client asked about is a
/// 4xx (an unknown run is 404, a taken or malformed id 400/409, a run another
/// process drives 409: the run's state conflicts with the request). A store
/// that cannot take writes right now but will once an operator acts or a
/// lock is released is a 503, so clients and proxies retry rather than
/// report a bug: another process holding the database beyond the busy
/// timeout (`Locked`), a closed journal, a read-only file or mount. A full
/// disk is 507 Insufficient Storage, the status HTTP has for exactly this.
/// Everything else (a damaged, too-new, missing or misnamed store, an
/// unreadable row, an I/O or database error, a failed commit) is the
/// server's own failure: 500.
/// The match is exhaustive so that a new store error must be placed here.
fn store_status(e: &StoreError) -> (StatusCode, &'static str) {
    match e {
        StoreError::RunNotFound(_) | StoreError::RecordNotFound { .. } => {
            (StatusCode::NOT_FOUND, "not_found")
        }
        StoreError::RunExists(_) | StoreError::LeaseHeld { .. } => {
            (StatusCode::CONFLICT, "conflict")
        }
        StoreError::Locked { .. } => (StatusCode::SERVICE_UNAVAILABLE, "store_locked"),
        StoreError::ReadOnly { .. } => (StatusCode::SERVICE_UNAVAILABLE, "store_read_only"),
        StoreError::Closed => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
        StoreError::DiskFull { .. } => (StatusCode::INSUFFICIENT_STORAGE, "store_full"),
        StoreError::Corrupt { .. }
        | StoreError::TooNew { .. }
        | StoreError::Open { .. }
        | StoreError::Missing { .. }
        | StoreError::BadUrl(_)
        | StoreError::BadRow { .. }
        | StoreError::Database(_)
        | StoreError::Io { .. }
        | StoreError::Commit(_) => (StatusCode::INTERNAL_SERVER_ERROR, "store"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn status_of(e: EngineError) -> (u16, &'static str) {
        let a = ApiError::from(e);
        (a.status.as_u16(), a.code)
    }

    #[test]
    fn engine_errors_map_to_their_statuses() {
        use cairn_engine::{
            ForkRefusal, HijackRefusal, IntegrityProblem, ResumeRefusal, RevertRefusal, Wanted,
        };
        use cairn_events::{RunId, RunStatus};
        let run = || RunId::parse("r").unwrap();
        let cases: Vec<(EngineError, u16, &str)> = vec![
            (EngineError::ShuttingDown, 503, "shutting_down"),
            (
                EngineError::InvalidRunId(RunId::parse("../x").unwrap_err()),
                400,
                "invalid_run_id",
            ),
            (
                EngineError::WorkflowNotFound {
                    name: "w".into(),
                    dir: None,
                },
                404,
                "not_found",
            ),
            (EngineError::RunNotFound { run: run() }, 404, "not_found"),
            (
                EngineError::NodeNotFound {
                    run: run(),
                    node: "n".into(),
                },
                404,
                "not_found",
            ),
            (
                EngineError::QuestionNotFound {
                    run: run(),
                    request: "q".into(),
                },
                404,
                "not_found",
            ),
            (
                EngineError::AnswerInvalid {
                    request: "q".into(),
                    reason: "x".into(),
                },
                400,
                "bad_request",
            ),
            (
                EngineError::ForkRefused {
                    reason: ForkRefusal::SeqZero,
                },
                400,
                "bad_request",
            ),
            (
                EngineError::RevertRefused {
                    reason: RevertRefusal::NodeWithoutSnapshot { node: "n".into() },
                },
                400,
                "bad_request",
            ),
            (
                EngineError::RevertRefused {
                    reason: RevertRefusal::OpenRevert { node: "n".into() },
                },
                409,
                "conflict",
            ),
            (
                EngineError::NodeNotWaiting {
                    run: run(),
                    node: "n".into(),
                    status: None,
                },
                409,
                "conflict",
            ),
            (
                EngineError::QuestionAnswered {
                    run: run(),
                    request: "q".into(),
                },
                409,
                "conflict",
            ),
            (
                EngineError::RunEnded {
                    run: run(),
                    status: RunStatus::Finished,
                },
                409,
                "conflict",
            ),
            (
                EngineError::RunEndedFirst {
                    run: run(),
                    command: "cancel",
                },
                409,
                "conflict",
            ),
            (
                EngineError::CommandNotTaken {
                    run: run(),
                    command: "approve",
                    waited: std::time::Duration::from_secs(30),
                },
                409,
                "conflict",
            ),
            (
                EngineError::CommandRefused {
                    run: run(),
                    command: "approve",
                    reason: "x".into(),
                },
                409,
                "conflict",
            ),
            (
                EngineError::NotHijackable {
                    node: "n".into(),
                    why: HijackRefusal::NotRunning,
                },
                409,
                "conflict",
            ),
            (
                EngineError::LeaseHeld {
                    run: run(),
                    holder: None,
                    wanted: Wanted::Resume,
                },
                409,
                "conflict",
            ),
            (
                EngineError::ResumeRefused {
                    run: run(),
                    reason: ResumeRefusal::Ended(RunStatus::Failed),
                },
                409,
                "conflict",
            ),
            (EngineError::NoSnapshots, 409, "conflict"),
            (
                EngineError::SnapshotsUnavailable { detail: "x".into() },
                409,
                "conflict",
            ),
            (
                EngineError::Workspace(cairn_events::ErrorInfo::new("sandbox", "x")),
                409,
                "conflict",
            ),
            (
                EngineError::Integrity {
                    run: run(),
                    problem: IntegrityProblem::GenerationMissing { generation: 2 },
                },
                409,
                "integrity",
            ),
        ];
        for (e, status, code) in cases {
            let said = e.to_string();
            assert_eq!(status_of(e), (status, code), "{said}");
        }
    }

    #[test]
    fn running_out_of_descriptors_is_a_503_with_retry_after_whatever_the_path() {
        let emfile = || StoreError::Io {
            path: PathBuf::from("locks/r.lock"),
            source: std::io::Error::from_raw_os_error(libc::EMFILE),
        };
        for e in [
            ApiError::from(emfile()),
            ApiError::from(EngineError::Store(emfile())),
        ] {
            assert_eq!((e.status.as_u16(), e.code), (503, "out_of_descriptors"));
            let resp = e.into_response();
            assert_eq!(resp.headers()["retry-after"], "1");
        }
        // A driver that keeps only the text.
        let pg = ApiError::from(StoreError::Database(
            "error connecting: Too many open files (os error 24)".into(),
        ));
        assert_eq!(pg.code, "out_of_descriptors");
        // Another I/O error keeps its own cause.
        let other = ApiError::from(StoreError::Io {
            path: PathBuf::from("locks/r.lock"),
            source: std::io::Error::from_raw_os_error(libc::EACCES),
        });
        assert_eq!((other.status.as_u16(), other.code), (500, "store"));
    }

    #[test]
    fn store_errors_map_the_same_directly_and_through_the_engine() {
        // Each case makes its error afresh: StoreError is not Clone.
        type Case = (fn() -> StoreError, u16, &'static str);
        let cases: Vec<Case> = vec![
            (|| StoreError::RunNotFound("r".into()), 404, "not_found"),
            (
                || StoreError::RecordNotFound {
                    what: "command",
                    id: 3,
                },
                404,
                "not_found",
            ),
            (|| StoreError::RunExists("r".into()), 409, "conflict"),
            (
                || StoreError::LeaseHeld { run: "r".into() },
                409,
                "conflict",
            ),
            (
                || StoreError::Locked {
                    store: "cairn.db".into(),
                },
                503,
                "store_locked",
            ),
            (
                || StoreError::ReadOnly {
                    store: "cairn.db".into(),
                    detail: "ro".into(),
                },
                503,
                "store_read_only",
            ),
            (|| StoreError::Closed, 503, "unavailable"),
            (
                || StoreError::DiskFull {
                    store: "cairn.db".into(),
                },
                507,
                "store_full",
            ),
            (
                || StoreError::Corrupt {
                    store: "cairn.db".into(),
                    detail: "x".into(),
                },
                500,
                "store",
            ),
            (
                || StoreError::BadRow {
                    run: "r".into(),
                    detail: "x".into(),
                },
                500,
                "store",
            ),
            (|| StoreError::Database("x".into()), 500, "store"),
        ];
        for (make, status, code) in cases {
            let direct = ApiError::from(make());
            assert_eq!(
                (direct.status.as_u16(), direct.code),
                (status, code),
                "{:?}",
                make()
            );
            assert_eq!(
                status_of(EngineError::Store(make())),
                (status, code),
                "{:?}",
                make()
            );
        }
    }
}
