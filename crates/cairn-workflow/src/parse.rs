//! Reading a workflow file into the model, reporting every problem found with its position.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use cairn_models::{Backoff, RetryPolicy};
use sha2::{Digest, Sha256};

use crate::duration::parse_duration;
use crate::error::{Problem, WorkflowError};
use crate::limits::{MAX_FILE_BYTES, MAX_VALUE_DEPTH};
use crate::model::*;
use crate::templates::Templates;
use crate::yaml::{self, Node, Pos, Streamed, Yaml};

mod models;
mod node;
mod scorers;
mod secrets;
mod triggers;

pub use triggers::{load_triggers, parse_schedule, parse_triggers};

pub(crate) use models::unknown_model_hint;

const TOP_FIELDS: &[&str] = &[
    "name",
    "description",
    "input",
    "defaults",
    "concurrency",
    "sandbox",
    "output",
    "nodes",
    "models",
    "max_cost_usd",
    "mcp_servers",
    "env",
    "secrets",
];
const MCP_FIELDS: &[&str] = &["command", "url", "headers_env", "env", "timeout"];
/// The keys every node may have, whatever its kind.
pub(crate) const COMMON_NODE_FIELDS: &[&str] = &[
    "id",
    "needs",
    "if",
    "stage",
    "timeout",
    "retry",
    "on_failure",
    "on_interrupt",
    "on_retry",
    "scorers",
    "secrets",
];
const RETRY_FIELDS: &[&str] = &["attempts", "backoff", "delay", "max_delay"];
const DEFAULTS_FIELDS: &[&str] = &["timeout", "retry"];
const SANDBOX_FIELDS: &[&str] = &[
    "root",
    "network",
    "max_output_bytes",
    "tool_timeout",
    "isolation",
    "limits",
    "read_only",
];
const NODE_SANDBOX_FIELDS: &[&str] = &["isolation", "limits"];
const LIMITS_FIELDS: &[&str] = &["memory", "processes", "cpu"];

/// Every field name of the workflow format: the keys the parser knows at
/// any level (a node's kinds and their fields from [`crate::KINDS`]). A key
/// that is not one of them is the file's own text (an unknown field, a key
/// of `env` or `args`, a model's name).
pub fn field_names() -> std::collections::BTreeSet<&'static str> {
    let lists: [&[&'static str]; 12] = [
        TOP_FIELDS,
        MCP_FIELDS,
        COMMON_NODE_FIELDS,
        RETRY_FIELDS,
        DEFAULTS_FIELDS,
        SANDBOX_FIELDS,
        NODE_SANDBOX_FIELDS,
        LIMITS_FIELDS,
        models::MODEL_FIELDS,
        models::PRICE_FIELDS,
        scorers::SCORER_FIELDS,
        scorers::SCORER_AGENT_FIELDS,
    ];
    let kinds = crate::KINDS.iter().flat_map(|d| {
        std::iter::once(d.key)
            .chain(d.fields.iter().copied())
            .chain(d.shared.iter().copied())
            .chain(d.inner.iter().copied())
    });
    lists.into_iter().flatten().copied().chain(kinds).collect()
}

/// Reads and parses a workflow file. A file larger than [`MAX_FILE_BYTES`] is refused before
/// it is read.
pub fn load(path: &Path) -> Result<Workflow, WorkflowError> {
    let source = read_limited(path, MAX_FILE_BYTES).map_err(|message| WorkflowError {
        problems: vec![Problem {
            file: path.to_path_buf(),
            line: None,
            column: None,
            field: None,
            message,
            hint: None,
        }],
    })?;
    parse_owned(source, path)
}

/// [`load`], then every child workflow the file names (`workflow` nodes,
/// agents' `delegates`) and theirs in turn, so that a broken or missing
/// child is found before the parent starts rather than halfway through it.
/// A file reached twice is read once: a workflow that names itself is
/// allowed here (its runs stop at the engine's depth limit and cycle check).
pub fn load_tree(path: &Path) -> Result<Workflow, WorkflowError> {
    let wf = load(path)?;
    let mut seen = HashSet::new();
    seen.insert(wf.path.canonicalize().unwrap_or_else(|_| wf.path.clone()));
    let mut problems = Vec::new();
    check_children(&wf, &mut seen, &mut problems);
    if problems.is_empty() {
        Ok(wf)
    } else {
        Err(WorkflowError { problems })
    }
}

fn check_children(wf: &Workflow, seen: &mut HashSet<PathBuf>, problems: &mut Vec<Problem>) {
    for (path, line) in wf.child_paths() {
        let full = wf.resolve(&path);
        if !seen.insert(full.canonicalize().unwrap_or_else(|_| full.clone())) {
            continue;
        }
        match load(&full) {
            Ok(child) => check_children(&child, seen, problems),
            // A file that cannot be read at all is the parent's mistake.
            Err(e) if e.problems.iter().all(|p| p.line.is_none()) => {
                for p in e.problems {
                    problems.push(Problem {
                        file: wf.path.clone(),
                        line: Some(line),
                        column: None,
                        field: None,
                        message: format!("child workflow `{path}`: {}", p.message),
                        hint: Some(format!("paths are relative to {}", wf.base_dir.display())),
                    });
                }
            }
            Err(e) => problems.extend(e.problems),
        }
    }
}

