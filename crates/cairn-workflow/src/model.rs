use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::error::{InputError, InputViolation};
use crate::kinds::{Group, NodeKind, SwitchSpec};
use cairn_models::{ModelConfig, RetryPolicy};

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
    /// The models agent nodes use, by name (`models:`).
    pub models: BTreeMap<String, ModelConfig>,
    /// Most the run may spend on models, in USD (`max_cost_usd`).
    pub max_cost_usd: Option<f64>,
    /// The MCP servers agents may use, by name (`mcp_servers:`).
    pub mcp_servers: BTreeMap<String, McpServerDef>,
    /// Plain variables for every command, tool process and agent CLI
    /// (`env:`); a node's `env` adds to them.
    pub env: BTreeMap<String, String>,
    /// The secrets a run may use and where each comes from (`secrets:`).
    /// Their values are read when a run starts or resumes, never kept.
    pub secrets: BTreeMap<String, SecretSource>,
    /// The file's path, made absolute.
    pub path: PathBuf,
    /// The file's folder: default cwd for commands and default sandbox root.
    pub base_dir: PathBuf,
    /// The file's text.
    pub source: String,
    /// SHA-256 hex of the text.
    pub hash: String,
    /// The texts of the files the workflow refers to in its whole tree
    /// (child workflows, scripted models' scripts), by the path its
    /// references resolve to ([`Workflow::resolve`], `base_dir` joined with
    /// a script), as a run pinned them when it began: a run reads these,
    /// never the disk, which a node may have changed since. `None` until a
    /// run pins them (and for runs started before files were pinned, which
    /// read the disk).
    pub pinned: Option<std::sync::Arc<BTreeMap<PathBuf, String>>>,
}

/// Where a secret's value comes from (`secrets.<NAME>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretSource {
    /// The engine's environment variable of this name.
    Env(String),
    /// A file's text, one trailing newline dropped; relative to the
    /// workflow's folder.
    File(String),
    /// A command's standard output, one trailing newline dropped: an argv,
    /// run without a shell (a password manager's CLI).
    Command(Vec<String>),
}

impl std::fmt::Display for SecretSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SecretSource::Env(v) => write!(f, "environment variable `{v}`"),
            SecretSource::File(p) => write!(f, "file `{p}`"),
            SecretSource::Command(argv) => write!(f, "command `{}`", argv.join(" ")),
        }
    }
}

/// An MCP server agents may use (`mcp_servers.<name>`).
#[derive(Debug, Clone, PartialEq)]
pub struct McpServerDef {
    /// How Cairn reaches it.
    pub transport: McpTransport,
    /// Longest one tool call may take.
    pub timeout: Option<Duration>,
}

/// How an MCP server is reached.
#[derive(Debug, Clone, PartialEq)]
pub enum McpTransport {
    /// A program Cairn starts (in the workflow's sandbox) and speaks to
    /// over its stdin and stdout.
    Stdio {
        /// The argv; `argv[0]` is looked up in `PATH`.
        command: Vec<String>,
        /// Variables added to its environment.
        env: BTreeMap<String, String>,
    },
    /// A server that speaks MCP's streamable HTTP at a URL.
    Http {
        /// The endpoint.
        url: String,
        /// Header names to the environment variables holding their values
        /// (a token never enters the workflow file or the log).
        headers_env: BTreeMap<String, String>,
    },
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
    /// Whether processes may use the network (`network: true`).
    pub network: bool,
    /// `network: [hosts]`: the hosts (globs, optional `:port`) processes may
    /// reach through the filtering proxy; `network` is false then.
    pub network_hosts: Vec<String>,
    /// Cap on a tool's captured output.
    pub max_output_bytes: Option<u64>,
    /// Default timeout of one tool call.
    pub tool_timeout: Option<Duration>,
    /// Whether the processes nodes start are confined (`isolation`).
    pub isolation: Isolation,
    /// Per-process resource ceilings (`limits`).
    pub limits: ResourceLimits,
    /// Extra host folders processes see read-only (`read_only`), e.g. a
    /// toolchain outside `/usr`.
    pub read_only: Vec<String>,
}

/// Whether the processes a node starts are confined (`sandbox.isolation`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Isolation {
    /// Their own user, mount, PID and network namespaces (the default).
    #[default]
    Namespaces,
    /// No namespaces: an explicit opt-out, logged when a node uses it.
    None,
}

