//! The HTTP routes and the state they share.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, FromRequest, Path, Query, Request, State};
use axum::http::{header, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{on, MethodFilter, MethodRouter};
use axum::{Json, Router};
use cairn_api::{
    ActivityEntry, ActivityPage, AnswerBody, Answered, CancelBody, CancelMechanism, Cancelled,
    DecideBody, Decided, Health, HijackBody, HijackRequested, ResumeBody, RunAccepted, RunDetail,
    RunList, RunMeta, RunSummary, StartBody,
};
use cairn_events::{ActivityFolder, Event, EventType, RunCommand, RunId, RunState};
use cairn_store::{EventQuery, Journal, RecordStatus, RunFilter, RunRecord};
use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use tokio::sync::watch;

use crate::error::ApiError;
use crate::ServeConfig;
use cairn_engine::{Engine, StartOptions};

/// What every handler shares. Cheap to clone.
#[derive(Clone)]
pub(crate) struct AppState(Arc<Inner>);

struct Inner {
    engine: Engine,
    cfg: ServeConfig,
    metrics: Arc<Mutex<crate::metrics::StoreMetrics>>,
    draining: AtomicBool,
    /// Flips to true when watchers must end their streams.
    closing: watch::Sender<bool>,
    /// Each watched run's live feed, shared by its watchers.
    feeds: Arc<crate::feed::Feeds>,
    /// The names and origins requests must come with.
    guard: crate::guard::Guard,
    /// Folded run states, brought up to date with only their new events.
    states: crate::states::StateCache,
    /// Failed logins by client address.
    logins: crate::auth::LoginThrottle,
    /// The triggers file's webhooks, and what their deliveries came to.
    hooks: crate::hooks::Hooks,
    /// What the due times this instance decided did.
    fire_counts: crate::schedules::FireCounts,
}

impl AppState {
    pub fn new(
        cfg: ServeConfig,
        engine: Engine,
        guard: crate::guard::Guard,
        hooks: crate::hooks::Hooks,
    ) -> Self {
        AppState(Arc::new(Inner {
            engine,
            cfg,
            metrics: Arc::new(Mutex::new(crate::metrics::StoreMetrics::new())),
            draining: AtomicBool::new(false),
            closing: watch::channel(false).0,
            feeds: Arc::default(),
            guard,
            states: crate::states::StateCache::default(),
            logins: crate::auth::LoginThrottle::default(),
            hooks,
            fire_counts: Default::default(),
        }))
    }

    /// The triggers file's webhooks.
    pub(crate) fn hooks(&self) -> &crate::hooks::Hooks {
        &self.0.hooks
    }

    /// What the due times this instance decided did.
    pub(crate) fn fire_counts(&self) -> &crate::schedules::FireCounts {
        &self.0.fire_counts
    }

    /// Failed logins by client address (see [`crate::auth::login`]).
    pub(crate) fn logins(&self) -> &crate::auth::LoginThrottle {
        &self.0.logins
    }

    /// Calls `f` with the run's current state, folding only the events
    /// the cache has not seen (see [`crate::states`]). Blocking.
    pub(crate) fn with_state<T>(
        &self,
        rec: &RunRecord,
        f: impl FnOnce(&RunState) -> T,
    ) -> Result<T, ApiError> {
        Ok(self
            .0
            .states
            .with_state(self.journal().backend().as_ref(), rec, f)?)
    }

    /// A watcher of the run's events after `after` (see [`crate::feed`]).
    pub async fn watch(
        &self,
        run_id: &RunId,
        after: u64,
        follow: bool,
    ) -> Result<crate::feed::Watcher, ApiError> {
        Ok(self
            .0
            .feeds
            .watch(
                self.journal(),
                run_id,
                after,
                follow,
                self.0.cfg.watcher_queue,
            )
            .await?)
    }

    pub fn engine(&self) -> &Engine {
        &self.0.engine
    }

    pub fn journal(&self) -> &Journal {
        self.0.engine.journal()
    }

    pub fn token(&self) -> Option<&str> {
        self.0.cfg.token.as_deref()
    }

    pub fn guard(&self) -> &crate::guard::Guard {
        &self.0.guard
    }

    pub fn cfg(&self) -> &ServeConfig {
        &self.0.cfg
    }

    pub fn grace(&self) -> Duration {
        self.0.cfg.grace
    }

    /// Stop taking new runs and commands that would start work.
    pub fn begin_drain(&self) {
        self.0.draining.store(true, Ordering::SeqCst);
    }

    pub(crate) fn draining(&self) -> bool {
        self.0.draining.load(Ordering::SeqCst)
    }

    /// Ends every watcher's stream.
    pub fn close_watchers(&self) {
        self.0.feeds.close();
        self.0.closing.send_replace(true);
    }

    /// Resolves when watchers must end.
    pub fn closing(&self) -> watch::Receiver<bool> {
        self.0.closing.subscribe()
    }
}

/// Resolves once watchers must end (or the server is gone).
pub(crate) async fn closed(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|c| *c).await;
}

