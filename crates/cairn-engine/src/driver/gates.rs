//! The gates a person answers: approvals an attempt waits at, questions it
//! asked, child runs that wait for a person, and the run's status as last
//! announced (running, or waiting for approval or input).
//!
//! [`Gates`] holds the attempts' reply channels and decides what an ask
//! or an answer appends; the driver checks the attempt still runs, appends
//! the events in the order given, waits for the log where a decision must
//! be durable, then hands the reply over through the gate.

use std::collections::HashMap;

use cairn_events::{EventKind, NodeState, NodeStatus, Question, RunId, RunStatus, Scope};
use serde_json::Value;
use tokio::sync::oneshot;

use crate::node::Decision;
use crate::plan::{Key, KeyMap};
use crate::EngineError;

/// What the driver appends and does for an ask.
#[derive(Debug, Default)]
pub(super) struct GateStep {
    /// To append, in order.
    pub events: Vec<(Scope, EventKind)>,
    /// The attempt stops: a graceful cancel does not wait for a person.
    pub cancel: bool,
}

/// An approval an attempt asks for.
pub(super) struct ApprovalAsk {
    pub key: Key,
    /// The node's scope, for the gate's events.
    pub scope: Scope,
    pub message: Option<String>,
    pub reply: oneshot::Sender<Decision>,
}

/// A question an attempt asks.
pub(super) struct InputAsk {
    pub key: Key,
    /// The node's scope, for the question's events.
    pub scope: Scope,
    pub request_id: String,
    pub prompt: String,
    pub schema: Option<Value>,
    pub reply: oneshot::Sender<Value>,
}

/// The gates of the attempts running now.
pub(super) struct Gates {
    /// Attempts waiting at an approval, with the channel the decision goes
    /// to.
    waiting: KeyMap<oneshot::Sender<Decision>>,
    /// Questions whose attempts wait for an answer, by request id.
    asking: HashMap<String, (Key, oneshot::Sender<Value>)>,
    /// Attempts whose child run waits for a person, with its status.
    child_waits: KeyMap<RunStatus>,
    /// The run's status as its last `RunStatusChanged` (or the log the
    /// driver started from) says.
    announced: RunStatus,
}

impl Gates {
    /// The gates of a driver that starts from a run whose status is
    /// `announced`.
    pub(super) fn new(announced: RunStatus) -> Gates {
        Gates {
            waiting: Default::default(),
            asking: HashMap::new(),
            child_waits: Default::default(),
            announced,
        }
    }

    /// `RunStatusChanged(status)`, unless the run said so last.
    pub(super) fn announce(&mut self, status: RunStatus) -> Option<EventKind> {
        if self.announced == status {
            return None;
        }
        self.announced = status;
        Some(EventKind::RunStatusChanged { status })
    }

    /// The run has work again (a decision, an answer, a child going on).
    pub(super) fn back_to_running(&mut self) -> Option<EventKind> {
        self.announce(RunStatus::Running)
    }

    /// A child run of the attempt `key` waits for a person (`Some`, with
    /// its status) or goes on again (`None`).
    pub(super) fn child(&mut self, key: Key, status: Option<RunStatus>) -> Option<EventKind> {
        match status {
            Some(s) => {
                self.child_waits.insert(key, s);
                None
            }
            None if self.child_waits.remove(&key).is_some() => self.back_to_running(),
            None => None,
        }
    }

    /// An attempt asks for approval. `node` is its node's state, which may
    /// hold the decision already (taken while nobody drove the run);
    /// `graceful` says a graceful cancel is under way.
    pub(super) fn approval(
        &mut self,
        ask: ApprovalAsk,
        node: Option<&NodeState>,
        graceful: bool,
    ) -> GateStep {
        let ApprovalAsk {
            key,
            scope,
            message,
            reply,
        } = ask;
        if let Some(d) = node.and_then(|n| n.decision()) {
            let _ = reply.send(Decision {
                approved: d.approved,
                note: d.note.clone(),
                by: d.by.clone(),
            });
            return GateStep::default();
        }
        // A graceful cancel lets running work finish but stops the gates
        // waiting for a person; a gate that asks only now (its attempt was
        // spawned before the cancel was applied) stops the same way
        // instead of waiting for ever.
        if graceful {
            self.waiting.insert(key, reply);
            return GateStep {
                events: Vec::new(),
                cancel: true,
            };
        }
        let mut step = GateStep::default();
        if node.map(|n| n.status) != Some(NodeStatus::WaitingApproval) {
            step.events
                .push((scope.clone(), EventKind::NodeWaitingApproval {}));
            step.events
                .push((scope, EventKind::ApprovalRequested { message }));
        }
        self.waiting.insert(key, reply);
        step
    }

