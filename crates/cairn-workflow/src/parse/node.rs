//! One node of a workflow: its kind, the fields it may have, its id, needs
//! and settings; and the checks among the nodes of one list.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::{closest, is_node_id, join, Cx, Fields, COMMON_NODE_FIELDS, NODE_SANDBOX_FIELDS};
use crate::error::Problem;
use crate::kinds::{self, KindDef, NodeKind};
use crate::model::*;
use crate::yaml::{self, Node, Pos, Streamed, Yaml};

/// A node as far as it could be read; sibling checks need ids and needs even when the rest of
/// the node is broken.
struct NodeRead {
    id: Option<(String, Pos)>,
    /// The needs, moved into the spec when there is one.
    needs: Vec<String>,
    needs_pos: Vec<Pos>,
    pos: Pos,
    spec: Option<NodeSpec>,
}

/// What the sibling checks of a list keep of each node until the list ends: positions, and
/// the id and needs themselves only when the node has no spec to hold them. A large list
/// keeps one of these per node beside its specs, so it is kept small.
struct Partial {
    pos: Pos,
    /// Where the id is written (meaningful when there is an id).
    id_pos: Pos,
    /// Where each of the needs is written, in order.
    needs_pos: Box<[Pos]>,
    names: Names,
}

/// Where a [`Partial`]'s id and needs are.
enum Names {
    /// In the list's spec at this index.
    Spec(usize),
    /// Here: the node did not read into a spec.
    Loose(Box<(Option<String>, Vec<String>)>),
}

impl Partial {
    fn id<'a>(&'a self, specs: &'a [NodeSpec]) -> Option<&'a str> {
        match &self.names {
            Names::Spec(i) => Some(&specs[*i].id),
            Names::Loose(l) => l.0.as_deref(),
        }
    }

    fn needs<'a>(&'a self, specs: &'a [NodeSpec]) -> &'a [String] {
        match &self.names {
            Names::Spec(i) => &specs[*i].needs,
            Names::Loose(l) => &l.1,
        }
    }
}

impl Cx {
    /// A node's `sandbox: { isolation, limits }`.
    fn node_sandbox(&mut self, node: &Node, field: &str) -> NodeSandbox {
        let mut out = NodeSandbox::default();
        let Some(f) = self.fields(node, field, NODE_SANDBOX_FIELDS, "in a node's sandbox") else {
            return out;
        };
        if let Some((_, i)) = f.get("isolation") {
            out.isolation = self.isolation(i, &join(field, "isolation"));
        }
        if let Some((_, l)) = f.get("limits") {
            out.limits = self.limits(l, &join(field, "limits"));
        }
        out
    }

    /// A list of nodes (`nodes`, a group's body), read.
    pub(crate) fn nodes(&mut self, node: &Node, field: &str) -> Vec<NodeSpec> {
        if let Yaml::Nodes(slot) = &node.value {
            let Streamed { specs, problems } = slot.take();
            self.problems.extend(problems);
            return specs;
        }
        // A list the builder did not stream (one copied by an alias) is read here.
        let Yaml::Seq(items) = &node.value else {
            self.at(
                node.pos,
                Some(field),
                format!("expected a list of nodes, found {}", node.value.type_name()),
            );
            return Vec::new();
        };
        use yaml::Lists;
        let mut list = self.open(field);
        for (i, n) in items.iter().enumerate() {
            self.item(&mut list, &format!("{field}[{i}]"), n);
        }
        let Streamed { specs, problems } = self.close(list, node.pos);
        self.problems.extend(problems);
        specs
    }