/// Runs blocking store work off the async threads.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::internal(format!("worker failed: {e}")))?
}

/// The run's row, or a 404 naming the run: where a run id from a request
/// (a path, a WebSocket message) is checked, a malformed one being a 400
/// `invalid_run_id`.
pub(crate) async fn existing_run(state: &AppState, run_id: &str) -> Result<RunRecord, ApiError> {
    let id = RunId::parse(run_id)?;
    state
        .journal()
        .backend()
        .get_run_async(&id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no run `{id}`")))
}

/// Every route of the API: the router is built from this table, and a test
/// checks it against the OpenAPI document both ways.
pub(crate) fn routes() -> Vec<(Method, &'static str, MethodRouter<AppState>)> {
    vec![
        (Method::GET, "/", on(MethodFilter::GET, crate::ui::index)),
        (
            Method::GET,
            "/ui/{file}",
            on(MethodFilter::GET, crate::ui::asset),
        ),
        (Method::GET, "/healthz", on(MethodFilter::GET, healthz)),
        (Method::GET, "/metrics", on(MethodFilter::GET, metrics)),
        (Method::GET, "/openapi.json", on(MethodFilter::GET, openapi)),
        (
            Method::GET,
            "/v1/session",
            on(MethodFilter::GET, crate::auth::session),
        ),
        (
            Method::POST,
            "/v1/session",
            on(MethodFilter::POST, crate::auth::login),
        ),
        (
            Method::DELETE,
            "/v1/session",
            on(MethodFilter::DELETE, crate::auth::logout),
        ),
        (Method::GET, "/v1/runs", on(MethodFilter::GET, list_runs)),
        (Method::POST, "/v1/runs", on(MethodFilter::POST, start_run)),
        (Method::GET, "/v1/runs/{id}", on(MethodFilter::GET, get_run)),
        (
            Method::GET,
            "/v1/runs/{id}/activity",
            on(MethodFilter::GET, activity),
        ),
        (
            Method::GET,
            "/v1/runs/{id}/compare/{other}",
            on(MethodFilter::GET, compare),
        ),
        (
            Method::GET,
            "/v1/runs/{id}/plan",
            on(MethodFilter::GET, crate::nodes::plan),
        ),
        (
            Method::GET,
            "/v1/runs/{id}/nodes/{node}/tool-calls",
            on(MethodFilter::GET, crate::nodes::tool_calls),
        ),
        (
            Method::GET,
            "/v1/runs/{id}/events",
            on(MethodFilter::GET, events_page),
        ),
        (
            Method::GET,
            "/v1/runs/{id}/events/stream",
            on(MethodFilter::GET, crate::sse::stream),
        ),
        (
            Method::POST,
            "/v1/runs/{id}/approvals/{node}",
            on(MethodFilter::POST, decide),
        ),
        (
            Method::POST,
            "/v1/runs/{id}/inputs/{requestId}",
            on(MethodFilter::POST, answer),
        ),
        (
            Method::POST,
            "/v1/runs/{id}/cancel",
            on(MethodFilter::POST, cancel),
        ),
        (
            Method::POST,
            "/v1/runs/{id}/resume",
            on(MethodFilter::POST, resume),
        ),
        (
            Method::POST,
            "/v1/runs/{id}/nodes/{node}/hijack",
            on(MethodFilter::POST, hijack),
        ),
        (
            Method::POST,
            "/v1/runs/{id}/revert",
            on(MethodFilter::POST, crate::files::revert),
        ),
        (
            Method::POST,
            "/v1/runs/{id}/fork",
            on(MethodFilter::POST, crate::files::fork),
        ),
        (
            Method::GET,
            "/v1/scores",
            on(MethodFilter::GET, crate::scores::scores),
        ),
        (
            Method::GET,
            "/v1/schedules",
            on(MethodFilter::GET, crate::schedules::list),
        ),
        (
            Method::POST,
            "/v1/schedules",
            on(MethodFilter::POST, crate::schedules::create),
        ),
        (
            Method::GET,
            "/v1/schedules/{name}",
            on(MethodFilter::GET, crate::schedules::get),
        ),
        (
            Method::DELETE,
            "/v1/schedules/{name}",
            on(MethodFilter::DELETE, crate::schedules::delete),
        ),
        (
            Method::POST,
            "/v1/schedules/{name}/pause",
            on(MethodFilter::POST, crate::schedules::pause),
        ),
        (
            Method::POST,
            "/v1/schedules/{name}/resume",
            on(MethodFilter::POST, crate::schedules::resume),
        ),
        (
            Method::POST,
            "/v1/schedules/{name}/trigger",
            on(MethodFilter::POST, crate::schedules::trigger),
        ),
        (
            Method::GET,
            "/v1/schedules/{name}/fires",
            on(MethodFilter::GET, crate::schedules::fires),
        ),
        (
            Method::POST,
            "/v1/hooks/{name}",
            on(MethodFilter::POST, crate::hooks::deliver),
        ),
        (
            Method::GET,
            "/v1/ws",
            on(MethodFilter::GET, crate::ws::upgrade),
        ),
    ]
}

pub(crate) fn router(state: AppState) -> Router {
    let mut by_path: Vec<(&'static str, MethodRouter<AppState>)> = Vec::new();
    // A worker drives runs and answers only its monitors.
    let worker = state.cfg().worker;
    let served = routes()
        .into_iter()
        .filter(|(_, path, _)| !worker || matches!(*path, "/healthz" | "/metrics"));
    for (method, path, mr) in served {
        let mr = if method == Method::POST {
            mr.route_layer(axum::middleware::from_fn(crate::guard::require_json))
        } else {
            mr
        };
        match by_path.iter_mut().find(|(p, _)| *p == path) {
            Some((_, existing)) => {
                let merged = std::mem::take(existing).merge(mr);
                *existing = merged;
            }
            None => by_path.push((path, mr)),
        }
    }
    let mut r = Router::new();
    for (path, mr) in by_path {
        r = r.route(path, mr.fallback(method_not_allowed));
    }
    r.fallback(no_route)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            crate::auth::require_token,
        ))
        // Outside the token check: a page elsewhere is refused whether or
        // not the server has a token.
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            crate::guard::check,
        ))
        .layer(DefaultBodyLimit::max(state.cfg().body_limit))
        .with_state(state)
}

