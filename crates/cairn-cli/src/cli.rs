//! The command line, as clap parses it.

use std::path::PathBuf;

use cairn_store::StoreUrl;
use clap::{Args, Parser, Subcommand};

/// Cairn runs durable workflows: every step is an event in a log, so a run
/// survives a crash and `cairn resume` continues it where it stopped.
#[derive(Debug, Parser)]
#[command(name = "cairn", version, after_help = crate::EXIT_CODES)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

/// Flags every command takes.
#[derive(Debug, Args)]
pub struct Global {
    /// The store: a SQLite database file, or a PostgreSQL database as a
    /// `postgres://user@host:port/db` URL (shared by many machines).
    /// Without it, the `.cairn/cairn.db` of the nearest folder at or above
    /// this one that has one, else `.cairn/cairn.db` here.
    #[arg(
        long,
        global = true,
        env = "CAIRN_STORE",
        value_name = "PATH|URL",
        default_value = ".cairn/cairn.db",
        value_parser = parse_store
    )]
    pub store: StoreUrl,
    /// On PostgreSQL, how long a run stays with a process that stopped
    /// renewing its lease (it died, or lost the database) before another
    /// process may take it over.
    #[arg(
        long,
        global = true,
        env = "CAIRN_LEASE_TTL",
        value_name = "DURATION",
        default_value = "5s"
    )]
    pub lease_ttl: String,
    /// What this process is called where runs say who drives them (`cairn
    /// runs`, the API, the web page, `/metrics`): letters, digits, `.`,
    /// `-`, `_`, `:` [default: the host name and pid, e.g. build-3-4242]
    #[arg(long, global = true, env = "CAIRN_INSTANCE_NAME", value_name = "NAME")]
    pub instance_name: Option<String>,
    /// Where each run's NDJSON mirror (`<run>/events.ndjson`) is written
    /// [default: `logs` beside the store, i.e. .cairn/logs]
    #[arg(long, global = true, env = "CAIRN_LOG_DIR", value_name = "DIR")]
    pub log_dir: Option<PathBuf>,
    /// Do not write the NDJSON mirror (the store keeps every event anyway).
    #[arg(long, global = true)]
    pub no_log: bool,
    /// Work through a `cairn serve` at this URL instead of a store: the
    /// commands that read or act on runs.
    #[arg(long, global = true, env = "CAIRN_SERVER", value_name = "URL")]
    pub server: Option<String>,
    /// Bearer token for --server.
    #[arg(long, global = true, env = "CAIRN_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// A profile of the config files (`~/.config/cairn/config.toml`,
    /// `.cairn.toml` in the project): its store or server and token.
    #[arg(long, global = true, env = "CAIRN_PROFILE", value_name = "NAME")]
    pub profile: Option<String>,
}

/// The store of the nearest `.cairn` folder at or above `dir` (as git finds
/// `.git`), when one holds a store: `cairn status` in a project's
/// subfolder reads the project's runs. `None` when none does: the default,
/// `.cairn/cairn.db` here, stands (and a command that starts a run creates
/// it).
pub fn nearest_store(dir: &std::path::Path) -> Option<PathBuf> {
    let default = std::path::Path::new(".cairn/cairn.db");
    searched(dir)
        .map(|d| d.join(default))
        .find(|candidate| candidate.is_file())
        .map(|found| relative_to(&found, dir))
}

/// `dir` and the folders above it that an upward search looks in: up to,
/// not into, a folder of `CAIRN_CEILING_DIRECTORIES` (absolute paths
/// separated by `:`, as git's `GIT_CEILING_DIRECTORIES`), so that a store
/// or a `.cairn.toml` someone left in `/tmp` or a home folder is not taken
/// for a project's. `dir` itself is always looked in.
pub fn searched(dir: &std::path::Path) -> impl Iterator<Item = &std::path::Path> {
    let ceilings: Vec<PathBuf> = std::env::var_os("CAIRN_CEILING_DIRECTORIES")
        .map(|v| {
            std::env::split_paths(&v)
                .filter(|p| p.is_absolute())
                .collect()
        })
        .unwrap_or_default();
    let mut first = true;
    dir.ancestors().take_while(move |d| {
        let go = first || !ceilings.iter().any(|c| c.as_path() == *d);
        first = false;
        go
    })
}

