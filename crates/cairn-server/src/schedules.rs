//! Schedules: runs started at due times, by whichever instance of the
//! store decides each due time first (see `cairn_storage::Schedules`), and
//! the routes that manage them (`/v1/schedules`).
//!
//! Exactly once per due time rests on two things: the cursor's
//! compare-and-set, so that one instance decides a due time, and a run id
//! made from the schedule's name and the due time, so that a decision taken
//! up again after a crash (its fire still `firing`) starts no second run.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use cairn_api::{FireList, FireView, ScheduleList, ScheduleView};
use cairn_events::{RunId, Trigger, TriggerKind};
use cairn_store::{Cursor, FireOutcome, FireRecord, ScheduleRecord, Schedules};
use cairn_workflow::triggers::{Catchup, Overlap, ScheduleDef};
use serde_json::json;

use crate::api::{blocking, AppState, JsonBody};
use crate::error::ApiError;

/// Longest the scheduler sleeps between looks: schedules created, paused
/// or decided by another instance are seen within it.
const LOOK_EVERY: Duration = Duration::from_secs(1);
/// A fire left `firing` this long is taken to be its decider's crash, and
/// started here (its run id makes a second start a no-op).
const FIRING_STALE_MS: i64 = 5_000;
/// Most due times one look walks through for one schedule (a schedule
/// every second, found after a week's downtime, is 604,800 of them).
const MAX_WALK: usize = 100_000;
/// Most rows of history a request reads.
const MAX_FIRES: usize = 1000;

/// Fires this instance decided or started, by schedule and outcome, for
/// `/metrics`.
#[derive(Default)]
pub(crate) struct FireCounts(Mutex<BTreeMap<(String, &'static str), u64>>);

impl FireCounts {
    fn add(&self, schedule: &str, outcome: FireOutcome) {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        *m.entry((schedule.to_string(), outcome.as_str()))
            .or_default() += 1;
    }

    /// The counters in Prometheus' text form.
    pub(crate) fn render(&self) -> String {
        let m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = String::from(
            "# HELP cairn_schedule_fires_total Due times this instance decided, by schedule and what they did.\n\
             # TYPE cairn_schedule_fires_total counter\n",
        );
        for ((s, o), n) in m.iter() {
            out.push_str(&format!(
                "cairn_schedule_fires_total{{schedule=\"{s}\",outcome=\"{o}\"}} {n}\n"
            ));
        }
        out
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// The run a schedule starts for a due time: the same on every instance
/// and after a crash.
pub(crate) fn fire_run_id(name: &str, due_ms: i64) -> RunId {
    RunId::parse(&format!("sched-{name}-{due_ms}")).expect("schedule names make run ids")
}

fn store(state: &AppState) -> Result<&dyn Schedules, ApiError> {
    state.journal().backend().schedules().ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_IMPLEMENTED,
            "schedules_unsupported",
            "this store keeps no schedules",
        )
    })
}

fn definition(rec: &ScheduleRecord) -> Result<ScheduleDef, String> {
    cairn_workflow::parse_schedule(
        &rec.definition.to_string(),
        std::path::Path::new(&format!("schedule {}", rec.name)),
    )
    .map_err(|e| e.to_string())
}

/// Writes the triggers file's schedules into the store: new ones are
/// added, changed ones replaced (their cursor set from now), and those the
/// file no longer declares deleted. Schedules made through the API are
/// left alone. Blocking.
pub(crate) fn sync_file(state: &AppState) -> Result<(), cairn_store::StoreError> {
    let Some(store) = state.journal().backend().schedules() else {
        return Ok(());
    };
    let declared = &state.cfg().triggers.schedules;
    let now = now_ms();
    let existing = store.list_schedules()?;
    for def in declared {
        let json = def.to_json();
        match existing.iter().find(|r| r.name == def.name) {
            Some(r) if r.from_file && r.definition == json => continue,
            Some(r) if !r.from_file => {
                tracing::warn!(schedule = %def.name, "the triggers file declares a schedule the API made; the file's replaces it");
            }
            _ => {}
        }
        let rec = ScheduleRecord {
            name: def.name.clone(),
            definition: json,
            from_file: true,
            paused: existing
                .iter()
                .find(|r| r.name == def.name)
                .is_some_and(|r| r.paused),
            cursor: Cursor {
                next_due_ms: def.timing.next_after(now),
                pending_due_ms: None,
            },
            last_run_id: existing
                .iter()
                .find(|r| r.name == def.name)
                .and_then(|r| r.last_run_id.clone()),
            updated_ms: now,
        };
        store.put_schedule(&rec, true)?;
    }
    for r in existing.iter().filter(|r| r.from_file) {
        if !declared.iter().any(|d| d.name == r.name) {
            store.delete_schedule(&r.name)?;
        }
    }
    Ok(())
}

/// The scheduler: decides due times as they come, until the server stops.
pub(crate) async fn run(state: AppState) {
    if state.journal().backend().schedules().is_none() {
        return;
    }
    {
        let st = state.clone();
        match tokio::task::spawn_blocking(move || sync_file(&st)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "schedules: the triggers file's schedules could not be stored")
            }
            Err(e) => tracing::warn!(error = %e, "schedules: sync failed"),
        }
    }
    loop {
        if state.draining() {
            return;
        }
        let st = state.clone();
        let soonest = match tokio::task::spawn_blocking(move || look(&st)).await {
            Ok(Ok(Look { fires, soonest })) => {
                for (def, fire) in fires {
                    start_fire(&state, &def, fire).await;
                }
                soonest
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "schedules: the store could not be read");
                None
            }
            Err(e) => {
                tracing::warn!(error = %e, "schedules: a look failed");
                None
            }
        };
        tokio::time::sleep(wait_for(soonest)).await;
    }
}

