//! What the nodes' scorers said across runs: `GET /v1/scores`, the same
//! report as `cairn scores --json`.

use serde::{Deserialize, Serialize};

/// Scores of every workflow that has any, by workflow name.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ScoreReport {
    /// One entry per workflow, by name.
    pub workflows: Vec<WorkflowScores>,
}

/// One workflow's scores.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkflowScores {
    /// The workflow's name.
    pub workflow: String,
    /// Each scorer over every generation, by node then scorer.
    pub scorers: Vec<ScorerStats>,
    /// The same per generation of the file, newest first.
    pub generations: Vec<GenerationScores>,
}

/// One generation of a workflow file: the runs started with one text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GenerationScores {
    /// SHA-256 hex of the file's text.
    pub workflow_hash: String,
    /// Runs of this generation with at least one scorer's end.
    pub runs: u64,
    /// When the first of those runs was created, Unix ms.
    pub first_run_ms: i64,
    /// When the last of those runs was created, Unix ms.
    pub last_run_ms: i64,
    /// Its scorers, by node then scorer.
    pub scorers: Vec<ScorerStats>,
}

/// What one scorer of one node said over some runs; the statistics are
/// absent when it gave no score.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ScorerStats {
    /// The node's path.
    pub node_id: String,
    /// The scorer's id.
    pub scorer_id: String,
    /// Its label for people (the latest seen).
    pub scorer_name: String,
    /// Scores given.
    pub count: u64,
    /// Times it failed (no score).
    pub failed: u64,
    /// Mean of the scores.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean: Option<f64>,
    /// Lowest score.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<f64>,
    /// Highest score.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<f64>,
    /// Population standard deviation of the scores.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stddev: Option<f64>,
}
