//! Replays (`cairn replay`, docs/replay.md): a new run of a workflow (the
//! original's, or a changed one) in which every model call whose request
//! is the same as one the original made is answered with the original's
//! answer, every question the original asked again is answered as it was,
//! and, with `tools: recorded`, every tool call and command answers as it
//! did without running.
//!
//! A replay is a run like any other: its own log (`RunStarted.replayOf`),
//! its own rows. Its tools run in a copy of the original's root, restored
//! from the original's first snapshot: never in the folder the original
//! ran in. Where it asks something the original never asked (a divergence),
//! the node fails (`replay_diverged`) unless the replay is live, which asks
//! the model or the person instead and says so (`Diagnostic`, source
//! `replay`). The report ([`report`]) compares the two logs afterwards.

pub mod bundle;
mod record;
pub mod report;
mod start;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use cairn_events::{ErrorInfo, EventKind, ReplayOf, ReplayTools, RunId};
use cairn_store::Backend;
use serde_json::{json, Value};

use crate::node::{Decision, NodeError};
use crate::EngineError;

pub(crate) use record::{RecStep, Recording};

/// A node pass: its node's id and its iteration.
pub(crate) type Key = (String, u32);

/// The error kind of a node whose request or question the original never
/// made, in a replay that is not live.
pub const DIVERGED: &str = "replay_diverged";

/// A replay's answers: the original's recording, and what the replay took
/// of it already.
#[derive(Debug)]
pub(crate) struct Replayer {
    pub of: ReplayOf,
    rec: Recording,
    /// The original's steps answered already, by node pass, attempt and
    /// step: each answers once.
    taken: Mutex<HashSet<(Key, u32, u32)>>,
    /// The original's tool calls answered already (`tools: recorded`), by
    /// node pass, attempt and `toolSeq`.
    calls_taken: Mutex<HashSet<(Key, u32, u32)>>,
    /// The original's answers taken, by node pass and position.
    answers_taken: Mutex<std::collections::HashMap<Key, HashSet<usize>>>,
    /// How many of the original's child runs of each pass were taken.
    children_taken: Mutex<std::collections::HashMap<Key, usize>>,
    /// Where the original's root is copied for this replay, and the folder
    /// it copies.
    root: Option<ReplayRoot>,
}

/// A replay's copy of the original's root.
#[derive(Debug, Clone)]
pub(crate) struct ReplayRoot {
    /// The root the original ran in.
    pub original: PathBuf,
    /// The copy.
    pub copy: PathBuf,
}

impl Replayer {
    /// The replay `own` of `of.run_id`: reads the original, and, for a
    /// replay taken up after a stop, what its own log answered already.
    pub(crate) fn load(
        backend: &dyn Backend,
        of: ReplayOf,
        own: Option<&[cairn_events::Event]>,
        root: Option<ReplayRoot>,
    ) -> Result<Replayer, EngineError> {
        let rec = Recording::read(backend, &of.run_id)?;
        let r = Replayer {
            of,
            rec,
            taken: Mutex::new(HashSet::new()),
            calls_taken: Mutex::new(HashSet::new()),
            answers_taken: Mutex::new(Default::default()),
            children_taken: Mutex::new(Default::default()),
            root,
        };
        if let Some(events) = own {
            r.seed(events);
        }
        Ok(r)
    }

    /// Marks as taken the original's answers that the replay's own log
    /// holds already, so that a resumed replay goes on where it stopped.
    fn seed(&self, events: &[cairn_events::Event]) {
        let own = Recording::fold(events);
        for (key, steps) in &own.steps {
            for s in steps {
                if let Some(h) = &s.hash {
                    let _ = self.take_step(key, h);
                }
            }
        }
    }

    /// The original run.
    pub(crate) fn original(&self) -> &RunId {
        &self.of.run_id
    }

    /// Whether tools and commands answer from the record.
    pub(crate) fn recorded_tools(&self) -> bool {
        self.of.tools == ReplayTools::Recorded
    }

    /// The folder a node's processes run in by default, for a workflow
    /// whose folder is `base_dir`: its place in the copy of the root.
    pub(crate) fn dir_for(&self, base_dir: &Path) -> Option<PathBuf> {
        let root = self.root.as_ref()?;
        Some(match base_dir.strip_prefix(&root.original) {
            Ok(rest) => root.copy.join(rest),
            Err(_) => root.copy.clone(),
        })
    }

    /// The original's answer to a request of node pass `key` with hash
    /// `hash`: the first of its steps with that hash not taken yet.
    pub(crate) fn take_step(&self, key: &Key, hash: &str) -> Option<RecStep> {
        let steps = self.rec.steps.get(key)?;
        let mut taken = self.taken.lock().unwrap_or_else(|e| e.into_inner());
        let s = steps.iter().find(|s| {
            s.hash.as_deref() == Some(hash) && !taken.contains(&(key.clone(), s.attempt, s.step))
        })?;
        taken.insert((key.clone(), s.attempt, s.step));
        Some(s.clone())
    }

