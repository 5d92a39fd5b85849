//! The one fold from a run's log to its state (contract, guarantee 4).
//!
//! Every command, endpoint and page that shows a run, and the engine when it
//! resumes one, reads state through [`RunState::apply`]; nothing keeps a second
//! copy of the truth.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::Serialize;
use serde_json::Value;

use crate::event::{ErrorInfo, Event, EventKind, OutputStream, RunStatus, TokenTotals};
use crate::ids::{NodePath, RunId};
use crate::output::Output;

/// Where a node stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum NodeStatus {
    Pending,
    Running,
    Retrying,
    WaitingApproval,
    WaitingInput,
    Finished,
    Failed,
    Skipped,
    Cancelled,
}

impl NodeStatus {
    /// The status as shown to people and templates.
    pub fn as_str(self) -> &'static str {
        match self {
            NodeStatus::Pending => "pending",
            NodeStatus::Running => "running",
            NodeStatus::Retrying => "retrying",
            NodeStatus::WaitingApproval => "waiting-approval",
            NodeStatus::WaitingInput => "waiting-input",
            NodeStatus::Finished => "finished",
            NodeStatus::Failed => "failed",
            NodeStatus::Skipped => "skipped",
            NodeStatus::Cancelled => "cancelled",
        }
    }

    /// A node in one of these states will not run again in this run.
    pub fn is_done(self) -> bool {
        matches!(
            self,
            NodeStatus::Finished | NodeStatus::Failed | NodeStatus::Skipped | NodeStatus::Cancelled
        )
    }
}

/// Where one attempt of a node stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AttemptStatus {
    /// Started, not ended (or ended by a crash the log does not show).
    Running,
    /// Ended with an output.
    Finished,
    /// Ended with an error.
    Failed,
    /// Stopped by a cancel.
    Cancelled,
}

impl AttemptStatus {
    /// The status as shown to people and in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            AttemptStatus::Running => "running",
            AttemptStatus::Finished => "finished",
            AttemptStatus::Failed => "failed",
            AttemptStatus::Cancelled => "cancelled",
        }
    }
}

/// How one attempt of a node went. A run keeps one per attempt of every
/// node pass, so it is kept to 48 bytes (its status a byte, not a string).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AttemptState {
    pub attempt: u32,
    pub started_ms: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ended_ms: Option<i64>,
    /// `running`, `finished`, `failed` or `cancelled`.
    pub status: AttemptStatus,
    /// Boxed: most attempts have none, and a run keeps every attempt.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<Box<ErrorInfo>>,
    pub tool_calls: u32,
}

/// A person's decision on an approval gate.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Decision {
    pub approved: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// The rarely set parts of a [`NodeState`].
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeNotes {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorInfo>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub approval_message: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decision: Option<Decision>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input_request_id: Option<String>,
    /// An agent node's progress.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentProgress>,
    /// Its scorers that started, in the order they started.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub scores: Vec<ScoreState>,
    /// The workspace snapshots taken before its attempts.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub snapshots: Vec<AttemptSnapshot>,
}

/// The workspace snapshot taken before one attempt (`NodeStarted.snapshot`).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AttemptSnapshot {
    /// The attempt.
    pub attempt: u32,
    /// The snapshot's id (a git tree in Cairn's snapshot repository).
    pub snapshot: String,
}

/// A revert the log started and has not ended: a process that stopped
/// while it restored the files. Whoever takes the run up next finishes it,
/// so the workspace ends as the snapshot has it, never half-way.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OpenRevert {
    /// The node whose attempt's snapshot is being restored.
    pub node_id: NodePath,
    /// Its pass.
    pub iteration: u32,
    /// The attempt.
    pub attempt: u32,
    /// The snapshot.
    pub snapshot: String,
}

/// One scorer of a node pass as the log tells it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ScoreState {
    /// The scorer's id in the workflow file.
    pub scorer_id: String,
    /// Its label for people.
    pub scorer_name: String,
    /// `running`, `finished` or `failed`.
    pub status: &'static str,
    /// The score, from 0 to 1, once it finished.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub score: Option<f64>,
    /// Why, when the scorer said.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Why it failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorInfo>,
}

impl ScoreState {
    /// Whether the scorer ended (finished or failed).
    pub fn is_done(&self) -> bool {
        self.status != "running"
    }
}

/// What the log tells of an agent node's work so far (every attempt).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentProgress {
    /// The latest step started.
    pub step: u32,
    /// The model it asks.
    pub model: String,
    /// Tool calls started.
    pub tool_calls: u32,
    /// Input tokens of its model calls.
    pub input_tokens: u64,
    /// Output tokens of its model calls.
    pub output_tokens: u64,
    /// What its model calls cost, where priced.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<f64>,
    /// The last line of text it streamed (at most 200 bytes).
    pub last_line: String,
}

/// Most bytes of an agent's last streamed line kept.
const LAST_LINE_MAX: usize = 200;

/// One node pass (`nodeId`, `iteration`) as the log tells it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeState {
    pub node_id: NodePath,
    pub iteration: u32,
    pub status: NodeStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chapter: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub layer_index: Option<u32>,
    /// The latest attempt number (0 before the first start).
    pub attempt: u32,
    pub attempts: Vec<AttemptState>,
    /// Compact when small; shared with the engine's template context
    /// instead of copied.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<Output>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// What few nodes have (an error, a reason, a gate's message and
    /// decision, an input request), in one box: a run of 100,000 nodes
    /// keeps a state for each. Serialized as fields of the node.
    #[serde(flatten)]
    pub notes: Option<Box<NodeNotes>>,
    pub first_seq: u64,
    /// A `NodeRetrying` announced the next attempt, which has not started yet.
    #[serde(skip)]
    pub retry_announced: bool,
}