/// Reads a data file a workflow refers to (a scripted model's turns): YAML
/// or JSON, bounded as a workflow file is, as JSON. Syntax errors name the
/// file, line and column.
pub fn load_data(path: &Path) -> Result<serde_json::Value, WorkflowError> {
    parse_data(&read_file(path)?, path)
}

/// A file's text, bounded as a workflow file is; problems name the file.
pub fn read_file(path: &Path) -> Result<String, WorkflowError> {
    read_limited(path, MAX_FILE_BYTES).map_err(|message| WorkflowError {
        problems: vec![Problem {
            file: path.to_path_buf(),
            line: None,
            column: None,
            field: None,
            message,
            hint: None,
        }],
    })
}

/// [`load_data`] of a text already read; `path` names the file in problems.
pub fn parse_data(source: &str, path: &Path) -> Result<serde_json::Value, WorkflowError> {
    let problem = |line: Option<usize>, column: Option<usize>, message: String| WorkflowError {
        problems: vec![Problem {
            file: path.to_path_buf(),
            line,
            column,
            field: None,
            message,
            hint: None,
        }],
    };
    if source.len() as u64 > MAX_FILE_BYTES {
        return Err(problem(
            None,
            None,
            format!("the file is too large: more than the {MAX_FILE_BYTES} bytes allowed"),
        ));
    }
    let root = yaml::load(source, &mut NoLists).map_err(|e| {
        let message = if e.limit {
            e.message
        } else {
            format!("YAML syntax error: {}", e.message)
        };
        problem(
            Some(e.pos.line).filter(|l| *l > 0),
            Some(e.pos.col),
            message,
        )
    })?;
    if let Some((pos, at)) = too_deep(&root, 0) {
        let message = format!("nested deeper than {MAX_VALUE_DEPTH} levels (at `{at}`)");
        return Err(problem(Some(pos.line), Some(pos.col), message));
    }
    Ok(root.to_json())
}

/// The sink of a file that has no workflow node lists (a data file, a
/// triggers file).
pub(crate) struct NoLists;

impl yaml::Lists for NoLists {
    type Open = ();
    fn open(&mut self, _: &str) {}
    fn item(&mut self, _: &mut (), _: &str, _: &Node) {}
    fn close(&mut self, _: (), _: Pos) -> Streamed {
        Streamed::default()
    }
}

/// The file's text, refused past `max` bytes: by its size when it has one, and by reading at
/// most one byte more than `max` (a pipe or a device says nothing of its size).
fn read_limited(path: &Path, max: u64) -> Result<String, String> {
    use std::io::Read;
    let file =
        std::fs::File::open(path).map_err(|e| format!("cannot read the workflow file: {e}"))?;
    let too_large = |size: u64| {
        format!(
            "the workflow file is too large: {size} bytes, more than the {max} allowed ({} MiB)",
            max >> 20
        )
    };
    let size = file.metadata().map_or(0, |m| m.len());
    if size > max {
        return Err(too_large(size));
    }
    // Room for the whole file at once: growing by doubling would hold up to twice its size.
    let mut bytes = Vec::with_capacity(size as usize + 1);
    file.take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read the workflow file: {e}"))?;
    if bytes.len() as u64 > max {
        return Err(format!(
            "the workflow file is too large: more than the {max} bytes allowed ({} MiB)",
            max >> 20
        ));
    }
    String::from_utf8(bytes).map_err(|e| {
        format!(
            "cannot read the workflow file: it is not UTF-8 text (at byte {})",
            e.utf8_error().valid_up_to()
        )
    })
}

/// Parses and validates workflow text; `path` names the file in errors, and its folder is the
/// workflow's base folder. Text longer than [`MAX_FILE_BYTES`] is refused.
pub fn parse(source: &str, path: &Path) -> Result<Workflow, WorkflowError> {
    let mut wf = parse_text(source, path)?;
    wf.source = source.to_string();
    Ok(wf)
}

/// [`parse`] of text the caller gives away: the workflow keeps it without a copy.
fn parse_owned(source: String, path: &Path) -> Result<Workflow, WorkflowError> {
    let mut wf = parse_text(&source, path)?;
    wf.source = source;
    Ok(wf)
}

/// The workflow in `source`, but for its `source` (left empty for the caller to fill).
fn parse_text(source: &str, path: &Path) -> Result<Workflow, WorkflowError> {
    let mut cx = Cx::new(path);
    if source.len() as u64 > MAX_FILE_BYTES {
        cx.at(
            Pos::default(),
            None,
            format!(
                "the workflow is too large: {} bytes, more than the {MAX_FILE_BYTES} allowed",
                source.len()
            ),
        );
        return Err(cx.into_error());
    }
    let root = match yaml::load(source, &mut cx) {
        Ok(root) => root,
        Err(e) => {
            // Problems of the nodes read before the error mean little without the rest.
            cx.problems.clear();
            let message = if e.limit {
                e.message
            } else {
                format!("YAML syntax error: {}", e.message)
            };
            cx.at(e.pos, e.field.as_deref(), message);
            return Err(cx.into_error());
        }
    };
    let wf = cx.workflow(&root, source, path);
    drop(root);
    if let Some(wf) = wf.as_ref().filter(|_| cx.problems.is_empty()) {
        let sites = std::mem::take(&mut cx.sites);
        cx.check_references(wf, &sites);
    }
    if cx.problems.is_empty() {
        Ok(wf.expect("a workflow without problems is complete"))
    } else {
        cx.problems
            .sort_by_key(|p| (p.line.unwrap_or(0), p.column.unwrap_or(0)));
        Err(cx.into_error())
    }
}

