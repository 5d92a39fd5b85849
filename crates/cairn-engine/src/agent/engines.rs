//! External agent CLIs as an agent node's engine: `claude-code` runs
//! `claude -p --output-format stream-json --verbose`, `codex` runs
//! `codex exec --json`, in the sandbox root with the node's prompt. The
//! prompt is data a node's inputs may have written: it goes after `--`, so
//! no part of it becomes an option or a subcommand of the CLI, and values
//! built from text are joined to their option (`--model=...`).
//!
//! Each JSON line the CLI prints is logged as `AgentEvent` (the raw event);
//! its text as `NodeOutput`; its usage as `TokenUsageReported`, from the
//! final `result` line (claude) or each `turn.completed` (codex), never from
//! per-message snapshots, which would count tokens twice; the final message
//! is the node's output. No line for the idle timeout, the node's timeout
//! or a cancel kill the CLI and everything it started (its process group,
//! its sandbox). An attempt that takes up one a crash interrupted passes
//! the session the log names (`--resume`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use cairn_events::{EventKind, OutputStream};
use cairn_store::EventQuery;
use cairn_tools::process::{run_process, ProcessObserver, ProcessSpec, Stream};
use cairn_workflow::AgentSpec;
use serde_json::{json, Value};

use super::{cut, render_text, Spend};
use crate::node::{now_ms, NodeCtx, NodeError};

/// Longest silence of a CLI when its model sets none.
const DEFAULT_IDLE: Duration = Duration::from_secs(600);

/// Longest JSON line kept whole in an `AgentEvent`; a longer one is logged
/// as its head.
const MAX_EVENT_LINE: usize = 256 * 1024;

/// Most bytes of a CLI's stdout kept in memory (the lines are streamed
/// to the log as they come; this only bounds what is held at once).
const MAX_STDOUT: usize = 64 * 1024 * 1024;

/// The two CLIs Cairn speaks to.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Claude,
    Codex,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Claude => "claude-code",
            Kind::Codex => "codex",
        }
    }
}

