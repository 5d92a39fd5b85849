//! What waits for a person in a run and in its child runs: the questions
//! and approvals `cairn status` lists, and that `cairn answer`, `approve`
//! and `deny` on the run reach wherever in its tree of runs they are (a
//! question asked inside a child workflow is answered on the parent).

use cairn_engine::Engine;
use cairn_events::{NodeStatus, RunId};
use cairn_store::RunFilter;
use serde_json::Value;

/// What a node waits for.
#[derive(Debug, Clone)]
pub enum Gate {
    /// A question (`ask`, an agent's `ask_user`).
    Question {
        request_id: String,
        prompt: String,
        schema: Option<Value>,
    },
    /// An approval.
    Approval { message: String },
}

/// One open gate: the run that holds it (the run itself or a child), and
/// the node.
#[derive(Debug, Clone)]
pub struct Open {
    pub run: RunId,
    pub node: String,
    pub gate: Gate,
}

impl Open {
    /// The question's request id, when it is one.
    pub fn request_id(&self) -> Option<&str> {
        match &self.gate {
            Gate::Question { request_id, .. } => Some(request_id),
            Gate::Approval { .. } => None,
        }
    }

    /// Whether `name` names this gate: its request id or its node's path.
    pub fn is_named(&self, name: &str) -> bool {
        self.node == name || self.request_id() == Some(name)
    }
}

/// Every open gate of `run` and of its child runs that have not ended,
/// the run's own first.
pub fn open_gates(engine: &Engine, run: &RunId) -> anyhow::Result<Vec<Open>> {
    let mut out = Vec::new();
    let mut todo = vec![run.clone()];
    let mut seen = std::collections::HashSet::new();
    while let Some(r) = todo.pop() {
        if !seen.insert(r.clone()) {
            continue;
        }
        let st = engine.state(&r)?;
        if st.status.is_some_and(|s| s.is_terminal()) {
            continue;
        }
        for (rid, q) in &st.questions {
            if q.answer.is_none() {
                out.push(Open {
                    run: r.clone(),
                    node: q.node_id.to_string(),
                    gate: Gate::Question {
                        request_id: rid.clone(),
                        prompt: q.prompt.clone(),
                        schema: q.schema.clone(),
                    },
                });
            }
        }
        for n in &st.nodes {
            if n.status == NodeStatus::WaitingApproval {
                out.push(Open {
                    run: r.clone(),
                    node: n.node_id.to_string(),
                    gate: Gate::Approval {
                        message: n.approval_message().unwrap_or_default().to_string(),
                    },
                });
            }
        }
        let children = engine.journal().backend().list_runs(&RunFilter {
            parent: Some(r.clone()),
            ..RunFilter::default()
        })?;
        todo.extend(children.into_iter().map(|c| c.run_id));
    }
    Ok(out)
}

/// What an answer may be, from its schema, for people: the choices of an
/// `enum`, else the type and its bounds (`integer from 1 to 5`).
pub fn constraints(schema: &Value) -> Option<String> {
    if let Some(choices) = schema["enum"].as_array() {
        let items: Vec<String> = choices
            .iter()
            .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_string))
            .collect();
        return Some(format!("one of: {}", items.join(", ")));
    }
    let ty = schema["type"].as_str()?;
    let mut s = ty.to_string();
    match (schema.get("minimum"), schema.get("maximum")) {
        (Some(lo), Some(hi)) => s.push_str(&format!(" from {lo} to {hi}")),
        (Some(lo), None) => s.push_str(&format!(" of at least {lo}")),
        (None, Some(hi)) => s.push_str(&format!(" of at most {hi}")),
        (None, None) => {}
    }
    if let Some(p) = schema["pattern"].as_str() {
        s.push_str(&format!(" matching `{p}`"));
    }
    if let Some(req) = schema["required"].as_array() {
        let names: Vec<&str> = req.iter().filter_map(Value::as_str).collect();
        if !names.is_empty() {
            s.push_str(&format!(" with {}", names.join(", ")));
        }
    }
    Some(s)
}

/// The open gates of a run for `cairn status`: each with where it is and
/// the command that answers it, on the run the person named.
pub fn describe(root: &RunId, gates: &[Open]) -> String {
    let mut out = String::from("waiting for people:\n");
    for g in gates {
        let place = if &g.run == root {
            format!("  {}", g.node)
        } else {
            format!("  {} (in child run {})", g.node, g.run)
        };
        match &g.gate {
            Gate::Question {
                request_id,
                prompt,
                schema,
            } => {
                out.push_str(&format!("{place} asks: {}\n", prompt.trim()));
                if let Some(c) = schema.as_ref().and_then(constraints) {
                    out.push_str(&format!("    answer: {c}\n"));
                }
                let which = if gates.iter().filter(|o| o.request_id().is_some()).count() == 1 {
                    String::new()
                } else {
                    format!("{request_id} ")
                };
                out.push_str(&format!("    cairn answer {root} {which}'<answer>'\n"));
            }
            Gate::Approval { message } => {
                out.push_str(&format!("{place} waits for approval: {}\n", message.trim()));
                out.push_str(&format!(
                    "    cairn approve {root} {}   (or: cairn deny {root} {})\n",
                    g.node, g.node
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn constraints_say_what_an_answer_may_be() {
        assert_eq!(
            constraints(&json!({"type": "string", "enum": ["main", "release"]})).as_deref(),
            Some("one of: main, release")
        );
        assert_eq!(
            constraints(&json!({"type": "integer", "minimum": 1, "maximum": 5})).as_deref(),
            Some("integer from 1 to 5")
        );
        assert_eq!(
            constraints(&json!({"type": "object", "required": ["a", "b"]})).as_deref(),
            Some("object with a, b")
        );
        assert_eq!(constraints(&json!({})), None);
    }
}
