//! Two runs compared (`cairn replay`'s report, `GET
//! /v1/runs/{id}/compare/{other}`): where a replay parts from the run it
//! replays, and every node's outcome side by side. A view derived from two
//! logs, as the Activity view is from one: the engine makes it
//! (`cairn_engine::replay::report`), the API sends it, clients read it.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Two runs compared.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Comparison {
    /// The run replayed.
    pub original: String,
    /// The replay.
    pub replay: String,
    /// The replay's model steps answered from the original's record.
    pub steps_replayed: u32,
    /// The replay's model steps whose request the original never made
    /// (asked of the model, in a live replay).
    pub steps_new: u32,
    /// Where the two part; `None` when the replay asked nothing the
    /// original did not.
    pub divergence: Option<Divergence>,
    /// Whether a node of the replay failed for asking what the original
    /// never did (a replay that is not live stops there).
    pub stopped: bool,
    /// Every node pass of either run, in the order of its name.
    pub nodes: Vec<NodeCompared>,
    /// Both runs' outputs.
    pub output: Side<Option<Value>>,
    /// Whether the replay's output is the original's.
    pub same_output: bool,
}

/// The same thing in both runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Side<T> {
    /// In the original.
    pub original: T,
    /// In the replay.
    pub replay: T,
}

/// Where a replay first asked what the original never did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Divergence {
    /// The node and its pass.
    pub node_id: String,
    pub iteration: u32,
    /// The replay's attempt and model step, for a request.
    pub attempt: Option<u32>,
    pub step: Option<u32>,
    /// `request` (a model call), or what else the node said it diverged
    /// on (`question`, `approval`, `tool`, `command`, `child`).
    pub kind: String,
    /// In a sentence.
    pub message: String,
    /// For a request: how it differs from the original's at the same place.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request: Option<RequestDiff>,
}

/// A replay's request against the original's at the same node and step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestDiff {
    /// Whether the original has a request at that place at all (it may
    /// have answered a step earlier).
    pub original_found: bool,
    /// The system prompts, when they differ.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub system: Option<Side<Option<String>>>,
    /// The messages that differ, by position.
    pub messages: Vec<MessageDiff>,
    /// Tools offered by the replay only.
    pub tools_added: Vec<String>,
    /// Tools the original offered and the replay does not.
    pub tools_removed: Vec<String>,
    /// Tools offered by both with another description or parameters.
    pub tools_changed: Vec<String>,
}

/// One message position where the two requests differ.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MessageDiff {
    /// Its position in the conversation, from 0.
    pub index: usize,
    /// `user`, `assistant` or `tool results`, on each side.
    pub role: Side<Option<String>>,
    /// The texts.
    pub text: Side<Option<String>>,
    /// A line diff (`-` the original's, `+` the replay's).
    pub diff: String,
}

/// One node pass in both runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeCompared {
    pub node_id: String,
    pub iteration: u32,
    /// `finished`, `failed`, `skipped`, `cancelled`, `running`, or `absent`.
    pub status: Side<String>,
    pub output: Side<Option<Value>>,
    /// The error of a failed pass.
    pub error: Side<Option<Value>>,
    /// The same status and output in both.
    pub same: bool,
}
