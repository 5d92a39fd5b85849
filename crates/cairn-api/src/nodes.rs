//! What the web page draws of a run's nodes: the workflow's plan
//! (`GET /v1/runs/{id}/plan`) and one node's tool calls
//! (`GET /v1/runs/{id}/nodes/{node}/tool-calls`).

use cairn_events::RunId;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `GET /v1/runs/{id}/plan`: the nodes of the workflow a run was started
/// with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    /// The run.
    pub run_id: RunId,
    /// Its workflow's name.
    pub workflow: String,
    /// In file order, each group followed by its members; empty when the
    /// run's stored workflow does not parse.
    pub nodes: Vec<PlanNode>,
}

/// One node of a [`Plan`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlanNode {
    /// As events name the node (`review.fix` inside the loop `review`);
    /// inside a `for_each`, the template's path (`per_line.show`, where
    /// events name instances `per_line[3].show`).
    pub path: String,
    /// Its id in the file.
    pub id: String,
    /// Its kind's name (`command`, `loop`, ...).
    pub kind: String,
    /// Groups it is nested in.
    pub depth: usize,
    /// Paths of the siblings that must end before it starts.
    pub needs: Vec<String>,
    /// Where it starts in the workflow file.
    pub line: usize,
    /// The path of the group it belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// Its timeline chapter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<String>,
    /// A loop's most passes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_iterations: Option<u32>,
    /// A tool node's tool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// A group's members' paths, in file order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub children: Option<Vec<String>>,
    /// A failure handler's `if`: it runs once its needs ended, however
    /// they ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handler: Option<String>,
    /// A switch's branches, in the order written, the default last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cases: Option<Vec<PlanCase>>,
}

/// One branch of a switch in a [`PlanNode`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlanCase {
    /// What `on` must equal (`default` for the default branch).
    pub label: String,
    /// Paths of the siblings the branch enables.
    pub nodes: Vec<String>,
    /// The branch taken when no label matches.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub default: bool,
}

/// `GET /v1/runs/{id}/nodes/{node}/tool-calls`: the tool calls of one node
/// pass, by attempt then order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolCalls {
    /// The run.
    pub run_id: RunId,
    /// The node's path.
    pub node_id: String,
    /// The loop pass asked about.
    pub iteration: u32,
    /// Its calls.
    pub tool_calls: Vec<ToolCall>,
}

/// One tool call, with its arguments and, once it succeeded, its result
/// (which the events do not carry).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolCall {
    /// The node attempt that made it.
    pub attempt: u32,
    /// Its place within the attempt, from 1.
    pub tool_seq: u32,
    /// The tool's name.
    pub tool: String,
    /// The key a replay finds it by.
    pub idempotency_key: String,
    /// Whether it changes something outside the run.
    pub side_effect: bool,
    /// Whether calling it again is harmless.
    pub idempotent: bool,
    /// The call's arguments.
    pub input: Value,
    /// `running`, `success` or `error`.
    pub status: String,
    /// When it started, Unix ms.
    pub started_ms: i64,
    /// Its result, once it succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
    /// When it ended, Unix ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_ms: Option<i64>,
    /// The error object when it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<Value>,
}
