//! `cairn run`, `resume`, `approve`, `deny` and `cancel`.

use std::io::IsTerminal;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use cairn_engine::{Engine, RunHandle, RunOutcome, StartOptions};
use cairn_events::{Event, RunId};
use cairn_store::SubscribeError;
use serde_json::Value;
use tokio::sync::mpsc;

use crate::bad_input;
use crate::cli::{
    AnswerArgs, CancelArgs, DecideArgs, DisplayArgs, ForkArgs, Global, ResumeArgs, RunArgs,
};
use crate::display::{now_ms, Ask, Mode, Progress};
use crate::store;
use crate::trace::Telemetry;

/// How often the terminal table refreshes its elapsed times.
const REDRAW: Duration = Duration::from_millis(100);
/// How long the display waits for the last events of a session to be
/// committed before giving up on them (they stay in the store regardless).
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Reads `--input`: inline JSON, or `@file`.
pub(crate) fn parse_input(arg: Option<&str>) -> anyhow::Result<Value> {
    let Some(arg) = arg else {
        return Ok(Value::Object(Default::default()));
    };
    let (text, origin) = match arg.strip_prefix('@') {
        Some(path) => (
            std::fs::read_to_string(path)
                .map_err(|e| bad_input(format!("--input @{path}: cannot read the file: {e}")))?,
            format!("--input @{path}"),
        ),
        None => (arg.to_string(), "--input".to_string()),
    };
    serde_json::from_str(&text).map_err(|e| bad_input(format!("{origin}: not valid JSON: {e}")))
}

/// The one run-id rule, checked before the store is touched.
pub(crate) fn check_run_id(id: &str) -> anyhow::Result<RunId> {
    RunId::parse(id).map_err(|e| bad_input(format!("--run-id: {e}")))
}

/// `cairn run`.
pub async fn run(g: &Global, a: RunArgs) -> anyhow::Result<u8> {
    raise_descriptor_limit();
    // The run's first store work (its record and lease) goes to tokio's
    // blocking pool, which makes its first thread on demand: made now, the
    // thread is ready by then instead of made on the run's critical path.
    tokio::task::spawn_blocking(|| {});
    // Everything the user gave is checked before the store is opened, so a
    // mistake leaves nothing behind.
    let wf = load_workflow(&a.file)?;
    let input = parse_input(a.input.as_deref())?;
    wf.validate_input(&input)?;
    let given = a.run_id.as_deref().map(check_run_id).transpose()?;
    if a.queue {
        return queue(g, wf, input, given).await;
    }
    let (engine, telemetry) = store::driving_engine(g, true)?;
    // A generated id is new by construction; only one given is looked up.
    if let Some(run_id) = &given {
        if engine.journal().backend().get_run(run_id)?.is_some() {
            return Err(bad_input(format!(
                "a run `{run_id}` already exists in this store; pick another --run-id or `cairn resume {run_id}`"
            )));
        }
    }
    let run_id = given.unwrap_or_else(cairn_engine::new_run_id);
    let session = Session::new(&engine, &run_id, &a.display, None)?;
    let opts = StartOptions {
        watch: a.watch,
        ..session.start_options(&a.display, &run_id)
    };
    let handle = engine.start(wf, input, opts).await;
    session.drive(&engine, handle, &telemetry).await
}

