//! The mounted plan: which node instances exist for the run's current state.
//!
//! A workflow is static; the plan is not. A `loop` mounts its children for the
//! current pass only, and a `for_each` mounts one copy of its children per
//! element once its list is known. The driver renders the plan at a run's
//! start and on resume, mounts one group's subtree again after that group's
//! shape changes, and commits a new frame when the plan's canonical XML
//! changes.

use std::collections::HashMap;
use std::sync::Arc;

use std::ptr::NonNull;

use cairn_events::NodePath;
use cairn_workflow::{Group, NodeSpec, Workflow};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// A node instance: its path (the `nodeId` of events) and its loop pass.
/// The path is shared text: every structure that names the instance (the
/// plan, the driver's maps, the run state, its events) holds one allocation.
pub type Key = (NodePath, u32);

/// A map keyed by instance. Paths nest their groups' paths, so they grow
/// long in deep workflows, and the driver looks instances up several times
/// per node: a keyed hash (aHash, seeded per process, so paths chosen by a
/// workflow's author cannot be made to collide) hashes them several times
/// faster than the standard SipHash.
pub type KeyMap<V> = HashMap<Key, V, ahash::RandomState>;

/// A set of instances; see [`KeyMap`].
pub type KeySet = std::collections::HashSet<Key, ahash::RandomState>;

/// The paths of every instance mounted so far, so that a render reuses the
/// text of instances it mounted before instead of copying it again (the
/// run state and the driver's maps hold those from the first render).
#[derive(Debug, Default)]
pub struct Paths(std::collections::HashSet<NodePath, ahash::RandomState>);

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
    pub needs: Needs,
    /// Depth in the mounted graph.
    pub layer: u32,
    /// Names that only exist inside a group instance (`item`, the `as` name,
    /// `index`, `iteration`), the group instance itself and the path prefix
    /// of its members; shared by the group's members.
    pub vars: Arc<GroupVars>,
    /// Mounted inside a loop's pass (at any depth), so that the passes of
    /// a loop in it are told apart by path.
    pub in_loop: bool,
    /// A group that had started when this instance was rendered (its
    /// children are mounted). Kept here so that writing the frame's XML
    /// looks nothing up: a group starts only through a render of it.
    pub started: bool,
}

impl Inst {
    /// The path prefix of its siblings, so templates can name a sibling by
    /// its plain id.
    pub fn prefix(&self) -> &str {
        &self.vars.prefix
    }

    /// The group instance this node belongs to, if any.
    pub fn parent(&self) -> Option<&Key> {
        self.vars.group.as_ref()
    }

    /// The path prefix of a group instance's children. A loop inside a
    /// loop's pass names that pass (`review.inner@2.`): its own passes count
    /// from 0 again on every outer pass, so the iteration alone would give
    /// the children of different outer passes the same (path, iteration).
    pub fn child_prefix(&self) -> String {
        match self.spec.kind.group() {
            Some(Group::Loop { .. }) if self.in_loop => format!("{}@{}.", self.key.0, self.key.1),
            Some(Group::Loop { .. } | Group::ForEach { .. }) | None => format!("{}.", self.key.0),
        }
    }
}

/// The instances one instance waits for. Most wait for one, which is held
/// inline: a boxed slice of one key is an allocation of 32 bytes per node,
/// and the inline key keeps an instance with its `Arc` in 96 bytes (a test
/// holds both sizes).
#[derive(Debug, Clone)]
pub enum Needs {
    /// One instance.
    One(Key),
    /// None, or two or more.
    Many(Box<[Key]>),
}

impl std::ops::Deref for Needs {
    type Target = [Key];
    fn deref(&self) -> &[Key] {
        match self {
            Needs::One(k) => std::slice::from_ref(k),
            Needs::Many(ks) => ks,
        }
    }
}