/// Per-process resource ceilings (`sandbox.limits`); unset means none.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ResourceLimits {
    /// `memory`: address space in bytes (`512MiB`, `2GiB` or bytes).
    pub memory_bytes: Option<u64>,
    /// `processes`: processes (and threads) at once.
    pub processes: Option<u64>,
    /// `cpu`: CPU time (a duration, whole seconds).
    pub cpu: Option<Duration>,
}

impl ResourceLimits {
    /// These limits with `over`'s set values taking precedence.
    pub fn overridden_by(self, over: ResourceLimits) -> ResourceLimits {
        ResourceLimits {
            memory_bytes: over.memory_bytes.or(self.memory_bytes),
            processes: over.processes.or(self.processes),
            cpu: over.cpu.or(self.cpu),
        }
    }
}

/// A node's own `sandbox:` settings, overriding the workflow's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeSandbox {
    /// `isolation`, when the node sets it.
    pub isolation: Option<Isolation>,
    /// `limits` the node sets (each replaces the workflow's).
    pub limits: ResourceLimits,
}

/// One node as written in the file.
///
/// What every node has is inline; the settings most nodes leave at their
/// defaults are in a [`NodeSettings`] shared between the nodes whose
/// settings are equal (a workflow of 100,000 nodes usually holds one or a
/// few), and read through this type as if they were its own fields
/// (`spec.timeout`), which is why it dereferences to them.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeSpec {
    /// Id, unique among siblings.
    pub id: String,
    /// What the node does.
    pub kind: NodeKind,
    /// Sibling ids that must end before this node starts.
    pub needs: Vec<String>,
    /// 1-based line where the node starts in the file.
    pub line: usize,
    /// Everything else the node sets.
    pub settings: std::sync::Arc<NodeSettings>,
}

impl std::ops::Deref for NodeSpec {
    type Target = NodeSettings;
    fn deref(&self) -> &NodeSettings {
        &self.settings
    }
}

/// The settings of a node beside its id, kind and needs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeSettings {
    /// Expression; false skips the node.
    pub if_: Option<String>,
    /// The `if` calls a status function (`success()`, `failure()`,
    /// `cancelled()`, `always()`): the node is a handler, asked once its
    /// needs all ended however they ended, even while the run stops
    /// (WORKFLOW.md, "Failure handlers"). Without one, the `if` is asked
    /// only when every need finished.
    pub handler: bool,
    /// Timeline grouping name (the events' `chapter`).
    pub stage: Option<String>,
    /// Node timeout (falls back to the workflow default in the engine).
    pub timeout: Option<Duration>,
    /// Retry policy (falls back to the workflow default in the engine).
    pub retry: Option<RetryPolicy>,
    /// What a failure of this node means for the run.
    pub on_failure: OnFailure,
    /// What a resume does with an attempt that a crash interrupted.
    pub on_interrupt: OnInterrupt,
    /// What happens to the sandbox root before a retry.
    pub on_retry: OnRetry,
    /// Environment added to a command (templates).
    pub env: BTreeMap<String, String>,
    /// Working directory of a command (template).
    pub cwd: Option<String>,
    /// How a command's stdout becomes its output.
    pub output: OutputFormat,
    /// A `tool` node's own output/content limit, lower than the sandbox's
    /// `max_output_bytes` (the sandbox's stays the ceiling).
    pub max_output_bytes: Option<u64>,
    /// The node's own sandbox settings (`command` and `tool` nodes).
    pub sandbox: NodeSandbox,
    /// What grades the node's output once it finished (`scorers:`).
    pub scorers: Vec<ScorerSpec>,
    /// The declared secrets this node's processes get as environment
    /// variables (`secrets: [NAME]`).
    pub secrets: Vec<String>,
}

/// One scorer of a node (`scorers[i]`): a command or a model that grades
/// the node's output with a number from 0 to 1.
#[derive(Debug, Clone, PartialEq)]
pub struct ScorerSpec {
    /// Id, unique among the node's scorers (the events' `scorerId`).
    pub id: String,
    /// A label for people (the events' `scorerName`); the id when not given.
    pub name: String,
    /// What does the grading.
    pub kind: ScorerKind,
    /// Whether the node's dependents wait for this scorer's end.
    pub block: bool,
    /// 1-based line where the scorer starts in the file.
    pub line: usize,
}

