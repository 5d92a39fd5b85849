//! People and other processes: approvals a running node asks for, and the
//! commands of the run's inbox (approve, deny, answer, cancel).

use super::*;

impl Driver {
    pub(super) fn on_ask(&mut self, a: Ask) {
        match a {
            Ask::Child { key, status } => {
                if !self.running.contains_key(&key) {
                    return;
                }
                match status {
                    Some(s) => {
                        self.child_waits.insert(key, s);
                    }
                    None => {
                        if self.child_waits.remove(&key).is_some()
                            && self.announced != RunStatus::Running
                        {
                            self.announced = RunStatus::Running;
                            self.emit(
                                Scope::run(),
                                EventKind::RunStatusChanged {
                                    status: RunStatus::Running,
                                },
                            );
                        }
                    }
                }
            }
            Ask::Approval {
                key,
                message,
                reply,
            } => {
                // The attempt may have been cancelled, and its end handled,
                // before its question came through: a gate opened now would
                // follow the node's terminal event.
                if !self.running.contains_key(&key) {
                    return;
                }
                let node = self.state.node(&key.0, key.1).cloned();
                if let Some(d) = node.as_ref().and_then(|n| n.decision().cloned()) {
                    let _ = reply.send(Decision {
                        approved: d.approved,
                        note: d.note,
                        by: d.by,
                    });
                    return;
                }
                // A graceful cancel lets running work finish but stops the
                // gates waiting for a person; a gate that asks only now
                // (its attempt was spawned before the cancel was applied)
                // stops the same way instead of waiting for ever.
                if matches!(self.cancelling, Some((CancelMechanism::Graceful, _))) {
                    if let Some(t) = self.running.get(&key) {
                        t.cancel();
                    }
                    self.waiting.insert(key, reply);
                    return;
                }
                if node.map(|n| n.status) != Some(NodeStatus::WaitingApproval) {
                    let scope = self.node_scope(&key);
                    self.emit(scope.clone(), EventKind::NodeWaitingApproval {});
                    self.emit(scope, EventKind::ApprovalRequested { message });
                }
                self.waiting.insert(key, reply);
            }
            Ask::Input {
                key,
                request_id,
                prompt,
                schema,
                reply,
            } => {
                if !self.running.contains_key(&key) {
                    return;
                }
                // Answered while the run was down, or before this attempt
                // asked again: the answer in the log is the answer.
                let asked = self.state.questions.get(&request_id);
                if let Some(answer) = asked.and_then(|q| q.answer.clone()) {
                    let _ = reply.send(answer);
                    return;
                }
                if matches!(self.cancelling, Some((CancelMechanism::Graceful, _))) {
                    if let Some(t) = self.running.get(&key) {
                        t.cancel();
                    }
                    return;
                }
                let waiting_already = self
                    .state
                    .node(&key.0, key.1)
                    .is_some_and(|n| n.status == NodeStatus::WaitingInput);
                if asked.is_some() && !waiting_already {
                    // Asked by an attempt a crash cut short: this one waits
                    // for the same answer.
                    let scope = self.node_scope(&key);
                    self.emit(
                        scope,
                        EventKind::NodeWaitingInput {
                            request_id: request_id.clone(),
                        },
                    );
                } else if asked.is_none() {
                    let scope = self.node_scope(&key);
                    self.emit(
                        scope.clone(),
                        EventKind::InputRequested {
                            request_id: request_id.clone(),
                            prompt,
                            schema,
                        },
                    );
                    self.emit(
                        scope,
                        EventKind::NodeWaitingInput {
                            request_id: request_id.clone(),
                        },
                    );
                }
                self.asking.insert(request_id, (key, reply));
            }
        }
    }

    /// Records the answer to an open question, once it matches the
    /// question's schema, and hands it to the attempt that asked.
    pub(super) async fn answer(
        &mut self,
        request_id: &str,
        answer: Value,
        by: Option<String>,
    ) -> Result<(), EngineError> {
        let q = self.state.questions.get(request_id).ok_or_else(|| {
            EngineError::NotFound(format!(
                "run `{}` has no question `{request_id}`",
                self.run_id
            ))
        })?;
        if q.answer.is_some() {
            return Err(EngineError::Conflict(format!(
                "question `{request_id}` of run `{}` was answered already",
                self.run_id
            )));
        }
        if let Some(problem) = q
            .schema
            .as_ref()
            .and_then(|s| crate::schema_problem(s, &answer))
        {
            return Err(EngineError::BadRequest(format!(
                "the answer to `{request_id}` does not match its schema: {problem}"
            )));
        }
        let key = (q.node_id.clone(), q.iteration);
        let scope = self.node_scope(&key);
        self.emit(
            scope,
            EventKind::InputReceived {
                request_id: request_id.to_string(),
                answer: answer.clone(),
                answered_by: by,
            },
        );
        if self.announced != RunStatus::Running {
            self.announced = RunStatus::Running;
            self.emit(
                Scope::run(),
                EventKind::RunStatusChanged {
                    status: RunStatus::Running,
                },
            );
        }
        self.log.sync().await?;
        if let Some((_, reply)) = self.asking.remove(request_id) {
            let _ = reply.send(answer);
        }
        Ok(())
    }

