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
//!
//! What differs from one CLI to another is a [`Cli`]: its argv, its
//! provider's variables, what a JSON line it prints says ([`Heard`]), which
//! line names its session, and whether a person can take the session over.
//! Each is a module of its own ([`claude_code`], [`codex`]), listed in
//! [`CLIS`]; the loop that runs one (the process, its idle watchdog, a
//! hijack's stop and hand-over, the final message) is here, once.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use cairn_events::{EventKind, OutputStream};
use cairn_store::EventQuery;
use cairn_tools::process::{
    run_process, ProcessError, ProcessObserver, ProcessOutcome, ProcessSpec, Stream,
};
use cairn_workflow::{AgentSpec, ModelConfig};
use serde_json::{json, Value};

use super::{cut, render_text, Spend};
use crate::node::{now_ms, NodeCtx, NodeError};

mod claude_code;
mod codex;

/// Longest silence of a CLI when its model sets none.
const DEFAULT_IDLE: Duration = Duration::from_secs(600);

/// Longest JSON line kept whole in an `AgentEvent`; a longer one is logged
/// as its head.
const MAX_EVENT_LINE: usize = 256 * 1024;

/// Most bytes of a CLI's stdout kept in memory (the lines are streamed
/// to the log as they come; this only bounds what is held at once).
const MAX_STDOUT: usize = 64 * 1024 * 1024;

/// What the CLI is told when a person hands its session back.
const CONTINUE_PROMPT: &str =
    "A person worked in this session meanwhile. Go on with the task from where the conversation stands, and finish it.";

/// What differs from one agent CLI to another.
pub(super) trait Cli: Sync {
    /// Its name as a workflow's `engine:` and the events give it.
    fn name(&self) -> &'static str;

    /// The program run when the node names no `engine_command`.
    fn program(&self) -> &'static str;

    /// The arguments after the program for one call.
    fn args(&self, call: &Call<'_>) -> Result<Vec<String>, NodeError>;

    /// The variables of its provider's key and address, as the CLI reads
    /// them.
    fn provider_vars(&self) -> (&'static str, &'static str);

    /// Variables that keep it from reporting to anyone but its provider.
    fn quiet_env(&self) -> &'static [(&'static str, &'static str)] {
        &[]
    }

    /// The session a JSON line names, if it names one (unchecked).
    fn session_in<'v>(&self, event: &'v Value) -> Option<&'v str>;

    /// What a JSON line says, in order.
    fn hear(&self, event: &Value, heard: &mut Vec<Heard>);

    /// Whether a JSON line ends a whole message or the tools' results: the
    /// boundaries where a hijack may stop the CLI.
    fn is_boundary(&self, _event: &Value) -> bool {
        false
    }

    /// Whether a person can take its session over (`cairn hijack`).
    fn hands_over(&self) -> bool {
        false
    }
}

/// One call of a CLI.
pub(super) struct Call<'a> {
    /// The prompt (data: it goes after `--`).
    pub prompt: &'a str,
    /// The system prompt, when the node has one.
    pub system: Option<&'a str>,
    /// The model the node names.
    pub model: Option<&'a ModelConfig>,
    /// The session to go on with.
    pub session: Option<&'a str>,
}

/// What a CLI's JSON line says.
#[derive(Debug)]
pub(super) enum Heard {
    /// Text to log as the attempt's output.
    Output(OutputStream, String),
    /// The model the CLI runs.
    Model(String),
    /// Its latest message (the node's output if a person ends a hijack).
    Message(String),
    /// Its final message: the node's output.
    Final(String),
    /// It failed: the attempt fails with this.
    Failed(String),
    /// An error it may have recovered from: named if no final message
    /// comes.
    Trouble(String),
    /// One model call's usage, and its cost when the CLI says.
    Usage(cairn_agent::Usage, Option<f64>),
}

/// The CLIs Cairn speaks to.
static CLIS: &[&dyn Cli] = &[&claude_code::ClaudeCode, &codex::Codex];

/// The CLI a workflow's `engine:` names.
fn cli(engine: &str) -> Option<&'static dyn Cli> {
    CLIS.iter().copied().find(|c| c.name() == engine)
}

/// Whether the external CLI `engine` has a session a person can take over.
pub(crate) fn hands_over(engine: &str) -> bool {
    cli(engine).is_some_and(|c| c.hands_over())
}