impl NodeState {
    fn new(node_id: NodePath, iteration: u32, seq: u64) -> Self {
        NodeState {
            node_id,
            iteration,
            status: NodeStatus::Pending,
            chapter: None,
            layer_index: None,
            attempt: 0,
            attempts: Vec::new(),
            output: None,
            duration_ms: None,
            notes: None,
            first_seq: seq,
            retry_announced: false,
        }
    }

    /// Its error, when it failed (or is retrying after a failure).
    pub fn error(&self) -> Option<&ErrorInfo> {
        self.notes.as_ref()?.error.as_ref()
    }

    /// An agent node's progress, once it asked its model.
    pub fn agent(&self) -> Option<&AgentProgress> {
        self.notes.as_ref()?.agent.as_ref()
    }

    /// Its scorers that started (empty when it has none or none started).
    pub fn scores(&self) -> &[ScoreState] {
        self.notes.as_ref().map_or(&[], |n| &n.scores)
    }

    /// Why it was skipped or cancelled.
    pub fn reason(&self) -> Option<&str> {
        self.notes.as_ref()?.reason.as_deref()
    }

    /// An approval gate's message.
    pub fn approval_message(&self) -> Option<&str> {
        self.notes.as_ref()?.approval_message.as_deref()
    }

    /// An approval gate's decision.
    pub fn decision(&self) -> Option<&Decision> {
        self.notes.as_ref()?.decision.as_ref()
    }

    /// The input request it waits on.
    pub fn input_request_id(&self) -> Option<&str> {
        self.notes.as_ref()?.input_request_id.as_deref()
    }

    fn notes_mut(&mut self) -> &mut NodeNotes {
        self.notes.get_or_insert_with(Default::default)
    }

    /// The attempt that started but never ended, if the log stops inside one
    /// (a crash): a resume closes it as failed.
    pub fn open_attempt(&self) -> Option<u32> {
        self.attempts
            .last()
            .filter(|a| a.status == AttemptStatus::Running)
            .map(|a| a.attempt)
    }
}

/// A run's whole state, folded from its events.
///
/// ```
/// use cairn_events::{Event, EventKind, RunId, RunState, Scope, Seq};
/// let run = RunId::parse("r1").unwrap();
/// let mut state = RunState::new(run.clone());
/// state.apply(&Event { run_id: run, seq: Seq(1), timestamp_ms: 10,
///     scope: Scope::node("a", 0), kind: EventKind::NodePending { layer_index: Some(0) } });
/// assert_eq!(state.node("a", 0).unwrap().status.as_str(), "pending");
/// ```
///
/// No `Default`: a state always belongs to a run ([`RunState::new`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunState {
    pub run_id: RunId,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workflow: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workflow_hash: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<RunStatus>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_ms: Option<i64>,
    /// When the latest resume began (its `RunStarted`); absent for a run
    /// that was never resumed. With `started_ms`, when the current session
    /// of the run began ([`RunState::session_started_ms`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resumed_ms: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ended_ms: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorInfo>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cancel_requested: Option<String>,
    pub resumes: u32,
    pub last_seq: u64,
    pub frame_no: u64,
    pub mounted: u64,
    pub tokens: TokenTotals,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<f64>,
    pub tool_calls: u64,
    pub nodes: Vec<NodeState>,
    /// The questions asked of people (`ask` nodes, agents' `ask_user`), by
    /// request id, with their answers once given.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub questions: BTreeMap<String, Question>,
    /// The run that started this one as a child (`workflow` node, delegate).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent_run_id: Option<RunId>,
    /// The parent's node that started it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent_node_id: Option<String>,
    /// How many parents it has (0 for a run started by a person).
    pub depth: u32,
    /// The child runs this run started, in the order it started them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub children: Vec<ChildRun>,
    /// Layers with `LayerStarted` and no `LayerFinished` yet, with the
    /// start's timestamp: a resumed engine closes them.
    #[serde(skip)]
    pub open_layers: BTreeMap<u32, i64>,
    /// Chapters with `ChapterStarted` and no `ChapterFinished` yet.
    #[serde(skip)]
    pub open_chapters: BTreeSet<String>,
    /// The generation of the workflow the run uses: 0 as it started, then
    /// the `generation` of the latest `WorkflowReloaded` (a resume loads
    /// that generation's stored text).
    #[serde(skip_serializing_if = "generation_zero")]
    pub generation: u64,
    /// The hash of the current generation's text as the log records it:
    /// the latest `RunStarted`'s `workflowHash`, unless a reload came after
    /// it (its event does not carry the hash), so that a resume can check
    /// the stored text against the log whenever the log says.
    #[serde(skip)]
    pub generation_hash: Option<String>,
    /// The run and seq this run's log was copied from (`cairn fork`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forked_from: Option<crate::event::ForkedFrom>,
    /// The schedule or webhook that started the run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trigger: Option<crate::event::Trigger>,
    /// The run a replay takes its answers from (`cairn replay`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replay_of: Option<crate::event::ReplayOf>,
    /// Agent nodes a person asked to take over (`RunHijackRequested`) whose
    /// conversation has not been handed back or ended (`RunHijacked`).
    #[serde(skip_serializing_if = "BTreeSet::is_empty")]
    pub hijack_requested: BTreeSet<String>,
    /// A revert started and not finished (see [`OpenRevert`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub open_revert: Option<Box<OpenRevert>>,
    /// Where each node pass is in `nodes`.
    #[serde(skip)]
    index: NodeIndex,
}

