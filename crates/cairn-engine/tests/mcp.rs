//! MCP servers end to end, against real servers from the npm registry that
//! nobody here wrote: `@modelcontextprotocol/server-everything` over stdio
//! (in the sandbox) and in its streamable HTTP mode on 127.0.0.1, and
//! `@modelcontextprotocol/server-filesystem`. `.ci/run` installs them into
//! `target/mcp-servers` (or set `CAIRN_TEST_MCP_DIR` to a folder holding
//! their `node_modules`); without them, or without Node.js, each test says
//! it was skipped.

mod common;
use common::*;

use std::path::{Path, PathBuf};
use std::time::Duration;

use cairn_engine::{Engine, EngineOptions, RunOutcome, StartOptions};
use cairn_events::{Event, EventKind, ToolStatus};
use serde_json::{json, Value};

/// The folder holding the servers' `node_modules`, and `node`, or why the
/// test cannot run.
fn servers() -> Result<(PathBuf, PathBuf), String> {
    let dir = std::env::var_os("CAIRN_TEST_MCP_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/mcp-servers"));
    let dir = dir.canonicalize().map_err(|_| {
        format!(
            "no MCP servers in {} (run .ci/run, or `npm install --prefix {} @modelcontextprotocol/server-everything @modelcontextprotocol/server-filesystem`)",
            dir.display(),
            dir.display()
        )
    })?;
    for pkg in ["server-everything", "server-filesystem"] {
        let p = dir.join("node_modules/@modelcontextprotocol").join(pkg);
        if !p.join("dist/index.js").is_file() {
            return Err(format!("{} is not installed", p.display()));
        }
    }
    let node = std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|p| p.join("node"))
                .find(|p| p.is_file())
        })
        .ok_or("Node.js (`node`) is not on PATH")?;
    Ok((dir, node))
}

macro_rules! need_servers {
    () => {
        match servers() {
            Ok(s) => s,
            Err(why) => {
                eprintln!("skipped: {why}");
                return;
            }
        }
    };
}

async fn run(dir: &Path, yaml: &str, turns: &str, run_id: &str) -> (Engine, RunOutcome) {
    std::fs::write(dir.join("turns.yaml"), turns).unwrap();
    std::fs::write(dir.join("wf.yaml"), yaml).unwrap();
    let engine = Engine::new(journal(dir), EngineOptions::default());
    let wf = engine
        .load_workflow(dir.join("wf.yaml").to_str().unwrap(), None)
        .unwrap();
    let opts = StartOptions {
        run_id: Some(cairn_events::RunId::parse(run_id).unwrap()),
        ..StartOptions::default()
    };
    let outcome = engine
        .start(wf, json!({}), opts)
        .await
        .unwrap()
        .wait()
        .await;
    (engine, outcome)
}

/// The calls' (tool, status, side effect) in the log's order.
fn calls(evs: &[Event]) -> Vec<(String, ToolStatus)> {
    evs.iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolCallFinished {
                tool_name, status, ..
            } => Some((tool_name.clone(), *status)),
            _ => None,
        })
        .collect()
}

