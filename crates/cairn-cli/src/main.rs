//! `cairn`: run durable workflows from the command line, decide their
//! approvals, and read their event logs.
//!
//! Every command opens the store (`--store`), does one thing and exits with
//! one of the documented codes (see [`EXIT_CODES`]). Bad input is refused
//! before anything is written: a workflow file and a run's input are checked
//! before the store is even opened.

mod cli;
mod display;
mod format;
mod inspect;
mod run;
mod store;

use std::process::ExitCode;

use clap::Parser;

use cli::{Cli, Command};

/// The exit codes, as `cairn --help` and docs/cli.md list them.
pub const EXIT_CODES: &str = "\
Exit codes:
  0  the run finished (or the command succeeded)
  1  the run failed (or the command failed for another reason)
  2  the run was cancelled
  3  the run is waiting for a person (approve or deny, then `cairn resume`)
  4  bad input: invalid workflow or input, unknown run or node, corrupt or
     locked store, bad flags";

/// Exit code: the run finished, or the command did what it was asked.
pub const EXIT_OK: u8 = 0;
/// Exit code: the run failed, or something other than bad input went wrong.
pub const EXIT_FAILED: u8 = 1;
/// Exit code: bad input of any kind.
pub const EXIT_BAD_INPUT: u8 = 4;

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

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
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
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
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

async fn dispatch(cli: Cli) -> anyhow::Result<u8> {
    let g = cli.global;
    match cli.command {
        Command::Run(a) => run::run(&g, a).await,
        Command::Resume(a) => run::resume(&g, a).await,
        Command::Approve(a) => run::decide(&g, a, true).await,
        Command::Deny(a) => run::decide(&g, a, false).await,
        Command::Cancel(a) => run::cancel(&g, a).await,
        Command::Runs(a) => inspect::runs(&g, a),
        Command::Status(a) => inspect::status(&g, a).await,
        Command::Logs(a) => inspect::logs(&g, a).await,
        Command::Validate(a) => inspect::validate(a),
        Command::Graph(a) => inspect::graph(a),
        Command::Export(a) => inspect::export(&g, a),
        Command::Gc(a) => inspect::gc(&g, a),
        Command::Serve(a) => inspect::serve(&g, a).await,
    }
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
            return ee.exit_code() as u8;
        }
        if let Some(se) = cause.downcast_ref::<StoreError>() {
            return match se {
                StoreError::Corrupt { .. }
                | StoreError::Locked { .. }
                | StoreError::TooNew { .. }
                | StoreError::NotFound(_)
                | StoreError::InvalidRunId(_)
                | StoreError::RunExists(_)
                | StoreError::Busy { .. } => EXIT_BAD_INPUT,
                _ => EXIT_FAILED,
            };
        }
    }
    EXIT_FAILED
}