/// How long until `soonest`, at most [`LOOK_EVERY`].
fn wait_for(soonest: Option<i64>) -> Duration {
    match soonest {
        Some(due) => {
            let ms = (due - now_ms()).clamp(0, LOOK_EVERY.as_millis() as i64);
            Duration::from_millis(ms as u64)
        }
        None => LOOK_EVERY,
    }
}

/// Whether a run of the schedule is going (or decided and not started).
fn going(state: &AppState, last: Option<&RunId>) -> bool {
    let Some(id) = last else { return false };
    match state.journal().backend().get_run(id) {
        Ok(Some(rec)) => !rec.status.is_terminal(),
        // Decided, not yet started: its starter is on it.
        Ok(None) => false,
        Err(_) => true,
    }
}

/// What one look at the schedules found.
struct Look {
    /// The due times it decided here, to start.
    fires: Vec<(ScheduleDef, FireRecord)>,
    /// The soonest due time not decided yet, of every schedule.
    soonest: Option<i64>,
}

/// One look at every schedule. A definition is read (and its cron
/// expression parsed) only for a schedule with something to decide.
/// Blocking.
fn look(state: &AppState) -> Result<Look, cairn_store::StoreError> {
    let mut out = Look {
        fires: Vec::new(),
        soonest: None,
    };
    let Some(store) = state.journal().backend().schedules() else {
        return Ok(out);
    };
    let now = now_ms();
    let rows = store.list_schedules()?;
    let mut sooner = |due: Option<i64>| {
        out.soonest = match (out.soonest, due) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    };
    let mut fires = Vec::new();
    // Fires a crash left decided and not started.
    for f in store.firing()? {
        if now - f.decided_ms < FIRING_STALE_MS {
            continue;
        }
        if let Some(def) = rows
            .iter()
            .find(|r| r.name == f.schedule)
            .and_then(|r| definition(r).ok())
        {
            fires.push((def, f));
        }
    }
    for rec in rows.iter().filter(|r| !r.paused) {
        let due = rec.cursor.next_due_ms.is_some_and(|d| d <= now);
        if !due && rec.cursor.pending_due_ms.is_none() {
            sooner(rec.cursor.next_due_ms);
            continue;
        }
        let def = match definition(rec) {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(schedule = %rec.name, error = %e, "schedules: a stored definition does not read");
                continue;
            }
        };
        sooner(def.timing.next_after(now));
        let decided = decide(state, store, rec, &def, now)?;
        fires.extend(decided.into_iter().map(|f| (def.clone(), f)));
    }
    out.fires = fires;
    Ok(out)
}

