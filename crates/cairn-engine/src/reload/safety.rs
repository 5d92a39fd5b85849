//! Whether a new definition can replace a run's current one: what has
//! begun and not ended must stay exactly as it was defined, and so must
//! what the whole run was checked against.

use std::collections::BTreeSet;
use std::sync::Arc;

use cairn_workflow::{Isolation, NodeKind, NodeSpec, ResourceLimits, ScorerKind, Workflow};

/// Most node reasons an unsafe reload names before it counts the rest.
const MAX_REASONS: usize = 3;

/// A node instance that has begun and not ended: its definition is in use.
#[derive(Debug, Clone)]
pub(crate) struct Active {
    /// The instance's path as events name it (`review.fix`,
    /// `per_line[3].show`, `review.inner@2.fix`).
    pub path: String,
    /// What it is doing, as the reason says it: "is running", ...
    pub doing: &'static str,
}

/// What else of the run holds on to the current definition.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct InUse {
    /// MCP servers were started in this session: they were started from
    /// the current `mcp_servers` and live until the session ends.
    pub mcp_started: bool,
}

/// Why `new` cannot replace `old` in a run where `active` have begun and
/// not ended; `None` when it can. Nodes that ended stay as they ended
/// whatever their new definition, and nodes that never began take the new
/// one, so neither is a reason.
pub(crate) fn unsafe_reason(
    old: &Workflow,
    new: &Workflow,
    active: &[Active],
    in_use: InUse,
) -> Option<String> {
    if old.name != new.name {
        return Some(format!(
            "the workflow's name changed from `{}` to `{}`: a run belongs to the workflow it \
             started as",
            old.name, new.name
        ));
    }
    if old.input_schema != new.input_schema {
        return Some(
            "the input schema changed: the run's input was checked against the old one, and \
             it cannot be asked again"
                .into(),
        );
    }
    if let Some(why) = loosened_tree(old, new) {
        return Some(why);
    }
    if in_use.mcp_started && old.mcp_servers != new.mcp_servers {
        return Some(
            "the MCP servers changed while servers of the old definition are running (they \
             are started once per session of the run)"
                .into(),
        );
    }
    let mut reasons = Vec::new();
    // Outer groups first, so that the members of a group already named are
    // not named again.
    let mut active: Vec<&Active> = active.iter().collect();
    active.sort_by_key(|a| (spec_path(&a.path).len(), a.path.clone()));
    let mut named: Vec<Vec<&str>> = Vec::new();
    let mut leaf_running: Option<&str> = None;
    for a in active {
        let segs = spec_path(&a.path);
        if named.iter().any(|g| segs.starts_with(g)) {
            continue;
        }
        let Some(before) = find(&old.nodes, &segs) else {
            continue;
        };
        let group = before.kind.children().is_some();
        if !group {
            leaf_running.get_or_insert(a.path.as_str());
        }
        let what = if group { before.kind.name() } else { "node" };
        let doing = if group { "is in progress" } else { a.doing };
        let why = match find(&new.nodes, &segs) {
            None => Some("the change removes it".to_string()),
            Some(after) => changed(old, before, new, after),
        };
        if let Some(why) = why {
            reasons.push(format!("{what} `{}` {doing} and {why}", a.path));
            named.push(segs);
        }
    }
    if reasons.is_empty() {
        if let Some(path) = leaf_running.filter(|_| old.sandbox != new.sandbox) {
            return Some(format!(
                "the sandbox changed while node `{path}` runs in the old one"
            ));
        }
        return None;
    }
    let more = reasons.len().saturating_sub(MAX_REASONS);
    reasons.truncate(MAX_REASONS);
    let mut reason = reasons.join("; ");
    if more > 0 {
        reason.push_str(&format!("; and {more} more"));
    }
    Some(reason)
}

