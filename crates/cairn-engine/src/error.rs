//! What the engine refuses or fails to do, in its own terms: which run,
//! node or question, in what state, and why. The edges choose the rest:
//! the server's statuses and codes (`cairn-server`'s `error.rs`) and the
//! CLI's exit codes (`cairn-cli`'s `main.rs`), each with an exhaustive
//! match, so a new variant must be placed in both. The `Display` texts are
//! the messages people read when an edge adds nothing of its own.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use cairn_events::{ErrorInfo, InvalidRunId, NodePath, NodeStatus, RunId, RunStatus, Seq};
use cairn_snapshot::SnapshotError;
use cairn_store::StoreError;
use cairn_workflow::{InputError, WorkflowError};

use crate::Engine;

/// Why the engine refused or could not do something.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The workflow file is invalid.
    #[error("{0}")]
    Workflow(#[from] WorkflowError),
    /// The run's input breaks the workflow's input schema.
    #[error("{0}")]
    Input(#[from] InputError),
    /// The store failed, or refused in its own terms (a run id taken, a
    /// lease held, ...).
    #[error("{0}")]
    Store(#[from] StoreError),
    /// The engine is shutting down and takes no new runs.
    #[error("the engine is shutting down and takes no new runs")]
    ShuttingDown,
    /// A text given as a run id cannot name a run.
    #[error("{0}")]
    InvalidRunId(#[from] InvalidRunId),
    /// No workflow file by this path, nor by this name in the folder of
    /// workflows.
    #[error("no workflow `{name}`: not a file{}", in_dir(.dir))]
    WorkflowNotFound {
        /// The path or name asked for.
        name: String,
        /// The folder of workflows looked in, if any.
        dir: Option<PathBuf>,
    },
    /// No run with this id in the store.
    #[error("no run `{run}` in this store")]
    RunNotFound {
        /// The run asked for.
        run: RunId,
    },
    /// The run never had this node.
    #[error("run `{run}` has no node `{node}`")]
    NodeNotFound {
        /// The run.
        run: RunId,
        /// The node asked for.
        node: NodePath,
    },
    /// A decision for a node that is not waiting at a gate.
    #[error("node `{node}` of run `{run}` is not waiting for approval{}", it_is(.status))]
    NodeNotWaiting {
        /// The run.
        run: RunId,
        /// The node.
        node: NodePath,
        /// Where the node stands, when the run's state is known.
        status: Option<NodeStatus>,
    },
    /// An answer to a question the run did not ask (or not yet).
    #[error("run `{run}` has no open question `{request}`")]
    QuestionNotFound {
        /// The run.
        run: RunId,
        /// The question's request id.
        request: String,
    },
    /// A secret the workflow declares could not be read: the run does not
    /// start (or resume).
    #[error("secret `{name}` ({from}) cannot be read: {reason}")]
    Secret {
        /// The secret's name.
        name: String,
        /// Where it comes from, as the workflow says.
        from: String,
        /// Why it could not be read (never its value).
        reason: String,
    },
    /// A second answer to a question.
    #[error("question `{request}` of run `{run}` was answered already")]
    QuestionAnswered {
        /// The run.
        run: RunId,
        /// The question's request id.
        request: String,
    },
    /// An answer that breaks its question's schema; the question stays open.
    #[error("the answer to `{request}` does not match its schema: {reason}")]
    AnswerInvalid {
        /// The question's request id.
        request: String,
        /// What the schema check said.
        reason: String,
    },
    /// A command to a run that has ended.
    #[error("run `{run}` has already ended ({})", .status.as_str())]
    RunEnded {
        /// The run.
        run: RunId,
        /// How it ended.
        status: RunStatus,
    },
    /// The run ended after the command was sent and before it was applied.
    #[error("run `{run}` ended before the {command} was applied")]
    RunEndedFirst {
        /// The run.
        run: RunId,
        /// The command's name (`approve`, `cancel`, ...).
        command: &'static str,
    },
    /// The process driving the run did not take the command in time; it
    /// stays in the run's inbox.
    #[error(
        "the process driving run `{run}` did not take the {command} within {} s; \
         it stays in the run's inbox and is applied when the run next runs",
        .waited.as_secs()
    )]
    CommandNotTaken {
        /// The run.
        run: RunId,
        /// The command's name.
        command: &'static str,
        /// How long the sender waited.
        waited: Duration,
    },
    /// The run's driver refused the command; the reason is the one its
    /// log records (an inbox `Diagnostic`), which a sender in another
    /// process reads back as text.
    #[error("{reason}")]
    CommandRefused {
        /// The run.
        run: RunId,
        /// The command's name.
        command: &'static str,
        /// The refusal as the run's log says it.
        reason: String,
    },
    /// `cairn hijack` of a node that cannot be taken over now.
    #[error("node `{node}` cannot be hijacked: {why}")]
    NotHijackable {
        /// The node.
        node: NodePath,
        /// Why not.
        why: HijackRefusal,
    },
    /// Another process drives the run (holds its lease), so what was asked
    /// cannot be done now.
    #[error("run `{run}` is being driven by another process{}{}", holder_of(.holder), .wanted.advice())]
    LeaseHeld {
        /// The run.
        run: RunId,
        /// Who holds the lease, as the store names it (`pid N on host`).
        holder: Option<String>,
        /// What needed the lease.
        wanted: Wanted,
    },
    /// A resume of a run that cannot go on.
    #[error("run `{run}` {}", resume_refusal(.run, .reason))]
    ResumeRefused {
        /// The run.
        run: RunId,
        /// Why.
        reason: ResumeRefusal,
    },
    /// A revert whose request does not fit the run (see [`RevertRefusal`]).
    #[error("{reason}")]
    RevertRefused {
        /// Why.
        reason: RevertRefusal,
    },
    /// A fork whose request does not fit the run (see [`ForkRefusal`]).
    #[error("{reason}")]
    ForkRefused {
        /// Why.
        reason: ForkRefusal,
    },
    /// Reverting or forking files needs workspace snapshots, and this
    /// engine keeps none.
    /// A replay that cannot be made: its original is no run to replay, or
    /// its copy of the root cannot be set up.
    #[error("{reason}")]
    ReplayRefused {
        /// Why.
        reason: String,
    },
    #[error("this store keeps no workspace snapshots (give the engine a snapshot folder)")]
    NoSnapshots,
    /// The snapshot repository could not be opened.
    #[error("{detail}")]
    SnapshotsUnavailable {
        /// What opening it said.
        detail: String,
    },
    /// The workflow's sandbox root could not be set up to put files back.
    #[error("{}", .0.message)]
    Workspace(ErrorInfo),
    /// Planning, restoring or pruning snapshots of the files failed.
    #[error("{task}: {source}")]
    Files {
        /// What was being done.
        task: FilesTask,
        /// What the snapshot repository said.
        #[source]
        source: SnapshotError,
    },
    /// What the store holds of a run does not match what its log recorded
    /// (the stored workflow was changed after the run started), so the run
    /// is not resumed.
    #[error("run `{run}`: {problem}")]
    Integrity {
        /// The run.
        run: RunId,
        /// What does not match.
        problem: IntegrityProblem,
    },
}

impl EngineError {
    /// The error `make` builds for the run `run`.
    pub(crate) fn for_run(run: &RunId, make: impl FnOnce(RunId) -> EngineError) -> EngineError {
        make(run.clone())
    }

    /// No run `run` in the store.
    pub(crate) fn run_not_found(run: &RunId) -> EngineError {
        Self::for_run(run, |run| EngineError::RunNotFound { run })
    }
}

impl Engine {
    /// The refusal of `wanted` on `run_id` while another process holds
    /// the run's lease, naming that process when the store knows it.
    pub(crate) async fn lease_held(&self, run_id: &RunId, wanted: Wanted) -> EngineError {
        let id = run_id.clone();
        let holder = self
            .blocking(move |e| e.backend().lease_holder(&id).ok().flatten())
            .await
            .map(|h| h.holder);
        EngineError::for_run(run_id, |run| EngineError::LeaseHeld {
            run,
            holder,
            wanted,
        })
    }
}

/// What needed a run's lease that another process holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wanted {
    /// Driving the run again (`cairn resume`).
    Resume,
    /// Putting files back to a snapshot (`cairn revert`).
    Revert,
    /// Putting files back for a fork of the run (`cairn fork`).
    Fork,
}