/// The parser's state: the problems found so far, where.
pub(crate) struct Cx {
    file: PathBuf,
    problems: Vec<Problem>,
    templates: Templates,
    /// The settings of the last node read, shared with the next node whose
    /// settings are equal (siblings mostly repeat each other's).
    last_settings: Option<std::sync::Arc<NodeSettings>>,
    /// Every template and expression met, for the reference check once
    /// the whole tree is known ([`crate::check`]).
    sites: Vec<crate::check::Site>,
}

/// A mapping's entries by key, as [`Cx::fields`] checked them: each
/// entry's key node (for its position) and value.
pub(crate) type Fields<'n> = BTreeMap<String, (&'n Node, &'n Node)>;

/// `prefix.key`, or `key` at the top.
pub(crate) fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_string()
    } else {
        format!("{prefix}.{key}")
    }
}

/// The candidate a mistyped word most likely meant, if one is close.
pub(crate) fn closest<'a>(
    word: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    // Edit distance with transpositions catches `lgo` for `log`; Jaro-Winkler catches longer
    // names with a shared stem. The smallest distance wins.
    let limit = (word.chars().count() / 3).max(2);
    candidates
        .into_iter()
        .map(|c| {
            (
                strsim::osa_distance(word, c),
                strsim::jaro_winkler(word, c),
                c,
            )
        })
        .filter(|(d, jw, _)| *d <= limit || *jw >= 0.9)
        .min_by(|a, b| a.0.cmp(&b.0).then(b.1.total_cmp(&a.1)))
        .map(|(_, _, c)| c)
}