/// `cairn run --queue`: the run written as work for the store's instances
/// to claim; its id on stdout.
async fn queue(
    g: &Global,
    wf: cairn_workflow::Workflow,
    input: serde_json::Value,
    given: Option<cairn_events::RunId>,
) -> anyhow::Result<u8> {
    if !g.store.is_postgres() {
        return Err(bad_input(
            "--queue: runs are queued for the instances of a store they share; this store is SQLite, where `cairn run` drives its run itself (use --store postgres://...)",
        ));
    }
    let engine = cairn_engine::Engine::new(
        store::open(g, true)?,
        cairn_engine::EngineOptions {
            queue: true,
            snapshot_dir: store::snapshot_dir(g),
            ..Default::default()
        },
    );
    if !engine.queues() {
        return Err(bad_input("--queue: this store takes no queued runs"));
    }
    if let Some(run_id) = &given {
        if engine.journal().backend().get_run(run_id)?.is_some() {
            return Err(bad_input(format!(
                "a run `{run_id}` already exists in this store; pick another --run-id"
            )));
        }
    }
    let opts = StartOptions {
        run_id: given,
        ..Default::default()
    };
    let submitted = engine.submit(wf, input, opts).await?;
    let run_id = submitted.run_id().clone();
    drop(submitted);
    engine.journal().close();
    println!("{run_id}");
    eprintln!(
        "queued {run_id}: an instance of the store claims it; `cairn status {run_id}` or `cairn logs {run_id} --follow` to watch it"
    );
    Ok(crate::EXIT_OK)
}

/// Raises the soft file descriptor limit to the hard one, as `cairn serve`
/// does: a run with many parallel nodes and agents holds many. Said only
/// when it cannot be done.
fn raise_descriptor_limit() {
    if let Err(e) = cairn_server::descriptors::raise_limit() {
        eprintln!("warning: file descriptors: the limit cannot be raised: {e}");
    }
}

/// `cairn resume`.
pub async fn resume(g: &Global, a: ResumeArgs) -> anyhow::Result<u8> {
    raise_descriptor_limit();
    let (engine, telemetry) = store::driving_engine(g, false)?;
    let run = store::require_run(engine.journal(), &a.run)?.run_id;
    if !a.no_wait {
        wait_for_lease(&engine, &run).await?;
    }
    let from = engine.journal().backend().last_seq(&run)?;
    let session = Session::new(&engine, &run, &a.display, Some(from))?;
    let opts = StartOptions {
        watch: a.watch,
        ..session.start_options(&a.display, &run)
    };
    let handle = engine.resume(&run, opts).await;
    session.drive(&engine, handle, &telemetry).await
}

/// The margin past a lease's expiry before the resume tries to take it:
/// the expiry is on the database's clock, the sleep on this machine's.
const LEASE_GRACE: Duration = Duration::from_millis(200);

/// Waits, once, for the run's lease to expire when its holder may have died
/// where this process cannot look (another machine), saying so on stderr.
/// A holder that lives renews its lease meanwhile, and the resume that
/// follows is refused (exit 4) as it would have been without the wait; so
/// is a resume of a run whose holder runs on this machine, at once. A lease
/// of a holder that died on this machine is no reason to wait: the resume
/// takes it over at once.
async fn wait_for_lease(engine: &Engine, run: &RunId) -> anyhow::Result<()> {
    let Some(held) = engine.journal().backend().lease_holder(run)? else {
        return Ok(());
    };
    let Some(left) = held.expires_in.filter(|_| !held.alive_here) else {
        return Ok(());
    };
    let until = now_ms().saturating_add(i64::try_from(left.as_millis()).unwrap_or(i64::MAX));
    eprintln!(
        "run {run} is held by {} until {}; waiting… (--no-wait fails at once)",
        held.holder,
        crate::format::datetime_ms(until)
    );
    tokio::time::sleep(left + LEASE_GRACE).await;
    Ok(())
}