/// Serde's test for leaving out the generation of a run never reloaded.
fn generation_zero(n: &u64) -> bool {
    *n == 0
}

/// A child run as its parent's log tells it (`DelegationStarted`, then
/// `DelegationFinished`).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ChildRun {
    /// The child's run id.
    pub run_id: RunId,
    /// The parent's node that started it.
    pub node_id: NodePath,
    /// That node's loop pass.
    pub iteration: u32,
    /// The delegate's name, or `workflow` for a `workflow` node.
    pub agent: String,
    /// The child's workflow file.
    pub workflow: String,
    /// How it ended (`finished`, `failed`, `cancelled`), once it has.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
}

/// A question asked of a person (`InputRequested`), and its answer
/// (`InputReceived`) once given.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Question {
    /// The node that asked.
    pub node_id: NodePath,
    /// Its loop pass.
    pub iteration: u32,
    /// The question.
    pub prompt: String,
    /// The JSON Schema an answer must match.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub schema: Option<Value>,
    /// The answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answer: Option<Value>,
    /// Who answered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answered_by: Option<String>,
}

/// Where each node pass of a run state is in its `nodes`, by path and
/// pass: a table of places hashed by the pass they point at, which holds no
/// copy of the keys. A map from keys to places took about 43 bytes per node
/// pass with its room, this about 7, and a run of 100,000 nodes keeps an
/// entry for every pass.
#[derive(Clone, Default)]
struct NodeIndex {
    table: hashbrown::HashTable<u32>,
    /// aHash, randomly keyed as std's SipHash is, but several times
    /// faster on long keys: paths run to hundreds of bytes inside nested
    /// groups, and the engine looks each node up several times.
    hasher: ahash::RandomState,
}

impl NodeIndex {
    fn hash(hasher: &ahash::RandomState, id: &str, iteration: u32) -> u64 {
        hasher.hash_one((id, iteration))
    }

    /// The place of pass `iteration` of `id` in `nodes`.
    fn get(&self, nodes: &[NodeState], id: &str, iteration: u32) -> Option<usize> {
        let h = Self::hash(&self.hasher, id, iteration);
        self.table
            .find(h, |&i| {
                let n = &nodes[i as usize];
                n.iteration == iteration && n.node_id.as_str() == id
            })
            .map(|&i| i as usize)
    }

    /// Indexes `nodes[i]`, a pass not indexed yet.
    fn insert(&mut self, nodes: &[NodeState], i: usize) {
        let n = &nodes[i];
        let hasher = &self.hasher;
        let h = Self::hash(hasher, n.node_id.as_str(), n.iteration);
        let place = u32::try_from(i).expect("fewer than 2^32 node passes");
        self.table
            .insert_unique(h, place, |&j| Self::rehash(hasher, nodes, j));
    }

    /// Makes room for `additional` more passes of `nodes`.
    fn reserve(&mut self, nodes: &[NodeState], additional: usize) {
        let hasher = &self.hasher;
        self.table
            .reserve(additional, |&j| Self::rehash(hasher, nodes, j));
    }

    /// Indexes `nodes` afresh.
    fn rebuild(&mut self, nodes: &[NodeState]) {
        self.table = hashbrown::HashTable::with_capacity(nodes.len());
        for i in 0..nodes.len() {
            self.insert(nodes, i);
        }
    }

    fn rehash(hasher: &ahash::RandomState, nodes: &[NodeState], place: u32) -> u64 {
        let n = &nodes[place as usize];
        Self::hash(hasher, n.node_id.as_str(), n.iteration)
    }
}

// Derived from `nodes`, which the state compares (and shows) itself.
impl PartialEq for NodeIndex {
    fn eq(&self, _: &NodeIndex) -> bool {
        true
    }
}

impl std::fmt::Debug for NodeIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeIndex")
            .field("len", &self.table.len())
            .finish()
    }
}

impl RunState {
    /// The state of a run with no events yet.
    pub fn new(run_id: RunId) -> Self {
        RunState {
            run_id,
            workflow: Default::default(),
            workflow_hash: Default::default(),
            input: Default::default(),
            status: Default::default(),
            started_ms: Default::default(),
            resumed_ms: Default::default(),
            ended_ms: Default::default(),
            output: Default::default(),
            error: Default::default(),
            cancel_requested: Default::default(),
            resumes: Default::default(),
            last_seq: Default::default(),
            frame_no: Default::default(),
            mounted: Default::default(),
            tokens: Default::default(),
            cost_usd: Default::default(),
            tool_calls: Default::default(),
            nodes: Default::default(),
            questions: Default::default(),
            parent_run_id: Default::default(),
            parent_node_id: Default::default(),
            depth: Default::default(),
            children: Default::default(),
            open_layers: Default::default(),
            open_chapters: Default::default(),
            generation: Default::default(),
            generation_hash: Default::default(),
            forked_from: Default::default(),
            trigger: None,
            replay_of: None,
            hijack_requested: Default::default(),
            open_revert: Default::default(),
            index: Default::default(),
        }
    }

