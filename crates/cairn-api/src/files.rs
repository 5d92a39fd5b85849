//! Putting a run's files back: the bodies of `POST /v1/runs/{id}/revert`
//! and `POST /v1/runs/{id}/fork`, and the plan both answer with (the same
//! JSON `cairn revert --json` and `cairn fork --dry-run --json` print from
//! a store).

use cairn_events::RunId;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What putting the files back writes, removes and conflicts with. Paths
/// are text; bytes that are not UTF-8 show as U+FFFD.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FilesPlan {
    /// The snapshot the paths are put back to (empty when there is none).
    pub snapshot: String,
    /// Paths written as the snapshot has them.
    pub write: Vec<String>,
    /// Paths deleted (the snapshot does not have them).
    pub remove: Vec<String>,
    /// Paths the run changed that something else changed since: refused
    /// unless forced (then they are in `write` or `remove` too).
    pub conflicts: Vec<FileConflict>,
    /// Whether conflicts are overwritten.
    pub force: bool,
    /// Attempts whose last changes are not known: left as they are.
    pub unknown: Vec<String>,
}

impl FilesPlan {
    /// Whether the plan may not be carried out: conflicts, not forced.
    pub fn refused(&self) -> bool {
        !self.conflicts.is_empty() && !self.force
    }

    /// The plan for a person, one path a line.
    pub fn lines(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        out.extend(self.write.iter().map(|p| format!("write   {p}")));
        out.extend(self.remove.iter().map(|p| format!("remove  {p}")));
        let tag = if self.force { "forced  " } else { "conflict" };
        out.extend(
            self.conflicts
                .iter()
                .map(|c| format!("{tag} {}: {}", c.path, c.why)),
        );
        out.extend(self.unknown.iter().map(|u| format!("unknown {u}")));
        out
    }
}

/// A path something besides the run changed since the run did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileConflict {
    /// The path, below the run's root.
    pub path: String,
    /// What changed it, as far as can be told.
    pub why: String,
}

/// `POST /v1/runs/{id}/revert`: put the paths the run changed since an
/// attempt of a node started back as they were then.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RevertBody {
    /// The node (its path, for a node inside a group).
    pub node: String,
    /// The pass; the latest with a snapshot when left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iteration: Option<u32>,
    /// The attempt; the first with a snapshot when left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    /// Overwrite paths something else changed since the run did.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub force: bool,
    /// The plan only: nothing is written, to the files or the log.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
}

/// What a revert did (200), or would do (a dry run), or the plan it
/// refused (409 `files_conflict`, in the error's `details`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Reverted {
    /// The plan; its `snapshot` is the one restored.
    #[serde(flatten)]
    pub plan: FilesPlan,
    /// The node whose attempt's snapshot it is.
    pub node: String,
    /// Its pass.
    pub iteration: u32,
    /// Its attempt.
    pub attempt: u32,
    /// Whether only the plan was asked for.
    pub dry_run: bool,
    /// Whether the files were touched.
    pub applied: bool,
    /// A snapshot of the files as they were before this revert: reverting
    /// to it undoes it.
    pub before: String,
    /// Files and links written back.
    pub written: u64,
    /// Files, links and folders deleted.
    pub removed: u64,
    /// A revert a stopped process had left half-way, finished first (its
    /// node); `null` when there was none.
    pub finished_open: Option<String>,
    /// Why the restore failed part-way (the files are as far as it got;
    /// reverting again finishes it); `null` when it did not.
    pub error: Option<String>,
}

/// `POST /v1/runs/{id}/fork`: a new run that starts from a point of this
/// one's log, with the files put back as they were there; the server
/// drives it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ForkBody {
    /// The point: a seq, or a node (`node`, `node@pass`), as `cairn fork
    /// --at` takes it.
    pub at: String,
    /// The fork's input instead of the run's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Value>,
    /// A workflow of the server's folder, by name, to run instead of the
    /// run's own (adopted as a reload at the point).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workflow: Option<String>,
    /// The fork's id; one is made when left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    /// Overwrite paths something else changed since the run did.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub force: bool,
    /// The plan only: no files touched, no run made.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
}

/// What a fork made (201), or would make (a dry run, 200), or the plan it
/// refused (409 `files_conflict`, in the error's `details`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Forked {
    /// The new run, driven by the server; `null` when none was made.
    pub run_id: Option<RunId>,
    /// The run forked.
    pub from: RunId,
    /// The last seq of `from` the fork's log copies.
    pub seq: u64,
    /// The fork's own events come after this seq of its log (those up to
    /// it are copied from `from`'s); 0 when none was made.
    pub starts_after: u64,
    /// The snapshot the files are put back to; `null` when the log has
    /// none at or before the point (the files are left as they are).
    pub snapshot: Option<String>,
    /// Whether the fork was made.
    pub made: bool,
    /// Whether only the plan was asked for.
    pub dry_run: bool,
    /// Files and links written back.
    pub written: u64,
    /// Files, links and folders deleted.
    pub removed: u64,
    /// What putting the files back writes, removes and conflicts with.
    pub plan: FilesPlan,
}
