//! External agent CLIs as engines, against stand-in CLIs (shell scripts in
//! the test) that print recorded-style JSON lines of each format: a clean
//! run, a hang, a crash mid-stream, children left behind, and a resume of
//! the session after the engine stopped. They run in the sandbox, as the
//! real CLIs would.

mod common;
use common::*;

use std::path::Path;
use std::time::Duration;

use cairn_engine::{Engine, EngineOptions, RunOutcome, StartOptions};
use cairn_events::{EventKind, OutputStream};
use serde_json::json;

fn workflow(dir: &Path, engine: &str, script: &str, extra: &str) -> cairn_workflow::Workflow {
    std::fs::write(dir.join("cli.sh"), script).unwrap();
    let yaml = format!(
        r#"
name: engine-test
models:
  m: {{ provider: anthropic, model: claude-test, idle_timeout: 1s }}
nodes:
  - id: a
{extra}
    agent:
      engine: {engine}
      engine_command: ["sh", "cli.sh"]
      model: m
      prompt: "Fix the bug in {{{{ input.file }}}}"
"#
    );
    std::fs::write(dir.join("wf.yaml"), yaml).unwrap();
    cairn_workflow::load(&dir.join("wf.yaml")).unwrap()
}

async fn start(
    engine: &Engine,
    wf: cairn_workflow::Workflow,
    run: &str,
) -> cairn_engine::RunHandle {
    let opts = StartOptions {
        run_id: Some(cairn_events::RunId::parse(run).unwrap()),
        ..StartOptions::default()
    };
    engine
        .start(wf, json!({"file": "main.rs"}), opts)
        .await
        .unwrap()
}

const CLAUDE: &str = r#"
printf '%s\n' "$@" > args.log
echo '{"type":"system","subtype":"init","session_id":"sess-1","model":"claude-test","tools":["Bash"]}'
echo '{"type":"assistant","message":{"id":"m1","role":"assistant","content":[{"type":"text","text":"Looking at the file. "}],"usage":{"input_tokens":100,"output_tokens":5}}}'
echo '{"type":"assistant","message":{"id":"m2","role":"assistant","content":[{"type":"tool_use","id":"t1","name":"Bash","input":{"command":"ls"}}],"usage":{"input_tokens":110,"output_tokens":9}}}'
echo '{"type":"user","message":{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"main.rs"}]}}'
echo '{"type":"assistant","message":{"id":"m3","role":"assistant","content":[{"type":"text","text":"Fixed it."}],"usage":{"input_tokens":130,"output_tokens":12}}}'
echo '{"type":"result","subtype":"success","is_error":false,"result":"Fixed the off-by-one in main.rs.","session_id":"sess-1","total_cost_usd":0.0123,"usage":{"input_tokens":340,"output_tokens":26,"cache_read_input_tokens":50,"cache_creation_input_tokens":20}}'
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_lines_become_events_and_usage_is_counted_once() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let engine = Engine::new(journal(d), EngineOptions::default());
    let outcome = start(&engine, workflow(d, "claude-code", CLAUDE, ""), "c1")
        .await
        .wait()
        .await;
    assert!(matches!(outcome, RunOutcome::Finished(_)), "{outcome:?}");
    let st = engine
        .state(&cairn_events::RunId::parse("c1").unwrap())
        .unwrap();
    assert_eq!(
        st.node("a", 0).unwrap().output.as_ref().unwrap().to_value(),
        json!("Fixed the off-by-one in main.rs.")
    );
    let evs = stored(&engine, "c1");
    let raw = evs
        .iter()
        .filter(
            |e| matches!(&e.kind, EventKind::AgentEvent { engine, .. } if engine == "claude-code"),
        )
        .count();
    assert_eq!(raw, 6, "one AgentEvent per line");
    let usage: Vec<(u64, u64, Option<u64>, Option<f64>)> = evs
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::TokenUsageReported {
                input_tokens,
                output_tokens,
                cache_read_tokens,
                cost_usd,
                ..
            } => Some((*input_tokens, *output_tokens, *cache_read_tokens, *cost_usd)),
            _ => None,
        })
        .collect();
    assert_eq!(
        usage,
        vec![(340, 26, Some(50), Some(0.0123))],
        "from the result line only"
    );
    let text: String = evs
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::NodeOutput {
                text,
                stream: OutputStream::Text,
            } => Some(text.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(text, "Looking at the file. Fixed it.");
    let args = std::fs::read_to_string(d.join("args.log")).unwrap();
    let args: Vec<&str> = args.lines().collect();
    for a in [
        "-p",
        "--output-format",
        "stream-json",
        "--verbose",
        "--model=claude-test",
    ] {
        assert!(args.contains(&a), "{args:?}");
    }
    assert_eq!(args[args.len() - 2..], ["--", "Fix the bug in main.rs"]);
    assert_eq!(st.tokens.input, 340);
}