    /// Folds a whole log.
    pub fn from_events<'a>(run_id: &RunId, events: impl IntoIterator<Item = &'a Event>) -> Self {
        let mut s = RunState::new(run_id.clone());
        for e in events {
            s.apply(e);
        }
        s
    }

    /// One node pass, if the log has mentioned it.
    pub fn node(&self, node_id: &str, iteration: u32) -> Option<&NodeState> {
        self.index
            .get(&self.nodes, node_id, iteration)
            .map(|i| &self.nodes[i])
    }

    /// Forgets the output of one node pass, for a holder of a run's live
    /// state that will not read it again (the log still has it; a fold of
    /// the log gives it back).
    pub fn drop_output(&mut self, node_id: &str, iteration: u32) {
        if let Some(i) = self.index.get(&self.nodes, node_id, iteration) {
            self.nodes[i].output = None;
        }
    }

    /// Keeps only the node passes `keep` says yes to, for a view of a run
    /// as it goes that need not hold what it no longer shows (`cairn run`'s
    /// display of a run of 100,000 nodes); the log still has them, and a
    /// fold of the log gives them back. An event about a pass let go folds
    /// into a new state of that pass, so such a holder leaves out the
    /// events of passes it let go of. Returns how many went.
    pub fn forget_nodes(&mut self, mut keep: impl FnMut(&NodeState) -> bool) -> usize {
        let before = self.nodes.len();
        self.nodes.retain(|n| keep(n));
        if self.nodes.len() == before {
            return 0;
        }
        self.nodes.shrink_to_fit();
        self.index.rebuild(&self.nodes);
        before - self.nodes.len()
    }

    /// Makes room for `additional` more node passes at once, so that a
    /// large frame's `NodePending` events do not grow the list by doubling
    /// (the old and new lists are both alive while it grows).
    pub fn reserve_nodes(&mut self, additional: usize) {
        self.nodes.reserve_exact(additional);
        self.index.reserve(&self.nodes, additional);
    }

    /// The latest pass of a node (highest iteration).
    pub fn latest(&self, node_id: &str) -> Option<&NodeState> {
        self.nodes
            .iter()
            .filter(|n| n.node_id == node_id)
            .max_by_key(|n| n.iteration)
    }

    /// When the current session of the run began: the latest resume, or the
    /// start when it was never resumed.
    pub fn session_started_ms(&self) -> Option<i64> {
        self.resumed_ms.or(self.started_ms)
    }

    /// Finished + failed + skipped nodes over mounted nodes, 0 to 1.
    pub fn progress(&self) -> f64 {
        let total = self.nodes.len();
        if total == 0 {
            return if self.status.is_some_and(|s| s.is_terminal()) {
                1.0
            } else {
                0.0
            };
        }
        let done = self
            .nodes
            .iter()
            .filter(|n| {
                matches!(
                    n.status,
                    NodeStatus::Finished | NodeStatus::Failed | NodeStatus::Skipped
                )
            })
            .count();
        done as f64 / total as f64
    }

    /// Counts of node passes by status.
    pub fn counts(&self) -> HashMap<&'static str, u64> {
        let mut m = HashMap::new();
        for n in &self.nodes {
            *m.entry(n.status.as_str()).or_insert(0) += 1;
        }
        m
    }

    fn node_mut(&mut self, ev: &Event) -> Option<&mut NodeState> {
        let (id, it) = ev.node_key()?;
        let idx = match self.index.get(&self.nodes, id, it) {
            Some(i) => i,
            None => {
                // The event's path is shared, not copied: the engine's
                // plan holds the same text.
                let path = ev.scope.node_id.clone()?;
                self.nodes.push(NodeState::new(path, it, ev.seq.get()));
                let i = self.nodes.len() - 1;
                self.index.insert(&self.nodes, i);
                i
            }
        };
        let n = &mut self.nodes[idx];
        if ev.scope.chapter.is_some() {
            n.chapter = ev.scope.chapter.clone();
        }
        Some(n)
    }

    /// Folds one event into the state.
    ///
    /// Every event type has its arm, those that change nothing included:
    /// a new type does not compile until it says what it does to state.
    pub fn apply(&mut self, ev: &Event) {
        use EventKind as K;
        self.last_seq = self.last_seq.max(ev.seq.get());
        let ts = ev.timestamp_ms;
        match &ev.kind {
            // The run.
            K::RunStarted {
                workflow,
                workflow_hash,
                input,
                resumed,
                parent_run_id,
                parent_node_id,
                depth,
                forked_from,
                trigger,
                replay_of,
            } => {
                self.lineage(parent_run_id, parent_node_id, *depth, forked_from);
                if trigger.is_some() {
                    self.trigger = trigger.as_deref().cloned();
                }
                if replay_of.is_some() {
                    self.replay_of = replay_of.as_deref().cloned();
                }
                self.run_started(ts, workflow, workflow_hash, input, *resumed);
            }
            K::RunStatusChanged { status } => self.status = Some(*status),
            K::RunCancelRequested { reason, .. } => {
                self.cancel_requested = Some(reason.clone().unwrap_or_default());
            }
            K::RunFinished { output, .. } => {
                self.output = output.clone();
                self.run_ended(ts, RunStatus::Finished);
            }
            K::RunFailed { error } => {
                self.error = Some(error.clone());
                self.run_ended(ts, RunStatus::Failed);
            }
            K::RunCancelled { .. } => self.run_ended(ts, RunStatus::Cancelled),
            K::WorkflowReloaded { generation, .. } => {
                self.generation = *generation;
                self.generation_hash = None;
            }
            K::RunHijackRequested { node_id, .. } => {
                self.hijack_requested.insert(node_id.clone());
            }
            K::RunHijacked { .. } => {
                if let Some(node) = &ev.scope.node_id {
                    self.hijack_requested.remove(node.as_str());
                }
            }
            // The plan.
            K::FrameCommitted {
                frame_no, mounted, ..
            } => (self.frame_no, self.mounted) = (*frame_no, *mounted),
            K::LayerStarted { layer_index, .. } => _ = self.open_layers.insert(*layer_index, ts),
            K::LayerFinished { layer_index, .. } => _ = self.open_layers.remove(layer_index),
            K::ChapterStarted { chapter } => _ = self.open_chapters.insert(chapter.clone()),
            K::ChapterFinished { chapter, .. } => _ = self.open_chapters.remove(chapter),
            // A node's passes and attempts.
            K::NodePending { layer_index } => self.node_pending(ev, *layer_index),
            K::NodeStarted { snapshot } => self.node_started(ev, snapshot),
            K::NodeFinished {
                duration_ms,
                output,
                ..
            } => self.node_finished(ev, *duration_ms, output),
            K::NodeFailed {
                error, will_retry, ..
            } => self.node_failed(ev, error, *will_retry),
            K::NodeRetrying { .. } => self.node_retrying(ev),
            K::NodeSkipped { reason } => self.node_skipped(ev, reason),
            K::NodeCancelled { reason } => self.node_cancelled(ev, reason),
            // People in the loop.
            K::NodeWaitingApproval {} => self.waiting_approval(ev),
            K::ApprovalRequested { message } => self.approval_requested(ev, message),
            K::ApprovalGranted { decided_by, note } => self.decided(ev, true, decided_by, note),
            K::ApprovalDenied { decided_by, note } => self.decided(ev, false, decided_by, note),
            K::InputRequested {
                request_id,
                prompt,
                schema,
            } => {
                self.asked(ev, request_id, prompt, schema);
                self.waiting_input(ev, request_id);
            }
            K::NodeWaitingInput { request_id } => self.waiting_input(ev, request_id),
            K::InputReceived {
                request_id,
                answer,
                answered_by,
            } => self.answered(ev, request_id, answer, answered_by),
            // Agents, tools and children.
            K::TokenUsageReported {
                input_tokens,
                output_tokens,
                cache_read_tokens,
                cache_write_tokens,
                reasoning_tokens,
                cost_usd,
                ..
            } => {
                let used = TokenTotals {
                    input: *input_tokens,
                    output: *output_tokens,
                    cache_read: cache_read_tokens.unwrap_or(0),
                    cache_write: cache_write_tokens.unwrap_or(0),
                    reasoning: reasoning_tokens.unwrap_or(0),
                };
                self.token_usage(ev, &used, *cost_usd);
            }
            K::AgentStepStarted { step, model, .. } => self.agent_step(ev, *step, model),
            K::NodeOutput {
                text,
                stream: OutputStream::Text,
            } => self.agent_text(ev, text),
            K::ToolCallStarted { .. } => self.tool_call_started(ev),
            K::DelegationStarted {
                child_run_id,
                agent,
                workflow,
            } => self.delegation_started(ev, child_run_id, agent, workflow),
            K::DelegationFinished {
                child_run_id,
                status,
            } => {
                if let Some(c) = self.children.iter_mut().find(|c| &c.run_id == child_run_id) {
                    c.status = Some(status.clone());
                }
            }
            // The workspace and scoring.
            K::RevertStarted { snapshot } => self.revert_started(ev, snapshot),
            K::RevertFinished { .. } => self.open_revert = None,
            K::ScorerStarted {
                scorer_id,
                scorer_name,
            } => self.scorer(ev, scorer_id, scorer_name, ScoreEnd::Open),
            K::ScorerFinished {
                scorer_id,
                scorer_name,
                score,
                reason,
            } => self.scorer(ev, scorer_id, scorer_name, ScoreEnd::Score(*score, reason)),
            K::ScorerFailed {
                scorer_id,
                scorer_name,
                error,
            } => self.scorer(ev, scorer_id, scorer_name, ScoreEnd::Failed(error)),
            // What the state does not keep: summaries and details the log
            // has (a command's output is not copied into the state).
            K::RunSummary { .. }
            | K::EdgeTraversed { .. }
            | K::BranchResolved { .. }
            | K::NodeHeartbeat { .. }
            | K::NodeOutput {
                stream: OutputStream::Stdout | OutputStream::Stderr | OutputStream::Reasoning,
                ..
            }
            | K::AgentStepFinished { .. }
            | K::AgentGenerationRetried { .. }
            | K::AgentContextCompacted { .. }
            | K::AgentWaiting { .. }
            | K::AgentEvent { .. }
            | K::ToolCallFinished { .. }
            | K::McpServerStarting { .. }
            | K::McpServerConnected { .. }
            | K::McpServerStderr { .. }
            | K::McpServerDisconnected { .. }
            | K::NetworkAccess { .. }
            | K::Diagnostic { .. }
            | K::WorkflowReloadDetected { .. }
            | K::WorkflowReloadFailed { .. }
            | K::WorkflowReloadUnsafe { .. } => {}
        }
    }
}

