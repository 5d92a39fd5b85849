//! The static check of what templates and expressions refer to, run once a
//! workflow has parsed: by `cairn validate` and before any run starts.
//!
//! Every template and expression the parser met is kept as a [`Site`] (its
//! text, its place in the file, its field path). Once the whole tree is
//! known, each name a site reads is resolved the way the engine will
//! resolve it: `nodes.<id>` against the node's siblings and then those of
//! each group around it, `nodes['a.b']` by path from the top, `input.<x>`
//! against the input schema's properties, a node's fields (`output`,
//! `status`, `attempt`, `error`) and, where the output has a known shape
//! (a `value` mapping, an approval, an agent's `output_schema`), the keys
//! of its output. A node read by a sibling must be among the sibling's
//! `needs`, directly or through its dependencies, or the read would see
//! nothing at run time.

use std::collections::{BTreeSet, HashMap, HashSet};

use crate::kinds::NodeKind;
use crate::model::{NodeSpec, Workflow};
use crate::parse::{closest, Cx};
use crate::refs::{references, Reference, Step};
use crate::templates::STATUS_FUNCTIONS;
use crate::yaml::Pos;

/// A template or expression as the parser met it.
#[derive(Debug)]
pub(crate) struct Site {
    pub pos: Pos,
    pub field: Box<str>,
    pub text: Box<str>,
    /// An expression (`if`, `until`, `for_each`, `switch.on`), not a
    /// template string.
    pub expr: bool,
}

/// The fields of a node entry under `nodes`.
const NODE_FIELDS: &[&str] = &["output", "status", "attempt", "error"];

/// Functions templates may call besides the status functions.
const GLOBAL_FUNCTIONS: &[&str] = &["range", "dict", "namespace", "debug"];

/// Where a site is: the chain of nodes from the top down to its node,
/// each as (its siblings, its index among them), and the rest of its field.
struct Place<'w, 'f> {
    chain: Vec<(&'w [NodeSpec], usize)>,
    rest: &'f str,
}

/// The node list and index path a field names (`nodes[2].loop.nodes[0]…`).
fn place<'w, 'f>(wf: &'w Workflow, field: &'f str) -> Option<Place<'w, 'f>> {
    let mut rest = field.strip_prefix("nodes[")?;
    let mut list: &'w [NodeSpec] = &wf.nodes;
    let mut chain = Vec::new();
    loop {
        let end = rest.find(']')?;
        let i: usize = rest[..end].parse().ok()?;
        if i >= list.len() {
            return None;
        }
        chain.push((list, i));
        rest = &rest[end + 1..];
        let body = rest
            .strip_prefix(".nodes[")
            .or_else(|| rest.strip_prefix(".loop.nodes["));
        match (body, list[i].kind.children()) {
            (Some(b), Some(children)) => {
                rest = b;
                list = children;
            }
            _ => return Some(Place { chain, rest }),
        }
    }
}

/// Each node list's ids, made once per list: a 100,000-node list is
/// looked up once per reference, and a scan per lookup made checking it
/// take minutes.
#[derive(Default)]
struct Indexes<'w> {
    by_list: HashMap<usize, HashMap<&'w str, usize>>,
}