/// `path` as a path relative to `dir` when it is beneath it (a store found
/// here keeps printing as `.cairn/cairn.db`), else as it is.
fn relative_to(path: &std::path::Path, dir: &std::path::Path) -> PathBuf {
    path.strip_prefix(dir)
        .map(PathBuf::from)
        .unwrap_or_else(|_| path.to_path_buf())
}

/// `--store`, `--from` and `--to`: a store's address, read by the one parser
/// every part of Cairn uses, so an unknown scheme is refused here rather
/// than taken for a file name.
fn parse_store(text: &str) -> Result<StoreUrl, cairn_store::BadStoreUrl> {
    StoreUrl::parse(text)
}

impl Global {
    /// Whether the store is there to read. A PostgreSQL store is taken to
    /// exist: connecting to it tells.
    pub fn store_exists(&self) -> bool {
        match &self.store {
            StoreUrl::Sqlite(path) => path.exists(),
            StoreUrl::Postgres(_) => true,
        }
    }

    /// The mirror folder: `--log-dir`, or `logs` next to the store (for a
    /// PostgreSQL store, `.cairn/logs` here).
    pub fn log_dir(&self) -> PathBuf {
        match &self.log_dir {
            Some(d) => d.clone(),
            None => match &self.store {
                StoreUrl::Postgres(_) => PathBuf::from(".cairn/logs"),
                StoreUrl::Sqlite(path) => path
                    .parent()
                    .map(|p| p.join("logs"))
                    .unwrap_or_else(|| PathBuf::from("logs")),
            },
        }
    }
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a workflow file and show its progress.
    Run(RunArgs),
    /// Continue a run that crashed, was interrupted, or exited to wait.
    Resume(ResumeArgs),
    /// Grant a waiting approval (works whether or not a process drives the run).
    Approve(DecideArgs),
    /// Deny a waiting approval (the node fails; its on_failure decides what follows).
    Deny(DecideArgs),
    /// Answer a question a run asks (works whether or not a process drives the run).
    Answer(AnswerArgs),
    /// Cancel a run, from any process.
    Cancel(CancelArgs),
    /// Start a new run from a point of another: its log copied up to there,
    /// its files put back as they were, then on from there (possibly with
    /// another workflow file or input).
    Fork(ForkArgs),
    /// Run a recorded run's workflow again (or a changed one) as a
    /// replay: the model's answers, the people's and (with --tools
    /// recorded) the tools' come from the record where the same is asked;
    /// then say where the two runs part.
    Replay(ReplayArgs),
    /// Replay a folder of recorded runs (bundles) against the workflows as
    /// they are now, each judged by what is written beside it; exit 6 when
    /// one fails.
    Test(TestArgs),
    /// Take a running agent's conversation in this terminal: it stops at
    /// its next step boundary, your lines are its user turns, /back hands
    /// it back.
    Hijack(HijackArgs),
    /// Put the sandbox root back as it was before an attempt of a node,
    /// from the snapshot taken then (the run may have ended).
    Revert(RevertArgs),
    /// List runs, newest first.
    Runs(RunsArgs),
    /// Show what the nodes' scorers said across runs: per workflow, node and
    /// scorer, and per generation of the workflow file, newest first.
    Scores(ScoresArgs),
    /// List, show, pause, resume, trigger or delete the schedules of
    /// `cairn serve --triggers` and of the API (docs/integrations.md).
    Schedules(SchedulesArgs),
    /// Show a run's state: nodes, attempts, durations, outputs.
    Status(StatusArgs),
    /// Print a run's events.
    Logs(LogsArgs),
    /// Print a run's Activity: one line per meaningful action.
    Activity(StatusArgs),
    /// Check a workflow file without running it.
    Validate(FileArgs),
    /// Print a workflow's graph as a Mermaid flowchart.
    Graph(FileArgs),
    /// Rewrite a run's NDJSON mirror from the store.
    Export(ExportArgs),
    /// Send a run's trace (with its child runs') to the OpenTelemetry
    /// endpoint of OTEL_EXPORTER_OTLP_ENDPOINT, or print it as OTLP JSON.
    Trace(TraceArgs),
    /// Delete finished, failed and cancelled runs older than a duration, with their logs.
    Gc(GcArgs),
    /// Work on stores as a whole: copy runs between SQLite and PostgreSQL.
    #[command(subcommand)]
    Store(StoreCommand),
    /// Serve the HTTP API (runs, live events, metrics).
    Serve(ServeArgs),
    /// Show which walls of the process sandbox this machine supports.
    Doctor(DoctorArgs),
    /// Start a project here: a starter workflow and `.cairn/` in .gitignore.
    Init(InitArgs),
    /// Print the shell completion script (e.g. `cairn completions bash >
    /// ~/.local/share/bash-completion/completions/cairn`).
    Completions(CompletionsArgs),
    /// Print the man page (`cairn man > cairn.1; man ./cairn.1`).
    Man,
}

