//! The commands that act on runs, through a `cairn serve` (`--server`, or
//! a profile's `server`) instead of a store: the same arguments, the same
//! exit codes (a server's 4xx is bad input, 4; no answer from it is 1).

use std::io::IsTerminal;

use cairn_api::{AnswerBody, CancelBody, DecideBody, ForkBody, Forked, ResumeBody, StartBody};
use cairn_client::{Client, ClientError};
use cairn_engine::RunOutcome;
use cairn_events::{Event, EventKind, NodePath, RunId, RunStatus};
use cairn_store::StoredEvent;

use crate::bad_input;
use crate::cli::{
    AnswerArgs, CancelArgs, DecideArgs, DisplayArgs, ForkArgs, Global, ResumeArgs, RunArgs,
};
use crate::display::{Mode, Progress};

/// The client of the server at `url`, with the token of `g`.
pub fn client(url: &str, g: &Global) -> anyhow::Result<Client> {
    Client::new(url, g.token.clone()).map_err(|e| bad_input(e.to_string()))
}

/// A server's "not found" or "bad request" is bad input like a local one.
pub fn client_error(e: ClientError) -> anyhow::Error {
    match &e {
        ClientError::Status { status, .. } if (400..500).contains(status) => {
            bad_input(e.to_string())
        }
        ClientError::Url { .. } => bad_input(e.to_string()),
        _ => anyhow::Error::new(e),
    }
}

fn by(given: Option<String>) -> Option<String> {
    given.or_else(|| std::env::var("USER").ok())
}

/// `cairn approve` / `deny` through a server.
pub async fn decide(url: &str, g: &Global, a: DecideArgs, approved: bool) -> anyhow::Result<u8> {
    let c = client(url, g)?;
    let run = crate::store::run_id(&a.run)?;
    let node =
        NodePath::parse(&a.node).map_err(|e| bad_input(format!("node `{}`: {e}", a.node)))?;
    // The run's own approval, else one of its child runs' of that node;
    // else the run, whose answer says why it cannot be decided.
    let target = crate::people::open_gates_remote(&c, &run)
        .await
        .map_err(client_error)?
        .into_iter()
        .find(|g| g.node == a.node && g.request_id().is_none())
        .map_or_else(|| run.clone(), |g| g.run);
    let body = DecideBody {
        approved,
        note: a.note,
        by: by(a.by),
    };
    let d = c
        .decide(&target, &node, &body)
        .await
        .map_err(client_error)?;
    if a.json {
        println!("{}", serde_json::to_string(&d)?);
        return Ok(crate::EXIT_OK);
    }
    let verb = if d.approved { "approved" } else { "denied" };
    if target == run {
        println!("{verb} {} of run {run}", d.node_id);
    } else {
        println!("{verb} {} of child run {target} of run {run}", d.node_id);
    }
    Ok(crate::EXIT_OK)
}

/// `cairn answer` through a server: the question named (request id or
/// node), or the only open one, of the run or of one of its child runs.
pub async fn answer(url: &str, g: &Global, a: AnswerArgs) -> anyhow::Result<u8> {
    let c = client(url, g)?;
    let run = crate::store::run_id(&a.run)?;
    let (which, answer) = match a.args.as_slice() {
        [answer] => (None, answer),
        [which, answer] => (Some(which.as_str()), answer),
        _ => unreachable!("clap takes one or two"),
    };
    let open = crate::people::open_gates_remote(&c, &run)
        .await
        .map_err(client_error)?;
    let target = crate::people::pick_question(&run, open, which)?;
    let rid = target.request_id().unwrap_or_default().to_string();
    let body = AnswerBody {
        value: crate::run::parse_answer(answer),
        by: by(a.by),
    };
    c.answer(&target.run, &rid, &body)
        .await
        .map_err(client_error)?;
    crate::people::report_answered(&run, &target, a.json)?;
    Ok(crate::EXIT_OK)
}

/// `cairn cancel` through a server.
pub async fn cancel(url: &str, g: &Global, a: CancelArgs) -> anyhow::Result<u8> {
    let c = client(url, g)?;
    let run = crate::store::run_id(&a.run)?;
    let body = CancelBody {
        graceful: a.graceful,
        reason: a.reason,
        by: by(None),
    };
    c.cancel(&run, &body).await.map_err(client_error)?;
    if a.json {
        println!(
            "{}",
            serde_json::json!({ "runId": run, "cancelRequested": true })
        );
    } else {
        println!("cancel of run {run} requested");
    }
    Ok(crate::EXIT_OK)
}

/// `cairn resume` through a server: the server drives the run; this
/// process says so and returns (`cairn logs --follow` watches it).
pub async fn resume(url: &str, g: &Global, a: ResumeArgs) -> anyhow::Result<u8> {
    if a.watch {
        return Err(bad_input(
            "--watch reloads files on this machine; a server's runs reload with `cairn serve --watch`",
        ));
    }
    let c = client(url, g)?;
    let run: RunId = crate::store::run_id(&a.run)?;
    let body = ResumeBody {
        max_concurrency: None,
    };
    let accepted = c.resume(&run, &body).await.map_err(client_error)?;
    println!(
        "run {} resumed on {url}; watch it with: cairn logs {} --follow --server {url}",
        accepted.run_id, accepted.run_id
    );
    Ok(crate::EXIT_OK)
}

