//! `cairn`: run durable workflows from the command line, decide their
//! approvals, and read their event logs.
//!
//! Every command opens the store (`--store`), does one thing and exits with
//! one of the documented codes (see [`EXIT_CODES`]). Bad input is refused
//! before anything is written: a workflow file and a run's input are checked
//! before the store is even opened.

mod cli;
mod config;
mod copy;
mod display;
mod doctor;
mod format;
mod hijack;
mod inspect;
mod people;
mod project;
mod reload;
mod remote;
mod replay;
mod revert;
mod run;
mod schedules;
mod scores;
mod store;
mod suite;
mod trace;

use std::process::ExitCode;

use cli::{Cli, Command, StoreCommand};

cairn_engine::use_run_allocator!();

/// The exit codes, as `cairn --help` and docs/cli.md list them.
pub const EXIT_CODES: &str = "\
Exit codes:
  0  the run finished (or the command succeeded)
  1  the run failed (or the command failed for another reason, e.g. a full
     disk)
  2  the run was cancelled
  3  the run is waiting for a person (approve or deny, then `cairn resume`)
  4  bad input: invalid workflow or input, unknown run or node, a store that
     is corrupt, locked, read-only or from a newer Cairn, bad flags
  5  revert or fork refused: files the run changed were changed since by
     something else (listed; --force overwrites them)
  6  a replay diverged: it asked what the original never did (cairn replay
     without --live); or a test of cairn test failed";

/// Exit code: the run finished, or the command did what it was asked.
pub const EXIT_OK: u8 = 0;
/// Exit code: the run failed, or something other than bad input went wrong.
pub const EXIT_FAILED: u8 = 1;
/// Exit code: bad input of any kind.
pub const EXIT_BAD_INPUT: u8 = 4;
/// Exit code: a revert or fork refused because something else changed
/// files the run changed (`--force` overwrites them).
pub const EXIT_CONFLICT: u8 = 5;

/// Exit code: a replay asked what its original never did.
pub const EXIT_DIVERGED: u8 = 6;

/// An error the user caused (bad flag value, unknown run...): exit code 4.
#[derive(Debug)]
pub struct BadInput(pub String);

impl std::fmt::Display for BadInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BadInput {}

/// Shorthand for a bad-input error.
pub fn bad_input(msg: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(BadInput(msg.into()))
}

/// The command line, with the store found the way git finds `.git` when
/// neither `--store` nor `CAIRN_STORE` names one.
fn parse_cli() -> Result<Cli, clap::Error> {
    use clap::{CommandFactory, FromArgMatches};
    let matches = Cli::command().try_get_matches()?;
    let mut cli = Cli::from_arg_matches(&matches)?;
    let store_given =
        matches.value_source("store") != Some(clap::parser::ValueSource::DefaultValue);
    if let Err(e) = config::apply(&mut cli.global, store_given) {
        // A config file or profile that cannot be used: bad input, said
        // as clap says a bad flag.
        return Err(clap::Error::raw(
            clap::error::ErrorKind::ValueValidation,
            format!("{e}\n"),
        ));
    }
    if !store_given
        && matches!(cli.global.store, cairn_store::StoreUrl::Sqlite(ref p) if p == std::path::Path::new(".cairn/cairn.db"))
    {
        if let Ok(here) = std::env::current_dir() {
            if let Some(found) = cli::nearest_store(&here) {
                cli.global.store = cairn_store::StoreUrl::Sqlite(found);
            }
        }
    }
    Ok(cli)
}

fn main() -> ExitCode {
    // Before the runtime starts its threads: arenas made earlier stay.
    cairn_engine::limit_malloc_arenas();
    // Before anything else: the processes a run starts must not be able to
    // read this process's memory or /proc entries (its environment holds
    // the engine's secrets), even outside their sandbox.
    if let Err(e) = cairn_sandbox::make_non_dumpable() {
        eprintln!("warning: cannot mark the engine non-dumpable: {e}");
    }
    let cli = match parse_cli() {
        Ok(c) => c,
        Err(e) => {
            use clap::error::ErrorKind;
            let _ = e.print();
            return match e.kind() {
                ErrorKind::DisplayHelp
                | ErrorKind::DisplayVersion
                | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => ExitCode::SUCCESS,
                // Usage errors are bad input like any other.
                _ => ExitCode::from(EXIT_BAD_INPUT),
            };
        }
    };
    let rt = match runtime(&cli.command) {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(EXIT_FAILED);
        }
    };
    let result = rt.block_on(dispatch(cli));
    // Running command attempts are killed by the engine on cancel; nothing
    // left on the runtime needs to finish once the command has its answer.
    rt.shutdown_background();
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            let code = exit_code_of(&e);
            match e.downcast_ref::<cairn_workflow::WorkflowError>() {
                // One line per problem, each with its file:line:col.
                Some(we) => {
                    for p in &we.problems {
                        eprintln!("error: {p}");
                    }
                }
                None => eprintln!("error: {}", render_error(&e)),
            }
            ExitCode::from(code)
        }
    }
}

