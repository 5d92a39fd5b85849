//! What the web page draws of a run's nodes: the workflow's plan (the
//! nodes as written, for the graph) and one node's tool calls (arguments
//! and results, which the events do not carry).

use std::collections::HashMap;

use axum::extract::{Path, Query, State};
use axum::Json;
use cairn_api::{Plan, PlanCase, PlanNode, ToolCall, ToolCalls};
use cairn_store::RunRecord;
use cairn_workflow::{NodeKind, NodeSpec};

use crate::api::{blocking, existing_run, known_params, AppState};
use crate::error::ApiError;

/// The nodes of the workflow a run was started with, as a flat list in file
/// order (each group followed by its members): each with its path, id,
/// kind, the paths of the siblings it needs, and for a group its members'
/// paths. Empty when the run's stored workflow text does not parse (a run
/// written by hand, say): the page then draws the nodes its state knows.
///
/// A path is as events name nodes (`review.fix` inside the loop `review`),
/// except inside a `for_each`, whose members appear once as a template
/// (`per_line.show`) while events name each instance (`per_line[3].show`).
pub(crate) fn plan_of(rec: &RunRecord) -> Vec<PlanNode> {
    let Ok(wf) = cairn_workflow::parse(
        &rec.workflow_source,
        std::path::Path::new(&rec.workflow_path),
    ) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    // Groups nest at most a couple of hundred deep (the workflow limits),
    // but an explicit stack costs nothing and cannot overflow.
    let mut stack: Vec<(&NodeSpec, String, Option<String>, usize)> = wf
        .nodes
        .iter()
        .rev()
        .map(|n| (n, n.id.clone(), None, 0))
        .collect();
    while let Some((n, path, parent, depth)) = stack.pop() {
        let prefix = parent
            .as_deref()
            .map(|p| format!("{p}."))
            .unwrap_or_default();
        let mut v = PlanNode {
            path: path.clone(),
            id: n.id.clone(),
            kind: n.kind.name().to_string(),
            depth,
            needs: n.needs.iter().map(|d| format!("{prefix}{d}")).collect(),
            line: n.line,
            parent: parent.clone(),
            stage: n.stage.clone(),
            max_iterations: None,
            tool: None,
            children: None,
            handler: n.handler.then(|| n.if_.clone()).flatten(),
            cases: None,
        };
        match &n.kind {
            NodeKind::Loop(l) => v.max_iterations = Some(l.max_iterations),
            NodeKind::Tool { tool, .. } => v.tool = Some(tool.clone()),
            NodeKind::Switch(s) => {
                let paths = |ids: &[String]| ids.iter().map(|id| format!("{prefix}{id}")).collect();
                let mut cases: Vec<PlanCase> = s
                    .cases
                    .iter()
                    .map(|(label, ids)| PlanCase {
                        label: label.clone(),
                        nodes: paths(ids),
                        default: false,
                    })
                    .collect();
                if let Some(ids) = &s.default {
                    cases.push(PlanCase {
                        label: "default".into(),
                        nodes: paths(ids),
                        default: true,
                    });
                }
                v.cases = Some(cases);
            }
            NodeKind::Command(_)
            | NodeKind::Value(_)
            | NodeKind::Approval(_)
            | NodeKind::ForEach { .. }
            | NodeKind::Ask { .. }
            | NodeKind::Agent(_)
            | NodeKind::Workflow { .. } => {}
        }
        if let Some(children) = n.kind.children() {
            v.children = Some(
                children
                    .iter()
                    .map(|c| format!("{path}.{}", c.id))
                    .collect(),
            );
            for c in children.iter().rev() {
                stack.push((c, format!("{path}.{}", c.id), Some(path.clone()), depth + 1));
            }
        }
        out.push(v);
    }
    out
}

