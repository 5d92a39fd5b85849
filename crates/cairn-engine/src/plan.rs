//! The mounted plan: which node instances exist for the run's current state.
//!
//! A workflow is static; the plan is not. A `loop` mounts its children for the
//! current pass only, and a `for_each` mounts one copy of its children per
//! element once its list is known. The driver renders the plan after every
//! change that can alter it, and commits a new frame when the plan's canonical
//! XML changes.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;

use std::ptr::NonNull;

use cairn_events::NodePath;
use cairn_workflow::{NodeKind, NodeSpec, Workflow};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// A node instance: its path (the `nodeId` of events) and its loop pass.
/// The path is shared text: every structure that names the instance (the
/// plan, the driver's maps, the run state, its events) holds one allocation.
pub type Key = (NodePath, u32);

/// The paths of every instance mounted so far, so that a render reuses the
/// text of instances it mounted before instead of copying it again (the
/// run state and the driver's maps hold those from the first render).
#[derive(Debug, Default)]
pub struct Paths(std::collections::HashSet<NodePath>);

impl Paths {
    /// The shared path for `text`.
    pub fn intern(&mut self, text: &str) -> NodePath {
        if let Some(p) = self.0.get(text) {
            return p.clone();
        }
        let p = NodePath::from(text);
        self.0.insert(p.clone());
        p
    }
}

/// One mounted node instance.
#[derive(Debug, Clone)]
pub struct Inst {
    pub key: Key,
    pub spec: SpecRef,
    /// The instances this one waits for (its `needs`, resolved in its group).
    pub needs: Vec<Key>,
    /// The group instance this node belongs to, if any.
    pub parent: Option<Key>,
    /// Depth in the mounted graph.
    pub layer: u32,
    /// Names that only exist inside a group instance (`item`, the `as` name, `index`, `iteration`).
    pub vars: Arc<GroupVars>,
    /// The path prefix of its siblings, so templates can name a sibling by
    /// its plain id; shared by the group's members.
    pub prefix: Arc<str>,
    /// Mounted inside a loop's pass (at any depth), so that the passes of
    /// a loop in it are told apart by path.
    pub in_loop: bool,
}

impl Inst {
    /// The path prefix of a group instance's children. A loop inside a
    /// loop's pass names that pass (`review.inner@2.`): its own passes count
    /// from 0 again on every outer pass, so the iteration alone would give
    /// the children of different outer passes the same (path, iteration).
    pub fn child_prefix(&self) -> String {
        match self.spec.kind {
            NodeKind::Loop { .. } if self.in_loop => format!("{}@{}.", self.key.0, self.key.1),
            _ => format!("{}.", self.key.0),
        }
    }
}

/// The names a group instance gives its members, as a chain from the
/// innermost group out. A `for_each` element points into the group's list
/// instead of holding copies of its item under each name: a list of
/// 100,000 elements would otherwise keep 100,000 copies of the list's
/// values, and a vector of names for each.
#[derive(Debug, Default)]
pub struct GroupVars {
    outer: Option<Arc<GroupVars>>,
    bind: Bind,
}

#[derive(Debug, Default)]
enum Bind {
    /// The top level: no names.
    #[default]
    None,
    /// A loop's pass: `iteration`.
    Pass(u32),
    /// A `for_each` element: `item`, the `as` name and `index`.
    Element {
        list: Arc<Vec<Value>>,
        index: usize,
        as_name: Option<Arc<str>>,
    },
}

impl GroupVars {
    /// Calls `f` with every name and value, outermost group first, so that
    /// when a name repeats the innermost group's value comes last (and
    /// wins where the caller inserts them into a map in turn).
    pub fn visit(&self, f: &mut impl FnMut(&str, Value)) {
        if let Some(outer) = &self.outer {
            outer.visit(f);
        }
        match &self.bind {
            Bind::None => {}
            Bind::Pass(pass) => f("iteration", Value::from(*pass)),
            Bind::Element {
                list,
                index,
                as_name,
            } => {
                let item = list.get(*index).cloned().unwrap_or(Value::Null);
                if let Some(name) = as_name {
                    f("item", item.clone());
                    f(name, item);
                } else {
                    f("item", item);
                }
                f("index", Value::from(*index));
            }
        }
    }
}

/// What the driver knows that shapes the plan: loop passes and `for_each` lists.
#[derive(Debug, Default)]
pub struct Shape {
    /// Group instances that have started (children are mounted only then).
    pub started_groups: std::collections::HashSet<Key>,
    /// The current pass of each started loop instance.
    pub loop_pass: HashMap<Key, u32>,
    /// The evaluated list of each started `for_each` instance.
    pub lists: HashMap<Key, Arc<Vec<Value>>>,
}

