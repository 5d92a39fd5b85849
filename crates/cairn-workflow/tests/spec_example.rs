//! The examples of the workflow format's documentation parse and validate as written.

use std::path::Path;
use std::time::Duration;

use cairn_workflow::{load, parse, Backoff, NodeKind, OnFailure, OutputFormat, Workflow};
use serde_json::json;
use sha2::{Digest, Sha256};

fn fixture(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn triage() -> Workflow {
    load(&fixture("triage.yaml")).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn full_example_parses_with_every_field() {
    let wf = triage();
    assert_eq!(wf.name, "triage");
    assert_eq!(
        wf.description.as_deref(),
        Some("Summarise recent commits and publish them.")
    );
    assert_eq!(
        wf.input_schema,
        Some(
            json!({"type": "object", "required": ["repo"], "properties": {"repo": {"type": "string"}}})
        )
    );
    assert_eq!(wf.defaults.timeout, Some(Duration::from_secs(60)));
    let retry = wf.defaults.retry.as_ref().unwrap();
    assert_eq!(retry.attempts, 3);
    assert_eq!(retry.backoff, Backoff::Exponential);
    assert_eq!(retry.delay, Duration::from_secs(1));
    assert_eq!(retry.max_delay, Duration::from_secs(30));
    assert_eq!(wf.concurrency, Some(4));
    assert_eq!(wf.sandbox.root.as_deref(), Some("."));
    assert!(!wf.sandbox.network);
    assert_eq!(wf.sandbox.max_output_bytes, Some(200_000));
    assert_eq!(wf.sandbox.tool_timeout, Some(Duration::from_secs(60)));
    assert_eq!(wf.output.as_deref(), Some("{{ nodes.publish.output }}"));

    let ids: Vec<&str> = wf.nodes.iter().map(|n| n.id.as_str()).collect();
    assert_eq!(
        ids,
        ["log", "count", "gate", "publish", "review", "per_line"]
    );
    let kinds: Vec<&str> = wf.nodes.iter().map(|n| n.kind.name()).collect();
    assert_eq!(
        kinds,
        ["command", "value", "approval", "command", "loop", "for_each"]
    );

    let log = &wf.nodes[0];
    assert_eq!(
        log.kind,
        NodeKind::Command(
            [
                "git",
                "-C",
                "{{ input.repo }}",
                "log",
                "--oneline",
                "-n",
                "20"
            ]
            .map(String::from)
            .to_vec()
        )
    );
    assert_eq!(log.output, OutputFormat::Lines);
    assert_eq!(log.line, 20, "line of `- id: log` in the fixture");

    assert_eq!(wf.nodes[1].needs, ["log"]);
    assert_eq!(
        wf.nodes[1].kind,
        NodeKind::Value(json!({"entries": "{{ nodes.log.output | length }}"}).into())
    );
    assert_eq!(
        wf.nodes[2].kind,
        NodeKind::Approval("Publish {{ nodes.count.output.entries }} entries?".into())
    );
    let publish = &wf.nodes[3];
    assert_eq!(
        publish.if_.as_deref(),
        Some("nodes.count.output.entries | int > 0")
    );
    assert_eq!(publish.stage.as_deref(), Some("publish"));
    assert_eq!(publish.on_failure, OnFailure::Fail);

    match &wf.nodes[4].kind {
        NodeKind::Loop(l) => {
            assert_eq!(l.until, "nodes['review.check'].output.ok");
            assert_eq!(l.max_iterations, 5);
            assert_eq!(l.nodes.len(), 2);
            assert_eq!(l.nodes[1].needs, ["fix"]);
            assert_eq!(l.nodes[1].output, OutputFormat::Json);
            assert_eq!(l.nodes[0].line, 44, "line of `- id: fix`");
        }
        other => panic!("expected a loop, got {other:?}"),
    }
    match &wf.nodes[5].kind {
        NodeKind::ForEach(f) => {
            assert_eq!(f.list, "nodes.log.output");
            assert_eq!(f.as_name.as_deref(), Some("line"));
            assert_eq!(f.nodes[0].id, "show");
        }
        other => panic!("expected for_each, got {other:?}"),
    }
    assert_eq!(wf.nodes[5].kind.children().map(<[_]>::len), Some(1));
    assert_eq!(wf.nodes[0].kind.children(), None);
}

#[test]
fn path_base_dir_source_and_hash() {
    let wf = triage();
    let text = std::fs::read_to_string(fixture("triage.yaml")).unwrap();
    assert!(wf.path.is_absolute());
    assert_eq!(wf.base_dir, fixture(""));
    assert_eq!(wf.source, text);
    assert_eq!(wf.hash, hex::encode(Sha256::digest(text.as_bytes())));
}

#[test]
fn relative_path_is_made_absolute() {
    let text = std::fs::read_to_string(fixture("triage.yaml")).unwrap();
    let wf = parse(&text, Path::new("flows/triage.yaml")).unwrap();
    let cwd = std::env::current_dir().unwrap();
    assert_eq!(wf.path, cwd.join("flows/triage.yaml"));
    assert_eq!(wf.base_dir, cwd.join("flows"));
}

#[test]
fn tool_nodes_example_parses() {
    let wf = load(&fixture("tools.yaml")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        wf.nodes[0].kind,
        NodeKind::Tool {
            tool: "grep".into(),
            args: Box::new(json!({"pattern": "TODO", "path": "src"}))
        }
    );
    assert_eq!(
        wf.nodes[1].kind,
        NodeKind::Tool {
            tool: "bash".into(),
            args: Box::new(json!({"argv": ["cargo", "build"], "timeout": "10m"}))
        }
    );
}

#[test]
fn json_files_are_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flow.json");
    std::fs::write(
        &path,
        r#"{
  "name": "j",
  "nodes": [
    {"id": "a", "value": {"n": 1, "s": "{{ input.x }}"}},
    {"id": "b", "needs": ["a"], "command": ["echo", "hi"], "output": "text"}
  ]
}
"#,
    )
    .unwrap();
    let wf = load(&path).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(wf.nodes.len(), 2);
    assert_eq!(
        wf.nodes[0].kind,
        NodeKind::Value(json!({"n": 1, "s": "{{ input.x }}"}).into())
    );
    assert_eq!(wf.nodes[1].line, 5);
    assert_eq!(wf.base_dir, dir.path());
}

