//! The template context of a node instance: the run's input, the outputs
//! of the nodes that ended (shared, never copied per render), the group's
//! names.

use super::*;
use cairn_events::NodePath;
use cairn_workflow::{NodeEntries, NodeEntry};

impl Driver {
    /// The template context of the workflow's `output`.
    pub(super) fn run_context(&self) -> Context {
        Context::scoped_nodes(
            self.small_vars(0, &GroupVars::default()),
            "nodes",
            self.nodes_ctx.shared(),
            "",
        )
    }

    /// The variables of a render other than `nodes`: all small, so they are
    /// built for every render. A group's names (`item`, the `as` name,
    /// `index`) come after `input` and before `run` and `workflow`, as they
    /// always have, so the same one wins where they clash.
    pub(super) fn small_vars(&self, iteration: u32, group: &GroupVars) -> Map<String, Value> {
        let mut vars = Map::new();
        vars.insert(
            "input".into(),
            self.state.input.clone().unwrap_or(Value::Null),
        );
        group.visit(&mut |k, v| {
            vars.insert(k.to_string(), v);
        });
        // Inside a loop the group's `iteration` is the instance's pass
        // already; a loop's own `until` reads the pass that just ended.
        vars.insert("iteration".into(), Value::from(iteration));
        vars.insert("run".into(), json!({ "id": self.run_id }));
        vars.insert("workflow".into(), json!({ "name": self.wf.name }));
        vars
    }

    /// The template context of one instance for a render in the driver: it
    /// shares `nodes` instead of copying it, so a render costs what the
    /// template reads. `iteration` is the instance's pass, or for a loop's
    /// `until` the pass that just ended.
    pub(super) fn context_for(&self, inst: &Inst, iteration: u32) -> Context {
        let vars = self.small_vars(iteration, &inst.vars);
        Context::scoped_nodes(vars, "nodes", self.nodes_ctx.shared(), &inst.prefix)
    }

    /// Whether an instance's spec has templates (looked at once per spec
    /// of a group; a top-level spec has one instance, and a map of every
    /// node of a 100,000-node file would outweigh looking again).
    pub(super) fn is_templated(&mut self, inst: &Inst) -> bool {
        if inst.parent.is_none() {
            return uses_templates(&inst.spec);
        }
        *self
            .templated
            .entry(inst.spec.id())
            .or_insert_with(|| uses_templates(&inst.spec))
    }

    /// The template context of an attempt that runs in its own task, as a
    /// value of its own. Nodes without templates get a small context:
    /// copying every node's output for each of thousands of plain nodes
    /// would make a run quadratic.
    pub(super) fn vars_for(&mut self, inst: &Inst, force: bool) -> Value {
        let templated = force || self.is_templated(inst);
        let mut vars = Map::new();
        vars.insert(
            "input".into(),
            self.state.input.clone().unwrap_or(Value::Null),
        );
        if templated {
            let all = self.nodes_ctx.map();
            let mut nodes: Map<String, Value> = all
                .iter()
                .map(|(k, e)| (k.to_string(), e.to_json()))
                .collect();
            if !inst.prefix.is_empty() {
                // Siblings inside a group are known by their plain id too.
                for (k, e) in all {
                    if let Some(rest) = k.strip_prefix(&*inst.prefix) {
                        if !rest.contains(['.', '[']) {
                            nodes.insert(rest.to_string(), e.to_json());
                        }
                    }
                }
            }
            vars.insert("nodes".into(), Value::Object(nodes));
        } else {
            vars.insert("nodes".into(), Value::Object(Map::new()));
        }
        vars.insert("iteration".into(), Value::from(inst.key.1));
        inst.vars.visit(&mut |k, v| {
            vars.insert(k.to_string(), v);
        });
        vars.insert("run".into(), json!({ "id": self.run_id }));
        vars.insert("workflow".into(), json!({ "name": self.wf.name }));
        Value::Object(vars)
    }
}

/// The `nodes` of templates (`output`, `status`, `attempt` of every ended
/// node instance, by path), shared with the renders that read it.
///
/// Renders in the driver hold the map only while they run, so an update
/// finds it unshared and changes it in place. An entry shares its path and
/// its output with the run state: a few dozen bytes of its own.
#[derive(Debug, Default)]
pub(super) struct NodesCtx(Arc<NodeEntries>);

impl NodesCtx {
    /// Sets the entry of `path`, giving back the one it replaces (an
    /// earlier pass of the same node, in a loop).
    pub(super) fn insert(&mut self, path: &NodePath, entry: NodeEntry) -> Option<NodeEntry> {
        Arc::make_mut(&mut self.0).insert(path.shared_text(), entry)
    }

    /// Makes room for `additional` more paths at once: the map of a large
    /// frame would otherwise grow by doubling, the old and new tables both
    /// alive while it does, and end up to twice as large as needed.
    pub(super) fn reserve(&mut self, additional: usize) {
        Arc::make_mut(&mut self.0).reserve_exact(additional);
    }

    pub(super) fn shared(&self) -> Arc<NodeEntries> {
        self.0.clone()
    }

    pub(super) fn map(&self) -> &NodeEntries {
        &self.0
    }
}

pub(super) fn node_ctx_entry(n: &cairn_events::NodeState) -> NodeEntry {
    NodeEntry {
        output: n.output.clone().unwrap_or_else(|| Value::Null.into()),
        status: n.status.as_str(),
        attempt: n.attempt,
        iteration: n.iteration,
    }
}

pub(super) fn uses_templates(spec: &NodeSpec) -> bool {
    fn has(s: &str) -> bool {
        s.contains("{{") || s.contains("{%") || s.contains("{#")
    }
    spec.if_.is_some()
        || spec.env.values().any(|v| has(v))
        || spec.cwd.as_deref().is_some_and(has)
        || spec.kind.uses_templates()
}
