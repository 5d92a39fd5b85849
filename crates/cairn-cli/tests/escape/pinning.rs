//! A node cannot change what will run. The run pins the texts of its
//! workflow's child workflows and scripts when it begins, so a child runs
//! the text its parent began with whatever the file says later; a `--watch`
//! reload that would loosen a wall is refused as unsafe; and the workflow
//! files inside the root are read-only to every node.
//!
//! The rewrites come from a node the workflow lets out of the sandbox
//! (`sandbox: { isolation: none }`): it stands for any way a node might
//! reach the file, and shows that pinning holds even then.

use super::common::{stderr_of, wait_exit};
use super::{dump, ended, node, sandbox_available, sh, Env};
use serde_json::Value;

/// Says `WALLED` when the store is out of sight (the sandbox is on), and
/// `OPEN` when it can read it.
const PROBE: &str = "if test -s .cairn/cairn.db; then echo OPEN; else echo WALLED; fi";

fn probe_node(id: &str, needs: &str) -> String {
    format!("  - id: {id}\n    needs: [{needs}]\n    command: [\"sh\", \"-c\", {PROBE:?}]\n")
}

/// A node out of the sandbox that writes `text` to `file` in the root,
/// then waits `settle` seconds.
fn rewriter(id: &str, file: &str, text: &str, settle: u32) -> String {
    let script = format!("printf '%s' \"$TEXT\" > {file} && sleep {settle}");
    format!(
        "  - id: {id}\n    sandbox: {{ isolation: none }}\n    env: {{ TEXT: {text:?} }}\n    command: [\"sh\", \"-c\", {script:?}]\n"
    )
}

fn output_of(events: &[Value], node: &str) -> String {
    events
        .iter()
        .find(|e| e["nodeId"] == node && e["type"] == "NodeFinished")
        .map(|e| e["output"].to_string())
        .unwrap_or_default()
}

#[test]
fn a_child_runs_the_text_pinned_when_its_parent_began() {
    if !sandbox_available() {
        return;
    }
    let env = Env::new();
    // The child writes what it saw to a file: an `output:` template would
    // be rendered in the rewriting node's environment.
    let verdict = format!("{{ {PROBE}; }} > child-verdict.txt");
    let child =
        format!("name: child\nnodes:\n  - id: probe\n    command: [\"sh\", \"-c\", {verdict:?}]\n");
    std::fs::write(env.root.join("child.yaml"), &child).unwrap();
    let loose = format!("name: child\nsandbox:\n  isolation: none\n{}", &child[12..]);
    let yaml = format!(
        "name: parent\nnodes:\n{}  - id: child\n    needs: [rewrite]\n    workflow: child.yaml\n",
        rewriter("rewrite", "child.yaml", &loose, 0)
    );
    let (status, err, events) = env.run(&yaml, "p1");
    let all = events
        .iter()
        .map(|e| e.to_string())
        .collect::<Vec<_>>()
        .join("\n");
    // The file did change: the child ran what was pinned, not this.
    assert_eq!(
        std::fs::read_to_string(env.root.join("child.yaml")).unwrap(),
        loose,
        "{status}: {err}\n{all}"
    );
    assert_eq!(
        ended(&events, "child"),
        "finished",
        "{status}: {err}\n{}",
        dump(&events, "child")
    );
    let out = std::fs::read_to_string(env.root.join("child-verdict.txt")).unwrap();
    assert_eq!(out, "WALLED\n", "the child ran outside its walls");
}

