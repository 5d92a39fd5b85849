//! Which files a revert or a fork may touch: the paths the run's own
//! attempts changed after the point, and nothing else (docs/snapshots.md,
//! "What a revert touches").
//!
//! A root is shared: other workflows, editors and builds write there too,
//! and a restore of the whole root would put their files back (delete what
//! they made) as well as the run's. What the run changed is known from its
//! snapshots: every attempt of a node that can change files has one before
//! it (`NodeStarted`), before each agent step after the first
//! (`AgentStepStarted`) and after it (`NodeFinished`, `NodeFailed`); two
//! snapshots of one attempt in a row bound what it did in between. A
//! revert in the log changed the paths it selected, to its snapshot.
//!
//! This module is the pure part: reading those bounds out of a log
//! ([`History::of`]), the changed paths of two snapshots ([`diff`]), and
//! the plan ([`plan`]) from the changed sets, the files as they are now and
//! the snapshot of the point. [`shell`] reads the snapshots and the root.

pub(crate) mod shell;

use std::collections::{BTreeMap, BTreeSet, HashMap};

use cairn_events::{Event, EventKind, SnapshotAt};
use cairn_snapshot::{Mode, ObjectId};
use serde_json::{json, Value};

/// A path relative to the root, '/'-separated bytes, as snapshots name it.
pub type RelPath = Vec<u8>;
/// What a snapshot holds at a path: its mode and blob.
pub type Entry = (Mode, ObjectId);
/// A snapshot as a flat map of its files and links.
pub type Flat = BTreeMap<RelPath, Entry>;
/// What one step of the run left at the paths it changed (`None`: it
/// deleted the path).
pub type Left = BTreeMap<RelPath, Option<Entry>>;

/// One attempt of one node pass.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AttemptKey {
    /// The node's path.
    pub node: String,
    /// Its pass.
    pub iteration: u32,
    /// The attempt.
    pub attempt: u32,
}

impl AttemptKey {
    fn of(ev: &Event) -> Option<AttemptKey> {
        Some(AttemptKey {
            node: ev.scope.node_id.as_ref()?.to_string(),
            iteration: ev.scope.iteration?,
            attempt: ev.scope.attempt?,
        })
    }
}

/// Where a segment's second snapshot comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum After {
    /// A snapshot the log names.
    Snapshot(String),
    /// The root as it is now: an attempt cut short (no snapshot of what it
    /// left) that an `on_retry: revert` undoes before anything else ran.
    Now,
}

/// Two snapshots of one attempt in a row: what the attempt did between.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    /// The attempt.
    pub key: AttemptKey,
    /// The first snapshot.
    pub before: String,
    /// The second.
    pub after: After,
    /// The seq of the event that names the second (`u64::MAX` for
    /// [`After::Now`]).
    pub end_seq: u64,
}

/// A revert the log holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RevertMark {
    /// Its `RevertStarted`.
    pub seq: u64,
    /// The attempt whose snapshot it restores.
    pub key: AttemptKey,
    /// That snapshot.
    pub target: String,
    /// An `on_retry: revert` (its node pass's last event before it was
    /// `NodeRetrying`): it restored the paths that attempt changed, where a
    /// `cairn revert` restores every path the run changed after the point.
    pub on_retry: bool,
    /// Its `RevertFinished`, when the log has it.
    pub finished: Option<u64>,
}

/// What a log says about the run's changes to the files.
#[derive(Debug, Clone, Default)]
pub struct History {
    /// Every segment, in the order their ends were logged.
    pub segments: Vec<Segment>,
    /// Every revert, in order.
    pub reverts: Vec<RevertMark>,
    /// Each attempt's `NodeStarted` seq.
    pub starts: HashMap<AttemptKey, u64>,
    /// Attempts whose changes after their last snapshot are not known:
    /// they ended without a snapshot and nothing took one after them (a
    /// cancel, a kill), or they are still open at the log's end.
    /// With the attempt's last snapshot.
    pub unclosed: Vec<(AttemptKey, String)>,
}

/// Which changes a plan covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Point {
    /// Every change logged after this seq (the event whose snapshot is the
    /// point's): `cairn revert`, `cairn fork`.
    After(u64),
    /// One attempt's own changes: `on_retry: revert`.
    Attempt(AttemptKey),
}

/// The snapshot an attempt's event names (before or after its work; a
/// revert's is not an attempt's).
fn snapshot_of(kind: &EventKind) -> Option<&str> {
    match kind.snapshot()? {
        (s, SnapshotAt::Before | SnapshotAt::After) => Some(s),
        (_, SnapshotAt::Restored) => None,
    }
}

