//! `cairn replay`: a recorded run replayed through the real binary, its
//! model a fake OpenAI-compatible server in this process that counts the
//! requests it gets. The same workflow replays with no request at all;
//! a changed prompt is the divergence, reported with its diff; `--live`
//! asks the model only from there; `--tools recorded` runs no tool; and
//! the person's decision comes from the record. No replay touches the
//! folder the original ran in.

mod common;
use common::*;

use cairn_agent::testing::{FakeProvider, Recorded, Reply};
use cairn_events::EventKind;
use serde_json::{json, Value};

/// Answers by the conversation: a `bash` call that writes note.txt when
/// the conversation holds no answer yet and offers tools, else a text
/// that repeats the first user message (so that a changed prompt changes
/// the output).
fn model(r: &Recorded) -> Reply {
    let messages = r.body["messages"].as_array().cloned().unwrap_or_default();
    let answered = messages.iter().filter(|m| m["role"] == "assistant").count();
    let prompt = messages
        .iter()
        .find(|m| m["role"] == "user")
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_string();
    let has_tools = r.body["tools"].as_array().is_some_and(|t| !t.is_empty());
    let mut events = Vec::new();
    if has_tools && answered == 0 {
        let args = json!({"argv": ["sh", "-c", "echo from-the-agent > note.txt && cat note.txt"]})
            .to_string();
        events.push(
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "c1",
                "type": "function", "function": {"name": "bash", "arguments": args}}]},
                "finish_reason": "tool_calls"}]})
            .to_string(),
        );
    } else {
        for piece in ["answer ", "to: ", prompt.as_str()] {
            events
                .push(json!({"choices": [{"index": 0, "delta": {"content": piece}}]}).to_string());
        }
        events.push(
            json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}).to_string(),
        );
    }
    events.push(
        json!({"choices": [], "usage": {"prompt_tokens": 50 + answered as u64, "completion_tokens": 5}})
            .to_string(),
    );
    events.push("[DONE]".into());
    Reply::sse(events)
}

fn workflow(url: &str, write_prompt: &str) -> String {
    format!(
        r#"
name: replayed
models:
  m: {{ provider: openai, model: gpt-4o, base_url: "{url}", idle_timeout: 10s }}
nodes:
  - id: gather
    agent:
      model: m
      prompt: Write the note.
      tools: [bash]
  - id: gate
    needs: [gather]
    approval: "Write it up?"
  - id: write
    needs: [gate]
    agent:
      model: m
      prompt: "{write_prompt} {{{{ nodes.gather.output }}}}"
output: "{{{{ nodes.write.output }}}}"
"#
    )
}

fn report(out: &std::process::Output) -> Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(last).unwrap_or_else(|e| panic!("no report ({e}): {stdout}"))
}

fn output_of(dir: &std::path::Path, run: &str) -> Option<Value> {
    events(dir, run).iter().find_map(|e| match &e.kind {
        EventKind::RunFinished { output, .. } => output.clone(),
        _ => None,
    })
}