/// `GET /v1/runs/{id}/plan`.
pub(crate) async fn plan(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Plan>, ApiError> {
    let rec = existing_run(&state, &id).await?;
    let (run_id, workflow) = (rec.run_id.clone(), rec.workflow.clone());
    // Parsing a workflow of 100,000 nodes takes a while: off the async threads.
    let nodes = blocking(move || Ok(plan_of(&rec))).await?;
    Ok(Json(Plan {
        run_id,
        workflow,
        nodes,
    }))
}

/// `GET /v1/runs/{id}/nodes/{node}/tool-calls?iteration=N`: the tool calls
/// of one node pass, by attempt then order, with their arguments and, once
/// they succeeded, their results.
pub(crate) async fn tool_calls(
    State(state): State<AppState>,
    Path((id, node)): Path<(String, String)>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Json<ToolCalls>, ApiError> {
    known_params(&q, &["iteration"])?;
    let iteration: u32 = match q.get("iteration") {
        None => 0,
        Some(v) => v.parse().map_err(|_| {
            ApiError::bad_request(format!(
                "query parameter `iteration`: `{v}` is not a loop pass (0 to {})",
                u32::MAX
            ))
        })?,
    };
    let run = existing_run(&state, &id).await?.run_id;
    let journal = state.journal().clone();
    // A text that is no node path names no node of the run: it has no calls.
    let calls = match cairn_events::NodePath::parse(&node) {
        Ok(path) => {
            let run = run.clone();
            blocking(move || Ok(journal.backend().tool_calls(&run, &path, iteration)?)).await?
        }
        Err(_) => Vec::new(),
    };
    Ok(Json(ToolCalls {
        run_id: run,
        node_id: node,
        iteration,
        tool_calls: calls.into_iter().map(tool_call).collect(),
    }))
}

/// A tool call's row as the API shows it. Every field is named, so that a
/// field added to the row is a compile error here rather than one the API
/// silently leaves out.
fn tool_call(c: cairn_store::ToolCallRecord) -> ToolCall {
    let cairn_store::ToolCallRecord {
        run_id: _,
        node_id: _,
        iteration: _,
        attempt,
        tool_seq,
        tool,
        idempotency_key,
        side_effect,
        idempotent,
        input,
        output,
        started_ms,
        finished_ms,
        status,
        error,
    } = c;
    ToolCall {
        attempt,
        tool_seq,
        tool,
        idempotency_key,
        side_effect,
        idempotent,
        input,
        status: status.as_str().to_string(),
        started_ms,
        output,
        finished_ms,
        error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    /// A run's record with `src` as its workflow text.
    fn record(src: &str) -> RunRecord {
        RunRecord {
            run_id: cairn_events::RunId::parse("r").unwrap(),
            workflow: "p".into(),
            workflow_path: "p.yaml".into(),
            workflow_hash: String::new(),
            workflow_source: src.into(),
            input: json!({}),
            status: cairn_events::RunStatus::Running.into(),
            created_ms: 0,
            updated_ms: 0,
            parent_run_id: None,
        }
    }

    #[test]
    fn the_plan_lists_groups_then_their_members_with_needs_as_paths() {
        let src = r#"
name: p
nodes:
  - id: a
    value: 1
  - id: g
    needs: [a]
    stage: work
    loop:
      until: "true"
      max_iterations: 3
      nodes:
        - id: x
          value: 1
        - id: y
          needs: [x]
          value: 2
  - id: each
    needs: [a]
    for_each: "[1, 2]"
    nodes:
      - id: z
        value: 3
"#;
        let rec = record(src);
        let plan = serde_json::to_value(plan_of(&rec)).unwrap();
        let plan: &Vec<Value> = plan.as_array().unwrap();
        let paths: Vec<&str> = plan.iter().map(|n| n["path"].as_str().unwrap()).collect();
        assert_eq!(paths, ["a", "g", "g.x", "g.y", "each", "each.z"]);
        assert_eq!(plan[1]["needs"], json!(["a"]));
        assert_eq!(plan[1]["children"], json!(["g.x", "g.y"]));
        assert_eq!(plan[1]["maxIterations"], 3);
        assert_eq!(plan[1]["stage"], "work");
        assert_eq!(plan[3]["needs"], json!(["g.x"]));
        assert_eq!(plan[3]["parent"], "g");
        assert_eq!(plan[3]["depth"], 1);
        assert_eq!(plan[4]["kind"], "for_each");
        let broken = RunRecord {
            workflow_source: "nodes: [".into(),
            ..rec
        };
        assert!(plan_of(&broken).is_empty());
    }

    #[test]
    fn the_plan_names_a_switchs_branches_and_the_handlers() {
        let src = r#"
name: p
nodes:
  - id: g
    loop:
      until: "true"
      max_iterations: 2
      nodes:
        - id: route
          switch:
            on: "'bug'"
            cases: {bug: [fix], feature: [plan, fix]}
            default: [triage]
        - {id: fix, needs: [route], value: 1}
        - {id: plan, needs: [route], value: 2}
        - {id: triage, needs: [route], value: 3}
        - {id: notify, needs: [fix], if: "failure()", value: 4}
        - {id: plain, needs: [fix], if: "nodes.fix.output == 1", value: 5}
"#;
        let rec = record(src);
        let plan = serde_json::to_value(plan_of(&rec)).unwrap();
        let by = |path: &str| {
            plan.as_array()
                .unwrap()
                .iter()
                .find(|n| n["path"] == path)
                .cloned()
                .unwrap()
        };
        assert_eq!(by("g.route")["kind"], "switch");
        assert_eq!(
            by("g.route")["cases"],
            json!([
                {"label": "bug", "nodes": ["g.fix"]},
                {"label": "feature", "nodes": ["g.plan", "g.fix"]},
                {"label": "default", "nodes": ["g.triage"], "default": true},
            ])
        );
        assert_eq!(by("g.notify")["handler"], "failure()");
        // An ordinary `if` is no handler.
        assert!(by("g.plain").get("handler").is_none());
        assert!(by("g.fix").get("cases").is_none());
    }
}