/// What [`History::of`] keeps while it reads a log.
#[derive(Default)]
struct Reading {
    h: History,
    /// Each open attempt's latest snapshot.
    last: HashMap<AttemptKey, (u64, String)>,
    /// Attempts that ended without a snapshot, waiting for the next one.
    pending: Vec<(AttemptKey, String)>,
    /// Whether a node pass's last event was `NodeRetrying`.
    retrying: HashMap<(String, u32), bool>,
}

impl History {
    /// Reads the segments and reverts out of `events` (a run's log in seq
    /// order; other events are ignored). An attempt that ended without a
    /// snapshot is closed by the next snapshot the log names after its end;
    /// with `now_closes`, one still without is closed by the root as it is
    /// now ([`After::Now`]), else it is [`History::unclosed`].
    pub fn of(events: &[Event], now_closes: bool) -> History {
        let mut r = Reading::default();
        for ev in events {
            r.read(ev);
        }
        r.finish(now_closes)
    }
}

impl Reading {
    /// Folds one event. Every event type has its arm: a new one does not
    /// compile until it says what it does to the files' history.
    fn read(&mut self, ev: &Event) {
        use EventKind as K;
        let seq = ev.seq.get();
        if let Some(s) = snapshot_of(&ev.kind) {
            for (key, before) in self.pending.drain(..) {
                self.h.segments.push(Segment {
                    key,
                    before,
                    after: After::Snapshot(s.to_string()),
                    end_seq: seq,
                });
            }
        }
        let pass = ev
            .scope
            .node_id
            .as_ref()
            .zip(ev.scope.iteration)
            .map(|(n, i)| (n.to_string(), i));
        let key = AttemptKey::of(ev);
        match &ev.kind {
            K::NodeStarted { snapshot } => {
                if let Some(key) = key {
                    self.h.starts.insert(key.clone(), seq);
                    if let Some(s) = snapshot {
                        self.last.insert(key, (seq, s.clone()));
                    }
                }
            }
            K::AgentStepStarted { snapshot, .. } => {
                if let (Some(key), Some(s)) = (key, snapshot) {
                    self.step(key, s, seq);
                }
            }
            K::NodeFinished { snapshot, .. } | K::NodeFailed { snapshot, .. } => {
                if let Some(key) = key {
                    self.attempt_ended(key, snapshot.as_deref(), seq);
                }
            }
            K::NodeCancelled { .. } => {
                if let Some(key) = key {
                    if let Some((_, before)) = self.last.remove(&key) {
                        self.pending.push((key, before));
                    }
                }
            }
            K::RevertStarted { snapshot } => self.revert_started(ev, snapshot, seq),
            K::RevertFinished { .. } => {
                let open = self.h.reverts.iter_mut().rev();
                if let Some(r) = open.into_iter().find(|r| r.finished.is_none()) {
                    r.finished = Some(seq);
                }
            }
            // No files changed, and no snapshot named.
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
            | K::RunHijacked { .. } => {}
        }
        if let Some(pass) = pass {
            let retrying = matches!(ev.kind, K::NodeRetrying { .. });
            self.retrying.insert(pass, retrying);
        }
    }

    /// An agent's step with the snapshot before it: what the steps before
    /// it did is a segment of its own.
    fn step(&mut self, key: AttemptKey, s: &str, seq: u64) {
        if let Some((_, before)) = self.last.insert(key.clone(), (seq, s.to_string())) {
            self.h.segments.push(Segment {
                key,
                before,
                after: After::Snapshot(s.to_string()),
                end_seq: seq,
            });
        }
    }

    /// `NodeFinished` or `NodeFailed`: with a snapshot after its work, the
    /// attempt's last segment closes; without, the next snapshot closes it.
    fn attempt_ended(&mut self, key: AttemptKey, snapshot: Option<&str>, seq: u64) {
        let Some((_, before)) = self.last.remove(&key) else {
            return;
        };
        match snapshot {
            Some(s) => self.h.segments.push(Segment {
                key,
                before,
                after: After::Snapshot(s.to_string()),
                end_seq: seq,
            }),
            None => self.pending.push((key, before)),
        }
    }

    fn revert_started(&mut self, ev: &Event, snapshot: &str, seq: u64) {
        let (Some(node), Some(iteration)) = (&ev.scope.node_id, ev.scope.iteration) else {
            return;
        };
        let key = AttemptKey {
            node: node.to_string(),
            iteration,
            attempt: ev.scope.attempt.unwrap_or(1),
        };
        let on_retry = self
            .retrying
            .get(&(key.node.clone(), iteration))
            .copied()
            .unwrap_or(false);
        self.h.reverts.push(RevertMark {
            seq,
            key,
            target: snapshot.to_string(),
            on_retry,
            finished: None,
        });
    }