fn results(engine: &Engine, run: &str) -> Vec<Value> {
    engine
        .journal()
        .backend()
        .tool_calls(
            &cairn_events::RunId::parse(run).unwrap(),
            &cairn_events::NodePath::from("a"),
            0,
        )
        .unwrap()
        .into_iter()
        .map(|r| r.output.unwrap_or(Value::Null))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_calls_a_stdio_servers_tools_in_the_sandbox() {
    let (servers, node) = need_servers!();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let everything =
        servers.join("node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    let yaml = format!(
        r#"
name: mcp-stdio
models:
  s: {{ provider: scripted, script: turns.yaml }}
mcp_servers:
  everything:
    command: ["{node}", "{everything}", "stdio"]
sandbox:
  network: false
  read_only: ["{servers}"]
nodes:
  - id: a
    agent:
      model: s
      prompt: Use the tools.
      tools: ["everything.*"]
"#,
        node = node.display(),
        everything = everything.display(),
        servers = servers.display(),
    );
    let turns = r#"
turns:
  - text: Echo and add.
    tool_calls:
      - { name: everything__echo, args: { message: "hello from cairn" } }
      - { name: everything__get-sum, args: { a: 2, b: 40 } }
      - { name: everything__no-such-tool, args: {} }
  - text: Done.
"#;
    let (engine, outcome) = run(d, &yaml, turns, "m1").await;
    assert!(matches!(outcome, RunOutcome::Finished(_)), "{outcome:?}");
    let evs = stored(&engine, "m1");
    // Read-only calls run side by side and end in either order.
    let mut c = calls(&evs);
    c.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        c,
        vec![
            ("everything.echo".into(), ToolStatus::Success),
            ("everything.get-sum".into(), ToolStatus::Success),
            ("everything__no-such-tool".into(), ToolStatus::Error),
        ]
    );
    let out = results(&engine, "m1");
    assert!(
        out.iter()
            .any(|o| o.to_string().contains("hello from cairn")),
        "{out:?}"
    );
    assert!(out.iter().any(|o| o.to_string().contains("42")), "{out:?}");
    // echo is annotated read-only: no side effect.
    let echo_side = evs.iter().find_map(|e| match &e.kind {
        EventKind::ToolCallStarted {
            tool_name,
            side_effect,
            ..
        } if tool_name == "everything.echo" => Some(*side_effect),
        _ => None,
    });
    assert_eq!(echo_side, Some(false), "echo is read-only");
    // Started once, connected with its tools, stopped before the run ended.
    let pos = |f: &dyn Fn(&EventKind) -> bool| evs.iter().position(|e| f(&e.kind));
    let starting = pos(&|k| matches!(k, EventKind::McpServerStarting { .. })).unwrap();
    let connected = evs.iter().find_map(|e| match &e.kind {
        EventKind::McpServerConnected { tool_count, .. } => Some(*tool_count),
        _ => None,
    });
    assert!(connected.unwrap() >= 5, "{connected:?}");
    let gone = pos(&|k| matches!(k, EventKind::McpServerDisconnected { .. })).unwrap();
    let end = pos(&|k| matches!(k, EventKind::RunFinished { .. })).unwrap();
    assert!(starting < gone && gone < end);
    assert_eq!(
        evs.iter()
            .filter(|e| matches!(e.kind, EventKind::McpServerStarting { .. }))
            .count(),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_filesystem_server_writes_inside_the_sandbox_root() {
    let (servers, node) = need_servers!();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().canonicalize().unwrap();
    let fs = servers.join("node_modules/@modelcontextprotocol/server-filesystem/dist/index.js");
    let yaml = format!(
        r#"
name: mcp-fs
models:
  s: {{ provider: scripted, script: turns.yaml }}
mcp_servers:
  fs:
    command: ["{node}", "{fs}", "{root}"]
sandbox:
  read_only: ["{servers}"]
nodes:
  - id: a
    agent:
      model: s
      prompt: Write a note.
      tools: [fs.write_file, fs.read_text_file]
"#,
        node = node.display(),
        fs = fs.display(),
        root = d.display(),
        servers = servers.display(),
    );
    let note = d.join("note.txt");
    let turns = format!(
        r#"
turns:
  - text: Writing.
    tool_calls:
      - {{ name: fs__write_file, args: {{ path: "{note}", content: "written over MCP" }} }}
  - text: Reading back.
    tool_calls:
      - {{ name: fs__read_text_file, args: {{ path: "{note}" }} }}
      - {{ name: fs__read_text_file, args: {{ path: "/etc/passwd" }} }}
  - text: Done.
"#,
        note = note.display()
    );
    let (engine, outcome) = run(&d, &yaml, &turns, "m2").await;
    assert!(matches!(outcome, RunOutcome::Finished(_)), "{outcome:?}");
    assert_eq!(std::fs::read_to_string(&note).unwrap(), "written over MCP");
    let evs = stored(&engine, "m2");
    let c = calls(&evs);
    assert_eq!(c[0], ("fs.write_file".into(), ToolStatus::Success));
    // The reads run side by side and end in either order. The one outside
    // the server's allowed folder is refused; the model reads why.
    let mut reads: Vec<ToolStatus> = c[1..].iter().map(|(_, s)| *s).collect();
    reads.sort_by_key(|s| *s == ToolStatus::Error);
    assert_eq!(reads, vec![ToolStatus::Success, ToolStatus::Error], "{c:?}");
    // write_file is not read-only: a side effect.
    let first_side = evs.iter().find_map(|e| match &e.kind {
        EventKind::ToolCallStarted { side_effect, .. } => Some(*side_effect),
        _ => None,
    });
    assert_eq!(first_side, Some(true));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_calls_a_streamable_http_server() {
    let (servers, node) = need_servers!();
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let everything =
        servers.join("node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    let mut server = tokio::process::Command::new(&node)
        .arg(&everything)
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut up = false;
    for _ in 0..200 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(up, "the HTTP server did not start");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let yaml = format!(
        r#"
name: mcp-http
models:
  s: {{ provider: scripted, script: turns.yaml }}
mcp_servers:
  remote:
    url: http://127.0.0.1:{port}/mcp
    headers_env: {{ X-Test-Token: CAIRN_TEST_MCP_TOKEN }}
nodes:
  - id: a
    agent:
      model: s
      prompt: Echo.
      tools: [remote.echo]
"#
    );
    std::env::set_var("CAIRN_TEST_MCP_TOKEN", "not-a-secret");
    let turns = r#"
turns:
  - text: Echo.
    tool_calls:
      - { name: remote__echo, args: { message: "over http" } }
  - text: Done.
"#;
    let (engine, outcome) = run(d, &yaml, turns, "m3").await;
    assert!(matches!(outcome, RunOutcome::Finished(_)), "{outcome:?}");
    let evs = stored(&engine, "m3");
    assert_eq!(
        calls(&evs),
        vec![("remote.echo".into(), ToolStatus::Success)]
    );
    assert!(results(&engine, "m3")[0].to_string().contains("over http"));
    // The header's value never enters the log.
    let log = std::fs::read_to_string(d.join(".cairn/logs/m3/events.ndjson")).unwrap();
    assert!(!log.contains("not-a-secret"));
    let _ = server.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_cannot_start_fails_the_node_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let yaml = r#"
name: mcp-missing
models:
  s: { provider: scripted, script: turns.yaml }
mcp_servers:
  ghost:
    command: ["/nonexistent/mcp-server"]
nodes:
  - id: a
    retry: { attempts: 1 }
    agent:
      model: s
      prompt: Try.
      tools: [ghost.anything]
"#;
    let turns = "turns:\n  - text: Never asked.\n";
    let (engine, outcome) = run(d, yaml, turns, "m4").await;
    let RunOutcome::Failed(e) = outcome else {
        panic!("{outcome:?}")
    };
    assert!(e.message.contains("ghost"), "{e:?}");
    let evs = stored(&engine, "m4");
    let reason = evs.iter().find_map(|e| match &e.kind {
        EventKind::McpServerDisconnected { reason, .. } => reason.clone(),
        _ => None,
    });
    assert!(reason.unwrap().contains("cannot start"));
}

/// A minimal stdio MCP server (Node.js, written for this test) whose one
/// tool tries to open a TCP connection: what the sandbox lets a server do.
const NET_SERVER: &str = r#"
const net = require("net");
const rl = require("readline").createInterface({ input: process.stdin });
const send = (m) => process.stdout.write(JSON.stringify(m) + "\n");
rl.on("line", (line) => {
  const m = JSON.parse(line);
  if (m.method === "initialize") {
    send({ jsonrpc: "2.0", id: m.id, result: { protocolVersion: m.params.protocolVersion,
      capabilities: { tools: {} }, serverInfo: { name: "net-probe", version: "1" } } });
  } else if (m.method === "tools/list") {
    send({ jsonrpc: "2.0", id: m.id, result: { tools: [{ name: "connect",
      inputSchema: { type: "object", properties: { port: { type: "integer" } } },
      annotations: { readOnlyHint: true } }] } });
  } else if (m.method === "tools/call") {
    const s = net.connect({ host: "127.0.0.1", port: m.params.arguments.port });
    const answer = (text) => { s.destroy(); send({ jsonrpc: "2.0", id: m.id,
      result: { content: [{ type: "text", text }] } }); };
    s.on("connect", () => answer("connected"));
    s.on("error", (e) => answer("refused: " + e.code));
  } else if (m.id !== undefined) {
    send({ jsonrpc: "2.0", id: m.id, error: { code: -32601, message: "no such method" } });
  }
});
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stdio_server_has_the_workflows_network_setting() {
    let Ok((_, node)) = servers() else {
        eprintln!("skipped: Node.js or the MCP servers are missing");
        return;
    };
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    for (network, expect) in [("false", "refused"), ("true", "connected")] {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join("probe.js"), NET_SERVER).unwrap();
        let yaml = format!(
            r#"
name: mcp-net
models:
  s: {{ provider: scripted, script: turns.yaml }}
mcp_servers:
  probe:
    command: ["{node}", "probe.js"]
sandbox:
  network: {network}
nodes:
  - id: a
    agent:
      model: s
      prompt: Connect.
      tools: [probe.connect]
"#,
            node = node.display(),
        );
        let turns = format!(
            "turns:\n  - text: Connecting.\n    tool_calls:\n      - {{ name: probe__connect, args: {{ port: {port} }} }}\n  - text: Done.\n"
        );
        let run_id = format!("net-{network}");
        let (engine, outcome) = run(d, &yaml, &turns, &run_id).await;
        assert!(matches!(outcome, RunOutcome::Finished(_)), "{outcome:?}");
        let out = results(&engine, &run_id);
        assert!(
            out[0].to_string().contains(expect),
            "network {network}: {out:?}"
        );
    }
}

/// A stdio server gets the workflow's `env` and the secrets of the node
/// that needs it, as that node's commands do; a node that names no secret
/// gets a server of its own, without them; the secret's value is masked in
/// every stored result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stdio_server_gets_the_secrets_of_the_node_that_needs_it_and_no_other() {
    let (servers, node) = need_servers!();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("token.txt"), "tok-7f3a9c2e51\n").unwrap();
    let everything =
        servers.join("node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    let yaml = format!(
        r#"
name: mcp-secrets
models:
  s: {{ provider: scripted, script: turns.yaml }}
env:
  PLAIN_SETTING: plain-value
secrets:
  DEPLOY_TOKEN: {{ file: token.txt }}
mcp_servers:
  everything:
    command: ["{node}", "{everything}", "stdio"]
sandbox:
  network: false
  read_only: ["{servers}"]
nodes:
  - id: a
    secrets: [DEPLOY_TOKEN]
    agent:
      model: s
      prompt: Show the environment.
      tools: ["everything.get-env"]
  - id: b
    needs: [a]
    agent:
      model: s
      prompt: Show the environment.
      tools: ["everything.get-env"]
"#,
        node = node.display(),
        everything = everything.display(),
        servers = servers.display(),
    );
    let turns = r#"
turns:
  - tool_calls:
      - { name: everything__get-env, args: {} }
  - text: Seen.
"#;
    let (engine, outcome) = run(d, &yaml, turns, "ms1").await;
    assert!(matches!(outcome, RunOutcome::Finished(_)), "{outcome:?}");
    let result_of = |node: &str| -> String {
        engine
            .journal()
            .backend()
            .tool_calls(
                &cairn_events::RunId::parse("ms1").unwrap(),
                &cairn_events::NodePath::from(node),
                0,
            )
            .unwrap()
            .into_iter()
            .map(|r| r.output.unwrap_or(Value::Null).to_string())
            .collect()
    };
    let a = result_of("a");
    let b = result_of("b");
    // The server of `a` had the secret (masked once stored) and the env.
    assert!(a.contains("DEPLOY_TOKEN"), "{a}");
    assert!(a.contains("***"), "{a}");
    assert!(a.contains("plain-value"), "{a}");
    // `b` names no secret: its server never had it.
    assert!(!b.contains("DEPLOY_TOKEN"), "{b}");
    assert!(b.contains("plain-value"), "{b}");
    // The value is nowhere in the store's events.
    let evs = stored(&engine, "ms1");
    for e in &evs {
        assert!(!e.to_json().contains("tok-7f3a9c2e51"), "{}", e.to_json());
    }
    assert_eq!(
        evs.iter()
            .filter(|e| matches!(e.kind, EventKind::McpServerStarting { .. }))
            .count(),
        2,
        "one server per set of secrets"
    );
}
