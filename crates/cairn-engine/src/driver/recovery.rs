//! After a resume: re-enter started groups, close attempts a crash
//! interrupted, and kill what the dead engine left running.

use super::*;

impl Driver {
    /// After a resume: re-enter started groups, close interrupted attempts,
    /// and kill process groups a crashed engine left behind.
    pub(super) fn recover(&mut self) {
        if self.mode == Mode::Drive {
            self.kill_leftovers();
        }
        self.reenter_groups();
        for key in self.plan_keys() {
            self.take_up_attempt(key);
        }
        if self.mode == Mode::Drive {
            self.recover_scorers();
        }
        self.resume_failing();
    }

    /// Enters again the groups the log shows running (their pass, their
    /// list), repeatedly, since a started group mounts more groups.
    fn reenter_groups(&mut self) {
        loop {
            let mut changed = false;
            for inst in self.sched.plan().order.clone() {
                let key = inst.key.clone();
                let is_group = inst.spec.kind.children().is_some();
                if !is_group || self.sched.group_started(&key) {
                    continue;
                }
                if self.status_of(&key) != Some(NodeStatus::Running) {
                    continue;
                }
                if self.enter_group(&key, true).is_ok() {
                    changed = true;
                }
            }
            if !changed {
                break;
            }
            self.rerender();
        }
    }

    /// Takes up the attempt of the leaf `key` that a stop left: a gate
    /// continues, an interrupted attempt is closed and run again, a retry
    /// that was due starts.
    fn take_up_attempt(&mut self, key: Key) {
        // Closing an attempt can end a group's pass and mount another
        // (an `on_interrupt: fail` node that may fail): what went with
        // the old pass needs no recovery.
        let Some(inst) = self.sched.inst(&key).cloned() else {
            return;
        };
        if inst.spec.kind.children().is_some() {
            return;
        }
        let Some(n) = self.state.node(&key.0, key.1).cloned() else {
            return;
        };
        let scope = self.node_scope(&key);
        match n.status {
            NodeStatus::WaitingApproval => {
                self.sched.withdraw_check(&key);
                self.attempts.resume(key.clone(), n.attempt);
                self.sched.requeue(key);
            }
            NodeStatus::Running | NodeStatus::WaitingInput
                if matches!(inst.spec.kind, NodeKind::Approval(_)) && n.decision().is_some() =>
            {
                self.attempts.resume(key.clone(), n.attempt);
                self.sched.requeue(key);
            }
            // Applying commands only: interrupted attempts and retries
            // are the next resume's to close and start.
            _ if self.mode == Mode::Apply => {}
            NodeStatus::Running | NodeStatus::WaitingInput => {
                self.interrupted(&key, &inst, n.attempt);
            }
            NodeStatus::Retrying => {
                if !n.retry_announced {
                    self.emit(
                        scope.with_attempt(n.attempt + 1),
                        EventKind::NodeRetrying { delay_ms: 0 },
                    );
                }
                self.sched.requeue(key);
            }
            _ => {}
        }
    }

    /// A node failed the run, then a stop came before the run's end: the
    /// run that goes on is failing.
    fn resume_failing(&mut self) {
        for key in self.plan_keys() {
            if self
                .sched
                .inst(&key)
                .is_none_or(|i| i.spec.on_failure != OnFailure::Fail)
            {
                continue;
            }
            let Some(n) = self.state.node(&key.0, key.1) else {
                continue;
            };
            if n.status == NodeStatus::Failed {
                let error = n
                    .error()
                    .cloned()
                    .unwrap_or_else(|| ErrorInfo::new("failed", "the node failed"));
                self.fail_run(&key, error);
                break;
            }
        }
    }

    /// Kills what the dead engine left running: the process groups it
    /// recorded (commands and `bash` calls), and, for a crash between a
    /// spawn and its record, every process whose environment names the run.
    pub(super) fn kill_leftovers(&mut self) {
        let backend = self.services.journal.backend().clone();
        let mut killed = 0;
        if let Ok(groups) = backend.processes(&self.run_id) {
            for g in groups {
                // A record may come from another machine sharing the store,
                // or name a pid the kernel has given to someone else since:
                // the group is killed only when its leader is the process
                // that was recorded.
                if crate::is_recorded_leader(&g, &self.run_id, &self.services.store_tag) {
                    // SAFETY: signal 0 only asks whether the group exists.
                    let alive = unsafe { libc::kill(-(g.pgid as libc::pid_t), 0) } == 0;
                    cairn_tools::process::kill_group(g.pgid);
                    killed += usize::from(alive);
                }
                let _ = backend.remove_process(g.id);
            }
        }
        killed += crate::kill_leftovers(&self.run_id, &self.services.store_tag);
        if killed > 0 {
            self.emit(
                Scope::run(),
                EventKind::Diagnostic {
                    level: Level::Info,
                    source: "resume".into(),
                    message: format!(
                        "killed {killed} leftover process(es) of the interrupted session"
                    ),
                },
            );
        }
    }
}