/// Why `new`'s walls are looser than `old`'s, if they are: a reload may
/// come from a node that rewrote the workflow (a file in its root, or one
/// it reached some other way), so it may never open the sandbox wider. A
/// person restarts the run to change the walls; tightening them is taken.
/// Compared: isolation (the workflow's and every node's own), the network
/// (shut < listed hosts < open; a list may only lose hosts), the read-only
/// folders shown (none may be added), the root (it may not move), and the
/// resource limits (the workflow's and every node's own: none may be
/// raised or lifted). A node new in `new` is held to `old`'s workflow-wide
/// walls.
pub(crate) fn loosened_walls(old: &Workflow, new: &Workflow) -> Option<String> {
    let (o, n) = (&old.sandbox, &new.sandbox);
    if o.isolation == Isolation::Namespaces && n.isolation == Isolation::None {
        return Some("it turns the sandbox off (`isolation: none`)".into());
    }
    let level = |network: bool, hosts: &[String]| match (network, hosts.is_empty()) {
        (true, _) => 2,
        (false, false) => 1,
        (false, true) => 0,
    };
    let (lo, ln) = (
        level(o.network, &o.network_hosts),
        level(n.network, &n.network_hosts),
    );
    if ln > lo {
        return Some("it opens the network wider".into());
    }
    if ln == 1 && lo == 1 {
        if let Some(h) = n
            .network_hosts
            .iter()
            .find(|h| !o.network_hosts.contains(h))
        {
            return Some(format!(
                "it adds `{h}` to the hosts the network lets through"
            ));
        }
    }
    if o.root != n.root {
        return Some("it moves the sandbox root".into());
    }
    if let Some(p) = n.read_only.iter().find(|p| !o.read_only.contains(p)) {
        return Some(format!("it shows `{p}` read-only to the sandbox"));
    }
    if let Some(what) = raised(o.limits, n.limits) {
        return Some(format!("it raises the sandbox's {what} limit"));
    }
    node_walls(old, new, &new.nodes, &mut Vec::new())
}

/// [`loosened_walls`] over the whole tree: the run's workflow, then every
/// child workflow `new` refers to, from the texts pinned with it, against
/// the same child as `old` pinned it (a child new to the tree against
/// `old` itself: a reload may not bring in a looser sandbox).
fn loosened_tree(old: &Workflow, new: &Workflow) -> Option<String> {
    if let Some(why) = loosened_walls(old, new) {
        return Some(why);
    }
    let mut seen = std::collections::HashSet::new();
    let mut stack = Vec::new();
    if let Some(why) = children_walls(old, new, &mut seen, &mut stack) {
        return Some(why);
    }
    while let Some(w) = stack.pop() {
        if let Some(why) = children_walls(old, &w, &mut seen, &mut stack) {
            return Some(why);
        }
    }
    None
}

/// [`loosened_walls`] of `w`'s children not seen yet, which are queued on
/// `stack` for their own children.
fn children_walls(
    old: &Workflow,
    w: &Workflow,
    seen: &mut std::collections::HashSet<std::path::PathBuf>,
    stack: &mut Vec<Workflow>,
) -> Option<String> {
    // Without pinned texts a child would be read from the disk.
    w.pinned.as_ref()?;
    for (p, _) in w.child_paths() {
        let path = w.resolve(&p);
        if !seen.insert(path.clone()) {
            continue;
        }
        let Ok(after) = w.child(&path) else { continue };
        let before = old.pinned.as_ref().and_then(|_| old.child(&path).ok());
        if let Some(why) = loosened_walls(before.as_ref().unwrap_or(old), &after) {
            return Some(format!("child workflow `{p}`: {why}"));
        }
        stack.push(after);
    }
    None
}

/// The first node of `nodes` (and their bodies) whose own walls are
/// looser in the new definition than the same node's in `old`.
fn node_walls<'a>(
    old: &Workflow,
    new: &Workflow,
    nodes: &'a [NodeSpec],
    path: &mut Vec<&'a str>,
) -> Option<String> {
    for n in nodes {
        path.push(&n.id);
        let before = find(&old.nodes, path);
        let iso = |wf: &Workflow, spec: Option<&NodeSpec>| {
            spec.and_then(|s| s.sandbox.isolation)
                .unwrap_or(wf.sandbox.isolation)
        };
        let limits = |wf: &Workflow, spec: Option<&NodeSpec>| {
            wf.sandbox
                .limits
                .overridden_by(spec.map(|s| s.sandbox.limits).unwrap_or_default())
        };
        let shown = path.join(".");
        if n.sandbox.isolation == Some(Isolation::None) && iso(old, before) == Isolation::Namespaces
        {
            return Some(format!("it turns the sandbox off for node `{shown}`"));
        }
        let new_limits = new.sandbox.limits.overridden_by(n.sandbox.limits);
        if let Some(what) = raised(limits(old, before), new_limits) {
            return Some(format!("it raises the {what} limit of node `{shown}`"));
        }
        if let Some(children) = n.kind.children() {
            if let Some(why) = node_walls(old, new, children, path) {
                return Some(why);
            }
        }
        path.pop();
    }
    None
}