    /// Checks that apply among siblings: unique ids, `needs` naming siblings, no cycles.
    /// `field` is the list's field path; `specs` holds the specs the partials point to.
    fn siblings(&mut self, field: &str, partials: &[Partial], specs: &[NodeSpec]) {
        let first = self.unique_ids(field, partials, specs);
        self.needs_are_siblings(field, partials, specs, &first);
        self.switch_branches(field, partials, specs, &first);
        // Cycles: depth-first search in file order; each cycle is reported once, at the
        // node where the search first entered it.
        // A duplicated id leads to its last node here (the duplicate is reported above).
        let mut last = first;
        for (i, p) in partials.iter().enumerate() {
            if let Some(id) = p.id(specs) {
                last.insert(id, i);
            }
        }
        let mut starts = Vec::with_capacity(partials.len() + 1);
        let mut targets: Vec<usize> = Vec::new();
        for p in partials {
            starts.push(targets.len());
            let id = p.id(specs);
            targets.extend(
                p.needs(specs)
                    .iter()
                    .filter_map(|n| last.get(n.as_str()).copied())
                    .filter(|&j| id != partials[j].id(specs)),
            );
        }
        starts.push(targets.len());
        let at = |i: usize, what: &str| format!("{field}[{i}].{what}");
        for cycle in cycles(&starts, &targets) {
            // Walk the cycle in `needs` direction: a needs b needs ... needs a.
            let names: Vec<&str> = cycle
                .iter()
                .chain(std::iter::once(&cycle[0]))
                .map(|&i| partials[i].id(specs).expect("a node in a cycle has an id"))
                .collect();
            let p = &partials[cycle[0]];
            let need_pos = p
                .needs(specs)
                .iter()
                .zip(p.needs_pos.iter())
                .find(|(n, _)| *n == names[1])
                .map(|(_, pos)| *pos)
                .unwrap_or(p.pos);
            self.at_hint(
                need_pos,
                Some(&at(cycle[0], "needs")),
                format!("cycle in needs: {}", names.join(" -> ")),
                Some("a node cannot (indirectly) wait for itself".into()),
            );
        }
    }