impl<'a> IntoIterator for &'a Needs {
    type Item = &'a Key;
    type IntoIter = std::slice::Iter<'a, Key>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

/// The names a group instance gives its members, as a chain from the
/// innermost group out. A `for_each` element points into the group's list
/// instead of holding copies of its item under each name: a list of
/// 100,000 elements would otherwise keep 100,000 copies of the list's
/// values, and a vector of names for each.
#[derive(Debug, Default)]
pub struct GroupVars {
    /// The nearest enclosing `for_each` element's names, skipping loop
    /// passes: an inner pass hides every outer one, so a render inside 200
    /// nested loops looks at one pass, not 200.
    outer_element: Option<Arc<GroupVars>>,
    /// The innermost loop pass at or above this group (`iteration`).
    pass: Option<u32>,
    bind: Bind,
    /// The group instance whose members these are (its loop or
    /// `for_each`; none at the top level): every member's parent, held once
    /// for them all rather than by each (an instance with its `Arc` fits 96
    /// bytes then).
    group: Option<Key>,
    /// The path prefix of the group's members (`review.`, `each[2].`;
    /// empty at the top level).
    prefix: Box<str>,
}

#[derive(Debug, Default)]
enum Bind {
    /// The top level, or a loop's pass (its number is `pass`): no names
    /// of its own beyond `iteration`.
    #[default]
    None,
    /// A `for_each` element: `item`, the `as` name and `index`.
    Element {
        list: Arc<Vec<Value>>,
        index: usize,
        as_name: Option<Arc<str>>,
    },
}

impl GroupVars {
    /// The names of the pass `pass` of the loop `group` inside `outer`,
    /// whose members' paths begin with `prefix`.
    pub fn pass(outer: &Arc<GroupVars>, pass: u32, group: &Key, prefix: String) -> GroupVars {
        GroupVars {
            outer_element: outer.element_or_outer(),
            pass: Some(pass),
            bind: Bind::None,
            group: Some(group.clone()),
            prefix: prefix.into(),
        }
    }

    /// The names of element `index` of the `for_each` `group` inside
    /// `outer`, whose members' paths begin with `prefix`.
    pub fn element(
        outer: &Arc<GroupVars>,
        list: Arc<Vec<Value>>,
        index: usize,
        as_name: Option<Arc<str>>,
        group: &Key,
        prefix: String,
    ) -> GroupVars {
        GroupVars {
            outer_element: outer.element_or_outer(),
            pass: outer.pass,
            bind: Bind::Element {
                list,
                index,
                as_name,
            },
            group: Some(group.clone()),
            prefix: prefix.into(),
        }
    }

    /// This group when it binds an element, else its nearest enclosing one.
    fn element_or_outer(self: &Arc<Self>) -> Option<Arc<GroupVars>> {
        match self.bind {
            Bind::Element { .. } => Some(self.clone()),
            Bind::None => self.outer_element.clone(),
        }
    }

    /// Calls `f` with every name and value: `iteration` (the innermost
    /// pass) first, then the elements' names outermost group first, so
    /// that when a name repeats the innermost group's value comes last
    /// (and wins where the caller inserts them into a map in turn).
    pub fn visit(&self, f: &mut impl FnMut(&str, Value)) {
        if let Some(pass) = self.pass {
            f("iteration", Value::from(pass));
        }
        self.visit_elements(f);
    }

