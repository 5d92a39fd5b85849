//! Hijack (docs/hijack.md): a person asks to take a running agent's
//! conversation (`RunHijackRequested`); the driver raises the attempt's
//! flag, and the agent, at its next step boundary, asks the person for
//! each turn (questions of their own, `h-` request ids) until handed back.
//! The turns are answers in the log, so a resume replays them.

use std::sync::atomic::{AtomicBool, Ordering};

use super::*;

impl Driver {
    /// The flag an agent attempt of `key` watches: raised already when the
    /// log holds a hijack of the node that was never handed back (the
    /// person still has it after a resume).
    pub(super) fn hijack_flag(&mut self, key: &Key, inst: &Inst) -> Option<Arc<AtomicBool>> {
        let NodeKind::Agent(a) = &inst.spec.kind else {
            return None;
        };
        // External CLIs other than Claude Code have no session to hand over.
        if a.engine.as_deref().is_some_and(|e| e != "claude-code") {
            return None;
        }
        let raised = self.state.hijack_requested.contains(key.0.as_str());
        let flag = Arc::new(AtomicBool::new(raised));
        self.hijack_flags.insert(key.clone(), flag.clone());
        Some(flag)
    }

    /// The attempt of `key` ended: its flag goes, and so does a request it
    /// never took up (a new attempt is a new conversation).
    pub(super) fn hijack_done(&mut self, key: &Key) {
        if self.hijack_flags.remove(key).is_some() {
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
        let key = self
            .hijack_flags
            .keys()
            .filter(|k| k.0 == node_id)
            .max_by_key(|k| k.1)
            .cloned();
        let Some(key) = key else {
            let what = self
                .plan
                .insts
                .iter()
                .find(|(k, _)| k.0 == node_id)
                .map(|(_, i)| &i.spec.kind);
            let why = match what {
                Some(NodeKind::Agent(a))
                    if a.engine.as_deref().is_some_and(|e| e != "claude-code") =>
                {
                    "its engine's CLI has no session Cairn can hand to a person"
                }
                Some(NodeKind::Agent(_)) if self.mode == Mode::Apply => {
                    "no process drives the run (`cairn resume` it, then hijack)"
                }
                Some(NodeKind::Agent(_)) => "it is not running",
                Some(_) => "it is not an agent",
                None => "it is not mounted",
            };
            return Err(EngineError::Conflict(format!(
                "node `{node_id}` cannot be hijacked: {why}"
            )));
        };
        // The flag, not the fold: the attempt logs its own `RunHijacked`,
        // which this driver's state does not see.
        if self
            .hijack_flags
            .get(&key)
            .is_some_and(|f| f.load(Ordering::SeqCst))
        {
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
        if let Some(flag) = self.hijack_flags.get(&key) {
            flag.store(true, Ordering::SeqCst);
        }
        Ok(None)
    }
}