    /// The attempts still without a snapshot after their changes.
    fn finish(mut self, now_closes: bool) -> History {
        let mut open: Vec<(AttemptKey, String)> =
            self.last.into_iter().map(|(k, (_, s))| (k, s)).collect();
        open.sort();
        for (key, before) in self.pending.into_iter().chain(open) {
            if now_closes {
                self.h.segments.push(Segment {
                    key,
                    before,
                    after: After::Now,
                    end_seq: u64::MAX,
                });
            } else {
                self.h.unclosed.push((key, before));
            }
        }
        self.h
    }
}

impl History {
    /// The segments and reverts (indexes) whose changes a plan for `point`
    /// covers, among those logged before `upto`.
    pub fn covered(&self, point: &Point, upto: u64) -> (Vec<usize>, Vec<usize>) {
        match point {
            Point::After(t) => (
                (0..self.segments.len())
                    .filter(|&i| {
                        let end = self.segments[i].end_seq;
                        end > *t && (end < upto || upto == u64::MAX)
                    })
                    .collect(),
                (0..self.reverts.len())
                    .filter(|&i| self.reverts[i].seq > *t && self.reverts[i].seq < upto)
                    .collect(),
            ),
            Point::Attempt(k) => (
                (0..self.segments.len())
                    .filter(|&i| &self.segments[i].key == k)
                    .collect(),
                Vec::new(),
            ),
        }
    }

    /// What a revert in the log covered: the paths the run changed after
    /// its attempt started (before the revert), or that attempt's own for
    /// an `on_retry: revert`.
    pub fn point_of(&self, r: &RevertMark) -> Point {
        if r.on_retry {
            Point::Attempt(r.key.clone())
        } else {
            Point::After(self.starts.get(&r.key).copied().unwrap_or(0))
        }
    }

    /// The seq at which a revert's change counts: its end, or its start
    /// when it never ended (the files may be either way).
    pub fn revert_seq(r: &RevertMark) -> u64 {
        r.finished.unwrap_or(r.seq)
    }
}

/// The paths where `after` differs from `before`, with what `after` has.
pub fn diff(before: &Flat, after: &Flat) -> Left {
    let mut out = Left::new();
    for (p, e) in after {
        if before.get(p) != Some(e) {
            out.insert(p.clone(), Some(*e));
        }
    }
    for p in before.keys() {
        if !after.contains_key(p) {
            out.insert(p.clone(), None);
        }
    }
    out
}

/// What the run changed, step by step: a segment's changed paths with
/// what it left there, or a revert's paths with its snapshot's content.
#[derive(Debug, Clone, Default)]
pub struct Change {
    /// When it counts: later changes of a path override earlier ones.
    pub seq: u64,
    /// The paths and what the run left at each.
    pub left: Left,
}

/// Why a path cannot be restored without overwriting someone else's work.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    /// The path.
    pub path: RelPath,
    /// Why, in words.
    pub why: String,
}

/// What a revert or a fork does to the files.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FilesPlan {
    /// The snapshot the paths are put back to.
    pub snapshot: String,
    /// Paths written as the snapshot has them.
    pub write: Vec<RelPath>,
    /// Paths deleted (the snapshot does not have them).
    pub remove: Vec<RelPath>,
    /// Paths the run changed that something else changed since: refused
    /// unless forced (then they are in `write`/`remove` too).
    pub conflicts: Vec<Conflict>,
    /// Whether conflicts are overwritten (`--force`).
    pub force: bool,
    /// Attempts whose last changes are not known (see
    /// [`History::unclosed`]): left as they are.
    pub unknown: Vec<String>,
}

impl FilesPlan {
    /// Whether the plan may not be carried out: conflicts, not forced.
    pub fn refused(&self) -> bool {
        !self.conflicts.is_empty() && !self.force
    }

    /// Every path the restore is given.
    pub fn paths(&self) -> Vec<RelPath> {
        let mut all: Vec<RelPath> = self.write.iter().chain(&self.remove).cloned().collect();
        all.sort();
        all
    }

    /// The plan as JSON (`--dry-run --json`): paths as text (bytes that are
    /// not UTF-8 shown as U+FFFD).
    pub fn to_json(&self) -> Value {
        let text = |p: &RelPath| String::from_utf8_lossy(p).into_owned();
        json!({
            "snapshot": self.snapshot,
            "write": self.write.iter().map(text).collect::<Vec<_>>(),
            "remove": self.remove.iter().map(text).collect::<Vec<_>>(),
            "conflicts": self.conflicts.iter().map(|c| json!({"path": text(&c.path), "why": c.why})).collect::<Vec<_>>(),
            "force": self.force,
            "unknown": self.unknown,
        })
    }

    /// The plan as lines for a person: one per path.
    pub fn lines(&self) -> Vec<String> {
        let text = |p: &RelPath| String::from_utf8_lossy(p).into_owned();
        let mut out = Vec::new();
        for p in &self.write {
            out.push(format!("write   {}", text(p)));
        }
        for p in &self.remove {
            out.push(format!("remove  {}", text(p)));
        }
        for c in &self.conflicts {
            let tag = if self.force { "forced  " } else { "conflict" };
            out.push(format!("{tag} {}: {}", text(&c.path), c.why));
        }
        for u in &self.unknown {
            out.push(format!("unknown {u}"));
        }
        out
    }
}

