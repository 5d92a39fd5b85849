//! The mounted plan in the log: a render of the plan after every change
//! that can alter it, committed as a frame when its XML changes, with the
//! instances that appeared (`NodePending`) and the pending ones that went.

use super::*;

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
        let plan = plan::render(&self.tree, &self.wf.name, &self.shape, &mut self.paths);
        if plan.xml_hash == self.plan.xml_hash {
            return;
        }
        let added: Vec<Key> = plan
            .order
            .iter()
            .filter(|i| !self.plan.insts.contains_key(&i.key))
            .map(|i| i.key.clone())
            .collect();
        let old = std::mem::replace(&mut self.plan, plan);
        let removed: Vec<Arc<Inst>> = old
            .order
            .iter()
            .filter(|i| !self.plan.insts.contains_key(&i.key))
            .cloned()
            .collect();
        drop(old);
        self.commit_plan(added, removed);
    }

    /// Mounts again what the shape change of one group instance (its start,
    /// a loop's next pass) changed: that group's subtree.
    pub(super) fn rerender_group(&mut self, group: &Key) {
        let before = std::mem::take(&mut self.plan.xml_hash);
        let change = plan::rerender_group(
            &self.tree,
            &self.wf.name,
            &self.shape,
            &mut self.paths,
            &mut self.plan,
            group,
        );
        let Some(change) = change else {
            self.plan.xml_hash = before;
            return self.rerender();
        };
        if self.plan.xml_hash == before {
            return;
        }
        self.commit_plan(change.added, change.removed);
    }

    /// Commits the plan in `self.plan` as a frame: the instances that
    /// appeared become pending and join the tallies and the dependency
    /// counts, the pending ones that went are cancelled.
    pub(super) fn commit_plan(&mut self, added: Vec<Key>, removed: Vec<Arc<Inst>>) {
        self.frame_no += 1;
        self.emit(
            Scope::run(),
            EventKind::FrameCommitted {
                frame_no: self.frame_no,
                xml_hash: self.plan.xml_hash.clone(),
                mounted: self.plan.order.len() as u64,
            },
        );
        self.state.reserve_nodes(added.len());
        self.nodes_ctx.reserve(added.len());
        // Counted once every instance is in its layer's total, so that a
        // layer still open from before a resume is not closed half-counted.
        let mut done_already = Vec::new();
        for key in &added {
            let inst = self.plan.insts[key].clone();
            if self.state.node(&key.0, key.1).is_none() {
                let scope = self.node_scope(key);
                self.emit(
                    scope,
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
            let mut unmet = 0;
            for dep in &inst.needs {
                // A need that has ended already has nothing left to tell.
                if self.status_of(dep).is_some_and(|s| s.is_done()) && !self.held_by_scorers(dep) {
                    continue;
                }
                unmet += 1;
                let deps = self.dependents.entry(dep.clone()).or_default();
                // Most nodes have one dependent: no room for four.
                deps.reserve_exact(1);
                deps.push(key.clone());
            }
            if unmet > 0 {
                self.unmet.insert(key.clone(), unmet);
            }
            if let Some(parent) = &inst.parent {
                if !done {
                    *self.group_remaining.entry(parent.clone()).or_default() += 1;
                }
            }
            if done {
                done_already.push((inst, status));
            } else if status == NodeStatus::Pending && unmet == 0 {
                // One with unmet needs is queued when the last of them ends.
                self.check_queue.push_back(key.clone());
            }
        }
        for (inst, status) in done_already {
            self.count_done(&inst, status);
        }
        for inst in &removed {
            let key = &inst.key;
            if self.status_of(key) == Some(NodeStatus::Pending) {
                let scope = Scope::node(key.0.clone(), key.1).with_chapter(inst.spec.stage.clone());
                self.emit(
                    scope,
                    EventKind::NodeCancelled {
                        reason: Some("unmounted".into()),
                    },
                );
            }
        }
    }
}
