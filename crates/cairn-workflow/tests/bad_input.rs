//! Bad workflow files: each problem is reported with its line, column and field path, and
//! every problem in a file is reported, not only the first.

use cairn_workflow::{load, Problem};

/// Writes `text` to a real file and returns the problems loading it reports.
fn problems(text: &str) -> Vec<Problem> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flow.yaml");
    std::fs::write(&path, text).unwrap();
    match load(&path) {
        Ok(_) => panic!("expected problems in:\n{text}"),
        Err(e) => {
            assert!(e.problems.iter().all(|p| p.file == path));
            e.problems
        }
    }
}

/// Asserts there is exactly one problem, at `line:col`, on `field`, saying `needle`.
#[track_caller]
fn one(text: &str, line: usize, col: usize, field: Option<&str>, needle: &str) -> Problem {
    let ps = problems(text);
    assert_eq!(ps.len(), 1, "expected one problem, got {ps:#?}");
    let p = ps.into_iter().next().unwrap();
    assert_eq!((p.line, p.column), (Some(line), Some(col)), "{p}");
    assert_eq!(p.field.as_deref(), field, "{p}");
    assert!(
        p.to_string().contains(needle),
        "`{p}` does not contain `{needle}`"
    );
    p
}

const HEAD: &str = "name: t\nnodes:\n";

#[test]
fn yaml_syntax_error_has_position() {
    one(
        "name: t\nnodes:\n  - id: a\n    value: \"open\n",
        4,
        12,
        None,
        "YAML syntax error",
    );
    let ps = problems("name: t\nnodes:\n  - id: a\n    approval: ok\n  bad: 1\n");
    assert_eq!(ps[0].line, Some(5));
}

#[test]
fn json_syntax_error_has_position() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flow.json");
    std::fs::write(
        &path,
        "{\n  \"name\": \"t\",\n  \"nodes\": [\n    {\"id\": \"a\" \"value\": 1}\n  ]\n}\n",
    )
    .unwrap();
    let e = load(&path).unwrap_err();
    assert_eq!(e.problems[0].line, Some(4), "{e}");
}

#[test]
fn unknown_top_level_field_lists_the_allowed_ones() {
    let p = one(
        &format!("{HEAD}  - id: a\n    value: 1\ndescripton: x\n"),
        5,
        1,
        Some("descripton"),
        "unknown field `descripton`",
    );
    let hint = p.hint.unwrap();
    assert!(hint.contains("did you mean `description`?"), "{hint}");
    assert!(
        hint.contains("name, description, input, defaults"),
        "{hint}"
    );
}

#[test]
fn unknown_fields_in_nested_mappings() {
    one(
        &format!("{HEAD}  - id: a\n    value: 1\n    retry: {{ attempts: 2, jitter: 1 }}\n"),
        5,
        27,
        Some("nodes[0].retry.jitter"),
        "allowed fields in retry: attempts, backoff, delay, max_delay",
    );
    one(
        &format!("sandbox:\n  netwrk: true\n{HEAD}  - id: a\n    value: 1\n"),
        2,
        3,
        Some("sandbox.netwrk"),
        "did you mean `network`?",
    );
    one(
        &format!("defaults:\n  timout: 1s\n{HEAD}  - id: a\n    value: 1\n"),
        2,
        3,
        Some("defaults.timout"),
        "unknown field",
    );
    one(
        &format!("{HEAD}  - id: l\n    loop:\n      until: \"true\"\n      max_iterations: 2\n      maxiter: 3\n      nodes:\n        - id: a\n          value: 1\n"),
        7,
        7,
        Some("nodes[0].loop.maxiter"),
        "allowed fields in loop: until, max_iterations, nodes",
    );
    one(
        &format!("{HEAD}  - id: a\n    value: 1\n    colour: red\n"),
        5,
        5,
        Some("nodes[0].colour"),
        "unknown field `colour`",
    );
}

#[test]
fn bad_names_and_ids() {
    one(
        "name: Triage\nnodes:\n  - id: a\n    value: 1\n",
        1,
        7,
        Some("name"),
        "not a valid workflow name",
    );
    one(
        &format!("{HEAD}  - id: a.b\n    value: 1\n"),
        3,
        9,
        Some("nodes[0].id"),
        "not a valid node id",
    );
    one(
        &format!("{HEAD}  - id: \"x[1]\"\n    value: 1\n"),
        3,
        9,
        Some("nodes[0].id"),
        "not a valid node id",
    );
    one(
        &format!("{HEAD}  - id: a\n    value: 1\n  - id: a\n    value: 2\n"),
        5,
        9,
        Some("nodes[1].id"),
        "duplicate node id `a`",
    );
    one(
        "nodes:\n  - id: a\n    value: 1\n",
        1,
        1,
        Some("name"),
        "missing required field `name`",
    );
}