async fn no_route(method: Method, uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "no_route",
        format!("no route {method} {}; see /openapi.json", uri.path()),
    )
}

async fn method_not_allowed(method: Method, uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!(
            "{method} is not allowed on {}; see /openapi.json",
            uri.path()
        ),
    )
}

/// A JSON body with errors in the API's shape: 413 for an oversized body,
/// 400 with line and column for bad JSON or a wrong field. An empty body
/// reads as `{}` so optional bodies may be left out.
pub(crate) struct JsonBody<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let bytes = Bytes::from_request(req, state).await.map_err(|r| {
            let status = r.status();
            if crate::listen::is_body_timeout(&r) {
                ApiError::new(StatusCode::REQUEST_TIMEOUT, "body_timeout", r.body_text())
            } else if status == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(
                    status,
                    "payload_too_large",
                    "the request body is larger than this server accepts",
                )
            } else {
                ApiError::new(status, "bad_body", r.body_text())
            }
        })?;
        let text: &[u8] = if bytes.iter().all(|b| b.is_ascii_whitespace()) {
            b"{}"
        } else {
            &bytes
        };
        serde_json::from_slice(text).map(JsonBody).map_err(|e| {
            let code = if e.is_data() {
                "invalid_body"
            } else {
                "bad_json"
            };
            ApiError::new(StatusCode::BAD_REQUEST, code, format!("request body: {e}"))
        })
    }
}