/// The run's own events.
impl RunState {
    /// Where a child or a fork comes from (`RunStarted`).
    fn lineage(
        &mut self,
        parent_run_id: &Option<RunId>,
        parent_node_id: &Option<String>,
        depth: u32,
        forked_from: &Option<crate::event::ForkedFrom>,
    ) {
        if forked_from.is_some() {
            self.forked_from = forked_from.clone();
        }
        if parent_run_id.is_some() {
            self.parent_run_id = parent_run_id.clone();
            self.parent_node_id = parent_node_id.clone();
            self.depth = depth;
        }
    }

    /// A session of the run begins (`RunStarted`): the first, or a resume.
    fn run_started(
        &mut self,
        ts: i64,
        workflow: &str,
        workflow_hash: &str,
        input: &Option<Value>,
        resumed: bool,
    ) {
        self.workflow = Some(workflow.to_string());
        self.workflow_hash = Some(workflow_hash.to_string());
        self.generation_hash = Some(workflow_hash.to_string());
        if input.is_some() {
            self.input = input.clone();
        }
        if resumed {
            self.resumes += 1;
            self.resumed_ms = Some(ts);
        } else {
            self.started_ms = Some(ts);
        }
        self.started_ms.get_or_insert(ts);
        self.status = Some(RunStatus::Running);
        self.ended_ms = None;
        self.error = None;
        // A cancel requested before a crash still stands after the
        // resume: only a new run starts without one.
        if !resumed {
            self.cancel_requested = None;
        }
    }