/// The async runtime of a command. `cairn serve` drives many runs and
/// serves many clients: a worker per core. A command that drives a run of
/// unknown size (`resume`, `fork`, `hijack`, `run` of a large workflow)
/// gets a worker less than the cores (at least one): the run's driver
/// there, the display on the main thread, and the store's writer (a thread
/// of its own) a core of its own. Everything else, `run` of a small
/// workflow included, runs on the main thread alone: starting and
/// stopping a worker and handing each step between two threads was a
/// twentieth of a one-node run's time, more than a small run gains from a
/// second thread (a 20,000-node chain on one thread takes a fifth longer).
fn runtime(command: &Command) -> std::io::Result<tokio::runtime::Runtime> {
    let workers = match command {
        Command::Serve(_) => None,
        Command::Resume(_) | Command::Fork(_) | Command::Replay(_) | Command::Hijack(_) => {
            Some(worker_count())
        }
        Command::Run(a) if !is_small_workflow(&a.file) => Some(worker_count()),
        _ => {
            return tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
        }
    };
    let mut b = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = workers {
        b.worker_threads(n);
    }
    b.enable_all().build()
}

/// A worker less than the cores, at least one.
fn worker_count() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    cores.saturating_sub(1).max(1)
}

/// Workflow files up to this size (a few hundred nodes) run on one thread.
const SMALL_WORKFLOW_BYTES: u64 = 64 << 10;

/// Whether `file` is a workflow small enough for one thread. A file that
/// is not there (a server's workflow, by name) or cannot be read is not:
/// the command then says why, on the usual runtime.
fn is_small_workflow(file: &std::path::Path) -> bool {
    std::fs::metadata(file).is_ok_and(|m| m.len() <= SMALL_WORKFLOW_BYTES)
}

async fn dispatch(cli: Cli) -> anyhow::Result<u8> {
    let g = cli.global;
    let command = match g.server.clone() {
        Some(url) => match through_server(&url, &g, cli.command).await {
            Ok(done) => return done,
            Err(command) => command,
        },
        None => cli.command,
    };
    match command {
        Command::Run(a) => run::run(&g, a).await,
        Command::Resume(a) => run::resume(&g, a).await,
        Command::Approve(a) => run::decide(&g, a, true).await,
        Command::Answer(a) => run::answer(&g, a).await,
        Command::Deny(a) => run::decide(&g, a, false).await,
        Command::Cancel(a) => run::cancel(&g, a).await,
        Command::Revert(a) => revert::revert(&g, a).await,
        Command::Fork(a) => run::fork(&g, a).await,
        Command::Replay(a) => run::replay(&g, a).await,
        Command::Test(a) => suite::test(&g, a).await,
        Command::Hijack(a) => hijack::hijack(&g, a).await,
        Command::Runs(a) => inspect::runs(&g, a).await,
        Command::Scores(a) => scores::scores(&g, a).await,
        Command::Schedules(a) => schedules::schedules(&g, a).await,
        Command::Status(a) => inspect::status(&g, a).await,
        Command::Logs(a) => inspect::logs(&g, a).await,
        Command::Activity(a) => inspect::activity(&g, a).await,
        Command::Validate(a) => inspect::validate(a),
        Command::Graph(a) => inspect::graph(a),
        Command::Export(a) if a.bundle => replay::export_bundle(&g, a).await,
        Command::Export(a) => inspect::export(&g, a),
        Command::Trace(a) => trace::trace(&g, a).await,
        Command::Gc(a) => inspect::gc(&g, a).await,
        Command::Store(StoreCommand::Copy(a)) => copy::copy(&g, a),
        Command::Serve(a) => inspect::serve(&g, a).await,
        Command::Doctor(a) => Ok(doctor::doctor(a.json)),
        Command::Init(a) => project::init(a),
        Command::Completions(a) => project::completions(a),
        Command::Man => project::man(),
    }
}

