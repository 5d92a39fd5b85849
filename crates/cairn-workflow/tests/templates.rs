//! Templates and expressions against a context shaped like the engine's.

use cairn_workflow::Templates;
use serde_json::{json, Value};

fn ctx() -> Value {
    json!({
        "input": {"repo": "/src/app", "n": 3, "tags": ["a", "b"]},
        "nodes": {
            "log": {"output": ["one", "two", "three"], "status": "finished", "attempt": 1},
            "count": {"output": {"entries": 3}, "status": "finished", "attempt": 2},
            "empty": {"output": {"entries": "0"}, "status": "finished", "attempt": 1},
            "review.check": {"output": {"ok": true}, "status": "finished", "attempt": 1}
        },
        "iteration": 2,
        "item": "two",
        "line": "two",
        "index": 1,
        "run": {"id": "run-1"},
        "workflow": {"name": "triage"}
    })
}

#[test]
fn templates_is_send_and_sync() {
    fn assert<T: Send + Sync>() {}
    assert::<Templates>();
}

#[test]
fn single_expression_yields_native_values() {
    let t = Templates::new();
    let c = ctx();
    assert_eq!(
        t.render("{{ nodes.log.output | length }}", &c).unwrap(),
        json!(3)
    );
    assert_eq!(
        t.render("  {{ input.tags }} ", &c).unwrap(),
        json!(["a", "b"])
    );
    assert_eq!(
        t.render("{{ nodes.count.output }}", &c).unwrap(),
        json!({"entries": 3})
    );
    assert_eq!(t.render("{{- input.n * 2 -}}", &c).unwrap(), json!(6));
    assert_eq!(
        t.render("{{ nodes['review.check'].output.ok }}", &c)
            .unwrap(),
        json!(true)
    );
    // Anything else is a string.
    assert_eq!(t.render("n={{ input.n }}", &c).unwrap(), json!("n=3"));
    assert_eq!(
        t.render("{{ input.n }}{{ input.n }}", &c).unwrap(),
        json!("33")
    );
    assert_eq!(t.render("plain text", &c).unwrap(), json!("plain text"));
}

#[test]
fn render_value_renders_nested_strings() {
    let t = Templates::new();
    let v = json!({
        "entries": "{{ nodes.log.output | length }}",
        "msg": ["{{ index }}: {{ line }}", 7, null, {"deep": "{{ run.id }}"}],
        "{{ keys }}": "are not templates"
    });
    assert_eq!(
        t.render_value(&v, &ctx()).unwrap(),
        json!({
            "entries": 3,
            "msg": ["1: two", 7, null, {"deep": "run-1"}],
            "{{ keys }}": "are not templates"
        })
    );
}

#[test]
fn strict_undefined_is_an_error() {
    let t = Templates::new();
    let c = ctx();
    let e = t.render_string("hello {{ nope }}", &c).unwrap_err();
    assert!(e.message.contains("undefined"), "{e}");
    assert_eq!(e.source_text, "hello {{ nope }}");
    assert!(t.render("{{ input.missing }}", &c).is_err());
    assert!(t.render_string("{{ nodes.log.outptu }}", &c).is_err());
    assert!(t.eval("nodes.nope.output", &c).is_err());
    assert!(t.eval_bool("input.missing", &c).is_err());
    // `default` still lets an author opt in to a fallback.
    assert_eq!(
        t.eval("input.missing | default('x')", &c).unwrap(),
        json!("x")
    );
}

#[test]
fn filters_and_expressions() {
    let t = Templates::new();
    let c = ctx();
    assert_eq!(
        t.render_string("{{ input.tags | join(',') | upper }}", &c)
            .unwrap(),
        "A,B"
    );
    let j = t.render_string("{{ input | tojson }}", &c).unwrap();
    assert_eq!(serde_json::from_str::<Value>(&j).unwrap(), c["input"]);
    // Objects keep the author's key order through native rendering.
    let v = t.render("{{ input }}", &c).unwrap();
    let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(keys, ["repo", "n", "tags"]);
    assert!(t
        .eval_bool("nodes.count.output.entries | int > 0", &c)
        .unwrap());
    assert!(!t
        .eval_bool("nodes.empty.output.entries | int > 0", &c)
        .unwrap());
    assert!(t.eval_bool("nodes['review.check'].output.ok", &c).unwrap());
    assert!(t
        .eval_bool("nodes.count.status == 'finished' and iteration >= 2", &c)
        .unwrap());
    assert_eq!(
        t.eval("nodes.log.output", &c).unwrap(),
        json!(["one", "two", "three"])
    );
    assert_eq!(
        t.eval("workflow.name ~ '/' ~ run.id", &c).unwrap(),
        json!("triage/run-1")
    );
    // Jinja truthiness: empty collections and strings are false.
    assert!(!t.eval_bool("[]", &c).unwrap());
    assert!(!t.eval_bool("''", &c).unwrap());
    assert!(t.eval_bool("input.tags", &c).unwrap());
    // No HTML escaping: output goes to argv and files.
    assert_eq!(
        t.render_string("{{ '<a & b>' }}", &json!({})).unwrap(),
        "<a & b>"
    );
}