#[test]
fn same_id_in_different_groups_is_fine() {
    let text = format!("{HEAD}  - id: a\n    value: 1\n  - id: g\n    for_each: \"[1, 2]\"\n    nodes:\n      - id: a\n        value: 2\n");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ok.yaml");
    std::fs::write(&path, text).unwrap();
    load(&path).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn kind_keys_zero_or_two() {
    one(
        &format!("{HEAD}  - id: a\n    needs: []\n"),
        3,
        5,
        Some("nodes[0]"),
        "node has no kind",
    );
    one(
        &format!("{HEAD}  - id: a\n    command: [\"x\"]\n    value: 2\n"),
        3,
        5,
        Some("nodes[0]"),
        "`command` and `value`",
    );
}

#[test]
fn needs_must_name_a_sibling_with_a_suggestion() {
    let p = one(
        &format!("{HEAD}  - id: log\n    value: 1\n  - id: lp\n    value: 1\n  - id: count\n    needs: [lgo]\n    value: 2\n"),
        8,
        13,
        Some("nodes[2].needs"),
        "`lgo` is not a node in this group (did you mean `log`?)",
    );
    assert!(
        p.to_string().contains("flow.yaml:8:13: nodes[2].needs:"),
        "{p}"
    );
    // Inside a group, only siblings count: the outer `log` is not visible by id.
    one(
        &format!("{HEAD}  - id: log\n    value: 1\n  - id: review\n    loop:\n      until: \"true\"\n      max_iterations: 2\n      nodes:\n        - id: fix\n          needs: [log]\n          value: 1\n"),
        11,
        19,
        Some("nodes[1].loop.nodes[0].needs"),
        "`log` is not a node in this group",
    );
    one(
        &format!("{HEAD}  - id: a\n    needs: [a]\n    value: 1\n"),
        4,
        13,
        Some("nodes[0].needs"),
        "cannot need itself",
    );
}

#[test]
fn cycles_are_named() {
    one(
        &format!("{HEAD}  - id: a\n    needs: [c]\n    value: 1\n  - id: b\n    needs: [a]\n    value: 1\n  - id: c\n    needs: [b]\n    value: 1\n"),
        4,
        13,
        Some("nodes[0].needs"),
        "cycle in needs: a -> c -> b -> a",
    );
}

#[test]
fn bad_durations_and_retry() {
    one(
        &format!("{HEAD}  - id: a\n    value: 1\n    timeout: 5 minutes\n"),
        5,
        14,
        Some("nodes[0].timeout"),
        "`5 minutes` is not a duration",
    );
    one(
        &format!("{HEAD}  - id: a\n    value: 1\n    retry:\n      attempts: 0\n"),
        6,
        17,
        Some("nodes[0].retry.attempts"),
        "at least 1",
    );
    one(
        &format!("defaults:\n  retry: {{ backoff: linear }}\n{HEAD}  - id: a\n    value: 1\n"),
        2,
        21,
        Some("defaults.retry.backoff"),
        "use `fixed` or `exponential`",
    );
    one(
        &format!("sandbox:\n  tool_timeout: 1d\n{HEAD}  - id: a\n    value: 1\n"),
        2,
        17,
        Some("sandbox.tool_timeout"),
        "not a duration",
    );
}

#[test]
fn loop_needs_until_and_positive_max_iterations() {
    let ps = problems(&format!(
        "{HEAD}  - id: l\n    loop:\n      max_iterations: 0\n      nodes:\n        - id: a\n          value: 1\n"
    ));
    assert_eq!(ps.len(), 2, "{ps:#?}");
    assert_eq!(ps[0].field.as_deref(), Some("nodes[0].loop.until"));
    assert_eq!(ps[0].line, Some(5));
    assert!(ps[0].message.contains("missing required field `until`"));
    assert_eq!(ps[1].field.as_deref(), Some("nodes[0].loop.max_iterations"));
    assert_eq!((ps[1].line, ps[1].column), (Some(5), Some(23)));
}

#[test]
fn options_that_belong_to_other_kinds() {
    one(
        &format!("{HEAD}  - id: a\n    value: 1\n    as: x\n"),
        5,
        5,
        Some("nodes[0].as"),
        "`as` is only allowed on `for_each` nodes",
    );
    one(
        &format!("{HEAD}  - id: a\n    approval: ok\n    env: {{ A: b }}\n"),
        5,
        5,
        Some("nodes[0].env"),
        "only allowed on `command` nodes",
    );
    one(
        &format!("{HEAD}  - id: a\n    tool: read\n    cwd: /tmp\n"),
        5,
        5,
        Some("nodes[0].cwd"),
        "only allowed on `command` nodes",
    );
    // The loop then also lacks its body; both are said.
    let ps = problems(&format!("{HEAD}  - id: l\n    loop: {{ until: \"true\", max_iterations: 1 }}\n    nodes:\n      - id: a\n        value: 1\n"));
    let p = ps
        .iter()
        .find(|p| p.field.as_deref() == Some("nodes[0].nodes"))
        .unwrap_or_else(|| panic!("{ps:#?}"));
    assert_eq!((p.line, p.column), (Some(5), Some(5)));
    assert!(p.message.contains("only allowed on `for_each` nodes"));
    assert!(p.hint.as_deref().unwrap().contains("inside `loop:`"));
    assert!(ps
        .iter()
        .any(|p| p.field.as_deref() == Some("nodes[0].loop.nodes")));
}

#[test]
fn output_format_must_be_known() {
    one(
        &format!("{HEAD}  - id: a\n    command: [\"x\"]\n    output: xml\n"),
        5,
        13,
        Some("nodes[0].output"),
        "use `text`, `json` or `lines`",
    );
}

#[test]
fn templates_and_expressions_must_parse() {
    one(
        &format!("{HEAD}  - id: a\n    command: [\"echo\", \"{{{{ input.x }}\"]\n"),
        4,
        23,
        Some("nodes[0].command[1]"),
        "template does not parse",
    );
    one(
        &format!("{HEAD}  - id: a\n    command: [\"x\"]\n    env: {{ A: \"{{{{ a b }}}}\" }}\n"),
        5,
        15,
        Some("nodes[0].env.A"),
        "template does not parse",
    );
    one(
        &format!("{HEAD}  - id: a\n    value: {{ deep: [1, \"{{{{ x | }}}}\"] }}\n"),
        4,
        24,
        Some("nodes[0].value.deep[1]"),
        "template does not parse",
    );
    one(
        &format!("{HEAD}  - id: a\n    approval: \"{{{{ \"\n"),
        4,
        15,
        Some("nodes[0].approval"),
        "template does not parse",
    );
    one(
        &format!("{HEAD}  - id: a\n    tool: write\n    args: {{ path: x, content: \"{{{{ a b }}}}\" }}\n"),
        5,
        31,
        Some("nodes[0].args.content"),
        "template does not parse",
    );
    one(
        &format!("output: \"{{{{ nodes. }}}}\"\n{HEAD}  - id: a\n    value: 1\n"),
        1,
        9,
        Some("output"),
        "template does not parse",
    );
    one(
        &format!("{HEAD}  - id: a\n    value: 1\n    if: \"x ==\"\n"),
        5,
        9,
        Some("nodes[0].if"),
        "expression does not parse",
    );
    one(
        &format!("{HEAD}  - id: l\n    loop:\n      until: \"nodes[\"\n      max_iterations: 1\n      nodes:\n        - id: a\n          value: 1\n"),
        5,
        14,
        Some("nodes[0].loop.until"),
        "expression does not parse",
    );
    one(
        &format!("{HEAD}  - id: f\n    for_each: \"{{{{ x }}}}\"\n    nodes:\n      - id: a\n        value: 1\n"),
        4,
        15,
        Some("nodes[0].for_each"),
        "expression does not parse",
    );
}

#[test]
fn input_schema_must_be_valid() {
    one(
        &format!("input:\n  type: object\n  properties:\n    repo: {{ type: strng }}\n{HEAD}  - id: a\n    value: 1\n"),
        4,
        19,
        Some("input.properties.repo.type"),
        "not a valid JSON Schema",
    );
}

#[test]
fn every_problem_is_reported_in_file_order() {
    let ps = problems(
        "name: Bad\nnodes:\n  - id: a\n    value: 1\n    timeout: soon\n  - id: b\n    needs: [z]\n    command: []\n",
    );
    let fields: Vec<&str> = ps.iter().filter_map(|p| p.field.as_deref()).collect();
    assert_eq!(
        fields,
        [
            "name",
            "nodes[0].timeout",
            "nodes[1].needs",
            "nodes[1].command"
        ],
        "{ps:#?}"
    );
    let lines: Vec<usize> = ps.iter().filter_map(|p| p.line).collect();
    assert_eq!(lines, [1, 5, 7, 8]);
}

#[test]
fn unreadable_and_empty_files() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.yaml");
    let e = load(&missing).unwrap_err();
    assert!(
        e.to_string().contains("cannot read the workflow file"),
        "{e}"
    );
    assert!(e.to_string().contains("nope.yaml"), "{e}");
    let p = one("", 1, 1, None, "empty");
    assert!(p.message.contains("`name` and `nodes`"));
    one(
        "name: t\n",
        1,
        1,
        Some("nodes"),
        "missing required field `nodes`",
    );
    one(
        "name: t\nnodes: []\n",
        2,
        8,
        Some("nodes"),
        "at least one node",
    );
}