/// The result of one render.
pub struct Plan {
    /// Instances in mount order.
    pub order: Vec<Key>,
    /// Shared, so that the driver's look-ups take an instance without copying its paths.
    pub insts: HashMap<Key, Arc<Inst>>,
    /// SHA-256 hex of the canonical XML.
    pub xml_hash: String,
}

/// One node of the run's workflow, shared by its instances without a copy:
/// it keeps the workflow alive and points into it.
#[derive(Clone)]
pub struct SpecRef {
    wf: Arc<Workflow>,
    ptr: NonNull<NodeSpec>,
}

// The pointer is into the workflow the `Arc` keeps alive and nothing
// mutates, so a `SpecRef` is as shareable as `&NodeSpec`.
unsafe impl Send for SpecRef {}
unsafe impl Sync for SpecRef {}

impl SpecRef {
    fn new(wf: &Arc<Workflow>, spec: &NodeSpec) -> SpecRef {
        SpecRef {
            wf: wf.clone(),
            ptr: NonNull::from(spec),
        }
    }

    /// The spec's address: the same for every instance of one spec node.
    pub fn id(&self) -> usize {
        self.ptr.as_ptr() as usize
    }
}

impl std::ops::Deref for SpecRef {
    type Target = NodeSpec;
    fn deref(&self) -> &NodeSpec {
        // SAFETY: `ptr` points into `wf`'s nodes, which live as long as `wf`
        // and are never mutated behind the `Arc`.
        unsafe { self.ptr.as_ref() }
    }
}

impl std::fmt::Debug for SpecRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&**self, f)
    }
}

/// The workflow's spec nodes as `SpecRef`s.
#[derive(Debug)]
pub struct SpecTree {
    pub roots: Vec<SpecRef>,
}

impl SpecTree {
    /// The tree of a workflow's nodes.
    pub fn new(wf: &Arc<Workflow>) -> SpecTree {
        SpecTree {
            roots: wf.nodes.iter().map(|n| SpecRef::new(wf, n)).collect(),
        }
    }

    /// The children of a group spec.
    pub fn children(&self, spec: &SpecRef) -> Vec<SpecRef> {
        spec.kind
            .children()
            .map(|kids| kids.iter().map(|n| SpecRef::new(&spec.wf, n)).collect())
            .unwrap_or_default()
    }
}

/// Renders the plan for the current shape.
pub fn render(tree: &SpecTree, workflow: &str, shape: &Shape, paths: &mut Paths) -> Plan {
    let mut plan = Plan {
        order: Vec::new(),
        insts: HashMap::new(),
        xml_hash: String::new(),
    };
    let mut xml = String::with_capacity(64 * 16);
    let _ = write!(xml, "<plan workflow=\"{}\">", esc(workflow));
    let mut cx = Mount {
        tree,
        shape,
        paths,
        plan: &mut plan,
        xml: &mut xml,
    };
    cx.group(
        &tree.roots,
        Arc::from(""),
        0,
        None,
        0,
        false,
        Arc::new(GroupVars::default()),
    );
    xml.push_str("</plan>");
    plan.xml_hash = hex::encode(Sha256::digest(xml.as_bytes()));
    plan
}

/// One render's work: what it reads and what it writes.
struct Mount<'a> {
    tree: &'a SpecTree,
    shape: &'a Shape,
    paths: &'a mut Paths,
    plan: &'a mut Plan,
    xml: &'a mut String,
}

