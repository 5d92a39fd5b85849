//! The contract's rules between a parent run's log and its children's:
//! every `DelegationStarted` is followed by its child's `RunStarted` naming
//! the parent, the node and the depth one below the parent's; every
//! `DelegationFinished` comes after the child's terminal event, with the
//! status that event says; and a child is started once (one `RunStarted`
//! that is not a resume).
//!
//! Pure: the caller reads the logs. The conformance and crash tests check
//! every tree of runs they make with it.

use std::collections::BTreeMap;

use crate::{Event, EventKind, RunId};

/// Checks a parent's log against its children's logs (by child run id).
/// Returns the first rule broken.
pub fn check_tree(parent: &[Event], children: &BTreeMap<String, Vec<Event>>) -> Result<(), String> {
    let parent_depth = parent
        .iter()
        .find_map(|e| match &e.kind {
            EventKind::RunStarted { depth, .. } => Some(*depth),
            _ => None,
        })
        .ok_or("the parent's log has no RunStarted")?;
    let parent_id = parent.first().map(|e| e.run_id.as_str()).unwrap_or("");
    let log_of = |child_run_id: &RunId, ev: &Event, what: &str| {
        children
            .get(child_run_id.as_str())
            .ok_or_else(|| format!("seq {}: {what} `{child_run_id}` has no log", ev.seq))
    };
    for ev in parent {
        use EventKind as K;
        match &ev.kind {
            K::DelegationStarted { child_run_id, .. } => {
                let child = log_of(child_run_id, ev, "child")?;
                child_started(ev, child_run_id, child, parent_id, parent_depth)?;
            }
            K::DelegationFinished {
                child_run_id,
                status,
            } => {
                let child = log_of(child_run_id, ev, "finished child")?;
                child_ended(ev, child_run_id, child, status)?;
            }
            // The tree's rules are about delegations only.
            K::RunStarted { .. }
            | K::RunStatusChanged { .. }
            | K::RunCancelRequested { .. }
            | K::RunSummary { .. }
            | K::RunFinished { .. }
            | K::RunFailed { .. }
            | K::RunCancelled { .. }
            | K::FrameCommitted { .. }
            | K::LayerStarted { .. }
            | K::LayerFinished { .. }
            | K::EdgeTraversed { .. }
            | K::BranchResolved { .. }
            | K::ChapterStarted { .. }
            | K::ChapterFinished { .. }
            | K::NodePending { .. }
            | K::NodeStarted { .. }
            | K::NodeHeartbeat { .. }
            | K::NodeOutput { .. }
            | K::NodeFinished { .. }
            | K::NodeFailed { .. }
            | K::NodeRetrying { .. }
            | K::NodeSkipped { .. }
            | K::NodeCancelled { .. }
            | K::NodeWaitingApproval {}
            | K::NodeWaitingInput { .. }
            | K::ApprovalRequested { .. }
            | K::ApprovalGranted { .. }
            | K::ApprovalDenied { .. }
            | K::InputRequested { .. }
            | K::InputReceived { .. }
            | K::AgentStepStarted { .. }
            | K::AgentStepFinished { .. }
            | K::AgentGenerationRetried { .. }
            | K::AgentContextCompacted { .. }
            | K::AgentWaiting { .. }
            | K::AgentEvent { .. }
            | K::TokenUsageReported { .. }
            | K::ToolCallStarted { .. }
            | K::ToolCallFinished { .. }
            | K::McpServerStarting { .. }
            | K::McpServerConnected { .. }
            | K::McpServerStderr { .. }
            | K::McpServerDisconnected { .. }
            | K::NetworkAccess { .. }
            | K::Diagnostic { .. }
            | K::RevertStarted { .. }
            | K::RevertFinished { .. }
            | K::WorkflowReloadDetected { .. }
            | K::WorkflowReloaded { .. }
            | K::WorkflowReloadFailed { .. }
            | K::WorkflowReloadUnsafe { .. }
            | K::ScorerStarted { .. }
            | K::ScorerFinished { .. }
            | K::ScorerFailed { .. }
            | K::RunHijackRequested { .. }
            | K::RunHijacked { .. } => {}
        }
    }
    Ok(())
}

/// A `DelegationStarted`'s child: started once, by this parent's node, one
/// level below it (each of its `RunStarted`, resumes too, says so).
fn child_started(
    ev: &Event,
    child_run_id: &RunId,
    child: &[Event],
    parent_id: &str,
    parent_depth: u32,
) -> Result<(), String> {
    let mut fresh = 0;
    for c in child {
        let EventKind::RunStarted {
            resumed,
            parent_run_id,
            parent_node_id,
            depth,
            ..
        } = &c.kind
        else {
            continue;
        };
        if !resumed {
            fresh += 1;
        }
        if parent_run_id.as_deref() != Some(parent_id) {
            return Err(format!(
                "child `{child_run_id}` seq {}: parentRunId {:?}, expected `{parent_id}`",
                c.seq,
                parent_run_id.as_deref(),
            ));
        }
        let node = ev.scope.node_id.as_ref().map(|n| n.as_str());
        if parent_node_id.as_deref() != node {
            return Err(format!(
                "child `{child_run_id}` seq {}: parentNodeId {parent_node_id:?}, expected {node:?}",
                c.seq
            ));
        }
        if *depth != parent_depth + 1 {
            return Err(format!(
                "child `{child_run_id}` seq {}: depth {depth}, expected {}",
                c.seq,
                parent_depth + 1
            ));
        }
    }
    if fresh != 1 {
        return Err(format!(
            "child `{child_run_id}` was started {fresh} times (RunStarted without resumed)"
        ));
    }
    Ok(())
}

/// A `DelegationFinished` comes after its child's terminal event and says
/// the status that event says.
fn child_ended(
    ev: &Event,
    child_run_id: &RunId,
    child: &[Event],
    status: &str,
) -> Result<(), String> {
    let end = child
        .iter()
        .rev()
        .find_map(|c| Some((c, c.kind.ended_as()?.as_str())));
    let Some((end, said)) = end else {
        return Err(format!(
            "seq {}: DelegationFinished for child `{child_run_id}`, which has not ended",
            ev.seq
        ));
    };
    if said != status {
        return Err(format!(
            "seq {}: DelegationFinished says `{status}`, child `{child_run_id}` {said}",
            ev.seq
        ));
    }
    if end.timestamp_ms > ev.timestamp_ms {
        return Err(format!(
            "seq {}: DelegationFinished precedes child `{child_run_id}`'s end",
            ev.seq
        ));
    }
    Ok(())
}
