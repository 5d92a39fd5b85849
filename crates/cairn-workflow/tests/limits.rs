//! Hostile workflow files and values: alias bombs, deep nesting, huge files and deep inputs
//! are refused with a clear error, and everything up to the limits works, on a thread with
//! the default stack.

use std::path::Path;

use cairn_workflow::limits::{
    MAX_ALIAS_NODES, MAX_FILE_BYTES, MAX_GROUP_DEPTH, MAX_VALUE_DEPTH, MAX_YAML_DEPTH,
};
use cairn_workflow::{load, parse, Context, Problem, Templates, Workflow};
use serde_json::json;

fn parsed(text: &str) -> Result<Workflow, Vec<Problem>> {
    parse(text, Path::new("flow.yaml")).map_err(|e| e.problems)
}

/// The single problem of `text`.
#[track_caller]
fn problem(text: &str) -> Problem {
    let ps = parsed(text).expect_err("expected a problem");
    assert_eq!(ps.len(), 1, "{ps:#?}");
    ps.into_iter().next().unwrap()
}

/// Runs `f` on a new thread with the default stack (2 MiB, as tokio's and the test
/// harness's threads), so a recursion that outgrows it fails the test.
fn on_default_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(f).join().expect("no stack overflow")
}

/// The classic billion laughs: nine aliases per level, nine levels.
fn billion_laughs() -> String {
    let mut y = String::from("name: t\nx0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n");
    for i in 1..10 {
        let p = i - 1;
        y.push_str(&format!(
            "x{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
        ));
    }
    y.push_str("nodes:\n  - id: a\n    value: *a9\n");
    y
}

#[test]
fn an_alias_bomb_is_refused_where_it_goes_off() {
    let text = billion_laughs();
    assert!(text.len() < 600, "{} bytes", text.len());
    let p = problem(&text);
    let msg = p.to_string();
    assert!(
        msg.contains("alias expansion exceeds 100000 nodes"),
        "{msg}"
    );
    // The alias that crosses the budget: on `x5`, each alias copies 73,810 nodes.
    assert_eq!(p.line, Some(7), "{msg}");
    assert!(p.column.is_some(), "{msg}");
}

#[test]
fn aliases_within_the_budget_are_copied() {
    let text = "name: t\n\
        defaults:\n  retry: &r {attempts: 3, delay: 1s}\n\
        nodes:\n\
        \x20 - id: body\n    value: &v {a: [1, 2, {b: c}]}\n\
        \x20 - id: again\n    value: *v\n    retry: *r\n\
        \x20 - id: l1\n    loop:\n      until: \"true\"\n      max_iterations: 1\n      nodes: &body\n        - id: x\n          value: 1\n\
        \x20 - id: l2\n    loop:\n      until: \"true\"\n      max_iterations: 1\n      nodes: *body\n";
    let wf = parsed(text).unwrap();
    assert_eq!(wf.nodes[1].kind, wf.nodes[0].kind);
    assert_eq!(wf.nodes[1].retry.as_ref().unwrap().attempts, 3);
    assert_eq!(wf.nodes[3].kind.children(), wf.nodes[2].kind.children());
    assert_eq!(wf.nodes[3].kind.children().unwrap()[0].id, "x");

    // A large file may copy as many nodes as it holds itself, past the fixed budget.
    let uses = MAX_ALIAS_NODES / 3 + 1_000;
    let mut big = String::from("name: t\ndefaults:\n  retry: &r {attempts: 3}\nnodes:\n");
    for i in 0..uses {
        big.push_str(&format!("  - id: n{i}\n    value: {i}\n    retry: *r\n"));
    }
    assert_eq!(parsed(&big).unwrap().nodes.len(), uses);

    // But not more: 60 copies of a list of 2,000 in a file of about 3,000 nodes.
    let mut bomb = String::from("name: t\nnodes:\n  - id: a\n    value: &v [");
    bomb.push_str(&vec!["1"; 2_000].join(", "));
    bomb.push_str("]\n");
    for i in 0..60 {
        bomb.push_str(&format!("  - id: c{i}\n    value: {{w: *v}}\n"));
    }
    assert!(problem(&bomb).message.contains("alias expansion exceeds"));
}

/// `levels` loops nested in each other around one value node.
fn nested_loops(levels: usize) -> String {
    let mut y = String::from("name: t\nnodes:\n");
    let mut pad = String::from("  ");
    for _ in 0..levels {
        y.push_str(&format!(
            "{pad}- id: a\n{pad}  loop:\n{pad}    until: \"true\"\n{pad}    max_iterations: 1\n{pad}    nodes:\n"
        ));
        pad.push_str("      ");
    }
    y.push_str(&format!("{pad}- id: v\n{pad}  value: 1\n"));
    y
}