/// Which of `old`'s limits `new` raises or lifts, if one.
fn raised(old: ResourceLimits, new: ResourceLimits) -> Option<&'static str> {
    let up = |o: Option<u64>, n: Option<u64>| o.is_some_and(|o| n.is_none_or(|n| n > o));
    if up(old.memory_bytes, new.memory_bytes) {
        return Some("memory");
    }
    if up(old.processes, new.processes) {
        return Some("processes");
    }
    if up(
        old.cpu.map(|d| d.as_millis() as u64),
        new.cpu.map(|d| d.as_millis() as u64),
    ) {
        return Some("cpu");
    }
    None
}

/// What differs between a node's definition in `old` and in `new` that
/// matters to an instance of it that has begun: the node itself (its
/// group's body included; not the lines it is written on), the workflow
/// defaults it falls back on, and the models it uses.
fn changed(old: &Workflow, before: &NodeSpec, new: &Workflow, after: &NodeSpec) -> Option<String> {
    if without_lines(before) != without_lines(after) {
        return Some(if before.kind.children().is_some() {
            "its definition (its body included) changed".into()
        } else {
            "its definition changed".into()
        });
    }
    let mut uses = Uses::default();
    uses.collect(before);
    if uses.timeout_default && old.defaults.timeout != new.defaults.timeout {
        return Some("the workflow's default timeout it runs with changed".into());
    }
    if uses.retry_default && old.defaults.retry != new.defaults.retry {
        return Some("the workflow's default retry it runs with changed".into());
    }
    for m in &uses.models {
        if old.models.get(m) != new.models.get(m) {
            return Some(format!("its model `{m}` changed"));
        }
    }
    None
}

/// What a node (with its body) takes from the workflow beside itself.
#[derive(Default)]
struct Uses {
    timeout_default: bool,
    retry_default: bool,
    models: BTreeSet<String>,
}

impl Uses {
    fn collect(&mut self, spec: &NodeSpec) {
        self.timeout_default |= spec.timeout.is_none();
        self.retry_default |= spec.retry.is_none();
        if let NodeKind::Agent(a) = &spec.kind {
            self.models.extend(a.model.clone());
        }
        for s in &spec.scorers {
            if let ScorerKind::Agent(a) = &s.kind {
                self.models.insert(a.model.clone());
            }
        }
        for child in spec.kind.children().unwrap_or_default() {
            self.collect(child);
        }
    }
}

/// The ids from the top of the workflow down to the node an instance path
/// names: `per_line[3].show` and `review.inner@2.fix` name the nodes
/// `per_line.show` and `review.inner.fix`. Ids are letters, digits, `_`
/// and `-`, so the marks of instances cannot be mistaken for them.
pub(crate) fn spec_path(instance: &str) -> Vec<&str> {
    instance
        .split('.')
        .map(|seg| seg.split(['[', '@']).next().unwrap_or(seg))
        .collect()
}

/// The node at `path` among `nodes` and their bodies.
pub(crate) fn find<'a>(nodes: &'a [NodeSpec], path: &[&str]) -> Option<&'a NodeSpec> {
    let (first, rest) = path.split_first()?;
    let node = nodes.iter().find(|n| n.id == *first)?;
    if rest.is_empty() {
        Some(node)
    } else {
        find(node.kind.children()?, rest)
    }
}

/// A node's definition without the lines it is written on: a node added
/// above another moves it down the file without changing it.
fn without_lines(spec: &NodeSpec) -> NodeSpec {
    let mut s = spec.clone();
    strip_lines(&mut s);
    s
}