impl Wanted {
    /// What the person can do about it.
    fn advice(self) -> &'static str {
        match self {
            Wanted::Resume => {
                "; cancel it or wait for it to stop (on PostgreSQL, the lease of a process \
                 that died on another machine lasts until it expires: --lease-ttl, 5s by default)"
            }
            Wanted::Revert => {
                ", whose nodes use the files; cancel it or wait for it to stop, then revert"
            }
            Wanted::Fork => {
                ", whose nodes use the files the fork would put back; wait for it to stop \
                 or cancel it, then fork"
            }
        }
    }
}

/// Why a resume has nothing to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResumeRefusal {
    /// The run ended (finished, failed or cancelled).
    Ended(RunStatus),
    /// A fork that was cut short before its log was written: it is made
    /// again by `cairn fork`, not resumed.
    ForkUnfinished,
}

/// Why `cairn hijack` cannot take a node over now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HijackRefusal {
    /// An agent run by an external CLI that has no session to hand over.
    NoSession,
    /// No process drives the run: the command was applied by a sender.
    NotDriven,
    /// An agent that is not running.
    NotRunning,
    /// Not an agent node.
    NotAnAgent,
    /// No such node in the mounted plan.
    NotMounted,
}

impl fmt::Display for HijackRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            HijackRefusal::NoSession => {
                "its engine's CLI has no session Cairn can hand to a person"
            }
            HijackRefusal::NotDriven => {
                "no process drives the run (`cairn resume` it, then hijack)"
            }
            HijackRefusal::NotRunning => "it is not running",
            HijackRefusal::NotAnAgent => "it is not an agent",
            HijackRefusal::NotMounted => "it is not mounted",
        })
    }
}