/// `cairn fork`: a new run from a point of another (docs/fork.md), then
/// driven and shown as `cairn resume` does.
pub async fn fork(g: &Global, a: ForkArgs) -> anyhow::Result<u8> {
    let wf = a.workflow.as_deref().map(load_workflow).transpose()?;
    let input = a
        .input
        .as_deref()
        .map(|i| parse_input(Some(i)))
        .transpose()?;
    let run_id = a.run_id.as_deref().map(check_run_id).transpose()?;
    let (engine, telemetry) = store::driving_engine(g, false)?;
    let from = store::require_run(engine.journal(), &a.run)?.run_id;
    let forked = engine
        .fork(
            &from,
            cairn_engine::ForkRequest {
                at: cairn_engine::ForkPoint::parse(&a.at),
                input,
                workflow: wf,
                run_id,
                force: a.force,
                dry_run: a.dry_run,
            },
        )
        .await?;
    let answer = cairn_server::files::forked_body(&from, &forked, a.dry_run);
    if !forked.made {
        return Ok(fork_not_made(&a, &answer));
    }
    told_forked(&a, &answer);
    let from = engine.journal().backend().last_seq(&forked.run_id)?;
    let session = Session::new(&engine, &forked.run_id, &a.display, Some(from))?;
    let opts = StartOptions {
        watch: a.watch,
        ..session.start_options(&a.display, &forked.run_id)
    };
    let handle = engine.resume(&forked.run_id, opts).await;
    session.drive(&engine, handle, &telemetry).await
}

/// `cairn replay`: the run's workflow (or `--workflow`) run again as a
/// replay of it, then the report of where the two part.
pub async fn replay(g: &Global, a: crate::cli::ReplayArgs) -> anyhow::Result<u8> {
    let wf = a.workflow.as_deref().map(load_workflow).transpose()?;
    let input = a
        .input
        .as_deref()
        .map(|i| parse_input(Some(i)))
        .transpose()?;
    let run_id = match a.run_id.as_deref() {
        Some(id) => check_run_id(id)?,
        None => cairn_engine::new_run_id(),
    };
    let bundle = crate::replay::bundle_path(&a.run);
    let (engine, telemetry) = store::driving_engine(g, bundle.is_some())?;
    let run = match &bundle {
        Some(path) => crate::replay::import(&engine, path).await?.to_string(),
        None => a.run.clone(),
    };
    let original = store::require_run(engine.journal(), &run)?;
    let wf = match wf {
        Some(wf) => wf,
        None => engine.definition_of(&original.run_id).await?,
    };
    let input = input.unwrap_or_else(|| original.input.clone());
    let session = Session::new(&engine, &run_id, &a.display, None)?;
    let opts = StartOptions {
        replay: Some(cairn_events::ReplayOf {
            run_id: original.run_id.clone(),
            live: a.live,
            tools: a.tools.into(),
        }),
        ..session.start_options(&a.display, &run_id)
    };
    let handle = engine.start(wf, input, opts).await;
    let code = session.drive(&engine, handle, &telemetry).await?;
    let backend = engine.journal().backend().clone();
    let (from, to) = (original.run_id.clone(), run_id.clone());
    let report = tokio::task::spawn_blocking(move || {
        cairn_engine::replay::report::report(backend.as_ref(), &from, &to)
    })
    .await??;
    crate::replay::print(&report, a.display.json);
    Ok(crate::replay::exit_code(&report, code))
}

/// A fork made: what was overwritten and where the files are.
pub fn told_forked(a: &ForkArgs, f: &cairn_api::Forked) {
    if a.display.json {
        return;
    }
    for c in &f.plan.conflicts {
        println!("overwrote (--force) {}: {}", c.path, c.why);
    }
    let files = match &f.snapshot {
        Some(s) => format!(
            "files put back to snapshot {s} ({} written, {} removed)",
            f.written, f.removed
        ),
        None => "no snapshot at that point: files left as they are".into(),
    };
    let id = f.run_id.as_ref().map(|r| r.to_string()).unwrap_or_default();
    println!("forked run {id} from {} at seq {}; {files}", f.from, f.seq);
}

