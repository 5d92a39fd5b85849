//! `bash`: runs an executable with an argv, no shell unless the argv names one.

use std::time::Duration;

use cairn_events::NetworkAction;
use serde_json::{json, Value};

use crate::error::ToolError;
use crate::process::{run_process, NetworkPolicy, ProcessSpec};
use crate::sandbox::Open;
use crate::tool::{type_name, Args, AsProcessObserver, Tool, ToolContext, ToolSpec};

/// `bash {argv, cwd?, env?, timeout?}`. Returns
/// `{exitCode, stdout, stderr, truncated}`; a non-zero exit is
/// [`ToolError::Exit`] with the code and the output.
#[derive(Debug, Default, Clone, Copy)]
pub struct BashTool;

#[async_trait::async_trait]
impl Tool for BashTool {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "bash".into(),
            side_effect: true,
            idempotent: false,
            description: "Run a program with an argv (no shell unless argv[0] is one) inside the sandbox root, network shut unless the workflow allows it.".into(),
            args_schema: json!({
                "type": "object",
                "required": ["argv"],
                "additionalProperties": false,
                "properties": {
                    "argv": {"type": "array", "items": {"type": "string"}, "minItems": 1},
                    "cwd": {"type": "string"},
                    "env": {"type": "object", "additionalProperties": {"type": "string"}},
                    "timeout": {"type": ["string", "number"], "description": "500ms, 30s, 10m, 1h or seconds; capped by the sandbox"}
                }
            }),
        }
    }

    async fn call(&self, args: Value, ctx: &ToolContext<'_>) -> Result<Value, ToolError> {
        let a = Args::new("bash", &args, &["argv", "cwd", "env", "timeout"])?;
        let argv = argv_of(&a)?;
        let mut env = env_of(&a, ctx.sandbox.env())?;
        // Last, so that the call's own `env` cannot hide it.
        env.push((crate::RUN_ENV.to_string(), ctx.run_id.to_string()));
        let requested = match a.opt("timeout") {
            None => None,
            Some(v) => Some(parse_timeout(v).map_err(|m| a.err("timeout", m))?),
        };
        let timeout = ctx.sandbox.limits().timeout_for(requested);
        let cwd_arg = a.opt_str("cwd")?.unwrap_or(".");
        let cwd_rel = ctx.sandbox.relative(cwd_arg)?;
        // Confirms the folder is beneath the root (symlinks included) and is
        // a directory; the child is not confined to it afterwards.
        ctx.sandbox.open_rel(&cwd_rel, Open::Dir, cwd_arg)?;
        let cwd = ctx.sandbox.root().join(&cwd_rel);

        let network = ctx.sandbox.network();
        judge_network(&argv, network, ctx)?;

        let spec = ProcessSpec {
            argv,
            cwd,
            env,
            clear_env: true,
            timeout: Some(timeout),
            max_output_bytes: ctx.sandbox.limits().max_output_bytes,
            network,
            confine: ctx.sandbox.confinement(),
            proxy: ctx.sandbox.network_hosts(),
        };
        let outcome =
            run_process(spec, &AsProcessObserver(ctx.observer), ctx.cancel.clone()).await?;
        outcome_value(outcome, timeout, ctx)
    }
}

