//! Hot reload, the driver's side: a change to a watched run's files
//! (`crate::reload`) is logged as `WorkflowReloadDetected`, then as exactly
//! one of `WorkflowReloaded` (the run takes the new definition as its next
//! generation), `WorkflowReloadFailed` (it does not validate) or
//! `WorkflowReloadUnsafe` (it cannot apply to this run); the last two leave
//! the run on the definition it has. A change that leaves the workflow's
//! text as the run has it (a referenced file changed, or the file changed
//! back) is no new generation: a `Diagnostic` says so.
//!
//! A new generation's text is stored before its `WorkflowReloaded` is
//! appended, and the event is durable before anything starts with the new
//! definition: the event is the commit point, and a crash before it leaves
//! the run on the previous generation.

use super::*;
use crate::reload::{safety, Note, Reload};
use cairn_store::GenerationRecord;

/// Waits for the watcher's next note; never resolves once the watcher is
/// gone (or for a run not watched).
pub(super) async fn next_note(notes: &mut Option<mpsc::UnboundedReceiver<Note>>) -> Note {
    if let Some(rx) = notes {
        if let Some(n) = rx.recv().await {
            return n;
        }
        *notes = None;
    }
    std::future::pending().await
}

impl Driver {
    pub(super) async fn on_note(&mut self, note: Note) {
        match note {
            Note::Warn(message) => self.warn("reload", message),
            Note::Reload(r) => self.on_reload(*r).await,
        }
    }

    async fn on_reload(&mut self, r: Reload) {
        let Reload {
            changed_files,
            loaded,
        } = r;
        self.emit(
            Scope::run(),
            EventKind::WorkflowReloadDetected {
                changed_files: changed_files.clone(),
            },
        );
        let mut wf = match loaded {
            Ok(wf) => wf,
            Err(error) => {
                self.emit(
                    Scope::run(),
                    EventKind::WorkflowReloadFailed {
                        error,
                        changed_files,
                    },
                );
                return;
            }
        };
        if wf.hash == self.wf.hash && wf.pinned == self.wf.pinned {
            self.emit(
                Scope::run(),
                EventKind::Diagnostic {
                    level: Level::Info,
                    source: "reload".into(),
                    message: format!(
                        "{}: the workflow's text is the one the run has (generation {}); \
                         nothing to reload",
                        changed_files.join(", "),
                        self.state.generation
                    ),
                },
            );
            return;
        }
        if let Some(reason) = self.reload_blocker(&wf) {
            self.emit(
                Scope::run(),
                EventKind::WorkflowReloadUnsafe {
                    reason,
                    changed_files,
                },
            );
            return;
        }
        let generation = self.state.generation + 1;
        let rec = GenerationRecord {
            run_id: self.run_id.clone(),
            generation,
            workflow_hash: wf.hash.clone(),
            // The driver needs only what was parsed from it, as at a start.
            workflow_source: std::mem::take(&mut wf.source),
            files: crate::reload::pin::pinned_files(&wf),
            created_ms: crate::node::now_ms(),
        };
        let backend = self.services.journal.backend().clone();
        let stored = tokio::task::spawn_blocking(move || backend.put_generation(&rec)).await;
        let stored = match stored {
            Ok(r) => r.map_err(|e| e.to_string()),
            Err(e) => Err(format!("the store's work stopped: {e}")),
        };
        if let Err(e) = stored {
            self.emit(
                Scope::run(),
                EventKind::WorkflowReloadFailed {
                    error: ErrorInfo::new(
                        "store",
                        format!("generation {generation} could not be stored: {e}"),
                    ),
                    changed_files,
                },
            );
            return;
        }
        self.emit(
            Scope::run(),
            EventKind::WorkflowReloaded {
                generation,
                changed_files,
            },
        );
        if let Err(e) = self.log.sync().await {
            // The run fails as on any store error; nothing started with
            // the new definition.
            self.store_error = Some(e.to_string());
            return;
        }
        self.adopt(Arc::new(wf));
    }

    /// Why the run cannot take `new` now, if it cannot.
    fn reload_blocker(&self, new: &Workflow) -> Option<String> {
        if let Some(why) = self.ending.reload_blocker() {
            return Some(why);
        }
        let mut active = Vec::new();
        for n in &self.state.nodes {
            let doing = match n.status {
                NodeStatus::Running => "is running",
                NodeStatus::Retrying => "waits to be retried",
                NodeStatus::WaitingApproval => "is waiting for approval",
                NodeStatus::WaitingInput => "is waiting for an answer",
                NodeStatus::Finished
                    if self.scoring.is_holding(&(n.node_id.clone(), n.iteration))
                        || n.scores().iter().any(|s| s.status == "running") =>
                {
                    "has scorers running"
                }
                _ => continue,
            };
            active.push(safety::Active {
                path: n.node_id.to_string(),
                doing,
            });
        }
        let in_use = safety::InUse {
            mcp_started: !self.mcp.is_idle(),
        };
        safety::unsafe_reason(&self.wf, new, &active, in_use)
    }

    /// Makes `wf` the run's definition and mounts the plan again from it,
    /// as a resume mounts it: groups in progress keep their pass and list
    /// (their definitions are unchanged, or the reload was unsafe), groups
    /// that ended are mounted without their members (a new body must not
    /// mount under them), nodes that never started take their new
    /// definition, new ones become pending, and pending ones that went are
    /// cancelled as `unmounted`. Always a new frame: the plan's definitions
    /// changed even when its shape did not.
    fn adopt(&mut self, wf: Arc<Workflow>) {
        if self.wf.mcp_servers != wf.mcp_servers {
            // Idle (no server started), or the reload was unsafe.
            self.mcp = Arc::new(crate::mcp::McpPool::new(
                wf.clone(),
                self.services.clone(),
                self.log.clone(),
            ));
        }
        self.wf = wf;
        // Keyed by the address of a spec of the old definition.
        self.templated.clear();
        // A definition that reads `nodes` where the old one did not.
        self.nodes_ctx.follow(&self.wf, &self.state);
        // What was derived from the old plan is derived again from the new
        // one by its frame: needs, group members, layer and chapter totals,
        // and which pending nodes to look at.
        self.tallies.recount();
        let state = &self.state;
        let frame = self
            .sched
            .remount(SpecTree::new(&self.wf), &self.wf.name, |k| {
                state.node(&k.0, k.1).is_none_or(|n| n.status.is_done())
            });
        self.commit_frame(frame);
        // A run that waited for a person has work again when the new
        // definition gave it nodes that can start; it says it waits again
        // once they ended.
        if self.sched.has_checks() {
            if let Some(kind) = self.gates.back_to_running() {
                self.emit(Scope::run(), kind);
            }
        }
    }
}