/// `cairn doctor`.
#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// The checks as one JSON object (`{"sandboxOk", "checks": [{"name",
    /// "ok", "required", "detail"}]}`).
    #[arg(long)]
    pub json: bool,
}

/// `cairn init`.
#[derive(Debug, Args)]
pub struct InitArgs {
    /// The starter workflow's file.
    #[arg(default_value = "workflow.yaml")]
    pub file: PathBuf,
}

/// `cairn completions`.
#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell.
    pub shell: clap_complete::Shell,
}

/// How a run's progress is shown (shared by `run` and `resume`).
#[derive(Debug, Args, Clone)]
pub struct DisplayArgs {
    /// Print each event as its stored JSON line on stdout (NDJSON) instead of progress.
    #[arg(long)]
    pub json: bool,
    /// Exit with code 3 as soon as the run waits for a person, instead of
    /// asking on the terminal or waiting for `cairn approve` from elsewhere.
    #[arg(long)]
    pub exit_on_wait: bool,
    /// Most nodes running at once (overrides the workflow's `concurrency`).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_concurrency: Option<u32>,
}

/// `cairn run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The workflow file (YAML or JSON).
    pub file: PathBuf,
    /// The run's input: a JSON text, or @FILE to read it from a file [default: {}].
    #[arg(long, value_name = "JSON|@FILE")]
    pub input: Option<String>,
    /// The run's id [default: generated].
    #[arg(long, value_name = "ID")]
    pub run_id: Option<String>,
    /// Watch the workflow file and the files it refers to, and reload the
    /// run when they change (docs/reload.md).
    #[arg(long)]
    pub watch: bool,
    /// Queue the run for the instances of a PostgreSQL store to claim
    /// (`cairn serve`, docs/deploy.md#a-fleet) instead of driving it here:
    /// prints its id once it is queued, and exits.
    #[arg(long, conflicts_with = "watch")]
    pub queue: bool,
    #[command(flatten)]
    pub display: DisplayArgs,
}

/// `cairn resume`.
#[derive(Debug, Args)]
pub struct ResumeArgs {
    /// The run's id.
    pub run: String,
    /// Watch the run's workflow file and the files it refers to, and
    /// reload the run when they change (docs/reload.md).
    #[arg(long)]
    pub watch: bool,
    /// On PostgreSQL, fail at once (exit 4) when the run's lease is held by
    /// a process on another machine, instead of waiting, once, for the
    /// lease to expire (it does unless that process is alive and renews it).
    #[arg(long)]
    pub no_wait: bool,
    #[command(flatten)]
    pub display: DisplayArgs,
}

