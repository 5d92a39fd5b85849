//! `cairn serve`: Cairn's runs over HTTP, their live events over SSE and
//! WebSocket, and Prometheus metrics. The bodies it answers with are
//! `cairn-api`'s types; the client that reads them is `cairn-client`.
//!
//! Runs execute inside the server process (the [`Engine`]); watchers are fed
//! by push from the store's sequencer ([`cairn_store::Journal::subscribe`]),
//! each through its own bounded buffer, so a slow watcher is cut off with a
//! reason instead of slowing a run. Every event a watcher receives is the
//! store's JSON text, byte for byte.
//!
//! The HTTP API is described by the OpenAPI document served at
//! `/openapi.json` (see [`OPENAPI`]).

mod api;
mod auth;
pub mod descriptors;
mod error;
mod feed;
pub mod files;
mod frames;
mod guard;
mod hooks;
mod listen;
mod metrics;
mod nodes;
pub mod schedules;
mod scores;
mod sse;
mod states;
mod ui;
mod workflows;
mod ws;

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::net::TcpListener;

use cairn_store::Topic;

pub use api::{run_activity, ActivityError};
pub use cairn_engine::{Engine, EngineError, EngineOptions};
pub use guard::GuardConfigError;

/// The OpenAPI 3.1 document of the HTTP API, as served at `/openapi.json`.
pub const OPENAPI: &str = cairn_api::OPENAPI;

/// The address `cairn serve` listens on by default.
pub const DEFAULT_ADDR: &str = "127.0.0.1:7700";

/// The largest workflow file `POST /v1/runs` reads by default, in bytes:
/// the bound the workflow loader itself puts on files.
pub const DEFAULT_MAX_WORKFLOW_BYTES: u64 = cairn_workflow::limits::MAX_FILE_BYTES;

/// How a server listens and behaves.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Where to listen. Without a token only loopback is allowed: any other
    /// host is replaced by 127.0.0.1.
    pub addr: SocketAddr,
    /// The bearer token every route but `/healthz` requires; `None` leaves
    /// the API open, to loopback clients only.
    pub token: Option<String>,
    /// The folder whose workflows `POST /v1/runs` may name (by name, never
    /// by path); `None` refuses every `POST /v1/runs`.
    pub workflows_dir: Option<PathBuf>,
    /// Largest workflow file `POST /v1/runs` reads, in bytes; a larger one
    /// is refused (413) before it is read.
    pub max_workflow_bytes: u64,
    /// Names (`name` for any port, or `name:port`) accepted in the `Host`
    /// header besides loopback names and the bound address with its port.
    pub allowed_hosts: Vec<String>,
    /// Origins (`scheme://host[:port]`) accepted in the `Origin` header
    /// besides the server's own.
    pub allowed_origins: Vec<String>,
    /// Connections open at once, WebSockets and event streams included;
    /// one more is answered 503 and closed.
    pub max_connections: usize,
    /// Connections one client (an IPv4 address, an IPv6 /64) may hold at
    /// once; one more is answered 429 and closed. `None`: an eighth of
    /// `max_connections`, at least 16 (or `max_connections` when smaller).
    /// Behind a reverse proxy every client has the proxy's address: raise
    /// it to `max_connections` there.
    pub max_connections_per_client: Option<usize>,
    /// Longest a client may take to send a request's headers, and to start
    /// its next request on a kept-alive connection; then it is closed.
    pub header_read_timeout: Duration,
    /// Longest a request's body may take to arrive, counted from the end of
    /// its headers; then the request fails (408) and the connection is
    /// closed.
    pub body_read_timeout: Duration,
    /// How long running nodes get to reach a safe point when the server
    /// stops, before they are cancelled.
    pub grace: Duration,
    /// How often an idle SSE stream sends a comment, so proxies and clients
    /// can tell a quiet run from a dead connection.
    pub heartbeat: Duration,
    /// Largest request body accepted, in bytes.
    pub body_limit: usize,
    /// Largest WebSocket message accepted from a client, in bytes.
    pub ws_message_limit: usize,
    /// Events that may wait for one watcher (an SSE stream, or one run
    /// subscribed on a WebSocket) while its connection is busy. A watcher
    /// that falls this far behind is cut off with the seq to resume from;
    /// the run never waits for it.
    pub watcher_queue: usize,
    /// How often the server looks for runs that nobody drives (their
    /// process died and its lease expired) and takes them over, as
    /// `cairn resume` would. `None` looks once, at start: enough when this
    /// server is the store's only user. Servers that share a PostgreSQL
    /// store set it, so that a run survives the death of its instance.
    pub takeover: Option<Duration>,
    /// This server's name where runs say who drives them (`/metrics`
    /// labels its share with it); the store's leases carry the same name.
    pub instance: String,
    /// Serve only `/healthz` and `/metrics` (`cairn serve --worker`): an
    /// instance that drives runs (those it claims and takes over) for a
    /// fleet whose requests other instances answer.
    pub worker: bool,
    /// Most runs this instance drives at once, runs waiting for a person
    /// not counted, when runs are claimed from a shared store
    /// ([`cairn_engine::Engine::queues`]): it claims no more, and no more
    /// than its share while another instance has room.
    pub max_runs: usize,
    /// The schedules and webhooks of the triggers file (`--triggers`).
    /// Schedules are written to the store and fired by whichever instance
    /// decides each due time first; hooks answer `POST /v1/hooks/{name}`.
    pub triggers: cairn_workflow::triggers::Triggers,
    /// The folder a hook's `secret: { file }` is relative to (the
    /// triggers file's).
    pub triggers_dir: PathBuf,
}

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig {
            addr: DEFAULT_ADDR.parse().expect("default address parses"),
            token: None,
            workflows_dir: None,
            max_workflow_bytes: DEFAULT_MAX_WORKFLOW_BYTES,
            allowed_hosts: Vec::new(),
            allowed_origins: Vec::new(),
            max_connections: 1024,
            max_connections_per_client: None,
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: DEFAULT_BODY_TIMEOUT,
            grace: Duration::from_secs(10),
            heartbeat: Duration::from_secs(15),
            body_limit: 1024 * 1024,
            ws_message_limit: 64 * 1024,
            watcher_queue: 8192,
            takeover: None,
            instance: cairn_store::default_instance_name(),
            worker: false,
            max_runs: default_max_runs(),
            triggers: Default::default(),
            triggers_dir: PathBuf::from("."),
        }
    }
}

