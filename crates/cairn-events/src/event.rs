//! The event envelope and the catalog of event kinds.
//!
//! The JSON form is fixed by the event contract: `type`, `runId`, `seq`,
//! `timestampMs`, then the scope fields (`nodeId`, `iteration`, `attempt`,
//! `chapter`), then the kind's own fields. Absent optional fields are omitted.

use serde::de::Error as _;
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};
use serde_with::skip_serializing_none;

use crate::ids::{NodePath, RunId, Seq};

/// Where a forked run's log was copied from (`RunStarted.forkedFrom`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ForkedFrom {
    /// The run forked.
    pub run_id: RunId,
    /// The last of its events the fork's log copies.
    pub seq: u64,
}

/// What started a run that no person or client started by hand
/// (`RunStarted.trigger`): a schedule's due time or a webhook's delivery.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Trigger {
    /// A schedule or a webhook.
    pub kind: TriggerKind,
    /// The schedule's or the hook's name.
    pub name: String,
    /// The due time a schedule fired for (Unix ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub due_ms: Option<i64>,
    /// The delivery's idempotency key, as the sender gave it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery_id: Option<String>,
}

/// What kind of trigger started a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TriggerKind {
    /// A schedule of `cairn serve`.
    Schedule,
    /// A delivery to `POST /v1/hooks/{name}`.
    Webhook,
}

/// The run a replay takes its answers from (`RunStarted.replayOf`,
/// `cairn replay`): the model's answers to requests the original made, the
/// people's answers to questions it asked, and with `tools: recorded` its
/// tools' results.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplayOf {
    /// The original run.
    pub run_id: RunId,
    /// A request or question the original never made goes to the model or
    /// the person, instead of failing its node (`replay_diverged`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub live: bool,
    /// Whether tools and commands run, or answer as they did.
    #[serde(default, skip_serializing_if = "ReplayTools::is_real")]
    pub tools: ReplayTools,
}

/// How a replay's tools and commands answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReplayTools {
    /// They run, in the replay's own copy of the root.
    #[default]
    Real,
    /// They answer with the original's results, and never run.
    Recorded,
}

impl ReplayTools {
    /// The default, which the log leaves out.
    pub fn is_real(&self) -> bool {
        *self == ReplayTools::Real
    }
}

/// What a step that begins a conversation was asked
/// (`AgentStepStarted.prompt`): with the log's answers and the tools'
/// results, every later request of the conversation follows from it, so a
/// replay can show how a request of its own differs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StepPrompt {
    /// The system prompt, as rendered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    /// The first user message, as rendered.
    pub user: String,
    /// The tools offered: each name, with the hash of its description and
    /// parameters.
    #[serde(default)]
    pub tools: Vec<ToolDigest>,
}

/// A tool as a request offered it, in brief.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolDigest {
    /// Its name.
    pub name: String,
    /// SHA-256 (hex) of its description and parameters.
    pub hash: String,
}

/// One entry of a run's log.
///
/// ```
/// use cairn_events::{Event, EventKind, RunId, Scope};
/// let ev = Event {
///     run_id: RunId::parse("r1").unwrap(),
///     seq: cairn_events::Seq(1),
///     timestamp_ms: 0,
///     scope: Scope::node("a", 0).with_attempt(1),
///     kind: EventKind::NodeStarted { snapshot: None },
/// };
/// let json = ev.to_json();
/// assert!(json.starts_with(r#"{"type":"NodeStarted","runId":"r1","seq":1"#));
/// assert_eq!(cairn_events::Event::from_json(&json).unwrap(), ev);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// The run whose log holds it.
    pub run_id: RunId,
    /// Its place in that log: 1, 2, 3, … with no gaps.
    pub seq: Seq,
    /// When it was appended (Unix ms; never earlier than the event before).
    pub timestamp_ms: i64,
    /// The node, pass and attempt it belongs to (empty for run events).
    pub scope: Scope,
    /// What happened, with the fields of its type.
    pub kind: EventKind,
}

/// Which node, pass and attempt an event belongs to. Run-scoped events leave
/// every field empty.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Scope {
    pub node_id: Option<NodePath>,
    pub iteration: Option<u32>,
    pub attempt: Option<u32>,
    pub chapter: Option<String>,
}

impl Scope {
    /// The scope of a run-level event.
    pub fn run() -> Self {
        Scope::default()
    }

    /// The scope of a node-level event.
    pub fn node(node_id: impl Into<NodePath>, iteration: u32) -> Self {
        Scope {
            node_id: Some(node_id.into()),
            iteration: Some(iteration),
            attempt: None,
            chapter: None,
        }
    }

    /// The same scope narrowed to one attempt.
    pub fn with_attempt(mut self, attempt: u32) -> Self {
        self.attempt = Some(attempt);
        self
    }

    /// The same scope tagged with a stage name.
    pub fn with_chapter(mut self, chapter: Option<String>) -> Self {
        self.chapter = chapter;
        self
    }
}

/// The error object carried by failure events: `{kind, message, details?}`.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorInfo {
    pub kind: String,
    pub message: String,
    #[serde(default)]
    pub details: Option<Value>,
}

impl ErrorInfo {
    /// An error with a kind and a message and no details.
    pub fn new(kind: impl Into<String>, message: impl Into<String>) -> Self {
        ErrorInfo {
            kind: kind.into(),
            message: message.into(),
            details: None,
        }
    }

    /// The same error with details attached.
    pub fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }
}