/// `cairn run` through a server: the server starts the workflow of its
/// `--workflows` folder named by FILE (the server runs only what its
/// operator put there, never a file a client sends), and this process
/// shows the run's events as they come, exiting as a local run would: 0
/// finished, 1 failed, 2 cancelled, 3 waiting for a person (with
/// `--exit-on-wait`) or the server stopped first. The run is the server's:
/// stopping this process stops only the watching.
pub async fn run(url: &str, g: &Global, a: RunArgs) -> anyhow::Result<u8> {
    if a.watch {
        return Err(bad_input(
            "--watch reloads files on this machine; a server's runs reload with `cairn serve --watch`",
        ));
    }
    let c = client(url, g)?;
    let input = crate::run::parse_input(a.input.as_deref())?;
    let run_id = a
        .run_id
        .as_deref()
        .map(crate::run::check_run_id)
        .transpose()?;
    let body = StartBody {
        workflow: a.file.to_string_lossy().into_owned(),
        input: Some(input),
        run_id: run_id.map(|r| r.to_string()),
        max_concurrency: a.display.max_concurrency.map(|n| n as usize),
    };
    let accepted = c.start(&body).await.map_err(client_error)?;
    follow(&c, url, &accepted.run_id, &a.display, 0).await
}

/// `cairn fork` through a server: the fork is made and driven there (its
/// files put back on the server's machine; `--workflow` names a workflow
/// of the server's folder), and shown here as `cairn run --server` shows
/// a run.
pub async fn fork(url: &str, g: &Global, a: ForkArgs) -> anyhow::Result<u8> {
    if a.watch {
        return Err(bad_input(
            "--watch reloads files on this machine; a server's runs reload with `cairn serve --watch`",
        ));
    }
    let c = client(url, g)?;
    let from = crate::store::run_id(&a.run)?;
    let input = a
        .input
        .as_deref()
        .map(|i| crate::run::parse_input(Some(i)))
        .transpose()?;
    let run_id = a
        .run_id
        .as_deref()
        .map(crate::run::check_run_id)
        .transpose()?;
    let body = ForkBody {
        at: a.at.clone(),
        input,
        workflow: a
            .workflow
            .as_ref()
            .map(|w| w.to_string_lossy().into_owned()),
        run_id: run_id.map(|r| r.to_string()),
        force: a.force,
        dry_run: a.dry_run,
    };
    let forked = match c.fork(&from, &body).await {
        Ok(f) => f,
        Err(e) => match crate::revert::refused_answer::<Forked>(&e) {
            Some(f) => f,
            None => return Err(client_error(e)),
        },
    };
    let Some(run) = forked.run_id.clone().filter(|_| forked.made) else {
        return Ok(crate::run::fork_not_made(&a, &forked));
    };
    crate::run::told_forked(&a, &forked);
    follow(&c, url, &run, &a.display, forked.starts_after).await
}

/// Shows a run the server drives, from after `after`, until it ends (or
/// waits, with `--exit-on-wait`, or the server stops); the exit code a
/// local run would have.
async fn follow(
    c: &Client,
    url: &str,
    run: &RunId,
    display: &DisplayArgs,
    after: u64,
) -> anyhow::Result<u8> {
    let run = run.clone();
    let mode = if display.json {
        Mode::Json
    } else if std::io::stdout().is_terminal() {
        Mode::Tty
    } else {
        Mode::Plain
    };
    let mut progress = Progress::new(mode, &run, after).through_server(url);
    let mut told_waiting = std::collections::HashSet::new();
    // From the start: the events up to `after` build the display's state
    // (what finished before a fork's point) without being shown.
    let mut stream = c.events(&run, 0, false).await.map_err(client_error)?;
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(100));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let outcome = loop {
        let line = tokio::select! {
            line = stream.next_event() => line,
            _ = tick.tick() => {
                progress.tick(crate::display::now_ms());
                continue;
            }
        };
        let Some(line) = line else {
            // The stream ended before the run did: the server stopped.
            break RunOutcome::Interrupted;
        };
        let line = line.map_err(client_error)?;
        let event = Event::from_json(&line).map_err(|e| {
            anyhow::anyhow!("the server sent an event Cairn cannot read ({e}): {line}")
        })?;
        let stored = StoredEvent {
            run_id: event.run_id.clone(),
            seq: event.seq.get(),
            type_name: event.type_name().to_string(),
            node_id: event.scope.node_id.clone(),
            timestamp_ms: event.timestamp_ms,
            json: line.into(),
        };
        if let Some(ask) = progress.on_event(&stored) {
            if !display.exit_on_wait && told_waiting.insert(ask.node_id.clone()) {
                progress.note_waiting_elsewhere(&ask);
            }
        }
        if event.seq.get() <= after {
            continue;
        }
        match event.kind {
            EventKind::RunFinished { output, .. } => break RunOutcome::Finished(output),
            EventKind::RunFailed { error } => break RunOutcome::Failed(error),
            EventKind::RunCancelled { .. } => break RunOutcome::Cancelled,
            EventKind::RunStatusChanged {
                status: RunStatus::WaitingApproval | RunStatus::WaitingInput,
            } if display.exit_on_wait => {
                break RunOutcome::Waiting;
            }
            _ => {}
        }
    };
    progress.finish(&outcome);
    Ok(outcome.exit_code() as u8)
}

/// A command that works on a store only, given a server.
pub fn store_only(command: &str) -> anyhow::Error {
    bad_input(format!(
        "`cairn {command}` works on a store, not through a server; \
         drop --server (or CAIRN_SERVER, or the profile's server) and give --store"
    ))
}