/// Runs one attempt of an agent node whose `engine` is a CLI.
pub(super) async fn run(spec: &AgentSpec, ctx: &NodeCtx, engine: &str) -> Result<Value, NodeError> {
    let kind = match engine {
        "claude-code" => Kind::Claude,
        "codex" => Kind::Codex,
        other => {
            return Err(NodeError::fatal(
                "unsupported",
                format!("agent engine `{other}` is not available in this build of Cairn"),
            ))
        }
    };
    let prompt = render_text(ctx, &spec.prompt)?;
    let system = match &spec.system {
        Some(t) => Some(render_text(ctx, t)?),
        None => None,
    };
    let model_def = match &spec.model {
        Some(name) => Some(ctx.workflow.models.get(name).ok_or_else(|| {
            NodeError::fatal(
                "config",
                format!("the workflow has no model named `{name}`"),
            )
        })?),
        None => None,
    };
    let mut session = earlier_session(ctx, kind).await?;
    // After a person handed a hijacked session back, the CLI goes on in it.
    let mut handed_back = false;
    let mut handoffs = 0u32;
    loop {
        let prompt = if handed_back {
            CONTINUE_PROMPT.to_string()
        } else {
            prompt.clone()
        };
        let mut argv: Vec<String> = spec.engine_command.clone().unwrap_or_else(|| {
            vec![match kind {
                Kind::Claude => "claude".into(),
                Kind::Codex => "codex".into(),
            }]
        });
        let mut env: Vec<(String, String)> = ctx.services.process_env(&ctx.run_id).to_vec();
        match kind {
            Kind::Claude => {
                argv.extend(
                    ["-p", "--output-format", "stream-json", "--verbose"].map(String::from),
                );
                // A value joined to its option with `=` is that option's
                // value whatever it starts with.
                if let Some(m) = model_def {
                    argv.push(format!("--model={}", m.model));
                }
                if let Some(s) = &system {
                    argv.push(format!("--append-system-prompt={s}"));
                }
                if let Some(s) = &session {
                    argv.extend(["--resume".into(), s.clone()]);
                }
                // The prompt is data: after `--`, no part of it is an option.
                argv.extend(["--".into(), prompt.clone()]);
            }
            Kind::Codex => {
                argv.push("exec".into());
                if let Some(s) = &session {
                    argv.extend(["resume".into(), s.clone()]);
                }
                // The sandbox root need not be a git repository.
                argv.extend(["--json".into(), "--skip-git-repo-check".into()]);
                if let Some(m) = model_def {
                    argv.push(format!("--model={}", m.model));
                    // Codex reads its provider's address from its config, not
                    // from the environment: a provider of Cairn's, given inline.
                    if let Some(url) = &m.base_url {
                        if url.chars().any(|c| c == '"' || c == '\\' || c.is_control()) {
                            return Err(NodeError::fatal(
                            "config",
                            format!("model `{}`: base_url holds a quote, a backslash or a control character", m.model),
                        ));
                        }
                        argv.extend([
                        "-c".into(),
                        format!(
                            "model_providers.cairn={{name=\"cairn\",base_url=\"{url}\",env_key=\"OPENAI_API_KEY\",wire_api=\"responses\"}}"
                        ),
                        "-c".into(),
                        "model_provider=cairn".into(),
                    ]);
                    }
                }
                // After `--`, the prompt is neither an option nor a
                // subcommand (`resume`, `review`).
                argv.push("--".into());
                argv.push(match &system {
                    Some(s) => format!("{s}\n\n{prompt}"),
                    None => prompt.clone(),
                });
            }
        }
        // The provider's key and address, from the model the node names (or
        // the CLI's usual variable): only these reach the CLI of the engine's
        // environment.
        let (key_var, url_var) = match kind {
            Kind::Claude => ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"),
            Kind::Codex => ("OPENAI_API_KEY", "OPENAI_BASE_URL"),
        };
        let from = model_def
            .and_then(|m| m.api_key_env.clone())
            .unwrap_or_else(|| key_var.to_string());
        if let Ok(v) = std::env::var(&from) {
            env.push((key_var.into(), v));
        }
        if let Some(url) = model_def.and_then(|m| m.base_url.clone()) {
            env.push((url_var.into(), url));
        }
        // A CLI in a workflow reports to nobody but its provider: no telemetry,
        // error reports or update checks from inside the sandbox.
        if kind == Kind::Claude {
            env.push((
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC".into(),
                "1".into(),
            ));
            env.push(("DISABLE_TELEMETRY".into(), "1".into()));
        }
        let idle = model_def
            .and_then(|m| m.idle_timeout)
            .unwrap_or(DEFAULT_IDLE);

        let sandbox = ctx
            .services
            .sandbox_for(&ctx.workflow, None, None, &Default::default())?;
        let confine = sandbox.confinement();
        if confine.is_none() {
            ctx.unconfined_notice();
        }
        let program = argv[0].clone();
        let proc_spec = ProcessSpec {
            argv,
            cwd: sandbox.root().to_path_buf(),
            env,
            clear_env: true,
            timeout: None,
            max_output_bytes: MAX_STDOUT,
            network: sandbox.network(),
            confine,
            proxy: sandbox.network_hosts(),
        };
        let observer = Lines::new(ctx, kind, spec.model.clone());
        let stop = ctx.cancel.child_token();
        let idle_hit = AtomicBool::new(false);
        let hijack_hit = AtomicBool::new(false);
        let outcome = {
            let watchdog = async {
                loop {
                    tokio::time::sleep(Duration::from_millis(250).min(idle)).await;
                    let quiet =
                        now_ms().saturating_sub(observer.last_line.load(Ordering::Relaxed) as i64);
                    if quiet >= idle.as_millis() as i64 {
                        idle_hit.store(true, Ordering::SeqCst);
                        stop.cancel();
                        return;
                    }
                }
            };
            tokio::pin!(watchdog);
            // A hijack stops the CLI at the first boundary (a whole message,
            // or the tools' results) after it was asked.
            let hijack = async {
                let Some(flag) = &ctx.hijack else {
                    return std::future::pending::<()>().await;
                };
                let mut asked_at: Option<u64> = None;
                loop {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    if !flag.load(Ordering::SeqCst) {
                        asked_at = None;
                        continue;
                    }
                    let now = observer.boundaries.load(Ordering::SeqCst);
                    match asked_at {
                        None => asked_at = Some(now),
                        Some(at) if now > at => {
                            hijack_hit.store(true, Ordering::SeqCst);
                            stop.cancel();
                            return;
                        }
                        Some(_) => {}
                    }
                }
            };
            tokio::pin!(hijack);
            let proc = run_process(proc_spec, &observer, stop.clone());
            tokio::pin!(proc);
            loop {
                tokio::select! {
                    r = &mut proc => break r,
                    _ = &mut watchdog, if !idle_hit.load(Ordering::SeqCst) => {}
                    _ = &mut hijack, if !hijack_hit.load(Ordering::SeqCst) => {}
                }
            }
        };
        observer.flush();
        let outcome = outcome.map_err(|e| match e {
            cairn_tools::process::ProcessError::Sandbox { .. } if !e.out_of_descriptors() => {
                NodeError::fatal("sandbox", e.to_string())
            }
            e => NodeError::new("spawn", format!("{} CLI: {e}", kind.name())),
        })?;
        if idle_hit.load(Ordering::SeqCst) && !ctx.cancel.is_cancelled() {
            return Err(NodeError::new(
                "idle_timeout",
                format!(
                "`{program}` printed nothing for {}s; it was stopped with everything it started",
                idle.as_secs()
            ),
            ));
        }
        if hijack_hit.load(Ordering::SeqCst) && !ctx.cancel.is_cancelled() {
            let said = observer.take();
            session = said.session.or(session);
            let Some(sess) = session.clone() else {
                return Err(NodeError::fatal(
                    "hijack",
                    format!("`{program}` named no session to hand over"),
                ));
            };
            let resumed = hand_over(ctx, kind, &program, &sess, sandbox.root(), handoffs).await?;
            handoffs += 1;
            if !resumed {
                return Ok(Value::String(said.last_text.unwrap_or_default()));
            }
            handed_back = true;
            continue;
        }
        if outcome.cancelled || outcome.timed_out {
            return Err(NodeError::cancelled(format!("`{program}` was stopped")));
        }
        let state = observer.take();
        if let Some(err) = state.error {
            return Err(NodeError::new("engine", format!("{}: {err}", kind.name())));
        }
        if outcome.exit_code != Some(0) {
            let how = match (outcome.exit_code, outcome.signal) {
                (Some(c), _) => format!("exited with code {c}"),
                (None, Some(s)) => format!("was killed by signal {s}"),
                _ => "ended abnormally".to_string(),
            };
            return Err(NodeError::new("engine", format!("`{program}` {how}"))
                .with_details(json!({"stderr": cut(&outcome.stderr, 2000)})));
        }
        let Some(text) = state.final_text else {
            let why = state
                .last_error
                .map(|e| format!(" (its last error: {e})"))
                .unwrap_or_default();
            return Err(NodeError::new(
                "engine",
                format!("`{program}` ended without a final message{why}"),
            ));
        };
        return match &spec.output_schema {
            None => Ok(Value::String(text)),
            Some(schema) => {
                let v: Value = serde_json::from_str(text.trim()).map_err(|e| {
                    NodeError::new("schema", format!("the final message is not JSON: {e}"))
                })?;
                if let Some(problem) = crate::schema_problem(schema, &v) {
                    return Err(NodeError::new(
                        "schema",
                        format!("the final message breaks output_schema: {problem}"),
                    ));
                }
                Ok(v)
            }
        };
    }
}