/// A run's status as `RunStatusChanged` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RunStatus {
    Running,
    WaitingApproval,
    WaitingInput,
    Finished,
    Failed,
    Cancelled,
}

impl RunStatus {
    /// The status as written in events and shown to people.
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Running => "running",
            RunStatus::WaitingApproval => "waiting-approval",
            RunStatus::WaitingInput => "waiting-input",
            RunStatus::Finished => "finished",
            RunStatus::Failed => "failed",
            RunStatus::Cancelled => "cancelled",
        }
    }

    /// Parses the form [`RunStatus::as_str`] writes.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "running" => RunStatus::Running,
            "waiting-approval" => RunStatus::WaitingApproval,
            "waiting-input" => RunStatus::WaitingInput,
            "finished" => RunStatus::Finished,
            "failed" => RunStatus::Failed,
            "cancelled" => RunStatus::Cancelled,
            _ => return None,
        })
    }

    /// Finished, failed and cancelled runs emit nothing more until resumed.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            RunStatus::Finished | RunStatus::Failed | RunStatus::Cancelled
        )
    }
}

/// How a cancel is carried out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CancelMechanism {
    Immediate,
    Graceful,
}

/// Which stream a piece of node output came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OutputStream {
    Stdout,
    Stderr,
    Text,
    Reasoning,
}

/// Counts of how nodes ended, for `RunSummary`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeCounts {
    pub finished: u64,
    pub failed: u64,
    pub skipped: u64,
    pub cancelled: u64,
}

/// Token totals, for `RunSummary`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenTotals {
    pub input: u64,
    pub output: u64,
    pub cache_read: u64,
    pub cache_write: u64,
    pub reasoning: u64,
}

/// One node pass's duration, for `RunSummary`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeTiming {
    pub node_id: String,
    pub iteration: u32,
    pub duration_ms: u64,
}

/// Success or error of one tool call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ToolStatus {
    Success,
    Error,
}

/// Whether a network access went through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NetworkAction {
    Allowed,
    Blocked,
}

/// A diagnostic's severity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    Debug,
    Info,
    Warn,
    Error,
}

/// Defines [`EventKind`] and, from the same list of variants, [`EventType`]
/// and the mapping between them: the catalog is written once, so the two
/// cannot drift apart.
macro_rules! event_catalog {
    (
        $(#[$kind_meta:meta])*
        pub enum EventKind {
            $(
                $(#[$variant_meta:meta])*
                $variant:ident { $($fields:tt)* }
            ),* $(,)?
        }
    ) => {
        $(#[$kind_meta])*
        pub enum EventKind {
            $(
                $(#[$variant_meta])*
                $variant { $($fields)* }
            ),*
        }

        /// The type of an event without its fields: the JSON `type` string,
        /// as a value that can be copied, compared, hashed and matched.
        ///
        /// Generated with [`EventKind`] from one list, in catalog order.
        ///
        /// ```
        /// use cairn_events::{EventKind, EventType};
        /// let kind = EventKind::RunCancelled { reason: None };
        /// assert_eq!(kind.event_type(), EventType::RunCancelled);
        /// assert_eq!(EventType::RunCancelled.to_string(), "RunCancelled");
        /// assert_eq!("RunCancelled".parse::<EventType>().unwrap(), EventType::RunCancelled);
        /// assert!("Nope".parse::<EventType>().is_err());
        /// ```
        #[derive(
            Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
        )]
        pub enum EventType {
            $(
                #[doc = concat!("`", stringify!($variant), "`.")]
                $variant
            ),*
        }

        impl EventType {
            /// Every event type of the catalog, in catalog order.
            pub const ALL: &'static [EventType] = &[$(EventType::$variant),*];

            /// The type as written in JSON (`"RunStarted"`, ...).
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(EventType::$variant => stringify!($variant)),*
                }
            }
        }

        impl EventKind {
            /// The event's type without its fields.
            pub const fn event_type(&self) -> EventType {
                match self {
                    $(EventKind::$variant { .. } => EventType::$variant),*
                }
            }
        }

        /// Every event type name of the catalog, in catalog order: the text
        /// form of [`EventType::ALL`], for edges that list names.
        pub const EVENT_TYPES: &[&str] = &[$(stringify!($variant)),*];
    };
}

