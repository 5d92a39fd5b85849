//! The process sandbox's settings: `isolation`, `limits`, `read_only`,
//! `network: [hosts]`, and a node's own `sandbox:`.

use std::path::Path;
use std::time::Duration;

use cairn_workflow::{Isolation, NodeSandbox, ResourceLimits};

fn parse(yaml: &str) -> Result<cairn_workflow::Workflow, Vec<String>> {
    cairn_workflow::parse(yaml, Path::new("wf.yaml"))
        .map_err(|e| e.problems.iter().map(|p| p.to_string()).collect())
}

#[test]
fn workflow_and_node_settings_parse() {
    let wf = parse(
        r#"name: s
sandbox:
  isolation: namespaces
  limits: { memory: 512MiB, processes: 64, cpu: 90s }
  read_only: [/opt/toolchain]
  network: ["pypi.org", "*.github.com:443"]
nodes:
  - id: a
    command: ["true"]
    sandbox: { isolation: none, limits: { memory: 2GiB } }
  - id: b
    tool: bash
    args: { argv: ["true"] }
"#,
    )
    .unwrap();
    assert_eq!(wf.sandbox.isolation, Isolation::Namespaces);
    assert_eq!(
        wf.sandbox.limits,
        ResourceLimits {
            memory_bytes: Some(512 << 20),
            processes: Some(64),
            cpu: Some(Duration::from_secs(90)),
        }
    );
    assert_eq!(wf.sandbox.read_only, ["/opt/toolchain"]);
    assert!(!wf.sandbox.network);
    assert_eq!(wf.sandbox.network_hosts, ["pypi.org", "*.github.com:443"]);
    assert_eq!(
        wf.nodes[0].sandbox,
        NodeSandbox {
            isolation: Some(Isolation::None),
            limits: ResourceLimits {
                memory_bytes: Some(2 << 30),
                ..Default::default()
            },
        }
    );
    assert_eq!(wf.nodes[1].sandbox, NodeSandbox::default());
    let merged = wf.sandbox.limits.overridden_by(wf.nodes[0].sandbox.limits);
    assert_eq!(merged.memory_bytes, Some(2 << 30));
    assert_eq!(merged.processes, Some(64));
}

#[test]
fn defaults_confine() {
    let wf = parse("name: d\nnodes:\n  - id: a\n    command: [\"true\"]\n").unwrap();
    assert_eq!(wf.sandbox.isolation, Isolation::Namespaces);
    assert_eq!(wf.sandbox.limits, ResourceLimits::default());
    assert!(wf.sandbox.network_hosts.is_empty());
}

#[test]
fn bad_settings_are_reported_with_line_and_field() {
    let errs = parse(
        r#"name: s
sandbox:
  isolation: partly
  limits: { memory: 12 parsecs, processes: 0, cpu: 10ms, disk: 1 }
  read_only: [relative/path]
  network: ["ok.org", "bad host", "x.org:99999"]
nodes:
  - id: a
    value: 1
    sandbox: { isolation: none }
"#,
    )
    .unwrap_err();
    let all = errs.join("\n");
    for want in [
        "wf.yaml:3:14: sandbox.isolation: expected `namespaces` or `none`, found `partly`",
        "sandbox.limits.memory: `12 parsecs` has an unknown unit",
        "sandbox.limits.processes: must be at least 1",
        "sandbox.limits.cpu: must be at least 1s",
        "unknown field `disk`",
        "sandbox.read_only[0]: `relative/path` is not an absolute path",
        "sandbox.network[1]: `bad host` is not a host pattern",
        "sandbox.network[2]: `x.org:99999` is not a host pattern",
        "unknown field `sandbox`",
    ] {
        assert!(all.contains(want), "missing `{want}` in:\n{all}");
    }
}
