use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::error::InputError;

/// A parsed and validated workflow file.
#[derive(Debug, Clone, PartialEq)]
pub struct Workflow {
    /// The workflow's name, `[a-z0-9_-]+`.
    pub name: String,
    /// Free text for people.
    pub description: Option<String>,
    /// JSON Schema the run's input must satisfy.
    pub input_schema: Option<serde_json::Value>,
    /// Options applied to every node that does not set its own.
    pub defaults: Defaults,
    /// Most nodes running at once.
    pub concurrency: Option<usize>,
    /// The tools' sandbox.
    pub sandbox: SandboxSpec,
    /// Template source of the run's output.
    pub output: Option<String>,
    /// Top-level nodes, in file order.
    pub nodes: Vec<NodeSpec>,
    /// The file's path, made absolute.
    pub path: PathBuf,
    /// The file's folder: default cwd for commands and default sandbox root.
    pub base_dir: PathBuf,
    /// The file's text.
    pub source: String,
    /// SHA-256 hex of the text.
    pub hash: String,
}

/// Node options applied workflow-wide.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Defaults {
    /// Default node timeout.
    pub timeout: Option<Duration>,
    /// Default retry policy.
    pub retry: Option<RetryPolicy>,
}

/// Settings for the tools' sandbox.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SandboxSpec {
    /// Root folder (relative to the workflow's folder); `None` means the workflow's folder.
    pub root: Option<String>,
    /// Whether bash may use the network.
    pub network: bool,
    /// Cap on a tool's captured output.
    pub max_output_bytes: Option<u64>,
    /// Default timeout of one tool call.
    pub tool_timeout: Option<Duration>,
}

/// One node as written in the file.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeSpec {
    /// Id, unique among siblings.
    pub id: String,
    /// What the node does.
    pub kind: NodeKind,
    /// Sibling ids that must end before this node starts.
    pub needs: Vec<String>,
    /// Expression; false skips the node.
    pub if_: Option<String>,
    /// Timeline grouping name (the events' `chapter`).
    pub stage: Option<String>,
    /// Node timeout (falls back to the workflow default in the engine).
    pub timeout: Option<Duration>,
    /// Retry policy (falls back to the workflow default in the engine).
    pub retry: Option<RetryPolicy>,
    /// What a failure of this node means for the run.
    pub on_failure: OnFailure,
    /// Environment added to a command (templates).
    pub env: BTreeMap<String, String>,
    /// Working directory of a command (template).
    pub cwd: Option<String>,
    /// How a command's stdout becomes its output.
    pub output: OutputFormat,
    /// 1-based line where the node starts in the file.
    pub line: usize,
}

/// The kind of a node and its kind-specific settings.
#[derive(Debug, Clone, PartialEq)]
pub enum NodeKind {
    /// Runs an argv (templates) without a shell.
    Command(Vec<String>),
    /// Its rendered value is the output.
    Value(serde_json::Value),
    /// Waits for a person; the string is the message template.
    Approval(String),
    /// Repeats `nodes` until `until` holds, at most `max_iterations` passes.
    Loop {
        /// Expression checked after each pass.
        until: String,
        /// Upper bound on passes.
        max_iterations: u32,
        /// The body.
        nodes: Vec<NodeSpec>,
    },
    /// Mounts `nodes` once per element of the list `list` yields.
    ForEach {
        /// Expression yielding the list.
        list: String,
        /// Name the element is bound to besides `item`.
        as_name: Option<String>,
        /// The body.
        nodes: Vec<NodeSpec>,
    },
    /// Calls one sandboxed tool.
    Tool {
        /// The tool's name.
        tool: String,
        /// Arguments; strings inside are templates.
        args: serde_json::Value,
    },
}

impl NodeKind {
    /// The kind key as written in files: `command`, `value`, `approval`, `loop`, `for_each`, `tool`.
    pub fn name(&self) -> &'static str {
        todo!()
    }

    /// The body of a group node (`loop`, `for_each`); `None` for leaves.
    pub fn children(&self) -> Option<&[NodeSpec]> {
        todo!()
    }
}

/// What a node's failure means for the run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OnFailure {
    /// The run fails.
    #[default]
    Fail,
    /// Dependents are skipped, the run goes on.
    Continue,
}

/// How a command's stdout becomes its output.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OutputFormat {
    /// The text as is.
    #[default]
    Text,
    /// Parsed as JSON.
    Json,
    /// A list of lines.
    Lines,
}

/// How retries space out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Backoff {
    /// The same delay each time.
    Fixed,
    /// The delay doubles each time, up to `max_delay`.
    #[default]
    Exponential,
}

/// How often and how patiently a node is retried.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// Total attempts, at least 1.
    pub attempts: u32,
    /// How the delay grows.
    pub backoff: Backoff,
    /// Base delay.
    pub delay: Duration,
    /// Cap on one delay.
    pub max_delay: Duration,
}

impl RetryPolicy {
    /// Delay before attempt `next_attempt` (2, 3, ...), with jitter in [0.5x, 1x] from a
    /// caller-given fraction so tests are deterministic.
    pub fn delay_before(&self, next_attempt: u32, jitter: f64) -> Duration {
        let _ = (next_attempt, jitter);
        todo!()
    }
}

impl Workflow {
    /// Checks a run input against the workflow's JSON Schema.
    pub fn validate_input(&self, input: &serde_json::Value) -> Result<(), InputError> {
        let _ = input;
        todo!()
    }

    /// A Mermaid `flowchart TD` of the workflow: groups as subgraphs, edges from `needs`.
    pub fn mermaid(&self) -> String {
        todo!()
    }
}