    /// `RunFinished`, `RunFailed` or `RunCancelled`.
    fn run_ended(&mut self, ts: i64, status: RunStatus) {
        self.status = Some(status);
        self.ended_ms = Some(ts);
    }
}

/// A node pass's lifecycle: pending, its attempts, how it ended.
impl RunState {
    fn node_pending(&mut self, ev: &Event, layer_index: Option<u32>) {
        if let Some(n) = self.node_mut(ev) {
            n.layer_index = layer_index;
            n.status = NodeStatus::Pending;
        }
    }

    fn node_started(&mut self, ev: &Event, snapshot: &Option<String>) {
        let attempt = ev.scope.attempt.unwrap_or(1);
        let Some(n) = self.node_mut(ev) else { return };
        if let Some(id) = snapshot {
            n.notes_mut().snapshots.push(AttemptSnapshot {
                attempt,
                snapshot: id.clone(),
            });
        }
        n.status = NodeStatus::Running;
        n.retry_announced = false;
        n.attempt = attempt;
        if let Some(notes) = n.notes.as_mut() {
            notes.error = None;
        }
        // Most nodes have one attempt: no room for four.
        n.attempts.reserve_exact(1);
        n.attempts.push(AttemptState {
            attempt,
            started_ms: ev.timestamp_ms,
            ended_ms: None,
            status: AttemptStatus::Running,
            error: None,
            tool_calls: 0,
        });
    }

    fn node_finished(&mut self, ev: &Event, duration_ms: u64, output: &Option<Output>) {
        if let Some(n) = self.node_mut(ev) {
            n.status = NodeStatus::Finished;
            n.output = output.clone();
            n.duration_ms = Some(duration_ms);
            close_attempt(n, ev.timestamp_ms, AttemptStatus::Finished, None);
        }
    }

    fn node_failed(&mut self, ev: &Event, error: &ErrorInfo, will_retry: bool) {
        if let Some(n) = self.node_mut(ev) {
            n.status = if will_retry {
                NodeStatus::Retrying
            } else {
                NodeStatus::Failed
            };
            n.notes_mut().error = Some(error.clone());
            close_attempt(
                n,
                ev.timestamp_ms,
                AttemptStatus::Failed,
                Some(Box::new(error.clone())),
            );
            if !will_retry {
                n.duration_ms = Some(total_duration(n));
            }
        }
    }

    fn node_retrying(&mut self, ev: &Event) {
        if let Some(n) = self.node_mut(ev) {
            n.status = NodeStatus::Retrying;
            n.retry_announced = true;
        }
    }

    fn node_skipped(&mut self, ev: &Event, reason: &str) {
        if let Some(n) = self.node_mut(ev) {
            n.status = NodeStatus::Skipped;
            n.notes_mut().reason = Some(reason.to_string());
        }
    }

    fn node_cancelled(&mut self, ev: &Event, reason: &Option<String>) {
        if let Some(n) = self.node_mut(ev) {
            n.status = NodeStatus::Cancelled;
            if reason.is_some() || n.notes.is_some() {
                n.notes_mut().reason = reason.clone();
            }
            close_attempt(n, ev.timestamp_ms, AttemptStatus::Cancelled, None);
        }
    }
}

/// Gates and questions: what a node asks of people, and their answers.
impl RunState {
    fn waiting_approval(&mut self, ev: &Event) {
        if let Some(n) = self.node_mut(ev) {
            n.status = NodeStatus::WaitingApproval;
        }
    }

    fn approval_requested(&mut self, ev: &Event, message: &Option<String>) {
        if let Some(n) = self.node_mut(ev) {
            if message.is_some() || n.notes.is_some() {
                n.notes_mut().approval_message = message.clone();
            }
        }
    }

    /// `ApprovalGranted` (`approved`) or `ApprovalDenied`.
    fn decided(
        &mut self,
        ev: &Event,
        approved: bool,
        decided_by: &Option<String>,
        note: &Option<String>,
    ) {
        if let Some(n) = self.node_mut(ev) {
            n.notes_mut().decision = Some(Decision {
                approved,
                by: decided_by.clone(),
                note: note.clone(),
            });
            if n.status == NodeStatus::WaitingApproval {
                n.status = NodeStatus::Running;
            }
        }
    }