const CODEX: &str = r#"
echo '{"type":"thread.started","thread_id":"th-9"}'
echo '{"type":"turn.started"}'
echo '{"type":"item.completed","item":{"id":"i0","type":"reasoning","text":"Check the loop bounds."}}'
echo '{"type":"item.completed","item":{"id":"i1","type":"command_execution","command":"ls","aggregated_output":"main.rs\n","exit_code":0,"status":"completed"}}'
echo '{"type":"item.completed","item":{"id":"i2","type":"agent_message","text":"{\"fixed\": true}"}}'
echo '{"type":"turn.completed","usage":{"input_tokens":900,"cached_input_tokens":300,"output_tokens":45}}'
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_lines_become_events_and_the_final_message_is_checked() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("unused"), "").unwrap();
    let engine = Engine::new(journal(d), EngineOptions::default());
    let mut wf = workflow(d, "codex", CODEX, "");
    if let cairn_workflow::NodeKind::Agent(a) = &mut wf.nodes[0].kind {
        a.output_schema = Some(json!({"type": "object", "required": ["fixed"]}));
    }
    let outcome = start(&engine, wf, "x1").await.wait().await;
    assert!(matches!(outcome, RunOutcome::Finished(_)), "{outcome:?}");
    let st = engine
        .state(&cairn_events::RunId::parse("x1").unwrap())
        .unwrap();
    assert_eq!(
        st.node("a", 0).unwrap().output.as_ref().unwrap().to_value(),
        json!({"fixed": true})
    );
    let evs = stored(&engine, "x1");
    let usage: Vec<(u64, Option<u64>)> = evs
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::TokenUsageReported {
                input_tokens,
                cache_read_tokens,
                ..
            } => Some((*input_tokens, *cache_read_tokens)),
            _ => None,
        })
        .collect();
    assert_eq!(usage, vec![(900, Some(300))]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_cli_is_killed_with_what_it_started() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let hang = r#"
echo '{"type":"system","subtype":"init","session_id":"sess-2"}'
sleep 313.25 &
sleep 300
"#;
    let engine = Engine::new(journal(d), EngineOptions::default());
    let outcome = start(
        &engine,
        workflow(d, "claude-code", hang, "    retry: { attempts: 1 }"),
        "h1",
    )
    .await
    .wait()
    .await;
    let RunOutcome::Failed(e) = outcome else {
        panic!("{outcome:?}")
    };
    assert!(e.message.contains("printed nothing"), "{e:?}");
    let err = first_error(&engine, "h1", "a");
    assert_eq!(err.kind, "idle_timeout");
    // The child it left behind went with it (its odd duration is this
    // test's mark).
    let mut left = String::new();
    for _ in 0..40 {
        left = std::process::Command::new("pgrep")
            .args(["-f", "sleep 313.25"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
            .unwrap_or_default();
        if left.trim().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(left.trim().is_empty(), "left running: {left}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cli_that_crashes_mid_stream_fails_the_node() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let crash = r#"
echo '{"type":"system","subtype":"init","session_id":"sess-3"}'
printf '{"type":"assistant","message":{"content":[{"type":"text","te'
echo 'segfault in the CLI' >&2
exit 139
"#;
    let engine = Engine::new(journal(d), EngineOptions::default());
    let outcome = start(
        &engine,
        workflow(d, "claude-code", crash, "    retry: { attempts: 1 }"),
        "k1",
    )
    .await
    .wait()
    .await;
    assert!(matches!(outcome, RunOutcome::Failed(_)), "{outcome:?}");
    let err = first_error(&engine, "k1", "a");
    assert_eq!(err.kind, "engine");
    assert!(err.message.contains("exited with code 139"), "{err:?}");
    assert!(err.details.unwrap()["stderr"]
        .as_str()
        .unwrap()
        .contains("segfault"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_session_is_resumed_with_its_id() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let script = r#"
printf '%s\n' "$@" >> args.log
case "$*" in
  *--resume*)
    echo '{"type":"result","subtype":"success","is_error":false,"result":"resumed","session_id":"sess-4","usage":{"input_tokens":1,"output_tokens":1}}'
    ;;
  *)
    echo '{"type":"system","subtype":"init","session_id":"sess-4"}'
    sleep 30
    ;;
esac
"#;
    let engine = Engine::new(journal(d), EngineOptions::default());
    let handle = start(&engine, workflow(d, "claude-code", script, ""), "r1").await;
    // Until the session's first line is in the log.
    loop {
        let seen = stored(&engine, "r1")
            .iter()
            .any(|e| matches!(e.kind, EventKind::AgentEvent { .. }));
        if seen {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (_engine, outcome) = stop_and_resume(d, engine, handle, "r1").await;
    assert!(matches!(outcome, RunOutcome::Finished(_)), "{outcome:?}");
    let args = std::fs::read_to_string(d.join("args.log")).unwrap();
    assert!(args.contains("--resume\nsess-4"), "{args}");
}

/// The folder `scripts/install-agent-clis` installed the real CLIs into.
fn real_clis() -> Option<std::path::PathBuf> {
    let dir = std::env::var_os("CAIRN_AGENT_CLIS_DIR").map(std::path::PathBuf::from);
    match dir.and_then(|d| d.canonicalize().ok()) {
        Some(d) if d.join("node_modules/.bin/claude").exists() => Some(d),
        _ => {
            eprintln!(
                "skipped: CAIRN_AGENT_CLIS_DIR does not name a folder with the real CLIs (run scripts/install-agent-clis; see docs/agents.md)"
            );
            None
        }
    }
}

/// Runs the one-node workflow `yaml` to its end and returns the node's
/// output and each usage report's (input, output) tokens.
async fn run_real(yaml: &str, run: &str) -> (serde_json::Value, Vec<(u64, u64)>) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("wf.yaml"), yaml).unwrap();
    let wf = cairn_workflow::load(&d.join("wf.yaml")).unwrap();
    let engine = Engine::new(journal(d), EngineOptions::default());
    let outcome = start(&engine, wf, run).await.wait().await;
    assert!(matches!(outcome, RunOutcome::Finished(_)), "{outcome:?}");
    let output = engine
        .state(&cairn_events::RunId::parse(run).unwrap())
        .unwrap()
        .node("a", 0)
        .unwrap()
        .output
        .as_ref()
        .unwrap()
        .to_value();
    let usage = stored(&engine, run)
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::TokenUsageReported {
                input_tokens,
                output_tokens,
                ..
            } => Some((*input_tokens, *output_tokens)),
            _ => None,
        })
        .collect();
    (output, usage)
}

/// The real Claude Code, from npm, run by Cairn in its sandbox against a
/// fake Anthropic server on 127.0.0.1: its lines become events, its usage
/// is counted once (from the result line, not the per-message snapshot),
/// and its answer is the node's output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_claude_code_runs_against_a_local_fake_provider() {
    let Some(clis) = real_clis() else { return };
    use cairn_agent::testing::{FakeProvider, Reply};
    let server = FakeProvider::start().await;
    server.respond_with(|r| {
        let model = r.body["model"].as_str().unwrap_or("m").to_string();
        if r.body["stream"] != json!(true) {
            let body = json!({"id": "msg_0", "type": "message", "role": "assistant", "model": model,
                "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn",
                "usage": {"input_tokens": 1, "output_tokens": 1}});
            return Reply::status(200, &body.to_string());
        }
        let ev = |t: &str, d: serde_json::Value| (t.to_string(), d.to_string());
        Reply::named_sse([
            ev("message_start", json!({"type": "message_start", "message": {"id": "msg_1", "type": "message",
                "role": "assistant", "model": model, "content": [], "stop_reason": null,
                "usage": {"input_tokens": 42, "output_tokens": 1}}})),
            ev("content_block_start", json!({"type": "content_block_start", "index": 0,
                "content_block": {"type": "text", "text": ""}})),
            ev("content_block_delta", json!({"type": "content_block_delta", "index": 0,
                "delta": {"type": "text_delta", "text": "Hello from the fake model."}})),
            ev("content_block_stop", json!({"type": "content_block_stop", "index": 0})),
            ev("message_delta", json!({"type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": null}, "usage": {"output_tokens": 7}})),
            ev("message_stop", json!({"type": "message_stop"})),
        ])
    });
    std::env::set_var("CAIRN_TEST_FAKE_ANTHROPIC_KEY", "sk-fake");
    let yaml = format!(
        r#"
name: real-claude
models:
  m: {{ provider: anthropic, model: claude-fake-1, base_url: "{url}", api_key_env: CAIRN_TEST_FAKE_ANTHROPIC_KEY, idle_timeout: 60s }}
sandbox:
  network: true
  read_only: ["{clis}"]
nodes:
  - id: a
    timeout: 120s
    agent:
      engine: claude-code
      engine_command: ["{claude}"]
      model: m
      prompt: Say hello.
"#,
        url = server.url(),
        clis = clis.display(),
        claude = clis.join("node_modules/.bin/claude").display(),
    );
    let (output, usage) = run_real(&yaml, "real-claude").await;
    assert_eq!(output, json!("Hello from the fake model."));
    assert_eq!(usage, vec![(42, 7)], "from the result line only");
    assert!(server
        .requests()
        .iter()
        .any(|r| r.body["model"] == "claude-fake-1"));
}

