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

use crate::{Event, EventKind};

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
    for ev in parent {
        match &ev.kind {
            EventKind::DelegationStarted { child_run_id, .. } => {
                let child = children
                    .get(child_run_id)
                    .ok_or_else(|| format!("seq {}: child `{child_run_id}` has no log", ev.seq))?;
                let mut fresh = 0;
                for c in child {
                    if let EventKind::RunStarted {
                        resumed,
                        parent_run_id,
                        parent_node_id,
                        depth,
                        ..
                    } = &c.kind
                    {
                        if !resumed {
                            fresh += 1;
                        }
                        if parent_run_id.as_deref() != Some(parent_id) {
                            return Err(format!(
                                "child `{child_run_id}` seq {}: parentRunId {parent_run_id:?}, expected `{parent_id}`",
                                c.seq
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
                }
                if fresh != 1 {
                    return Err(format!(
                        "child `{child_run_id}` was started {fresh} times (RunStarted without resumed)"
                    ));
                }
            }
            EventKind::DelegationFinished {
                child_run_id,
                status,
            } => {
                let child = children.get(child_run_id).ok_or_else(|| {
                    format!("seq {}: finished child `{child_run_id}` has no log", ev.seq)
                })?;
                let end = child.iter().rev().find_map(|c| match &c.kind {
                    EventKind::RunFinished { .. } => Some((c, "finished")),
                    EventKind::RunFailed { .. } => Some((c, "failed")),
                    EventKind::RunCancelled { .. } => Some((c, "cancelled")),
                    _ => None,
                });
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
            }
            _ => {}
        }
    }
    Ok(())
}