    /// Keeps the question of an `InputRequested` (once: a question asked
    /// again after a crash is the same one).
    fn asked(&mut self, ev: &Event, request_id: &str, prompt: &str, schema: &Option<Value>) {
        let (Some(node_id), Some((_, iteration))) = (&ev.scope.node_id, ev.node_key()) else {
            return;
        };
        self.questions
            .entry(request_id.to_string())
            .or_insert_with(|| Question {
                node_id: node_id.clone(),
                iteration,
                prompt: prompt.to_string(),
                schema: schema.clone(),
                answer: None,
                answered_by: None,
            });
    }

    /// `InputRequested` or `NodeWaitingInput`: the node waits for `request_id`.
    fn waiting_input(&mut self, ev: &Event, request_id: &str) {
        if let Some(n) = self.node_mut(ev) {
            n.status = NodeStatus::WaitingInput;
            n.notes_mut().input_request_id = Some(request_id.to_string());
        }
    }

    fn answered(
        &mut self,
        ev: &Event,
        request_id: &str,
        answer: &Value,
        answered_by: &Option<String>,
    ) {
        if let Some(q) = self.questions.get_mut(request_id) {
            q.answer = Some(answer.clone());
            q.answered_by = answered_by.clone();
        }
        // The node waits while any question it asked is open (an
        // agent asks several at once).
        let open = ev.node_key().is_some_and(|(node, it)| {
            self.questions
                .values()
                .any(|q| q.answer.is_none() && q.iteration == it && q.node_id.as_str() == node)
        });
        if let Some(n) = self.node_mut(ev) {
            if n.status == NodeStatus::WaitingInput && !open {
                n.status = NodeStatus::Running;
            }
        }
    }
}

/// Agents' model calls and tool calls, and child runs.
impl RunState {
    fn token_usage(&mut self, ev: &Event, used: &TokenTotals, cost_usd: Option<f64>) {
        self.tokens.input += used.input;
        self.tokens.output += used.output;
        self.tokens.cache_read += used.cache_read;
        self.tokens.cache_write += used.cache_write;
        self.tokens.reasoning += used.reasoning;
        if let Some(c) = cost_usd {
            *self.cost_usd.get_or_insert(0.0) += c;
        }
        if let Some(a) = self.agent_mut(ev) {
            a.input_tokens += used.input;
            a.output_tokens += used.output;
            if let Some(c) = cost_usd {
                *a.cost_usd.get_or_insert(0.0) += c;
            }
        }
    }

    /// The progress of the agent node an event is of, once it asked its
    /// model (the node's state is made if the log had not named it).
    fn agent_mut(&mut self, ev: &Event) -> Option<&mut AgentProgress> {
        self.node_mut(ev)?.notes.as_mut()?.agent.as_mut()
    }

    fn agent_step(&mut self, ev: &Event, step: u32, model: &str) {
        if let Some(n) = self.node_mut(ev) {
            let a = n.notes_mut().agent.get_or_insert_with(Default::default);
            a.step = step;
            // A new step says new things.
            a.last_line.clear();
            if a.model != model {
                a.model = model.to_string();
            }
        }
    }

    /// An agent's streamed text: only agents keep a last line.
    fn agent_text(&mut self, ev: &Event, text: &str) {
        let Some(a) = self.agent_mut(ev) else { return };
        let line = text.trim_end().rsplit('\n').next().unwrap_or("");
        if text.contains('\n') || a.last_line.len() >= LAST_LINE_MAX {
            a.last_line.clear();
        }
        let room = LAST_LINE_MAX.saturating_sub(a.last_line.len());
        let mut end = line.len().min(room);
        while !line.is_char_boundary(end) {
            end -= 1;
        }
        a.last_line.push_str(&line[..end]);
    }

    fn tool_call_started(&mut self, ev: &Event) {
        self.tool_calls += 1;
        let attempt = ev.scope.attempt;
        if let Some(a) = self.agent_mut(ev) {
            a.tool_calls += 1;
        }
        if let Some(n) = self.node_mut(ev) {
            if let Some(a) = n
                .attempts
                .iter_mut()
                .rev()
                .find(|a| Some(a.attempt) == attempt)
            {
                a.tool_calls += 1;
            }
        }
    }

    fn delegation_started(
        &mut self,
        ev: &Event,
        child_run_id: &RunId,
        agent: &str,
        workflow: &str,
    ) {
        // An attempt that takes a delegation up again after a crash
        // logs it again: one entry per child.
        let known = self.children.iter().any(|c| &c.run_id == child_run_id);
        if let (false, Some(node), Some(iteration)) = (known, &ev.scope.node_id, ev.scope.iteration)
        {
            self.children.push(ChildRun {
                run_id: child_run_id.clone(),
                node_id: node.clone(),
                iteration,
                agent: agent.to_string(),
                workflow: workflow.to_string(),
                status: None,
            });
        }
    }
}