/// A command with a server to work through: those that act on runs go to
/// it, and those that need the files of a store here say so (`Ok`). The
/// rest come back (`Err`) to run as without a server: the reading commands
/// ask the server themselves, and checking a file or this machine's walls
/// needs neither.
async fn through_server(
    url: &str,
    g: &cli::Global,
    command: Command,
) -> Result<anyhow::Result<u8>, Command> {
    Ok(match command {
        Command::Approve(a) => remote::decide(url, g, a, true).await,
        Command::Deny(a) => remote::decide(url, g, a, false).await,
        Command::Answer(a) => remote::answer(url, g, a).await,
        Command::Cancel(a) => remote::cancel(url, g, a).await,
        Command::Resume(a) => remote::resume(url, g, a).await,
        Command::Run(a) => remote::run(url, g, a).await,
        Command::Revert(a) => revert::revert_remote(url, g, a).await,
        Command::Fork(a) => remote::fork(url, g, a).await,
        Command::Hijack(a) => hijack::hijack_remote(url, g, a).await,
        Command::Export(a) => Err(bad_input(format!(
            "`cairn export` rewrites the mirror beside a store; through a server, \
             `cairn logs {} --json --server {url}` prints the same lines",
            a.run
        ))),
        Command::Trace(a) => trace::trace_remote(url, g, a).await,
        Command::Gc(_) => Err(remote::store_only("gc")),
        Command::Store(_) => Err(remote::store_only("store copy")),
        Command::Serve(_) => Err(remote::store_only("serve")),
        Command::Replay(_) => Err(remote::store_only("replay")),
        Command::Test(_) => Err(remote::store_only("test")),
        other @ (Command::Runs(_)
        | Command::Scores(_)
        | Command::Schedules(_)
        | Command::Status(_)
        | Command::Logs(_)
        | Command::Activity(_)
        | Command::Validate(_)
        | Command::Graph(_)
        | Command::Doctor(_)
        | Command::Init(_)
        | Command::Completions(_)
        | Command::Man) => return Err(other),
    })
}

/// The message of an error with its causes, without repeating a cause the
/// message already contains.
fn render_error(e: &anyhow::Error) -> String {
    let mut out = e.to_string();
    for cause in e.chain().skip(1) {
        let c = cause.to_string();
        if !out.contains(&c) {
            out.push_str(": ");
            out.push_str(&c);
        }
    }
    out
}

/// Maps an error to the documented exit code: 4 for anything the user can
/// fix by changing what they passed (or the store they pointed at), 1 else.
fn exit_code_of(e: &anyhow::Error) -> u8 {
    use cairn_engine::EngineError;
    use cairn_store::StoreError;
    for cause in e.chain() {
        if cause.is::<BadInput>()
            || cause.is::<cairn_workflow::WorkflowError>()
            || cause.is::<cairn_workflow::InputError>()
        {
            return EXIT_BAD_INPUT;
        }
        if let Some(ee) = cause.downcast_ref::<EngineError>() {
            return engine_exit_code(ee);
        }
        if let Some(se) = cause.downcast_ref::<StoreError>() {
            return store_exit_code(se);
        }
        if let Some(ce) = cause.downcast_ref::<cairn_store::copy::CopyError>() {
            return match ce.store_error() {
                _ if ce.is_refusal() => EXIT_BAD_INPUT,
                Some(se) => store_exit_code(se),
                None => EXIT_FAILED,
            };
        }
    }
    EXIT_FAILED
}

/// The engine's refusals are all about what was asked (a workflow, an
/// input, a run, node or question, a decision, command, revert or fork that
/// does not fit the run, a run another process drives, files that cannot
/// be put back now): bad input. A store failure maps as if the store had
/// reported it directly, so the same failure gives the same code whichever
/// layer saw it first. A store changed behind the run's back, and a
/// shutdown, are failures (1). The match is exhaustive so that a new engine
/// error must be placed here.
fn engine_exit_code(e: &cairn_engine::EngineError) -> u8 {
    use cairn_engine::EngineError;
    match e {
        EngineError::Workflow(_)
        | EngineError::Input(_)
        | EngineError::InvalidRunId(_)
        | EngineError::WorkflowNotFound { .. }
        | EngineError::RunNotFound { .. }
        | EngineError::NodeNotFound { .. }
        | EngineError::NodeNotWaiting { .. }
        | EngineError::QuestionNotFound { .. }
        | EngineError::QuestionAnswered { .. }
        | EngineError::AnswerInvalid { .. }
        | EngineError::RunEnded { .. }
        | EngineError::RunEndedFirst { .. }
        | EngineError::CommandNotTaken { .. }
        | EngineError::CommandRefused { .. }
        | EngineError::NotHijackable { .. }
        | EngineError::LeaseHeld { .. }
        | EngineError::ResumeRefused { .. }
        | EngineError::RevertRefused { .. }
        | EngineError::ForkRefused { .. }
        | EngineError::ReplayRefused { .. }
        | EngineError::NoSnapshots
        | EngineError::SnapshotsUnavailable { .. }
        | EngineError::Workspace(_)
        | EngineError::Files { .. }
        | EngineError::Secret { .. } => EXIT_BAD_INPUT,
        EngineError::Store(se) => store_exit_code(se),
        EngineError::ShuttingDown | EngineError::Integrity { .. } => EXIT_FAILED,
    }
}