/// The real Codex CLI, from npm, run by Cairn in its sandbox against a fake
/// OpenAI Responses server on 127.0.0.1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_codex_runs_against_a_local_fake_provider() {
    let Some(clis) = real_clis() else { return };
    use cairn_agent::testing::{FakeProvider, Reply};
    let server = FakeProvider::start().await;
    server.respond_with(|_| {
        let ev = |d: serde_json::Value| (d["type"].as_str().unwrap().to_string(), d.to_string());
        let item = json!({"type": "message", "role": "assistant", "id": "msg_1",
            "content": [{"type": "output_text", "text": "Hello from the fake model."}]});
        Reply::named_sse([
            ev(json!({"type": "response.created", "response": {"id": "resp_1"}})),
            ev(json!({"type": "response.output_item.added", "output_index": 0,
                "item": {"type": "message", "role": "assistant", "id": "msg_1", "content": []}})),
            ev(json!({"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 0,
                "content_index": 0, "delta": "Hello from the fake model."})),
            ev(json!({"type": "response.output_item.done", "output_index": 0, "item": item})),
            ev(json!({"type": "response.completed", "response": {"id": "resp_1", "usage": {
                "input_tokens": 42, "input_tokens_details": {"cached_tokens": 10},
                "output_tokens": 7, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 49}}})),
        ])
    });
    std::env::set_var("CAIRN_TEST_FAKE_OPENAI_KEY", "sk-fake");
    let yaml = format!(
        r#"
name: real-codex
models:
  m: {{ provider: openai, model: fake-model, base_url: "{url}/v1", api_key_env: CAIRN_TEST_FAKE_OPENAI_KEY, idle_timeout: 60s }}
sandbox:
  network: true
  read_only: ["{clis}"]
nodes:
  - id: a
    timeout: 120s
    agent:
      engine: codex
      engine_command: ["{codex}"]
      model: m
      prompt: Say hello.
"#,
        url = server.url(),
        clis = clis.display(),
        codex = clis.join("node_modules/.bin/codex").display(),
    );
    let (output, usage) = run_real(&yaml, "real-codex").await;
    assert_eq!(output, json!("Hello from the fake model."));
    assert_eq!(usage, vec![(42, 7)]);
    assert!(server
        .requests()
        .iter()
        .any(|r| r.body["model"] == "fake-model"));
}