/// Why a revert's request does not fit the run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RevertRefusal {
    /// The node never started in the run.
    #[error("run `{run}` has no node `{node}` that started")]
    NodeNeverStarted {
        /// The run.
        run: RunId,
        /// The node asked for.
        node: NodePath,
    },
    /// The node has no such pass.
    #[error("node `{node}` has no pass {iteration}")]
    NoSuchPass {
        /// The node.
        node: NodePath,
        /// The pass asked for.
        iteration: u32,
    },
    /// No pass of the node has a snapshot.
    #[error(
        "node `{node}` has no workspace snapshot: only attempts of nodes that can change \
         files (agents with tools, commands, write/edit/bash tools) get one"
    )]
    NodeWithoutSnapshot {
        /// The node.
        node: NodePath,
    },
    /// The pass has no snapshot.
    #[error("node `{node}` pass {iteration} has no workspace snapshot")]
    PassWithoutSnapshot {
        /// The node.
        node: NodePath,
        /// The pass.
        iteration: u32,
    },
    /// The attempt asked for has no snapshot.
    #[error("node `{node}` pass {iteration} has no snapshot before attempt {attempt} (attempts with one: {})", attempts(.have))]
    NoSnapshotBeforeAttempt {
        /// The node.
        node: NodePath,
        /// The pass.
        iteration: u32,
        /// The attempt asked for.
        attempt: u32,
        /// The attempts of the pass that have one.
        have: Vec<u32>,
    },
    /// A dry run while a revert a stopped process left half-way waits to
    /// be finished (which a dry run may not do).
    #[error(
        "a revert of node `{node}` that a stopped process left half-way would be \
         finished first; revert without --dry-run to finish it"
    )]
    OpenRevert {
        /// The node of the open revert.
        node: NodePath,
    },
}

/// Why a fork's request does not fit the run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ForkRefusal {
    /// A point before the log's first event.
    #[error("--at: seqs start at 1")]
    SeqZero,
    /// A point past the log's end.
    #[error("--at {at}: the run's log ends at seq {last}")]
    PastEnd {
        /// The point asked for.
        at: Seq,
        /// The log's last seq.
        last: Seq,
    },
    /// A node point for a node that never started.
    #[error("--at {node}: no node `{node}` started in this run")]
    NodeNeverStarted {
        /// The node asked for.
        node: NodePath,
    },
    /// A point after the run's end.
    #[error("--at {at}: the run ended at seq {ended}; fork at an earlier point")]
    AfterEnd {
        /// The point.
        at: Seq,
        /// The seq of the run's end.
        ended: Seq,
    },
    /// A point after the run was asked to cancel.
    #[error("--at {at}: the run was asked to cancel at seq {cancel}; fork at an earlier point")]
    AfterCancel {
        /// The point.
        at: Seq,
        /// The seq of `RunCancelRequested`.
        cancel: Seq,
    },
    /// A point inside a revert of the files.
    #[error("--at {at}: a revert of the files was under way there; fork at another point")]
    InRevert {
        /// The point.
        at: Seq,
    },
    /// The fork's id names a run that exists (and is not a fork cut short).
    #[error("a run `{run}` already exists in this store; pick another --run-id")]
    RunIdTaken {
        /// The id asked for.
        run: RunId,
    },
}

/// What was being done to the files when the snapshot repository failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FilesTask {
    /// Planning a revert.
    RevertPlan,
    /// Putting the files back for a fork.
    ForkRestore,
    /// Pruning unused snapshots (`cairn gc`).
    Prune,
    /// Copying the original's root for a replay.
    ReplayCopy,
}

impl fmt::Display for FilesTask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FilesTask::RevertPlan => "the revert's plan",
            FilesTask::ReplayCopy => "the replay's copy of the root",
            FilesTask::ForkRestore => "the files cannot be put back",
            FilesTask::Prune => "pruning the workspace snapshots",
        })
    }
}

