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
        Context::scoped_nodes(vars, "nodes", self.nodes_ctx.shared(), inst.prefix())
    }

    /// Whether an instance's spec has templates (looked at once per spec
    /// of a group; a top-level spec has one instance, and a map of every
    /// node of a 100,000-node file would outweigh looking again).
    pub(super) fn is_templated(&mut self, inst: &Inst) -> bool {
        if inst.parent().is_none() {
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
            if !inst.prefix().is_empty() {
                // Siblings inside a group are known by their plain id too.
                for (k, e) in all {
                    if let Some(rest) = k.strip_prefix(inst.prefix()) {
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
/// its output with the run state: a few dozen bytes of its own, about 84
/// with the map's room (8 MB for a run of 100,000 nodes). So it is kept
/// only once the run's definition has something that reads it
/// ([`reads_nodes`]): until then it stays empty, and nothing looks.
#[derive(Debug, Default)]
pub(super) struct NodesCtx {
    map: Arc<NodeEntries>,
    /// Whether the definition reads `nodes`, so that the map is kept.
    kept: bool,
}

impl NodesCtx {
    /// Keeps the map from now on when `wf` reads it, filled with the
    /// nodes of `state` that ended (at a run's start or resume, and after
    /// a reload to a definition that reads it where the old one did not).
    pub(super) fn follow(&mut self, wf: &Workflow, state: &RunState) {
        if self.kept || !reads_nodes(wf) {
            return;
        }
        self.kept = true;
        for n in &state.nodes {
            if n.status.is_done() {
                self.insert(&n.node_id, node_ctx_entry(n));
            }
        }
    }

    /// Sets the entry of `path`, giving back the one it replaces (an
    /// earlier pass of the same node, in a loop); nothing when the map is
    /// not kept.
    pub(super) fn insert(&mut self, path: &NodePath, entry: NodeEntry) -> Option<NodeEntry> {
        if !self.kept {
            return None;
        }
        Arc::make_mut(&mut self.map).insert(path.shared_text(), entry)
    }

    /// Makes room for `additional` more paths at once: the map of a large
    /// frame would otherwise grow by doubling, the old and new tables both
    /// alive while it does, and end up to twice as large as needed.
    pub(super) fn reserve(&mut self, additional: usize) {
        if self.kept {
            Arc::make_mut(&mut self.map).reserve_exact(additional);
        }
    }

    pub(super) fn shared(&self) -> Arc<NodeEntries> {
        self.map.clone()
    }

    pub(super) fn map(&self) -> &NodeEntries {
        &self.map
    }
}

/// Whether a render of the run can read `nodes`: the workflow's `output`,
/// a node whose own settings have templates (a condition, a group's
/// expression, an agent's prompts: what [`uses_templates`] says, which is
/// also what decides whether an attempt's context holds `nodes`), or a
/// scorer (its context holds every node's).
pub(super) fn reads_nodes(wf: &Workflow) -> bool {
    if wf.output.is_some() {
        return true;
    }
    // A stack rather than recursion: groups nest as deep as a file goes.
    let mut bodies: Vec<&[NodeSpec]> = vec![&wf.nodes];
    while let Some(nodes) = bodies.pop() {
        for spec in nodes {
            if uses_templates(spec) || !spec.scorers.is_empty() {
                return true;
            }
            bodies.extend(spec.kind.children());
        }
    }
    false
}

pub(super) fn node_ctx_entry(n: &cairn_events::NodeState) -> NodeEntry {
    NodeEntry {
        output: n.output.clone().unwrap_or_else(|| Value::Null.into()),
        status: n.status.as_str(),
        attempt: n.attempt,
        error: n.error().map(|e| Box::new(e.clone())),
        iteration: n.iteration,
    }
}

pub(super) fn uses_templates(spec: &NodeSpec) -> bool {
    fn has(s: &str) -> bool {
        cairn_workflow::has_markup(s)
    }
    spec.if_.is_some()
        || spec.env.values().any(|v| has(v))
        || spec.cwd.as_deref().is_some_and(has)
        || spec.kind.uses_templates()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(yaml: &str) -> Workflow {
        cairn_workflow::parse(yaml, std::path::Path::new("/w.yaml")).unwrap()
    }

    const PLAIN: &str = "name: p\nnodes:\n  - id: a\n    value: {x: 1}\n  - id: b\n    needs: [a]\n    value: [2, \"b\"]\n";

    #[test]
    fn only_a_definition_that_reads_nodes_keeps_their_map() {
        assert!(!reads_nodes(&parsed(PLAIN)));
        let readers = [
            "name: p\nnodes:\n  - id: a\n    value: \"{{ input.x }}\"\n",
            "name: p\nnodes:\n  - id: a\n    value: 1\n  - id: b\n    needs: [a]\n    if: \"nodes.a.output == 1\"\n    value: 2\n",
            "name: p\noutput: \"{{ nodes.a.output }}\"\nnodes:\n  - id: a\n    value: 1\n",
            "name: p\nnodes:\n  - id: a\n    value: 1\n    scorers:\n      - id: s\n        command: [\"./score.sh\"]\n",
            "name: p\nnodes:\n  - id: l\n    loop:\n      until: \"true\"\n      max_iterations: 2\n      nodes:\n        - id: x\n          value: 1\n",
        ];
        for yaml in readers {
            assert!(reads_nodes(&parsed(yaml)), "{yaml}");
        }

        // A state with an ended node: the map takes it only when kept.
        let r = cairn_events::RunId::parse("r").unwrap();
        let mut state = RunState::new(r.clone());
        let ended = |kind| Event {
            run_id: r.clone(),
            seq: cairn_events::Seq(1),
            timestamp_ms: 1,
            scope: Scope::node("a", 0),
            kind,
        };
        state.apply(&ended(EventKind::NodeSkipped {
            reason: "test".into(),
        }));
        let mut ctx = NodesCtx::default();
        ctx.follow(&parsed(PLAIN), &state);
        ctx.reserve(10);
        assert!(ctx
            .insert(&NodePath::from("b"), node_ctx_entry(&state.nodes[0]))
            .is_none());
        assert!(ctx.map().is_empty());
        ctx.follow(&parsed(readers[0]), &state);
        assert_eq!(ctx.map().len(), 1, "the ended node, once kept");
        ctx.insert(&NodePath::from("b"), node_ctx_entry(&state.nodes[0]));
        assert_eq!(ctx.map().len(), 2);
    }
}