/// What is at a path now, for the plan.
#[derive(Debug, Clone, Default)]
pub struct Current {
    /// The root's files and links (a fresh snapshot of it).
    pub flat: Flat,
    /// Paths that snapshot left out (too large, a socket, a FIFO): what
    /// they hold is not known, so they are never overwritten unasked.
    pub unknown: BTreeSet<RelPath>,
}

fn describe(e: &Option<Entry>) -> &'static str {
    match e {
        None => "absent",
        Some((Mode::Symlink, _)) => "a link",
        Some((Mode::Executable, _)) => "an executable file",
        Some(_) => "a file",
    }
}

/// Why `now` is not what the run left (`left`).
fn why_changed(left: &Option<Entry>, now: &Option<Entry>) -> String {
    match (left, now) {
        (None, Some(_)) => format!(
            "the run deleted it, and something else made it since ({} now)",
            describe(now)
        ),
        (Some(_), None) => "the run left it, and something else deleted it since".into(),
        _ => format!(
            "the run left {}, and something else changed it since ({} now)",
            describe(left),
            describe(now)
        ),
    }
}

/// The plan: for each path the changes cover (later changes override
/// earlier ones), its content at the point (`target`) is written or its
/// file deleted, unless it already is so, or it is not what the run left
/// there last (something else changed it since): then it is a conflict,
/// done anyway only with `force`. A write that would replace a file on
/// its way (`a` for `a/b`) or delete what is under it (`a/x` for `a`)
/// that is not itself restored is a conflict too.
pub fn plan(changes: &[Change], target: &Flat, current: &Current, force: bool) -> FilesPlan {
    let mut order: Vec<&Change> = changes.iter().collect();
    order.sort_by_key(|c| c.seq);
    let mut left: BTreeMap<&RelPath, &Option<Entry>> = BTreeMap::new();
    for c in order {
        for (p, e) in &c.left {
            left.insert(p, e);
        }
    }
    let mut out = FilesPlan {
        force,
        ..Default::default()
    };
    let mut write = Vec::new();
    let mut remove = BTreeSet::new();
    for (p, l) in left {
        let want = target.get(p).copied();
        let now = current.flat.get(p).copied();
        if current.unknown.contains(p) {
            out.conflicts.push(Conflict {
                path: p.clone(),
                why: "snapshots leave it out (too large, or not a file), so what it holds now \
                      is not known"
                    .into(),
            });
            if !force {
                continue;
            }
        } else if now == want {
            continue;
        } else if now != *l {
            out.conflicts.push(Conflict {
                path: p.clone(),
                why: why_changed(l, &now),
            });
            if !force {
                continue;
            }
        }
        match want {
            Some(_) => write.push(p.clone()),
            None => {
                remove.insert(p.clone());
            }
        }
    }
    for p in write {
        match in_the_way(&p, current, &remove) {
            Some(why) => {
                out.conflicts.push(Conflict {
                    path: p.clone(),
                    why,
                });
                if force {
                    out.write.push(p);
                }
            }
            None => out.write.push(p),
        }
    }
    out.remove = remove.into_iter().collect();
    out.conflicts.sort_by(|a, b| a.path.cmp(&b.path));
    out.conflicts.dedup_by(|a, b| a.path == b.path);
    out
}

/// What writing `p` would destroy that is neither the run's nor deleted by
/// the plan: a file or link where a folder of its path goes, or files
/// under `p` where `p` is now a folder.
fn in_the_way(p: &RelPath, current: &Current, remove: &BTreeSet<RelPath>) -> Option<String> {
    let text = |p: &[u8]| String::from_utf8_lossy(p).into_owned();
    for (i, b) in p.iter().enumerate() {
        if *b != b'/' {
            continue;
        }
        let up = &p[..i];
        if current.flat.contains_key(up) && !remove.contains(up) {
            return Some(format!(
                "`{}` on its way is a file or link that something else made",
                text(up)
            ));
        }
    }
    let mut under = p.clone();
    under.push(b'/');
    let inside = current
        .flat
        .range(under.clone()..)
        .take_while(|(q, _)| q.starts_with(&under))
        .map(|(q, _)| q)
        .chain(
            current
                .unknown
                .range(under.clone()..)
                .take_while(|q| q.starts_with(&under)),
        )
        .find(|q| !remove.contains(*q));
    inside.map(|q| {
        format!(
            "it is a folder now, holding `{}` that something else made",
            text(q)
        )
    })
}

#[cfg(test)]
mod tests;