impl<'w> Indexes<'w> {
    fn of(&mut self, list: &'w [NodeSpec]) -> &HashMap<&'w str, usize> {
        self.by_list
            .entry(list.as_ptr() as usize)
            .or_insert_with(|| {
                list.iter()
                    .enumerate()
                    .map(|(i, n)| (n.id.as_str(), i))
                    .collect()
            })
    }
}

/// Whether `spec` waits for `target` among `siblings`, directly or through
/// its dependencies. The search stops at `target`: a node reading its
/// direct need (the usual case) costs one look.
fn waits_for(
    siblings: &[NodeSpec],
    index: &HashMap<&str, usize>,
    spec: &NodeSpec,
    target: &str,
) -> bool {
    let mut seen: HashSet<&str> = HashSet::new();
    let mut todo: Vec<&str> = spec.needs.iter().map(String::as_str).collect();
    while let Some(id) = todo.pop() {
        if id == target {
            return true;
        }
        if !seen.insert(id) {
            continue;
        }
        if let Some(&i) = index.get(id) {
            todo.extend(siblings[i].needs.iter().map(String::as_str));
        }
    }
    false
}

/// A node found by its full path from the top (`review.fix`).
fn by_path<'w>(wf: &'w Workflow, path: &str, index: &mut Indexes<'w>) -> Option<&'w NodeSpec> {
    let mut list: &'w [NodeSpec] = &wf.nodes;
    let mut found = None;
    for part in path.split('.') {
        let n = &list[*index.of(list).get(part)?];
        list = n.kind.children().unwrap_or_default();
        found = Some(n);
    }
    found
}

/// The keys an output of `spec` is known to have, when its shape is known.
fn output_keys(spec: &NodeSpec) -> Option<Vec<String>> {
    match &spec.kind {
        NodeKind::Value(v) => match &*v.value() {
            serde_json::Value::Object(m) => Some(m.keys().cloned().collect()),
            _ => None,
        },
        NodeKind::Approval(_) => Some(vec!["approved".into(), "note".into(), "by".into()]),
        NodeKind::Agent(a) => {
            let schema = a.output_schema.as_ref()?;
            if schema.get("additionalProperties") != Some(&serde_json::Value::Bool(false)) {
                return None;
            }
            let props = schema.get("properties")?.as_object()?;
            Some(props.keys().cloned().collect())
        }
        NodeKind::Command(_)
        | NodeKind::Loop(_)
        | NodeKind::ForEach(_)
        | NodeKind::Tool { .. }
        | NodeKind::Ask { .. }
        | NodeKind::Workflow { .. }
        | NodeKind::Switch(_) => None,
    }
}

/// The properties an input must have named, when the schema closes them.
fn input_fields(wf: &Workflow) -> Option<Vec<String>> {
    let schema = wf.input_schema.as_ref()?;
    let props = schema.get("properties")?.as_object()?;
    // Extra fields are allowed unless the schema says otherwise, but a
    // field the schema does not name is almost always a typo.
    Some(props.keys().cloned().collect())
}

/// A `did you mean` among `candidates`; only the first
/// [`MAX_HINT_CANDIDATES`] are compared, so that a file of 100,000 nodes
/// with as many wrong names cannot make the check quadratic.
fn hint_for<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<String> {
    closest(word, candidates.into_iter().take(MAX_HINT_CANDIDATES))
        .map(|c| format!("did you mean `{c}`?"))
}

/// How many names a `did you mean` compares at most.
const MAX_HINT_CANDIDATES: usize = 200;

fn key_of(step: Option<&Step>) -> Option<&str> {
    match step {
        Some(Step::Key(k)) => Some(k),
        _ => None,
    }
}

impl Cx {
    /// Checks every site of `wf`, reporting each reference that cannot
    /// resolve.
    pub(crate) fn check_references(&mut self, wf: &Workflow, sites: &[Site]) {
        let inputs = input_fields(wf);
        let mut index = Indexes::default();
        for site in sites {
            let exprs: Vec<String> = if site.expr {
                vec![site.text.to_string()]
            } else {
                match crate::templates::expressions(&site.text) {
                    Some(e) => e,
                    None => continue,
                }
            };
            let before = self.problem_count();
            for expr in exprs {
                let Ok(refs) = references(&expr) else {
                    continue;
                };
                self.check_site(wf, site, &refs, inputs.as_deref(), &mut index);
            }
            // One site that names a node twice (`nodes.x is defined and
            // nodes.x.output`) is told once.
            self.dedup_problems_since(before);
        }
    }