fn parse_param<T: std::str::FromStr>(
    q: &HashMap<String, String>,
    name: &str,
    what: &str,
) -> Result<Option<T>, ApiError> {
    match q.get(name) {
        None => Ok(None),
        Some(v) => v.parse().map(Some).map_err(|_| {
            ApiError::bad_request(format!("query parameter `{name}`: `{v}` is not {what}"))
        }),
    }
}

pub(crate) fn parse_bool(q: &HashMap<String, String>, name: &str) -> Result<bool, ApiError> {
    match q.get(name).map(String::as_str) {
        None | Some("false") | Some("0") => Ok(false),
        Some("") | Some("true") | Some("1") => Ok(true),
        Some(v) => Err(ApiError::bad_request(format!(
            "query parameter `{name}`: `{v}` is not true or false"
        ))),
    }
}

/// Rejects query parameters a route does not know, so a typo is an error
/// rather than a silently ignored filter.
pub(crate) fn known_params(q: &HashMap<String, String>, known: &[&str]) -> Result<(), ApiError> {
    for k in q.keys() {
        if !known.contains(&k.as_str()) {
            return Err(ApiError::bad_request(format!(
                "unknown query parameter `{k}`; this route takes: {}",
                known.join(", ")
            )));
        }
    }
    Ok(())
}

type Params = Query<HashMap<String, String>>;

async fn healthz() -> Json<Health> {
    Json(Health::ok())
}

async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], crate::OPENAPI).into_response()
}

async fn metrics(State(state): State<AppState>) -> Response {
    let text = tokio::task::spawn_blocking(move || state.metrics_now()).await;
    match text {
        Ok(text) => (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

impl AppState {
    /// The whole store's metrics, caught up with its logs first (blocking:
    /// it reads the store). A store that cannot be read leaves the counts
    /// where they were, said in the server's log.
    pub(crate) fn metrics_now(&self) -> String {
        let mut m = self.0.metrics.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = m.catch_up(self.journal().backend().as_ref()) {
            tracing::warn!("metrics: the store could not be read: {e}");
        }
        let mut text = m.render();
        drop(m);
        text.push_str(&self.hooks().render());
        text.push_str(&self.fire_counts().render());
        // This instance's own share, by its name (checked: no quoting needed).
        text.push_str(&format!(
            "# HELP cairn_instance_driven_runs Runs this instance drives now, by its name.\n\
             # TYPE cairn_instance_driven_runs gauge\n\
             cairn_instance_driven_runs{{instance=\"{}\"}} {}\n",
            self.cfg().instance,
            self.engine().active_runs().len()
        ));
        if self.engine().queues() {
            text.push_str(&format!(
                "# HELP cairn_instance_capacity Most runs this instance drives at once (--max-runs), by its name.\n\
                 # TYPE cairn_instance_capacity gauge\n\
                 cairn_instance_capacity{{instance=\"{}\"}} {}\n",
                self.cfg().instance,
                self.cfg().max_runs
            ));
            // The queue is the fleet's: every instance tells the same.
            match self.journal().backend().claims().map(|c| c.fleet()) {
                Some(Ok(fleet)) => text.push_str(&format!(
                    "# HELP cairn_runs_queued Runs waiting for an instance: queued and not yet claimed, or left by an instance that stopped or died.\n\
                     # TYPE cairn_runs_queued gauge\n\
                     cairn_runs_queued {}\n\
                     # HELP cairn_fleet_instances Instances claiming runs from the store.\n\
                     # TYPE cairn_fleet_instances gauge\n\
                     cairn_fleet_instances {}\n",
                    fleet.queued,
                    fleet.instances.len()
                )),
                Some(Err(e)) => tracing::warn!("metrics: the fleet could not be read: {e}"),
                None => {}
            }
        }
        text
    }
}

/// What the API's run views take from a run's record.
pub(crate) fn run_meta(rec: &RunRecord) -> RunMeta<'_> {
    RunMeta {
        workflow: &rec.workflow,
        status: rec.status.as_str(),
        parent_run_id: rec.parent_run_id.as_ref(),
    }
}

/// A run as `GET /v1/runs` lists it: its record, and from its state what
/// a list shows (when it started and ended, progress, tokens, cost). A run
/// whose log cannot be read is listed without those: one damaged run must
/// not hide the others.
fn run_summary(state: &AppState, r: &RunRecord) -> RunSummary {
    let summary = RunSummary::new(&r.run_id, &run_meta(r), r.created_ms, r.updated_ms);
    match state.with_state(r, |st| summary.clone().with_state(st)) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(run = %r.run_id, "listing runs: {}", e.message);
            summary
        }
    }
}