#[test]
fn a_recorded_run_replays_without_the_model_and_a_changed_prompt_is_the_divergence() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = rt.block_on(FakeProvider::start());
    server.respond_with(model);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::write(dir.join("wf.yaml"), workflow(&server.url(), "Summarize:")).unwrap();

    // The original: the gate waits for a person, who approves.
    let out = cairn(
        dir,
        &["run", "wf.yaml", "--run-id", "orig", "--exit-on-wait"],
    );
    expect_code(&out, 3);
    expect_code(
        &cairn(dir, &["approve", "orig", "gate", "--by", "alice"]),
        0,
    );
    expect_code(&cairn(dir, &["resume", "orig"]), 0);
    let asked = server.requests().len();
    assert_eq!(asked, 3, "two steps of gather, one of write");
    let original = output_of(dir, "orig").expect("the original's output");
    assert_eq!(
        original,
        json!("answer to: Summarize: answer to: Write the note.")
    );
    // A person edits the file the run wrote: no replay may touch it.
    std::fs::write(dir.join("note.txt"), "the person's edit\n").unwrap();

    // The same workflow: every answer from the record, none from the model.
    let out = cairn(dir, &["replay", "orig", "--run-id", "same", "--json"]);
    expect_code(&out, 0);
    assert_eq!(server.requests().len(), asked, "a replay asked the model");
    let r = report(&out);
    assert_eq!(r["stepsReplayed"], 3, "{r}");
    assert_eq!(r["stepsNew"], 0, "{r}");
    assert!(r["divergence"].is_null(), "{r}");
    assert_eq!(r["sameOutput"], true, "{r}");
    assert_eq!(output_of(dir, "same"), Some(original.clone()));
    let evs = events(dir, "same");
    let EventKind::RunStarted { replay_of, .. } = &evs[0].kind else {
        panic!("no RunStarted first")
    };
    assert_eq!(replay_of.as_ref().unwrap().run_id.as_str(), "orig");
    // The decision came from the record, in the replay's own log.
    assert!(evs.iter().any(|e| matches!(&e.kind,
        EventKind::ApprovalGranted { decided_by: Some(by), .. } if by == "replay of orig")));
    // Its tools ran for real, in its own copy of the root.
    assert_eq!(
        std::fs::read_to_string(dir.join(".cairn/replays/same/note.txt")).unwrap(),
        "from-the-agent\n"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("note.txt")).unwrap(),
        "the person's edit\n"
    );

    // A changed prompt: the steps before it replay, the changed request
    // is the divergence, and the replay stops there (exit 6).
    std::fs::write(dir.join("wf2.yaml"), workflow(&server.url(), "Sum up:")).unwrap();
    let out = cairn(
        dir,
        &[
            "replay",
            "orig",
            "--workflow",
            "wf2.yaml",
            "--run-id",
            "changed",
            "--json",
        ],
    );
    expect_code(&out, 6);
    assert_eq!(server.requests().len(), asked, "a replay asked the model");
    let r = report(&out);
    let d = &r["divergence"];
    assert_eq!(d["nodeId"], "write", "{r}");
    assert_eq!(d["step"], 1, "{r}");
    assert_eq!(d["kind"], "request", "{r}");
    assert_eq!(r["stopped"], true, "{r}");
    assert_eq!(r["stepsReplayed"], 2, "{r}");
    let diff = d["request"]["messages"][0]["diff"].as_str().unwrap();
    assert!(
        diff.contains("-Summarize: answer to: Write the note.")
            && diff.contains("+Sum up: answer to: Write the note."),
        "{diff}"
    );
    let nodes = r["nodes"].as_array().unwrap();
    let node = |id: &str| nodes.iter().find(|n| n["nodeId"] == id).unwrap().clone();
    assert_eq!(node("gather")["same"], true, "{r}");
    assert_eq!(node("write")["status"]["replay"], "failed", "{r}");

    // Live: only the changed node asks the model, once, and the run ends.
    let out = cairn(
        dir,
        &[
            "replay",
            "orig",
            "--workflow",
            "wf2.yaml",
            "--live",
            "--run-id",
            "live",
            "--json",
        ],
    );
    expect_code(&out, 0);
    assert_eq!(server.requests().len(), asked + 1);
    let r = report(&out);
    assert_eq!(r["stepsReplayed"], 2, "{r}");
    assert_eq!(r["stepsNew"], 1, "{r}");
    assert_eq!(r["divergence"]["nodeId"], "write", "{r}");
    assert_eq!(r["sameOutput"], false, "{r}");
    assert_eq!(
        output_of(dir, "live"),
        Some(json!("answer to: Sum up: answer to: Write the note."))
    );

    // Recorded tools: the bash call answers as it did and never runs.
    let out = cairn(
        dir,
        &[
            "replay", "orig", "--tools", "recorded", "--run-id", "rec", "--json",
        ],
    );
    expect_code(&out, 0);
    assert_eq!(server.requests().len(), asked + 1);
    assert_eq!(output_of(dir, "rec"), Some(original));
    assert!(dir.join(".cairn/replays/rec").is_dir());
    assert!(!dir.join(".cairn/replays/rec/note.txt").exists());

    // An unknown original is bad input.
    expect_code(&cairn(dir, &["replay", "nope"]), 4);

    // A bundle: exported here, replayed in a fresh folder with a fresh
    // store once the original's folder is gone; the same output, and no
    // request.
    let out = cairn(dir, &["export", "--bundle", "orig", "-o", "orig.bundle"]);
    expect_code(&out, 0);
    let bundle = std::fs::read(dir.join("orig.bundle")).unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let there = elsewhere.path();
    std::fs::write(there.join("orig.bundle"), &bundle).unwrap();
    drop(tmp);
    let out = cairn(
        there,
        &["replay", "orig.bundle", "--run-id", "there", "--json"],
    );
    expect_code(&out, 0);
    assert_eq!(
        server.requests().len(),
        asked + 1,
        "a replay asked the model"
    );
    let r = report(&out);
    assert_eq!(r["sameOutput"], true, "{r}");
    assert_eq!(output_of(there, "there"), output_of(there, "orig"));
    assert_eq!(
        std::fs::read_to_string(there.join(".cairn/replays/there/note.txt")).unwrap(),
        "from-the-agent\n"
    );
    // Read again: taken as read.
    expect_code(
        &cairn(there, &["replay", "orig.bundle", "--run-id", "again"]),
        0,
    );
    // A bundle cut short or changed is refused, nothing written.
    let cut = &bundle[..bundle.len() - 20];
    std::fs::write(there.join("cut.bundle"), cut).unwrap();
    let fresh = tempfile::tempdir().unwrap();
    std::fs::write(fresh.path().join("cut.bundle"), cut).unwrap();
    let out = cairn(fresh.path(), &["replay", "cut.bundle"]);
    expect_code(&out, 4);
    let text = String::from_utf8_lossy(&bundle).replace("Write the note.", "Write the nose.");
    std::fs::write(fresh.path().join("changed.bundle"), text).unwrap();
    let out = cairn(fresh.path(), &["replay", "changed.bundle"]);
    expect_code(&out, 4);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("its end does not match"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // A suite: the same bundle twice, judged two ways, against the
    // workflows as they are now.
    let suite = there.join("suite");
    std::fs::create_dir_all(suite.join("nested")).unwrap();
    std::fs::write(suite.join("same.bundle"), &bundle).unwrap();
    std::fs::write(suite.join("nested/changed.bundle"), &bundle).unwrap();
    std::fs::write(suite.join("wf2.yaml"), workflow(&server.url(), "Sum up:")).unwrap();
    std::fs::write(
        suite.join("same.expect.yaml"),
        "expect:\n  output: \"answer to: Summarize: answer to: Write the note.\"\n",
    )
    .unwrap();
    std::fs::write(
        suite.join("nested/changed.expect.yaml"),
        "workflow: ../wf2.yaml\nexpect:\n  output_schema: {type: string, pattern: \"^answer\"}\n",
    )
    .unwrap();
    let out = cairn(there, &["test", "suite", "--junit", "junit.xml", "--json"]);
    expect_code(&out, 6);
    let s: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(s["passed"], 1, "{s}");
    assert_eq!(s["failed"], 1, "{s}");
    let tests = s["tests"].as_array().unwrap();
    let changed = tests.iter().find(|t| t["name"] == "changed").unwrap();
    assert!(
        changed["failures"][0]
            .as_str()
            .unwrap()
            .starts_with("diverged"),
        "{changed}"
    );
    let junit = std::fs::read_to_string(there.join("junit.xml")).unwrap();
    assert!(
        junit.contains("<testsuite name=\"cairn\" tests=\"2\" failures=\"1\""),
        "{junit}"
    );
    assert!(junit.contains("<failure message=\"diverged"), "{junit}");
    // Live, the changed prompt passes its schema; the model is asked once.
    std::fs::write(
        suite.join("nested/changed.expect.yaml"),
        "workflow: ../wf2.yaml\nlive: true\nexpect:\n  output_schema: {type: string, pattern: \"^answer\"}\n",
    )
    .unwrap();
    let before = server.requests().len();
    let out = cairn(there, &["test", "suite", "--concurrency", "2"]);
    expect_code(&out, 0);
    assert_eq!(server.requests().len(), before + 1);
    // A bad expectation is bad input, naming its file and field.
    std::fs::write(
        suite.join("same.expect.yaml"),
        "expect:\n  scores: {judge: high}\n",
    )
    .unwrap();
    let out = cairn(there, &["test", "suite"]);
    expect_code(&out, 4);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("same.expect.yaml") && err.contains("expect.scores.judge"),
        "{err}"
    );
    drop(server);
    drop(rt);
}