    fn check_site<'w>(
        &mut self,
        wf: &'w Workflow,
        site: &Site,
        refs: &crate::refs::Refs,
        inputs: Option<&[String]>,
        index: &mut Indexes<'w>,
    ) {
        let place = place(wf, &site.field);
        if site.field.contains(".scorers[") || site.field.starts_with("models") {
            // Scorers and models render with contexts of their own.
            return;
        }
        let in_if = place.as_ref().is_some_and(|p| p.rest == ".if");
        for call in &refs.calls {
            let ok = GLOBAL_FUNCTIONS.contains(&call.as_str())
                || (in_if && STATUS_FUNCTIONS.contains(&call.as_str()));
            if !ok {
                let hint = if STATUS_FUNCTIONS.contains(&call.as_str()) {
                    Some("status functions belong in a node's `if`".to_string())
                } else {
                    hint_for(
                        call,
                        GLOBAL_FUNCTIONS
                            .iter()
                            .chain(STATUS_FUNCTIONS.iter())
                            .copied(),
                    )
                };
                self.at_hint(
                    site.pos,
                    Some(&site.field),
                    format!("unknown function `{call}()`"),
                    hint,
                );
            }
        }
        let names = scope_names(place.as_ref());
        for r in &refs.reads {
            match r.root.as_str() {
                "nodes" => self.check_node_ref(wf, site, place.as_ref(), r, index),
                "input" => {
                    if let (Some(fields), Some(k)) = (inputs, key_of(r.path.first())) {
                        if !fields.iter().any(|f| f == k) {
                            self.at_hint(
                                site.pos,
                                Some(&site.field),
                                format!("`input.{k}`: the input schema has no property `{k}`"),
                                hint_for(k, fields.iter().map(String::as_str)).or_else(|| {
                                    Some(format!("its properties: {}", fields.join(", ")))
                                }),
                            );
                        }
                    }
                }
                "run" | "workflow" => {
                    let want = if r.root == "run" { "id" } else { "name" };
                    if let Some(k) = key_of(r.path.first()).filter(|k| *k != want) {
                        self.at_hint(
                            site.pos,
                            Some(&site.field),
                            format!("`{}.{k}`: `{}` has only `{want}`", r.root, r.root),
                            None,
                        );
                    }
                }
                name if names.contains(name) => {}
                name => {
                    let hint = if STATUS_FUNCTIONS.contains(&name) {
                        Some(format!("call it: `{name}()`"))
                    } else {
                        let mut h = hint_for(name, names.iter().map(String::as_str))
                            .map(|h| format!("{h} "))
                            .unwrap_or_default();
                        h.push_str(&format!(
                            "names in scope here: {}",
                            names
                                .iter()
                                .map(String::as_str)
                                .collect::<Vec<_>>()
                                .join(", ")
                        ));
                        Some(h)
                    };
                    self.at_hint(
                        site.pos,
                        Some(&site.field),
                        format!("unknown name `{name}`"),
                        hint,
                    );
                }
            }
        }
    }