/// What the CLI is told when a person hands its session back.
const CONTINUE_PROMPT: &str =
    "A person worked in this session meanwhile. Go on with the task from where the conversation stands, and finish it.";

/// A hijacked CLI stopped: its session is the person's (`cairn hijack`
/// runs `<cli> --resume <session>` in the root for them, from the
/// question's `x-cairn-handoff`), until they answer `/back` (true) or
/// `/done` (false). `RunHijacked` says which.
async fn hand_over(
    ctx: &NodeCtx,
    kind: Kind,
    program: &str,
    session: &str,
    root: &std::path::Path,
    n: u32,
) -> Result<bool, NodeError> {
    if kind != Kind::Claude {
        return Err(NodeError::fatal(
            "hijack",
            format!("{} sessions cannot be handed to a person", kind.name()),
        ));
    }
    let id = crate::node::hijack_request_id(ctx.node_id.as_str(), ctx.iteration, ctx.attempt, n, 0);
    let prompt = format!(
        "Agent `{}` ({}) stopped, and its session is yours: run `{program} --resume {session}` \
         in the sandbox root (cairn hijack does), then answer /back to hand it back, or /done \
         to end the node with the agent's last answer.",
        ctx.node_id,
        kind.name()
    );
    // Only what names the session: keys stay in the person's environment.
    let schema = json!({
        "type": "string",
        "enum": ["/back", "/done"],
        "x-cairn-handoff": {
            "argv": [program, "--resume", session],
            "cwd": root.display().to_string(),
        }
    });
    let answer = ctx.ask_person_as(id, prompt, Some(schema)).await?;
    let resumed = answer.as_str() != Some("/done");
    ctx.emit_durable(EventKind::RunHijacked {
        engine: kind.name().into(),
        mode: "interactive".into(),
        resumed,
    })
    .await?;
    if let Some(f) = &ctx.hijack {
        f.store(false, Ordering::SeqCst);
    }
    Ok(resumed)
}