    fn visit_elements(&self, f: &mut impl FnMut(&str, Value)) {
        if let Some(outer) = &self.outer_element {
            outer.visit_elements(f);
        }
        if let Bind::Element {
            list,
            index,
            as_name,
        } = &self.bind
        {
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

/// What the driver knows that shapes the plan: loop passes and `for_each` lists.
#[derive(Debug, Default)]
pub struct Shape {
    /// Group instances that have started (children are mounted only then).
    pub started_groups: KeySet,
    /// The current pass of each started loop instance.
    pub loop_pass: KeyMap<u32>,
    /// The evaluated list of each started `for_each` instance.
    pub lists: KeyMap<Arc<Vec<Value>>>,
}

/// The result of one render.
#[derive(Default)]
pub struct Plan {
    /// Instances in mount order, shared with `insts`: walking the plan
    /// (the frame's XML after every group start) looks nothing up.
    pub order: Vec<Arc<Inst>>,
    /// Shared, so that the driver's look-ups take an instance without copying its paths.
    pub insts: Insts,
    /// SHA-256 hex of the canonical XML.
    pub xml_hash: String,
    /// Where the XML's hash stood before every `MARK_EVERY`th instance, so
    /// that a change hashes again only from the mark before it.
    marks: Vec<Mark>,
}

/// The mounted instances by key: a table of the instances alone, each
/// found by the key it holds, rather than a map that holds a copy of every
/// key beside it (about 12 bytes per instance with the table's room
/// instead of 43).
#[derive(Default)]
pub struct Insts {
    table: hashbrown::HashTable<Arc<Inst>>,
    /// aHash, keyed per process (see [`KeyMap`]).
    hasher: ahash::RandomState,
}

impl Insts {
    fn hash(hasher: &ahash::RandomState, key: &Key) -> u64 {
        hasher.hash_one(key)
    }

    /// The instance `key`.
    pub fn get(&self, key: &Key) -> Option<&Arc<Inst>> {
        let h = Self::hash(&self.hasher, key);
        self.table.find(h, |i| i.key == *key)
    }

    /// Whether `key` is mounted.
    pub fn contains_key(&self, key: &Key) -> bool {
        self.get(key).is_some()
    }

    /// Adds `inst`, or replaces the instance of its key, which it gives back.
    pub fn insert(&mut self, inst: Arc<Inst>) -> Option<Arc<Inst>> {
        let hasher = &self.hasher;
        let h = Self::hash(hasher, &inst.key);
        let entry = self
            .table
            .entry(h, |i| i.key == inst.key, |i| Self::hash(hasher, &i.key));
        match entry {
            hashbrown::hash_table::Entry::Occupied(mut e) => {
                Some(std::mem::replace(e.get_mut(), inst))
            }
            hashbrown::hash_table::Entry::Vacant(e) => {
                e.insert(inst);
                None
            }
        }
    }

    /// Takes the instance `key` out.
    pub fn remove(&mut self, key: &Key) -> Option<Arc<Inst>> {
        let h = Self::hash(&self.hasher, key);
        let found = self.table.find_entry(h, |i| i.key == *key).ok()?;
        Some(found.remove().0)
    }

    /// Adds every instance of `other`.
    pub fn extend(&mut self, other: Insts) {
        for inst in other.table {
            self.insert(inst);
        }
    }

    /// Every instance, in no order.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Inst>> {
        self.table.iter()
    }
}

impl std::ops::Index<&Key> for Insts {
    type Output = Arc<Inst>;
    fn index(&self, key: &Key) -> &Arc<Inst> {
        self.get(key).expect("a mounted instance")
    }
}

/// The hash of the XML before the instance at `order[index]`: the digest's
/// state and the groups open there, outermost first.
struct Mark {
    index: usize,
    hasher: Sha256,
    open: Vec<Arc<Inst>>,
}

/// Instances between two marks: a change hashes at most this many
/// instances before it again, and the marks weigh about two bytes per
/// instance of a flat plan.
const MARK_EVERY: usize = 64;

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

/// The workflow's spec nodes. A mounted instance takes a [`SpecRef`] of
/// its spec as it is mounted: the tree keeps none of its own (a list of
/// every top-level node's would cost 16 bytes per node for the run).
#[derive(Debug, Clone)]
pub struct SpecTree {
    wf: Arc<Workflow>,
}

impl SpecTree {
    /// The tree of a workflow's nodes.
    pub fn new(wf: &Arc<Workflow>) -> SpecTree {
        SpecTree { wf: wf.clone() }
    }

    /// The children of a group spec (none for a leaf).
    pub fn children<'a>(&self, spec: &'a SpecRef) -> &'a [NodeSpec] {
        spec.kind.children().unwrap_or_default()
    }
}

/// Renders the plan for the current shape.
pub fn render(tree: &SpecTree, workflow: &str, shape: &Shape, paths: &mut Paths) -> Plan {
    let mut plan = Plan::default();
    let mut cx = Mount {
        tree,
        shape,
        paths,
        plan: &mut plan,
    };
    cx.group(
        &tree.wf,
        &tree.wf.nodes,
        0,
        0,
        false,
        Arc::new(GroupVars::default()),
    );
    hash_from(&mut plan, workflow, 0);
    plan
}

/// What a change of one group's shape did to the plan.
pub struct Change {
    /// Instances that appeared, in mount order.
    pub added: Vec<Key>,
    /// Instances that went, in their old mount order.
    pub removed: Vec<Arc<Inst>>,
}

/// Updates `plan` after the shape of the group instance `group` changed (it
/// started, or a loop moved to its next pass) and nothing else did: only
/// the group's subtree is mounted again and spliced in, the rest is kept as
/// it was. A full render mounts every instance each time, which made a
/// group start cost the whole plan (deep nesting paid it once per level).
/// `None`, with the plan untouched, when the group is not mounted.
pub fn rerender_group(
    tree: &SpecTree,
    workflow: &str,
    shape: &Shape,
    paths: &mut Paths,
    plan: &mut Plan,
    group: &Key,
) -> Option<Change> {
    let mut inst = plan.insts.get(group)?.clone();
    let at = plan.order.iter().position(|i| Arc::ptr_eq(i, &inst))?;
    let started = shape.started_groups.contains(group);
    if inst.started != started {
        inst = Arc::new(Inst {
            started,
            ..(*inst).clone()
        });
        plan.order[at] = inst.clone();
        plan.insts.insert(inst.clone());
    }
    // Its old subtree follows it in mount order: every instance whose
    // parent is the group or in the subtree already.
    let mut end = at + 1;
    {
        let mut inside: std::collections::HashSet<&Key, ahash::RandomState> = Default::default();
        inside.insert(group);
        while let Some(i) = plan.order.get(end) {
            match i.parent() {
                Some(p) if inside.contains(p) => {
                    inside.insert(&i.key);
                    end += 1;
                }
                _ => break,
            }
        }
    }
    let mut sub = Plan::default();
    if started {
        let mut cx = Mount {
            tree,
            shape,
            paths,
            plan: &mut sub,
        };
        cx.children(&inst.key, &inst.spec, inst.layer, inst.in_loop, &inst.vars);
    }
    let old: Vec<Arc<Inst>> = plan
        .order
        .splice(at + 1..end, sub.order.iter().cloned())
        .collect();
    let removed: Vec<Arc<Inst>> = old
        .iter()
        .filter(|i| !sub.insts.contains_key(&i.key))
        .filter_map(|i| plan.insts.remove(&i.key))
        .collect();
    let added: Vec<Key> = sub
        .order
        .iter()
        .filter(|i| !plan.insts.contains_key(&i.key))
        .map(|i| i.key.clone())
        .collect();
    plan.insts.extend(sub.insts);
    hash_from(plan, workflow, at);
    Some(Change { added, removed })
}

/// One render's work: what it reads and what it writes.
struct Mount<'a> {
    tree: &'a SpecTree,
    shape: &'a Shape,
    paths: &'a mut Paths,
    plan: &'a mut Plan,
}