/// Decides what the schedule's due times up to `now` do, and moves its
/// cursor past them; the fires to start here, or none when another
/// instance decided first.
fn decide(
    state: &AppState,
    store: &dyn Schedules,
    rec: &ScheduleRecord,
    def: &ScheduleDef,
    now: i64,
) -> Result<Vec<FireRecord>, cairn_store::StoreError> {
    let cursor = rec.cursor;
    let due_now = cursor.next_due_ms.filter(|d| *d <= now);
    if due_now.is_none() && cursor.pending_due_ms.is_none() {
        // Nothing to decide: the common case, and no read of a run.
        return Ok(Vec::new());
    }
    let mut busy = going(state, rec.last_run_id.as_ref());
    let fire = |due: i64, outcome: FireOutcome, detail: Option<String>| FireRecord {
        schedule: rec.name.clone(),
        due_ms: due,
        decided_ms: now,
        outcome,
        run_id: (outcome == FireOutcome::Firing).then(|| fire_run_id(&rec.name, due)),
        detail,
    };
    let mut fires = Vec::new();
    let mut new = cursor;
    // A due time that waited for the going run.
    if let Some(p) = cursor.pending_due_ms {
        if !busy {
            fires.push(fire(p, FireOutcome::Firing, None));
            new.pending_due_ms = None;
            busy = true;
        }
    }
    if let Some(first) = due_now {
        let mut dues = Vec::new();
        let mut d = Some(first);
        while let Some(due) = d.filter(|due| *due <= now) {
            if dues.len() == MAX_WALK {
                break;
            }
            dues.push(due);
            d = def.timing.next_after(due);
        }
        new.next_due_ms = match d {
            Some(due) if due <= now => def.timing.next_after(now),
            other => other,
        };
        let grace = def.grace.as_millis() as i64;
        let (late, on_time): (Vec<i64>, Vec<i64>) =
            dues.iter().partition(|due| now - **due > grace);
        let caught: Vec<i64> = match def.catchup {
            _ if late.is_empty() => Vec::new(),
            Catchup::Skip => Vec::new(),
            Catchup::Once if on_time.is_empty() => vec![*late.last().expect("not empty")],
            Catchup::Once => Vec::new(),
            Catchup::All => {
                let n = def.catchup_limit as usize;
                late[late.len().saturating_sub(n)..].to_vec()
            }
        };
        let missed = late.len() - caught.len();
        if missed > 0 {
            let first_missed = *late
                .iter()
                .find(|d| !caught.contains(d))
                .expect("a missed one");
            fires.push(fire(
                first_missed,
                FireOutcome::Missed,
                Some(format!("{missed} due times missed while no instance ran")),
            ));
        }
        for due in caught.into_iter().chain(on_time) {
            let outcome = if !busy || def.overlap == Overlap::Allow {
                FireOutcome::Firing
            } else if def.overlap == Overlap::QueueOne && new.pending_due_ms.is_none() {
                new.pending_due_ms = Some(due);
                FireOutcome::Queued
            } else {
                FireOutcome::Skipped
            };
            busy |= outcome == FireOutcome::Firing;
            fires.push(fire(due, outcome, None));
        }
    }
    if fires.is_empty() && new == cursor {
        return Ok(Vec::new());
    }
    if !store.advance_schedule(&rec.name, cursor, new, &fires)? {
        // Another instance decided these due times.
        return Ok(Vec::new());
    }
    for f in fires.iter().filter(|f| f.outcome != FireOutcome::Firing) {
        state.fire_counts().add(&f.schedule, f.outcome);
    }
    Ok(fires
        .into_iter()
        .filter(|f| f.outcome == FireOutcome::Firing)
        .collect())
}