event_catalog! {
/// Every event type of the contract, with its own fields.
///
/// Adding an event type means adding a variant here: [`EventType`] gets it
/// too, and every fold of events (the reducer, the activity view, the
/// metrics, the contract checkers, the OTLP spans, the agent's history)
/// stops compiling until it says what the new event does there.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all_fields = "camelCase")]
pub enum EventKind {
    // Run lifecycle
    RunStarted {
        workflow: String,
        workflow_hash: String,
        #[serde(default)]
        input: Option<Value>,
        resumed: bool,
        #[serde(default)]
        parent_run_id: Option<RunId>,
        #[serde(default)]
        parent_node_id: Option<String>,
        depth: u32,
        /// The run and seq a fork copied its log from (`cairn fork`).
        #[serde(default)]
        forked_from: Option<ForkedFrom>,
        /// The schedule or webhook that started the run (boxed: most runs
        /// have none, and every event is as large as the largest kind).
        #[serde(default)]
        trigger: Option<Box<Trigger>>,
        /// The run a replay answers from (`cairn replay`).
        #[serde(default)]
        replay_of: Option<Box<ReplayOf>>,
    },
    RunStatusChanged {
        status: RunStatus,
    },
    RunCancelRequested {
        #[serde(default)]
        reason: Option<String>,
        #[serde(default)]
        requested_by: Option<String>,
        mechanism: CancelMechanism,
    },
    RunSummary {
        duration_ms: u64,
        nodes: NodeCounts,
        tokens: TokenTotals,
        #[serde(default)]
        cost_usd: Option<f64>,
        timings: Vec<NodeTiming>,
    },
    RunFinished {
        #[serde(default)]
        output: Option<Value>,
        duration_ms: u64,
    },
    RunFailed {
        error: ErrorInfo,
    },
    RunCancelled {
        #[serde(default)]
        reason: Option<String>,
    },

    // Plan
    FrameCommitted {
        frame_no: u64,
        xml_hash: String,
        mounted: u64,
    },
    LayerStarted {
        layer_index: u32,
        node_count: u64,
    },
    LayerFinished {
        layer_index: u32,
        duration_ms: u64,
        succeeded: u64,
        failed: u64,
        skipped: u64,
        /// Nodes cancelled (by a cancel, a failing run, or unmounted),
        /// counted apart from those skipped by a condition or a dependency.
        #[serde(default)]
        cancelled: u64,
    },
    EdgeTraversed {
        from: String,
        to: String,
        #[serde(default)]
        condition: Option<String>,
    },
    BranchResolved {
        chosen: String,
        candidates: Vec<String>,
    },
    ChapterStarted {
        chapter: String,
    },
    ChapterFinished {
        chapter: String,
        status: String,
    },

    // Node lifecycle
    NodePending {
        #[serde(default)]
        layer_index: Option<u32>,
    },
    NodeStarted {
        /// The workspace snapshot taken just before the attempt, for a
        /// node that can change files in the sandbox root.
        #[serde(default)]
        snapshot: Option<String>,
    },
    NodeHeartbeat {
        elapsed_ms: u64,
        #[serde(default)]
        timeout_ms: Option<u64>,
        #[serde(default)]
        percent_elapsed: Option<f64>,
    },
    NodeOutput {
        text: String,
        stream: OutputStream,
    },
    NodeFinished {
        duration_ms: u64,
        /// Shared with the run state that folds the event, instead of
        /// copied (a group's output holds every member's); small outputs
        /// are their JSON text.
        #[serde(default)]
        output: Option<crate::output::Output>,
        #[serde(default)]
        cached: Option<bool>,
        /// The workspace snapshot taken just after the attempt, for a node
        /// that can change files (a fork after it starts from these files).
        #[serde(default)]
        snapshot: Option<String>,
    },
    NodeFailed {
        error: ErrorInfo,
        will_retry: bool,
        /// As `NodeFinished`'s: the files the failed attempt left.
        #[serde(default)]
        snapshot: Option<String>,
    },
    NodeRetrying {
        delay_ms: u64,
    },
    NodeSkipped {
        reason: String,
    },
    NodeCancelled {
        #[serde(default)]
        reason: Option<String>,
    },
    NodeWaitingApproval {},
    NodeWaitingInput {
        request_id: String,
    },

    // People in the loop
    ApprovalRequested {
        #[serde(default)]
        message: Option<String>,
    },
    ApprovalGranted {
        #[serde(default)]
        decided_by: Option<String>,
        #[serde(default)]
        note: Option<String>,
    },
    ApprovalDenied {
        #[serde(default)]
        decided_by: Option<String>,
        #[serde(default)]
        note: Option<String>,
    },
    InputRequested {
        request_id: String,
        prompt: String,
        #[serde(default)]
        schema: Option<Value>,
    },
    InputReceived {
        request_id: String,
        /// The answer, as JSON.
        #[serde(default)]
        answer: Value,
        #[serde(default)]
        answered_by: Option<String>,
    },

    // Agents and tools
    AgentStepStarted {
        step: u32,
        /// The model asked.
        #[serde(default)]
        model: String,
        /// The workspace snapshot before this step's model call (steps
        /// after the first, of agents that can change files): the files
        /// the earlier steps' tool calls left, where a fork in the middle
        /// of the conversation starts from.
        #[serde(default)]
        snapshot: Option<String>,
        /// SHA-256 (hex) of the request in canonical form: what a replay
        /// matches a request of its own by.
        #[serde(default)]
        request_hash: Option<String>,
        /// On a step that begins a conversation: its prompts and tools.
        #[serde(default)]
        prompt: Option<Box<StepPrompt>>,
    },
    AgentStepFinished {
        step: u32,
        tool_calls: u32,
        /// Why the model stopped: `stop`, `tool_calls`, `max_tokens`, ...
        #[serde(default)]
        finish_reason: String,
        /// The model's whole answer: `text?`, `reasoning?`, `toolCalls`
        /// [{`id`, `name`, `args`}], and what the provider needs back.
        #[serde(default)]
        message: Value,
    },
    AgentGenerationRetried {
        step: u32,
        reason: String,
    },
    /// The conversation was made shorter before `step` was asked, so that
    /// it fits the model's context window.
    AgentContextCompacted {
        step: u32,
        /// `truncate-tool-results` or `summarize`.
        strategy: String,
        tokens_before: u64,
        tokens_after: u64,
        /// The summary that replaces the older turns (`summarize`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message: Option<String>,
    },
    /// A step waits for its share of a limit every agent on the model
    /// shares.
    AgentWaiting {
        step: u32,
        model: String,
        /// `concurrency`, `requests_per_minute` or `tokens_per_minute`.
        reason: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        wait_ms: Option<u64>,
    },
    AgentEvent {
        engine: String,
        event: Value,
    },
    TokenUsageReported {
        provider: String,
        model: String,
        input_tokens: u64,
        output_tokens: u64,
        #[serde(default)]
        cache_read_tokens: Option<u64>,
        #[serde(default)]
        cache_write_tokens: Option<u64>,
        #[serde(default)]
        reasoning_tokens: Option<u64>,
        #[serde(default)]
        cost_usd: Option<f64>,
    },
    ToolCallStarted {
        tool_name: String,
        tool_seq: u32,
        idempotency_key: String,
        side_effect: bool,
    },
    ToolCallFinished {
        tool_name: String,
        tool_seq: u32,
        status: ToolStatus,
        duration_ms: u64,
        #[serde(default)]
        error: Option<ErrorInfo>,
    },
    DelegationStarted {
        child_run_id: RunId,
        agent: String,
        workflow: String,
    },
    DelegationFinished {
        child_run_id: RunId,
        status: String,
    },

    // Runtime
    McpServerStarting {
        server: String,
        command: String,
        args: Vec<String>,
    },
    McpServerConnected {
        server: String,
        tool_count: u32,
        start_ms: u64,
    },
    McpServerStderr {
        server: String,
        message: String,
    },
    McpServerDisconnected {
        server: String,
        #[serde(default)]
        reason: Option<String>,
    },
    NetworkAccess {
        action: NetworkAction,
        target: String,
        reason: String,
    },
    Diagnostic {
        level: Level,
        source: String,
        message: String,
    },

    // Workspace, reload, scoring
    RevertStarted {
        snapshot: String,
    },
    RevertFinished {
        snapshot: String,
        success: bool,
        #[serde(default)]
        error: Option<ErrorInfo>,
    },
    WorkflowReloadDetected {
        changed_files: Vec<String>,
    },
    WorkflowReloaded {
        generation: u64,
        changed_files: Vec<String>,
    },
    WorkflowReloadFailed {
        error: ErrorInfo,
        changed_files: Vec<String>,
    },
    WorkflowReloadUnsafe {
        reason: String,
        changed_files: Vec<String>,
    },
    ScorerStarted {
        scorer_id: String,
        scorer_name: String,
    },
    ScorerFinished {
        scorer_id: String,
        scorer_name: String,
        score: f64,
        #[serde(default)]
        reason: Option<String>,
    },
    ScorerFailed {
        scorer_id: String,
        scorer_name: String,
        error: ErrorInfo,
    },
    RunHijackRequested {
        node_id: String,
        #[serde(default)]
        requested_by: Option<String>,
    },
    RunHijacked {
        engine: String,
        /// `interactive`: the person took the conversation in a terminal.
        mode: String,
        /// Handed back to the agent (true), or ended by the person.
        resumed: bool,
    },
}
}

