//! `cairn hijack`: take a running agent's conversation in the terminal
//! (docs/hijack.md). The run goes on in the process that drives it (or the
//! server); this one sends the request and the person's turns through the
//! run's inbox (or the server's API), and shows what the agent answers and
//! does from the run's log.

use std::io::{BufRead, Write};

use cairn_api::{AnswerBody, HijackBody};
use cairn_client::{Client, EventStream};
use cairn_engine::Engine;
use cairn_events::{Event, EventKind, NodePath, RunCommand, RunId};
use cairn_store::Subscription;
use serde_json::Value;

use crate::bad_input;
use crate::cli::{Global, HijackArgs};
use crate::remote::client_error;
use crate::store;

/// Exit 0 once the conversation is handed back or ended, 1 when the run
/// ended first, 4 when the node cannot be hijacked.
pub async fn hijack(g: &Global, a: HijackArgs) -> anyhow::Result<u8> {
    let engine = store::engine(g, false)?;
    let run = store::require_run(engine.journal(), &a.run)?.run_id;
    let asked = engine
        .send(
            &run,
            RunCommand::Hijack {
                node_id: a.node.clone(),
                by: by(),
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
    let sub = engine.journal().subscribe(&run, asked.seq.get());
    let sub = match sub {
        Ok(s) => s,
        Err(e) => {
            engine.journal().close();
            return Err(e.into());
        }
    };
    let mut link = Link::Local {
        engine: &engine,
        sub,
    };
    let code = converse(&a, &run, &mut link).await;
    engine.journal().close();
    code
}

/// `cairn hijack` through a server: the request, the person's turns and
/// the agent's steps go over the API (`POST .../nodes/{node}/hijack`, the
/// run's event stream, `POST .../inputs/{requestId}`). An external CLI's
/// session cannot be handed over from here: it lives on the server's
/// machine; it is handed back at once, saying so.
pub async fn hijack_remote(url: &str, g: &Global, a: HijackArgs) -> anyhow::Result<u8> {
    let c = crate::remote::client(url, g)?;
    let run = store::run_id(&a.run)?;
    let node =
        NodePath::parse(&a.node).map_err(|e| bad_input(format!("node `{}`: {e}", a.node)))?;
    let asked = c
        .hijack(&run, &node, &HijackBody { by: by() })
        .await
        .map_err(client_error)?;
    let events = c
        .events(&run, asked.seq, false)
        .await
        .map_err(client_error)?;
    let mut link = Link::Remote { client: c, events };
    converse(&a, &run, &mut link).await
}

fn by() -> Option<String> {
    std::env::var("USER").ok()
}

/// Where the conversation's events come from and its turns go: this
/// process's store, or a server.
enum Link<'a> {
    Local {
        engine: &'a Engine,
        sub: Subscription,
    },
    Remote {
        client: Client,
        events: EventStream,
    },
}

impl Link<'_> {
    /// The run's next event; `None` once the run has ended.
    async fn next(&mut self) -> anyhow::Result<Option<Event>> {
        match self {
            Link::Local { sub, .. } => match sub.next().await {
                None => Ok(None),
                Some(next) => Ok(Some(next?.decode()?)),
            },
            Link::Remote { events, .. } => match events.next_event().await {
                None => Ok(None),
                Some(line) => {
                    let line = line.map_err(client_error)?;
                    let ev = Event::from_json(&line).map_err(|e| {
                        anyhow::anyhow!("the server sent an event Cairn cannot read ({e}): {line}")
                    })?;
                    Ok(Some(ev))
                }
            },
        }
    }

    /// Answers one of the person's turns.
    async fn answer(&self, run: &RunId, request_id: &str, text: String) -> anyhow::Result<()> {
        match self {
            Link::Local { engine, .. } => {
                engine
                    .answer(run, request_id, Value::String(text), None)
                    .await?;
            }
            Link::Remote { client, .. } => {
                let body = AnswerBody {
                    value: Value::String(text),
                    by: by(),
                };
                client
                    .answer(run, request_id, &body)
                    .await
                    .map_err(client_error)?;
            }
        }
        Ok(())
    }

    fn is_remote(&self) -> bool {
        matches!(self, Link::Remote { .. })
    }
}