    /// An attempt asks a question. `asked` is the question as the log has
    /// it (asked by an attempt a crash cut short, maybe answered since);
    /// `waiting_already` says the node's state waits for input.
    pub(super) fn input(
        &mut self,
        ask: InputAsk,
        asked: Option<&Question>,
        waiting_already: bool,
        graceful: bool,
    ) -> GateStep {
        let InputAsk {
            key,
            scope,
            request_id,
            prompt,
            schema,
            reply,
        } = ask;
        // Answered while the run was down, or before this attempt asked
        // again: the answer in the log is the answer.
        if let Some(answer) = asked.and_then(|q| q.answer.clone()) {
            let _ = reply.send(answer);
            return GateStep::default();
        }
        if graceful {
            return GateStep {
                events: Vec::new(),
                cancel: true,
            };
        }
        let mut step = GateStep::default();
        if asked.is_some() && !waiting_already {
            // Asked by an attempt a crash cut short: this one waits for
            // the same answer.
            step.events.push((
                scope,
                EventKind::NodeWaitingInput {
                    request_id: request_id.clone(),
                },
            ));
        } else if asked.is_none() {
            step.events.push((
                scope.clone(),
                EventKind::InputRequested {
                    request_id: request_id.clone(),
                    prompt,
                    schema,
                },
            ));
            step.events.push((
                scope,
                EventKind::NodeWaitingInput {
                    request_id: request_id.clone(),
                },
            ));
        }
        self.asking.insert(request_id, (key, reply));
        step
    }

    /// The attempt of `key` ended: it waits for nobody any more. (Its
    /// questions stay until answered: an answer to a question nobody
    /// waits for is still recorded.)
    pub(super) fn attempt_ended(&mut self, key: &Key) {
        self.waiting.remove(key);
        self.child_waits.remove(key);
    }

    /// The gate of `node_id` that waits for a decision (its latest pass).
    pub(super) fn gate_of(&self, node_id: &str) -> Option<Key> {
        self.waiting
            .keys()
            .filter(|k| k.0 == node_id)
            .max_by_key(|k| k.1)
            .cloned()
    }

    /// Hands a decision (durable by now) to the attempt waiting at `key`.
    pub(super) fn decided(&mut self, key: &Key, decision: Decision) {
        if let Some(reply) = self.waiting.remove(key) {
            let _ = reply.send(decision);
        }
    }

    /// Hands an answer (durable by now) to the attempt that asked.
    pub(super) fn answered(&mut self, request_id: &str, answer: Value) {
        if let Some((_, reply)) = self.asking.remove(request_id) {
            let _ = reply.send(answer);
        }
    }

    /// Attempts that wait at an approval or for an answer: safe points,
    /// since the log holds what they wait for and a resume asks again.
    pub(super) fn at_people(&self) -> Vec<Key> {
        let mut keys: Vec<Key> = self.waiting.keys().cloned().collect();
        keys.extend(self.asking.values().map(|(k, _)| k.clone()));
        keys.sort_unstable();
        keys.dedup();
        keys
    }

    /// Attempts that wait for a person at a gate or through a child run:
    /// what a graceful cancel stops.
    pub(super) fn waiting_for_people(&self) -> impl Iterator<Item = &Key> {
        self.waiting.keys().chain(self.child_waits.keys())
    }

    /// How many attempts wait at an approval.
    pub(super) fn approval_count(&self) -> usize {
        self.waiting.len()
    }

    /// How many attempts wait for a person: at a gate, for an answer, or
    /// through a child run.
    pub(super) fn waiting_count(&self) -> usize {
        let mut others: Vec<&Key> = self
            .asking
            .values()
            .map(|(k, _)| k)
            .filter(|k| !self.waiting.contains_key(*k))
            .collect();
        others.extend(
            self.child_waits
                .keys()
                .filter(|k| !self.waiting.contains_key(*k)),
        );
        others.sort_unstable();
        others.dedup();
        self.waiting.len() + others.len()
    }

    /// Whether anything waits for a person.
    pub(super) fn any(&self) -> bool {
        !self.waiting.is_empty() || !self.asking.is_empty() || !self.child_waits.is_empty()
    }

    /// What the run waits for, when it waits: input if a question (its
    /// own, or a child's) is open, else approval.
    pub(super) fn waiting_status(&self) -> RunStatus {
        let child_asks = self
            .child_waits
            .values()
            .any(|s| *s == RunStatus::WaitingInput);
        if self.asking.is_empty() && !child_asks {
            RunStatus::WaitingApproval
        } else {
            RunStatus::WaitingInput
        }
    }
}