/// What the store holds of a run that does not match what its log
/// recorded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IntegrityProblem {
    /// The stored source of the run's first generation hashes otherwise
    /// than its `RunStarted` recorded.
    #[error(
        "the stored workflow hashes to {stored} but the run started with {recorded}; {CHANGED}"
    )]
    SourceChanged {
        /// The stored source's hash.
        stored: String,
        /// The hash the log recorded.
        recorded: String,
    },
    /// The log names a generation whose text the store does not hold.
    #[error("its log says it runs generation {generation} of its workflow, but the store holds no text for that generation, so the run is not resumed")]
    GenerationMissing {
        /// The generation.
        generation: u64,
    },
    /// A generation's stored text hashes otherwise than recorded.
    #[error("generation {generation} of its workflow hashes to {stored} but was recorded as {recorded}; {CHANGED}")]
    GenerationChanged {
        /// The generation.
        generation: u64,
        /// The stored text's hash.
        stored: String,
        /// The hash recorded.
        recorded: String,
    },
    /// The files pinned for a generation belong to another workflow.
    #[error("the files pinned for generation {generation} belong to a workflow that hashes to {pinned_for}, not {workflow}; {CHANGED}")]
    PinnedForAnother {
        /// The generation.
        generation: u64,
        /// The workflow hash stored with the pinned files.
        pinned_for: String,
        /// The generation's workflow hash.
        workflow: String,
    },
    /// A pinned file's text does not hash to what was recorded.
    #[error("the pinned text of {path} does not hash to what was recorded; {CHANGED}")]
    PinnedTextChanged {
        /// The pinned file's path (absolute, as the workflow's reference
        /// resolved).
        path: String,
    },
}

/// The end of every message about a changed store.
const CHANGED: &str = "the store was changed outside Cairn, so the run is not resumed";

fn in_dir(dir: &Option<PathBuf>) -> String {
    dir.as_ref()
        .map(|d| format!(", nor a workflow name in {}", d.display()))
        .unwrap_or_default()
}

fn it_is(status: &Option<NodeStatus>) -> String {
    status
        .map(|s| format!(" (it is {})", s.as_str()))
        .unwrap_or_default()
}

fn holder_of(holder: &Option<String>) -> String {
    holder
        .as_ref()
        .map(|h| format!(" ({h})"))
        .unwrap_or_default()
}

fn resume_refusal(run: &RunId, reason: &ResumeRefusal) -> String {
    match reason {
        ResumeRefusal::Ended(status) => format!(
            "has already {}; there is nothing to resume",
            match status {
                RunStatus::Finished => "finished",
                RunStatus::Failed => "failed",
                _ => "been cancelled",
            }
        ),
        ResumeRefusal::ForkUnfinished => format!(
            "is a fork that was cut short before its log was written; \
             make it again with `cairn fork ... --run-id {run}`"
        ),
    }
}

fn attempts(have: &[u32]) -> String {
    if have.is_empty() {
        return "none".into();
    }
    have.iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(id: &str) -> RunId {
        RunId::parse(id).unwrap()
    }

    #[test]
    fn messages_name_what_they_are_about() {
        let cases: Vec<(EngineError, &str)> = vec![
            (
                EngineError::run_not_found(&run("r1")),
                "no run `r1` in this store",
            ),
            (
                EngineError::NodeNotWaiting {
                    run: run("r"),
                    node: "gate".into(),
                    status: Some(NodeStatus::Finished),
                },
                "node `gate` of run `r` is not waiting for approval (it is finished)",
            ),
            (
                EngineError::LeaseHeld {
                    run: run("r"),
                    holder: Some("pid 7 on h".into()),
                    wanted: Wanted::Revert,
                },
                "run `r` is being driven by another process (pid 7 on h), whose nodes use the files; \
                 cancel it or wait for it to stop, then revert",
            ),
            (
                EngineError::ResumeRefused {
                    run: run("f"),
                    reason: ResumeRefusal::ForkUnfinished,
                },
                "run `f` is a fork that was cut short before its log was written; \
                 make it again with `cairn fork ... --run-id f`",
            ),
            (
                EngineError::ResumeRefused {
                    run: run("r"),
                    reason: ResumeRefusal::Ended(RunStatus::Cancelled),
                },
                "run `r` has already been cancelled; there is nothing to resume",
            ),
            (
                EngineError::RevertRefused {
                    reason: RevertRefusal::NoSnapshotBeforeAttempt {
                        node: "c".into(),
                        iteration: 0,
                        attempt: 2,
                        have: vec![],
                    },
                },
                "node `c` pass 0 has no snapshot before attempt 2 (attempts with one: none)",
            ),
            (
                EngineError::Integrity {
                    run: run("r"),
                    problem: IntegrityProblem::PinnedTextChanged {
                        path: "s.sh".into(),
                    },
                },
                "run `r`: the pinned text of s.sh does not hash to what was recorded; \
                 the store was changed outside Cairn, so the run is not resumed",
            ),
        ];
        for (e, says) in cases {
            assert_eq!(e.to_string(), says);
        }
    }
}