#[test]
fn errors_carry_the_line_and_the_source() {
    let t = Templates::new();
    let src = "line one\nline two {{ a b }}\nline three";
    let e = t.check_template(src).unwrap_err();
    assert_eq!(e.line, Some(2), "{e}");
    assert_eq!(e.source_text, src);
    let shown = e.to_string();
    assert!(shown.contains("line 2"), "{shown}");
    assert!(shown.contains("line two {{ a b }}"), "{shown}");

    let src = "ok\n{{ nodes.missing.output }}";
    let e = t.render_string(src, &ctx()).unwrap_err();
    assert_eq!(e.line, Some(2), "{e}");

    let e = t.check_expr("a ==").unwrap_err();
    assert!(e.message.contains("syntax error"), "{e}");
    assert!(t.check_expr("").is_err());
    t.check_expr("nodes['review.check'].output.ok").unwrap();
    // Only `{{ … }}` is template syntax: Jinja's blocks and comments are text.
    t.check_template("{% for x in xs %}{{ x }}{% endfor %}")
        .unwrap();
    t.check_template("{% for x in xs %}").unwrap();
    assert!(t.check_template("a {{ x").is_err());
}

#[test]
fn filter_errors_are_template_errors() {
    let t = Templates::new();
    let e = t.eval("input.repo | int", &ctx()).unwrap_err();
    assert!(!e.message.is_empty());
    assert_eq!(e.source_text, "input.repo | int");
}

/// The shared, lazily read context gives the same results as a copied one.
#[test]
fn shared_context_matches_copied_context() {
    use cairn_workflow::Context;
    let t = Templates::new();
    let c = ctx();
    let shared = Context::new(std::sync::Arc::new(c.clone()));
    for tpl in [
        "{{ nodes.log.output | length }}",
        "{{ nodes['review.check'].output.ok }}",
        "{{ nodes.count.output }}",
        "{{ input }}",
        "{{ input.tags[-1] }}",
        "{{ input | tojson }}",
        "{{ nodes | dictsort | map(attribute='0') | join(';') }}",
        "{{ nodes.log.output | join(' ') }}",
        "{{ 'log' in nodes }}/{{ 'nope' in nodes }}",
        "{{ nodes.log.output | join('+') }} {{ input.tags | list }}",
        "{{ index }}: {{ line }}",
    ] {
        assert_eq!(
            t.render_in(tpl, &shared).unwrap(),
            t.render(tpl, &c).unwrap(),
            "{tpl}"
        );
    }
    for expr in [
        "nodes.count.output.entries | int > 0",
        "nodes.empty.output.entries | int > 0",
        "input.tags",
        "nodes.nothing",
    ] {
        assert_eq!(
            t.eval_bool_in(expr, &shared).ok(),
            t.eval_bool(expr, &c).ok(),
            "{expr}"
        );
    }
    assert!(t.render_string_in("{{ nope }}", &shared).is_err());
    assert!(t.eval_in("input.missing", &shared).is_err());
    let v = json!({"a": ["{{ run.id }}", {"b": "{{ input.n + 1 }}"}]});
    assert_eq!(
        t.render_value_in(&v, &shared).unwrap(),
        t.render_value(&v, &c).unwrap()
    );
    let keys: Vec<String> = t
        .eval_in("input", &shared)
        .unwrap()
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    assert_eq!(keys, ["repo", "n", "tags"]);
}

