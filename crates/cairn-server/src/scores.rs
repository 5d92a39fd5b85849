//! `GET /v1/scores`: what the nodes' scorers said across the runs in the
//! store, the same report as `cairn scores --json`.

use std::collections::HashMap;

use axum::extract::{Query, State};
use axum::Json;
use cairn_api::{GenerationScores, ScoreReport, ScorerStats, WorkflowScores};
use cairn_store::{aggregate_scores, ScoreFilter};

use crate::api::{blocking, known_params, AppState};
use crate::error::ApiError;

/// Per workflow, node and scorer: count, failures, mean, min, max and
/// standard deviation, over all generations and per generation (newest
/// first); `workflow` and `node` narrow it.
pub(crate) async fn scores(
    State(state): State<AppState>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Json<ScoreReport>, ApiError> {
    known_params(&q, &["workflow", "node"])?;
    let filter = ScoreFilter {
        workflow: q.get("workflow").cloned(),
        node: q.get("node").cloned(),
    };
    let journal = state.journal().clone();
    let report =
        blocking(move || Ok(aggregate_scores(journal.backend().as_ref(), &filter)?)).await?;
    Ok(Json(report_of(report)))
}

/// The store's report as the API carries it. Every field is named, so that
/// a field added to the store's report is a compile error here rather than
/// one the API silently leaves out.
fn report_of(r: cairn_store::ScoreReport) -> ScoreReport {
    let cairn_store::ScoreReport { workflows } = r;
    ScoreReport {
        workflows: workflows
            .into_iter()
            .map(|w| {
                let cairn_store::WorkflowScores {
                    workflow,
                    scorers,
                    generations,
                } = w;
                WorkflowScores {
                    workflow,
                    scorers: scorers.into_iter().map(stats_of).collect(),
                    generations: generations
                        .into_iter()
                        .map(|g| {
                            let cairn_store::GenerationScores {
                                workflow_hash,
                                runs,
                                first_run_ms,
                                last_run_ms,
                                scorers,
                            } = g;
                            GenerationScores {
                                workflow_hash,
                                runs,
                                first_run_ms,
                                last_run_ms,
                                scorers: scorers.into_iter().map(stats_of).collect(),
                            }
                        })
                        .collect(),
                }
            })
            .collect(),
    }
}

fn stats_of(s: cairn_store::ScorerStats) -> ScorerStats {
    let cairn_store::ScorerStats {
        node_id,
        scorer_id,
        scorer_name,
        count,
        failed,
        mean,
        min,
        max,
        stddev,
    } = s;
    ScorerStats {
        node_id,
        scorer_id,
        scorer_name,
        count,
        failed,
        mean,
        min,
        max,
        stddev,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `cairn scores --json` prints the store's report and this route the
    /// API's: the two must be the same JSON.
    #[test]
    fn the_api_report_is_the_stores_json() {
        let stats = |mean| cairn_store::ScorerStats {
            node_id: "judge".into(),
            scorer_id: "s".into(),
            scorer_name: "S".into(),
            count: 2,
            failed: 1,
            mean,
            min: mean,
            max: mean,
            stddev: mean.map(|_| 0.0),
        };
        let store = cairn_store::ScoreReport {
            workflows: vec![cairn_store::WorkflowScores {
                workflow: "w".into(),
                scorers: vec![stats(Some(0.5)), stats(None)],
                generations: vec![cairn_store::GenerationScores {
                    workflow_hash: "ab".into(),
                    runs: 3,
                    first_run_ms: 1,
                    last_run_ms: 2,
                    scorers: vec![stats(Some(1.0))],
                }],
            }],
        };
        let want = serde_json::to_string(&store).unwrap();
        assert_eq!(serde_json::to_string(&report_of(store)).unwrap(), want);
    }
}