/// `cairn approve` and `cairn deny`.
#[derive(Debug, Args)]
pub struct DecideArgs {
    /// The run's id.
    pub run: String,
    /// The approval node's id (its path, e.g. `per_item[2].gate`).
    pub node: String,
    /// A note kept with the decision.
    #[arg(long)]
    pub note: Option<String>,
    /// Who decides [default: $USER].
    #[arg(long)]
    pub by: Option<String>,
    /// The decision taken as one JSON object (`{"runId", "nodeId",
    /// "approved"}`, as the API's).
    #[arg(long)]
    pub json: bool,
}

/// `cairn answer`.
#[derive(Debug, Args)]
pub struct AnswerArgs {
    /// The run's id.
    pub run: String,
    /// `[QUESTION] ANSWER`: the question (its request id or its node's
    /// path; not needed when the run, its child runs included, has one open
    /// question), then the answer: JSON, or else taken as text.
    #[arg(num_args = 1..=2, required = true, value_names = ["QUESTION", "ANSWER"])]
    pub args: Vec<String>,
    /// The answer taken as one JSON object (`{"runId", "requestId"}`, as
    /// the API's).
    #[arg(long)]
    pub json: bool,
    /// Who answers [default: $USER].
    #[arg(long)]
    pub by: Option<String>,
}

/// `cairn cancel`.
#[derive(Debug, Args)]
pub struct CancelArgs {
    /// The run's id.
    pub run: String,
    /// Let running nodes finish instead of killing their processes.
    #[arg(long)]
    pub graceful: bool,
    /// Why, kept in the log.
    #[arg(long)]
    pub reason: Option<String>,
    /// The request taken as one JSON object (`{"runId", "cancelRequested":
    /// true}`).
    #[arg(long)]
    pub json: bool,
}

/// `cairn fork`.
#[derive(Debug, Args)]
pub struct ForkArgs {
    /// The run to fork.
    pub run: String,
    /// Where: a seq of the run's log (the fork keeps events up to it), or a
    /// node (the fork keeps what came before its first attempt).
    #[arg(long, value_name = "SEQ|NODE")]
    pub at: String,
    /// The fork's input instead of the run's: a JSON text, or @FILE.
    #[arg(long)]
    pub input: Option<String>,
    /// The fork's workflow file instead of the run's (nodes that finished
    /// before the point stay finished).
    #[arg(long, value_name = "FILE")]
    pub workflow: Option<PathBuf>,
    /// The fork's id [default: generated].
    #[arg(long)]
    pub run_id: Option<String>,
    /// Watch the fork's workflow files and reload it when they change.
    #[arg(long)]
    pub watch: bool,
    /// Put back also the paths that something else changed since the run
    /// did (otherwise a conflict: exit 5, nothing done).
    #[arg(long)]
    pub force: bool,
    /// Print the files the fork would write and remove, and the
    /// conflicts; touch nothing and make no run (`--json`: one object).
    #[arg(long)]
    pub dry_run: bool,
    #[command(flatten)]
    pub display: DisplayArgs,
}

/// `cairn replay`.
#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// The recorded run: its id, or a bundle file (`cairn export
    /// --bundle`), read into this store first.
    pub run: String,
    /// The workflow file to replay instead of the run's own (a prompt, a
    /// tool or a node changed).
    #[arg(long, value_name = "FILE")]
    pub workflow: Option<PathBuf>,
    /// The input instead of the run's: a JSON text, or @FILE.
    #[arg(long)]
    pub input: Option<String>,
    /// Where the replay asks what the original never did, ask the model
    /// or the person and go on (otherwise that node fails and the replay
    /// stops there: exit 6).
    #[arg(long)]
    pub live: bool,
    /// `real`: tools and commands run, in the replay's own copy of the
    /// original's root; `recorded`: they answer as they did, and never run.
    #[arg(long, value_enum, default_value_t = ReplayToolsArg::Real)]
    pub tools: ReplayToolsArg,
    /// The replay's id [default: generated].
    #[arg(long)]
    pub run_id: Option<String>,
    #[command(flatten)]
    pub display: DisplayArgs,
}

