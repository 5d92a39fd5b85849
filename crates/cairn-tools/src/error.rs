//! The errors tool calls end with.

use cairn_events::ErrorInfo;
use serde_json::{json, Value};

use crate::process::ProcessError;

/// Why a tool call failed. [`ToolError::kind`] names the variant for
/// `ErrorInfo.kind`; [`ToolError::to_error_info`] builds the whole object.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// The arguments do not fit the tool's schema.
    #[error("{tool}: bad argument `{field}`: {message}")]
    BadArgs {
        /// The tool called.
        tool: String,
        /// The argument at fault.
        field: String,
        /// What is wrong with it.
        message: String,
    },
    /// A path was refused or could not be opened.
    #[error("path `{path}` {reason}")]
    Path {
        /// The path as given.
        path: String,
        /// Why (escapes the root, does not exist, ...).
        reason: String,
    },
    /// A file or content is over the output limit.
    #[error("{what} is {size} bytes, over the limit of {limit} bytes")]
    TooLarge {
        /// What was too large.
        what: String,
        /// Its size.
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// The network is shut and the command would use it.
    #[error("network access refused for `{target}`: {reason}")]
    NetworkRefused {
        /// What the command would have reached.
        target: String,
        /// Which rule refused it.
        reason: String,
    },
    /// A command ended with a non-zero exit code or a signal.
    #[error("{}", exit_message(*.code, *.signal, stderr))]
    Exit {
        /// The exit code, if it exited.
        code: Option<i32>,
        /// The signal, if one ended it.
        signal: Option<i32>,
        /// Its captured standard output.
        stdout: String,
        /// Its captured standard error.
        stderr: String,
    },
    /// A command ran into its time limit; its whole group was killed.
    #[error("command timed out after {}s and was killed", .timeout.as_secs_f64())]
    Timeout {
        /// The limit that applied.
        timeout: std::time::Duration,
        /// Output captured before the kill.
        stdout: String,
        /// Error output captured before the kill.
        stderr: String,
    },
    /// The call was cancelled.
    #[error("cancelled")]
    Cancelled,
    /// A hunk of a patch does not apply; the file was left untouched.
    #[error("hunk {index} ({header}) does not apply to `{path}`: {reason}")]
    Hunk {
        /// The file being edited.
        path: String,
        /// 1-based position of the hunk in the patch.
        index: usize,
        /// The hunk's `@@ ... @@` line.
        header: String,
        /// What did not match.
        reason: String,
    },
    /// A patch could not be parsed.
    #[error("patch line {line}: {message}")]
    Patch {
        /// 1-based line in the patch text.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// A search pattern is not a valid regular expression.
    #[error("bad pattern `{pattern}`: {message}")]
    Pattern {
        /// The pattern.
        pattern: String,
        /// The regex engine's explanation.
        message: String,
    },
    /// A process could not be started.
    #[error(transparent)]
    Process(#[from] ProcessError),
    /// The command failed because it hit one of the sandbox's resource
    /// limits.
    #[error("command stopped by a resource limit: {limit}")]
    ResourceLimit {
        /// Which limit, in words.
        limit: String,
        /// Exit code, if it exited.
        code: Option<i32>,
        /// Signal, if one ended it.
        signal: Option<i32>,
        /// Captured standard error.
        stderr: String,
    },
    /// Reading or writing failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// No tool has that name.
    #[error("unknown tool `{0}`")]
    UnknownTool(String),
    /// A custom tool's own failure.
    #[error("{0}")]
    Other(String),
}

fn exit_message(code: Option<i32>, signal: Option<i32>, stderr: &str) -> String {
    let how = match (code, signal) {
        (Some(c), _) => format!("command exited with code {c}"),
        (None, Some(s)) => format!("command was killed by signal {s}"),
        (None, None) => "command ended abnormally".to_string(),
    };
    let tail = stderr.trim_end();
    if tail.is_empty() {
        how
    } else {
        // The last lines of stderr usually say why; the whole output is in
        // the error's details.
        let last: Vec<&str> = tail.lines().rev().take(3).collect();
        let last: Vec<&str> = last.into_iter().rev().collect();
        format!("{how}: {}", last.join(" / "))
    }
}

impl ToolError {
    /// A short machine-readable name for `ErrorInfo.kind`.
    pub fn kind(&self) -> &'static str {
        match self {
            ToolError::BadArgs { .. } => "bad_args",
            ToolError::Path { .. } => "path",
            ToolError::TooLarge { .. } => "too_large",
            ToolError::NetworkRefused { .. } => "network_refused",
            ToolError::Exit { .. } => "exit",
            ToolError::Timeout { .. } => "timeout",
            ToolError::Cancelled => "cancelled",
            ToolError::Hunk { .. } => "hunk",
            ToolError::Patch { .. } => "patch",
            ToolError::Pattern { .. } => "pattern",
            ToolError::Process(ProcessError::Sandbox { .. }) => "sandbox",
            ToolError::Process(_) => "spawn",
            ToolError::ResourceLimit { .. } => "resource_limit",
            ToolError::Io { .. } => "io",
            ToolError::UnknownTool(_) => "unknown_tool",
            ToolError::Other(_) => "tool",
        }
    }

    /// Structured details (exit code and output, hunk number, ...), if any.
    pub fn details(&self) -> Option<Value> {
        match self {
            ToolError::Exit {
                code,
                signal,
                stdout,
                stderr,
            } => Some(
                json!({"exitCode": code, "signal": signal, "stdout": stdout, "stderr": stderr}),
            ),
            ToolError::Timeout {
                timeout,
                stdout,
                stderr,
            } => Some(
                json!({"timeoutMs": timeout.as_millis() as u64, "stdout": stdout, "stderr": stderr}),
            ),
            ToolError::Hunk { index, header, .. } => Some(json!({"hunk": index, "header": header})),
            ToolError::Path { path, .. } => Some(json!({"path": path})),
            ToolError::NetworkRefused { target, reason } => {
                Some(json!({"target": target, "reason": reason}))
            }
            ToolError::BadArgs { field, .. } => Some(json!({"field": field})),
            ToolError::ResourceLimit {
                limit,
                code,
                signal,
                stderr,
            } => {
                Some(json!({"limit": limit, "exitCode": code, "signal": signal, "stderr": stderr}))
            }
            _ => None,
        }
    }

    /// The `error` object of `ToolCallFinished` / `NodeFailed`.
    pub fn to_error_info(&self) -> ErrorInfo {
        let mut info = ErrorInfo::new(self.kind(), self.to_string());
        info.details = self.details();
        info
    }

    pub(crate) fn bad_args(tool: &str, field: &str, message: impl Into<String>) -> Self {
        ToolError::BadArgs {
            tool: tool.to_string(),
            field: field.to_string(),
            message: message.into(),
        }
    }

    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        ToolError::Io {
            context: context.into(),
            source,
        }
    }
}