/// Loads a workflow of `dir` by name as `POST /v1/runs` does (the checks
/// of names and sizes included): for a caller that checks what a triggers
/// file names before serving.
pub fn load_workflow(
    dir: &Path,
    name: &str,
    max_bytes: u64,
) -> Result<cairn_workflow::Workflow, String> {
    workflows::load(Some(dir), name, max_bytes).map_err(|e| e.message)
}

/// Runs an instance drives at once by default: 256 per core. A run that
/// waits on a model or a process costs about 0.1 MB and little CPU.
pub fn default_max_runs() -> usize {
    256 * std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// How long a request's body may take to arrive by default: a full body
/// of the default 1 MiB limit at about 35 KB/s.
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(30);

impl ServeConfig {
    /// Checks what can be checked before binding: the allowed hosts and
    /// origins are well formed and the connection caps are at least 1.
    pub fn validate(&self) -> Result<(), ServerError> {
        if self.max_connections == 0 || self.max_connections_per_client == Some(0) {
            return Err(GuardConfigError::NoConnections.into());
        }
        guard::Guard::new(self.addr, &self.allowed_hosts, &self.allowed_origins)?;
        Ok(())
    }

    /// The connections one client may hold: the configured cap, or an
    /// eighth of `max_connections`, at least 16 (never more than
    /// `max_connections`).
    pub fn per_client_cap(&self) -> usize {
        self.max_connections_per_client
            .unwrap_or_else(|| (self.max_connections / 8).max(16))
            .min(self.max_connections)
    }
}

/// Why the server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// Serving connections failed.
    #[error("server error: {0}")]
    Io(#[from] std::io::Error),
    /// The configuration cannot work: a malformed allowed host or origin,
    /// a connection cap of 0.
    #[error(transparent)]
    Config(#[from] GuardConfigError),
    /// A hook of the triggers file cannot check signatures: its secret
    /// cannot be read.
    #[error(transparent)]
    Hook(#[from] hooks::HookSetupError),
}

/// A bound server, ready to [`Server::run`]. Binding first lets callers (and
/// tests) learn the port before any request arrives.
pub struct Server {
    listener: TcpListener,
    state: api::AppState,
    loopback_forced: bool,
}

impl Server {
    /// Binds the listening socket. Without a token the host is forced to
    /// 127.0.0.1 (see [`Server::loopback_forced`]).
    pub async fn bind(cfg: ServeConfig, engine: Engine) -> Result<Server, ServerError> {
        let mut addr = cfg.addr;
        let loopback_forced = cfg.token.is_none() && !addr.ip().is_loopback();
        if loopback_forced {
            addr.set_ip(IpAddr::V4(Ipv4Addr::LOCALHOST));
        }
        cfg.validate()?;
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| ServerError::Bind { addr, source })?;
        let local = listener.local_addr().map_err(ServerError::Io)?;
        let guard = guard::Guard::new(local, &cfg.allowed_hosts, &cfg.allowed_origins)?;
        let hooks = hooks::Hooks::new(&cfg.triggers.hooks, &cfg.triggers_dir)?;
        let state = api::AppState::new(cfg, engine, guard, hooks);
        Ok(Server {
            listener,
            state,
            loopback_forced,
        })
    }

    /// The address actually bound (the port is known even when 0 was asked).
    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    /// True when a non-loopback address was asked for without a token and
    /// the server listens on 127.0.0.1 instead.
    pub fn loopback_forced(&self) -> bool {
        self.loopback_forced
    }

    /// Resumes the runs a previous server left running, then serves until
    /// `shutdown` completes. Then it stops taking new runs, lets the engine
    /// stop (running nodes get the grace period), ends every watcher's
    /// stream once the last event is committed, and returns.
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServerError> {
        let state = self.state;
        let resumed = state.engine().resume_interrupted().await;
        if !resumed.is_empty() {
            let runs: Vec<&str> = resumed.iter().map(|r| r.as_str()).collect();
            tracing::info!(runs = ?runs, "resumed interrupted runs");
        }
        // The whole store is folded once now, not at the first scrape.
        let metrics_task = {
            let state = state.clone();
            tokio::task::spawn_blocking(move || drop(state.metrics_now()))
        };
        // A claimer takes over runs by claiming them, as its share allows;
        // otherwise it looks for them every `takeover`.
        let claim_task = match join_claimers(&state).await {
            true => Some(tokio::spawn(claim_queued(state.clone()))),
            false => None,
        };
        let takeover_task = match claim_task {
            Some(_) => None,
            None => state
                .cfg()
                .takeover
                .map(|every| tokio::spawn(take_over(state.clone(), every))),
        };
        let schedules_task = tokio::spawn(schedules::run(state.clone()));
        let router = api::router(state.clone());
        let stopping = state.clone();
        let graceful = async move {
            shutdown.await;
            tracing::info!("stopping: no new runs; waiting for running nodes");
            stopping.begin_drain();
            leave_claimers(&stopping).await;
            stopping.engine().shutdown(stopping.grace()).await;
            give_back(&stopping).await;
            // Every event is committed now: watchers may go.
            stopping.close_watchers();
        };
        let limits = listen::Limits {
            max_connections: state.cfg().max_connections,
            max_connections_per_client: state.cfg().per_client_cap(),
            header_read_timeout: state.cfg().header_read_timeout,
            body_read_timeout: state.cfg().body_read_timeout,
        };
        let result = listen::serve(self.listener, router, limits, graceful).await;
        metrics_task.abort();
        schedules_task.abort();
        for t in [takeover_task, claim_task].into_iter().flatten() {
            t.abort();
        }
        result.map_err(ServerError::Io)
    }
}

/// How long a stopping server waits for its runs' leases to be given back
/// before it wakes the others anyway.
const GIVE_BACK_WAIT: Duration = Duration::from_secs(5);

/// After another server's wake-up, looks made this often ...
const LOOK_AGAIN: Duration = Duration::from_secs(1);
/// ... this many times, besides the one at the wake-up.
const LOOKS_AFTER_WAKE: u32 = 3;

/// Once this server's drivers have stopped: waits until their leases are
/// given back, then wakes the store's other servers, which take the runs
/// over at once instead of at their next look.
async fn give_back(state: &api::AppState) {
    // A driver's last holders of its run's log (a node's task, a watcher's
    // fold) may let go of it a moment after the driver ends.
    let deadline = tokio::time::Instant::now() + GIVE_BACK_WAIT;
    while state.engine().journal().held_runs() > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let engine = state.engine().clone();
    let settled = tokio::task::spawn_blocking(move || {
        engine.journal().settle();
        // Sent before this process goes: a wake-up queued is lost with it.
        engine.journal().backend().notify_sent(Topic::Released);
    })
    .await;
    if let Err(e) = settled {
        tracing::warn!(error = %e, "could not wake the other servers; they take this one's runs over at their next look");
    }
}

/// Takes over the runs whose driver is gone: every `every`, and whenever
/// another server gives its runs back as it stops; stops looking once the
/// server drains.
async fn take_over(state: api::AppState, every: Duration) {
    let mut given_back = match state.engine().journal().backend().listen(Topic::Released) {
        Ok(l) => Some(l),
        Err(e) => {
            tracing::warn!(error = %e, "cannot hear other servers stop; looking for their runs every {every:?}");
            None
        }
    };
    // Looks still to make soon after a wake-up: a run whose lease the
    // stopping server gave back a moment after it woke us is found by one.
    let mut soon = 0u32;
    loop {
        let woken = async {
            match given_back.as_mut() {
                Some(l) => l.wait().await,
                None => std::future::pending().await,
            }
        };
        let wait = if soon > 0 {
            LOOK_AGAIN.min(every)
        } else {
            every
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => soon = soon.saturating_sub(1),
            _ = woken => soon = LOOKS_AFTER_WAKE,
        }
        if state.draining() {
            return;
        }
        let resumed = state.engine().resume_interrupted().await;
        if !resumed.is_empty() {
            let runs: Vec<&str> = resumed.iter().map(|r| r.as_str()).collect();
            tracing::info!(runs = ?runs, "took over runs whose process stopped");
        }
    }
}

/// Most runs one claim asks for: a claimer goes on claiming at once while
/// it gets any, so a large queue is taken in steps that let the other
/// instances' claims interleave.
const CLAIM_BATCH: usize = 16;

/// How often a claimer looks at the queue when nothing woke it: a
/// wake-up lost (a reconnection) costs at most this.
const CLAIM_EVERY: Duration = Duration::from_secs(1);

/// Registers this server as a claimer of the store's queued runs, when
/// its engine queues them; says whether it did.
async fn join_claimers(state: &api::AppState) -> bool {
    if !state.engine().queues() {
        return false;
    }
    let (engine, capacity) = (state.engine().clone(), state.cfg().max_runs);
    let joined = tokio::task::spawn_blocking(move || match engine.journal().backend().claims() {
        Some(c) => c.join(capacity),
        None => Ok(()),
    })
    .await;
    match joined {
        Ok(Ok(())) => true,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "cannot register as a claimer of queued runs; this instance claims none");
            false
        }
        Err(_) => false,
    }
}