/// What grades a node's output.
#[derive(Debug, Clone, PartialEq)]
pub enum ScorerKind {
    /// An argv (templates) run like a `command` node, the output as JSON on
    /// its stdin; it prints `{"score", "reason"}` or a bare number.
    Command(Vec<String>),
    /// A model asked once; its answer must be `{"score", "reason"}`.
    Agent(ScorerAgent),
}

/// An agent scorer's settings (`scorers[i].agent`).
#[derive(Debug, Clone, PartialEq)]
pub struct ScorerAgent {
    /// The model's name in `models`.
    pub model: String,
    /// The system prompt (template).
    pub system: Option<String>,
    /// The request (template; `output` is the node's output).
    pub prompt: String,
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

/// What a resume does with an attempt that was running when the process
/// driving the run died. A crash is not the node's failure, so the default
/// runs the attempt again whatever its retry budget; work that must never
/// run twice says `fail`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OnInterrupt {
    /// Run the interrupted attempt again (`NodeFailed` with `willRetry`).
    #[default]
    Rerun,
    /// The interrupted attempt fails the node (`on_failure` decides what follows).
    Fail,
}

/// What happens to the sandbox root before a node's retry (`on_retry`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OnRetry {
    /// The retry starts from the files as the failed attempt left them.
    #[default]
    Keep,
    /// The root is restored to the snapshot taken before the failed
    /// attempt, so the retry starts from the same files it did.
    Revert,
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

impl Workflow {
    /// The text of a file the workflow refers to: the pinned one when the
    /// run pinned its files (an error when this one was not among them),
    /// else the file as it reads now.
    pub fn referenced_text(&self, path: &std::path::Path) -> Result<String, crate::WorkflowError> {
        match &self.pinned {
            Some(files) => files
                .get(path)
                .cloned()
                .ok_or_else(|| crate::WorkflowError {
                    problems: vec![crate::Problem {
                        file: path.to_path_buf(),
                        line: None,
                        column: None,
                        field: None,
                        message: "this file was not read when the run started, so the run does \
                              not use it (a run uses the files as they were when it began)"
                            .into(),
                        hint: None,
                    }],
                }),
            None => crate::parse::read_file(path),
        }
    }

    /// The child workflow at `path` (resolved, [`Workflow::resolve`]) as
    /// this run uses it ([`Workflow::referenced_text`]), sharing the run's
    /// pinned files.
    pub fn child(&self, path: &std::path::Path) -> Result<Workflow, crate::WorkflowError> {
        let text = self.referenced_text(path)?;
        let mut wf = crate::parse(&text, path)?;
        wf.pinned = self.pinned.clone();
        Ok(wf)
    }

    /// Where a child workflow's path (`workflow:`, `delegates`) points: an
    /// absolute path as it is, a relative one from this file's folder.
    pub fn resolve(&self, path: &str) -> PathBuf {
        let p = std::path::Path::new(path);
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.base_dir.join(p)
        }
    }

    /// Every child workflow path the file names, in file order, each once,
    /// with the line of the first node that names it: `workflow` nodes
    /// (inside groups too) and agents' `delegates`.
    pub fn child_paths(&self) -> Vec<(String, usize)> {
        fn walk(nodes: &[NodeSpec], out: &mut Vec<(String, usize)>) {
            for n in nodes {
                out.extend(
                    n.kind
                        .child_workflows()
                        .into_iter()
                        .map(|p| (p.to_string(), n.line)),
                );
                if let Some(body) = n.kind.children() {
                    walk(body, out);
                }
            }
        }
        let mut out = Vec::new();
        walk(&self.nodes, &mut out);
        let mut seen = std::collections::HashSet::new();
        out.retain(|(p, _)| seen.insert(p.clone()));
        out
    }

    /// Checks a run input against the workflow's JSON Schema, and that it nests at most
    /// [`crate::limits::MAX_VALUE_DEPTH`] deep.
    ///
    /// A workflow without a schema accepts any input that is not too deep. The schema was checked when the file was
    /// parsed, so compiling it here cannot fail in practice; if it does, that is reported as a
    /// violation at the root rather than a panic.
    pub fn validate_input(&self, input: &serde_json::Value) -> Result<(), InputError> {
        // Whatever the schema, the input is written to the log, which must stay readable.
        if let Err(e) = crate::limits::check_depth(input) {
            return Err(InputError {
                violations: vec![InputViolation {
                    pointer: e.pointer.clone(),
                    message: e.to_string(),
                }],
            });
        }
        let Some(schema) = &self.input_schema else {
            return Ok(());
        };
        let validator = match jsonschema::validator_for(schema) {
            Ok(v) => v,
            Err(e) => {
                return Err(InputError {
                    violations: vec![InputViolation {
                        pointer: String::new(),
                        message: format!("the workflow's input schema is invalid: {e}"),
                    }],
                })
            }
        };
        let violations: Vec<InputViolation> = validator
            .iter_errors(input)
            .map(|e| InputViolation {
                pointer: e.instance_path().to_string(),
                message: e.to_string(),
            })
            .collect();
        if violations.is_empty() {
            Ok(())
        } else {
            Err(InputError { violations })
        }
    }

    /// A Mermaid `flowchart TD` of the workflow: groups as subgraphs, edges from `needs`.
    ///
    /// Mermaid ids are derived from node paths (`review.fix` becomes `review__fix`) because
    /// dots are not allowed in them; labels keep the real path and kind.
    pub fn mermaid(&self) -> String {
        let mut out = String::from("flowchart TD\n");
        mermaid_group(&mut out, &self.nodes, "", 1);
        out
    }
}