#[test]
fn input_is_checked_against_the_schema() {
    let wf = triage();
    wf.validate_input(&json!({"repo": "."})).unwrap();
    let err = wf.validate_input(&json!({"repo": 3})).unwrap_err();
    assert_eq!(err.violations.len(), 1);
    assert_eq!(err.violations[0].pointer, "/repo");
    let err = wf.validate_input(&json!({})).unwrap_err();
    assert_eq!(err.violations[0].pointer, "");
    assert!(err.to_string().contains("repo"), "{err}");
}

#[test]
fn without_schema_any_input_is_accepted() {
    let wf = parse(
        "name: n\nnodes:\n  - id: a\n    value: 1\n",
        Path::new("n.yaml"),
    )
    .unwrap();
    wf.validate_input(&json!([1, "x"])).unwrap();
}

#[test]
fn mermaid_has_groups_and_edges() {
    let m = triage().mermaid();
    assert!(m.starts_with("flowchart TD\n"), "{m}");
    assert!(m.contains("subgraph review["), "{m}");
    assert!(m.contains("review__fix --> review__check"), "{m}");
    assert!(m.contains("log --> per_line"), "{m}");
    assert!(m.contains("gate --> publish"), "{m}");
    // Every subgraph is closed.
    assert_eq!(
        m.matches("subgraph").count(),
        m.matches("\n    end\n").count()
    );
}

#[test]
fn mermaid_labels_a_switchs_branches_and_dots_a_handlers_edges() {
    let wf = cairn_workflow::parse(
        r#"
name: r
nodes:
  - id: route
    switch: {on: "'bug'", cases: {bug: [fix], feature: [plan, fix]}, default: [triage]}
  - {id: fix, needs: [route], value: 1}
  - {id: plan, needs: [route], value: 2}
  - {id: triage, needs: [route], value: 3}
  - {id: notify, needs: [fix], if: "failure()", value: 4}
"#,
        std::path::Path::new("r.yaml"),
    )
    .unwrap();
    let m = wf.mermaid();
    assert!(m.contains("route -->|\"bug, feature\"| fix\n"), "{m}");
    assert!(m.contains("route -->|\"default\"| triage\n"), "{m}");
    assert!(m.contains("fix -.->|\"failure()\"| notify\n"), "{m}");
}