/// The session an interrupted attempt of this conversation left, from its
/// `AgentEvent`s (claude's `system`/`init`, codex's `thread.started`).
async fn earlier_session(ctx: &NodeCtx, kind: Kind) -> Result<Option<String>, NodeError> {
    if ctx.attempt <= 1 {
        return Ok(None);
    }
    let backend = ctx.services.journal.backend().clone();
    let (run, node) = (ctx.run_id.clone(), ctx.node_id.to_string());
    let events = tokio::task::spawn_blocking(move || {
        backend.read_events(
            &run,
            &EventQuery {
                node: Some(node),
                types: vec!["NodeFailed".into(), "AgentEvent".into()],
                ..EventQuery::default()
            },
        )
    })
    .await
    .map_err(|e| NodeError::new("internal", e.to_string()))??;
    let mut failed = std::collections::HashMap::new();
    let mut sessions: Vec<(u32, String)> = Vec::new();
    for stored in &events {
        let Ok(ev) = stored.decode() else { continue };
        if ev.scope.iteration != Some(ctx.iteration) {
            continue;
        }
        let attempt = ev.scope.attempt.unwrap_or(0);
        match ev.kind {
            EventKind::NodeFailed { error, .. } => {
                failed.insert(attempt, error.kind);
            }
            EventKind::AgentEvent { event, .. } => {
                if let Some(s) = session_of(kind, &event) {
                    sessions.push((attempt, s));
                }
            }
            _ => {}
        }
    }
    let origin = crate::child::origin_of(&failed, ctx.attempt);
    Ok(sessions
        .into_iter()
        .filter(|(a, _)| *a >= origin && *a < ctx.attempt)
        .map(|(_, s)| s)
        .next_back())
}

fn session_of(kind: Kind, event: &Value) -> Option<String> {
    let s = match kind {
        Kind::Claude if event["type"] == "system" => event["session_id"].as_str(),
        Kind::Codex if event["type"] == "thread.started" => event["thread_id"].as_str(),
        _ => None,
    }?;
    // It goes on a command line: an id, not an option.
    let ok = !s.is_empty()
        && s.len() <= 200
        && !s.starts_with('-')
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    ok.then(|| s.to_string())
}

/// What the lines said so far.
#[derive(Default)]
struct Said {
    partial: String,
    final_text: Option<String>,
    error: Option<String>,
    /// The last error the CLI reported on the way (it may have recovered).
    last_error: Option<String>,
    model: Option<String>,
    /// The CLI's session (claude's `system` line).
    session: Option<String>,
    /// The text of its latest message.
    last_text: Option<String>,
}