/// Runs one attempt of an agent node whose `engine` is a CLI.
pub(super) async fn run(spec: &AgentSpec, ctx: &NodeCtx, engine: &str) -> Result<Value, NodeError> {
    let Some(cli) = cli(engine) else {
        return Err(NodeError::fatal(
            "unsupported",
            format!("agent engine `{engine}` is not available in this build of Cairn"),
        ));
    };
    let prompt = render_text(ctx, &spec.prompt)?;
    let system = match &spec.system {
        Some(t) => Some(render_text(ctx, t)?),
        None => None,
    };
    let model = match &spec.model {
        Some(name) => Some(ctx.workflow.models.get(name).ok_or_else(|| {
            NodeError::fatal(
                "config",
                format!("the workflow has no model named `{name}`"),
            )
        })?),
        None => None,
    };
    let mut session = earlier_session(ctx, cli).await?;
    // After a person handed a hijacked session back, the CLI goes on in it.
    let mut handed_back = false;
    let mut handoffs = 0u32;
    loop {
        let call = Call {
            prompt: if handed_back {
                CONTINUE_PROMPT
            } else {
                prompt.as_str()
            },
            system: system.as_deref(),
            model,
            session: session.as_deref(),
        };
        let (proc_spec, idle) = command(cli, spec, ctx, &call)?;
        let program = proc_spec.argv[0].clone();
        let root = proc_spec.cwd.clone();
        let observer = Lines::new(ctx, cli, spec.model.clone());
        let ran = supervise(ctx, proc_spec, &observer, idle).await;
        observer.flush();
        let outcome = ran.outcome.map_err(|e| match e {
            ProcessError::Sandbox { .. } if !e.out_of_descriptors() => {
                NodeError::fatal("sandbox", e.to_string())
            }
            e => NodeError::new("spawn", format!("{} CLI: {e}", cli.name())),
        })?;
        if ran.idle_hit && !ctx.cancel.is_cancelled() {
            return Err(NodeError::new(
                "idle_timeout",
                format!(
                    "`{program}` printed nothing for {}s; it was stopped with everything it started",
                    idle.as_secs()
                ),
            ));
        }
        if ran.hijack_hit && !ctx.cancel.is_cancelled() {
            let said = observer.take();
            session = said.session.or(session);
            let Some(sess) = session.clone() else {
                return Err(NodeError::fatal(
                    "hijack",
                    format!("`{program}` named no session to hand over"),
                ));
            };
            let resumed = hand_over(ctx, cli, &program, &sess, &root, handoffs).await?;
            handoffs += 1;
            if !resumed {
                return Ok(Value::String(said.last_text.unwrap_or_default()));
            }
            handed_back = true;
            continue;
        }
        return finish(cli, spec, &program, outcome, &observer);
    }
}

/// The process of one call: the CLI's argv, the provider's variables and
/// no others of the engine's environment, the sandbox; and how long it may
/// stay silent.
fn command(
    cli: &dyn Cli,
    spec: &AgentSpec,
    ctx: &NodeCtx,
    call: &Call<'_>,
) -> Result<(ProcessSpec, Duration), NodeError> {
    let mut argv: Vec<String> = spec
        .engine_command
        .clone()
        .unwrap_or_else(|| vec![cli.program().into()]);
    argv.extend(cli.args(call)?);
    let mut env: Vec<(String, String)> = ctx.services.process_env(&ctx.run_id).to_vec();
    // The provider's key and address, from the model the node names (or
    // the CLI's usual variable): only these reach the CLI of the engine's
    // environment.
    let (key_var, url_var) = cli.provider_vars();
    let secret = call
        .model
        .and_then(|m| m.api_key_secret.as_deref())
        .and_then(|s| ctx.secrets.get(s));
    if let Some(v) = secret {
        env.push((key_var.into(), v.to_string()));
    } else {
        let from = call
            .model
            .and_then(|m| m.api_key_env.clone())
            .unwrap_or_else(|| key_var.to_string());
        if let Ok(v) = std::env::var(&from) {
            env.push((key_var.into(), v));
        }
    }
    // The workflow's `env` and the secrets the node names.
    env.extend(ctx.process_env.iter().cloned());
    if let Some(url) = call.model.and_then(|m| m.base_url.clone()) {
        env.push((url_var.into(), url));
    }
    env.extend(
        cli.quiet_env()
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string())),
    );
    let idle = call
        .model
        .and_then(|m| m.idle_timeout)
        .unwrap_or(DEFAULT_IDLE);
    let sandbox = ctx
        .services
        .sandbox_for(&ctx.workflow, None, None, &Default::default())?;
    let confine = sandbox.confinement();
    if confine.is_none() {
        ctx.unconfined_notice();
    }
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
    Ok((proc_spec, idle))
}