/// `cairn test`.
#[derive(Debug, Args)]
pub struct TestArgs {
    /// The folder of bundles (`*.bundle`, at any depth), each with an
    /// optional `NAME.expect.yaml` beside it [default: .].
    pub dir: Option<PathBuf>,
    /// Most replays at once [default: the cores].
    #[arg(long)]
    pub concurrency: Option<usize>,
    /// Write a JUnit XML report here.
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
    /// One JSON object: every test with its failures and report.
    #[arg(long)]
    pub json: bool,
    /// Keep the suite's store and copies of the roots (their folder is
    /// printed) instead of deleting them.
    #[arg(long)]
    pub keep: bool,
}

/// `cairn replay --tools`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ReplayToolsArg {
    /// Run them.
    Real,
    /// Answer from the record.
    Recorded,
}

impl From<ReplayToolsArg> for cairn_events::ReplayTools {
    fn from(a: ReplayToolsArg) -> Self {
        match a {
            ReplayToolsArg::Real => cairn_events::ReplayTools::Real,
            ReplayToolsArg::Recorded => cairn_events::ReplayTools::Recorded,
        }
    }
}

/// `cairn hijack`.
#[derive(Debug, Args)]
pub struct HijackArgs {
    /// The run's id.
    pub run: String,
    /// The agent node (its path, for a node inside a group).
    pub node: String,
}

/// `cairn revert`.
#[derive(Debug, Args)]
pub struct RevertArgs {
    /// The run's id.
    pub run: String,
    /// The node whose attempt's snapshot is restored (its path, for a node
    /// inside a loop or for_each).
    pub node: String,
    /// The attempt [default: the first, i.e. the files before the node did
    /// anything].
    #[arg(long, value_name = "N")]
    pub attempt: Option<u32>,
    /// The pass, for a node in a loop or for_each [default: the latest].
    #[arg(long, value_name = "N")]
    pub iteration: Option<u32>,
    /// Put back also the paths that something else changed since the run
    /// did (otherwise a conflict: exit 5, nothing done).
    #[arg(long)]
    pub force: bool,
    /// Print the files the revert would write and remove, and the
    /// conflicts; touch nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Print what was done (or planned) as one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// `cairn runs`.
#[derive(Debug, Args)]
pub struct RunsArgs {
    /// Only runs with this status: running, waiting-approval, waiting-input,
    /// finished, failed, cancelled, queued (waiting for an instance of a
    /// shared store to claim it), pending.
    #[arg(long, value_name = "S")]
    pub status: Option<String>,
    /// At most this many runs.
    #[arg(long, value_name = "N", default_value_t = 20)]
    pub limit: usize,
    /// The list as one JSON object (`{"runs": [...]}`, as the API's
    /// `GET /v1/runs`) instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `cairn scores`.
#[derive(Debug, Args)]
pub struct ScoresArgs {
    /// Only runs of this workflow (by name).
    #[arg(long, value_name = "W")]
    pub workflow: Option<String>,
    /// Only the scorers of this node (its path).
    #[arg(long, value_name = "N")]
    pub node: Option<String>,
    /// The report as one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// `cairn schedules`.
#[derive(Debug, Args)]
pub struct SchedulesArgs {
    /// What to do; without one, list them.
    #[command(subcommand)]
    pub action: Option<ScheduleAction>,
    /// As JSON (the API's bodies).
    #[arg(long, global = true)]
    pub json: bool,
}

/// What `cairn schedules` does to one schedule.
#[derive(Debug, Subcommand)]
pub enum ScheduleAction {
    /// Its definition, where its firing stands, and its last fires.
    Show {
        /// The schedule's name.
        name: String,
        /// How many of its last fires to show.
        #[arg(long, default_value_t = 20)]
        fires: usize,
    },
    /// Stop it firing until it is resumed.
    Pause {
        /// The schedule's name.
        name: String,
    },
    /// Let it fire again, from now: what fell due while paused does not fire.
    Resume {
        /// The schedule's name.
        name: String,
    },
    /// Start its run now, whatever its overlap policy (through a server:
    /// the server has the workflows).
    Trigger {
        /// The schedule's name.
        name: String,
    },
    /// Delete one made through the API, with its history.
    Delete {
        /// The schedule's name.
        name: String,
    },
}

/// `cairn status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The run's id.
    pub run: String,
    /// The state as JSON.
    #[arg(long)]
    pub json: bool,
}

/// `cairn logs`.
#[derive(Debug, Args)]
pub struct LogsArgs {
    /// The run's id.
    pub run: String,
    /// Keep printing new events until the run ends.
    #[arg(long, short = 'f')]
    pub follow: bool,
    /// Only events after this seq.
    #[arg(long, value_name = "SEQ", default_value_t = 0)]
    pub since: u64,
    /// Only events of this type (repeatable), e.g. NodeFinished.
    #[arg(long = "type", value_name = "T")]
    pub types: Vec<String>,
    /// Only events of this node.
    #[arg(long, value_name = "N")]
    pub node: Option<String>,
    /// The stored JSON lines, byte for byte (NDJSON).
    #[arg(long)]
    pub json: bool,
    /// With --follow, how long to wait for a run that has not started yet
    /// (or a store not made yet) before giving up with exit 4.
    #[arg(
        long,
        value_name = "DURATION",
        default_value = "60s",
        requires = "follow"
    )]
    pub timeout: String,
}