/// Bad input (4) is what the user can fix by changing what they passed or
/// the store they pointed `--store` at: an unknown, malformed or taken run
/// id, a run another process drives, and a store that cannot be used at all
/// (damaged, written by a newer Cairn, locked, unopenable, read-only, or
/// holding rows that do not decode). A full disk, a database or I/O error
/// in the middle of the work, a closed journal or a failed commit are
/// failures of the moment: 1. The match is exhaustive so that a new store
/// error must be placed here.
fn store_exit_code(e: &cairn_store::StoreError) -> u8 {
    use cairn_store::StoreError;
    match e {
        StoreError::Corrupt { .. }
        | StoreError::Locked { .. }
        | StoreError::TooNew { .. }
        | StoreError::Open { .. }
        | StoreError::Missing { .. }
        | StoreError::BadUrl(_)
        | StoreError::ReadOnly { .. }
        | StoreError::BadRow { .. }
        | StoreError::RunNotFound(_)
        | StoreError::RunExists(_)
        | StoreError::LeaseHeld { .. } => EXIT_BAD_INPUT,
        StoreError::RecordNotFound { .. }
        | StoreError::DiskFull { .. }
        | StoreError::Database(_)
        | StoreError::Io { .. }
        | StoreError::Closed
        | StoreError::Commit(_) => EXIT_FAILED,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_engine::EngineError;
    use cairn_store::StoreError;

    fn code(e: impl std::error::Error + Send + Sync + 'static) -> u8 {
        exit_code_of(&anyhow::Error::new(e))
    }

    #[test]
    fn store_errors_get_one_code_whichever_layer_reports_them() {
        let cases: Vec<(fn() -> StoreError, u8)> = vec![
            (|| StoreError::RunNotFound("r".into()), EXIT_BAD_INPUT),
            (|| StoreError::RunExists("r".into()), EXIT_BAD_INPUT),
            (|| StoreError::LeaseHeld { run: "r".into() }, EXIT_BAD_INPUT),
            (
                || StoreError::Locked {
                    store: "c.db".into(),
                },
                EXIT_BAD_INPUT,
            ),
            (
                || StoreError::TooNew {
                    store: "c.db".into(),
                    found: 9,
                    supported: 2,
                },
                EXIT_BAD_INPUT,
            ),
            (
                || StoreError::Corrupt {
                    store: "c.db".into(),
                    detail: "x".into(),
                },
                EXIT_BAD_INPUT,
            ),
            (
                || StoreError::BadRow {
                    run: "r".into(),
                    detail: "x".into(),
                },
                EXIT_BAD_INPUT,
            ),
            (
                || StoreError::DiskFull {
                    store: "c.db".into(),
                },
                EXIT_FAILED,
            ),
            (|| StoreError::Database("x".into()), EXIT_FAILED),
            (|| StoreError::Closed, EXIT_FAILED),
        ];
        for (make, want) in cases {
            assert_eq!(code(make()), want, "{:?}", make());
            assert_eq!(
                code(EngineError::Store(make())),
                want,
                "engine: {:?}",
                make()
            );
        }
    }

    #[test]
    fn engine_refusals_are_bad_input_and_shutdown_and_tampering_are_not() {
        use cairn_engine::{ForkRefusal, IntegrityProblem, ResumeRefusal, Wanted};
        use cairn_events::{RunId, RunStatus};
        let run = || RunId::parse("r").unwrap();
        let not_found = || EngineError::RunNotFound { run: run() };
        assert_eq!(code(not_found()), EXIT_BAD_INPUT);
        assert_eq!(
            code(EngineError::NodeNotWaiting {
                run: run(),
                node: "n".into(),
                status: None,
            }),
            EXIT_BAD_INPUT
        );
        assert_eq!(
            code(EngineError::LeaseHeld {
                run: run(),
                holder: None,
                wanted: Wanted::Resume,
            }),
            EXIT_BAD_INPUT
        );
        assert_eq!(
            code(EngineError::ResumeRefused {
                run: run(),
                reason: ResumeRefusal::Ended(RunStatus::Finished),
            }),
            EXIT_BAD_INPUT
        );
        assert_eq!(
            code(EngineError::ForkRefused {
                reason: ForkRefusal::SeqZero
            }),
            EXIT_BAD_INPUT
        );
        assert_eq!(code(EngineError::ShuttingDown), EXIT_FAILED);
        assert_eq!(
            code(EngineError::Integrity {
                run: run(),
                problem: IntegrityProblem::GenerationMissing { generation: 1 },
            }),
            EXIT_FAILED
        );
        let wrapped = anyhow::Error::new(not_found()).context("resuming");
        assert_eq!(exit_code_of(&wrapped), EXIT_BAD_INPUT);
    }
}