/// How a CLI's process went.
struct Ran {
    outcome: Result<ProcessOutcome, ProcessError>,
    /// It printed nothing for its idle timeout, and was stopped.
    idle_hit: bool,
    /// A hijack stopped it at a boundary.
    hijack_hit: bool,
}

/// Runs the CLI's process, stopping it when it stays silent too long or
/// when a person takes it over (at the first boundary, a whole message or
/// the tools' results, after they asked).
async fn supervise(
    ctx: &NodeCtx,
    proc_spec: ProcessSpec,
    observer: &Lines<'_>,
    idle: Duration,
) -> Ran {
    let stop = ctx.cancel.child_token();
    let idle_hit = AtomicBool::new(false);
    let hijack_hit = AtomicBool::new(false);
    let watchdog = async {
        loop {
            tokio::time::sleep(Duration::from_millis(250).min(idle)).await;
            let quiet = now_ms().saturating_sub(observer.last_line.load(Ordering::Relaxed) as i64);
            if quiet >= idle.as_millis() as i64 {
                idle_hit.store(true, Ordering::SeqCst);
                stop.cancel();
                return;
            }
        }
    };
    tokio::pin!(watchdog);
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
    let proc = run_process(proc_spec, observer, stop.clone());
    tokio::pin!(proc);
    let outcome = loop {
        tokio::select! {
            r = &mut proc => break r,
            _ = &mut watchdog, if !idle_hit.load(Ordering::SeqCst) => {}
            _ = &mut hijack, if !hijack_hit.load(Ordering::SeqCst) => {}
        }
    };
    Ran {
        outcome,
        idle_hit: idle_hit.load(Ordering::SeqCst),
        hijack_hit: hijack_hit.load(Ordering::SeqCst),
    }
}