/// A scoped context reads like the copied context a group member would get:
/// the shared map, plus its siblings under their plain ids.
#[test]
fn scoped_context_matches_copied_context_with_siblings() {
    use cairn_workflow::Context;
    let t = Templates::new();
    let nodes = json!({
        "log": { "output": ["a", "b"], "status": "finished", "attempt": 1 },
        "fix": { "output": "top", "status": "finished", "attempt": 1 },
        "review.fix": { "output": 3, "status": "finished", "attempt": 2 },
        "review.deep.x": { "output": 9, "status": "finished", "attempt": 1 },
        "per[0].show": { "output": "zero", "status": "finished", "attempt": 1 },
    });
    let mut vars = serde_json::Map::new();
    vars.insert("input".into(), json!({ "n": 1 }));
    vars.insert("iteration".into(), json!(2));
    vars.insert("item".into(), json!("it"));
    let scoped = Context::scoped(
        vars.clone(),
        "nodes",
        std::sync::Arc::new(nodes.clone()),
        "review.",
    );
    // The copy the engine made before: every node, then the siblings by plain id.
    let mut copied_nodes = nodes.as_object().unwrap().clone();
    copied_nodes.insert("fix".into(), nodes["review.fix"].clone());
    let mut copied = vars.clone();
    copied.insert("nodes".into(), serde_json::Value::Object(copied_nodes));
    let copied = serde_json::Value::Object(copied);
    for tpl in [
        "{{ nodes.fix.output }}",
        "{{ nodes['review.fix'].attempt }}",
        "{{ nodes['review.deep.x'].output }}",
        "{{ nodes.log.output | join('+') }}",
        "{{ nodes['per[0].show'].output }}",
        "{{ iteration }} {{ item }} {{ input.n + 1 }}",
        "{{ 'fix' in nodes }}/{{ 'deep.x' in nodes }}/{{ 'nope' in nodes }}",
        "{{ nodes | sort | join(';') }}",
    ] {
        assert_eq!(
            t.render_in(tpl, &scoped).unwrap(),
            t.render(tpl, &copied).unwrap(),
            "{tpl}"
        );
    }
    assert!(t.eval_in("nodes.nope", &scoped).is_err());
    assert!(t.eval_in("nope", &scoped).is_err());
    // Without a prefix, a plain id is the top-level node.
    let top = Context::scoped(vars, "nodes", std::sync::Arc::new(nodes), "");
    assert_eq!(t.eval_in("nodes.fix.output", &top).unwrap(), json!("top"));
}

/// The engine's `nodes` (entries, not JSON objects) reads exactly as the
/// JSON map it replaced, siblings by plain id and walk order included.
#[test]
fn node_entries_read_as_the_json_map() {
    use cairn_workflow::{Context, NodeEntries, NodeEntry};
    use std::sync::Arc;
    let t = Templates::new();
    let nodes = json!({
        "log": { "output": ["a", "b"], "status": "finished", "attempt": 1, "error": null },
        "fix": { "output": "top", "status": "finished", "attempt": 1, "error": null },
        "review.fix": { "output": { "n": 3, "deep": [1, { "x": 2 }] }, "status": "failed", "attempt": 2,
                        "error": { "kind": "exit", "message": "exit code 1" } },
        "per[0].show": { "output": null, "status": "skipped", "attempt": 0, "error": null },
    });
    let mut entries = NodeEntries::new();
    for (k, v) in nodes.as_object().unwrap() {
        let status = match v["status"].as_str().unwrap() {
            "finished" => "finished",
            "failed" => "failed",
            _ => "skipped",
        };
        entries.insert(
            Arc::from(k.as_str()),
            NodeEntry {
                output: v["output"].clone().into(),
                status,
                attempt: v["attempt"].as_u64().unwrap() as u32,
                error: v["error"].as_object().map(|e| {
                    Box::new(cairn_events::ErrorInfo::new(
                        e["kind"].as_str().unwrap(),
                        e["message"].as_str().unwrap(),
                    ))
                }),
                iteration: 0,
            },
        );
    }
    let vars = serde_json::Map::new();
    let json_ctx = Context::scoped(vars.clone(), "nodes", Arc::new(nodes), "review.");
    let entry_ctx = Context::scoped_nodes(vars, "nodes", Arc::new(entries), "review.");
    for tpl in [
        "{{ nodes.fix.output }}",
        "{{ nodes['review.fix'].output.deep[1].x }}",
        "{{ nodes.fix.attempt }} {{ nodes.fix.status }}",
        "{{ nodes.log.output | join('+') }}",
        "{{ nodes['per[0].show'].output is none }}",
        "{{ nodes['review.fix'].error.message }} {{ nodes.fix.error is none }}",
        "{{ nodes.fix | tojson }}",
        "{{ nodes.log }}",
        "{{ 'fix' in nodes }}/{{ 'nope' in nodes }}",
        "{{ nodes | list | join(';') }}",
        "{{ nodes['review.fix'] | items | list }}",
    ] {
        assert_eq!(
            t.render_in(tpl, &entry_ctx).unwrap(),
            t.render_in(tpl, &json_ctx).unwrap(),
            "{tpl}"
        );
    }
    assert!(t.eval_in("nodes.nope", &entry_ctx).is_err());
    assert!(t.eval_in("nodes.fix.nope", &entry_ctx).is_err());
}

