//! `POST /v1/runs/{id}/revert` and `POST /v1/runs/{id}/fork`: a run's files
//! put back, on the machine that holds them (the server's), so that a
//! person at another machine reverts or forks through `cairn --server`.
//! The engine's answers become the API's bodies here, for the server and
//! for `cairn revert`/`fork` on a store, which print the same JSON.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use cairn_api::{FilesPlan, ForkBody, Forked, RevertBody, Reverted};
use cairn_engine::{ForkPoint, ForkRequest, RevertRequest, StartOptions};
use cairn_events::RunId;

use crate::api::{blocking, existing_run, AppState, JsonBody};
use crate::error::ApiError;

/// The API's plan from the engine's: the same JSON `--dry-run --json`
/// prints, read back into its type.
pub fn plan_body(plan: &cairn_engine::FilesPlan) -> FilesPlan {
    serde_json::from_value(plan.to_json()).expect("a files plan reads as the API's plan")
}

/// The engine's revert as the API answers it (and `cairn revert --json`
/// prints it).
pub fn reverted_body(r: cairn_engine::Reverted, dry_run: bool) -> Reverted {
    Reverted {
        plan: plan_body(&r.plan),
        node: r.node,
        iteration: r.iteration,
        attempt: r.attempt,
        dry_run,
        applied: r.applied,
        before: r.before,
        written: r.written,
        removed: r.removed,
        finished_open: r.finished_open,
        error: r.error.map(|e| e.message),
    }
}

/// The engine's fork of `from` as the API answers it (`starts_after` is
/// set by whoever drives the fork).
pub fn forked_body(from: &RunId, f: &cairn_engine::Forked, dry_run: bool) -> Forked {
    Forked {
        run_id: f.made.then(|| f.run_id.clone()),
        from: from.clone(),
        seq: f.seq,
        starts_after: 0,
        snapshot: f.snapshot.clone(),
        made: f.made,
        dry_run,
        written: f.written,
        removed: f.removed,
        plan: plan_body(&f.plan),
    }
}

/// A plan refused for its conflicts: 409 `files_conflict`, the refused
/// answer in `details`, so a client shows what it would have overwritten.
fn refused(what: &str, conflicts: usize, details: serde_json::Value) -> ApiError {
    let mut e = ApiError::new(
        StatusCode::CONFLICT,
        "files_conflict",
        format!(
            "{conflicts} path(s) the run changed were changed since by something else; nothing \
             was done. Look at them, then {what} again with force to overwrite them"
        ),
    );
    e.details = Some(details);
    e
}

pub(crate) async fn revert(
    State(state): State<AppState>,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<RevertBody>,
) -> Result<Response, ApiError> {
    let run = existing_run(&state, &id).await?.run_id;
    let dry_run = body.dry_run;
    let r = state
        .engine()
        .revert(
            &run,
            RevertRequest {
                node: body.node,
                iteration: body.iteration,
                attempt: body.attempt,
                force: body.force,
                dry_run,
            },
        )
        .await?;
    let out = reverted_body(r, dry_run);
    if !out.applied && out.plan.refused() {
        let n = out.plan.conflicts.len();
        return Err(refused(
            "revert",
            n,
            serde_json::to_value(&out).expect("an answer serializes to JSON"),
        ));
    }
    Ok(Json(out).into_response())
}

pub(crate) async fn fork(
    State(state): State<AppState>,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<ForkBody>,
) -> Result<Response, ApiError> {
    if state.draining() {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting_down",
            "the server is stopping and makes no forks",
        ));
    }
    let from = existing_run(&state, &id).await?.run_id;
    if body.at.trim().is_empty() {
        return Err(ApiError::bad_request("request body: `at` is empty"));
    }
    let workflow = match body.workflow {
        Some(name) => {
            let dir = state.cfg().workflows_dir.clone();
            let max = state.cfg().max_workflow_bytes;
            Some(blocking(move || crate::workflows::load(dir.as_deref(), &name, max)).await?)
        }
        None => None,
    };
    let run_id = body.run_id.as_deref().map(RunId::parse).transpose()?;
    let dry_run = body.dry_run;
    let forked = state
        .engine()
        .fork(
            &from,
            ForkRequest {
                at: ForkPoint::parse(&body.at),
                input: body.input,
                workflow,
                run_id,
                force: body.force,
                dry_run,
            },
        )
        .await?;
    let mut out = forked_body(&from, &forked, dry_run);
    if !forked.made {
        if out.plan.refused() {
            let n = out.plan.conflicts.len();
            return Err(refused(
                "fork",
                n,
                serde_json::to_value(&out).expect("an answer serializes to JSON"),
            ));
        }
        return Ok(Json(out).into_response());
    }
    // Made: the fork goes on in the server, as a resumed run does.
    out.starts_after = state
        .journal()
        .backend()
        .last_seq_async(&forked.run_id)
        .await?;
    let handle = state
        .engine()
        .resume(&forked.run_id, StartOptions::default())
        .await?;
    out.run_id = Some(handle.run_id.clone());
    drop(handle);
    Ok((StatusCode::CREATED, Json(out)).into_response())
}