/// The question `request_id` of run `run_id`, when `answer` may answer it:
/// asked, not answered yet, and the answer matches its schema. Returns the
/// node pass that asked.
pub(super) fn answerable(
    run_id: &RunId,
    questions: &std::collections::BTreeMap<String, Question>,
    request_id: &str,
    answer: &Value,
) -> Result<Key, EngineError> {
    let request = || request_id.to_string();
    let q = questions.get(request_id).ok_or_else(|| {
        EngineError::for_run(run_id, |run| EngineError::QuestionNotFound {
            run,
            request: request(),
        })
    })?;
    if q.answer.is_some() {
        return Err(EngineError::for_run(run_id, |run| {
            EngineError::QuestionAnswered {
                run,
                request: request(),
            }
        }));
    }
    if let Some(problem) = q
        .schema
        .as_ref()
        .and_then(|s| crate::schema_problem(s, answer))
    {
        return Err(EngineError::AnswerInvalid {
            request: request(),
            reason: problem,
        });
    }
    Ok((q.node_id.clone(), q.iteration))
}

/// The event that records a decision at a gate.
pub(super) fn decision_event(
    approved: bool,
    note: Option<String>,
    by: Option<String>,
) -> EventKind {
    if approved {
        EventKind::ApprovalGranted {
            decided_by: by,
            note,
        }
    } else {
        EventKind::ApprovalDenied {
            decided_by: by,
            note,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::testing::{apply, key};
    use cairn_events::RunState;
    use serde_json::json;

    fn approval(k: &Key) -> (ApprovalAsk, oneshot::Receiver<Decision>) {
        let (reply, rx) = oneshot::channel();
        let ask = ApprovalAsk {
            key: k.clone(),
            scope: Scope::node(k.0.clone(), k.1),
            message: Some("ok?".into()),
            reply,
        };
        (ask, rx)
    }

    fn input(k: &Key, id: &str) -> (InputAsk, oneshot::Receiver<Value>) {
        let (reply, rx) = oneshot::channel();
        let ask = InputAsk {
            key: k.clone(),
            scope: Scope::node(k.0.clone(), k.1),
            request_id: id.into(),
            prompt: "name?".into(),
            schema: Some(json!({"type": "string"})),
            reply,
        };
        (ask, rx)
    }

    fn types(step: &GateStep) -> Vec<&'static str> {
        step.events.iter().map(|(_, k)| k.type_name()).collect()
    }

    #[test]
    fn an_approval_opens_a_gate_once_and_takes_its_decision() {
        let mut gates = Gates::new(RunStatus::Running);
        let k = key("gate");
        let (ask, mut rx) = approval(&k);
        let step = gates.approval(ask, None, false);
        assert_eq!(types(&step), ["NodeWaitingApproval", "ApprovalRequested"]);
        assert!(!step.cancel);
        assert!(gates.any());
        assert_eq!(gates.waiting_count(), 1);
        assert_eq!(gates.waiting_status(), RunStatus::WaitingApproval);
        assert_eq!(gates.gate_of("gate"), Some(k.clone()));
        assert_eq!(
            gates.announce(RunStatus::WaitingApproval),
            Some(EventKind::RunStatusChanged {
                status: RunStatus::WaitingApproval
            })
        );
        assert_eq!(gates.announce(RunStatus::WaitingApproval), None);
        gates.decided(
            &k,
            Decision {
                approved: true,
                note: None,
                by: Some("ann".into()),
            },
        );
        let d = rx.try_recv().expect("the decision reached the attempt");
        assert!(d.approved);
        assert!(!gates.any());
        assert_eq!(
            gates.back_to_running(),
            Some(EventKind::RunStatusChanged {
                status: RunStatus::Running
            })
        );
    }

    #[test]
    fn a_gate_the_log_shows_waiting_or_decided_is_not_opened_again() {
        let k = key("gate");
        let mut state = RunState::new(RunId::parse("r").unwrap());
        let scope = Scope::node(k.0.clone(), 0);
        apply(&mut state, scope.clone(), EventKind::NodeWaitingApproval {});
        let mut gates = Gates::new(RunStatus::WaitingApproval);
        let (ask, _rx) = approval(&k);
        let step = gates.approval(ask, state.node("gate", 0), false);
        assert!(step.events.is_empty(), "the log shows it waiting already");

        apply(
            &mut state,
            scope,
            decision_event(false, Some("no".into()), None),
        );
        let mut gates = Gates::new(RunStatus::Running);
        let (ask, mut rx) = approval(&k);
        let step = gates.approval(ask, state.node("gate", 0), false);
        assert!(step.events.is_empty());
        assert_eq!(gates.gate_of("gate"), None);
        let d = rx.try_recv().expect("the recorded decision");
        assert!(!d.approved);
        assert_eq!(d.note.as_deref(), Some("no"));
    }

    #[test]
    fn a_graceful_cancel_stops_a_gate_that_asks_late() {
        let mut gates = Gates::new(RunStatus::Running);
        let k = key("gate");
        let (ask, _rx) = approval(&k);
        let step = gates.approval(ask, None, true);
        assert!(step.cancel && step.events.is_empty());
        let (ask, _rx) = input(&key("q"), "q-1");
        let step = gates.input(ask, None, false, true);
        assert!(step.cancel && step.events.is_empty());
    }

    #[test]
    fn a_question_is_asked_once_and_an_answer_in_the_log_is_the_answer() {
        let mut gates = Gates::new(RunStatus::Running);
        let k = key("ask");
        let (ask, _rx) = input(&k, "q-1");
        let step = gates.input(ask, None, false, false);
        assert_eq!(types(&step), ["InputRequested", "NodeWaitingInput"]);
        assert_eq!(gates.waiting_status(), RunStatus::WaitingInput);
        assert_eq!(gates.waiting_count(), 1);

        // Asked before a crash: the new attempt waits for the same answer.
        let mut state = RunState::new(RunId::parse("r").unwrap());
        let scope = Scope::node(k.0.clone(), 0);
        apply(
            &mut state,
            scope.clone(),
            EventKind::InputRequested {
                request_id: "q-1".into(),
                prompt: "name?".into(),
                schema: None,
            },
        );
        let mut gates = Gates::new(RunStatus::Running);
        let (ask, _rx) = input(&k, "q-1");
        let step = gates.input(ask, state.questions.get("q-1"), false, false);
        assert_eq!(types(&step), ["NodeWaitingInput"]);

        apply(
            &mut state,
            scope,
            EventKind::InputReceived {
                request_id: "q-1".into(),
                answer: json!("ann"),
                answered_by: None,
            },
        );
        let mut gates = Gates::new(RunStatus::Running);
        let (ask, mut rx) = input(&k, "q-1");
        let step = gates.input(ask, state.questions.get("q-1"), false, false);
        assert!(step.events.is_empty());
        assert_eq!(rx.try_recv().unwrap(), json!("ann"));
        assert!(!gates.any());
    }

    #[test]
    fn a_child_waiting_counts_once_and_its_going_on_says_running() {
        let mut gates = Gates::new(RunStatus::Running);
        let k = key("child");
        assert_eq!(gates.child(k.clone(), Some(RunStatus::WaitingInput)), None);
        assert_eq!(gates.waiting_count(), 1);
        assert_eq!(gates.waiting_status(), RunStatus::WaitingInput);
        gates.announce(RunStatus::WaitingInput);
        assert_eq!(
            gates.child(k.clone(), None),
            Some(EventKind::RunStatusChanged {
                status: RunStatus::Running
            })
        );
        assert_eq!(gates.child(k, None), None);
    }

    #[test]
    fn an_answer_must_be_to_an_open_question_and_match_its_schema() {
        let mut state = RunState::new(RunId::parse("r").unwrap());
        apply(
            &mut state,
            Scope::node("ask", 2),
            EventKind::InputRequested {
                request_id: "q-1".into(),
                prompt: "n?".into(),
                schema: Some(json!({"type": "integer"})),
            },
        );
        let q = &state.questions;
        assert!(matches!(
            answerable(&RunId::parse("r").unwrap(), q, "q-9", &json!(1)),
            Err(EngineError::QuestionNotFound { .. })
        ));
        assert!(matches!(
            answerable(&RunId::parse("r").unwrap(), q, "q-1", &json!("one")),
            Err(EngineError::AnswerInvalid { .. })
        ));
        assert_eq!(
            answerable(&RunId::parse("r").unwrap(), q, "q-1", &json!(1)).unwrap(),
            ("ask".into(), 2)
        );
        apply(
            &mut state,
            Scope::node("ask", 2),
            EventKind::InputReceived {
                request_id: "q-1".into(),
                answer: json!(1),
                answered_by: None,
            },
        );
        assert!(matches!(
            answerable(
                &RunId::parse("r").unwrap(),
                &state.questions,
                "q-1",
                &json!(1)
            ),
            Err(EngineError::QuestionAnswered { .. })
        ));
    }
}