/// A dry run, or a fork refused for conflicts: its plan, and the exit code.
pub fn fork_not_made(a: &ForkArgs, f: &cairn_api::Forked) -> u8 {
    if a.display.json {
        println!(
            "{}",
            serde_json::to_string(f).expect("an answer serializes")
        );
    } else {
        match &f.snapshot {
            Some(s) => {
                println!(
                    "{} of run {} at seq {}: files put back to snapshot {s}:",
                    if a.dry_run {
                        "the plan of a fork"
                    } else {
                        "refused: a fork"
                    },
                    f.from,
                    f.seq
                );
                crate::revert::print_plan(&f.plan);
            }
            None => println!(
                "the plan of a fork of run {} at seq {}: no snapshot at that point, files left \
                 as they are",
                f.from, f.seq
            ),
        }
    }
    if f.plan.refused() {
        eprintln!("{}", crate::revert::refusal(&f.plan, "fork"));
        return crate::EXIT_CONFLICT;
    }
    crate::EXIT_OK
}

fn load_workflow(path: &Path) -> anyhow::Result<cairn_workflow::Workflow> {
    if !path.is_file() {
        return Err(bad_input(format!(
            "{}: no such workflow file",
            path.display()
        )));
    }
    // The child workflows it names are read too: a broken one is found
    // before anything runs.
    let wf = cairn_workflow::load_tree(path)?;
    // The parse's YAML tree is freed but still resident; a large workflow's
    // run would otherwise carry it to its end.
    cairn_engine::release_free_memory();
    Ok(wf)
}

/// One `run`/`resume` session: the display fed by a subscription to the
/// run's committed events, and the prompt for approvals on a terminal.
struct Session {
    run_id: RunId,
    /// Ask on the terminal (stdin and stdout are terminals, and the run is
    /// not meant to exit when it waits).
    ask: bool,
    progress: Arc<Mutex<Progress>>,
    sub: cairn_store::Subscription,
    /// The seq of the last event the engine appended in this session.
    appended: Arc<AtomicU64>,
    from: u64,
    exit_on_wait: bool,
}

impl Session {
    /// A session over a run this process is about to start (`from` is
    /// `None`) or to resume (`from` is the last seq stored, after which
    /// progress is shown).
    fn new(
        engine: &Engine,
        run_id: &RunId,
        d: &DisplayArgs,
        from: Option<u64>,
    ) -> anyhow::Result<Session> {
        let tty = std::io::stdout().is_terminal();
        let mode = if d.json {
            Mode::Json
        } else if tty {
            Mode::Tty
        } else {
            Mode::Plain
        };
        let ask = !d.exit_on_wait && tty && std::io::stdin().is_terminal();
        // Subscribed before the run starts: nothing committed can be missed.
        let sub = match from {
            None => engine.journal().subscribe_to_new(run_id),
            Some(_) => engine.journal().subscribe(run_id, 0)?,
        }
        .stop_at_terminal(false);
        let from = from.unwrap_or(0);
        Ok(Session {
            run_id: run_id.clone(),
            ask,
            progress: Arc::new(Mutex::new(Progress::new(mode, run_id, from))),
            sub,
            appended: Arc::new(AtomicU64::new(from)),
            from,
            exit_on_wait: d.exit_on_wait,
        })
    }

    fn start_options(&self, d: &DisplayArgs, run_id: &RunId) -> StartOptions {
        let appended = self.appended.clone();
        StartOptions {
            run_id: Some(run_id.clone()),
            max_concurrency: d.max_concurrency.map(|n| n as usize),
            exit_on_wait: d.exit_on_wait,
            observer: Some(Arc::new(move |e: &Event| {
                appended.fetch_max(e.seq.get(), Ordering::SeqCst);
            })),
            watch: false,
            trigger: None,
            replay: None,
        }
    }