async fn list_runs(
    State(state): State<AppState>,
    Query(q): Params,
) -> Result<Json<RunList>, ApiError> {
    known_params(&q, &["status", "workflow", "parent", "limit", "offset"])?;
    let status = match q.get("status") {
        Some(s) => match RecordStatus::parse(s) {
            Some(st @ (RecordStatus::Queued | RecordStatus::Run(_))) => Some(st),
            _ => {
                return Err(ApiError::bad_request(format!(
                    "query parameter `status`: `{s}` is not one of queued, running, waiting-approval, waiting-input, finished, failed, cancelled"
                )))
            }
        },
        None => None,
    };
    let limit: usize = parse_param(&q, "limit", "a count")?.unwrap_or(50);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::bad_request(
            "query parameter `limit`: must be 1 to 1000",
        ));
    }
    let offset: usize = parse_param(&q, "offset", "a count")?.unwrap_or(0);
    let parent = match q.get("parent").map(|p| RunId::parse(p)) {
        // No run has a parent whose id is no run id.
        Some(Err(_)) => {
            return Ok(Json(RunList {
                runs: Vec::new(),
                limit,
                offset,
                next_offset: None,
            }))
        }
        Some(Ok(p)) => Some(p),
        None => None,
    };
    let filter = RunFilter {
        status,
        workflow: q.get("workflow").cloned(),
        // One more than asked tells whether another page exists.
        limit: Some(limit + 1),
        offset: Some(offset),
        parent,
    };
    let mut runs = state.journal().backend().list_runs_async(&filter).await?;
    let more = runs.len() > limit;
    runs.truncate(limit);
    // A summary may fold a run's log into its state: blocking work.
    let st = state.clone();
    let runs = blocking(move || {
        let mut out: Vec<RunSummary> = runs.iter().map(|r| run_summary(&st, r)).collect();
        // Who drives the page's runs that have not ended: one look.
        let open: Vec<RunId> = runs
            .iter()
            .filter(|r| !r.status.is_terminal())
            .map(|r| r.run_id.clone())
            .collect();
        let mut drivers = st.journal().backend().drivers(&open).unwrap_or_else(|e| {
            tracing::warn!("listing runs: who drives them: {e}");
            Default::default()
        });
        for s in &mut out {
            s.instance = drivers.remove(&s.run_id);
        }
        Ok(out)
    })
    .await?;
    Ok(Json(RunList {
        runs,
        limit,
        offset,
        next_offset: more.then_some(offset + limit),
    }))
}

