//! `cairn hijack`: take a running agent's conversation in the terminal
//! (docs/hijack.md). The run goes on in the process that drives it; this
//! one sends the request and the person's turns through the run's inbox,
//! and shows what the agent answers and does from the run's log.

use std::io::{BufRead, Write};

use cairn_events::{Event, EventKind, RunCommand};
use serde_json::Value;

use crate::cli::{Global, HijackArgs};
use crate::store;

/// Exit 0 once the conversation is handed back or ended, 1 when the run
/// ended first, 4 when the node cannot be hijacked.
pub async fn hijack(g: &Global, a: HijackArgs) -> anyhow::Result<u8> {
    let engine = store::engine(g, false)?;
    let run = store::require_run(engine.journal(), &a.run)?.run_id;
    let by = std::env::var("USER").ok();
    let asked = engine
        .send(
            &run,
            RunCommand::Hijack {
                node_id: a.node.clone(),
                by,
            },
        )
        .await;
    let asked = match asked {
        Ok(ev) => ev,
        Err(e) => {
            engine.journal().close();
            return Err(e.into());
        }
    };
    let mut out = std::io::stdout();
    writeln!(
        out,
        "asked agent `{}` to stop at its next step boundary; then write to it \
         (/back hands it back, /done ends the node with its last answer)",
        a.node
    )?;
    out.flush()?;
    let mut sub = engine.journal().subscribe(&run, asked.seq.get())?;
    let (lines_tx, mut lines) = tokio::sync::mpsc::unbounded_channel::<Option<String>>();
    let mut reader: Option<std::thread::JoinHandle<()>> = None;
    let code = loop {
        let Some(next) = sub.next().await else {
            break crate::EXIT_FAILED;
        };
        let ev: Event = next?.decode()?;
        let ours = ev.scope.node_id.as_deref() == Some(a.node.as_str());
        match &ev.kind {
            EventKind::AgentStepFinished { message, .. } if ours => show_step(&mut out, message)?,
            EventKind::ToolCallFinished {
                tool_name,
                status,
                error,
                ..
            } if ours => {
                let err = error
                    .as_ref()
                    .map(|e| format!(": {}", e.message))
                    .unwrap_or_default();
                writeln!(out, "  {tool_name}: {}{err}", status_word(status))?;
            }
            EventKind::InputRequested {
                request_id, schema, ..
            } if ours && request_id.starts_with("h-") && handoff(schema.as_ref()).is_some() => {
                // An external CLI's own session: the person works in it
                // here, and leaving it hands it back.
                let (argv, cwd) = handoff(schema.as_ref()).unwrap_or_default();
                writeln!(
                    out,
                    "the agent's session is yours: {} (in {cwd}); leave it to hand it back",
                    argv.join(" ")
                )?;
                out.flush()?;
                let status = std::process::Command::new(&argv[0])
                    .args(&argv[1..])
                    .current_dir(&cwd)
                    .status();
                let answer = match status {
                    Ok(_) => "/back",
                    Err(e) => {
                        writeln!(out, "cannot start {}: {e}; ending the hijack", argv[0])?;
                        "/back"
                    }
                };
                engine
                    .answer(&run, request_id, Value::String(answer.into()), None)
                    .await?;
            }
            EventKind::InputRequested { request_id, .. }
                if ours && request_id.starts_with("h-") =>
            {
                write!(out, "you> ")?;
                out.flush()?;
                // One line from the terminal, read off the async workers.
                if reader.is_none() {
                    let tx = lines_tx.clone();
                    reader = Some(std::thread::spawn(move || {
                        let stdin = std::io::stdin();
                        for line in stdin.lock().lines() {
                            if tx.send(line.ok()).is_err() {
                                return;
                            }
                        }
                        let _ = tx.send(None);
                    }));
                }
                // End of input hands the conversation back.
                let text = match lines.recv().await.flatten() {
                    Some(l) if !l.trim().is_empty() => l,
                    Some(_) => {
                        writeln!(out, "(an empty line is not a turn; /back hands it back)")?;
                        "/back".to_string()
                    }
                    None => {
                        writeln!(out, "/back")?;
                        "/back".to_string()
                    }
                };
                engine
                    .answer(&run, request_id, Value::String(text), None)
                    .await?;
            }
            EventKind::RunHijacked { resumed, .. } if ours => {
                if *resumed {
                    writeln!(out, "handed back: agent `{}` goes on by itself", a.node)?;
                } else {
                    writeln!(
                        out,
                        "ended: node `{}` finishes with the agent's last answer",
                        a.node
                    )?;
                }
                break crate::EXIT_OK;
            }
            EventKind::NodeFinished { .. }
            | EventKind::NodeFailed {
                will_retry: false, ..
            } if ours && ev.scope.attempt.is_some() => {
                writeln!(out, "node `{}` ended before a person took it", a.node)?;
                break crate::EXIT_FAILED;
            }
            k if ev_is_terminal(k) => {
                writeln!(out, "run `{}` ended", a.run)?;
                break crate::EXIT_FAILED;
            }
            _ => {}
        }
        out.flush()?;
    };
    out.flush()?;
    engine.journal().close();
    // The reader thread may be blocked on the terminal: it ends with the
    // process.
    drop(reader);
    Ok(code)
}

/// The command and folder a hand-over question names (`x-cairn-handoff`).
fn handoff(schema: Option<&Value>) -> Option<(Vec<String>, String)> {
    let h = schema?.get("x-cairn-handoff")?;
    let argv: Vec<String> = h
        .get("argv")?
        .as_array()?
        .iter()
        .map(|v| v.as_str().map(str::to_string))
        .collect::<Option<_>>()?;
    let cwd = h.get("cwd")?.as_str()?.to_string();
    (!argv.is_empty()).then_some((argv, cwd))
}

fn ev_is_terminal(k: &EventKind) -> bool {
    matches!(
        k,
        EventKind::RunFinished { .. }
            | EventKind::RunFailed { .. }
            | EventKind::RunCancelled { .. }
    )
}

fn status_word(s: &cairn_events::ToolStatus) -> String {
    serde_json::to_value(s)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// The agent's message: its text, and the calls it asks for.
fn show_step(out: &mut impl Write, message: &Value) -> std::io::Result<()> {
    if let Some(text) = message.get("text").and_then(Value::as_str) {
        for line in text.lines() {
            writeln!(out, "agent> {line}")?;
        }
    }
    for call in message
        .get("toolCalls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let name = call.get("name").and_then(Value::as_str).unwrap_or("?");
        let args = call.get("args").map(Value::to_string).unwrap_or_default();
        let args: String = args.chars().take(200).collect();
        writeln!(out, "  -> {name} {args}")?;
    }
    Ok(())
}
