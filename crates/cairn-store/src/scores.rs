//! Scores across runs: what each node's scorers said, per workflow, node
//! and scorer, in all and per generation of the workflow file (its hash),
//! so that a person sees whether a change to a prompt helped.
//!
//! Computed from the logs on any [`Backend`]: for each run only its
//! `ScorerFinished` and `ScorerFailed` events are read (the backends filter
//! by type), and the statistics are running sums, so memory grows with the
//! number of distinct scorers, not of runs or events.

use std::collections::BTreeMap;

use cairn_events::{EventKind, EventType};
use serde::Serialize;

use cairn_storage::prelude::*;
use cairn_storage::{EventQuery, RunFilter, RunRecord, StoreError};

/// Runs read per page of the run list.
const PAGE: usize = 500;

/// Which scores to aggregate; empty fields mean all.
#[derive(Debug, Default, Clone)]
pub struct ScoreFilter {
    /// Only runs of this workflow (by name).
    pub workflow: Option<String>,
    /// Only scores of this node (its path, as events name it).
    pub node: Option<String>,
}

/// Scores of every workflow that has any, by workflow name.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ScoreReport {
    /// One entry per workflow, by name.
    pub workflows: Vec<WorkflowScores>,
}

/// One workflow's scores.
#[derive(Debug, Clone, PartialEq, Serialize)]
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
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GenerationScores {
    /// SHA-256 hex of the file's text.
    pub workflow_hash: String,
    /// Runs of this generation with at least one scorer's end.
    pub runs: u64,
    /// When the first of those runs was created (Unix ms).
    pub first_run_ms: i64,
    /// When the last of those runs was created (Unix ms).
    pub last_run_ms: i64,
    /// Its scorers, by node then scorer.
    pub scorers: Vec<ScorerStats>,
}

/// What one scorer of one node said, over some runs.
#[derive(Debug, Clone, PartialEq, Serialize)]
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
    /// Mean of the scores; absent without any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mean: Option<f64>,
    /// Lowest score.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min: Option<f64>,
    /// Highest score.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max: Option<f64>,
    /// Population standard deviation of the scores.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stddev: Option<f64>,
}

/// Running statistics of one scorer (Welford's, stable for many scores).
#[derive(Debug, Clone, Default)]
struct Acc {
    name: String,
    count: u64,
    failed: u64,
    mean: f64,
    m2: f64,
    min: f64,
    max: f64,
}

impl Acc {
    fn add(&mut self, x: f64) {
        if self.count == 0 {
            (self.min, self.max) = (x, x);
        }
        self.count += 1;
        let d = x - self.mean;
        self.mean += d / self.count as f64;
        self.m2 += d * (x - self.mean);
        self.min = self.min.min(x);
        self.max = self.max.max(x);
    }

    fn stats(&self, node_id: &str, scorer_id: &str) -> ScorerStats {
        let some = |v: f64| (self.count > 0).then_some(v);
        ScorerStats {
            node_id: node_id.to_string(),
            scorer_id: scorer_id.to_string(),
            scorer_name: self.name.clone(),
            count: self.count,
            failed: self.failed,
            mean: some(self.mean),
            min: some(self.min),
            max: some(self.max),
            stddev: some((self.m2 / self.count.max(1) as f64).sqrt()),
        }
    }
}

/// (node, scorer) → statistics.
type Accs = BTreeMap<(String, String), Acc>;

#[derive(Default)]
struct Generation {
    runs: u64,
    first_ms: i64,
    last_ms: i64,
    accs: Accs,
}

/// workflow → (all generations, hash → generation).
type ByWorkflow = BTreeMap<String, (Accs, BTreeMap<String, Generation>)>;

impl Generation {
    /// Counts a run in this generation once, from `began` (when the run,
    /// or the reload that brought this text, began).
    fn count_run(&mut self, began: i64) {
        self.first_ms = if self.runs == 0 {
            began
        } else {
            self.first_ms.min(began)
        };
        self.last_ms = self.last_ms.max(began);
        self.runs += 1;
    }
}