/// Every problem of `text`, one per line, for checks that only care what
/// is said.
fn said(text: &str) -> String {
    problems(text)
        .iter()
        .map(|p| p.to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn child_workflows_delegates_mcp_servers_and_engines_are_checked() {
    let m = "models:\n  m: { provider: scripted, script: t.yaml }\n";
    // A workflow node's path is a plain path.
    let s = said(&format!(
        "{HEAD}  - id: w\n    workflow: \"{{{{ input.f }}}}.yaml\"\n"
    ));
    assert!(s.contains("cannot be a template"), "{s}");
    // `input` belongs to workflow nodes.
    let s = said(&format!(
        "{HEAD}  - id: c\n    command: [\"true\"]\n    input: {{}}\n"
    ));
    assert!(s.contains("only allowed on `workflow` nodes"), "{s}");
    // A delegate may not take a built-in tool's name, nor an invalid one.
    let s = said(&format!(
        "{m}{HEAD}  - id: a\n    agent:\n      model: m\n      prompt: p\n      delegates: {{ read: r.yaml, \"a b\": r.yaml }}\n"
    ));
    assert!(s.contains("has the name of a built-in tool"), "{s}");
    assert!(s.contains("not a valid delegate name"), "{s}");
    // An MCP tool names a declared server.
    let s = said(&format!(
        "{m}{HEAD}  - id: a\n    agent:\n      model: m\n      prompt: p\n      tools: [\"docs.search\"]\n"
    ));
    assert!(s.contains("which `mcp_servers` does not declare"), "{s}");
    // A server is a command or a URL, not both, not neither.
    let s = said(&format!(
        "mcp_servers:\n  a: {{ command: [x], url: \"http://h/mcp\" }}\n  b: {{ timeout: 1s }}\n  c: {{ url: \"ftp://h\" }}\n{HEAD}  - id: v\n    value: 1\n"
    ));
    assert!(s.contains("not both"), "{s}");
    assert!(s.contains("needs `command`"), "{s}");
    assert!(s.contains("not an http:// or https:// URL"), "{s}");
    // Engines: known ones only, and without a model loop's settings.
    let s = said(&format!(
        "{HEAD}  - id: a\n    agent:\n      engine: cursor\n      prompt: p\n"
    ));
    assert!(s.contains("unknown agent engine `cursor`"), "{s}");
    let s = said(&format!(
        "{HEAD}  - id: a\n    agent:\n      engine: codex\n      prompt: p\n      tools: [read]\n"
    ));
    assert!(
        s.contains("does not apply to an agent run by `engine: codex`"),
        "{s}"
    );
}

#[test]
fn a_switch_names_its_branches_and_they_need_it() {
    one(
        &format!(
            "{HEAD}  - id: route\n    switch: {{ on: \"input.k\", cases: {{ bug: [fxi] }} }}\n  - id: fix\n    needs: [route]\n    value: 1\n"
        ),
        3,
        5,
        Some("nodes[0].switch.cases.bug"),
        "`fxi` is not a node in this group",
    );
    one(
        &format!(
            "{HEAD}  - id: route\n    switch: {{ on: \"input.k\", cases: {{ bug: [fix] }} }}\n  - id: fix\n    value: 1\n"
        ),
        5,
        5,
        Some("nodes[0].switch.cases.bug"),
        "`fix` is in a branch of switch `route` but does not need it",
    );
    one(
        &format!("{HEAD}  - id: route\n    switch: {{ on: \"input.k\", cases: {{}} }}\n"),
        4,
        37,
        Some("nodes[0].switch.cases"),
        "at least one case",
    );
    one(
        &format!("{HEAD}  - id: route\n    switch: {{ cases: {{ a: [] }} }}\n"),
        4,
        13,
        Some("nodes[0].switch.on"),
        "missing required field `on`",
    );
}

/// What templates refer to is checked before anything runs: each mistake
/// a person makes is one problem at its string, with a hint.
#[test]
fn template_references_are_checked_statically() {
    const SCHEMA: &str =
        "name: t\ninput:\n  type: object\n  properties: { name: { type: string } }\nnodes:\n";
    let cases: &[(&str, usize, &str, &str, &str)] = &[
        (
            "  - id: a\n    value: { n: 1 }\n  - id: b\n    needs: [a]\n    value: \"{{ nodes.aa.output }}\"\n",
            10,
            "nodes[1].value",
            "no node `aa` here",
            "did you mean `a`?",
        ),
        (
            "  - id: a\n    value: { n: 1 }\n  - id: b\n    needs: [a]\n    value: \"{{ nodes.a.outptu }}\"\n",
            10,
            "nodes[1].value",
            "a node has no field `outptu`",
            "did you mean `output`?",
        ),
        (
            "  - id: a\n    value: { n: 1 }\n  - id: b\n    needs: [a]\n    value: \"{{ nodes.a.output.m }}\"\n",
            10,
            "nodes[1].value",
            "the output of `a` has no `m`",
            "did you mean `n`?",
        ),
        (
            "  - id: a\n    value: 1\n  - id: b\n    command: [echo, \"{{ input.nme }}\"]\n",
            9,
            "nodes[1].command[1]",
            "the input schema has no property `nme`",
            "did you mean `name`?",
        ),
        (
            "  - id: a\n    value: 1\n  - id: b\n    command: [echo, \"{{ nodes.a.output }}\"]\n",
            9,
            "nodes[1].command[1]",
            "`nodes.a` is read by `b`, which does not wait for `a`",
            "add `a` to the `needs` of `b`",
        ),
        (
            "  - id: a\n    value: 1\n  - id: b\n    needs: [a]\n    if: \"nodes.a.output > 0 and itme\"\n    value: 2\n",
            10,
            "nodes[1].if",
            "unknown name `itme`",
            "names in scope here",
        ),
        (
            "  - id: a\n    value: 1\n  - id: b\n    needs: [a]\n    if: \"failure\"\n    value: 2\n",
            10,
            "nodes[1].if",
            "unknown name `failure`",
            "call it: `failure()`",
        ),
        (
            "  - id: a\n    value: \"{{ always() }}\"\n",
            7,
            "nodes[0].value",
            "unknown function `always()`",
            "status functions belong in a node's `if`",
        ),
        (
            "  - id: a\n    value: 1\n  - id: each\n    for_each: \"[1, 2]\"\n    nodes:\n      - id: show\n        value: \"{{ nodes.a.output }} {{ item }}\"\n",
            12,
            "nodes[1].nodes[0].value",
            "`nodes.a` is read by `each`, which does not wait for `a`",
            "add `a` to the `needs` of `each`",
        ),
    ];
    for (body, line, field, message, hint) in cases {
        let text = format!("{SCHEMA}{body}");
        let ps = problems(&text);
        assert_eq!(ps.len(), 1, "{body}: expected one problem, got {ps:#?}");
        let p = &ps[0];
        assert_eq!(p.line, Some(*line), "{p}");
        assert_eq!(p.field.as_deref(), Some(*field), "{p}");
        assert!(p.message.contains(message), "`{p}` lacks `{message}`");
        let h = p.hint.as_deref().unwrap_or_default();
        assert!(h.contains(hint), "`{p}`: hint `{h}` lacks `{hint}`");
    }
}

/// What resolves is not reported: reads through dependencies, a group's
/// `until` reading its members, members reading each other and the
/// group's names, full paths, handlers, and the workflow's output.
#[test]
fn references_that_resolve_pass() {
    let text = r#"name: t
input: { type: object, properties: { n: { type: integer } } }
output: "{{ nodes.last.output }}"
nodes:
  - id: a
    value: { n: 1 }
  - id: b
    needs: [a]
    value: "{{ nodes.a.output.n }}"
  - id: review
    needs: [b]
    loop:
      until: "nodes.check.output.ok and iteration > 0"
      max_iterations: 3
      nodes:
        - id: fix
          value: "{{ nodes.a.output.n + input.n }} {{ iteration }}"
        - id: check
          needs: [fix]
          value: { ok: "{{ nodes.fix.status == 'finished' }}" }
  - id: each
    needs: [review]
    for_each: "nodes.b.output | string | list"
    as: ch
    nodes:
      - id: show
        value: "{{ index }} {{ item }} {{ ch }} {{ nodes['review.check'].output.ok }}"
  - id: last
    needs: [each]
    if: "always() and nodes.each.status != 'skipped' and run.id and workflow.name"
    value: "{{ nodes.a.error is none }} {{ range(2) | list }}"
"#;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flow.yaml");
    std::fs::write(&path, text).unwrap();
    if let Err(e) = load(&path) {
        panic!("{e}");
    }
}

/// In a loop's body a member may read a sibling it does not wait for: it
/// reads what the previous pass left. Outside loops that is an error, said
/// once however often the site names the node.
#[test]
fn a_loop_member_reads_the_previous_pass() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flow.yaml");
    std::fs::write(
        &path,
        "name: t\nnodes:\n  - id: l\n    loop:\n      until: \"iteration >= 3\"\n      max_iterations: 5\n      nodes:\n        - id: step\n          value: \"{{ (nodes.check.output if nodes.check is defined else 0) + 1 }}\"\n        - id: check\n          needs: [step]\n          value: \"{{ nodes.step.output }}\"\n",
    )
    .unwrap();
    if let Err(e) = load(&path) {
        panic!("{e}");
    }
    let ps = problems(
        "name: t\nnodes:\n  - id: step\n    value: \"{{ nodes.check.output if nodes.check is defined else 0 }}\"\n  - id: check\n    value: 1\n",
    );
    assert_eq!(ps.len(), 1, "{ps:#?}");
}