/// A stand-in CLI that parses its argv as getopt-style CLIs do (options
/// until `--`, then data) and writes each argument to `parsed.log` as
/// `option <arg>` or `data <arg>` (a newline in data as `|`), then answers
/// in `$1`'s format.
const PARSING_CLI: &str = r#"
format="$1"; shift
ended=no
: > parsed.log
for a in "$@"; do
  if [ "$ended" = yes ]; then printf 'data %s\n' "$(printf '%s' "$a" | tr '\n' '|')" >> parsed.log; continue; fi
  case "$a" in
    --) ended=yes ;;
    -*) printf 'option %s\n' "$a" >> parsed.log ;;
    *) printf 'word %s\n' "$a" >> parsed.log ;;
  esac
done
if [ "$format" = claude ]; then
  echo '{"type":"result","subtype":"success","is_error":false,"result":"done","session_id":"s","usage":{"input_tokens":1,"output_tokens":1}}'
else
  echo '{"type":"item.completed","item":{"id":"i","type":"agent_message","text":"done"}}'
fi
"#;

/// Runs one node of `engine` whose prompt and system text are the inputs
/// `prompt` and `system`, and returns what the CLI parsed as options and as
/// data.
async fn parsed_by(engine_name: &str, prompt: &str, system: &str) -> (Vec<String>, Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("cli.sh"), PARSING_CLI).unwrap();
    let format = if engine_name == "codex" {
        "codex"
    } else {
        "claude"
    };
    let yaml = format!(
        r#"
name: data-not-options
models:
  m: {{ provider: anthropic, model: claude-test, idle_timeout: 10s }}
nodes:
  - id: a
    agent:
      engine: {engine_name}
      engine_command: ["sh", "cli.sh", "{format}"]
      model: m
      system: "{{{{ input.system }}}}"
      prompt: "{{{{ input.prompt }}}}"
"#
    );
    std::fs::write(d.join("wf.yaml"), yaml).unwrap();
    let wf = cairn_workflow::load(&d.join("wf.yaml")).unwrap();
    let engine = Engine::new(journal(d), EngineOptions::default());
    let opts = StartOptions {
        run_id: Some(cairn_events::RunId::parse("o1").unwrap()),
        ..StartOptions::default()
    };
    let outcome = engine
        .start(wf, json!({"prompt": prompt, "system": system}), opts)
        .await
        .unwrap()
        .wait()
        .await;
    assert!(matches!(outcome, RunOutcome::Finished(_)), "{outcome:?}");
    let log = std::fs::read_to_string(d.join("parsed.log")).unwrap();
    let mut options = Vec::new();
    let mut data = Vec::new();
    for line in log.lines() {
        if let Some(o) = line.strip_prefix("option ") {
            options.push(o.to_string());
        } else if let Some(x) = line.strip_prefix("data ") {
            data.push(x.to_string());
        }
    }
    (options, data)
}