/// The conversation, from the request taken to the hand-back or the end.
async fn converse(a: &HijackArgs, run: &RunId, link: &mut Link<'_>) -> anyhow::Result<u8> {
    let mut out = std::io::stdout();
    writeln!(
        out,
        "asked agent `{}` to stop at its next step boundary; then write to it \
         (/back hands it back, /done ends the node with its last answer)",
        a.node
    )?;
    out.flush()?;
    let mut terminal = Terminal::default();
    let code = loop {
        let Some(ev) = link.next().await? else {
            break crate::EXIT_FAILED;
        };
        let ours = ev.scope.node_id.as_deref() == Some(a.node.as_str());
        match &ev.kind {
            EventKind::AgentStepFinished { message, .. } if ours => show_step(&mut out, message)?,
            EventKind::ToolCallFinished {
                tool_name,
                status,
                error,
                ..
            } if ours => writeln!(out, "  {tool_name}: {}", tool_outcome(status, error))?,
            EventKind::InputRequested {
                request_id, schema, ..
            } if ours && request_id.starts_with("h-") && handoff(schema.as_ref()).is_some() => {
                let (argv, cwd) = handoff(schema.as_ref()).unwrap_or_default();
                if link.is_remote() {
                    writeln!(
                        out,
                        "the agent's session is an external CLI's on the server's machine ({} in \
                         {cwd}); it cannot be handed over from here: handing it back (run \
                         `cairn hijack` there to work in it)",
                        argv.join(" ")
                    )?;
                } else {
                    hand_over(&mut out, &argv, &cwd)?;
                }
                link.answer(run, request_id, "/back".into()).await?;
            }
            EventKind::InputRequested { request_id, .. }
                if ours && request_id.starts_with("h-") =>
            {
                let text = terminal.turn(&mut out).await?;
                link.answer(run, request_id, text).await?;
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
    // The reader thread may be blocked on the terminal: it ends with the
    // process.
    drop(terminal);
    Ok(code)
}

/// An external CLI's own session, handed over: the person works in it
/// here, and leaving it (or its failing to start) hands it back.
fn hand_over(out: &mut impl Write, argv: &[String], cwd: &str) -> std::io::Result<()> {
    writeln!(
        out,
        "the agent's session is yours: {} (in {cwd}); leave it to hand it back",
        argv.join(" ")
    )?;
    out.flush()?;
    let Some((program, args)) = argv.split_first() else {
        return writeln!(out, "the hand-over names no program; ending the hijack");
    };
    if let Err(e) = std::process::Command::new(program)
        .args(args)
        .current_dir(cwd)
        .status()
    {
        writeln!(out, "cannot start {program}: {e}; ending the hijack")?;
    }
    Ok(())
}

/// The person's terminal: lines read on a thread of their own, off the
/// async workers, started at the first turn.
#[derive(Default)]
struct Terminal {
    lines: Option<tokio::sync::mpsc::UnboundedReceiver<Option<String>>>,
}

impl Terminal {
    /// Asks for and reads one turn. An empty line or the end of input
    /// hands the conversation back (`/back`).
    async fn turn(&mut self, out: &mut impl Write) -> std::io::Result<String> {
        write!(out, "you> ")?;
        out.flush()?;
        let lines = self.lines.get_or_insert_with(|| {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            std::thread::spawn(move || {
                let stdin = std::io::stdin();
                for line in stdin.lock().lines() {
                    if tx.send(line.ok()).is_err() {
                        return;
                    }
                }
                let _ = tx.send(None);
            });
            rx
        });
        Ok(match lines.recv().await.flatten() {
            Some(l) if !l.trim().is_empty() => l,
            Some(_) => {
                writeln!(out, "(an empty line is not a turn; /back hands it back)")?;
                "/back".to_string()
            }
            None => {
                writeln!(out, "/back")?;
                "/back".to_string()
            }
        })
    }
}

/// How a tool call ended, with its error's message when it failed.
fn tool_outcome(
    status: &cairn_events::ToolStatus,
    error: &Option<cairn_events::ErrorInfo>,
) -> String {
    match error {
        Some(e) => format!("{}: {}", status_word(status), e.message),
        None => status_word(status),
    }
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