    /// `nodes.<id>…`: the node exists where the reader can see it, is
    /// among its needs, and the fields read exist.
    fn check_node_ref<'w>(
        &mut self,
        wf: &'w Workflow,
        site: &Site,
        place: Option<&Place<'w, '_>>,
        r: &Reference,
        index: &mut Indexes<'w>,
    ) {
        let Some(id) = key_of(r.path.first()) else {
            return;
        };
        if id.contains(['[', '@']) {
            // An instance of a `for_each` member, or a pass of a loop in a
            // loop: named at run time.
            return;
        }
        let target = if id.contains('.') {
            match by_path(wf, id, index) {
                Some(n) => n,
                None => {
                    self.at_hint(
                        site.pos,
                        Some(&site.field),
                        format!("`nodes['{id}']`: no node has the path `{id}`"),
                        Some(
                            "a path names a node inside groups by their ids: `group.member`".into(),
                        ),
                    );
                    return;
                }
            }
        } else {
            match self.visible(wf, site, place, id, index) {
                Some(n) => n,
                None => return,
            }
        };
        let Some(field) = key_of(r.path.get(1)) else {
            return;
        };
        if !NODE_FIELDS.contains(&field) {
            self.at_hint(
                site.pos,
                Some(&site.field),
                format!("`nodes.{id}.{field}`: a node has no field `{field}`"),
                hint_for(field, NODE_FIELDS.iter().copied())
                    .or_else(|| Some(format!("its fields: {}", NODE_FIELDS.join(", ")))),
            );
            return;
        }
        if field != "output" {
            return;
        }
        let (Some(key), Some(keys)) = (key_of(r.path.get(2)), output_keys(target)) else {
            return;
        };
        if !keys.iter().any(|k| k == key) {
            self.at_hint(
                site.pos,
                Some(&site.field),
                format!("`nodes.{id}.output.{key}`: the output of `{id}` has no `{key}`"),
                hint_for(key, keys.iter().map(String::as_str))
                    .or_else(|| Some(format!("it has: {}", keys.join(", ")))),
            );
        }
    }

    /// The node a plain `nodes.<id>` names from this site, reported when
    /// there is none or when the reader does not need it.
    fn visible<'w>(
        &mut self,
        wf: &'w Workflow,
        site: &Site,
        place: Option<&Place<'w, '_>>,
        id: &str,
        index: &mut Indexes<'w>,
    ) -> Option<&'w NodeSpec> {
        let Some(place) = place else {
            // The workflow's `output`: any top-level node, read at the end.
            if let Some(&i) = index.of(&wf.nodes).get(id) {
                return Some(&wf.nodes[i]);
            }
            self.no_such_node(site, id, wf.nodes.iter().map(|n| n.id.as_str()));
            return None;
        };
        let (list, i) = place.chain[place.chain.len() - 1];
        let own = &list[i];
        // A group's own expressions (`until`) read its members.
        if let Some(children) = own.kind.children() {
            if let Some(&c) = index.of(children).get(id) {
                return Some(&children[c]);
            }
        }
        for (level, &(siblings, at)) in place.chain.iter().enumerate().rev() {
            let anchor = &siblings[at];
            let ids = index.of(siblings);
            let Some(&found) = ids.get(id) else {
                continue;
            };
            let n = &siblings[found];
            // In a loop's body, a sibling the reader does not wait for is
            // read as the previous pass left it (`nodes.x is defined`).
            let in_loop = level > 0 && {
                let (outer, j) = place.chain[level - 1];
                matches!(outer[j].kind, NodeKind::Loop(_))
            };
            if n.id != anchor.id && !in_loop && !waits_for(siblings, ids, anchor, id) {
                self.at_hint(
                    site.pos,
                    Some(&site.field),
                    format!(
                        "`nodes.{id}` is read by `{}`, which does not wait for `{id}`",
                        anchor.id
                    ),
                    Some(format!(
                        "add `{id}` to the `needs` of `{}` (or of a node it needs)",
                        anchor.id
                    )),
                );
            }
            return Some(n);
        }
        // Nearest lists first: the likeliest meant are the reader's siblings.
        let visible = place
            .chain
            .iter()
            .rev()
            .flat_map(|(s, _)| s.iter().map(|n| n.id.as_str()));
        self.no_such_node(site, id, visible);
        None
    }

    fn no_such_node<'a>(
        &mut self,
        site: &Site,
        id: &str,
        candidates: impl IntoIterator<Item = &'a str>,
    ) {
        self.at_hint(
            site.pos,
            Some(&site.field),
            format!("`nodes.{id}`: no node `{id}` here"),
            hint_for(id, candidates),
        );
    }
}

/// The names a template may read at `place` besides `nodes`, `input`,
/// `run` and `workflow`: `iteration` everywhere, and inside a `for_each`'s
/// body `item`, `index` and its `as` name.
fn scope_names(place: Option<&Place<'_, '_>>) -> BTreeSet<String> {
    let mut names: BTreeSet<String> = ["input", "nodes", "iteration", "run", "workflow"]
        .into_iter()
        .map(String::from)
        .collect();
    let Some(place) = place else {
        return names;
    };
    let len = place.chain.len();
    for (depth, &(list, i)) in place.chain.iter().enumerate() {
        // A group's members see its names; the group's own fields do not.
        if depth + 1 == len {
            break;
        }
        if let Some(crate::kinds::Group::ForEach { as_name, .. }) = list[i].kind.group() {
            names.insert("item".into());
            names.insert("index".into());
            if let Some(a) = as_name {
                names.insert(a.to_string());
            }
        }
    }
    names
}