impl EventKind {
    /// The event's `type` as written in JSON.
    pub fn type_name(&self) -> &'static str {
        self.event_type().as_str()
    }
}

impl std::fmt::Display for EventType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is not an event type of the catalog.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not an event type of the contract")]
pub struct UnknownEventType(pub String);

impl std::str::FromStr for EventType {
    type Err = UnknownEventType;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        EventType::ALL
            .iter()
            .copied()
            .find(|t| t.as_str() == s)
            .ok_or_else(|| UnknownEventType(s.to_string()))
    }
}

impl EventKind {
    /// Lifecycle events must be durable before the engine acts on them;
    /// streaming events (output, heartbeats, raw agent events, diagnostics)
    /// may be committed in groups (contract, guarantee 2).
    pub fn is_lifecycle(&self) -> bool {
        !matches!(
            self,
            EventKind::NodeOutput { .. }
                | EventKind::NodeHeartbeat { .. }
                | EventKind::AgentEvent { .. }
                | EventKind::Diagnostic { .. }
        )
    }

    /// `RunFinished`, `RunFailed` and `RunCancelled` end a run.
    pub fn is_terminal(&self) -> bool {
        self.ended_as().is_some()
    }

    /// The workspace snapshot the event names, if any, and when it was
    /// taken. Every event type has its arm: a new one that names files
    /// must say so here, or reverts, forks and the store's pruning would
    /// not know its snapshot.
    pub fn snapshot(&self) -> Option<(&str, SnapshotAt)> {
        use EventKind as K;
        match self {
            K::NodeStarted { snapshot } | K::AgentStepStarted { snapshot, .. } => {
                Some((snapshot.as_deref()?, SnapshotAt::Before))
            }
            K::NodeFinished { snapshot, .. } | K::NodeFailed { snapshot, .. } => {
                Some((snapshot.as_deref()?, SnapshotAt::After))
            }
            K::RevertStarted { snapshot } | K::RevertFinished { snapshot, .. } => {
                Some((snapshot, SnapshotAt::Restored))
            }
            K::RunStarted { .. }
            | K::RunStatusChanged { .. }
            | K::RunCancelRequested { .. }
            | K::RunSummary { .. }
            | K::RunFinished { .. }
            | K::RunFailed { .. }
            | K::RunCancelled { .. }
            | K::FrameCommitted { .. }
            | K::LayerStarted { .. }
            | K::LayerFinished { .. }
            | K::EdgeTraversed { .. }
            | K::BranchResolved { .. }
            | K::ChapterStarted { .. }
            | K::ChapterFinished { .. }
            | K::NodePending { .. }
            | K::NodeHeartbeat { .. }
            | K::NodeOutput { .. }
            | K::NodeRetrying { .. }
            | K::NodeSkipped { .. }
            | K::NodeCancelled { .. }
            | K::NodeWaitingApproval {}
            | K::NodeWaitingInput { .. }
            | K::ApprovalRequested { .. }
            | K::ApprovalGranted { .. }
            | K::ApprovalDenied { .. }
            | K::InputRequested { .. }
            | K::InputReceived { .. }
            | K::AgentStepFinished { .. }
            | K::AgentGenerationRetried { .. }
            | K::AgentContextCompacted { .. }
            | K::AgentWaiting { .. }
            | K::AgentEvent { .. }
            | K::TokenUsageReported { .. }
            | K::ToolCallStarted { .. }
            | K::ToolCallFinished { .. }
            | K::DelegationStarted { .. }
            | K::DelegationFinished { .. }
            | K::McpServerStarting { .. }
            | K::McpServerConnected { .. }
            | K::McpServerStderr { .. }
            | K::McpServerDisconnected { .. }
            | K::NetworkAccess { .. }
            | K::Diagnostic { .. }
            | K::WorkflowReloadDetected { .. }
            | K::WorkflowReloaded { .. }
            | K::WorkflowReloadFailed { .. }
            | K::WorkflowReloadUnsafe { .. }
            | K::ScorerStarted { .. }
            | K::ScorerFinished { .. }
            | K::ScorerFailed { .. }
            | K::RunHijackRequested { .. }
            | K::RunHijacked { .. } => None,
        }
    }