/// Aggregates the scores of the runs in `backend` that `filter` selects.
pub fn aggregate_scores(
    backend: &dyn Backend,
    filter: &ScoreFilter,
) -> Result<ScoreReport, StoreError> {
    let mut by_wf = ByWorkflow::new();
    let mut offset = 0;
    loop {
        let runs = backend.list_runs(&RunFilter {
            workflow: filter.workflow.clone(),
            limit: Some(PAGE),
            offset: Some(offset),
            ..RunFilter::default()
        })?;
        offset += runs.len();
        for run in &runs {
            add_run(backend, run, filter, &mut by_wf)?;
        }
        if runs.len() < PAGE {
            break;
        }
    }
    Ok(report(by_wf))
}

/// Adds one run's scores to `by_wf`, each to the generation of the text
/// that was in force when it was scored.
fn add_run(
    backend: &dyn Backend,
    run: &RunRecord,
    filter: &ScoreFilter,
    by_wf: &mut ByWorkflow,
) -> Result<(), StoreError> {
    // A reload mid-run starts a generation of its own: the scores after it
    // are the new text's (its hash is stored with the generation).
    let query = EventQuery {
        types: vec![
            EventType::ScorerFinished,
            EventType::ScorerFailed,
            EventType::WorkflowReloaded,
        ],
        ..EventQuery::default()
    };
    let events = backend.read_events(&run.run_id, &query)?;
    // (hash, when it began) of the generation in force.
    let mut current = (run.workflow_hash.clone(), run.created_ms);
    let mut counted: Vec<String> = Vec::new();
    for stored in &events {
        let ev = stored.decode().map_err(|e| StoreError::BadRow {
            run: run.run_id.to_string(),
            detail: e.to_string(),
        })?;
        if let EventKind::WorkflowReloaded { generation, .. } = &ev.kind {
            if let Some(g) = backend.generation(&run.run_id, *generation)? {
                current = (g.workflow_hash, ev.timestamp_ms);
            }
            continue;
        }
        let Some(node) = ev.scope.node_id.as_deref() else {
            continue;
        };
        if filter.node.as_deref().is_some_and(|n| n != node) {
            continue;
        }
        let (id, name, score) = match &ev.kind {
            EventKind::ScorerFinished {
                scorer_id,
                scorer_name,
                score,
                ..
            } => (scorer_id, scorer_name, Some(*score)),
            EventKind::ScorerFailed {
                scorer_id,
                scorer_name,
                ..
            } => (scorer_id, scorer_name, None),
            _ => continue,
        };
        let (all, gens) = by_wf.entry(run.workflow.clone()).or_default();
        let g = gens.entry(current.0.clone()).or_default();
        if !counted.contains(&current.0) {
            counted.push(current.0.clone());
            g.count_run(current.1);
        }
        for accs in [&mut *all, &mut g.accs] {
            let acc = accs.entry((node.to_string(), id.clone())).or_default();
            acc.name.clone_from(name);
            match score {
                Some(x) => acc.add(x),
                None => acc.failed += 1,
            }
        }
    }
    Ok(())
}

/// The report of what [`add_run`] gathered: workflows by name, each
/// generation newest first.
fn report(by_wf: ByWorkflow) -> ScoreReport {
    let stats = |accs: &Accs| -> Vec<ScorerStats> {
        accs.iter().map(|((n, s), a)| a.stats(n, s)).collect()
    };
    let workflows = by_wf
        .into_iter()
        .map(|(workflow, (all, gens))| {
            let mut generations: Vec<GenerationScores> = gens
                .into_iter()
                .map(|(hash, g)| GenerationScores {
                    workflow_hash: hash,
                    runs: g.runs,
                    first_run_ms: g.first_ms,
                    last_run_ms: g.last_ms,
                    scorers: stats(&g.accs),
                })
                .collect();
            generations.sort_by(|a, b| {
                b.last_run_ms
                    .cmp(&a.last_run_ms)
                    .then_with(|| a.workflow_hash.cmp(&b.workflow_hash))
            });
            WorkflowScores {
                workflow,
                scorers: stats(&all),
                generations,
            }
        })
        .collect();
    ScoreReport { workflows }
}