/// `levels` for_each groups nested in each other around one value node.
fn nested_for_each(levels: usize) -> String {
    let mut y = String::from("name: t\nnodes:\n");
    let mut pad = String::from("  ");
    for _ in 0..levels {
        y.push_str(&format!(
            "{pad}- id: e\n{pad}  for_each: \"[1]\"\n{pad}  nodes:\n"
        ));
        pad.push_str("    ");
    }
    y.push_str(&format!("{pad}- id: v\n{pad}  value: 1\n"));
    y
}

fn depth(nodes: &[cairn_workflow::NodeSpec]) -> usize {
    let mut d = 0;
    let mut cur = nodes;
    while let Some(children) = cur.first().and_then(|n| n.kind.children()) {
        d += 1;
        cur = children;
    }
    d
}

#[test]
fn groups_nest_up_to_the_limit_on_a_default_stack() {
    let wf = on_default_stack(|| parsed(&nested_loops(MAX_GROUP_DEPTH)).map(|w| depth(&w.nodes)));
    assert_eq!(wf.unwrap(), MAX_GROUP_DEPTH);
    let wf =
        on_default_stack(|| parsed(&nested_for_each(MAX_GROUP_DEPTH)).map(|w| depth(&w.nodes)));
    assert_eq!(wf.unwrap(), MAX_GROUP_DEPTH);
    // Dropping a deep workflow recurses too.
    on_default_stack(|| drop(parsed(&nested_loops(MAX_GROUP_DEPTH))));
}

#[test]
fn groups_nested_past_the_limit_are_refused() {
    let p = on_default_stack(|| problem(&nested_loops(MAX_GROUP_DEPTH + 1)));
    let msg = p.to_string();
    assert!(
        msg.contains("groups (loop, for_each) nested deeper than 200 levels"),
        "{msg}"
    );
    // The body list that is one too deep: line of its `nodes:` key's value.
    assert_eq!(p.line, Some(5 * (MAX_GROUP_DEPTH + 1) + 3), "{msg}");
    let field = p.field.unwrap();
    assert!(field.starts_with("nodes[0].loop.nodes[0].loop."), "{field}");
    assert!(field.ends_with(".loop.nodes"), "{field}");
    assert!(
        field.len() < 200,
        "the middle of a long path is left out: {field}"
    );

    let p = on_default_stack(|| problem(&nested_for_each(MAX_GROUP_DEPTH + 1)));
    assert!(p.message.contains("nested deeper than 200"), "{p}");
}

#[test]
fn yaml_nested_past_the_limit_is_refused_without_overflowing() {
    // Block sequences in each other on one line: `- - - - 1`.
    let deep = format!(
        "name: t\nnodes:\n  - id: a\n    value:\n      {}1\n",
        "- ".repeat(MAX_YAML_DEPTH + 10)
    );
    let p = on_default_stack(move || problem(&deep));
    assert!(
        p.message
            .contains(&format!("YAML nested deeper than {MAX_YAML_DEPTH} levels")),
        "{p}"
    );
    assert_eq!(p.line, Some(5), "{p}");
    assert_eq!(p.field.as_deref(), Some("nodes[0]"), "{p}");

    // Just under the limit, the tree is built, refused by the value limit, copied by an
    // alias and dropped, all on the default stack.
    let under = format!(
        "name: t\nnodes:\n  - id: a\n    value: &v\n      {}1\n  - id: b\n    value: *v\n",
        "- ".repeat(MAX_YAML_DEPTH - 10)
    );
    let ps = on_default_stack(move || parsed(&under).unwrap_err());
    assert_eq!(ps.len(), 2, "{ps:#?}");
    assert!(ps
        .iter()
        .all(|p| p.message.contains("nested deeper than 64")));

    // Flow collections: the YAML parser has its own limit, reported as a syntax error.
    let flow = format!(
        "name: t\nnodes:\n  - id: a\n    value: {}\n",
        "[".repeat(100_000)
    );
    let p = on_default_stack(move || problem(&flow));
    assert!(p.message.contains("YAML syntax error"), "{p}");
}

/// A value `levels` lists deep.
fn deep_list(levels: usize) -> String {
    format!("{}1{}", "[".repeat(levels), "]".repeat(levels))
}

#[test]
fn values_nest_up_to_the_limit() {
    let at = deep_list(MAX_VALUE_DEPTH);
    let text = format!(
        "name: t\ninput: {{type: object, properties: {{x: {{const: {}}}}}}}\nnodes:\n  - id: a\n    value: {at}\n  - id: t\n    tool: read\n    args: {{path: x, extra: {}}}\n",
        deep_list(MAX_VALUE_DEPTH - 3),
        deep_list(MAX_VALUE_DEPTH - 1)
    );
    let wf = parsed(&text).unwrap();
    assert_eq!(
        cairn_workflow::json_depth(&match &wf.nodes[0].kind {
            cairn_workflow::NodeKind::Value(v) => v.to_value(),
            _ => unreachable!(),
        }),
        MAX_VALUE_DEPTH
    );
}