    /// The status a terminal event ends its run with; `None` for every
    /// other event.
    pub fn ended_as(&self) -> Option<RunStatus> {
        match self {
            EventKind::RunFinished { .. } => Some(RunStatus::Finished),
            EventKind::RunFailed { .. } => Some(RunStatus::Failed),
            EventKind::RunCancelled { .. } => Some(RunStatus::Cancelled),
            _ => None,
        }
    }
}

/// When the workspace snapshot an event names was taken
/// ([`EventKind::snapshot`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotAt {
    /// Just before the work the event begins: an attempt's start, an
    /// agent's step (the files the earlier steps left).
    Before,
    /// Just after the work the event ends: an attempt's end.
    After,
    /// The snapshot a revert restores.
    Restored,
}

impl SnapshotAt {
    /// Every event type that can name a snapshot, for reading only those.
    pub const EVENT_TYPES: [EventType; 6] = [
        EventType::NodeStarted,
        EventType::AgentStepStarted,
        EventType::NodeFinished,
        EventType::NodeFailed,
        EventType::RevertStarted,
        EventType::RevertFinished,
    ];
}

/// The deepest event JSON that [`Event::from_json`] reads, payload included.
///
/// serde_json stops at 128 levels, but a group's output holds its members'
/// outputs (one level per `loop`, two per `for_each`), so the `NodeFinished`
/// of a group at the workflow's group limit (200) around values at the value
/// limit (64) nests up to about 470 deep. Reading recurses, about 1 KB of
/// stack per level in a release build and 3 KB in a debug one: 512 levels fit
/// in a thread's default 2 MiB stack.
pub const MAX_EVENT_DEPTH: usize = 512;

/// [`Event::from_json`] past serde_json's recursion limit, once the text's
/// depth is known to be within [`MAX_EVENT_DEPTH`].
fn from_deep_json(s: &str) -> Result<Event, DecodeError> {
    let depth = text_depth(s);
    if depth > MAX_EVENT_DEPTH {
        return Err(DecodeError(serde::de::Error::custom(format!(
            "the event nests {depth} levels deep, more than the {MAX_EVENT_DEPTH} read"
        ))));
    }
    let mut de = serde_json::Deserializer::from_str(s);
    de.disable_recursion_limit();
    let ev = Event::deserialize(&mut de)?;
    de.end()?;
    Ok(ev)
}

/// How deep arrays and objects nest in JSON text (strings skipped), without
/// parsing it.
pub(crate) fn text_depth(s: &str) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    let (mut in_string, mut escaped) = (false, false);
    for b in s.bytes() {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// Why a stored line could not be read back as an event.
#[derive(Debug, thiserror::Error)]
#[error("invalid event JSON: {0}")]
pub struct DecodeError(#[from] serde_json::Error);

impl Event {
    /// The event's JSON line, in the contract's field order. This is the
    /// exact text the store keeps and the NDJSON mirror repeats.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("events always serialize")
    }

    /// Reads an event from the JSON that [`Event::to_json`] writes, nested
    /// up to [`MAX_EVENT_DEPTH`] deep.
    pub fn from_json(s: &str) -> Result<Event, DecodeError> {
        match serde_json::from_str(s) {
            Err(e) if e.to_string().starts_with("recursion limit exceeded") => from_deep_json(s),
            r => Ok(r?),
        }
    }

    /// `nodeId` and `iteration` together, for node-scoped events.
    pub fn node_key(&self) -> Option<(&str, u32)> {
        Some((
            self.scope.node_id.as_deref()?,
            self.scope.iteration.unwrap_or(0),
        ))
    }

    /// The event's `type`, as text.
    pub fn type_name(&self) -> &'static str {
        self.kind.type_name()
    }

    /// The event's type.
    pub fn event_type(&self) -> EventType {
        self.kind.event_type()
    }
}

