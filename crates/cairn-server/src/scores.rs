//! `GET /v1/scores`: what the nodes' scorers said across the runs in the
//! store, the same report as `cairn scores --json`.

use std::collections::HashMap;

use axum::extract::{Query, State};
use axum::Json;
use cairn_store::{aggregate_scores, ScoreFilter, ScoreReport};

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
    Ok(Json(report))
}