    async fn drive(
        self,
        engine: &Engine,
        handle: Result<RunHandle, cairn_engine::EngineError>,
        telemetry: &Telemetry,
    ) -> anyhow::Result<u8> {
        let handle = handle?;
        let Session {
            run_id,
            ask,
            progress,
            mut sub,
            appended,
            from,
            exit_on_wait,
        } = self;
        let (ask_tx, ask_rx) = mpsc::unbounded_channel::<Ask>();
        let prompter = if ask {
            Some(tokio::spawn(prompt_loop(
                engine.clone(),
                run_id.clone(),
                progress.clone(),
                ask_rx,
            )))
        } else {
            drop(ask_rx);
            None
        };
        // The session ends when the engine says so; the display then shows
        // every event up to the last one appended.
        let (done_tx, mut done_rx) = tokio::sync::watch::channel(None::<u64>);
        let stopper = engine.clone();
        let waiter = tokio::spawn(async move {
            let outcome = wait_with_signals(handle, stopper).await;
            let _ = done_tx.send(Some(appended.load(Ordering::SeqCst)));
            outcome
        });
        let mut tick = tokio::time::interval(REDRAW);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut target: Option<u64> = None;
        let mut deadline: Option<tokio::time::Instant> = None;
        let mut told_waiting = std::collections::HashSet::new();
        loop {
            if let Some(t) = target {
                if progress.lock().unwrap().last_seq() >= t {
                    break;
                }
            }
            tokio::select! {
                next = sub.next() => match next {
                    Some(Ok(stored)) => {
                        let asked = progress.lock().unwrap().on_event(&stored);
                        if let Some(a) = asked {
                            if ask {
                                let _ = ask_tx.send(a);
                            } else if !exit_on_wait && stored.seq > from && told_waiting.insert(a.node_id.clone()) {
                                progress.lock().unwrap().note_waiting_elsewhere(&a);
                            }
                        }
                    }
                    Some(Err(SubscribeError::Lagged { last_seq })) => {
                        sub = engine.journal().subscribe(&run_id, last_seq)?.stop_at_terminal(false);
                    }
                    Some(Err(SubscribeError::Store(e))) => return Err(e.into()),
                    // Not stopping at terminal events, it ends only with the journal.
                    None => break,
                },
                _ = tick.tick() => {
                    progress.lock().unwrap().tick(now_ms());
                    if deadline.is_some_and(|d| tokio::time::Instant::now() > d) {
                        eprintln!("warning: the last events of run {run_id} were not shown; `cairn logs {run_id}` has them");
                        break;
                    }
                }
                changed = done_rx.changed(), if target.is_none() => {
                    if changed.is_ok() {
                        target = *done_rx.borrow();
                        deadline = Some(tokio::time::Instant::now() + DRAIN_TIMEOUT);
                    }
                }
            }
        }
        if let Some(p) = prompter {
            p.abort();
        }
        let outcome = waiter.await.context("the run's task stopped")?;
        engine.journal().close();
        progress.lock().unwrap().finish(&outcome);
        // Every event is committed: the traces queued as drivers stopped
        // can be read whole. Bounded by the export timeout.
        telemetry.finish().await;
        Ok(outcome.exit_code() as u8)
    }
}

/// Waits for the run; on Ctrl-C or SIGTERM the engine stops running nodes
/// at a safe point (the run stays resumable), a second signal exits at once.
async fn wait_with_signals(handle: RunHandle, engine: Engine) -> RunOutcome {
    use tokio::signal::unix::{signal, SignalKind};
    let run_id = handle.run_id.clone();
    let mut wait = Box::pin(handle.wait());
    let mut term = signal(SignalKind::terminate()).ok();
    let mut int = signal(SignalKind::interrupt()).ok();
    let mut stopping = false;
    loop {
        let got = async {
            tokio::select! {
                _ = async { match term.as_mut() { Some(s) => { s.recv().await; } None => std::future::pending::<()>().await } } => {},
                _ = async { match int.as_mut() { Some(s) => { s.recv().await; } None => std::future::pending::<()>().await } } => {},
            }
        };
        tokio::select! {
            outcome = &mut wait => return outcome,
            _ = got => {
                if stopping {
                    eprintln!("\nstopping now; `cairn resume {run_id}` continues the run");
                    std::process::exit(130);
                }
                stopping = true;
                eprintln!("\nstopping: running nodes get a grace period to reach a safe point, then are stopped (Ctrl-C again to quit now)");
                let e = engine.clone();
                tokio::spawn(async move { e.shutdown(Duration::from_secs(5)).await });
            }
        }
    }
}