    /// Reports every id used twice in the list; returns each id's first node.
    fn unique_ids<'s>(
        &mut self,
        field: &str,
        partials: &'s [Partial],
        specs: &'s [NodeSpec],
    ) -> HashMap<&'s str, usize> {
        let at = |i: usize, what: &str| format!("{field}[{i}].{what}");
        let mut first: HashMap<&str, usize> = HashMap::with_capacity(partials.len());
        for (i, p) in partials.iter().enumerate() {
            let Some(id) = p.id(specs) else { continue };
            if let Some(&prev) = first.get(id) {
                let line = partials[prev].pos.line;
                self.at_hint(
                    p.id_pos,
                    Some(&at(i, "id")),
                    format!("duplicate node id `{id}`"),
                    Some(format!(
                        "ids must be unique in their group; first used on line {line}"
                    )),
                );
            } else {
                first.insert(id, i);
            }
        }
        first
    }

    /// Reports each `needs` that names the node itself or no sibling.
    fn needs_are_siblings(
        &mut self,
        field: &str,
        partials: &[Partial],
        specs: &[NodeSpec],
        first: &HashMap<&str, usize>,
    ) {
        let at = |i: usize, what: &str| format!("{field}[{i}].{what}");
        for (i, p) in partials.iter().enumerate() {
            let id = p.id(specs);
            for (need, pos) in p.needs(specs).iter().zip(p.needs_pos.iter()) {
                if id == Some(need.as_str()) {
                    self.at(
                        *pos,
                        Some(&at(i, "needs")),
                        format!("`{need}` cannot need itself"),
                    );
                } else if !first.contains_key(need.as_str()) {
                    let hint = closest(need, partials.iter().filter_map(|p| p.id(specs)))
                        .map(|c| format!("did you mean `{c}`?"))
                        .or_else(|| {
                            need.contains('.').then(|| {
                                "`needs` names a sibling by its id, not a path".to_string()
                            })
                        });
                    self.at_hint(
                        *pos,
                        Some(&at(i, "needs")),
                        format!("`{need}` is not a node in this group"),
                        hint,
                    );
                }
            }
        }
    }

    /// Reports each node a `switch` lists that is no sibling, or that does
    /// not have the switch in its `needs` (it would start before the
    /// branch is chosen).
    fn switch_branches(
        &mut self,
        field: &str,
        partials: &[Partial],
        specs: &[NodeSpec],
        first: &HashMap<&str, usize>,
    ) {
        for (i, p) in partials.iter().enumerate() {
            let Names::Spec(si) = p.names else { continue };
            let spec = &specs[si];
            let NodeKind::Switch(sw) = &spec.kind else {
                continue;
            };
            let branches = sw
                .cases
                .iter()
                .map(|(l, ids)| (format!("cases.{l}"), ids))
                .chain(sw.default.iter().map(|ids| ("default".to_string(), ids)));
            for (where_, ids) in branches {
                let f = format!("{field}[{i}].switch.{where_}");
                for id in ids {
                    match first.get(id.as_str()) {
                        None => {
                            let hint = closest(id, partials.iter().filter_map(|p| p.id(specs)))
                                .map(|c| format!("did you mean `{c}`?"));
                            self.at_hint(
                                p.pos,
                                Some(&f),
                                format!("`{id}` is not a node in this group"),
                                hint,
                            );
                        }
                        Some(&j) if !partials[j].needs(specs).contains(&spec.id) => {
                            self.at_hint(
                                partials[j].pos,
                                Some(&f),
                                format!(
                                    "`{id}` is in a branch of switch `{}` but does not need it",
                                    spec.id
                                ),
                                Some(format!("add `{}` to the `needs` of `{id}`", spec.id)),
                            );
                        }
                        Some(_) => {}
                    }
                }
            }
        }
    }

    /// One node of a list: what could be read of it, with every problem
    /// found reported.
    fn node(&mut self, node: &Node, field: &str) -> NodeRead {
        let mut partial = NodeRead {
            id: None,
            needs: Vec::new(),
            needs_pos: Vec::new(),
            pos: node.pos,
            spec: None,
        };
        let Yaml::Map(entries) = &node.value else {
            self.at(
                node.pos,
                Some(field),
                format!(
                    "expected a node (a mapping with `id` and a kind), found {}",
                    node.value.type_name()
                ),
            );
            return partial;
        };
        let kind = self.node_kind(entries, node.pos, field);
        let f = self.node_fields(entries, kind, field);
        let id = self.node_id(&f, node.pos, field);
        if let Some(id) = &id {
            partial.id = Some(id.clone());
        }
        let id = id.map(|(id, _)| id);
        if let Some((_, v)) = f.get("needs") {
            self.node_needs(v, &join(field, "needs"), &mut partial);
        }
        let before = self.problems.len();
        let settings = self.node_settings(&f, kind, field);
        let kind = kind.and_then(|k| {
            let (_, v) = f.get(k.key)?;
            (k.parse)(self, v, &f, field)
        });
        if self.problems.len() != before {
            return partial;
        }
        if let (Some(id), Some(kind)) = (id, kind) {
            let settings = self.shared_settings(settings);
            partial.spec = Some(NodeSpec {
                id,
                kind,
                needs: {
                    // The spec stays for the run: no room past the last need.
                    let mut needs = std::mem::take(&mut partial.needs);
                    needs.shrink_to_fit();
                    needs
                },
                line: node.pos.line,
                settings,
            });
        }
        partial
    }

    /// The node's kind: the one key of [`KINDS`] among its keys.
    fn node_kind(
        &mut self,
        entries: &[(Node, Node)],
        pos: Pos,
        field: &str,
    ) -> Option<&'static KindDef> {
        let kinds: Vec<&'static KindDef> = entries
            .iter()
            .filter_map(|(k, _)| match &k.value {
                Yaml::Str(s) => kinds::kind_named(s),
                _ => None,
            })
            .collect();
        match kinds.as_slice() {
            [one] => Some(*one),
            [] => {
                self.at_hint(
                    pos,
                    Some(field),
                    "node has no kind",
                    Some(format!("give exactly one of: {}", kinds::keys_list())),
                );
                None
            }
            many => {
                let list: Vec<String> = many.iter().map(|k| format!("`{}`", k.key)).collect();
                self.at_hint(
                    pos,
                    Some(field),
                    format!("node has more than one kind: {}", list.join(" and ")),
                    Some("give exactly one kind key per node".into()),
                );
                None
            }
        }
    }

    /// The node's fields, checked against what its kind allows. A field
    /// that belongs to another kind is told so (sharper than "unknown").
    fn node_fields<'n>(
        &mut self,
        entries: &'n [(Node, Node)],
        kind: Option<&'static KindDef>,
        field: &str,
    ) -> Fields<'n> {
        let allowed: Vec<&str> = COMMON_NODE_FIELDS
            .iter()
            .copied()
            .chain(kinds::node_fields(kind))
            .collect();
        let what = match kind {
            Some(k) => format!("on a `{}` node", k.key),
            None => "on a node".to_string(),
        };
        let mut misplaced = HashSet::new();
        if let Some(kind) = kind {
            for (k, _) in entries {
                let key = k.key_text();
                if allowed.contains(&key.as_str()) {
                    continue;
                }
                let Some(owner) = kinds::owner_of(&key) else {
                    continue;
                };
                let hint = kind
                    .misplaced_hints
                    .iter()
                    .find(|(f, _)| *f == key)
                    .map(|(_, h)| h.to_string());
                self.at_hint(
                    k.pos,
                    Some(&join(field, &key)),
                    format!("`{key}` is only allowed on `{}` nodes", owner.key),
                    hint,
                );
                misplaced.insert(key);
            }
        }
        self.fields_in(
            entries
                .iter()
                .filter(|(k, _)| !misplaced.contains(&k.key_text())),
            field,
            &allowed,
            &what,
        )
    }

    /// `id`, with where it is written.
    fn node_id(&mut self, f: &Fields<'_>, pos: Pos, field: &str) -> Option<(String, Pos)> {
        let Some((_, v)) = f.get("id") else {
            self.at(pos, Some(&join(field, "id")), "missing required field `id`");
            return None;
        };
        let id = self.string(v, &join(field, "id"))?;
        if is_node_id(&id) {
            return Some((id, v.pos));
        }
        self.at_hint(
            v.pos,
            Some(&join(field, "id")),
            format!("`{id}` is not a valid node id"),
            Some(
                "use letters, digits, `_` and `-`; `.`, `[` and `]` are reserved for paths".into(),
            ),
        );
        None
    }

    /// `needs`: one id or a list of them, each with where it is written.
    fn node_needs(&mut self, v: &Node, nf: &str, partial: &mut NodeRead) {
        match &v.value {
            Yaml::Str(s) => {
                partial.needs.push(s.clone());
                partial.needs_pos.push(v.pos);
            }
            Yaml::Seq(items) => {
                partial.needs.reserve_exact(items.len());
                partial.needs_pos.reserve_exact(items.len());
                for item in items {
                    if let Some(s) = self.string(item, nf) {
                        partial.needs.push(s);
                        partial.needs_pos.push(item.pos);
                    }
                }
            }
            other => self.at(
                v.pos,
                Some(nf),
                format!("expected a list of node ids, found {}", other.type_name()),
            ),
        }
    }

    /// Everything but the id, the needs and the kind's own settings.
    fn node_settings(
        &mut self,
        f: &Fields<'_>,
        kind: Option<&'static KindDef>,
        field: &str,
    ) -> NodeSettings {
        let if_ = f
            .get("if")
            .and_then(|(_, v)| self.expr(v, &join(field, "if")));
        let handler = if_
            .as_deref()
            .is_some_and(|e| self.templates.calls_status(e));
        let stage = f
            .get("stage")
            .and_then(|(_, v)| self.string(v, &join(field, "stage")));
        let timeout = f
            .get("timeout")
            .and_then(|(_, v)| self.duration(v, &join(field, "timeout")));
        let retry = f
            .get("retry")
            .and_then(|(_, v)| self.retry(v, &join(field, "retry")));
        let max_output_bytes = f
            .get("max_output_bytes")
            .and_then(|(_, v)| self.uint(v, &join(field, "max_output_bytes"), 1));
        let sandbox = match f.get("sandbox") {
            Some((_, v)) => self.node_sandbox(v, &join(field, "sandbox")),
            None => NodeSandbox::default(),
        };
        let on_failure = self.choice(
            f,
            field,
            "on_failure",
            &[("fail", OnFailure::Fail), ("continue", OnFailure::Continue)],
            "`{}` is not an on_failure policy; use `fail` or `continue`",
        );
        let on_interrupt = self.choice(
            f,
            field,
            "on_interrupt",
            &[("rerun", OnInterrupt::Rerun), ("fail", OnInterrupt::Fail)],
            "`{}` is not an on_interrupt policy; use `rerun` or `fail`",
        );
        let on_retry = self.on_retry(f, kind, field);
        let env = match f.get("env") {
            Some((_, v)) => self.env(v, &join(field, "env")),
            None => BTreeMap::new(),
        };
        let cwd = f
            .get("cwd")
            .and_then(|(_, v)| self.template(v, &join(field, "cwd")));
        let output = self.choice(
            f,
            field,
            "output",
            &[
                ("text", OutputFormat::Text),
                ("json", OutputFormat::Json),
                ("lines", OutputFormat::Lines),
            ],
            "`{}` is not an output format; use `text`, `json` or `lines`",
        );
        let scorers = match f.get("scorers") {
            Some((_, v)) => self.scorers(v, &join(field, "scorers")),
            None => Vec::new(),
        };
        let secrets = match f.get("secrets") {
            Some((_, v)) => self.node_secrets(v, &join(field, "secrets")),
            None => Vec::new(),
        };
        NodeSettings {
            if_,
            handler,
            stage,
            timeout,
            retry,
            on_failure,
            on_interrupt,
            on_retry,
            env,
            cwd,
            output,
            max_output_bytes,
            sandbox,
            scorers,
            secrets,
        }
    }

    /// One of a few words (`key` of the node), the first being the default;
    /// `wrong` says what a word that is none of them is (its `{}` is the
    /// word).
    fn choice<T: Copy>(
        &mut self,
        f: &Fields<'_>,
        field: &str,
        key: &str,
        words: &[(&str, T)],
        wrong: &str,
    ) -> T {
        let default = words[0].1;
        let Some((_, v)) = f.get(key) else {
            return default;
        };
        let kf = join(field, key);
        let Some(word) = self.string(v, &kf) else {
            return default;
        };
        match words.iter().find(|(w, _)| *w == word) {
            Some((_, value)) => *value,
            None => {
                self.at(v.pos, Some(&kf), wrong.replace("{}", &word));
                default
            }
        }
    }

    /// `on_retry`: `keep`, or `revert` for a kind that changes files.
    fn on_retry(&mut self, f: &Fields<'_>, kind: Option<&'static KindDef>, field: &str) -> OnRetry {
        let Some((_, v)) = f.get("on_retry") else {
            return OnRetry::Keep;
        };
        let of = join(field, "on_retry");
        match self.string(v, &of).as_deref() {
            Some("keep") | None => OnRetry::Keep,
            Some("revert") if !kind.is_some_and(|k| k.changes_files) => {
                self.at(
                    v.pos,
                    Some(&of),
                    format!(
                        "`on_retry: revert` restores the files a node changed; only {} nodes change files",
                        kinds::file_changing_kinds()
                    ),
                );
                OnRetry::Keep
            }
            Some("revert") => OnRetry::Revert,
            Some(other) => {
                self.at(
                    v.pos,
                    Some(&of),
                    format!("`{other}` is not an on_retry policy; use `keep` or `revert`"),
                );
                OnRetry::Keep
            }
        }
    }

    /// `env`: variable names to values, each a template.
    fn env(&mut self, v: &Node, ef: &str) -> BTreeMap<String, String> {
        let mut env = BTreeMap::new();
        let Yaml::Map(entries) = &v.value else {
            self.at(
                v.pos,
                Some(ef),
                format!(
                    "expected a mapping of variables, found {}",
                    v.value.type_name()
                ),
            );
            return env;
        };
        for (k, val) in entries {
            let key = k.key_text();
            let kf = join(ef, &key);
            if let Some(text) = self.text(val, &kf) {
                self.check_template_at(&text, val.pos, &kf);
                env.insert(key, text);
            }
        }
        env
    }
    /// `settings` as a shared allocation: the previous node's when equal.
    fn shared_settings(&mut self, settings: NodeSettings) -> std::sync::Arc<NodeSettings> {
        match &self.last_settings {
            Some(last) if **last == settings => last.clone(),
            _ => {
                let shared = std::sync::Arc::new(settings);
                self.last_settings = Some(shared.clone());
                shared
            }
        }
    }
}