async fn start_run(
    State(state): State<AppState>,
    JsonBody(body): JsonBody<StartBody>,
) -> Result<Response, ApiError> {
    if state.draining() {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting_down",
            "the server is stopping and takes no new runs",
        ));
    }
    if body.workflow.trim().is_empty() {
        return Err(ApiError::bad_request("request body: `workflow` is empty"));
    }
    let dir = state.cfg().workflows_dir.clone();
    let max = state.cfg().max_workflow_bytes;
    let name = body.workflow.clone();
    // Refused before anything is opened for it: a start that would take
    // the descriptors the runs going need. Counted until it has started.
    let admitted = blocking(crate::descriptors::admit).await?;
    let wf = blocking(move || crate::workflows::load(dir.as_deref(), &name, max)).await?;
    let opts = StartOptions {
        run_id: body.run_id.as_deref().map(RunId::parse).transpose()?,
        max_concurrency: body.max_concurrency,
        ..StartOptions::default()
    };
    let input = body.input.unwrap_or_else(|| json!({}));
    // Queued for the fleet's instances to claim on a shared store, else
    // driven here; nobody here waits for its end.
    let submitted = state.engine().submit(wf, input, opts).await?;
    drop(admitted);
    let run_id = submitted.run_id().clone();
    drop(submitted);
    Ok((StatusCode::CREATED, Json(RunAccepted { run_id })).into_response())
}