/// Starts a decided fire's run (a second start of the same due time finds
/// its run there) and records what came of it.
async fn start_fire(state: &AppState, def: &ScheduleDef, mut fire: FireRecord) {
    let run_id = fire
        .run_id
        .clone()
        .unwrap_or_else(|| fire_run_id(&def.name, fire.due_ms));
    let outcome = start(state, def, &run_id, fire.due_ms).await;
    fire.run_id = Some(run_id);
    fire.decided_ms = now_ms();
    match outcome {
        Ok(()) => fire.outcome = FireOutcome::Started,
        Err(why) => {
            tracing::warn!(schedule = %def.name, due_ms = fire.due_ms, error = %why, "schedules: a run could not start");
            fire.outcome = FireOutcome::Failed;
            fire.detail = Some(why);
        }
    }
    state.fire_counts().add(&fire.schedule, fire.outcome);
    let st = state.clone();
    let written = tokio::task::spawn_blocking(move || match st.journal().backend().schedules() {
        Some(s) => s.update_fire(&fire),
        None => Ok(()),
    })
    .await;
    if let Ok(Err(e)) = written {
        tracing::warn!(error = %e, "schedules: a fire's outcome could not be recorded");
    }
}

/// Starts the schedule's run for `due_ms`, or finds it started.
async fn start(
    state: &AppState,
    def: &ScheduleDef,
    run_id: &RunId,
    due_ms: i64,
) -> Result<(), String> {
    let dir = state.cfg().workflows_dir.clone();
    let max = state.cfg().max_workflow_bytes;
    let name = def.workflow.clone();
    let wf = blocking(move || crate::workflows::load(dir.as_deref(), &name, max))
        .await
        .map_err(|e| e.message)?;
    let input = match &def.input {
        None => json!({}),
        Some(v) => {
            let due = rfc3339(due_ms);
            let ctx = json!({"schedule": {"name": def.name, "dueMs": due_ms, "due": due}});
            cairn_workflow::Templates::new()
                .render_value(v, &ctx)
                .map_err(|e| format!("input: {e}"))?
        }
    };
    let opts = cairn_engine::StartOptions {
        run_id: Some(run_id.clone()),
        trigger: Some(Trigger {
            kind: TriggerKind::Schedule,
            name: def.name.clone(),
            due_ms: Some(due_ms),
            delivery_id: None,
        }),
        ..Default::default()
    };
    match state.engine().submit(wf, input, opts).await {
        Ok(_) => Ok(()),
        Err(cairn_engine::EngineError::Store(cairn_store::StoreError::RunExists(_))) => Ok(()),
        Err(e) => Err(e.to_string()),
    }
}

/// A Unix time in ms as RFC 3339 UTC (`2026-03-02T09:30:00.000Z`).
fn rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|d| d.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_default()
}

/// A schedule's row as the API shows it (also `cairn schedules` on a
/// store here).
pub fn view(rec: ScheduleRecord) -> ScheduleView {
    ScheduleView {
        name: rec.name,
        definition: rec.definition,
        from_file: rec.from_file,
        paused: rec.paused,
        next_due_ms: rec.cursor.next_due_ms,
        pending_due_ms: rec.cursor.pending_due_ms,
        last_run_id: rec.last_run_id,
    }
}

/// A history row as the API shows it.
pub fn fire_view(f: FireRecord) -> FireView {
    FireView {
        due_ms: f.due_ms,
        decided_ms: f.decided_ms,
        outcome: f.outcome.as_str().to_string(),
        run_id: f.run_id,
        detail: f.detail,
    }
}

fn no_schedule(name: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "schedule_not_found",
        format!("no schedule `{name}`"),
    )
}