/// Asks about approvals on the terminal, one at a time, and records the
/// answers through the engine.
async fn prompt_loop(
    engine: Engine,
    run_id: RunId,
    progress: Arc<Mutex<Progress>>,
    mut asks: mpsc::UnboundedReceiver<Ask>,
) {
    let by = std::env::var("USER").ok();
    while let Some(ask) = asks.recv().await {
        if let Some((rid, schema)) = &ask.question {
            progress.lock().unwrap().pause();
            answer_inline(&engine, &run_id, &ask, rid, schema.as_ref(), by.clone()).await;
            progress.lock().unwrap().resume_drawing();
            continue;
        }
        // Someone else may have decided while an earlier question was open.
        if let Ok(state) = engine.state(&run_id) {
            let waiting = state
                .latest(&ask.node_id)
                .is_some_and(|n| n.status == cairn_events::NodeStatus::WaitingApproval);
            if !waiting {
                continue;
            }
        }
        progress.lock().unwrap().pause();
        let message = ask.message.trim().trim_end_matches('?');
        let question = format!("Approve {}: {message}? [y/N] ", ask.node_id);
        let answer = read_line(question).await;
        let approved = matches!(
            answer.as_ref().map(|l| l.trim().to_ascii_lowercase()),
            Some(l) if l == "y" || l == "yes"
        );
        if let Err(e) = engine
            .decide(&run_id, &ask.node_id, approved, None, by.clone())
            .await
        {
            eprintln!("note: {e}");
        }
        progress.lock().unwrap().resume_drawing();
    }
}

/// Prints `prompt` on stderr and reads a line of stdin (`None` at its end).
async fn read_line(prompt: String) -> Option<String> {
    tokio::task::spawn_blocking(move || {
        use std::io::Write;
        let mut err = std::io::stderr();
        let _ = write!(err, "{prompt}");
        let _ = err.flush();
        let mut line = String::new();
        match std::io::stdin().read_line(&mut line) {
            Ok(0) | Err(_) => None,
            Ok(_) => Some(line),
        }
    })
    .await
    .ok()
    .flatten()
}

/// Asks a node's question on the terminal until an answer is accepted (a
/// refused one says why), someone answers elsewhere, or stdin ends.
async fn answer_inline(
    engine: &Engine,
    run_id: &RunId,
    ask: &Ask,
    request_id: &str,
    schema: Option<&serde_json::Value>,
    by: Option<String>,
) {
    let choices = schema
        .and_then(crate::people::constraints)
        .map(|c| format!(" ({c})"))
        .unwrap_or_default();
    loop {
        let open = engine.state(run_id).ok().is_some_and(|s| {
            s.questions
                .get(request_id)
                .is_some_and(|q| q.answer.is_none())
        });
        if !open {
            return;
        }
        let prompt = format!("{} asks: {}{choices}\n> ", ask.node_id, ask.message.trim());
        let Some(line) = read_line(prompt).await else {
            return;
        };
        let answer = parse_answer(line.trim());
        match engine.answer(run_id, request_id, answer, by.clone()).await {
            Ok(_) => return,
            Err(e) => eprintln!("not taken: {e}"),
        }
    }
}

/// An answer as people type it: JSON when it parses, else the text.
pub fn parse_answer(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|_| serde_json::Value::String(text.to_string()))
}

