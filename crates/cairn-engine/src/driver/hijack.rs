//! Hijack (docs/hijack.md): a person asks to take a running agent's
//! conversation (`RunHijackRequested`); the driver raises the attempt's
//! flag, and the agent, at its next step boundary, asks the person for
//! each turn (questions of their own, `h-` request ids) until handed back.
//! The turns are answers in the log, so a resume replays them.

use std::sync::atomic::AtomicBool;

use super::*;
use crate::HijackRefusal;

/// Why node `node_id`, of kind `kind` (`None` when not mounted), cannot be
/// hijacked now; `applying` says no process drives the run.
fn refusal(kind: Option<&NodeKind>, applying: bool) -> HijackRefusal {
    match kind {
        Some(NodeKind::Agent(a))
            if a.engine
                .as_deref()
                .is_some_and(|e| !crate::agent::hands_over(e)) =>
        {
            HijackRefusal::NoSession
        }
        Some(NodeKind::Agent(_)) if applying => HijackRefusal::NotDriven,
        Some(NodeKind::Agent(_)) => HijackRefusal::NotRunning,
        Some(_) => HijackRefusal::NotAnAgent,
        None => HijackRefusal::NotMounted,
    }
}

impl Driver {
    /// The flag an agent attempt of `key` watches: raised already when the
    /// log holds a hijack of the node that was never handed back (the
    /// person still has it after a resume).
    pub(super) fn hijack_flag(&mut self, key: &Key, inst: &Inst) -> Option<Arc<AtomicBool>> {
        let NodeKind::Agent(a) = &inst.spec.kind else {
            return None;
        };
        // An external CLI may have no session to hand over.
        if a.engine
            .as_deref()
            .is_some_and(|e| !crate::agent::hands_over(e))
        {
            return None;
        }
        let raised = self.state.hijack_requested.contains(key.0.as_str());
        Some(self.attempts.hijack_flag(key.clone(), raised))
    }

    /// The attempt of `key` ended: its flag goes, and so does a request it
    /// never took up (a new attempt is a new conversation).
    pub(super) fn hijack_done(&mut self, key: &Key) {
        if self.attempts.hijack_ended(key) {
            self.state.hijack_requested.remove(key.0.as_str());
        }
    }

    /// `RunCommand::Hijack`: refused unless the node is an agent this
    /// driver runs now.
    pub(super) fn hijack(
        &mut self,
        node_id: &str,
        by: Option<String>,
    ) -> Result<Option<String>, EngineError> {
        let Some(key) = self.attempts.hijackable(node_id) else {
            let kind = self
                .sched
                .plan()
                .insts
                .iter()
                .find(|i| i.key.0 == node_id)
                .map(|i| &i.spec.kind);
            let why = refusal(kind, self.mode == Mode::Apply);
            return Err(EngineError::NotHijackable {
                node: node_id.into(),
                why,
            });
        };
        if self.attempts.hijack_raised(&key) {
            return Ok(Some(format!(
                "node `{node_id}` is already being taken over"
            )));
        }
        self.emit(
            Scope::run(),
            EventKind::RunHijackRequested {
                node_id: node_id.to_string(),
                requested_by: by,
            },
        );
        self.attempts.raise_hijack(&key);
        Ok(None)
    }
}