impl Mount<'_> {
    /// Mounts `specs`, siblings in `wf`, as members of one group instance
    /// (the top level, a loop's pass, an element of a `for_each`), which
    /// `vars` names.
    fn group(
        &mut self,
        wf: &Arc<Workflow>,
        specs: &[NodeSpec],
        iteration: u32,
        base_layer: u32,
        in_loop: bool,
        vars: Arc<GroupVars>,
    ) {
        let prefix = &*vars.prefix;
        let index: HashMap<&str, usize, ahash::RandomState> = specs
            .iter()
            .enumerate()
            .map(|(i, s)| (s.id.as_str(), i))
            .collect();
        let depths = depths(specs, &index);
        // Every sibling's path first, so that `needs` share them.
        let mut text = String::with_capacity(prefix.len() + 16);
        let paths: Vec<NodePath> = specs
            .iter()
            .map(|spec| {
                text.clear();
                text.push_str(prefix);
                text.push_str(&spec.id);
                self.paths.intern(&text)
            })
            .collect();
        for ((spec, depth), path) in specs.iter().zip(depths).zip(&paths) {
            let key: Key = (path.clone(), iteration);
            let layer = base_layer + depth;
            let mut need = |n: &String| match index.get(n.as_str()) {
                Some(&j) => (paths[j].clone(), iteration),
                None => (self.paths.intern(&format!("{prefix}{n}")), iteration),
            };
            let needs = match spec.needs.as_slice() {
                [n] => Needs::One(need(n)),
                many => Needs::Many(many.iter().map(need).collect()),
            };
            let started = self.shape.started_groups.contains(&key);
            let spec = SpecRef::new(wf, spec);
            let inst = Arc::new(Inst {
                key: key.clone(),
                spec: spec.clone(),
                needs,
                layer,
                vars: vars.clone(),
                in_loop,
                started,
            });
            self.plan.order.push(inst.clone());
            self.plan.insts.insert(inst);
            if started {
                self.children(&key, &spec, layer, in_loop, &vars);
            }
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
        match spec.kind.group() {
            Some(Group::Loop { .. }) => {
                let pass = self.shape.loop_pass.get(key).copied().unwrap_or(0);
                let child_prefix = if in_loop {
                    format!("{}@{iteration}.", key.0)
                } else {
                    format!("{}.", key.0)
                };
                let v = GroupVars::pass(vars, pass, key, child_prefix);
                let kids = self.tree.children(spec);
                self.group(&spec.wf, kids, pass, layer + 1, true, Arc::new(v));
            }
            Some(Group::ForEach { as_name, .. }) => {
                if let Some(list) = self.shape.lists.get(key).cloned() {
                    let kids = self.tree.children(spec);
                    let as_name: Option<Arc<str>> = as_name.map(Arc::from);
                    for i in 0..list.len() {
                        let prefix = format!("{}[{i}].", key.0);
                        let v =
                            GroupVars::element(vars, list.clone(), i, as_name.clone(), key, prefix);
                        self.group(&spec.wf, kids, iteration, layer + 1, in_loop, Arc::new(v));
                    }
                }
            }
            None => {}
        }
    }
}

