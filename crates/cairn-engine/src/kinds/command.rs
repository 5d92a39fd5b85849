//! `command`: runs an argv without a shell, in the node's sandbox; its
//! stdout becomes the output. Scorers run their commands through
//! [`run_command`] too.

use std::path::PathBuf;

use async_trait::async_trait;
use cairn_tools::cairn_sandbox::ResourceLimits;
use cairn_tools::process::{
    run_process, run_process_with_input, ProcessError, ProcessOutcome, ProcessSpec,
};
use cairn_workflow::{NodeKind, NodeSpec, OutputFormat};
use serde_json::{json, Value};

use crate::node::{EventObserver, NodeCtx, NodeError, NodeRunner};

/// `command`: runs an argv without a shell.
pub(crate) struct CommandNode;

#[async_trait]
impl NodeRunner for CommandNode {
    async fn run(&self, spec: &NodeSpec, ctx: &NodeCtx) -> Result<Value, NodeError> {
        let NodeKind::Command(argv) = &spec.kind else {
            unreachable!("runner_for maps only command nodes here")
        };
        if let Some(recorded) = recorded(ctx)? {
            return recorded;
        }
        let stdout = run_command(spec, argv, ctx, None, EventObserver::new(ctx)).await?;
        parse_output(&stdout, spec.output)
    }
}

/// In a replay whose commands answer from the record: the original's
/// outcome of the same node pass, its output streamed again as it was.
/// `Ok(None)` to run the command: not such a replay, or a live one where the
/// original has no such pass.
fn recorded(ctx: &NodeCtx) -> Result<Option<Result<Value, NodeError>>, NodeError> {
    let Some(r) = ctx.replay.as_ref().filter(|r| r.recorded_tools()) else {
        return Ok(None);
    };
    let key = (ctx.node_id.to_string(), ctx.iteration);
    match r.command(&key) {
        Some((end, pieces)) if matches!(end.status, "finished" | "failed") => {
            for (stream, text) in pieces {
                ctx.output(*stream, text);
            }
            Ok(Some(match (&end.output, &end.error) {
                (_, Some(error)) => {
                    let info: cairn_events::ErrorInfo = serde_json::from_value(error.clone())
                        .unwrap_or_else(|_| cairn_events::ErrorInfo::new("command", "failed"));
                    Err(NodeError {
                        info: Box::new(info),
                        retryable: false,
                        cancelled: false,
                    })
                }
                (output, None) => Ok(output.clone().unwrap_or(Value::Null)),
            }))
        }
        _ => {
            r.diverged(ctx, "runs a command", json!({"kind": "command"}))?;
            Ok(None)
        }
    }
}

/// Runs `argv` (templates, rendered against `ctx`) as node `spec`'s command
/// runs: its sandbox, working folder, environment and output limit, the
/// attempt's cancel token; `input` goes to its stdin. Returns its stdout;
/// a process that did not exit with 0 is an error. Scorers run their
/// commands through here too, with an observer that streams nothing.
pub(crate) async fn run_command(
    spec: &NodeSpec,
    argv: &[String],
    ctx: &NodeCtx,
    input: Option<Vec<u8>>,
    observer: EventObserver<'_>,
) -> Result<String, NodeError> {
    let render = |s: &str| -> Result<String, NodeError> {
        ctx.templates
            .render_string(s, &ctx.vars)
            .map_err(|e| NodeError::fatal("template", e.to_string()))
    };
    let argv = argv
        .iter()
        .map(|a| render(a))
        .collect::<Result<Vec<_>, _>>()?;
    let sandbox = ctx
        .services
        .sandbox_for(&ctx.workflow, None, None, &spec.sandbox)?;
    let confine = sandbox.confinement();
    if confine.is_none() {
        ctx.unconfined_notice();
    }
    let cwd = match &spec.cwd {
        Some(c) => Some(render(c)?),
        None => None,
    };
    // A replay's processes work in its copy of the root, never in the
    // folder the original ran in.
    let base_dir = ctx
        .replay
        .as_ref()
        .and_then(|r| r.dir_for(&ctx.workflow.base_dir))
        .unwrap_or_else(|| ctx.workflow.base_dir.clone());
    let cwd = working_dir(cwd, &base_dir, confine.is_some(), sandbox.root());
    // The workflow's `env` and the node's secrets, then the node's own
    // `env` on top (a later variable of the same name wins).
    let mut env = ctx.process_env.clone();
    for (k, v) in &spec.env {
        env.push((k.clone(), render(v)?));
    }
    // Inherited by every descendant, so a resume can find what a
    // crashed engine left running even before its group was recorded.
    env.extend(ctx.services.process_env(&ctx.run_id));
    let program = argv.first().cloned().unwrap_or_default();
    let max_output = ctx
        .workflow
        .sandbox
        .max_output_bytes
        .map(|b| b as usize)
        .unwrap_or(crate::COMMAND_OUTPUT_LIMIT);
    let proc_spec = ProcessSpec {
        argv,
        cwd,
        env,
        // Only what the node declares, never the engine's secrets.
        clear_env: true,
        // The node's timeout is enforced by the driver, which cancels us.
        timeout: None,
        max_output_bytes: max_output,
        network: sandbox.network(),
        confine,
        proxy: sandbox.network_hosts(),
    };
    let outcome = match input {
        Some(input) => {
            run_process_with_input(proc_spec, input, &observer, ctx.cancel.clone()).await
        }
        None => run_process(proc_spec, &observer, ctx.cancel.clone()).await,
    };
    drop(observer);
    let outcome = outcome.map_err(|e| match e {
        // Retrying cannot make the kernel offer what it lacks; descriptors
        // that ran out come free again.
        ProcessError::Sandbox { .. } if !e.out_of_descriptors() => {
            NodeError::fatal("sandbox", e.to_string())
        }
        e => NodeError::new("spawn", e.to_string()),
    })?;
    finished(outcome, &program, &sandbox.resources())
}