#[test]
fn a_reload_that_loosens_the_walls_is_refused_and_the_next_node_keeps_them() {
    if !sandbox_available() {
        return;
    }
    let env = Env::new();
    let body = |rewrite: &str| {
        format!(
            "name: watched\nnodes:\n{rewrite}{}",
            probe_node("probe", "rewrite")
        )
    };
    // The same workflow with the sandbox turned off.
    let loose_text = body(&rewriter("rewrite", "w1.yaml", "", 3)).replacen(
        "nodes:\n",
        "sandbox:\n  isolation: none\nnodes:\n",
        1,
    );
    let yaml = body(&rewriter("rewrite", "w1.yaml", &loose_text, 3));
    std::fs::write(env.root.join("w1.yaml"), &yaml).unwrap();
    let mut child = env.cairn(&["run", "w1.yaml", "--watch", "--run-id", "w1"]);
    let status = wait_exit(&mut child);
    let err = stderr_of(&mut child);
    let events = env.events("w1");
    let all = || {
        events
            .iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    };
    let unsafe_at = events
        .iter()
        .find(|e| e["type"] == "WorkflowReloadUnsafe")
        .unwrap_or_else(|| panic!("no WorkflowReloadUnsafe ({status}: {err}):\n{}", all()));
    assert!(
        unsafe_at["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("isolation"),
        "{unsafe_at}"
    );
    assert!(
        !events.iter().any(|e| e["type"] == "WorkflowReloaded"),
        "{}",
        all()
    );
    let probe_start = events
        .iter()
        .find(|e| e["nodeId"] == "probe" && e["type"] == "NodeStarted")
        .expect("probe started");
    assert!(
        unsafe_at["seq"].as_u64() < probe_start["seq"].as_u64(),
        "the reload was decided after the next node started: {}",
        all()
    );
    let out = output_of(&events, "probe");
    assert!(
        out.contains("WALLED"),
        "the next node ran outside its walls: {out}"
    );
}

#[test]
fn the_workflow_files_in_the_root_are_read_only_to_nodes() {
    if !sandbox_available() {
        return;
    }
    let env = Env::new();
    let child = "name: child\nnodes:\n  - id: v\n    value: 1\n";
    std::fs::write(env.root.join("child.yaml"), child).unwrap();
    let mut yaml = String::from("name: ro\nnodes:\n");
    let attacks = [
        ("own", "echo evil >> ro1.yaml"),
        ("child", "echo evil >> child.yaml"),
        ("replace", "echo evil > x && mv x child.yaml"),
        ("remove", "rm -f child.yaml && test ! -e child.yaml"),
    ];
    for kind in ["command", "bash"] {
        for (id, script) in attacks {
            yaml.push_str(&node(kind, id, &sh(script), true));
        }
        yaml.push_str(&node(kind, "control", &sh("echo ok > control.txt"), false));
    }
    for (id, path) in [("t_own", "ro1.yaml"), ("t_child", "child.yaml")] {
        yaml.push_str(&format!(
            "  - id: {id}\n    tool: write\n    args: {{ path: {path}, content: \"name: evil\" }}\n    on_failure: continue\n"
        ));
    }
    yaml.push_str("  - id: uses_child\n    workflow: child.yaml\n");
    let (status, err, events) = env.run(&yaml, "ro1");
    let mut problems = Vec::new();
    for prefix in ["c", "b"] {
        for (id, _) in attacks {
            let n = format!("{prefix}_{id}");
            if ended(&events, &n) != "failed" {
                problems.push(format!("{n} was not refused:\n{}", dump(&events, &n)));
            }
        }
        let n = format!("{prefix}_control");
        if ended(&events, &n) != "finished" {
            problems.push(format!("{n} did not work:\n{}", dump(&events, &n)));
        }
    }
    for n in ["t_own", "t_child"] {
        if ended(&events, n) != "failed" {
            problems.push(format!("{n} was not refused:\n{}", dump(&events, n)));
        }
    }
    let all = events
        .iter()
        .map(|e| e.to_string())
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        problems.is_empty(),
        "{}\n({status}: {err})\n{all}",
        problems.join("\n\n")
    );
    assert_eq!(
        std::fs::read_to_string(env.root.join("child.yaml")).unwrap(),
        child
    );
    assert_eq!(
        std::fs::read_to_string(env.root.join("ro1.yaml")).unwrap(),
        yaml
    );
}