async fn get_run(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<RunDetail>, ApiError> {
    let rec = existing_run(&state, &id).await?;
    let st = state.clone();
    let v = blocking(move || {
        let mut v = st.with_state(&rec, |s| RunDetail::new(s, &run_meta(&rec)))?;
        let backend = st.journal().backend();
        if !rec.status.is_terminal() {
            let id = std::slice::from_ref(&rec.run_id);
            v.with_instance(
                backend
                    .drivers(id)
                    .ok()
                    .and_then(|mut d| d.remove(&rec.run_id)),
            );
        }
        v.with_child_states(|child| {
            let child = RunId::parse(child).ok()?;
            Some(backend.get_run(&child).ok()??.status.to_string())
        });
        Ok(v)
    })
    .await?;
    Ok(Json(v))
}

/// Node kinds by node path, from the workflow text the run was started
/// with, so the Activity view can tell command nodes from the others.
fn node_kinds(rec: &RunRecord) -> HashMap<String, String> {
    fn walk(prefix: &str, nodes: &[cairn_workflow::NodeSpec], out: &mut HashMap<String, String>) {
        for n in nodes {
            let path = if prefix.is_empty() {
                n.id.clone()
            } else {
                format!("{prefix}.{}", n.id)
            };
            out.insert(path.clone(), n.kind.name().to_string());
            if let Some(children) = n.kind.children() {
                walk(&path, children, out);
            }
        }
    }
    let mut out = HashMap::new();
    if let Ok(wf) = cairn_workflow::parse(
        &rec.workflow_source,
        std::path::Path::new(&rec.workflow_path),
    ) {
        walk("", &wf.nodes, &mut out);
    }
    out
}

async fn activity(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<ActivityPage>, ApiError> {
    let rec = existing_run(&state, &id).await?;
    let run_id = rec.run_id.clone();
    let journal = state.journal().clone();
    let entries = blocking(move || {
        run_activity(journal.backend().as_ref(), &rec).map_err(|e| match e {
            ActivityError::Store(e) => ApiError::from(e),
            e @ ActivityError::Decode { .. } => ApiError::internal(e.to_string()),
        })
    })
    .await?;
    Ok(Json(ActivityPage {
        run_id,
        activity: entries.into_iter().map(ActivityEntry::from).collect(),
    }))
}

/// Two runs compared (docs/replay.md#the-report): run `id` as the
/// original, `other` as its replay (any two runs can be compared).
async fn compare(
    State(state): State<AppState>,
    Path((id, other)): Path<(String, String)>,
) -> Result<Json<cairn_engine::replay::report::Report>, ApiError> {
    let original = existing_run(&state, &id).await?.run_id;
    let replay = existing_run(&state, &other).await?.run_id;
    let journal = state.journal().clone();
    blocking(move || {
        cairn_engine::replay::report::report(journal.backend().as_ref(), &original, &replay)
            .map(Json)
            .map_err(ApiError::from)
    })
    .await
}

/// Why a run's Activity view could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ActivityError {
    /// The store could not be read.
    #[error(transparent)]
    Store(#[from] cairn_store::StoreError),
    /// An event in the store is not one this build can read.
    #[error("run `{run}` seq {seq}: {message}")]
    Decode {
        /// The run.
        run: String,
        /// The event's place in the log.
        seq: u64,
        /// What is wrong with it.
        message: String,
    },
}

/// The Activity view of a run, folded from its whole log: what
/// `GET /v1/runs/{id}/activity` serves and `cairn activity` prints.
pub fn run_activity(
    backend: &dyn cairn_store::Backend,
    rec: &RunRecord,
) -> Result<Vec<cairn_events::Activity>, ActivityError> {
    let mut out = Vec::new();
    tree_activity(backend, rec, 0, &mut out)?;
    Ok(out)
}

/// Most levels of child runs an Activity view follows (the engine's
/// default depth limit, and then some).
const MAX_ACTIVITY_DEPTH: usize = 16;

/// `rec`'s entries, each child run's entries right after the delegation
/// that started it (and theirs after theirs).
fn tree_activity(
    backend: &dyn cairn_store::Backend,
    rec: &RunRecord,
    depth: usize,
    out: &mut Vec<cairn_events::Activity>,
) -> Result<(), ActivityError> {
    let stored = backend.read_events(&rec.run_id, &EventQuery::default())?;
    let mut f = ActivityFolder::new().with_node_kinds(node_kinds(rec));
    for s in stored {
        let ev: Event = s.decode().map_err(|e| ActivityError::Decode {
            run: rec.run_id.to_string(),
            seq: s.seq,
            message: e.to_string(),
        })?;
        f.apply(&ev);
    }
    for entry in f.into_entries() {
        let child = entry.child_run_id.clone();
        out.push(entry);
        if depth >= MAX_ACTIVITY_DEPTH {
            continue;
        }
        if let Some(child) = child.and_then(|c| backend.get_run(&c).ok().flatten()) {
            tree_activity(backend, &child, depth + 1, out)?;
        }
    }
    Ok(())
}

/// Most events one page returns.
const MAX_PAGE: usize = 10_000;

async fn events_page(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(q): Params,
) -> Result<Response, ApiError> {
    known_params(&q, &["after", "type", "node", "limit"])?;
    let after: u64 = parse_param(&q, "after", "a seq")?.unwrap_or(0);
    let limit: usize = parse_param(&q, "limit", "a count")?.unwrap_or(1000);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(ApiError::bad_request(format!(
            "query parameter `limit`: must be 1 to {MAX_PAGE}"
        )));
    }
    let mut types = Vec::new();
    if let Some(t) = q.get("type") {
        for name in t.split(',').map(str::trim) {
            if name.is_empty() {
                return Err(ApiError::bad_request(
                    "query parameter `type`: an empty event type; write names separated by commas",
                ));
            }
            let t = name.parse::<EventType>().map_err(|_| {
                ApiError::bad_request(format!(
                    "query parameter `type`: `{name}` is not an event type of the contract"
                ))
            })?;
            types.push(t);
        }
    }
    let run = existing_run(&state, &id).await?.run_id;
    let query = EventQuery {
        after,
        types,
        node: q.get("node").cloned(),
        limit: Some(limit + 1),
    };
    let mut events = state
        .journal()
        .backend()
        .read_events_async(&run, &query)
        .await?;
    let more = events.len() > limit;
    events.truncate(limit);
    // Each event is the store's text, byte for byte, not read again.
    let next_after = more.then(|| events.last().map_or(after, |e| e.seq));
    let body = cairn_api::events_page_json(&run, events.iter().map(|e| &*e.json), next_after);
    Ok((
        [(header::CONTENT_TYPE, "application/json")],
        Body::from(body),
    )
        .into_response())
}

async fn decide(
    State(state): State<AppState>,
    Path((id, node)): Path<(String, String)>,
    JsonBody(body): JsonBody<DecideBody>,
) -> Result<Json<Decided>, ApiError> {
    let run = existing_run(&state, &id).await?.run_id;
    state
        .engine()
        .decide(&run, &node, body.approved, body.note, body.by)
        .await?;
    Ok(Json(Decided {
        run_id: run,
        node_id: node,
        approved: body.approved,
    }))
}

async fn hijack(
    State(state): State<AppState>,
    Path((id, node)): Path<(String, String)>,
    JsonBody(body): JsonBody<HijackBody>,
) -> Result<Response, ApiError> {
    if state.draining() {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting_down",
            "the server is stopping and takes no hijacks",
        ));
    }
    let run = existing_run(&state, &id).await?.run_id;
    let ev = state
        .engine()
        .send(
            &run,
            RunCommand::Hijack {
                node_id: node.clone(),
                by: body.by,
            },
        )
        .await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(HijackRequested {
            run_id: run,
            node_id: node,
            seq: ev.seq.get(),
        }),
    )
        .into_response())
}