/// Depth of each sibling within its group: 0 without needs, else one more than
/// the deepest need. `index` gives a sibling's place by its id. Most files
/// list a node after its needs, and one pass in their order settles every
/// depth then; otherwise Kahn's order (iterative, so a chain of thousands
/// of nodes needs no deep recursion; the workflow was validated acyclic).
fn depths(specs: &[NodeSpec], index: &HashMap<&str, usize, ahash::RandomState>) -> Vec<u32> {
    let mut depth = vec![0u32; specs.len()];
    let in_order = specs.iter().enumerate().all(|(i, s)| {
        s.needs.iter().all(|n| match index.get(n.as_str()) {
            Some(&j) if j < i => {
                depth[i] = depth[i].max(depth[j] + 1);
                true
            }
            Some(_) => false,
            None => true,
        })
    });
    if in_order {
        return depth;
    }
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
    depth.fill(0);
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

/// Sets `plan.xml_hash` to the SHA-256 hex of the plan's canonical XML:
/// one `<node>` per instance in mount order, a started group's children
/// inside it. An instance is named by its path after its parent's (`.fix`,
/// `[2].say`, `@1.check`; the whole path at the top level), so the text
/// grows with the number of instances, not with their depth times their
/// number.
///
/// Nothing before `order[changed]` may have changed since the last call:
/// hashing starts again from the mark before it, so a group start deep in
/// a plan, or at its end, costs what follows it rather than the whole
/// plan (200 nested loops wrote the whole plan once per level).
fn hash_from(plan: &mut Plan, workflow: &str, changed: usize) {
    let keep = plan.marks.partition_point(|m| m.index <= changed);
    plan.marks.truncate(keep);
    let (mut hasher, mut open, start) = match plan.marks.last() {
        Some(m) => (m.hasher.clone(), m.open.clone(), m.index),
        None => {
            let mut h = Sha256::new();
            h.update(format!("<plan workflow=\"{}\">", esc(workflow)));
            (h, Vec::new(), 0)
        }
    };
    // Written in pieces of a few KiB: the whole text of a 100,000-node plan
    // is never held.
    let mut xml = String::with_capacity(8 << 10);
    for (index, inst) in plan.order.iter().enumerate().skip(start) {
        if index % MARK_EVERY == 0 && index > start {
            hasher.update(xml.as_bytes());
            xml.clear();
            plan.marks.push(Mark {
                index,
                hasher: hasher.clone(),
                open: open.clone(),
            });
        } else if xml.len() >= 8 << 10 {
            hasher.update(xml.as_bytes());
            xml.clear();
        }
        while let Some(top) = open.last() {
            if inst.parent() == Some(&top.key) {
                break;
            }
            xml.push_str("</node>");
            open.pop();
        }
        write_node(&mut xml, inst);
        if inst.started {
            open.push(inst.clone());
        }
    }
    for _ in open {
        xml.push_str("</node>");
    }
    xml.push_str("</plan>");
    hasher.update(xml.as_bytes());
    plan.xml_hash = hex::encode(hasher.finalize());
}

/// One instance's element, open (`>`) when it is a started group.
fn write_node(xml: &mut String, inst: &Inst) {
    let key = &inst.key;
    let base = inst.parent().map_or(0, |p| p.0.len());
    xml.push_str("<node id=\"");
    esc_into(xml, key.0.get(base..).unwrap_or(&key.0));
    // Pushed piece by piece: `write!` costs several times as much.
    let mut num = itoa::Buffer::new();
    xml.push_str("\" iteration=\"");
    xml.push_str(num.format(key.1));
    xml.push_str("\" kind=\"");
    xml.push_str(inst.spec.kind.name());
    xml.push_str("\" layer=\"");
    xml.push_str(num.format(inst.layer));
    xml.push('"');
    if !inst.needs.is_empty() {
        xml.push_str(" needs=\"");
        for (i, k) in inst.needs.iter().enumerate() {
            if i > 0 {
                xml.push(' ');
            }
            esc_into(xml, k.0.get(base..).unwrap_or(&k.0));
        }
        xml.push('"');
    }
    xml.push_str(if inst.started { ">" } else { "/>" });
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

    #[test]
    fn an_instance_and_its_arc_fit_96_bytes() {
        // One per node of the plan: 112 bytes of allocation past 96.
        assert!(std::mem::size_of::<Inst>() + 2 * std::mem::size_of::<usize>() <= 96);
        // A single need inline costs nothing beside a boxed slice's place.
        assert_eq!(std::mem::size_of::<Needs>(), std::mem::size_of::<Key>());
    }

    const NESTED: &str = r#"
name: nested
nodes:
  - id: a
    value: 1
  - id: outer
    needs: [a]
    loop:
      until: "false"
      max_iterations: 3
      nodes:
        - id: x
          value: 1
        - id: each
          needs: [x]
          for_each: "[1, 2]"
          nodes:
            - id: say
              value: 1
            - id: inner
              needs: [say]
              loop:
                until: "false"
                max_iterations: 2
                nodes:
                  - id: leaf
                    value: 1
  - id: z
    needs: [outer]
    value: 1
"#;

    /// Mounting one group's subtree again gives exactly the plan a full
    /// render gives, frame hash included, through every start and pass of
    /// loops and for_each nested in each other.
    const WIDE: &str = r#"
name: nested
nodes:
  - id: a
    value: 1
  - id: each
    needs: [a]
    for_each: "[1]"
    nodes:
      - id: say
        value: 1
      - id: inner
        needs: [say]
        loop:
          until: "false"
          max_iterations: 3
          nodes:
            - id: leaf
              value: 1
  - id: z
    needs: [each]
    value: 1
"#;

    /// `levels` loops nested in each other, a value node at the bottom.
    fn deep(levels: usize) -> String {
        let mut y = String::from("name: nested\nnodes:\n");
        let mut pad = String::from("  ");
        for _ in 0..levels {
            y.push_str(&format!(
                "{pad}- id: l\n{pad}  loop:\n{pad}    until: \"false\"\n{pad}    max_iterations: 2\n{pad}    nodes:\n"
            ));
            pad.push_str("      ");
        }
        y.push_str(&format!("{pad}- id: v\n{pad}  value: 1\n"));
        y
    }

    #[test]
    fn a_group_rerender_matches_a_full_render() {
        // Few elements keep the plan under one hash mark; more put the
        // changes between marks, and before and after them.
        rerender_matches_full_render(NESTED, 2, 16);
        rerender_matches_full_render(NESTED, 30, 16);
        rerender_matches_full_render(WIDE, 100, 6);
        rerender_matches_full_render(&deep(150), 0, 304);
    }

    fn rerender_matches_full_render(yaml: &str, elements: usize, rounds: usize) {
        let wf = Arc::new(cairn_workflow::parse(yaml, std::path::Path::new("/w.yaml")).unwrap());
        let tree = SpecTree::new(&wf);
        let mut shape = Shape::default();
        let mut paths = Paths::default();
        let mut plan = render(&tree, "nested", &shape, &mut paths);
        let mut steps = 0;
        // Start every group in mount order, then move each loop through its
        // passes, checking after every change.
        for round in 0..rounds {
            let groups: Vec<Key> = plan
                .order
                .iter()
                .filter(|i| i.spec.kind.children().is_some())
                .map(|i| i.key.clone())
                .collect();
            for g in groups {
                if !plan.insts.contains_key(&g) {
                    continue;
                }
                let inst = plan.insts[&g].clone();
                if !shape.started_groups.contains(&g) {
                    shape.started_groups.insert(g.clone());
                    match inst.spec.kind.group() {
                        Some(Group::Loop { .. }) => {
                            shape.loop_pass.insert(g.clone(), 0);
                        }
                        Some(Group::ForEach { .. }) | None => {
                            shape.lists.insert(
                                g.clone(),
                                Arc::new((0..elements).map(Value::from).collect()),
                            );
                        }
                    }
                } else if matches!(inst.spec.kind.group(), Some(Group::Loop { .. }))
                    && round % 2 == 1
                {
                    *shape.loop_pass.get_mut(&g).unwrap() += 1;
                } else {
                    continue;
                }
                let before: Vec<Key> = plan.order.iter().map(|i| i.key.clone()).collect();
                let change =
                    rerender_group(&tree, "nested", &shape, &mut paths, &mut plan, &g).unwrap();
                let full = render(&tree, "nested", &shape, &mut paths);
                let keys = |p: &Plan| p.order.iter().map(|i| i.key.clone()).collect::<Vec<Key>>();
                assert_eq!(keys(&plan), keys(&full), "order after changing {g:?}");
                assert_eq!(plan.xml_hash, full.xml_hash, "hash after changing {g:?}");
                let mut a: Vec<&Key> = plan.insts.iter().map(|i| &i.key).collect();
                let mut b: Vec<&Key> = full.insts.iter().map(|i| &i.key).collect();
                a.sort();
                b.sort();
                assert_eq!(a, b);
                for k in &change.added {
                    assert!(!before.contains(k) && full.insts.contains_key(k));
                }
                for i in &change.removed {
                    assert!(before.contains(&i.key) && !full.insts.contains_key(&i.key));
                }
                let appeared = full
                    .order
                    .iter()
                    .filter(|i| !before.contains(&i.key))
                    .count();
                let went = before
                    .iter()
                    .filter(|k| !full.insts.contains_key(k))
                    .count();
                assert_eq!((change.added.len(), change.removed.len()), (appeared, went));
                steps += 1;
            }
        }
        assert!(steps > 10, "only {steps} changes were checked");
    }

    /// Each instance's layer by path, for a workflow of `nodes` listed in
    /// that order (`(id, needs)`).
    fn layers(nodes: &[(&str, &[&str])]) -> Vec<(String, u32)> {
        let mut y = String::from("name: layers\nnodes:\n");
        for (id, needs) in nodes {
            y.push_str(&format!("  - id: {id}\n    value: 1\n"));
            if !needs.is_empty() {
                y.push_str(&format!("    needs: [{}]\n", needs.join(", ")));
            }
        }
        let wf = Arc::new(cairn_workflow::parse(&y, std::path::Path::new("/w.yaml")).unwrap());
        let plan = render(
            &SpecTree::new(&wf),
            "layers",
            &Shape::default(),
            &mut Paths::default(),
        );
        let mut out: Vec<(String, u32)> = plan
            .order
            .iter()
            .map(|i| (i.key.0.to_string(), i.layer))
            .collect();
        out.sort();
        out
    }

    #[test]
    fn layers_do_not_depend_on_the_order_siblings_are_listed_in() {
        let a: (&str, &[&str]) = ("a", &[]);
        let b: (&str, &[&str]) = ("b", &["a"]);
        let c: (&str, &[&str]) = ("c", &["a", "b"]);
        let d: (&str, &[&str]) = ("d", &["c"]);
        let want: Vec<(String, u32)> = [("a", 0), ("b", 1), ("c", 2), ("d", 3)]
            .iter()
            .map(|&(p, l)| (p.to_string(), l))
            .collect();
        // Needs listed first (one pass), and after their dependents.
        assert_eq!(layers(&[a, b, c, d]), want);
        assert_eq!(layers(&[d, c, b, a]), want);
        assert_eq!(layers(&[b, d, a, c]), want);
    }

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