/// `cairn validate` and `cairn graph`.
#[derive(Debug, Args)]
pub struct FileArgs {
    /// The workflow file.
    pub file: PathBuf,
    /// `validate`: the verdict as one JSON object (`{"ok": true,
    /// "workflow", "nodes", "childWorkflows"}`, or `{"ok": false,
    /// "problems": [...]}`).
    #[arg(long)]
    pub json: bool,
}

/// `cairn export`.
#[derive(Debug, Args)]
pub struct ExportArgs {
    /// The run's id.
    pub run: String,
    /// Write the run as a bundle instead (its log, its tool calls, its
    /// child runs and the files of its first snapshot, in one text file
    /// that `cairn replay` and `cairn test` read on any machine).
    #[arg(long)]
    pub bundle: bool,
    /// The bundle's file [default: RUN.bundle; `-` for standard output].
    #[arg(long, short, value_name = "FILE", requires = "bundle")]
    pub out: Option<PathBuf>,
}

/// `cairn trace`.
#[derive(Debug, Args)]
pub struct TraceArgs {
    /// The run's id.
    pub run: String,
    /// Print the spans as OTLP JSON on stdout (one export request per
    /// line) instead of sending them.
    #[arg(long)]
    pub print: bool,
}

/// `cairn gc`.
#[derive(Debug, Args)]
pub struct GcArgs {
    /// Age of the runs to delete: 30m, 12h, 7d, 2w (last change before now minus this).
    #[arg(long, value_name = "DURATION")]
    pub older_than: String,
    /// Workspace snapshot objects that no remaining run names are deleted
    /// too, unless written or used within this: 30m, 1h, 0s (a snapshot
    /// another process is taking is named by its run only once taken).
    #[arg(long, value_name = "DURATION", default_value = "1h")]
    pub snapshot_grace: String,
}

/// `cairn store ...`.
#[derive(Debug, Subcommand)]
pub enum StoreCommand {
    /// Copy runs with their events (byte for byte), tool calls and pending
    /// commands from one store to another: SQLite file or PostgreSQL URL,
    /// either way. The source is only read.
    Copy(StoreCopyArgs),
}