    /// The summary the original's conversation of `key` was compacted with
    /// before `step`.
    pub(crate) fn summary(&self, key: &Key, step: u32) -> Option<String> {
        self.rec
            .summaries
            .get(&(key.clone(), step))
            .and_then(|s| s.last().cloned())
    }

    /// The decision the original's gate of `key` had.
    pub(crate) fn decision(&self, key: &Key) -> Option<Decision> {
        self.rec.decisions.get(key).map(|d| Decision {
            approved: d.approved,
            note: d.note.clone(),
            by: Some(format!("replay of {}", self.of.run_id)),
        })
    }

    /// The answer the original got to the same question in the same node
    /// pass: the first asked in the same words and not answered here yet.
    pub(crate) fn answer(&self, key: &Key, prompt: &str) -> Option<Value> {
        let answers = self.rec.answers.get(key)?;
        let mut taken = self.answers_taken.lock().unwrap_or_else(|e| e.into_inner());
        let used = taken.entry(key.clone()).or_default();
        let i = (0..answers.len()).find(|i| answers[*i].0 == prompt && !used.contains(i))?;
        used.insert(i);
        Some(answers[i].1.clone())
    }

    /// The original's result of a call of `tool` with `input` in node pass
    /// `key` (`tools: recorded`): the first such call not answered yet
    /// that ended.
    pub(crate) fn take_call(
        &self,
        key: &Key,
        tool: &str,
        input: &Value,
    ) -> Option<Result<Value, ErrorInfo>> {
        let rows = self.rec.calls.get(key)?;
        let wanted = cairn_agent::canonical_json(input);
        let mut taken = self.calls_taken.lock().unwrap_or_else(|e| e.into_inner());
        for row in rows {
            let id = (key.clone(), row.attempt, row.tool_seq);
            if row.tool != tool || taken.contains(&id) {
                continue;
            }
            let Some(result) = crate::agent::history::outcome(row) else {
                continue;
            };
            if cairn_agent::canonical_json(&row.input) != wanted {
                continue;
            }
            taken.insert(id);
            return Some(result);
        }
        None
    }

    /// How the original's pass `key` ended, and what its attempt streamed
    /// (`tools: recorded` answers a command with them).
    pub(crate) fn command(
        &self,
        key: &Key,
    ) -> Option<(&record::RecEnd, &[(cairn_events::OutputStream, String)])> {
        let end = self.rec.ends.get(key)?;
        let pieces = self
            .rec
            .pieces
            .get(&(key.clone(), end.attempt))
            .map_or(&[][..], Vec::as_slice);
        Some((end, pieces))
    }

    /// The replay of the next child run the original's pass `key`
    /// started, in order: what a child this replay starts there replays.
    /// `Ok(None)` for a live replay whose original started no more there.
    pub(crate) fn child(
        &self,
        ctx: &crate::node::NodeCtx,
        key: &Key,
    ) -> Result<Option<ReplayOf>, NodeError> {
        let mut next = self
            .children_taken
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let n = next.entry(key.clone()).or_insert(0);
        match self.rec.children.get(key).and_then(|c| c.get(*n)) {
            Some(child) => {
                *n += 1;
                Ok(Some(ReplayOf {
                    run_id: child.clone(),
                    live: self.of.live,
                    tools: self.of.tools,
                }))
            }
            None => {
                self.diverged(ctx, "starts a child run", json!({"kind": "child"}))?;
                Ok(None)
            }
        }
    }

    /// The snapshot the copy of the root starts from.
    pub(crate) fn first_snapshot(&self) -> Option<&str> {
        self.rec.first_snapshot.as_deref()
    }

    /// What a divergence does: in a live replay, a warning in the log and
    /// `Ok` (the caller asks the model or the person); else the node's
    /// failure, which says what the original never asked.
    pub(crate) fn diverged(
        &self,
        ctx: &crate::node::NodeCtx,
        what: &str,
        details: Value,
    ) -> Result<(), NodeError> {
        let message = format!(
            "node `{}`{}: {what}, which replayed run {} never did",
            ctx.node_id,
            match ctx.iteration {
                0 => String::new(),
                i => format!(" (pass {i})"),
            },
            self.of.run_id
        );
        if self.of.live {
            ctx.emit(EventKind::Diagnostic {
                level: cairn_events::Level::Warn,
                source: "replay".into(),
                message: format!("{message}: going on live"),
            });
            return Ok(());
        }
        let mut details = details;
        if let Value::Object(m) = &mut details {
            m.insert("original".into(), json!(self.of.run_id));
            m.insert("nodeId".into(), json!(ctx.node_id.as_str()));
            m.insert("iteration".into(), json!(ctx.iteration));
            m.insert("attempt".into(), json!(ctx.attempt));
        }
        Err(NodeError::fatal(DIVERGED, message).with_details(details))
    }
}