#[test]
fn values_nested_past_the_limit_are_refused_with_their_field() {
    let past = deep_list(MAX_VALUE_DEPTH + 1);
    let p = problem(&format!(
        "name: t\nnodes:\n  - id: a\n    value: {{k: {past}}}\n"
    ));
    assert!(
        p.message
            .contains("nested deeper than 64 levels of lists and mappings"),
        "{p}"
    );
    assert_eq!(p.line, Some(4), "{p}");
    let field = p.field.unwrap();
    assert_eq!(
        field,
        format!("nodes[0].value.k{}", "[0]".repeat(MAX_VALUE_DEPTH - 1))
    );

    let p = problem(&format!(
        "name: t\nnodes:\n  - id: t\n    tool: read\n    args: {{path: {past}}}\n"
    ));
    assert!(p.field.unwrap().starts_with("nodes[0].args.path[0]"));

    let p = problem(&format!(
        "name: t\ninput: {{type: object, default: {past}}}\nnodes:\n  - id: a\n    value: 1\n"
    ));
    assert!(p.field.unwrap().starts_with("input.default[0]"));
    assert_eq!(p.line, Some(2));
}

fn nested_json(levels: usize) -> serde_json::Value {
    let mut v = json!(1);
    for _ in 0..levels {
        v = json!({ "a": v });
    }
    v
}

#[test]
fn a_run_input_past_the_limit_is_refused() {
    let wf = parsed("name: t\nnodes:\n  - id: a\n    value: 1\n").unwrap();
    wf.validate_input(&nested_json(MAX_VALUE_DEPTH)).unwrap();
    let e = wf
        .validate_input(&nested_json(MAX_VALUE_DEPTH + 1))
        .unwrap_err();
    assert_eq!(e.violations.len(), 1);
    assert_eq!(e.violations[0].pointer, "/a".repeat(MAX_VALUE_DEPTH));
    assert!(e.to_string().contains("more than the 64 allowed"), "{e}");
}

#[test]
fn a_rendered_value_past_the_limit_is_an_error() {
    let t = Templates::new();
    let ctx = Context::new(std::sync::Arc::new(json!({
        "ok": nested_json(MAX_VALUE_DEPTH - 1),
        "deep": nested_json(MAX_VALUE_DEPTH),
    })));
    // The value alone is at the limit; inside a list it is one past.
    t.render_value_in(&json!("{{ deep }}"), &ctx).unwrap();
    t.render_value_in(&json!(["{{ ok }}"]), &ctx).unwrap();
    let e = t.render_value_in(&json!(["{{ deep }}"]), &ctx).unwrap_err();
    assert!(e.to_string().contains("more than the 64 allowed"), "{e}");
    let e = t
        .render_value(
            &json!({"x": "{{ deep }}"}),
            &json!({"deep": nested_json(64)}),
        )
        .unwrap_err();
    assert!(e.to_string().contains("nested 65 levels deep"), "{e}");
}

#[test]
fn a_file_past_the_size_limit_is_refused_before_it_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("huge.yaml");
    // Sparse: no disk is written, and a read of it would take 64 MiB of memory.
    let f = std::fs::File::create(&path).unwrap();
    f.set_len(MAX_FILE_BYTES + 1).unwrap();
    drop(f);
    let e = load(&path).unwrap_err();
    assert_eq!(e.problems.len(), 1);
    let msg = e.to_string();
    assert!(msg.contains("the workflow file is too large"), "{msg}");
    assert!(msg.contains("67108865 bytes"), "{msg}");
    assert!(msg.contains("64 MiB"), "{msg}");
}

/// What templates refer to is checked with each list's ids looked up, not
/// scanned: a 50,000-node chain whose every node reads its need checks in
/// one pass (a scan per reference made this take hours), and as many
/// wrong names each get their problem with a bounded `did you mean`.
#[test]
fn the_reference_check_of_a_large_chain_stays_linear() {
    let n = 50_000;
    let mut ok = String::from("name: chain\nnodes:\n  - id: n0\n    value: 0\n");
    let mut bad = ok.clone();
    for i in 1..n {
        ok.push_str(&format!(
            "  - id: n{i}\n    needs: [n{}]\n    value: \"{{{{ nodes.n{}.output }}}}\"\n",
            i - 1,
            i - 1
        ));
        bad.push_str(&format!(
            "  - id: n{i}\n    needs: [n{}]\n    value: \"{{{{ nodes.x{i}.output }}}}\"\n",
            i - 1
        ));
    }
    let wf = cairn_workflow::parse(&ok, std::path::Path::new("/w/chain.yaml")).unwrap();
    assert_eq!(wf.nodes.len(), n);
    let e = cairn_workflow::parse(&bad, std::path::Path::new("/w/chain.yaml")).unwrap_err();
    assert_eq!(e.problems.len(), n - 1);
}