#[test]
fn model_limits_windows_and_fallbacks_are_checked() {
    let node = "nodes:\n  - id: a\n    agent: { model: m, prompt: go }\n";
    one(
        &format!(
            "name: t\nmodels:\n  m:\n    provider: openai\n    model: x\n    fallback: [m]\n{node}"
        ),
        6,
        16,
        Some("models.m.fallback[0]"),
        "cannot be its own fallback",
    );
    one(
        &format!("name: t\nmodels:\n  m:\n    provider: openai\n    model: x\n    fallback: [spare, backup]\n  spare: {{ provider: openai, model: y }}\n{node}"),
        6,
        23,
        Some("models.m.fallback[1]"),
        "no model named `backup`",
    );
    one(
        &format!("name: t\nmodels:\n  m:\n    provider: openai\n    model: x\n    max_concurrency: 0\n{node}"),
        6,
        22,
        Some("models.m.max_concurrency"),
        "",
    );
    one(
        &format!("name: t\nmodels:\n  m:\n    provider: openai\n    model: x\n    context_window: lots\n{node}"),
        6,
        21,
        Some("models.m.context_window"),
        "",
    );
    one(
        &format!("name: t\nmodels:\n  m:\n    provider: openai\n    model: x\n    prompt_cache: sometimes\n{node}"),
        6,
        19,
        Some("models.m.prompt_cache"),
        "",
    );
    // All of them right: the model carries them.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flow.yaml");
    std::fs::write(
        &path,
        format!("name: t\nmodels:\n  m:\n    provider: gemini\n    model: gemini-2.5-flash\n    max_concurrency: 4\n    requests_per_minute: 60\n    tokens_per_minute: 100000\n    context_window: 32768\n    prompt_cache: false\n    fallback: spare\n  spare: {{ provider: openai-responses, model: gpt-5.1 }}\n{node}"),
    )
    .unwrap();
    let wf = load(&path).unwrap();
    let m = &wf.models["m"];
    assert_eq!(m.limits.max_concurrency, Some(4));
    assert_eq!(m.limits.requests_per_minute, Some(60));
    assert_eq!(m.limits.tokens_per_minute, Some(100_000));
    assert_eq!(m.context_window, Some(32768));
    assert_eq!(m.prompt_cache, Some(false));
    assert_eq!(m.fallback, ["spare"]);
    assert_eq!(wf.models["spare"].builtin_context_window(), Some(400_000));
}