/// A list of nodes being read: the specs so far, what sibling checks need of each node, and
/// the problems found before the list (set aside while the list collects its own).
pub(crate) struct OpenList {
    field: String,
    partials: Vec<Partial>,
    specs: Vec<NodeSpec>,
    before: Vec<Problem>,
}

impl yaml::Lists for Cx {
    type Open = OpenList;

    fn open(&mut self, field: &str) -> OpenList {
        OpenList {
            field: field.to_string(),
            partials: Vec::new(),
            specs: Vec::new(),
            before: std::mem::take(&mut self.problems),
        }
    }

    fn item(&mut self, list: &mut OpenList, field: &str, item: &Node) {
        let read = self.node(item, field);
        let id_pos = read.id.as_ref().map_or(read.pos, |(_, pos)| *pos);
        let needs_pos = read.needs_pos.into_boxed_slice();
        let names = match read.spec {
            Some(spec) => {
                list.specs.push(spec);
                Names::Spec(list.specs.len() - 1)
            }
            None => Names::Loose(Box::new((read.id.map(|(id, _)| id), read.needs))),
        };
        list.partials.push(Partial {
            pos: read.pos,
            id_pos,
            needs_pos,
            names,
        });
    }

    fn close(&mut self, list: OpenList, pos: Pos) -> Streamed {
        if list.partials.is_empty() {
            self.at(pos, Some(&list.field), "needs at least one node");
        }
        // One vector grown as usual: at this size the allocator maps it apart and grows it
        // in place, where gathering chunks and joining them at the end held both at once
        // (measured). No room is kept past the last spec: the specs stay for the run.
        let mut specs = list.specs;
        specs.shrink_to_fit();
        self.siblings(&list.field, &list.partials, &specs);
        let problems = std::mem::replace(&mut self.problems, list.before);
        Streamed { specs, problems }
    }
}