/// `GET /v1/schedules`.
pub(crate) async fn list(State(state): State<AppState>) -> Result<Json<ScheduleList>, ApiError> {
    let schedules = blocking(move || {
        let rows = store(&state)?.list_schedules()?;
        Ok(rows.into_iter().map(view).collect())
    })
    .await?;
    Ok(Json(ScheduleList { schedules }))
}

/// `GET /v1/schedules/{name}`.
pub(crate) async fn get(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Json<ScheduleView>, ApiError> {
    blocking(move || {
        let rec = store(&state)?.get_schedule(&name)?;
        rec.map(view).map(Json).ok_or_else(|| no_schedule(&name))
    })
    .await
}

/// `POST /v1/schedules`: a new schedule (409 when the name is taken).
pub(crate) async fn create(
    State(state): State<AppState>,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let text = std::str::from_utf8(&body)
        .map_err(|_| ApiError::bad_request("request body: not UTF-8"))?
        .to_string();
    let def = cairn_workflow::parse_schedule(&text, std::path::Path::new("request body"))
        .map_err(|e| ApiError::bad_request(format!("request body: {e}")))?;
    // The workflow must load now, not fail at its first due time.
    let (dir, max, wf) = (
        state.cfg().workflows_dir.clone(),
        state.cfg().max_workflow_bytes,
        def.workflow.clone(),
    );
    blocking(move || crate::workflows::load(dir.as_deref(), &wf, max).map(drop)).await?;
    let now = now_ms();
    let rec = ScheduleRecord {
        name: def.name.clone(),
        definition: def.to_json(),
        from_file: false,
        paused: false,
        cursor: Cursor {
            next_due_ms: def.timing.next_after(now),
            pending_due_ms: None,
        },
        last_run_id: None,
        updated_ms: now,
    };
    let view = blocking(move || {
        if !store(&state)?.put_schedule(&rec, false)? {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "schedule_exists",
                format!("a schedule `{}` exists; delete it first", rec.name),
            ));
        }
        Ok(view(rec))
    })
    .await?;
    Ok((StatusCode::CREATED, Json(view)).into_response())
}

/// `DELETE /v1/schedules/{name}`: one made through the API; the triggers
/// file's are the file's to remove.
pub(crate) async fn delete(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    blocking(move || {
        let s = store(&state)?;
        let rec = s.get_schedule(&name)?.ok_or_else(|| no_schedule(&name))?;
        if rec.from_file {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "schedule_from_file",
                format!("schedule `{name}` is declared in the server's triggers file; remove it there (or pause it)"),
            ));
        }
        s.delete_schedule(&name)?;
        Ok(StatusCode::NO_CONTENT)
    })
    .await
}

async fn set_paused(
    state: AppState,
    name: String,
    paused: bool,
) -> Result<Json<ScheduleView>, ApiError> {
    blocking(move || {
        let s = store(&state)?;
        let rec = s.get_schedule(&name)?.ok_or_else(|| no_schedule(&name))?;
        let def = definition(&rec).map_err(ApiError::internal)?;
        // A resume starts from now: what fell due while paused was meant
        // not to run.
        let cursor = if paused {
            rec.cursor
        } else {
            Cursor {
                next_due_ms: def.timing.next_after(now_ms()),
                pending_due_ms: None,
            }
        };
        if rec.paused != paused {
            s.set_paused(&name, paused, cursor)?;
        }
        let rec = s.get_schedule(&name)?.ok_or_else(|| no_schedule(&name))?;
        Ok(Json(view(rec)))
    })
    .await
}

/// The body of the routes that take none: empty, or `{}`; anything else
/// is refused rather than ignored, so that a client that thinks it sends
/// an option learns it does not.
fn no_fields(body: &serde_json::Map<String, serde_json::Value>) -> Result<(), ApiError> {
    match body.keys().next() {
        None => Ok(()),
        Some(k) => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_body",
            format!("request body: unknown field `{k}`: this route takes none"),
        )),
    }
}

