//! People and other processes: approvals a running node asks for, and the
//! commands of the run's inbox (approve, deny, answer, cancel).

use super::gates::{self, ApprovalAsk, GateStep, InputAsk};
use super::*;

impl Driver {
    /// An attempt asks for a person (through its gates) or says its child
    /// run waits for one.
    pub(super) fn on_ask(&mut self, a: Ask) {
        let graceful = self.ending.graceful();
        let (key, step) = match a {
            Ask::Child { key, status } => {
                if !self.attempts.is_running(&key) {
                    return;
                }
                let event = self.gates.child(key.clone(), status);
                let step = GateStep {
                    events: event.map(|k| (Scope::run(), k)).into_iter().collect(),
                    cancel: false,
                };
                (key, step)
            }
            Ask::Approval {
                key,
                message,
                reply,
                replayed,
            } => {
                // The attempt may have been cancelled, and its end handled,
                // before its question came through: a gate opened now would
                // follow the node's terminal event.
                if !self.attempts.is_running(&key) {
                    return;
                }
                let ask = ApprovalAsk {
                    key: key.clone(),
                    scope: self.node_scope(&key),
                    message,
                    reply,
                };
                let node = self.state.node(&key.0, key.1);
                let decided = node.and_then(|n| n.decision()).is_some();
                let mut step = self.gates.approval(ask, node, graceful);
                if let Some(d) = replayed.filter(|_| !decided && !step.cancel) {
                    // A replay's gate is decided as the original's was, in
                    // the log like any decision; the attempt hears of it
                    // once that is durable (`hand_over_replayed`).
                    let kind = gates::decision_event(d.approved, d.note.clone(), d.by.clone());
                    step.events.push((self.node_scope(&key), kind));
                    self.replayed.push(Replayed::Decision(key.clone(), d));
                }
                (key, step)
            }
            Ask::Input {
                key,
                request_id,
                prompt,
                schema,
                reply,
                replayed,
            } => {
                if !self.attempts.is_running(&key) {
                    return;
                }
                let asked = self.state.questions.get(&request_id);
                let waiting_already = self
                    .state
                    .node(&key.0, key.1)
                    .is_some_and(|n| n.status == NodeStatus::WaitingInput);
                let answered = asked.is_some_and(|q| q.answer.is_some());
                let id = request_id.clone();
                let ask = InputAsk {
                    key: key.clone(),
                    scope: self.node_scope(&key),
                    request_id,
                    prompt,
                    schema,
                    reply,
                };
                let mut step = self.gates.input(ask, asked, waiting_already, graceful);
                if let Some(answer) = replayed.filter(|_| !answered && !step.cancel) {
                    let by = Some(format!("replay of {}", self.replayed_from()));
                    step.events.push((
                        self.node_scope(&key),
                        EventKind::InputReceived {
                            request_id: id.clone(),
                            answer: answer.clone(),
                            answered_by: by,
                        },
                    ));
                    self.replayed.push(Replayed::Answer(id, answer));
                }
                (key, step)
            }
        };
        if step.cancel {
            self.attempts.stop(&key);
        }
        self.emit_all(step.events);
    }

    /// The original a replay answers from (empty for another run).
    fn replayed_from(&self) -> String {
        self.replay
            .as_ref()
            .map(|r| r.original().to_string())
            .unwrap_or_default()
    }

    /// Hands the decisions and answers a replay recorded to the attempts
    /// that asked, once the log holds them.
    pub(super) fn hand_over_replayed(&mut self) {
        for r in std::mem::take(&mut self.replayed) {
            match r {
                Replayed::Decision(key, d) => self.gates.decided(&key, d),
                Replayed::Answer(id, answer) => self.gates.answered(&id, answer),
            }
        }
    }

    /// The run goes on after a person's decision or answer.
    fn back_to_running(&mut self) {
        if let Some(kind) = self.gates.back_to_running() {
            self.emit(Scope::run(), kind);
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
        let key = gates::answerable(&self.run_id, &self.state.questions, request_id, &answer)?;
        let scope = self.node_scope(&key);
        self.emit(
            scope,
            EventKind::InputReceived {
                request_id: request_id.to_string(),
                answer: answer.clone(),
                answered_by: by,
            },
        );
        self.back_to_running();
        self.log.sync().await?;
        self.gates.answered(request_id, answer);
        Ok(())
    }

    /// Applies the commands waiting in the run's inbox, oldest first, and
    /// returns how many it took. Each is marked taken only once what it
    /// caused is durable, so a crash in between applies it again on resume
    /// (where a second decision is refused, harmlessly).
    pub(super) async fn drain_inbox(&mut self) -> usize {
        self.polls = 0;
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
                if self.ending.is_cancelling() {
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

    /// Records a decision at the gate of `node_id` and hands it to the
    /// attempt waiting there.
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
            .gates
            .gate_of(node_id)
            .or_else(|| self.gate_in_log(node_id))
            .ok_or_else(|| crate::not_waiting(&self.run_id, node_id, &self.state))?;
        let scope = self.node_scope(&key);
        let kind = gates::decision_event(approved, note.clone(), by.clone());
        self.emit(scope, kind);
        self.back_to_running();
        self.log.sync().await?;
        self.gates.decided(&key, Decision { approved, note, by });
        Ok(())
    }

    /// The latest mounted pass of `node_id` that the log shows waiting for
    /// a decision it has not had.
    fn gate_in_log(&self, node_id: &str) -> Option<Key> {
        self.state
            .nodes
            .iter()
            .filter(|n| {
                n.node_id == node_id
                    && n.status == NodeStatus::WaitingApproval
                    && n.decision().is_none()
                    && self
                        .sched
                        .plan()
                        .insts
                        .contains_key(&(n.node_id.clone(), n.iteration))
            })
            .map(|n| (n.node_id.clone(), n.iteration))
            .max_by_key(|k| k.1)
    }

    pub(super) async fn request_cancel(
        &mut self,
        graceful: bool,
        reason: Option<String>,
        by: Option<String>,
    ) -> Result<(), EngineError> {
        if self.ending.is_cancelling() {
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
        self.ending.cancel(mechanism, reason);
        if graceful {
            // Gates and children waiting for a person would wait for ever.
            for key in self.gates.waiting_for_people() {
                self.attempts.stop(key);
            }
        } else {
            self.run_cancel.cancel();
        }
        Ok(())
    }
}

/// A decision or answer a replay recorded, waiting for the log before it
/// reaches the attempt that asked.
pub(super) enum Replayed {
    Decision(Key, Decision),
    Answer(String, Value),
}

/// Resolves at the listener's next wake-up; never without a listener.
pub(super) async fn wait_for(listener: &mut Option<Box<dyn Listener>>) {
    match listener {
        Some(l) => l.wait().await,
        None => std::future::pending().await,
    }
}