/// `cairn answer`.
pub async fn answer(g: &Global, a: AnswerArgs) -> anyhow::Result<u8> {
    // A run no process drives is driven here to apply the command (and
    // may end): its trace is exported like any run's.
    let (engine, telemetry) = store::driving_engine(g, false)?;
    let run = store::require_run(engine.journal(), &a.run)?.run_id;
    let by = a.by.or_else(|| std::env::var("USER").ok());
    let (which, answer) = match a.args.as_slice() {
        [answer] => (None, answer),
        [which, answer] => (Some(which.as_str()), answer),
        _ => unreachable!("clap takes one or two"),
    };
    let target = match question_to_answer(&engine, &run, which) {
        Ok(t) => t,
        Err(e) => {
            engine.journal().close();
            return Err(e);
        }
    };
    let rid = target.request_id().unwrap_or_default().to_string();
    let r = engine
        .answer(&target.run, &rid, parse_answer(answer), by)
        .await;
    engine.journal().close();
    telemetry.finish().await;
    r?;
    crate::people::report_answered(&run, &target, a.json)?;
    Ok(crate::EXIT_OK)
}

/// The open question `which` names in `run` or its child runs (its
/// request id or node path), or the only one when `which` is `None`.
fn question_to_answer(
    engine: &Engine,
    run: &RunId,
    which: Option<&str>,
) -> anyhow::Result<crate::people::Open> {
    crate::people::pick_question(run, crate::people::open_gates(engine, run)?, which)
}

/// `cairn approve` and `cairn deny`.
pub async fn decide(g: &Global, a: DecideArgs, approved: bool) -> anyhow::Result<u8> {
    // A run no process drives is driven here to apply the command (and
    // may end): its trace is exported like any run's.
    let (engine, telemetry) = store::driving_engine(g, false)?;
    let run = store::require_run(engine.journal(), &a.run)?.run_id;
    let by = a.by.or_else(|| std::env::var("USER").ok());
    // The run's own approval, else one of its child runs' of that node.
    let target = approval_run(&engine, &run, &a.node).unwrap_or_else(|| run.clone());
    let r = engine.decide(&target, &a.node, approved, a.note, by).await;
    engine.journal().close();
    telemetry.finish().await;
    r?;
    let verb = if approved { "approved" } else { "denied" };
    if a.json {
        let d = cairn_api::Decided {
            run_id: target,
            node_id: a.node,
            approved,
        };
        println!("{}", serde_json::to_string(&d)?);
    } else if target == run {
        println!("{verb} {} of run {run}", a.node);
    } else {
        println!("{verb} {} of child run {target} of run {run}", a.node);
    }
    Ok(crate::EXIT_OK)
}

/// The run of `run`'s tree (itself first, then its child runs) whose node
/// `node` waits for approval; `None` when none does (the decision then
/// goes to `run`, which says why it cannot be taken).
fn approval_run(engine: &Engine, run: &RunId, node: &str) -> Option<RunId> {
    crate::people::open_gates(engine, run)
        .ok()?
        .into_iter()
        .find(|g| g.node == node && g.request_id().is_none())
        .map(|g| g.run)
}

/// `cairn cancel`.
pub async fn cancel(g: &Global, a: CancelArgs) -> anyhow::Result<u8> {
    // A run no process drives is driven here to apply the command (and
    // may end): its trace is exported like any run's.
    let (engine, telemetry) = store::driving_engine(g, false)?;
    let run = store::require_run(engine.journal(), &a.run)?.run_id;
    let by = std::env::var("USER").ok();
    let r = engine.cancel(&run, a.graceful, a.reason, by).await;
    engine.journal().close();
    telemetry.finish().await;
    r?;
    if a.json {
        println!(
            "{}",
            serde_json::json!({ "runId": run, "cancelRequested": true })
        );
        return Ok(crate::EXIT_OK);
    }
    println!(
        "cancel{} requested for run {}",
        if a.graceful { " (graceful)" } else { "" },
        a.run
    );
    Ok(crate::EXIT_OK)
}