/// The call's `argv`: a non-empty list of strings.
fn argv_of(a: &Args<'_>) -> Result<Vec<String>, ToolError> {
    let argv = match a.opt("argv") {
        None => return Err(a.err("argv", "is required")),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, v)| {
                v.as_str().map(str::to_string).ok_or_else(|| {
                    a.err(
                        "argv",
                        format!("element {i} should be a string, got {}", type_name(v)),
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()?,
        Some(v) => {
            return Err(a.err(
                "argv",
                format!("expected an array of strings, got {}", type_name(v)),
            ))
        }
    };
    if argv.is_empty() {
        return Err(a.err("argv", "is empty"));
    }
    Ok(argv)
}

/// The sandbox's environment with the call's `env` on top.
fn env_of(a: &Args<'_>, base: &[(String, String)]) -> Result<Vec<(String, String)>, ToolError> {
    let mut env: Vec<(String, String)> = base.to_vec();
    match a.opt("env") {
        None => {}
        Some(Value::Object(m)) => {
            for (k, v) in m {
                let Some(v) = v.as_str() else {
                    return Err(a.err(
                        "env",
                        format!("`{k}` should be a string, got {}", type_name(v)),
                    ));
                };
                if k.is_empty() || k.contains('=') || k.contains('\0') {
                    return Err(a.err("env", format!("`{k}` is not a valid variable name")));
                }
                env.push((k.clone(), v.to_string()));
            }
        }
        Some(v) => {
            return Err(a.err(
                "env",
                format!("expected an object of strings, got {}", type_name(v)),
            ))
        }
    }
    Ok(env)
}

/// A program known to reach the network, judged before it starts: refused
/// (and reported) when the network is shut, reported when it is open.
fn judge_network(
    argv: &[String],
    network: NetworkPolicy,
    ctx: &ToolContext<'_>,
) -> Result<(), ToolError> {
    if let Some((target, reason)) = network_use(argv) {
        match network {
            NetworkPolicy::Deny => {
                ctx.observer
                    .network(NetworkAction::Blocked, &target, &reason);
                return Err(ToolError::NetworkRefused { target, reason });
            }
            NetworkPolicy::Allow => {
                ctx.observer.network(
                    NetworkAction::Allowed,
                    &target,
                    "the workflow's sandbox allows the network",
                );
            }
            // The proxy judges each connection the program makes.
            NetworkPolicy::Proxy => {}
        }
    }
    Ok(())
}

/// The tool's answer for a program that ran: its output when it exited
/// with 0, an error that keeps the output otherwise.
fn outcome_value(
    outcome: crate::process::ProcessOutcome,
    timeout: Duration,
    ctx: &ToolContext<'_>,
) -> Result<Value, ToolError> {
    if outcome.cancelled {
        return Err(ToolError::Cancelled);
    }
    if outcome.timed_out {
        return Err(ToolError::Timeout {
            timeout,
            stdout: outcome.stdout,
            stderr: outcome.stderr,
        });
    }
    if let Some(limit) = outcome.resource_limit(&ctx.sandbox.resources()) {
        return Err(ToolError::ResourceLimit {
            limit,
            code: outcome.exit_code,
            signal: outcome.signal,
            stderr: outcome.stderr,
        });
    }
    if outcome.exit_code != Some(0) {
        return Err(ToolError::Exit {
            code: outcome.exit_code,
            signal: outcome.signal,
            stdout: outcome.stdout,
            stderr: outcome.stderr,
        });
    }
    Ok(json!({
        "exitCode": 0,
        "stdout": outcome.stdout,
        "stderr": outcome.stderr,
        "truncated": outcome.stdout_truncated || outcome.stderr_truncated,
    }))
}

/// Programs that exist to reach the network.
const NETWORK_PROGRAMS: &[&str] = &["curl", "wget", "npm", "npx", "bun", "bunx", "pip", "pip3"];

/// Git subcommands that talk to a remote.
const GIT_REMOTE_OPS: &[&str] = &[
    "push",
    "pull",
    "fetch",
    "clone",
    "remote",
    "ls-remote",
    "submodule",
];

/// Git options that take their value as the next argument.
const GIT_OPTS_WITH_VALUE: &[&str] = &[
    "-C",
    "-c",
    "--git-dir",
    "--work-tree",
    "--namespace",
    "--exec-path",
    "--config-env",
];

/// The cheap first check: whether an argv plainly means to use the network,
/// with the target and the rule. The kernel filter catches what this misses
/// (a script that opens a socket itself).
pub fn network_use(argv: &[String]) -> Option<(String, String)> {
    let program = argv.first()?;
    let base = program.rsplit('/').next().unwrap_or(program);
    if NETWORK_PROGRAMS.contains(&base) {
        let target = argv
            .iter()
            .skip(1)
            .find(|a| is_url(a))
            .cloned()
            .unwrap_or_else(|| base.to_string());
        return Some((
            target,
            format!("`{base}` is a network client and the network is shut"),
        ));
    }
    if let Some(url) = argv.iter().find(|a| is_url(a)) {
        return Some((
            url.clone(),
            "an argument is an http(s) URL and the network is shut".to_string(),
        ));
    }
    if base == "git" {
        let mut it = argv.iter().skip(1);
        while let Some(arg) = it.next() {
            if GIT_OPTS_WITH_VALUE.contains(&arg.as_str()) {
                it.next();
                continue;
            }
            if arg.starts_with('-') {
                continue;
            }
            if GIT_REMOTE_OPS.contains(&arg.as_str()) {
                return Some((
                    format!("git {arg}"),
                    format!("`git {arg}` talks to a remote and the network is shut"),
                ));
            }
            break;
        }
    }
    None
}

fn is_url(s: &str) -> bool {
    let lower = s.get(..8).unwrap_or(s).to_ascii_lowercase();
    lower.starts_with("http://") || lower.starts_with("https://")
}

/// `500ms`, `30s`, `10m`, `1h`, or a number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| !(c.is_ascii_digit() || c == '.')) {
        Some(i) => (&s[..i], &s[i..]),
        None => (s, "s"),
    };
    let n: f64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a duration (use 500ms, 30s, 10m or 1h)"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => {
            return Err(format!(
                "`{s}` has an unknown unit `{unit}` (use ms, s, m or h)"
            ))
        }
    };
    if !secs.is_finite() || secs <= 0.0 || secs > 1e9 {
        return Err(format!("`{s}` is not a positive duration"));
    }
    Ok(Duration::from_secs_f64(secs))
}

fn parse_timeout(v: &Value) -> Result<Duration, String> {
    match v {
        Value::String(s) => parse_duration(s),
        Value::Number(n) => match n.as_f64() {
            Some(f) if f > 0.0 && f.is_finite() && f <= 1e9 => Ok(Duration::from_secs_f64(f)),
            _ => Err(format!("{n} is not a positive number of seconds")),
        },
        other => Err(format!(
            "expected a duration string or seconds, got {}",
            type_name(other)
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn cheap_refusals() {
        assert!(network_use(&argv(&["curl", "example.org"])).is_some());
        assert!(network_use(&argv(&["/usr/bin/wget", "-q", "x"])).is_some());
        assert!(network_use(&argv(&["pip", "install", "x"])).is_some());
        assert_eq!(
            network_use(&argv(&["python3", "fetch.py", "HTTPS://example.org/a"]))
                .unwrap()
                .0,
            "HTTPS://example.org/a"
        );
        assert!(network_use(&argv(&["git", "-C", "repo", "push"])).is_some());
        assert!(network_use(&argv(&["git", "clone", "x"])).is_some());
        assert!(network_use(&argv(&["git", "log", "--grep", "push"])).is_none());
        assert!(network_use(&argv(&["git", "-C", "push", "status"])).is_none());
        assert!(network_use(&argv(&["echo", "httpx"])).is_none());
        assert!(network_use(&argv(&["ls"])).is_none());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("10m").unwrap(), Duration::from_secs(600));
        assert_eq!(parse_duration("2").unwrap(), Duration::from_secs(2));
        assert!(parse_duration("10x").unwrap_err().contains("unknown unit"));
        assert!(parse_duration("0s").is_err());
    }
}