/// Letters, digits, `_` and `-` (node, model, server and scorer names).
pub(crate) fn is_node_id(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn is_workflow_name(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

impl Cx {
    fn new(path: &Path) -> Cx {
        Cx {
            file: path.to_path_buf(),
            problems: Vec::new(),
            templates: Templates::new(),
            last_settings: None,
            sites: Vec::new(),
        }
    }

    fn into_error(self) -> WorkflowError {
        WorkflowError {
            problems: self.problems,
        }
    }

    pub(crate) fn at(&mut self, pos: Pos, field: Option<&str>, message: impl Into<String>) {
        self.at_hint(pos, field, message, None);
    }

    /// How many problems were found so far.
    pub(crate) fn problem_count(&self) -> usize {
        self.problems.len()
    }

    /// Drops the repeats among the problems found since `from`.
    pub(crate) fn dedup_problems_since(&mut self, from: usize) {
        let mut seen = HashSet::new();
        let mut i = from;
        while i < self.problems.len() {
            let p = &self.problems[i];
            if seen.insert((p.field.clone(), p.message.clone())) {
                i += 1;
            } else {
                self.problems.remove(i);
            }
        }
    }

    pub(crate) fn at_hint(
        &mut self,
        pos: Pos,
        field: Option<&str>,
        message: impl Into<String>,
        hint: Option<String>,
    ) {
        self.problems.push(Problem {
            file: self.file.clone(),
            line: (pos.line > 0).then_some(pos.line),
            column: (pos.line > 0).then_some(pos.col),
            field: field.map(str::to_string),
            message: message.into(),
            hint,
        });
    }

    /// The entries of a mapping, reporting duplicate and unknown keys. `None` (with a problem)
    /// when `node` is not a mapping.
    pub(crate) fn fields<'n>(
        &mut self,
        node: &'n Node,
        field: &str,
        allowed: &[&str],
        what: &str,
    ) -> Option<BTreeMap<String, (&'n Node, &'n Node)>> {
        let Yaml::Map(entries) = &node.value else {
            let f = (!field.is_empty()).then_some(field);
            self.at(
                node.pos,
                f,
                format!("expected a mapping, found {}", node.value.type_name()),
            );
            return None;
        };
        Some(self.fields_in(entries.iter(), field, allowed, what))
    }

    /// [`Cx::fields`] of some entries of a mapping.
    pub(crate) fn fields_in<'n>(
        &mut self,
        entries: impl Iterator<Item = &'n (Node, Node)>,
        field: &str,
        allowed: &[&str],
        what: &str,
    ) -> BTreeMap<String, (&'n Node, &'n Node)> {
        let mut out: BTreeMap<String, (&'n Node, &'n Node)> = BTreeMap::new();
        for (k, v) in entries {
            let key = k.key_text();
            let kf = join(field, &key);
            if !allowed.contains(&key.as_str()) {
                let mut hint = String::new();
                if let Some(c) = closest(&key, allowed.iter().copied()) {
                    hint.push_str(&format!("did you mean `{c}`? "));
                }
                hint.push_str(&format!("allowed fields {what}: {}", allowed.join(", ")));
                self.at_hint(
                    k.pos,
                    Some(&kf),
                    format!("unknown field `{key}`"),
                    Some(hint),
                );
                continue;
            }
            if let Some((first, _)) = out.get(&key) {
                let line = first.pos.line;
                self.at_hint(
                    k.pos,
                    Some(&kf),
                    format!("duplicate field `{key}`"),
                    Some(format!("first given on line {line}")),
                );
                continue;
            }
            out.insert(key, (k, v));
        }
        out
    }

    pub(crate) fn string(&mut self, node: &Node, field: &str) -> Option<String> {
        match &node.value {
            Yaml::Str(s) => Some(s.clone()),
            other => {
                self.at(
                    node.pos,
                    Some(field),
                    format!("expected a string, found {}", other.type_name()),
                );
                None
            }
        }
    }

    /// A string, number or boolean as text (argv words, env values).
    pub(crate) fn text(&mut self, node: &Node, field: &str) -> Option<String> {
        let t = node.scalar_text();
        if t.is_none() {
            self.at(
                node.pos,
                Some(field),
                format!("expected a string, found {}", node.value.type_name()),
            );
        }
        t
    }

    pub(crate) fn bool(&mut self, node: &Node, field: &str) -> Option<bool> {
        match node.value {
            Yaml::Bool(b) => Some(b),
            ref other => {
                self.at(
                    node.pos,
                    Some(field),
                    format!("expected true or false, found {}", other.type_name()),
                );
                None
            }
        }
    }

    pub(crate) fn uint(&mut self, node: &Node, field: &str, min: i64) -> Option<u64> {
        match node.value {
            Yaml::Int(i) if i >= min => Some(i as u64),
            Yaml::Int(i) => {
                self.at(
                    node.pos,
                    Some(field),
                    format!("must be at least {min}, found {i}"),
                );
                None
            }
            ref other => {
                self.at(
                    node.pos,
                    Some(field),
                    format!("expected an integer, found {}", other.type_name()),
                );
                None
            }
        }
    }

    pub(crate) fn duration(&mut self, node: &Node, field: &str) -> Option<Duration> {
        let parsed = match &node.value {
            Yaml::Str(s) => parse_duration(s),
            Yaml::Int(i) if *i >= 0 => Ok(Duration::from_secs(*i as u64)),
            other => Err(format!(
                "expected a duration like 500ms, 30s, 10m or 1h, found {}",
                other.type_name()
            )),
        };
        match parsed {
            Ok(d) => Some(d),
            Err(msg) => {
                self.at(node.pos, Some(field), msg);
                None
            }
        }
    }

    /// `namespaces` or `none`.
    pub(crate) fn isolation(&mut self, node: &Node, field: &str) -> Option<Isolation> {
        match self.string(node, field)?.as_str() {
            "namespaces" => Some(Isolation::Namespaces),
            "none" => Some(Isolation::None),
            other => {
                self.at(
                    node.pos,
                    Some(field),
                    format!("expected `namespaces` or `none`, found `{other}`"),
                );
                None
            }
        }
    }

    /// `{ memory, processes, cpu }`.
    pub(crate) fn limits(&mut self, node: &Node, field: &str) -> ResourceLimits {
        let mut limits = ResourceLimits::default();
        let Some(f) = self.fields(node, field, LIMITS_FIELDS, "in limits") else {
            return limits;
        };
        if let Some((_, m)) = f.get("memory") {
            limits.memory_bytes = self.bytes(m, &join(field, "memory"));
        }
        if let Some((_, p)) = f.get("processes") {
            limits.processes = self.uint(p, &join(field, "processes"), 1);
        }
        if let Some((_, c)) = f.get("cpu") {
            let cf = join(field, "cpu");
            limits.cpu = self.duration(c, &cf);
            if limits.cpu.is_some_and(|d| d < Duration::from_secs(1)) {
                self.at(c.pos, Some(&cf), "must be at least 1s".to_string());
                limits.cpu = None;
            }
        }
        limits
    }

    /// A size: an integer of bytes, or a number with KiB, MiB, GiB (or K,
    /// M, G, powers of 1024 as well).
    fn bytes(&mut self, node: &Node, field: &str) -> Option<u64> {
        let parsed = match &node.value {
            Yaml::Int(i) if *i > 0 => Ok(*i as u64),
            Yaml::Str(s) => parse_bytes(s),
            other => Err(format!(
                "expected a size like 512MiB or 2GiB, found {}",
                other.type_name()
            )),
        };
        match parsed {
            Ok(b) => Some(b),
            Err(msg) => {
                self.at(node.pos, Some(field), msg);
                None
            }
        }
    }

    /// `network: [hosts]`: host names or globs, each with an optional port.
    fn hosts(&mut self, node: &Node, field: &str) -> Vec<String> {
        let Yaml::Seq(items) = &node.value else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let f = format!("{field}[{i}]");
            let Some(h) = self.string(item, &f) else {
                continue;
            };
            let (host, port) = match h.rsplit_once(':') {
                Some((host, p)) if !host.contains(':') => (host, Some(p)),
                _ => (h.as_str(), None),
            };
            let bad_host = host.is_empty()
                || host
                    .chars()
                    .any(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '*' | '_')));
            let bad_port = port.is_some_and(|p| p.parse::<u16>().map_or(true, |n| n == 0));
            if bad_host || bad_port {
                self.at_hint(
                    item.pos,
                    Some(&f),
                    format!("`{h}` is not a host pattern"),
                    Some(
                        "use a host name or glob with an optional port: pypi.org, *.github.com:443"
                            .into(),
                    ),
                );
            } else {
                out.push(h);
            }
        }
        out
    }

    /// A list of absolute folder paths.
    fn read_only(&mut self, node: &Node, field: &str) -> Vec<String> {
        let Yaml::Seq(items) = &node.value else {
            self.at(
                node.pos,
                Some(field),
                format!(
                    "expected a list of absolute paths, found {}",
                    node.value.type_name()
                ),
            );
            return Vec::new();
        };
        let mut out = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let f = format!("{field}[{i}]");
            if let Some(p) = self.string(item, &f) {
                if p.starts_with('/') {
                    out.push(p);
                } else {
                    self.at(item.pos, Some(&f), format!("`{p}` is not an absolute path"));
                }
            }
        }
        out
    }

    pub(crate) fn template(&mut self, node: &Node, field: &str) -> Option<String> {
        let s = self.string(node, field)?;
        self.check_template_at(&s, node.pos, field);
        Some(s)
    }

    pub(crate) fn check_template_at(&mut self, s: &str, pos: Pos, field: &str) {
        if crate::has_markup(s) {
            self.sites.push(crate::check::Site {
                pos,
                field: field.into(),
                text: s.into(),
                expr: false,
            });
        }
        if let Err(e) = self.templates.check_template(s) {
            let msg = match e.line {
                Some(l) if s.contains('\n') => {
                    format!(
                        "template does not parse: {} (line {l} of the template)",
                        e.message
                    )
                }
                _ => format!("template does not parse: {}", e.message),
            };
            self.at(pos, Some(field), msg);
        }
    }

    /// An expression; booleans and numbers written bare are accepted as their literal.
    pub(crate) fn expr(&mut self, node: &Node, field: &str) -> Option<String> {
        let s = self.text(node, field)?;
        self.sites.push(crate::check::Site {
            pos: node.pos,
            field: field.into(),
            text: s.as_str().into(),
            expr: true,
        });
        if let Err(e) = self.templates.check_expr(&s) {
            self.at(
                node.pos,
                Some(field),
                format!("expression does not parse: {}", e.message),
            );
        }
        Some(s)
    }

    /// Checks every string inside a JSON-like value as a template.
    pub(crate) fn check_templates_in(&mut self, node: &Node, field: &str) {
        match &node.value {
            Yaml::Str(s) => self.check_template_at(s, node.pos, field),
            Yaml::Seq(items) => {
                for (i, item) in items.iter().enumerate() {
                    self.check_templates_in(item, &format!("{field}[{i}]"));
                }
            }
            Yaml::Map(entries) => {
                for (k, v) in entries {
                    self.check_templates_in(v, &join(field, &k.key_text()));
                }
            }
            _ => {}
        }
    }

    pub(crate) fn retry(&mut self, node: &Node, field: &str) -> Option<RetryPolicy> {
        let f = self.fields(node, field, RETRY_FIELDS, "in retry")?;
        let mut ok = true;
        let mut policy = RetryPolicy::none();
        if let Some((_, v)) = f.get("attempts") {
            match self.uint(v, &join(field, "attempts"), 1) {
                Some(n) if n <= u32::MAX as u64 => policy.attempts = n as u32,
                Some(_) => {
                    self.at(v.pos, Some(&join(field, "attempts")), "too many attempts");
                    ok = false;
                }
                None => ok = false,
            }
        }
        if let Some((_, v)) = f.get("backoff") {
            let bf = join(field, "backoff");
            match self.string(v, &bf).as_deref() {
                Some("fixed") => policy.backoff = Backoff::Fixed,
                Some("exponential") => policy.backoff = Backoff::Exponential,
                Some(other) => {
                    self.at(
                        v.pos,
                        Some(&bf),
                        format!("`{other}` is not a backoff; use `fixed` or `exponential`"),
                    );
                    ok = false;
                }
                None => ok = false,
            }
        }
        if let Some((_, v)) = f.get("delay") {
            match self.duration(v, &join(field, "delay")) {
                Some(d) => policy.delay = d,
                None => ok = false,
            }
        }
        if let Some((_, v)) = f.get("max_delay") {
            match self.duration(v, &join(field, "max_delay")) {
                Some(d) => {
                    policy.max_delay = d;
                    if d < policy.delay {
                        self.at(
                            v.pos,
                            Some(&join(field, "max_delay")),
                            "max_delay is shorter than delay",
                        );
                        ok = false;
                    }
                }
                None => ok = false,
            }
        } else if policy.max_delay < policy.delay {
            // An explicit long delay with no cap: the cap follows the delay.
            policy.max_delay = policy.delay;
        }
        ok.then_some(policy)
    }

    fn workflow(&mut self, root: &Node, source: &str, path: &Path) -> Option<Workflow> {
        if matches!(root.value, Yaml::Null) {
            self.at(
                root.pos,
                None,
                "the workflow file is empty; it needs at least `name` and `nodes`",
            );
            return None;
        }
        let f = self.fields(root, "", TOP_FIELDS, "at the top level")?;

        let name = self.workflow_name(root, &f);
        let description = f
            .get("description")
            .and_then(|(_, v)| self.string(v, "description"));

        let input_schema = f.get("input").and_then(|(_, v)| self.input_schema(v));

        let defaults = self.defaults(&f);

        let concurrency = f
            .get("concurrency")
            .and_then(|(_, v)| self.uint(v, "concurrency", 1))
            .map(|n| n as usize);

        let sandbox = self.sandbox(&f);

        let output = f
            .get("output")
            .and_then(|(_, v)| self.template(v, "output"));

        let models = match f.get("models") {
            Some((_, v)) => self.models(v),
            None => BTreeMap::new(),
        };
        let max_cost_usd = f
            .get("max_cost_usd")
            .and_then(|(_, v)| self.positive(v, "max_cost_usd"));
        let mcp_servers = match f.get("mcp_servers") {
            Some((_, v)) => self.mcp_servers(v),
            None => BTreeMap::new(),
        };

        let nodes = match f.get("nodes") {
            Some((_, v)) => self.nodes(v, "nodes"),
            None => {
                self.at(
                    root.pos,
                    Some("nodes"),
                    "missing required field `nodes` (a list of nodes)",
                );
                Vec::new()
            }
        };

        crate::kinds::check_models(self, &nodes, "nodes", &models);
        self.scorer_models(&nodes, "nodes", &models);
        crate::kinds::check_mcp_tools(self, &nodes, "nodes", &mcp_servers);
        let env = match f.get("env") {
            Some((_, v)) => self.workflow_env(v),
            None => BTreeMap::new(),
        };
        let secrets = match f.get("secrets") {
            Some((_, v)) => self.secrets(v),
            None => BTreeMap::new(),
        };
        self.check_secret_uses(&nodes, "nodes", &secrets);
        let models_pos = f.get("models").map_or(root.pos, |(k, _)| k.pos);
        self.check_model_secrets(&models, &secrets, models_pos);

        let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
        let base_dir = abs
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("/"));
        Some(Workflow {
            name: name?,
            description,
            input_schema,
            defaults,
            concurrency,
            sandbox,
            output,
            nodes,
            models,
            max_cost_usd,
            mcp_servers,
            env,
            secrets,
            path: abs,
            base_dir,
            source: String::new(),
            hash: hex::encode(Sha256::digest(source.as_bytes())),
            pinned: None,
        })
    }

    /// The workflow's `name`, which is required and must be a valid name.
    fn workflow_name(&mut self, root: &Node, f: &Fields) -> Option<String> {
        match f.get("name") {
            Some((_, v)) => self.string(v, "name").and_then(|n| {
                if is_workflow_name(&n) {
                    Some(n)
                } else {
                    self.at(
                        v.pos,
                        Some("name"),
                        format!("`{n}` is not a valid workflow name; use lower-case letters, digits, `_` and `-`"),
                    );
                    None
                }
            }),
            None => {
                self.at(root.pos, Some("name"), "missing required field `name`");
                None
            }
        }
    }

    /// The top-level `defaults` (timeout and retry) nodes inherit.
    fn defaults(&mut self, f: &Fields) -> Defaults {
        let mut defaults = Defaults::default();
        if let Some((_, v)) = f.get("defaults") {
            if let Some(d) = self.fields(v, "defaults", DEFAULTS_FIELDS, "in defaults") {
                if let Some((_, t)) = d.get("timeout") {
                    defaults.timeout = self.duration(t, "defaults.timeout");
                }
                if let Some((_, r)) = d.get("retry") {
                    defaults.retry = self.retry(r, "defaults.retry");
                }
            }
        }
        defaults
    }

    /// The top-level `sandbox`: root, network, limits and what is shown.
    fn sandbox(&mut self, f: &Fields) -> SandboxSpec {
        let mut sandbox = SandboxSpec::default();
        if let Some((_, v)) = f.get("sandbox") {
            if let Some(s) = self.fields(v, "sandbox", SANDBOX_FIELDS, "in sandbox") {
                if let Some((_, r)) = s.get("root") {
                    sandbox.root = self.string(r, "sandbox.root");
                }
                if let Some((_, n)) = s.get("network") {
                    if let Yaml::Seq(_) = &n.value {
                        sandbox.network_hosts = self.hosts(n, "sandbox.network");
                    } else {
                        sandbox.network = self.bool(n, "sandbox.network").unwrap_or(false);
                    }
                }
                if let Some((_, m)) = s.get("max_output_bytes") {
                    sandbox.max_output_bytes = self.uint(m, "sandbox.max_output_bytes", 1);
                }
                if let Some((_, t)) = s.get("tool_timeout") {
                    sandbox.tool_timeout = self.duration(t, "sandbox.tool_timeout");
                }
                if let Some((_, i)) = s.get("isolation") {
                    sandbox.isolation = self.isolation(i, "sandbox.isolation").unwrap_or_default();
                }
                if let Some((_, l)) = s.get("limits") {
                    sandbox.limits = self.limits(l, "sandbox.limits");
                }
                if let Some((_, r)) = s.get("read_only") {
                    sandbox.read_only = self.read_only(r, "sandbox.read_only");
                }
            }
        }
        sandbox
    }

    fn input_schema(&mut self, node: &Node) -> Option<serde_json::Value> {
        self.json_schema(node, "input")
    }

    /// A JSON Schema (`input`, an `ask`'s `schema`, an agent's
    /// `output_schema`), checked; a problem points into it where it can.
    pub(crate) fn json_schema(&mut self, node: &Node, field: &str) -> Option<serde_json::Value> {
        if !matches!(node.value, Yaml::Map(_) | Yaml::Bool(_)) {
            self.at(
                node.pos,
                Some(field),
                format!(
                    "expected a JSON Schema (a mapping), found {}",
                    node.value.type_name()
                ),
            );
            return None;
        }
        if !self.shallow(node, field) {
            return None;
        }
        let schema = node.to_json();
        match jsonschema::validator_for(&schema) {
            Ok(_) => Some(schema),
            Err(e) => {
                // Point at the offending part of the schema when the pointer leads somewhere.
                let pointer = e.instance_path().to_string();
                let (pos, at) = locate(node, &pointer)
                    .map(|(n, f)| (n.pos, format!("{field}{f}")))
                    .unwrap_or((node.pos, field.to_string()));
                self.at(pos, Some(&at), format!("not a valid JSON Schema: {e}"));
                None
            }
        }
    }

    /// A number above zero (`max_cost_usd`, prices may be zero: see `price`).
    pub(crate) fn positive(&mut self, node: &Node, field: &str) -> Option<f64> {
        let n = self.number(node, field)?;
        if n > 0.0 {
            Some(n)
        } else {
            self.at(
                node.pos,
                Some(field),
                format!("must be more than 0, found {n}"),
            );
            None
        }
    }

    /// A finite number, not below zero.
    pub(crate) fn number(&mut self, node: &Node, field: &str) -> Option<f64> {
        let n = match node.value {
            Yaml::Int(i) => i as f64,
            Yaml::Float(f) => f,
            ref other => {
                self.at(
                    node.pos,
                    Some(field),
                    format!("expected a number, found {}", other.type_name()),
                );
                return None;
            }
        };
        if !n.is_finite() || n < 0.0 {
            self.at(
                node.pos,
                Some(field),
                format!("must be a number of at least 0, found {n}"),
            );
            return None;
        }
        Some(n)
    }

    /// `mcp_servers:`: each entry a server whose tools agents may use.
    fn mcp_servers(&mut self, node: &Node) -> BTreeMap<String, McpServerDef> {
        let mut out = BTreeMap::new();
        let Yaml::Map(entries) = &node.value else {
            self.at(
                node.pos,
                Some("mcp_servers"),
                format!(
                    "expected a mapping of named MCP servers, found {}",
                    node.value.type_name()
                ),
            );
            return out;
        };
        for (k, v) in entries {
            let name = k.key_text();
            let sf = join("mcp_servers", &name);
            if !is_node_id(&name) {
                self.at(
                    k.pos,
                    Some(&sf),
                    format!(
                        "`{name}` is not a valid server name; use letters, digits, `_` and `-`"
                    ),
                );
                continue;
            }
            if let Some(def) = self.mcp_server(v, &sf) {
                out.insert(name, def);
            }
        }
        out
    }

    /// One MCP server, at field `sf`: how it is reached and its timeout.
    fn mcp_server(&mut self, v: &Node, sf: &str) -> Option<McpServerDef> {
        let f = self.fields(v, sf, MCP_FIELDS, "in an MCP server")?;
        let transport = match (f.get("command"), f.get("url")) {
            (Some(_), Some((k, _))) => {
                self.at_hint(
                    k.pos,
                    Some(sf),
                    "an MCP server has either `command` (stdio) or `url` (streamable HTTP), not both",
                    None,
                );
                return None;
            }
            (None, None) => {
                self.at_hint(
                    v.pos,
                    Some(sf),
                    "an MCP server needs `command` (a program to start) or `url` (a streamable HTTP endpoint)",
                    None,
                );
                return None;
            }
            (Some((_, c)), None) => self.mcp_stdio(v, sf, c, &f)?,
            (None, Some((_, u))) => self.mcp_http(v, sf, u, &f)?,
        };
        let timeout = f
            .get("timeout")
            .and_then(|(_, t)| self.duration(t, &join(sf, "timeout")));
        Some(McpServerDef { transport, timeout })
    }

    /// A server started as a program (`command`, its argv) with `env`.
    fn mcp_stdio(&mut self, v: &Node, sf: &str, c: &Node, f: &Fields) -> Option<McpTransport> {
        let cf = join(sf, "command");
        let Yaml::Seq(items) = &c.value else {
            self.at(
                c.pos,
                Some(&cf),
                format!("expected a list (the argv), found {}", c.value.type_name()),
            );
            return None;
        };
        let argv: Vec<String> = items
            .iter()
            .enumerate()
            .filter_map(|(i, it)| self.string(it, &format!("{cf}[{i}]")))
            .collect();
        if argv.len() != items.len() {
            return None;
        }
        if argv.is_empty() {
            self.at(c.pos, Some(&cf), "the argv is empty");
            return None;
        }
        if f.contains_key("headers_env") {
            self.at(
                v.pos,
                Some(&join(sf, "headers_env")),
                "`headers_env` is for `url` servers",
            );
            return None;
        }
        let env = self.string_map(f, sf, "env")?;
        Some(McpTransport::Stdio { command: argv, env })
    }

    /// A server reached over streamable HTTP (`url`) with `headers_env`.
    fn mcp_http(&mut self, v: &Node, sf: &str, u: &Node, f: &Fields) -> Option<McpTransport> {
        let uf = join(sf, "url");
        let url = self.string(u, &uf)?;
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            self.at(
                u.pos,
                Some(&uf),
                format!("`{url}` is not an http:// or https:// URL"),
            );
            return None;
        }
        if f.contains_key("env") {
            self.at(
                v.pos,
                Some(&join(sf, "env")),
                "`env` is for `command` servers",
            );
            return None;
        }
        let headers_env = self.string_map(f, sf, "headers_env")?;
        Some(McpTransport::Http { url, headers_env })
    }

    /// The mapping of names to strings at `key` of `f` (empty when absent);
    /// `None` after reporting one that is not such a mapping.
    fn string_map(&mut self, f: &Fields, sf: &str, key: &str) -> Option<BTreeMap<String, String>> {
        let Some((_, m)) = f.get(key) else {
            return Some(BTreeMap::new());
        };
        let mf = join(sf, key);
        let Yaml::Map(items) = &m.value else {
            self.at(
                m.pos,
                Some(&mf),
                format!(
                    "expected a mapping of names to strings, found {}",
                    m.value.type_name()
                ),
            );
            return None;
        };
        let mut out = BTreeMap::new();
        for (ik, iv) in items {
            let key = ik.key_text();
            let value = self.string(iv, &join(&mf, &key))?;
            out.insert(key, value);
        }
        Some(out)
    }
}