/// `POST /v1/schedules/{name}/pause`.
pub(crate) async fn pause(
    State(state): State<AppState>,
    Path(name): Path<String>,
    JsonBody(body): JsonBody<serde_json::Map<String, serde_json::Value>>,
) -> Result<Json<ScheduleView>, ApiError> {
    no_fields(&body)?;
    set_paused(state, name, true).await
}

/// `POST /v1/schedules/{name}/resume`.
pub(crate) async fn resume(
    State(state): State<AppState>,
    Path(name): Path<String>,
    JsonBody(body): JsonBody<serde_json::Map<String, serde_json::Value>>,
) -> Result<Json<ScheduleView>, ApiError> {
    no_fields(&body)?;
    set_paused(state, name, false).await
}

/// `POST /v1/schedules/{name}/trigger`: a run now, whatever the overlap
/// policy says (a person asked for it), recorded in the history with the
/// time it was asked as its due time.
pub(crate) async fn trigger(
    State(state): State<AppState>,
    Path(name): Path<String>,
    JsonBody(body): JsonBody<serde_json::Map<String, serde_json::Value>>,
) -> Result<Response, ApiError> {
    no_fields(&body)?;
    if state.draining() {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting_down",
            "the server is stopping and takes no new runs",
        ));
    }
    let st = state.clone();
    let (def, fire) = blocking(move || {
        let s = store(&st)?;
        for _ in 0..3 {
            let rec = s.get_schedule(&name)?.ok_or_else(|| no_schedule(&name))?;
            let def = definition(&rec).map_err(ApiError::internal)?;
            // Never a whole second, so never a due time of the schedule's
            // own (those are whole seconds): its row and run are apart.
            let due = match now_ms() {
                t if t.rem_euclid(1000) == 0 => t + 1,
                t => t,
            };
            let fire = FireRecord {
                schedule: name.clone(),
                due_ms: due,
                decided_ms: due,
                outcome: FireOutcome::Firing,
                run_id: Some(fire_run_id(&name, due)),
                detail: Some("by hand".into()),
            };
            // The cursor stays; comparing it orders this with a decision
            // another instance takes meanwhile.
            if s.advance_schedule(&name, rec.cursor, rec.cursor, std::slice::from_ref(&fire))? {
                return Ok((def, fire));
            }
            if rec.paused {
                return Err(ApiError::new(
                    StatusCode::CONFLICT,
                    "schedule_paused",
                    format!("schedule `{name}` is paused; resume it first"),
                ));
            }
        }
        Err(ApiError::new(
            StatusCode::CONFLICT,
            "schedule_busy",
            "the schedule changed three times while this was asked; ask again",
        ))
    })
    .await?;
    let mut fire = fire;
    let run_id = fire.run_id.clone().expect("a firing fire has its run");
    start_fire(&state, &def, fire.clone()).await;
    fire.outcome = FireOutcome::Started;
    let st = state.clone();
    let (sched, due) = (fire.schedule.clone(), fire.due_ms);
    let recorded = blocking(move || {
        Ok(store(&st)?
            .fires(&sched, MAX_FIRES)?
            .into_iter()
            .find(|f| f.due_ms == due))
    })
    .await?;
    let fire = recorded.unwrap_or(FireRecord {
        run_id: Some(run_id),
        ..fire
    });
    if fire.outcome == FireOutcome::Failed {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "schedule_fire_failed",
            fire.detail.unwrap_or_default(),
        ));
    }
    Ok((StatusCode::CREATED, Json(fire_view(fire))).into_response())
}

/// `GET /v1/schedules/{name}/fires`: newest first.
pub(crate) async fn fires(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Json<FireList>, ApiError> {
    blocking(move || {
        let s = store(&state)?;
        s.get_schedule(&name)?.ok_or_else(|| no_schedule(&name))?;
        let fires = s.fires(&name, MAX_FIRES)?;
        Ok(Json(FireList {
            fires: fires.into_iter().map(fire_view).collect(),
        }))
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_of_ms() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(1_772_443_800_123), "2026-03-02T09:30:00.123Z");
    }
}