/// `cairn store copy`.
#[derive(Debug, Args)]
pub struct StoreCopyArgs {
    /// The store to copy from: a SQLite file, or a `postgres://` URL.
    #[arg(long, value_name = "PATH|URL", value_parser = parse_store)]
    pub from: StoreUrl,
    /// The store to copy to: a SQLite file (created if missing), or a
    /// `postgres://` URL.
    #[arg(long, value_name = "PATH|URL", value_parser = parse_store)]
    pub to: StoreUrl,
    /// Copy only this run, with its child runs (repeatable) [default: every run].
    #[arg(long = "run", value_name = "ID")]
    pub runs: Vec<String>,
    /// Skip runs the destination already holds whole (a copy that stopped
    /// part-way is completed) instead of failing on them.
    #[arg(long)]
    pub skip_existing: bool,
}

/// `cairn serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:7700")]
    pub addr: String,
    /// Bearer token the API requires; without one only loopback is served.
    #[arg(long, env = "CAIRN_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Folder of workflows that `POST /v1/runs` may name (by name, never by
    /// path); without it the server starts no workflows.
    #[arg(long, value_name = "DIR")]
    pub workflows: Option<PathBuf>,
    /// Largest workflow file `POST /v1/runs` reads, in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = cairn_server::DEFAULT_MAX_WORKFLOW_BYTES,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub max_workflow_bytes: u64,
    /// Another name clients reach the server by, accepted in the `Host`
    /// header (NAME for any port, or NAME:PORT); repeatable. Loopback names
    /// and the bound address with its port are always accepted.
    #[arg(long = "allow-host", value_name = "NAME[:PORT]")]
    pub allow_hosts: Vec<String>,
    /// An origin whose web pages may call the API (SCHEME://HOST[:PORT]);
    /// repeatable. Requests with any other `Origin` are refused.
    #[arg(long = "allow-origin", value_name = "ORIGIN")]
    pub allow_origins: Vec<String>,
    /// Drive runs and answer only /healthz and /metrics: an instance of a
    /// fleet on a PostgreSQL store whose requests other instances serve. It
    /// claims queued runs and takes over runs whose instance died or stopped.
    #[arg(long)]
    pub worker: bool,
    /// Most runs this instance drives at once on a PostgreSQL store, runs
    /// waiting for a person not counted: it claims queued runs up to this,
    /// and no more than its share while another instance has room
    /// [default: 256 per core].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_runs: Option<u32>,
    /// A triggers file: schedules that start runs at due times and
    /// webhooks (`POST /v1/hooks/NAME`) that start runs on signed
    /// deliveries (docs/integrations.md). Its workflows are names in
    /// --workflows.
    #[arg(long, value_name = "FILE")]
    pub triggers: Option<PathBuf>,
    /// Connections open at once (event streams and WebSockets included);
    /// one more is answered 503 and closed.
    #[arg(long, value_name = "N", default_value_t = 1024,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,
    /// Connections one client address (an IPv6 /64) may hold at once; one
    /// more is answered 429 and closed [default: an eighth of
    /// --max-connections, at least 16]. Behind a reverse proxy, where every
    /// client has the proxy's address, set it to --max-connections.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections_per_client: Option<u32>,
    /// Longest a client may take to send a request's headers (and to start
    /// its next request on an idle connection): 500ms, 10s, 1m.
    #[arg(long, value_name = "DURATION", default_value = "10s")]
    pub header_timeout: String,
    /// Longest a request's body may take to arrive after its headers; then
    /// the request is answered 408 and the connection closed.
    #[arg(long, value_name = "DURATION", default_value = "30s")]
    pub body_timeout: String,
    /// Watch the workflow files of the runs this server drives, and reload
    /// a run when its files change (docs/reload.md).
    #[arg(long)]
    pub watch: bool,
}