fn mermaid_id(path: &str) -> String {
    path.replace('.', "__")
}

fn mermaid_label(text: &str) -> String {
    // Quotes would end the label early; Mermaid reads `#quot;` as a double quote.
    text.replace('"', "#quot;")
}

fn mermaid_group(out: &mut String, nodes: &[NodeSpec], prefix: &str, depth: usize) {
    let indent = "    ".repeat(depth);
    for n in nodes {
        let path = format!("{prefix}{}", n.id);
        let id = mermaid_id(&path);
        match n.kind.group() {
            Some(group) => {
                let children = group.nodes();
                let extra = match group {
                    Group::Loop { max_iterations, .. } => {
                        format!(", at most {max_iterations} passes")
                    }
                    Group::ForEach { .. } => String::new(),
                };
                out.push_str(&format!(
                    "{indent}subgraph {id}[\"{}{}\"]\n",
                    mermaid_label(&format!("{} ({})", n.id, n.kind.name())),
                    extra
                ));
                mermaid_group(out, children, &format!("{path}."), depth + 1);
                out.push_str(&format!("{indent}end\n"));
            }
            None => {
                let shape = n.kind.def().mermaid;
                out.push_str(&format!(
                    "{indent}{id}{}\"{}\"{}\n",
                    shape.0,
                    mermaid_label(&format!("{} ({})", n.id, n.kind.name())),
                    shape.1
                ));
            }
        }
    }
    // Looked up per edge: a list of 100,000 nodes has few switches.
    let switches: std::collections::HashMap<&str, &SwitchSpec> = nodes
        .iter()
        .filter_map(|s| match &s.kind {
            NodeKind::Switch(sw) => Some((s.id.as_str(), &**sw)),
            _ => None,
        })
        .collect();
    for n in nodes {
        let id = mermaid_id(&format!("{prefix}{}", n.id));
        for need in &n.needs {
            let from = mermaid_id(&format!("{prefix}{need}"));
            // A switch's edge says which cases take it; a handler's is
            // dotted and says when it runs.
            let mut labels: Vec<&str> = Vec::new();
            if let Some(sw) = switches.get(need.as_str()) {
                labels.extend(
                    sw.cases
                        .iter()
                        .filter(|(_, ids)| ids.contains(&n.id))
                        .map(|(label, _)| label.as_str()),
                );
                if sw.default.as_ref().is_some_and(|ids| ids.contains(&n.id)) {
                    labels.push("default");
                }
            }
            let handler = n.handler.then_some(n.if_.as_deref()).flatten();
            if let Some(cond) = handler {
                labels.push(cond);
            }
            let arrow = if handler.is_some() { "-.->" } else { "-->" };
            if labels.is_empty() {
                out.push_str(&format!("{indent}{from} {arrow} {id}\n"));
            } else {
                let label = mermaid_label(&labels.join(", "));
                out.push_str(&format!("{indent}{from} {arrow}|\"{label}\"| {id}\n"));
            }
        }
    }
}