/// The cycles of a graph whose edges are in one flat list (`targets[starts[v]..
/// starts[v + 1]]` are `v`'s), each once, as the depth-first search in vertex order
/// first enters it. The search keeps its own stack: a chain of 100,000 nodes is as deep
/// as it goes.
fn cycles(starts: &[usize], targets: &[usize]) -> Vec<Vec<usize>> {
    let n = starts.len() - 1;
    let mut state = vec![0u8; n]; // 0 new, 1 on stack, 2 done
    let mut reported: HashSet<Vec<usize>> = HashSet::new();
    let mut cycles: Vec<Vec<usize>> = Vec::new();
    // The search's path, and for each vertex on it the next edge to follow.
    let mut path: Vec<usize> = Vec::new();
    let mut next_edge: Vec<usize> = Vec::new();
    for root in 0..n {
        if state[root] != 0 {
            continue;
        }
        state[root] = 1;
        path.push(root);
        next_edge.push(starts[root]);
        while let Some(&v) = path.last() {
            let e = next_edge.last_mut().expect("one per vertex on the path");
            if *e == starts[v + 1] {
                path.pop();
                next_edge.pop();
                state[v] = 2;
                continue;
            }
            let w = targets[*e];
            *e += 1;
            if state[w] == 1 {
                let start = path.iter().position(|&x| x == w).expect("w is on the path");
                let cycle: Vec<usize> = path[start..].to_vec();
                let mut key = cycle.clone();
                key.sort_unstable();
                if reported.insert(key) {
                    cycles.push(cycle);
                }
            } else if state[w] == 0 {
                state[w] = 1;
                path.push(w);
                next_edge.push(starts[w]);
            }
        }
    }
    cycles
}
