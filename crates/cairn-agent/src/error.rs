//! What can go wrong with a model call, in terms the engine maps to a
//! node's `error.kind` and to whether a retry may mend it.

/// Why a model call failed. The message never holds the API key.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct ModelError {
    /// What kind of failure.
    pub kind: ModelErrorKind,
    /// For people: what happened, with the provider's own message (cut).
    pub message: String,
    /// The HTTP status, when the provider answered with one.
    pub status: Option<u16>,
}

/// The kinds of [`ModelError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelErrorKind {
    /// The model's settings are wrong (a script that cannot be read, a
    /// scripted model asked past its last turn).
    Config,
    /// No key, or the provider refused it (401, 403).
    Auth,
    /// The provider refused the request (400, 404, 422, ...).
    BadRequest,
    /// 429 after every retry.
    RateLimited,
    /// 5xx after every retry.
    Server,
    /// The connection failed or dropped before the answer began, after
    /// every retry.
    Network,
    /// No byte for longer than `idle_timeout`.
    IdleTimeout,
    /// The whole call took longer than its timeout.
    Timeout,
    /// The stream was not what the wire format says.
    Protocol,
    /// The provider sent an error event in the stream.
    StreamError,
    /// The stream broke after the answer began; never re-sent on its own,
    /// since the answer may have been paid for.
    Interrupted,
    /// The answer exceeded what Cairn keeps of one.
    TooLarge,
}

impl ModelErrorKind {
    /// As a node's `error.kind` writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            ModelErrorKind::Config => "config",
            ModelErrorKind::Auth => "auth",
            ModelErrorKind::BadRequest => "bad_request",
            ModelErrorKind::RateLimited => "rate_limited",
            ModelErrorKind::Server => "server",
            ModelErrorKind::Network => "network",
            ModelErrorKind::IdleTimeout => "idle_timeout",
            ModelErrorKind::Timeout => "timeout",
            ModelErrorKind::Protocol => "protocol",
            ModelErrorKind::StreamError => "stream_error",
            ModelErrorKind::Interrupted => "interrupted",
            ModelErrorKind::TooLarge => "too_large",
        }
    }

    /// Whether a later attempt of the node may succeed where this failed.
    pub fn retryable(self) -> bool {
        !matches!(
            self,
            ModelErrorKind::Config | ModelErrorKind::Auth | ModelErrorKind::BadRequest
        )
    }
}

impl ModelErrorKind {
    /// Whether a model's `fallback` is asked after this: the provider
    /// turned the call away (rate limits, its own errors, no connection)
    /// after every retry, before any byte of an answer, so another model
    /// may answer the same request.
    pub fn falls_back(self) -> bool {
        matches!(
            self,
            ModelErrorKind::RateLimited | ModelErrorKind::Server | ModelErrorKind::Network
        )
    }
}

impl ModelError {
    /// An error of `kind` with a message.
    pub fn new(kind: ModelErrorKind, message: impl Into<String>) -> ModelError {
        ModelError {
            kind,
            message: message.into(),
            status: None,
        }
    }
}