impl Serialize for Event {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(None)?;
        map.serialize_entry("type", self.kind.type_name())?;
        map.serialize_entry("runId", &self.run_id)?;
        map.serialize_entry("seq", &self.seq)?;
        map.serialize_entry("timestampMs", &self.timestamp_ms)?;
        if let Some(n) = &self.scope.node_id {
            map.serialize_entry("nodeId", n)?;
        }
        if let Some(i) = &self.scope.iteration {
            map.serialize_entry("iteration", i)?;
        }
        if let Some(a) = &self.scope.attempt {
            map.serialize_entry("attempt", a)?;
        }
        if let Some(c) = &self.scope.chapter {
            map.serialize_entry("chapter", c)?;
        }
        // The kind's own fields follow in the same map, written straight
        // through: no JSON value of the payload is built first (a group's
        // output can be megabytes of members' outputs).
        self.kind.serialize(flat::Fields(&mut map))?;
        map.end()
    }
}

/// Serializes an [`EventKind`] as entries of an enclosing map.
mod flat {
    use serde::ser::{self, Impossible, Serialize, SerializeMap, SerializeStruct};

    /// The enclosing map. The kind's `type` tag is left out: the event
    /// writes it first.
    pub(super) struct Fields<'a, M>(pub(super) &'a mut M);

    fn not_a_struct<E: ser::Error>() -> E {
        E::custom("event kind did not serialize to an object")
    }

    impl<'a, M: SerializeMap> SerializeStruct for Fields<'a, M> {
        type Ok = ();
        type Error = M::Error;
        fn serialize_field<T: Serialize + ?Sized>(
            &mut self,
            key: &'static str,
            value: &T,
        ) -> Result<(), M::Error> {
            if key == "type" {
                return Ok(());
            }
            self.0.serialize_entry(key, value)
        }
        fn end(self) -> Result<(), M::Error> {
            Ok(())
        }
    }

    macro_rules! refuse {
        ($($name:ident($($arg:ty),*);)*) => {
            $(fn $name(self, $(_: $arg),*) -> Result<(), M::Error> {
                Err(not_a_struct())
            })*
        };
    }

    impl<'a, M: SerializeMap> ser::Serializer for Fields<'a, M> {
        type Ok = ();
        type Error = M::Error;
        type SerializeSeq = Impossible<(), M::Error>;
        type SerializeTuple = Impossible<(), M::Error>;
        type SerializeTupleStruct = Impossible<(), M::Error>;
        type SerializeTupleVariant = Impossible<(), M::Error>;
        type SerializeMap = Impossible<(), M::Error>;
        type SerializeStruct = Self;
        type SerializeStructVariant = Impossible<(), M::Error>;

        fn serialize_struct(self, _: &'static str, _: usize) -> Result<Self, M::Error> {
            Ok(self)
        }

        refuse! {
            serialize_bool(bool);
            serialize_i8(i8);
            serialize_i16(i16);
            serialize_i32(i32);
            serialize_i64(i64);
            serialize_u8(u8);
            serialize_u16(u16);
            serialize_u32(u32);
            serialize_u64(u64);
            serialize_f32(f32);
            serialize_f64(f64);
            serialize_char(char);
            serialize_str(&str);
            serialize_bytes(&[u8]);
            serialize_none();
            serialize_unit();
            serialize_unit_struct(&'static str);
            serialize_unit_variant(&'static str, u32, &'static str);
        }

        fn serialize_some<T: Serialize + ?Sized>(self, _: &T) -> Result<(), M::Error> {
            Err(not_a_struct())
        }
        fn serialize_newtype_struct<T: Serialize + ?Sized>(
            self,
            _: &'static str,
            value: &T,
        ) -> Result<(), M::Error> {
            value.serialize(self)
        }
        fn serialize_newtype_variant<T: Serialize + ?Sized>(
            self,
            _: &'static str,
            _: u32,
            _: &'static str,
            _: &T,
        ) -> Result<(), M::Error> {
            Err(not_a_struct())
        }
        fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, M::Error> {
            Err(not_a_struct())
        }
        fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, M::Error> {
            Err(not_a_struct())
        }
        fn serialize_tuple_struct(
            self,
            _: &'static str,
            _: usize,
        ) -> Result<Self::SerializeTupleStruct, M::Error> {
            Err(not_a_struct())
        }
        fn serialize_tuple_variant(
            self,
            _: &'static str,
            _: u32,
            _: &'static str,
            _: usize,
        ) -> Result<Self::SerializeTupleVariant, M::Error> {
            Err(not_a_struct())
        }
        fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, M::Error> {
            Err(not_a_struct())
        }
        fn serialize_struct_variant(
            self,
            _: &'static str,
            _: u32,
            _: &'static str,
            _: usize,
        ) -> Result<Self::SerializeStructVariant, M::Error> {
            Err(not_a_struct())
        }
    }
}