fn strip_lines(s: &mut NodeSpec) {
    s.line = 0;
    if s.scorers.iter().any(|sc| sc.line != 0) {
        for sc in &mut Arc::make_mut(&mut s.settings).scorers {
            sc.line = 0;
        }
    }
    if let Some(nodes) = s.kind.children_mut() {
        for n in nodes {
            strip_lines(n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wf(yaml: &str) -> Workflow {
        cairn_workflow::parse(yaml, std::path::Path::new("/w/flow.yaml")).unwrap()
    }

    fn running(path: &str) -> Active {
        Active {
            path: path.into(),
            doing: "is running",
        }
    }

    const BASE: &str = r#"
name: flow
input:
  type: object
defaults:
  timeout: 30s
models:
  m: { provider: scripted, script: m.yaml }
nodes:
  - id: wait
    command: ["sleep", "5"]
  - id: after
    needs: [wait]
    command: ["echo", "old"]
  - id: ask
    agent: { model: m, prompt: "hi" }
  - id: review
    loop:
      until: "true"
      max_iterations: 3
      nodes:
        - id: fix
          command: ["echo", "fix"]
  - id: each
    for_each: "[1, 2]"
    nodes:
      - id: show
        command: ["echo", "{{ item }}"]
"#;

    #[test]
    fn nodes_that_have_not_begun_or_have_ended_may_change() {
        let old = wf(BASE);
        // `after` has not begun: its command changes, a node is added
        // above everything (every line moves), one is added at the end.
        let changed = BASE
            .replace("[\"echo\", \"old\"]", "[\"echo\", \"new\"]")
            .replace(
                "nodes:\n  - id: wait",
                "nodes:\n  - id: first\n    value: 1\n  - id: wait",
            );
        let new = wf(&format!("{changed}  - id: extra\n    value: 2\n"));
        assert_eq!(
            unsafe_reason(&old, &new, &[running("wait")], InUse::default()),
            None
        );
        // `wait` ended (it is not active): its change is no reason.
        let new = wf(&BASE.replace("[\"sleep\", \"5\"]", "[\"sleep\", \"1\"]"));
        assert_eq!(
            unsafe_reason(&old, &new, &[running("after")], InUse::default()),
            None
        );
        // Nothing at all changed but the lines.
        let new = wf(&format!("\n\n{BASE}"));
        let all = [
            "wait",
            "ask",
            "review",
            "review.fix",
            "each",
            "each[1].show",
        ];
        let active: Vec<Active> = all.iter().map(|p| running(p)).collect();
        assert_eq!(unsafe_reason(&old, &new, &active, InUse::default()), None);
    }

    #[test]
    fn a_running_or_waiting_node_that_changes_or_goes_is_named() {
        let old = wf(BASE);
        let new = wf(&BASE.replace("[\"sleep\", \"5\"]", "[\"sleep\", \"1\"]"));
        let why = unsafe_reason(&old, &new, &[running("wait")], InUse::default()).unwrap();
        assert_eq!(why, "node `wait` is running and its definition changed");
        let gone = wf(&BASE.replace(
            "  - id: wait\n    command: [\"sleep\", \"5\"]\n  - id: after\n    needs: [wait]\n",
            "  - id: after\n",
        ));
        let waiting = Active {
            path: "wait".into(),
            doing: "is waiting for approval",
        };
        let why = unsafe_reason(&old, &gone, &[waiting], InUse::default()).unwrap();
        assert_eq!(
            why,
            "node `wait` is waiting for approval and the change removes it"
        );
    }

    #[test]
    fn a_group_in_progress_whose_body_changes_is_named_once() {
        let old = wf(BASE);
        let new = wf(&BASE.replace("[\"echo\", \"fix\"]", "[\"echo\", \"fixed\"]"));
        let active = [running("review.fix"), running("review")];
        let why = unsafe_reason(&old, &new, &active, InUse::default()).unwrap();
        assert_eq!(
            why,
            "loop `review` is in progress and its definition (its body included) changed"
        );
        let new = wf(&BASE.replace("{{ item }}", "{{ index }}"));
        let active = [
            running("each"),
            running("each[0].show"),
            running("each[1].show"),
        ];
        let why = unsafe_reason(&old, &new, &active, InUse::default()).unwrap();
        assert_eq!(
            why,
            "for_each `each` is in progress and its definition (its body included) changed"
        );
    }

    #[test]
    fn what_the_whole_run_was_checked_against_may_not_change() {
        let old = wf(BASE);
        let new = wf(&BASE.replace("  type: object\n", "  type: object\n  required: [x]\n"));
        let why = unsafe_reason(&old, &new, &[], InUse::default()).unwrap();
        assert!(why.starts_with("the input schema changed"), "{why}");
        let new = wf(&BASE.replace("name: flow", "name: other"));
        let why = unsafe_reason(&old, &new, &[], InUse::default()).unwrap();
        assert!(why.contains("`flow` to `other`"), "{why}");
    }

    #[test]
    fn what_a_running_node_takes_from_the_workflow_counts() {
        let old = wf(BASE);
        // The default timeout `wait` runs with.
        let new = wf(&BASE.replace("timeout: 30s", "timeout: 10s"));
        let why = unsafe_reason(&old, &new, &[running("wait")], InUse::default()).unwrap();
        assert!(why.contains("default timeout"), "{why}");
        // The model the running agent uses; not a reason for `wait`.
        let new = wf(&BASE.replace("script: m.yaml", "script: n.yaml"));
        let why = unsafe_reason(&old, &new, &[running("ask")], InUse::default()).unwrap();
        assert_eq!(why, "node `ask` is running and its model `m` changed");
        assert_eq!(
            unsafe_reason(&old, &new, &[running("wait")], InUse::default()),
            None
        );
        // The sandbox running commands were started in (tightened here:
        // loosening is refused whatever runs).
        let open = wf(&format!("{BASE}sandbox:\n  network: true\n"));
        let why = unsafe_reason(&open, &old, &[running("wait")], InUse::default()).unwrap();
        assert!(why.starts_with("the sandbox changed"), "{why}");
        assert_eq!(unsafe_reason(&open, &old, &[], InUse::default()), None);
    }

    #[test]
    fn loosening_a_wall_is_refused_and_tightening_is_taken() {
        let with = |sandbox: &str| wf(&format!("{BASE}sandbox:\n{sandbox}"));
        let base = with(
            "  network: [\"a.example\"]\n  read_only: [/opt/t]\n  \
             limits: { memory: 1GiB, processes: 10, cpu: 10s }\n",
        );
        let loosen = |sandbox: &str, says: &str| {
            let why = unsafe_reason(&base, &with(sandbox), &[], InUse::default())
                .unwrap_or_else(|| panic!("taken: {sandbox}"));
            assert!(why.contains(says), "{sandbox}: {why}");
        };
        let keep = "  read_only: [/opt/t]\n  limits: { memory: 1GiB, processes: 10, cpu: 10s }\n";
        let hosts = "  network: [\"a.example\"]\n";
        loosen(
            &format!("  isolation: none\n{hosts}{keep}"),
            "isolation: none",
        );
        loosen(&format!("  network: true\n{keep}"), "network");
        loosen(
            &format!("  network: [\"a.example\", \"b.example\"]\n{keep}"),
            "b.example",
        );
        loosen(&format!("  root: ..\n{hosts}{keep}"), "root");
        loosen(
            &format!("{hosts}  read_only: [/opt/t, /home]\n  limits: {{ memory: 1GiB, processes: 10, cpu: 10s }}\n"),
            "/home",
        );
        loosen(
            &format!("{hosts}  read_only: [/opt/t]\n  limits: {{ memory: 2GiB, processes: 10, cpu: 10s }}\n"),
            "memory",
        );
        loosen(
            &format!("{hosts}  read_only: [/opt/t]\n  limits: {{ memory: 1GiB, cpu: 10s }}\n"),
            "processes",
        );
        // A node of its own out of the sandbox, or with a higher limit.
        let node_out = wf(&format!(
            "{BASE}  - id: out\n    command: [\"true\"]\n    sandbox: {{ isolation: none }}\nsandbox:\n{hosts}{keep}"
        ));
        let why = unsafe_reason(&base, &node_out, &[], InUse::default()).unwrap();
        assert!(why.contains("node `out`"), "{why}");
        let node_up = wf(&format!(
            "{BASE}  - id: up\n    command: [\"true\"]\n    sandbox: {{ limits: {{ cpu: 60s }} }}\nsandbox:\n{hosts}{keep}"
        ));
        let why = unsafe_reason(&base, &node_up, &[], InUse::default()).unwrap();
        assert!(why.contains("cpu limit of node `up`"), "{why}");
        // Tighter walls are taken.
        for tighter in [
            format!("  network: false\n{keep}"),
            format!("{hosts}  limits: {{ memory: 512MiB, processes: 5, cpu: 5s }}\n"),
        ] {
            assert_eq!(
                unsafe_reason(&base, &with(&tighter), &[], InUse::default()),
                None,
                "{tighter}"
            );
        }
    }

    #[test]
    fn instance_paths_name_their_nodes() {
        assert_eq!(spec_path("a"), ["a"]);
        assert_eq!(spec_path("per_line[3].show"), ["per_line", "show"]);
        assert_eq!(spec_path("review.inner@2.fix"), ["review", "inner", "fix"]);
    }
}