/// How a `Scorer*` event leaves its scorer.
enum ScoreEnd<'a> {
    /// `ScorerStarted`.
    Open,
    /// `ScorerFinished`: the score and its reason.
    Score(f64, &'a Option<String>),
    /// `ScorerFailed`.
    Failed(&'a ErrorInfo),
}

/// The workspace and scoring.
impl RunState {
    fn revert_started(&mut self, ev: &Event, snapshot: &str) {
        if let (Some(node), Some(iteration)) = (&ev.scope.node_id, ev.scope.iteration) {
            self.open_revert = Some(Box::new(OpenRevert {
                node_id: node.clone(),
                iteration,
                attempt: ev.scope.attempt.unwrap_or(1),
                snapshot: snapshot.to_string(),
            }));
        }
    }

    /// Folds a `Scorer*` event into its node pass's scores: a start opens
    /// the scorer's entry (again, after a resume ran it once more), an end
    /// closes it.
    fn scorer(&mut self, ev: &Event, id: &str, name: &str, end: ScoreEnd) {
        let Some(n) = self.node_mut(ev) else { return };
        let scores = &mut n.notes_mut().scores;
        let idx = match scores.iter().position(|s| s.scorer_id == id) {
            Some(i) => i,
            None => {
                scores.push(ScoreState {
                    scorer_id: id.to_string(),
                    scorer_name: name.to_string(),
                    status: "running",
                    score: None,
                    reason: None,
                    error: None,
                });
                scores.len() - 1
            }
        };
        let s = &mut scores[idx];
        match end {
            ScoreEnd::Open => {}
            ScoreEnd::Score(score, reason) => {
                s.status = "finished";
                s.score = Some(score);
                s.reason = reason.clone();
            }
            ScoreEnd::Failed(error) => {
                s.status = "failed";
                s.error = Some(error.clone());
            }
        }
    }
}

fn close_attempt(n: &mut NodeState, ts: i64, status: AttemptStatus, error: Option<Box<ErrorInfo>>) {
    if let Some(a) = n.attempts.last_mut() {
        if a.status == AttemptStatus::Running {
            a.status = status;
            a.ended_ms = Some(ts);
            a.error = error;
        }
    }
}

fn total_duration(n: &NodeState) -> u64 {
    n.attempts
        .iter()
        .map(|a| (a.ended_ms.unwrap_or(a.started_ms) - a.started_ms).max(0) as u64)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Scope;

    fn ev(seq: u64, scope: Scope, kind: EventKind) -> Event {
        Event {
            run_id: crate::RunId::parse("r").unwrap(),
            seq: crate::Seq(seq),
            timestamp_ms: seq as i64 * 10,
            scope,
            kind,
        }
    }

    #[test]
    fn retry_then_finish() {
        let s = RunState::from_events(
            &RunId::parse("r").unwrap(),
            &[
                ev(
                    1,
                    Scope::node("a", 0),
                    EventKind::NodePending {
                        layer_index: Some(0),
                    },
                ),
                ev(
                    2,
                    Scope::node("a", 0).with_attempt(1),
                    EventKind::NodeStarted { snapshot: None },
                ),
                ev(
                    3,
                    Scope::node("a", 0).with_attempt(1),
                    EventKind::NodeFailed {
                        error: ErrorInfo::new("exit", "1"),
                        will_retry: true,
                        snapshot: None,
                    },
                ),
                ev(
                    4,
                    Scope::node("a", 0).with_attempt(2),
                    EventKind::NodeRetrying { delay_ms: 5 },
                ),
                ev(
                    5,
                    Scope::node("a", 0).with_attempt(2),
                    EventKind::NodeStarted { snapshot: None },
                ),
                ev(
                    6,
                    Scope::node("a", 0).with_attempt(2),
                    EventKind::NodeFinished {
                        duration_ms: 10,
                        output: Some(Value::from(3).into()),
                        cached: None,
                        snapshot: None,
                    },
                ),
            ],
        );
        let n = s.node("a", 0).unwrap();
        assert_eq!(n.status, NodeStatus::Finished);
        assert_eq!(n.attempt, 2);
        assert_eq!(n.attempts.len(), 2);
        assert_eq!(n.attempts[0].status, AttemptStatus::Failed);
        assert_eq!(
            n.output.as_ref().map(Output::to_value),
            Some(Value::from(3))
        );
        assert_eq!(s.progress(), 1.0);
        assert_eq!(s.last_seq, 6);
    }

    #[test]
    fn open_attempt_is_found() {
        let s = RunState::from_events(
            &RunId::parse("r").unwrap(),
            &[
                ev(
                    1,
                    Scope::node("a", 0),
                    EventKind::NodePending { layer_index: None },
                ),
                ev(
                    2,
                    Scope::node("a", 0).with_attempt(1),
                    EventKind::NodeStarted { snapshot: None },
                ),
            ],
        );
        assert_eq!(s.node("a", 0).unwrap().open_attempt(), Some(1));
    }

    #[test]
    fn a_resume_starts_a_new_session_and_keeps_the_start() {
        let started = |seq, resumed| {
            ev(
                seq,
                Scope::run(),
                EventKind::RunStarted {
                    workflow: "w".into(),
                    workflow_hash: "h".into(),
                    input: None,
                    resumed,
                    parent_run_id: None,
                    parent_node_id: None,
                    depth: 0,
                    forked_from: None,
                    trigger: None,
                    replay_of: None,
                },
            )
        };
        let first = RunState::from_events(&RunId::parse("r").unwrap(), &[started(1, false)]);
        assert_eq!(first.session_started_ms(), Some(10));
        assert_eq!(first.resumed_ms, None);
        let again = RunState::from_events(
            &RunId::parse("r").unwrap(),
            &[started(1, false), started(2, true), started(3, true)],
        );
        assert_eq!(again.started_ms, Some(10));
        assert_eq!(again.session_started_ms(), Some(30));
        assert_eq!(again.resumes, 2);
    }
}