impl Mount<'_> {
    #[allow(clippy::too_many_arguments)]
    fn group(
        &mut self,
        specs: &[SpecRef],
        prefix: Arc<str>,
        iteration: u32,
        parent: Option<&Key>,
        base_layer: u32,
        in_loop: bool,
        vars: Arc<GroupVars>,
    ) {
        let depths = depths(specs);
        // Every sibling's path first, so that `needs` share them.
        let mut text = String::with_capacity(prefix.len() + 16);
        let keys: HashMap<&str, NodePath> = specs
            .iter()
            .map(|spec| {
                text.clear();
                text.push_str(&prefix);
                text.push_str(&spec.id);
                (spec.id.as_str(), self.paths.intern(&text))
            })
            .collect();
        for (spec, depth) in specs.iter().zip(depths) {
            let key: Key = (keys[spec.id.as_str()].clone(), iteration);
            let layer = base_layer + depth;
            let needs: Vec<Key> = spec
                .needs
                .iter()
                .map(|n| match keys.get(n.as_str()) {
                    Some(p) => (p.clone(), iteration),
                    None => (self.paths.intern(&format!("{prefix}{n}")), iteration),
                })
                .collect();
            self.node_xml(&key, spec, layer, &needs);
            self.plan.order.push(key.clone());
            self.plan.insts.insert(
                key.clone(),
                Arc::new(Inst {
                    key: key.clone(),
                    spec: spec.clone(),
                    needs,
                    parent: parent.cloned(),
                    layer,
                    vars: vars.clone(),
                    prefix: prefix.clone(),
                    in_loop,
                }),
            );
            if !self.shape.started_groups.contains(&key) {
                self.xml.push_str("/>");
                continue;
            }
            self.xml.push('>');
            self.children(&key, spec, layer, in_loop, &vars);
            self.xml.push_str("</node>");
        }
    }

    fn node_xml(&mut self, key: &Key, spec: &SpecRef, layer: u32, needs: &[Key]) {
        let xml = &mut *self.xml;
        xml.push_str("<node id=\"");
        esc_into(xml, &key.0);
        let _ = write!(
            xml,
            "\" iteration=\"{}\" kind=\"{}\" layer=\"{}\"",
            key.1,
            spec.kind.name(),
            layer
        );
        if !needs.is_empty() {
            xml.push_str(" needs=\"");
            for (i, k) in needs.iter().enumerate() {
                if i > 0 {
                    xml.push(' ');
                }
                esc_into(xml, &k.0);
            }
            xml.push('"');
        }
    }

    /// A started group's children: a loop's current pass, or one copy per
    /// element of a `for_each` list.
    fn children(
        &mut self,
        key: &Key,
        spec: &SpecRef,
        layer: u32,
        in_loop: bool,
        vars: &Arc<GroupVars>,
    ) {
        let iteration = key.1;
        match &spec.kind {
            NodeKind::Loop { .. } => {
                let pass = self.shape.loop_pass.get(key).copied().unwrap_or(0);
                let v = GroupVars {
                    outer: Some(vars.clone()),
                    bind: Bind::Pass(pass),
                };
                let child_prefix: Arc<str> = if in_loop {
                    format!("{}@{iteration}.", key.0).into()
                } else {
                    format!("{}.", key.0).into()
                };
                let kids = self.tree.children(spec);
                self.group(
                    &kids,
                    child_prefix,
                    pass,
                    Some(key),
                    layer + 1,
                    true,
                    Arc::new(v),
                );
            }
            NodeKind::ForEach { as_name, .. } => {
                if let Some(list) = self.shape.lists.get(key).cloned() {
                    let kids = self.tree.children(spec);
                    let as_name: Option<Arc<str>> = as_name.as_deref().map(Arc::from);
                    for i in 0..list.len() {
                        let v = GroupVars {
                            outer: Some(vars.clone()),
                            bind: Bind::Element {
                                list: list.clone(),
                                index: i,
                                as_name: as_name.clone(),
                            },
                        };
                        self.group(
                            &kids,
                            format!("{}[{i}].", key.0).into(),
                            iteration,
                            Some(key),
                            layer + 1,
                            in_loop,
                            Arc::new(v),
                        );
                    }
                }
            }
            _ => {}
        }
    }
}

/// Depth of each sibling within its group: 0 without needs, else one more than
/// the deepest need. Iterative (Kahn's order) so a chain of thousands of nodes
/// needs no deep recursion; the workflow was validated acyclic.
fn depths(specs: &[SpecRef]) -> Vec<u32> {
    let index: HashMap<&str, usize> = specs
        .iter()
        .enumerate()
        .map(|(i, s)| (s.id.as_str(), i))
        .collect();
    let mut indegree = vec![0usize; specs.len()];
    let mut dependents: Vec<Vec<usize>> = vec![Vec::new(); specs.len()];
    for (i, s) in specs.iter().enumerate() {
        for n in &s.needs {
            if let Some(&j) = index.get(n.as_str()) {
                indegree[i] += 1;
                dependents[j].push(i);
            }
        }
    }
    let mut depth = vec![0u32; specs.len()];
    let mut queue: std::collections::VecDeque<usize> =
        (0..specs.len()).filter(|&i| indegree[i] == 0).collect();
    while let Some(j) = queue.pop_front() {
        for &i in &dependents[j] {
            depth[i] = depth[i].max(depth[j] + 1);
            indegree[i] -= 1;
            if indegree[i] == 0 {
                queue.push_back(i);
            }
        }
    }
    depth
}

/// Appends `s` escaped as [`esc`] would, without a copy per attribute
/// (the plan is rendered after every group start).
fn esc_into(out: &mut String, s: &str) {
    if !s.bytes().any(|b| matches!(b, b'&' | b'<' | b'>' | b'"')) {
        // Paths never need escaping: ids are letters, digits, `_` and `-`.
        out.push_str(s);
        return;
    }
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            c => out.push(c),
        }
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The frame's hash is over these bytes: the in-place escape must write
    /// exactly what the copying one returns.
    #[test]
    fn escape_in_place_matches_copying_escape() {
        for s in ["plain", "a&b", "<&amp;>", "\"q\" & 'a'", "x[1].y@2", ""] {
            let mut out = String::from("<");
            esc_into(&mut out, s);
            assert_eq!(out, format!("<{}", esc(s)), "{s}");
        }
    }
}