impl<'de> Deserialize<'de> for Event {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut map = Map::<String, Value>::deserialize(d)?;
        fn take<T: serde::de::DeserializeOwned, E: serde::de::Error>(
            map: &mut Map<String, Value>,
            key: &str,
        ) -> Result<Option<T>, E> {
            match map.shift_remove(key) {
                None | Some(Value::Null) => Ok(None),
                Some(v) => serde_json::from_value(v)
                    .map(Some)
                    .map_err(|e| E::custom(format!("field `{key}`: {e}"))),
            }
        }
        let run_id: RunId = take::<_, D::Error>(&mut map, "runId")?
            .ok_or_else(|| D::Error::missing_field("runId"))?;
        let seq: Seq =
            take::<_, D::Error>(&mut map, "seq")?.ok_or_else(|| D::Error::missing_field("seq"))?;
        let timestamp_ms: i64 = take::<_, D::Error>(&mut map, "timestampMs")?
            .ok_or_else(|| D::Error::missing_field("timestampMs"))?;
        let ty = map
            .get("type")
            .and_then(Value::as_str)
            .and_then(|t| t.parse::<EventType>().ok());
        let scope = Scope {
            // `RunHijackRequested` is a run's event that names a node in its
            // own `nodeId` field.
            node_id: match ty {
                Some(EventType::RunHijackRequested) => None,
                _ => take::<_, D::Error>(&mut map, "nodeId")?,
            },
            iteration: take::<_, D::Error>(&mut map, "iteration")?,
            attempt: take::<_, D::Error>(&mut map, "attempt")?,
            // `ChapterStarted`/`ChapterFinished` carry `chapter` as their own
            // field; everywhere else it is the scope's stage name.
            chapter: match ty {
                Some(EventType::ChapterStarted | EventType::ChapterFinished) => None,
                _ => take::<_, D::Error>(&mut map, "chapter")?,
            },
        };
        let kind = EventKind::deserialize(Value::Object(map)).map_err(D::Error::custom)?;
        Ok(Event {
            run_id,
            seq,
            timestamp_ms,
            scope,
            kind,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A `NodeFinished` whose output nests `levels` objects deep.
    fn deep_event(levels: usize) -> String {
        let mut output = json!(1);
        for _ in 0..levels {
            output = json!({ "a": output });
        }
        let ev = Event {
            run_id: RunId::parse("r").unwrap(),
            seq: crate::Seq(1),
            timestamp_ms: 0,
            scope: Scope::node("g", 0).with_attempt(1),
            kind: EventKind::NodeFinished {
                duration_ms: 0,
                output: Some(output.into()),
                cached: None,
                snapshot: None,
            },
        };
        ev.to_json()
    }

    #[test]
    fn events_past_serde_json_s_limit_read_back_up_to_the_bound() {
        // On a thread with the default stack, as the runtime's.
        std::thread::spawn(|| {
            let text = deep_event(MAX_EVENT_DEPTH - 1);
            assert_eq!(text_depth(&text), MAX_EVENT_DEPTH);
            let ev = Event::from_json(&text).expect("reads back");
            assert_eq!(ev.to_json(), text);
            let e = Event::from_json(&deep_event(MAX_EVENT_DEPTH)).unwrap_err();
            assert!(e.to_string().contains("more than the 512 read"), "{e}");
        })
        .join()
        .expect("no stack overflow");
        assert_eq!(text_depth(r#"{"a":"[[{\"}","b":[1,{}]}"#), 3);
    }

    #[test]
    fn field_order_follows_the_contract() {
        let ev = Event {
            run_id: RunId::parse("r").unwrap(),
            seq: crate::Seq(7),
            timestamp_ms: 42,
            scope: Scope::node("build", 2)
                .with_attempt(1)
                .with_chapter(Some("ship".into())),
            kind: EventKind::NodeFailed {
                error: ErrorInfo::new("exit", "exit code 3"),
                will_retry: true,
                snapshot: None,
            },
        };
        assert_eq!(
            ev.to_json(),
            r#"{"type":"NodeFailed","runId":"r","seq":7,"timestampMs":42,"nodeId":"build","iteration":2,"attempt":1,"chapter":"ship","error":{"kind":"exit","message":"exit code 3"},"willRetry":true}"#
        );
        assert_eq!(Event::from_json(&ev.to_json()).unwrap(), ev);
    }

    /// The kind's fields are written straight into the event's map: the
    /// same text as building the kind's JSON object first and copying its
    /// entries after the envelope's.
    #[test]
    fn kind_fields_are_written_as_through_a_json_object() {
        let kinds = vec![
            EventKind::NodeStarted { snapshot: None },
            EventKind::RunCancelled { reason: None },
            EventKind::RunCancelled {
                reason: Some("by \"ops\"".into()),
            },
            EventKind::NodeFinished {
                duration_ms: 3,
                output: Some(json!({"z": [1, {"a": null}], "b": "x"}).into()),
                cached: Some(true),
                snapshot: None,
            },
            EventKind::NodeHeartbeat {
                elapsed_ms: 5,
                timeout_ms: None,
                percent_elapsed: Some(0.5),
            },
            EventKind::FrameCommitted {
                frame_no: 1,
                xml_hash: "h".into(),
                mounted: 2,
            },
        ];
        for kind in kinds {
            let ev = Event {
                run_id: RunId::parse("r").unwrap(),
                seq: crate::Seq(2),
                timestamp_ms: 9,
                scope: Scope::node("n", 0).with_attempt(1),
                kind,
            };
            let mut want = serde_json::Map::new();
            want.insert("type".into(), json!(ev.kind.type_name()));
            want.insert("runId".into(), json!("r"));
            want.insert("seq".into(), json!(2));
            want.insert("timestampMs".into(), json!(9));
            want.insert("nodeId".into(), json!("n"));
            want.insert("iteration".into(), json!(0));
            want.insert("attempt".into(), json!(1));
            let Value::Object(fields) = serde_json::to_value(&ev.kind).unwrap() else {
                panic!("not an object");
            };
            for (k, v) in fields {
                if k != "type" {
                    want.insert(k, v);
                }
            }
            assert_eq!(ev.to_json(), Value::Object(want).to_string());
            assert_eq!(Event::from_json(&ev.to_json()).unwrap(), ev);
        }
    }

    #[test]
    fn absent_optionals_are_omitted() {
        let ev = Event {
            run_id: RunId::parse("r").unwrap(),
            seq: crate::Seq(1),
            timestamp_ms: 1,
            scope: Scope::run(),
            kind: EventKind::RunStarted {
                workflow: "w".into(),
                workflow_hash: "h".into(),
                input: None,
                resumed: false,
                parent_run_id: None,
                parent_node_id: None,
                depth: 0,
                forked_from: None,
                trigger: None,
                replay_of: None,
            },
        };
        let v: Value = serde_json::from_str(&ev.to_json()).unwrap();
        assert_eq!(
            v,
            json!({"type":"RunStarted","runId":"r","seq":1,"timestampMs":1,
                   "workflow":"w","workflowHash":"h","resumed":false,"depth":0})
        );
    }

    #[test]
    fn every_type_name_is_listed_once() {
        let mut names = EVENT_TYPES.to_vec();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), EVENT_TYPES.len());
    }

    /// The type enum and the names agree, in catalog order, and read back.
    #[test]
    fn event_types_are_the_names_in_catalog_order() {
        let names: Vec<&str> = EventType::ALL.iter().map(|t| t.as_str()).collect();
        assert_eq!(names, EVENT_TYPES);
        assert!(EventType::ALL.windows(2).all(|w| w[0] < w[1]));
        for &t in EventType::ALL {
            assert_eq!(t.to_string().parse::<EventType>(), Ok(t));
            assert_eq!(
                serde_json::to_value(t).unwrap(),
                Value::String(t.as_str().into())
            );
            let back: EventType = serde_json::from_value(json!(t.as_str())).unwrap();
            assert_eq!(back, t);
        }
        let e = "runStarted".parse::<EventType>().unwrap_err();
        assert_eq!(
            e.to_string(),
            "`runStarted` is not an event type of the contract"
        );
        assert!(serde_json::from_value::<EventType>(json!("Nope")).is_err());
    }

    /// An event's type is the one its JSON says.
    #[test]
    fn an_events_type_is_its_json_type() {
        let ev = Event {
            run_id: RunId::parse("r").unwrap(),
            seq: crate::Seq(1),
            timestamp_ms: 0,
            scope: Scope::run(),
            kind: EventKind::RunCancelled { reason: None },
        };
        let v: Value = serde_json::from_str(&ev.to_json()).unwrap();
        assert_eq!(v["type"], json!(ev.kind.event_type()));
        assert_eq!(ev.kind.event_type(), EventType::RunCancelled);
    }

    /// The types read for snapshots are those whose events name one.
    #[test]
    fn snapshot_types_are_the_events_that_name_one() {
        let s = || Some("s".to_string());
        let named = [
            EventKind::NodeStarted { snapshot: s() },
            EventKind::AgentStepStarted {
                step: 2,
                model: "m".into(),
                snapshot: s(),
                request_hash: None,
                prompt: None,
            },
            EventKind::NodeFinished {
                duration_ms: 1,
                output: None,
                cached: None,
                snapshot: s(),
            },
            EventKind::NodeFailed {
                error: ErrorInfo::new("exit", "1"),
                will_retry: false,
                snapshot: s(),
            },
            EventKind::RevertStarted {
                snapshot: "s".into(),
            },
            EventKind::RevertFinished {
                snapshot: "s".into(),
                success: true,
                error: None,
            },
        ];
        let types: Vec<EventType> = named.iter().map(EventKind::event_type).collect();
        assert_eq!(types, SnapshotAt::EVENT_TYPES);
        assert!(named.iter().all(|k| k.snapshot().map(|s| s.0) == Some("s")));
        assert_eq!(
            EventKind::NodeStarted { snapshot: None }.snapshot(),
            None,
            "an attempt of a node that changes no files names none"
        );
    }

    #[test]
    fn chapter_events_keep_their_own_field() {
        let ev = Event {
            run_id: RunId::parse("r").unwrap(),
            seq: crate::Seq(3),
            timestamp_ms: 1,
            scope: Scope::run(),
            kind: EventKind::ChapterFinished {
                chapter: "ship".into(),
                status: "finished".into(),
            },
        };
        assert_eq!(Event::from_json(&ev.to_json()).unwrap(), ev);
    }

    #[test]
    fn unknown_type_is_an_error() {
        let err = Event::from_json(r#"{"type":"Nope","runId":"r","seq":1,"timestampMs":1}"#);
        assert!(err.is_err());
    }
}

#[cfg(test)]
mod hijack_tests {
    use super::*;

    #[test]
    fn a_hijack_request_names_its_node_in_its_own_field() {
        let ev = Event {
            run_id: RunId::parse("r").unwrap(),
            seq: Seq(3),
            timestamp_ms: 1,
            scope: Scope::run(),
            kind: EventKind::RunHijackRequested {
                node_id: "author".into(),
                requested_by: Some("ann".into()),
            },
        };
        let json = ev.to_json();
        assert_eq!(
            json,
            r#"{"type":"RunHijackRequested","runId":"r","seq":3,"timestampMs":1,"nodeId":"author","requestedBy":"ann"}"#
        );
        assert_eq!(Event::from_json(&json).unwrap(), ev);
    }
}