impl Cx {
    /// Whether `node` nests at most [`MAX_VALUE_DEPTH`] lists and mappings deep; reports the
    /// first one past the limit when not.
    pub(crate) fn shallow(&mut self, node: &Node, field: &str) -> bool {
        let Some((pos, path)) = too_deep(node, 0) else {
            return true;
        };
        self.at(
            pos,
            Some(&format!("{field}{path}")),
            format!("nested deeper than {MAX_VALUE_DEPTH} levels of lists and mappings"),
        );
        false
    }
}

/// The first list or mapping inside `node` nested deeper than [`MAX_VALUE_DEPTH`] (`above` of
/// them enclose `node`), with its field path below `node`. Recursion stops at the limit.
fn too_deep(node: &Node, above: usize) -> Option<(Pos, String)> {
    let is_container = matches!(node.value, Yaml::Seq(_) | Yaml::Map(_));
    if is_container && above >= MAX_VALUE_DEPTH {
        return Some((node.pos, String::new()));
    }
    match &node.value {
        Yaml::Seq(items) => items.iter().enumerate().find_map(|(i, n)| {
            too_deep(n, above + 1).map(|(pos, path)| (pos, format!("[{i}]{path}")))
        }),
        Yaml::Map(entries) => entries.iter().find_map(|(k, v)| {
            too_deep(v, above + 1).map(|(pos, path)| (pos, format!(".{}{path}", k.key_text())))
        }),
        _ => None,
    }
}

