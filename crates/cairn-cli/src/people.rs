//! What waits for a person in a run and in its child runs: the questions
//! and approvals `cairn status` lists, and that `cairn answer`, `approve`
//! and `deny` on the run reach wherever in its tree of runs they are (a
//! question asked inside a child workflow is answered on the parent).

use cairn_engine::Engine;

use crate::bad_input;
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

/// The open question of `open` (the gates of `run`'s tree) that `which`
/// names (its request id or node path), or the only one when `which` is
/// `None`; bad input that lists them otherwise.
pub fn pick_question(run: &RunId, open: Vec<Open>, which: Option<&str>) -> anyhow::Result<Open> {
    let open: Vec<Open> = open
        .into_iter()
        .filter(|g| g.request_id().is_some())
        .collect();
    let list = |gates: &[Open]| {
        gates
            .iter()
            .map(|g| {
                format!(
                    "\n  {} ({}{})",
                    g.request_id().unwrap_or_default(),
                    g.node,
                    if &g.run == run {
                        String::new()
                    } else {
                        format!(" in child run {}", g.run)
                    }
                )
            })
            .collect::<String>()
    };
    let found: Vec<Open> = match which {
        None => open.clone(),
        Some(w) => open.iter().filter(|g| g.is_named(w)).cloned().collect(),
    };
    match (found.len(), which) {
        (1, _) => Ok(found.into_iter().next().expect("one")),
        (0, None) => Err(bad_input(format!("run {run} has no open question"))),
        (0, Some(w)) if open.is_empty() => Err(bad_input(format!(
            "run {run} has no open question (`{w}` names none)"
        ))),
        (0, Some(w)) => Err(bad_input(format!(
            "no open question of run {run} is `{w}`; its open questions:{}",
            list(&open)
        ))),
        _ => Err(bad_input(format!(
            "run {run} has {} open questions; name one (its request id or node): \
             cairn answer {run} <question> <answer>{}",
            found.len(),
            list(&found)
        ))),
    }
}

/// Says that `target` (a question of `run`'s tree) was answered: the
/// API's `{"runId", "requestId"}` with `json`, else a line that names the
/// child run when the question was one of a child's.
pub fn report_answered(run: &RunId, target: &Open, json: bool) -> anyhow::Result<()> {
    let rid = target.request_id().unwrap_or_default();
    if json {
        let done = cairn_api::Answered {
            run_id: target.run.clone(),
            request_id: rid.to_string(),
        };
        println!("{}", serde_json::to_string(&done)?);
    } else if &target.run == run {
        println!("answered {rid} ({}) of run {run}", target.node);
    } else {
        println!(
            "answered {rid} ({}) of child run {} of run {run}",
            target.node, target.run
        );
    }
    Ok(())
}

/// Every open gate of `run` and of its child runs that have not ended, as
/// a server's `GET /v1/runs/{id}` tells them, the run's own first. At most
/// [`MAX_TREE_RUNS`] runs are asked.
pub async fn open_gates_remote(
    client: &cairn_client::Client,
    run: &RunId,
) -> Result<Vec<Open>, cairn_client::ClientError> {
    let mut out = Vec::new();
    let mut todo = std::collections::VecDeque::from([run.clone()]);
    let mut seen = std::collections::HashSet::new();
    while let Some(r) = todo.pop_front() {
        if !seen.insert(r.clone()) || seen.len() > MAX_TREE_RUNS {
            continue;
        }
        let detail = client.run(&r).await?;
        let v = detail.as_value();
        if let Some(qs) = v["questions"].as_object() {
            for (rid, q) in qs {
                if q.get("answer").is_some_and(|a| !a.is_null()) {
                    continue;
                }
                out.push(Open {
                    run: r.clone(),
                    node: q["nodeId"].as_str().unwrap_or_default().to_string(),
                    gate: Gate::Question {
                        request_id: rid.clone(),
                        prompt: q["prompt"].as_str().unwrap_or_default().to_string(),
                        schema: q.get("schema").filter(|s| !s.is_null()).cloned(),
                    },
                });
            }
        }
        for n in v["nodes"].as_array().into_iter().flatten() {
            if n["status"] == "waiting-approval" {
                out.push(Open {
                    run: r.clone(),
                    node: n["nodeId"].as_str().unwrap_or_default().to_string(),
                    gate: Gate::Approval {
                        message: n["approvalMessage"]
                            .as_str()
                            .unwrap_or_default()
                            .to_string(),
                    },
                });
            }
        }
        for c in v["children"].as_array().into_iter().flatten() {
            // `state` is the child's own record now; `status` what the
            // parent's log says of its end.
            let status = c["state"].as_str().or(c["status"].as_str()).unwrap_or("");
            if matches!(status, "finished" | "failed" | "cancelled") {
                continue;
            }
            if let Some(id) = c["runId"].as_str().and_then(|t| RunId::parse(t).ok()) {
                todo.push_back(id);
            }
        }
    }
    Ok(out)
}

/// Most runs of a tree a remote command asks the server about.
const MAX_TREE_RUNS: usize = 256;

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
/// the command that answers it, on the run the person named; `via` ends
/// each command (` --server URL` for a server's run, else nothing).
pub fn describe(root: &RunId, gates: &[Open], via: &str) -> String {
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
                out.push_str(&format!("    cairn answer {root} {which}'<answer>'{via}\n"));
            }
            Gate::Approval { message } => {
                out.push_str(&format!("{place} waits for approval: {}\n", message.trim()));
                out.push_str(&format!(
                    "    cairn approve {root} {}{via}   (or: cairn deny {root} {}{via})\n",
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