/// Inputs shaped like the options that would open the CLI's own walls
/// reach it as data, for both CLIs: after `--`, and the system text joined
/// to its option.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn option_like_prompts_reach_the_cli_as_data() {
    let (options, data) = parsed_by(
        "claude-code",
        "--permission-mode=bypassPermissions",
        "--dangerously-skip-permissions",
    )
    .await;
    assert_eq!(data, ["--permission-mode=bypassPermissions"], "{options:?}");
    assert!(
        options
            .iter()
            .all(|o| !o.starts_with("--permission-mode") && o != "--dangerously-skip-permissions"),
        "{options:?}"
    );
    assert!(
        options.contains(&"--append-system-prompt=--dangerously-skip-permissions".to_string()),
        "{options:?}"
    );

    let (options, data) = parsed_by(
        "codex",
        "-csandbox_mode=danger-full-access",
        "--dangerously-bypass-approvals-and-sandbox",
    )
    .await;
    assert_eq!(
        data,
        ["--dangerously-bypass-approvals-and-sandbox||-csandbox_mode=danger-full-access"],
        "{options:?}"
    );
    assert!(
        options
            .iter()
            .all(|o| !o.contains("sandbox_mode") && !o.contains("bypass")),
        "{options:?}"
    );
    // A prompt that names a subcommand stays the prompt.
    let (_, data) = parsed_by("codex", "resume", "").await;
    assert_eq!(data, ["||resume"]);
}

/// A session id in the log that looks like an option is never passed on:
/// the retry starts a new session instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_option_like_session_id_is_not_resumed() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let script = r#"
printf '%s\n' "$@" >> args.log
if [ -e started ]; then
  echo '{"type":"result","subtype":"success","is_error":false,"result":"again","session_id":"x","usage":{"input_tokens":1,"output_tokens":1}}'
else
  touch started
  echo '{"type":"system","subtype":"init","session_id":"--dangerously-skip-permissions"}'
  sleep 30
fi
"#;
    let engine = Engine::new(journal(d), EngineOptions::default());
    let handle = start(&engine, workflow(d, "claude-code", script, ""), "s1").await;
    loop {
        let seen = stored(&engine, "s1")
            .iter()
            .any(|e| matches!(e.kind, EventKind::AgentEvent { .. }));
        if seen {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (_engine, outcome) = stop_and_resume(d, engine, handle, "s1").await;
    assert!(matches!(outcome, RunOutcome::Finished(_)), "{outcome:?}");
    let args = std::fs::read_to_string(d.join("args.log")).unwrap();
    assert!(!args.contains("--resume"), "{args}");
    assert!(!args.contains("--dangerously-skip-permissions"), "{args}");
}