/// Where the command runs: its rendered `cwd` (relative to the workflow's
/// folder), else the workflow's folder, unless a confining sandbox's root
/// is narrower.
fn working_dir(
    cwd: Option<String>,
    base_dir: &std::path::Path,
    confined: bool,
    root: &std::path::Path,
) -> PathBuf {
    match cwd {
        Some(c) => {
            let c = PathBuf::from(c);
            if c.is_absolute() {
                c
            } else {
                base_dir.join(c)
            }
        }
        None if confined && !within(base_dir, root) => root.to_path_buf(),
        None => base_dir.to_path_buf(),
    }
}

/// The command's output, or why it counts as failed: stopped, over a
/// resource limit, or a non-zero exit.
fn finished(
    outcome: ProcessOutcome,
    program: &str,
    resources: &ResourceLimits,
) -> Result<String, NodeError> {
    if outcome.cancelled || outcome.timed_out {
        return Err(NodeError::cancelled(format!("`{program}` was stopped")));
    }
    if let Some(limit) = outcome.resource_limit(resources) {
        return Err(NodeError::new(
            "resource_limit",
            format!("`{program}` was stopped by a resource limit: {limit}"),
        )
        .with_details(json!({
            "exitCode": outcome.exit_code,
            "signal": outcome.signal,
            "stderr": tail(&outcome.stderr, 2000),
            // Named when the tree's control group counted it; null
            // when inferred from the exit and stderr.
            "limit": outcome.tree.and_then(|t| t.hit).map(|l| l.as_str()),
        })));
    }
    if outcome.exit_code != Some(0) {
        let how = match (outcome.exit_code, outcome.signal) {
            (Some(c), _) => format!("exited with code {c}"),
            (None, Some(s)) => format!("was killed by signal {s}"),
            _ => "ended abnormally".to_string(),
        };
        return Err(
            NodeError::new("exit", format!("`{program}` {how}")).with_details(json!({
                "exitCode": outcome.exit_code,
                "signal": outcome.signal,
                "stderr": tail(&outcome.stderr, 2000),
            })),
        );
    }
    Ok(outcome.stdout)
}

/// Whether `path` lies inside `root` (compared canonically when it exists).
fn within(path: &std::path::Path, root: &std::path::Path) -> bool {
    let p = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    p.starts_with(root)
}

fn tail(s: &str, n: usize) -> &str {
    if s.len() <= n {
        return s;
    }
    let mut start = s.len() - n;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

/// Turns stdout into the node's output per its `output` format.
pub(crate) fn parse_output(stdout: &str, format: OutputFormat) -> Result<Value, NodeError> {
    match format {
        OutputFormat::Text => Ok(Value::String(
            stdout.strip_suffix('\n').unwrap_or(stdout).to_string(),
        )),
        OutputFormat::Lines => Ok(Value::Array(
            stdout
                .lines()
                .filter(|l| !l.trim().is_empty())
                .map(|l| Value::String(l.to_string()))
                .collect(),
        )),
        OutputFormat::Json => {
            let v: Value = serde_json::from_str(stdout).map_err(|e| {
                NodeError::fatal(
                    "output",
                    format!("stdout is not valid JSON (output: json): {e}"),
                )
                .with_details(json!({ "stdout": tail(stdout, 2000) }))
            })?;
            // The output is written to the log, which must stay readable.
            cairn_workflow::check_depth(&v).map_err(|e| {
                NodeError::fatal("output", format!("stdout's JSON (output: json) is {e}"))
            })?;
            Ok(v)
        }
    }
}