    /// Applies the commands waiting in the run's inbox, oldest first, and
    /// returns how many it took. Each is marked taken only once what it
    /// caused is durable, so a crash in between applies it again on resume
    /// (where a second decision is refused, harmlessly).
    pub(super) async fn drain_inbox(&mut self) -> usize {
        let backend = self.services.journal.backend().clone();
        let run = self.run_id.clone();
        let pending = tokio::task::spawn_blocking(move || backend.pending_commands(&run)).await;
        let entries = match pending {
            Ok(Ok(e)) => e,
            Ok(Err(e)) => {
                self.warn("inbox", format!("cannot read the run's inbox: {e}"));
                return 0;
            }
            Err(_) => return 0,
        };
        let n = entries.len();
        for entry in entries {
            let outcome = self.apply(entry.command).await;
            let text = match outcome {
                Ok(None) => "applied".to_string(),
                Ok(Some(note)) => {
                    let reply = InboxReply {
                        id: entry.id,
                        accepted: true,
                        message: note.clone(),
                    };
                    self.emit(Scope::run(), reply.to_event_kind());
                    format!("applied: {note}")
                }
                Err(e) => {
                    let reply = InboxReply {
                        id: entry.id,
                        accepted: false,
                        message: e.to_string(),
                    };
                    self.emit(Scope::run(), reply.to_event_kind());
                    format!("refused: {e}")
                }
            };
            if let Err(e) = self.log.sync().await {
                self.store_error = Some(e.to_string());
                return n;
            }
            let backend = self.services.journal.backend().clone();
            let id = entry.id;
            let _ = tokio::task::spawn_blocking(move || backend.take_command(id, &text)).await;
        }
        n
    }

    /// Carries out one command. `Ok(Some(note))` when it was taken without
    /// an event of its own.
    pub(super) async fn apply(
        &mut self,
        command: RunCommand,
    ) -> Result<Option<String>, EngineError> {
        match command {
            RunCommand::Approve { node_id, note, by } => {
                self.decide(&node_id, true, note, by).await.map(|_| None)
            }
            RunCommand::Deny { node_id, note, by } => {
                self.decide(&node_id, false, note, by).await.map(|_| None)
            }
            RunCommand::Cancel {
                graceful,
                reason,
                by,
            } => {
                if self.cancelling.is_some() {
                    return Ok(Some("the run is already being cancelled".into()));
                }
                self.request_cancel(graceful, reason, by)
                    .await
                    .map(|_| None)
            }
            RunCommand::Answer {
                request_id,
                answer,
                by,
            } => self.answer(&request_id, answer, by).await.map(|_| None),
            RunCommand::Hijack { node_id, by } => self.hijack(&node_id, by),
        }
    }

    pub(super) async fn decide(
        &mut self,
        node_id: &str,
        approved: bool,
        note: Option<String>,
        by: Option<String>,
    ) -> Result<(), EngineError> {
        // A gate the log shows waiting may not have asked again yet after a
        // resume: its attempt finds the decision in the state when it does.
        let key = self
            .waiting
            .keys()
            .filter(|k| k.0 == node_id)
            .max_by_key(|k| k.1)
            .cloned()
            .or_else(|| {
                self.state
                    .nodes
                    .iter()
                    .filter(|n| {
                        n.node_id == node_id
                            && n.status == NodeStatus::WaitingApproval
                            && n.decision().is_none()
                            && self
                                .plan
                                .insts
                                .contains_key(&(n.node_id.clone(), n.iteration))
                    })
                    .map(|n| (n.node_id.clone(), n.iteration))
                    .max_by_key(|k| k.1)
            })
            .ok_or_else(|| crate::not_waiting(&self.run_id, node_id, &self.state))?;
        let scope = self.node_scope(&key);
        let kind = if approved {
            EventKind::ApprovalGranted {
                decided_by: by.clone(),
                note: note.clone(),
            }
        } else {
            EventKind::ApprovalDenied {
                decided_by: by.clone(),
                note: note.clone(),
            }
        };
        self.emit(scope, kind);
        if self.announced != RunStatus::Running {
            self.announced = RunStatus::Running;
            self.emit(
                Scope::run(),
                EventKind::RunStatusChanged {
                    status: RunStatus::Running,
                },
            );
        }
        self.log.sync().await?;
        if let Some(reply) = self.waiting.remove(&key) {
            let _ = reply.send(Decision { approved, note, by });
        }
        Ok(())
    }

    pub(super) async fn request_cancel(
        &mut self,
        graceful: bool,
        reason: Option<String>,
        by: Option<String>,
    ) -> Result<(), EngineError> {
        if self.cancelling.is_some() {
            return Ok(());
        }
        let mechanism = if graceful {
            CancelMechanism::Graceful
        } else {
            CancelMechanism::Immediate
        };
        self.emit(
            Scope::run(),
            EventKind::RunCancelRequested {
                reason: reason.clone(),
                requested_by: by,
                mechanism,
            },
        );
        self.log.sync().await?;
        self.cancelling = Some((mechanism, reason));
        if graceful {
            // Gates and children waiting for a person would wait for ever.
            for key in self.waiting.keys().chain(self.child_waits.keys()) {
                if let Some(t) = self.running.get(key) {
                    t.cancel();
                }
            }
        } else {
            self.run_cancel.cancel();
        }
        Ok(())
    }
}

/// Resolves at the listener's next wake-up; never without a listener.
pub(super) async fn wait_for(listener: &mut Option<Box<dyn Listener>>) {
    match listener {
        Some(l) => l.wait().await,
        None => std::future::pending().await,
    }
}