/// Follows a JSON pointer through the YAML tree, for positions inside the input schema.
fn locate<'n>(node: &'n Node, pointer: &str) -> Option<(&'n Node, String)> {
    let mut cur = node;
    let mut field = String::new();
    for raw in pointer.split('/').skip(1) {
        let seg = raw.replace("~1", "/").replace("~0", "~");
        cur = match &cur.value {
            Yaml::Map(entries) => {
                field.push('.');
                field.push_str(&seg);
                &entries.iter().find(|(k, _)| k.key_text() == seg)?.1
            }
            Yaml::Seq(items) => {
                let i: usize = seg.parse().ok()?;
                field.push_str(&format!("[{i}]"));
                items.get(i)?
            }
            _ => return None,
        };
    }
    Some((cur, field))
}

/// `512MiB`, `2GiB`, `64K`, or a number of bytes.
fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a size (use bytes, or 512MiB, 2GiB)"))?;
    let mult: u64 = match unit.trim() {
        "" | "B" => 1,
        "K" | "KiB" | "k" => 1 << 10,
        "M" | "MiB" => 1 << 20,
        "G" | "GiB" => 1 << 30,
        other => {
            return Err(format!(
                "`{s}` has an unknown unit `{other}` (use KiB, MiB or GiB)"
            ))
        }
    };
    match n.checked_mul(mult) {
        Some(0) => Err(format!("`{s}` is not a positive size")),
        Some(b) => Ok(b),
        None => Err(format!("`{s}` is too large")),
    }
}