async fn answer(
    State(state): State<AppState>,
    Path((id, request_id)): Path<(String, String)>,
    JsonBody(body): JsonBody<AnswerBody>,
) -> Result<Json<Answered>, ApiError> {
    let run = existing_run(&state, &id).await?.run_id;
    state
        .engine()
        .answer(&run, &request_id, body.value, body.by)
        .await?;
    Ok(Json(Answered {
        run_id: run,
        request_id,
    }))
}

async fn cancel(
    State(state): State<AppState>,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<CancelBody>,
) -> Result<Response, ApiError> {
    let run = existing_run(&state, &id).await?.run_id;
    state
        .engine()
        .cancel(&run, body.graceful, body.reason, body.by)
        .await?;
    let mechanism = CancelMechanism::of(body.graceful);
    Ok((
        StatusCode::ACCEPTED,
        Json(Cancelled {
            run_id: run,
            mechanism,
        }),
    )
        .into_response())
}

async fn resume(
    State(state): State<AppState>,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<ResumeBody>,
) -> Result<Response, ApiError> {
    if state.draining() {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting_down",
            "the server is stopping and resumes no runs",
        ));
    }
    let run = existing_run(&state, &id).await?.run_id;
    let opts = StartOptions {
        max_concurrency: body.max_concurrency,
        ..StartOptions::default()
    };
    let handle = state.engine().resume(&run, opts).await?;
    let run_id = handle.run_id.clone();
    drop(handle);
    Ok((StatusCode::ACCEPTED, Json(RunAccepted { run_id })).into_response())
}

/// Exposed for the WebSocket's `listRuns`, which answers like `GET /v1/runs`.
pub(crate) async fn list_runs_value(
    state: &AppState,
    q: HashMap<String, String>,
) -> Result<Value, ApiError> {
    let Json(list) = list_runs(State(state.clone()), Query(q)).await?;
    Ok(serde_json::to_value(list).expect("a run list serializes to JSON"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The router is built from `routes()`; this holds that table and the
    /// OpenAPI document to each other, both ways.
    #[test]
    fn routes_and_openapi_document_agree() {
        let doc: Value = serde_json::from_str(crate::OPENAPI).unwrap();
        let mut documented: Vec<(String, String)> = Vec::new();
        for (path, item) in doc["paths"].as_object().unwrap() {
            for method in item.as_object().unwrap().keys() {
                documented.push((method.to_uppercase(), path.clone()));
            }
        }
        let mut routed: Vec<(String, String)> = routes()
            .into_iter()
            .map(|(m, p, _)| (m.to_string(), p.to_string()))
            .collect();
        documented.sort();
        routed.sort();
        assert_eq!(routed, documented);
    }

    /// The `type` filter's documented values are the contract's event types.
    #[test]
    fn documented_event_types_are_the_contracts() {
        let doc: Value = serde_json::from_str(crate::OPENAPI).unwrap();
        let params = doc["paths"]["/v1/runs/{id}/events"]["get"]["parameters"]
            .as_array()
            .unwrap();
        let ty = params.iter().find(|p| p["name"] == "type").unwrap();
        let names: Vec<&str> = ty["schema"]["items"]["enum"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert_eq!(names, cairn_events::EVENT_TYPES);
    }
}