/// Turns the CLI's stdout into events, a line at a time.
struct Lines<'a> {
    inner: crate::kinds::EventObserver<'a>,
    kind: Kind,
    model: Option<String>,
    said: Mutex<Said>,
    last_line: AtomicU64,
    /// Whole messages and tool results seen: the boundaries where a hijack
    /// may stop the CLI.
    boundaries: AtomicU64,
}

impl<'a> Lines<'a> {
    fn new(ctx: &'a NodeCtx, kind: Kind, model: Option<String>) -> Self {
        Lines {
            inner: crate::kinds::EventObserver::new(ctx),
            kind,
            model,
            said: Mutex::new(Said::default()),
            last_line: AtomicU64::new(now_ms() as u64),
            boundaries: AtomicU64::new(0),
        }
    }

    fn ctx(&self) -> &NodeCtx {
        self.inner.ctx
    }

    /// Handles what is left of a line without its newline (the CLI ended).
    fn flush(&self) {
        let rest = std::mem::take(&mut self.lock().partial);
        if !rest.trim().is_empty() {
            self.line(&rest);
        }
    }

    fn take(&self) -> Said {
        std::mem::take(&mut *self.lock())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Said> {
        self.said.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn line(&self, line: &str) {
        let line = line.trim();
        if line.is_empty() {
            return;
        }
        let ctx = self.ctx();
        let event: Value = match serde_json::from_str(line) {
            Ok(v) => v,
            Err(_) => {
                // Not an event: the CLI's own words.
                ctx.output(OutputStream::Stdout, &format!("{}\n", cut(line, 4096)));
                return;
            }
        };
        let logged = if line.len() > MAX_EVENT_LINE {
            json!({"truncated": true, "bytes": line.len(), "type": event["type"].clone()})
        } else {
            event.clone()
        };
        ctx.emit(EventKind::AgentEvent {
            engine: self.kind.name().into(),
            event: logged,
        });
        if let Some(s) = session_of(self.kind, &event) {
            self.lock().session = Some(s);
        }
        match self.kind {
            Kind::Claude => self.claude(&event),
            Kind::Codex => self.codex(&event),
        }
        if matches!(event["type"].as_str(), Some("assistant" | "user")) {
            self.boundaries.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn claude(&self, ev: &Value) {
        let ctx = self.ctx();
        match ev["type"].as_str() {
            Some("system") => {
                if let Some(m) = ev["model"].as_str() {
                    self.lock().model = Some(m.to_string());
                }
            }
            Some("assistant") => {
                for block in ev["message"]["content"].as_array().into_iter().flatten() {
                    match block["type"].as_str() {
                        Some("text") => {
                            if let Some(t) = block["text"].as_str() {
                                ctx.output(OutputStream::Text, t);
                                self.lock().last_text = Some(t.to_string());
                            }
                        }
                        Some("thinking") => {
                            if let Some(t) = block["thinking"].as_str() {
                                ctx.output(OutputStream::Reasoning, t);
                            }
                        }
                        _ => {}
                    }
                }
            }
            Some("result") => {
                let u = &ev["usage"];
                self.usage(
                    cairn_agent::Usage {
                        input_tokens: u["input_tokens"].as_u64().unwrap_or(0),
                        output_tokens: u["output_tokens"].as_u64().unwrap_or(0),
                        cache_read_tokens: u["cache_read_input_tokens"].as_u64(),
                        cache_write_tokens: u["cache_creation_input_tokens"].as_u64(),
                        reasoning_tokens: None,
                    },
                    ev["total_cost_usd"].as_f64(),
                );
                let mut s = self.lock();
                if ev["is_error"].as_bool() == Some(true)
                    || ev["subtype"].as_str().is_some_and(|t| t != "success")
                {
                    s.error = Some(format!(
                        "the run ended with `{}`: {}",
                        ev["subtype"].as_str().unwrap_or("error"),
                        cut(ev["result"].as_str().unwrap_or(""), 2000)
                    ));
                } else if let Some(r) = ev["result"].as_str() {
                    s.final_text = Some(r.to_string());
                }
            }
            _ => {}
        }
    }

    fn codex(&self, ev: &Value) {
        let ctx = self.ctx();
        match ev["type"].as_str() {
            Some("item.completed") => {
                let item = &ev["item"];
                match item["type"].as_str() {
                    Some("agent_message") => {
                        if let Some(t) = item["text"].as_str() {
                            ctx.output(OutputStream::Text, &format!("{t}\n"));
                            self.lock().final_text = Some(t.to_string());
                        }
                    }
                    Some("reasoning") => {
                        if let Some(t) = item["text"].as_str() {
                            ctx.output(OutputStream::Reasoning, &format!("{t}\n"));
                        }
                    }
                    _ => {}
                }
            }
            Some("turn.completed") => {
                let u = &ev["usage"];
                self.usage(
                    cairn_agent::Usage {
                        input_tokens: u["input_tokens"].as_u64().unwrap_or(0),
                        output_tokens: u["output_tokens"].as_u64().unwrap_or(0),
                        cache_read_tokens: u["cached_input_tokens"].as_u64(),
                        cache_write_tokens: u["cache_write_input_tokens"].as_u64(),
                        reasoning_tokens: u["reasoning_output_tokens"].as_u64(),
                    },
                    None,
                );
            }
            // A turn that failed is the attempt's failure; other errors
            // (reconnects, warnings) only explain a CLI that ends
            // without a final message.
            Some("turn.failed") => {
                let msg = ev["error"]["message"]
                    .as_str()
                    .unwrap_or("the CLI reported a failed turn");
                self.lock().error = Some(cut(msg, 2000));
            }
            Some("error") => {
                if let Some(msg) = ev["message"].as_str() {
                    self.lock().last_error = Some(cut(msg, 2000));
                }
            }
            _ => {}
        }
    }

    fn usage(&self, usage: cairn_agent::Usage, cost: Option<f64>) {
        let ctx = self.ctx();
        let model = self
            .lock()
            .model
            .clone()
            .or_else(|| self.model.clone())
            .unwrap_or_else(|| self.kind.name().to_string());
        Spend::add(&ctx.spend, &usage, cost);
        ctx.emit(EventKind::TokenUsageReported {
            provider: self.kind.name().into(),
            model,
            input_tokens: usage.input_tokens,
            output_tokens: usage.output_tokens,
            cache_read_tokens: usage.cache_read_tokens,
            cache_write_tokens: usage.cache_write_tokens,
            reasoning_tokens: usage.reasoning_tokens,
            cost_usd: cost,
        });
    }
}

impl ProcessObserver for Lines<'_> {
    fn spawned(&self, pid: u32) {
        self.inner.spawned(pid);
    }

    fn output(&self, stream: Stream, text: &str) {
        match stream {
            Stream::Stdout => {
                self.last_line.store(now_ms() as u64, Ordering::Relaxed);
                let lines: Vec<String> = {
                    let mut s = self.lock();
                    s.partial.push_str(text);
                    let mut out = Vec::new();
                    while let Some(i) = s.partial.find('\n') {
                        let line: String = s.partial.drain(..=i).collect();
                        out.push(line);
                    }
                    // A line with no end in sight is not held for ever.
                    if s.partial.len() > MAX_EVENT_LINE * 4 {
                        let line = std::mem::take(&mut s.partial);
                        out.push(line);
                    }
                    out
                };
                for l in lines {
                    self.line(&l);
                }
            }
            Stream::Stderr => self.ctx().output(OutputStream::Stderr, text),
        }
    }

    fn network_refused(&self, target: &str, reason: &str) {
        self.inner.network_refused(target, reason);
    }

    fn network_allowed(&self, target: &str, reason: &str) {
        self.inner.network_allowed(target, reason);
    }

    fn limits_weakened(&self, why: &str) {
        self.inner.limits_weakened(why);
    }
}
