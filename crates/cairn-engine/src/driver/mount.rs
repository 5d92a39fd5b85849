//! The mounted plan in the log: a render of the plan after every change
//! that can alter it (the scheduler's), committed as a frame when its XML
//! changes, with the instances that appeared (`NodePending`) and the
//! pending ones that went.

use super::scheduler::Frame;
use super::*;

/// Instances a frame adds from which room is made for them at once.
const LARGE_FRAME: usize = 1024;

impl Driver {
    /// Waits for the log, blocking, once a render (or a join's edges) has
    /// appended a backlog's worth of events: a frame that mounts 100,000
    /// instances appends their `NodePending`s in one go, and the round's own
    /// wait comes only after it. The store's writer is a thread of its own, so blocking here
    /// cannot stall it; it costs the wait the round would have made anyway.
    pub(super) fn ease_backlog_now(&mut self) {
        if !self.backlog_full() || self.store_error.is_some() {
            return;
        }
        self.synced_at = self.log.last_seq();
        if let Err(e) = self.log.sync_blocking() {
            self.store_error = Some(e.to_string());
        }
    }

    /// Renders the whole plan again (a run's start, a resume).
    pub(super) fn rerender(&mut self) {
        if let Some(frame) = self.sched.render(&self.wf.name) {
            self.commit_frame(frame);
        }
    }

    /// Mounts again what the shape change of one group instance (its start,
    /// a loop's next pass) changed: that group's subtree.
    pub(super) fn rerender_group(&mut self, group: &Key) {
        if let Some(frame) = self.sched.render_group(&self.wf.name, group) {
            self.commit_frame(frame);
        }
    }

    /// Commits a frame of the plan: the instances that appeared become
    /// pending and join the tallies and the scheduler's counts, the pending
    /// ones that went are cancelled.
    pub(super) fn commit_frame(&mut self, frame: Frame) {
        let Frame {
            event,
            added,
            removed,
        } = frame;
        self.emit(Scope::run(), event);
        // Room for a large frame at once (growing by doubling would leave
        // up to twice what it needs); a small one, such as a loop's next
        // pass, grows the lists as they fill, rather than by exactly its
        // size every time: a loop of 100,000 passes reallocated the run
        // state's list of node passes at nearly every one.
        if added.len() >= LARGE_FRAME {
            self.state.reserve_nodes(added.len());
            self.nodes_ctx.reserve(added.len());
        }
        // Counted once every instance is in its layer's total, so that a
        // layer still open from before a resume is not closed half-counted.
        let mut done_already = Vec::new();
        for key in &added {
            let Some(inst) = self.sched.inst(key).cloned() else {
                continue;
            };
            if self.state.node(&key.0, key.1).is_none() {
                self.emit(
                    scope_of(&inst),
                    EventKind::NodePending {
                        layer_index: Some(inst.layer),
                    },
                );
                self.ease_backlog_now();
            }
            let status = self.status_of(key).unwrap_or(NodeStatus::Pending);
            // A node held for a blocking scorer has not ended for its
            // dependents and its group: its scorer's end ends it.
            let done = status.is_done() && !self.held_by_scorers(key);
            self.tallies.mounted(inst.layer, inst.spec.stage.as_deref());
            let (state, scoring) = (&self.state, &self.scoring);
            self.sched.mounted(&inst, status, done, |dep, insts| {
                state
                    .node(&dep.0, dep.1)
                    .is_some_and(|n| n.status.is_done())
                    && !insts
                        .get(dep)
                        .is_some_and(|i| scoring.holds(i, || state.node(&dep.0, dep.1)))
            });
            if done {
                done_already.push((inst, status));
            }
        }
        for (inst, status) in done_already {
            self.count_done(&inst, status);
        }
        for inst in &removed {
            let key = &inst.key;
            if self.status_of(key) == Some(NodeStatus::Pending) {
                self.emit(
                    scope_of(inst),
                    EventKind::NodeCancelled {
                        reason: Some("unmounted".into()),
                    },
                );
            }
        }
    }
}