/// Takes this server out of the claimers as it stops, so that the others'
/// shares no longer count it.
async fn leave_claimers(state: &api::AppState) {
    if !state.engine().queues() {
        return;
    }
    let engine = state.engine().clone();
    let left = tokio::task::spawn_blocking(move || match engine.journal().backend().claims() {
        Some(c) => c.leave(),
        None => Ok(()),
    })
    .await;
    if let Ok(Err(e)) = left {
        tracing::warn!(error = %e, "cannot leave the claimers; the others stop counting this instance once it is no longer seen");
    }
}

/// Claims runs while this server has room: queued ones, and those another
/// instance gave back or left by dying. When runs are queued or given back
/// (a wake-up from whichever instance did it), when a run here stops (room
/// freed), and every [`CLAIM_EVERY`]; stops once the server drains.
async fn claim_queued(state: api::AppState) {
    let engine = state.engine().clone();
    let listen = |topic| match engine.journal().backend().listen(topic) {
        Ok(l) => Some(l),
        Err(e) => {
            tracing::warn!(error = %e, "cannot hear runs being queued or given back; looking for them every {CLAIM_EVERY:?}");
            None
        }
    };
    let (mut queued, mut released) = (listen(Topic::Queued), listen(Topic::Released));
    let mut stopped = engine.runs_stopped();
    loop {
        if state.draining() {
            return;
        }
        match engine.claim(CLAIM_BATCH).await {
            // There may be more, and this instance's share may allow them
            // now: runs that wait for a person count for no one's share, so
            // a claim of them leaves the next one as large a share.
            Ok(got) if !got.is_empty() => {
                tokio::task::yield_now().await;
                continue;
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "cannot claim queued runs"),
        }
        tokio::select! {
            _ = woken(queued.as_mut()) => {}
            _ = woken(released.as_mut()) => {}
            _ = stopped.changed() => {}
            _ = tokio::time::sleep(CLAIM_EVERY) => {}
        }
    }
}

/// A wake-up of `listener`, or never without one.
async fn woken(listener: Option<&mut Box<dyn cairn_store::Listener>>) {
    match listener {
        Some(l) => l.wait().await,
        None => std::future::pending().await,
    }
}

/// Binds, says where it listens (on stderr), and serves until `shutdown`
/// completes; see [`Server::run`].
pub async fn serve(
    cfg: ServeConfig,
    engine: Engine,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    let has_token = cfg.token.is_some();
    let server = Server::bind(cfg, engine).await?;
    if server.loopback_forced() {
        eprintln!("cairn serve: no token configured, so listening on 127.0.0.1 only (set --token or CAIRN_TOKEN to listen elsewhere)");
    } else if !has_token {
        eprintln!("cairn serve: no token configured; the API is open to local clients");
    }
    if server.state.cfg().worker {
        eprintln!(
            "cairn serve: a worker: serving /healthz and /metrics on http://{}",
            server.local_addr()
        );
    } else {
        eprintln!("cairn serve: listening on http://{}", server.local_addr());
    }
    server.run(shutdown).await
}