/// The node's output from how the CLI ended: its final message (checked
/// against the node's `output_schema`), or why there is none.
fn finish(
    cli: &dyn Cli,
    spec: &AgentSpec,
    program: &str,
    outcome: ProcessOutcome,
    observer: &Lines<'_>,
) -> Result<Value, NodeError> {
    if outcome.cancelled || outcome.timed_out {
        return Err(NodeError::cancelled(format!("`{program}` was stopped")));
    }
    let state = observer.take();
    if let Some(err) = state.error {
        return Err(NodeError::new("engine", format!("{}: {err}", cli.name())));
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
    let Some(schema) = &spec.output_schema else {
        return Ok(Value::String(text));
    };
    let v: Value = serde_json::from_str(text.trim())
        .map_err(|e| NodeError::new("schema", format!("the final message is not JSON: {e}")))?;
    if let Some(problem) = crate::schema_problem(schema, &v) {
        return Err(NodeError::new(
            "schema",
            format!("the final message breaks output_schema: {problem}"),
        ));
    }
    Ok(v)
}

/// A hijacked CLI stopped: its session is the person's (`cairn hijack`
/// runs `<cli> --resume <session>` in the root for them, from the
/// question's `x-cairn-handoff`), until they answer `/back` (true) or
/// `/done` (false). `RunHijacked` says which.
async fn hand_over(
    ctx: &NodeCtx,
    cli: &dyn Cli,
    program: &str,
    session: &str,
    root: &std::path::Path,
    n: u32,
) -> Result<bool, NodeError> {
    if !cli.hands_over() {
        return Err(NodeError::fatal(
            "hijack",
            format!("{} sessions cannot be handed to a person", cli.name()),
        ));
    }
    let id = crate::node::hijack_request_id(ctx.node_id.as_str(), ctx.iteration, ctx.attempt, n, 0);
    let prompt = format!(
        "Agent `{}` ({}) stopped, and its session is yours: run `{program} --resume {session}` \
         in the sandbox root (cairn hijack does), then answer /back to hand it back, or /done \
         to end the node with the agent's last answer.",
        ctx.node_id,
        cli.name()
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
        engine: cli.name().into(),
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
async fn earlier_session(ctx: &NodeCtx, cli: &dyn Cli) -> Result<Option<String>, NodeError> {
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
                types: vec![
                    cairn_events::EventType::NodeFailed,
                    cairn_events::EventType::AgentEvent,
                ],
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
                if let Some(s) = session_of(cli, &event) {
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

/// The session a JSON line of `cli` names, when it is one Cairn may pass
/// back on a command line: an id, not an option.
fn session_of(cli: &dyn Cli, event: &Value) -> Option<String> {
    let s = cli.session_in(event)?;
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
    /// The CLI's session.
    session: Option<String>,
    /// The text of its latest message.
    last_text: Option<String>,
}

/// Turns the CLI's stdout into events, a line at a time.
struct Lines<'a> {
    inner: crate::node::EventObserver<'a>,
    cli: &'a dyn Cli,
    model: Option<String>,
    said: Mutex<Said>,
    last_line: AtomicU64,
    /// Whole messages and tool results seen: the boundaries where a hijack
    /// may stop the CLI.
    boundaries: AtomicU64,
}

impl<'a> Lines<'a> {
    fn new(ctx: &'a NodeCtx, cli: &'a dyn Cli, model: Option<String>) -> Self {
        Lines {
            inner: crate::node::EventObserver::new(ctx),
            cli,
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
            engine: self.cli.name().into(),
            event: logged,
        });
        if let Some(s) = session_of(self.cli, &event) {
            self.lock().session = Some(s);
        }
        let mut heard = Vec::new();
        self.cli.hear(&event, &mut heard);
        for h in heard {
            self.heard(h);
        }
        if self.cli.is_boundary(&event) {
            self.boundaries.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Carries out what a line said.
    fn heard(&self, h: Heard) {
        match h {
            Heard::Output(stream, text) => self.ctx().output(stream, &text),
            Heard::Model(m) => self.lock().model = Some(m),
            Heard::Message(t) => self.lock().last_text = Some(t),
            Heard::Final(t) => self.lock().final_text = Some(t),
            Heard::Failed(e) => self.lock().error = Some(e),
            Heard::Trouble(e) => self.lock().last_error = Some(e),
            Heard::Usage(usage, cost) => self.usage(usage, cost),
        }
    }

    fn usage(&self, usage: cairn_agent::Usage, cost: Option<f64>) {
        let ctx = self.ctx();
        let model = self
            .lock()
            .model
            .clone()
            .or_else(|| self.model.clone())
            .unwrap_or_else(|| self.cli.name().to_string());
        Spend::add(&ctx.spend, &usage, cost);
        ctx.emit(EventKind::TokenUsageReported {
            provider: self.cli.name().into(),
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

#[cfg(test)]
mod testing {
    //! What the engines' tests share.

    use cairn_workflow::ModelConfig;

    /// A model `model` of an OpenAI-compatible provider at `base_url`.
    pub(super) fn model(model: &str, base_url: Option<&str>) -> ModelConfig {
        let yaml = format!(
            "name: t\nmodels:\n  m: {{ provider: openai, model: {model:?} }}\nnodes:\n  - id: a\n    value: 1\n"
        );
        let wf = cairn_workflow::parse(&yaml, std::path::Path::new("t.yaml")).expect("valid");
        let mut m = wf.models["m"].clone();
        m.base_url = base_url.map(str::to_string);
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_cli_is_found_by_its_name_and_only_claude_code_hands_over() {
        assert_eq!(cli("claude-code").map(|c| c.name()), Some("claude-code"));
        assert_eq!(cli("codex").map(|c| c.name()), Some("codex"));
        assert!(cli("aider").is_none());
        assert!(hands_over("claude-code"));
        assert!(!hands_over("codex") && !hands_over("aider"));
        // Every CLI a workflow may name is one Cairn speaks to.
        for name in cairn_workflow::AGENT_ENGINES {
            assert!(cli(name).is_some(), "{name}");
        }
    }

    #[test]
    fn a_session_must_be_an_id_not_an_option() {
        let claude = cli("claude-code").unwrap();
        let named = |id: &str| json!({"type": "system", "session_id": id});
        assert_eq!(session_of(claude, &named("a-1_b")), Some("a-1_b".into()));
        assert_eq!(session_of(claude, &named("--help")), None);
        assert_eq!(session_of(claude, &named("a b")), None);
        assert_eq!(session_of(claude, &named("")), None);
        assert_eq!(session_of(claude, &json!({"type": "assistant"})), None);
    }
}