/// Only `{{ … }}` is template syntax: shell code with `{%`, `{#`, `%}` and
/// `#}` passes through a template as it was written.
#[test]
fn shell_text_passes_through_untouched() {
    let t = Templates::new();
    let c = ctx();
    for text in [
        "echo ${#N}",
        "printf '{%s}' x",
        "echo $((1 + 2)) {# not a comment #} {% not a block %}",
        "awk '{ print $1 }'",
        "a } b }} c",
        "{#}",
    ] {
        t.check_template(text).unwrap();
        assert_eq!(t.render_string(text, &c).unwrap(), text);
        assert_eq!(t.render(text, &c).unwrap(), json!(text));
    }
    assert_eq!(
        t.render_string("n=${#N}; echo {{ input.repo }} {%s}", &c)
            .unwrap(),
        "n=${#N}; echo /src/app {%s}"
    );
    // A `}}` inside a string literal or closing a nested map is part of
    // the expression.
    assert_eq!(t.render("{{ '}}' }}", &c).unwrap(), json!("}}"));
    assert_eq!(
        t.render("{{ {'a': {'b': 1}} }}", &c).unwrap(),
        json!({"a": {"b": 1}})
    );
    assert_eq!(
        t.render_string("x {{ \"a\\\"}}\" }} y", &c).unwrap(),
        "x a\"}} y"
    );
    // Whitespace control trims around the expression.
    assert_eq!(
        t.render_string("a   {{- input.n -}}   b", &c).unwrap(),
        "a3b"
    );
    // Whitespace around one expression keeps its native value.
    assert_eq!(t.render("  {{ input.n }}\n", &c).unwrap(), json!(3));
}

/// A template error names the line and column of the `{{` it is in.
#[test]
fn an_unclosed_or_empty_expression_is_refused_with_its_place() {
    let t = Templates::new();
    let e = t.check_template("ok\n  x {{ input.repo").unwrap_err();
    assert_eq!((e.line, e.column), (Some(2), Some(5)), "{e}");
    assert!(e.message.contains("never closed"), "{e}");
    let e = t.check_template("a {{ }} b").unwrap_err();
    assert!(e.message.contains("empty"), "{e}");
    let e = t
        .render_string("one\ntwo {{ nodes.log.outptu }}", &ctx())
        .unwrap_err();
    assert_eq!((e.line, e.column), (Some(2), Some(5)), "{e}");
    assert!(e.to_string().contains("line 2, column 5"), "{e}");
}

/// An `if` that calls a status function is a handler's; its context
/// answers the calls.
#[test]
fn status_functions_answer_how_the_needs_ended() {
    use cairn_workflow::{Context, NeedsEnded};
    let t = Templates::new();
    assert!(t.calls_status("failure()"));
    assert!(t.calls_status("always() and input.n > 1"));
    assert!(t.calls_status("not success()"));
    assert!(!t.calls_status("nodes.a.status == 'failed'"));
    assert!(!t.calls_status("failure"));
    assert!(!t.calls_status("a =="));
    let c = Context::new(std::sync::Arc::new(ctx()));
    let failed = c.with_status(NeedsEnded {
        failure: true,
        ..NeedsEnded::default()
    });
    assert!(t.eval_bool_in("failure()", &failed).unwrap());
    assert!(!t.eval_bool_in("success()", &failed).unwrap());
    assert!(!t.eval_bool_in("cancelled()", &failed).unwrap());
    assert!(t.eval_bool_in("always()", &failed).unwrap());
    assert!(t
        .eval_bool_in("failure() and input.n == 3", &failed)
        .unwrap());
    assert!(t.eval_bool_in("success()", &c).is_err());
}
