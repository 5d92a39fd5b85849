//! Reading a workflow file into the model, reporting every problem found with its position.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::duration::parse_duration;
use crate::error::{Problem, WorkflowError};
use crate::limits::{MAX_FILE_BYTES, MAX_VALUE_DEPTH};
use crate::model::*;
use crate::templates::Templates;
use crate::yaml::{self, Node, Pos, Streamed, Yaml};

mod scorers;

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
];
const MCP_FIELDS: &[&str] = &["command", "url", "headers_env", "env", "timeout"];
const KIND_KEYS: &[&str] = &[
    "command", "value", "approval", "loop", "for_each", "tool", "ask", "agent", "workflow",
];
const MODEL_FIELDS: &[&str] = &[
    "provider",
    "model",
    "api_key_env",
    "base_url",
    "max_tokens",
    "temperature",
    "idle_timeout",
    "timeout",
    "retry",
    "price",
    "script",
];
const PRICE_FIELDS: &[&str] = &["input", "output", "cache_read", "cache_write"];
const AGENT_FIELDS: &[&str] = &[
    "model",
    "engine",
    "system",
    "prompt",
    "tools",
    "delegates",
    "max_steps",
    "output_schema",
    "schema_retries",
    "max_cost_usd",
    "engine_command",
];
/// The external agent CLIs an agent node may run instead of a model.
pub const AGENT_ENGINES: &[&str] = &["claude-code", "codex"];
/// The tools an agent may name: the built-in sandbox tools and `ask_user`.
pub const AGENT_TOOLS: &[&str] = &["read", "write", "edit", "grep", "bash", "ask_user"];
const COMMON_NODE_FIELDS: &[&str] = &[
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
];
/// The node kinds whose attempts may change files in the sandbox root:
/// the ones `on_retry: revert` applies to.
const CHANGES_FILES: &[&str] = &["agent", "command", "tool"];
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
const LOOP_FIELDS: &[&str] = &["until", "max_iterations", "nodes"];
/// Names the engine puts in the template context; an `as` name must not hide them.
const RESERVED_NAMES: &[&str] = &["input", "nodes", "iteration", "index", "run", "workflow"];

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
    /// Data files have no workflow node lists.
    struct NoLists;
    impl yaml::Lists for NoLists {
        type Open = ();
        fn open(&mut self, _: &str) {}
        fn item(&mut self, _: &mut (), _: &str, _: &Node) {}
        fn close(&mut self, _: (), _: Pos) -> Streamed {
            Streamed::default()
        }
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
    let mut cx = Cx {
        file: path.to_path_buf(),
        problems: Vec::new(),
        templates: Templates::new(),
        last_settings: None,
    };
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
    if cx.problems.is_empty() {
        Ok(wf.expect("a workflow without problems is complete"))
    } else {
        cx.problems
            .sort_by_key(|p| (p.line.unwrap_or(0), p.column.unwrap_or(0)));
        Err(cx.into_error())
    }
}

struct Cx {
    file: PathBuf,
    problems: Vec<Problem>,
    templates: Templates,
    /// The settings of the last node read, shared with the next node whose
    /// settings are equal (siblings mostly repeat each other's).
    last_settings: Option<std::sync::Arc<NodeSettings>>,
}

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

fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_string()
    } else {
        format!("{prefix}.{key}")
    }
}

fn closest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
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

fn is_node_id(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn is_workflow_name(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

fn is_identifier(s: &str) -> bool {
    let mut bytes = s.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

impl Cx {
    fn into_error(self) -> WorkflowError {
        WorkflowError {
            problems: self.problems,
        }
    }

    fn at(&mut self, pos: Pos, field: Option<&str>, message: impl Into<String>) {
        self.at_hint(pos, field, message, None);
    }

    fn at_hint(
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
    fn fields<'n>(
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
    fn fields_in<'n>(
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

    fn string(&mut self, node: &Node, field: &str) -> Option<String> {
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
    fn text(&mut self, node: &Node, field: &str) -> Option<String> {
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

    fn bool(&mut self, node: &Node, field: &str) -> Option<bool> {
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

    fn uint(&mut self, node: &Node, field: &str, min: i64) -> Option<u64> {
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

    fn duration(&mut self, node: &Node, field: &str) -> Option<Duration> {
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
    fn isolation(&mut self, node: &Node, field: &str) -> Option<Isolation> {
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

    /// `{ memory, processes, cpu }`.
    fn limits(&mut self, node: &Node, field: &str) -> ResourceLimits {
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

    fn template(&mut self, node: &Node, field: &str) -> Option<String> {
        let s = self.string(node, field)?;
        self.check_template_at(&s, node.pos, field);
        Some(s)
    }

    fn check_template_at(&mut self, s: &str, pos: Pos, field: &str) {
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
    fn expr(&mut self, node: &Node, field: &str) -> Option<String> {
        let s = self.text(node, field)?;
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
    fn check_templates_in(&mut self, node: &Node, field: &str) {
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

    fn retry(&mut self, node: &Node, field: &str) -> Option<RetryPolicy> {
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

        let name = match f.get("name") {
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
        };
        let description = f
            .get("description")
            .and_then(|(_, v)| self.string(v, "description"));

        let input_schema = f.get("input").and_then(|(_, v)| self.input_schema(v));

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

        let concurrency = f
            .get("concurrency")
            .and_then(|(_, v)| self.uint(v, "concurrency", 1))
            .map(|n| n as usize);

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

        self.agent_models(&nodes, "nodes", &models);
        self.scorer_models(&nodes, "nodes", &models);
        self.agent_mcp_tools(&nodes, "nodes", &mcp_servers);

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
            path: abs,
            base_dir,
            source: String::new(),
            hash: hex::encode(Sha256::digest(source.as_bytes())),
            pinned: None,
        })
    }

    fn input_schema(&mut self, node: &Node) -> Option<serde_json::Value> {
        self.json_schema(node, "input")
    }

    /// A JSON Schema (`input`, an `ask`'s `schema`, an agent's
    /// `output_schema`), checked; a problem points into it where it can.
    fn json_schema(&mut self, node: &Node, field: &str) -> Option<serde_json::Value> {
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
    fn positive(&mut self, node: &Node, field: &str) -> Option<f64> {
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
    fn number(&mut self, node: &Node, field: &str) -> Option<f64> {
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
            let Some(f) = self.fields(v, &sf, MCP_FIELDS, "in an MCP server") else {
                continue;
            };
            let string_map = |cx: &mut Self, key: &str| -> Option<BTreeMap<String, String>> {
                let Some((_, m)) = f.get(key) else {
                    return Some(BTreeMap::new());
                };
                let mf = join(&sf, key);
                let Yaml::Map(items) = &m.value else {
                    cx.at(
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
                    let value = cx.string(iv, &join(&mf, &key))?;
                    out.insert(key, value);
                }
                Some(out)
            };
            let transport = match (f.get("command"), f.get("url")) {
                (Some(_), Some((k, _))) => {
                    self.at_hint(
                        k.pos,
                        Some(&sf),
                        "an MCP server has either `command` (stdio) or `url` (streamable HTTP), not both",
                        None,
                    );
                    continue;
                }
                (None, None) => {
                    self.at_hint(
                        v.pos,
                        Some(&sf),
                        "an MCP server needs `command` (a program to start) or `url` (a streamable HTTP endpoint)",
                        None,
                    );
                    continue;
                }
                (Some((_, c)), None) => {
                    let cf = join(&sf, "command");
                    let Yaml::Seq(items) = &c.value else {
                        self.at(
                            c.pos,
                            Some(&cf),
                            format!("expected a list (the argv), found {}", c.value.type_name()),
                        );
                        continue;
                    };
                    let argv: Vec<String> = items
                        .iter()
                        .enumerate()
                        .filter_map(|(i, it)| self.string(it, &format!("{cf}[{i}]")))
                        .collect();
                    if argv.len() != items.len() {
                        continue;
                    }
                    if argv.is_empty() {
                        self.at(c.pos, Some(&cf), "the argv is empty");
                        continue;
                    }
                    if f.contains_key("headers_env") {
                        self.at(
                            v.pos,
                            Some(&join(&sf, "headers_env")),
                            "`headers_env` is for `url` servers",
                        );
                        continue;
                    }
                    let Some(env) = string_map(self, "env") else {
                        continue;
                    };
                    McpTransport::Stdio { command: argv, env }
                }
                (None, Some((_, u))) => {
                    let uf = join(&sf, "url");
                    let Some(url) = self.string(u, &uf) else {
                        continue;
                    };
                    if !(url.starts_with("http://") || url.starts_with("https://")) {
                        self.at(
                            u.pos,
                            Some(&uf),
                            format!("`{url}` is not an http:// or https:// URL"),
                        );
                        continue;
                    }
                    if f.contains_key("env") {
                        self.at(
                            v.pos,
                            Some(&join(&sf, "env")),
                            "`env` is for `command` servers",
                        );
                        continue;
                    }
                    let Some(headers_env) = string_map(self, "headers_env") else {
                        continue;
                    };
                    McpTransport::Http { url, headers_env }
                }
            };
            let timeout = f
                .get("timeout")
                .and_then(|(_, t)| self.duration(t, &join(&sf, "timeout")));
            out.insert(name, McpServerDef { transport, timeout });
        }
        out
    }

    /// Every agent's `server.tool` names a server of `mcp_servers` (checked
    /// once the whole file is read).
    fn agent_mcp_tools(
        &mut self,
        nodes: &[NodeSpec],
        field: &str,
        servers: &BTreeMap<String, McpServerDef>,
    ) {
        for (i, n) in nodes.iter().enumerate() {
            let nf = format!("{field}[{i}]");
            match &n.kind {
                NodeKind::Agent(a) => {
                    for t in &a.tools {
                        let Some((server, _)) = t.split_once('.') else {
                            continue;
                        };
                        if !servers.contains_key(server) {
                            let hint = if servers.is_empty() {
                                "declare it under `mcp_servers:` at the top level".to_string()
                            } else {
                                format!(
                                    "the workflow's MCP servers are: {}",
                                    servers.keys().cloned().collect::<Vec<_>>().join(", ")
                                )
                            };
                            self.at_hint(
                                Pos { line: n.line, col: 1 },
                                Some(&format!("{nf}.agent.tools")),
                                format!("tool `{t}` names MCP server `{server}`, which `mcp_servers` does not declare"),
                                Some(hint),
                            );
                        }
                    }
                }
                NodeKind::Loop { nodes, .. } => {
                    self.agent_mcp_tools(nodes, &format!("{nf}.loop.nodes"), servers)
                }
                NodeKind::ForEach { nodes, .. } => {
                    self.agent_mcp_tools(nodes, &format!("{nf}.nodes"), servers)
                }
                _ => {}
            }
        }
    }

    /// `models:`: each entry a model agents may name.
    fn models(&mut self, node: &Node) -> BTreeMap<String, ModelDef> {
        let mut out = BTreeMap::new();
        let Yaml::Map(entries) = &node.value else {
            self.at(
                node.pos,
                Some("models"),
                format!(
                    "expected a mapping of named models, found {}",
                    node.value.type_name()
                ),
            );
            return out;
        };
        for (k, v) in entries {
            let name = k.key_text();
            let mf = join("models", &name);
            if !is_node_id(&name) {
                self.at(
                    k.pos,
                    Some(&mf),
                    format!("`{name}` is not a valid model name; use letters, digits, `_` and `-`"),
                );
                continue;
            }
            if out.contains_key(&name) {
                self.at(k.pos, Some(&mf), format!("duplicate model `{name}`"));
                continue;
            }
            if let Some(def) = self.model(v, &mf, &name) {
                out.insert(name, def);
            }
        }
        out
    }

    fn model(&mut self, node: &Node, field: &str, name: &str) -> Option<ModelDef> {
        let f = self.fields(node, field, MODEL_FIELDS, "in a model")?;
        let provider = match f.get("provider") {
            Some((_, p)) => {
                let pf = join(field, "provider");
                let p_name = self.string(p, &pf)?;
                if !["anthropic", "openai", "scripted"].contains(&p_name.as_str()) {
                    self.at_hint(
                        p.pos,
                        Some(&pf),
                        format!("unknown provider `{p_name}`"),
                        Some("use anthropic, openai (also for vLLM, Ollama, llama.cpp, OpenRouter) or scripted".into()),
                    );
                    return None;
                }
                p_name
            }
            None => {
                self.at(
                    node.pos,
                    Some(&join(field, "provider")),
                    "missing required field `provider` (anthropic, openai or scripted)",
                );
                return None;
            }
        };
        let scripted = provider == "scripted";
        let model = match f.get("model") {
            Some((_, m)) => self.string(m, &join(field, "model"))?,
            None if scripted => name.to_string(),
            None => {
                self.at(
                    node.pos,
                    Some(&join(field, "model")),
                    "missing required field `model` (the provider's model id)",
                );
                return None;
            }
        };
        let opt_string = |cx: &mut Cx, key: &str| {
            f.get(key)
                .and_then(|(_, v)| cx.string(v, &join(field, key)))
        };
        let api_key_env = opt_string(self, "api_key_env");
        let base_url = opt_string(self, "base_url");
        if let (Some(url), Some((_, v))) = (&base_url, f.get("base_url")) {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                self.at(
                    v.pos,
                    Some(&join(field, "base_url")),
                    format!("`{url}` is not an http:// or https:// address"),
                );
            }
        }
        let script = opt_string(self, "script");
        match (&script, scripted) {
            (None, true) => self.at(
                node.pos,
                Some(&join(field, "script")),
                "a scripted model needs `script` (its file of turns)",
            ),
            (Some(_), false) => {
                let pos = f.get("script").map_or(node.pos, |(k, _)| k.pos);
                self.at(
                    pos,
                    Some(&join(field, "script")),
                    "`script` is only for scripted models",
                );
            }
            _ => {}
        }
        let max_tokens = f
            .get("max_tokens")
            .and_then(|(_, v)| self.uint(v, &join(field, "max_tokens"), 1))
            .map(|n| n.min(u32::MAX as u64) as u32);
        let temperature = f
            .get("temperature")
            .and_then(|(_, v)| self.number(v, &join(field, "temperature")));
        let idle_timeout = f
            .get("idle_timeout")
            .and_then(|(_, v)| self.duration(v, &join(field, "idle_timeout")));
        let timeout = f
            .get("timeout")
            .and_then(|(_, v)| self.duration(v, &join(field, "timeout")));
        let retry = f
            .get("retry")
            .and_then(|(_, v)| self.retry(v, &join(field, "retry")));
        let price = match f.get("price") {
            Some((_, v)) => {
                let pf = join(field, "price");
                let p = self.fields(v, &pf, PRICE_FIELDS, "in a price")?;
                let get = |cx: &mut Cx, key: &str| {
                    p.get(key)
                        .map(|(_, n)| cx.number(n, &join(&pf, key)))
                        .unwrap_or(Some(0.0))
                };
                Some(ModelPrice {
                    input: get(self, "input")?,
                    output: get(self, "output")?,
                    cache_read: get(self, "cache_read")?,
                    cache_write: get(self, "cache_write")?,
                })
            }
            None => None,
        };
        Some(ModelDef {
            provider,
            model,
            api_key_env,
            base_url,
            max_tokens,
            temperature,
            idle_timeout,
            timeout,
            retry,
            price,
            script,
        })
    }

    /// An `agent:` node's settings.
    fn agent(&mut self, node: &Node, field: &str) -> Option<AgentSpec> {
        let f = self.fields(node, field, AGENT_FIELDS, "in agent")?;
        let model = f
            .get("model")
            .and_then(|(_, v)| self.string(v, &join(field, "model")));
        let engine = match f.get("engine") {
            Some((_, v)) => {
                let ef = join(field, "engine");
                let engine = self.string(v, &ef)?;
                if !AGENT_ENGINES.contains(&engine.as_str()) {
                    self.at_hint(
                        v.pos,
                        Some(&ef),
                        format!("unknown agent engine `{engine}`"),
                        Some(format!("the engines are: {}", AGENT_ENGINES.join(", "))),
                    );
                    return None;
                }
                // An external CLI brings its own tools and loop.
                for key in ["tools", "delegates", "max_steps", "schema_retries"] {
                    if let Some((k, _)) = f.get(key) {
                        self.at_hint(
                            k.pos,
                            Some(&join(field, key)),
                            format!("`{key}` does not apply to an agent run by `engine: {engine}`"),
                            Some("the CLI uses its own tools and loop".into()),
                        );
                        return None;
                    }
                }
                Some(engine)
            }
            None => None,
        };
        let engine_command = match f.get("engine_command") {
            Some((k, v)) => {
                let cf = join(field, "engine_command");
                if engine.is_none() {
                    self.at(k.pos, Some(&cf), "`engine_command` needs an `engine`");
                    return None;
                }
                let Yaml::Seq(items) = &v.value else {
                    self.at(
                        v.pos,
                        Some(&cf),
                        format!(
                            "expected a list (the argv before the CLI's own arguments), found {}",
                            v.value.type_name()
                        ),
                    );
                    return None;
                };
                let argv: Vec<String> = items
                    .iter()
                    .enumerate()
                    .filter_map(|(i, it)| self.string(it, &format!("{cf}[{i}]")))
                    .collect();
                if argv.is_empty() || argv.len() != items.len() {
                    self.at(v.pos, Some(&cf), "the argv is empty");
                    return None;
                }
                Some(argv)
            }
            None => None,
        };
        let delegates = match f.get("delegates") {
            Some((_, v)) => self.delegates(v, &join(field, "delegates"))?,
            None => BTreeMap::new(),
        };
        if model.is_none() && engine.is_none() {
            self.at(
                node.pos,
                Some(&join(field, "model")),
                "missing required field `model` (a name from `models`)",
            );
        }
        let system = f
            .get("system")
            .and_then(|(_, v)| self.template(v, &join(field, "system")));
        let prompt = match f.get("prompt") {
            Some((_, v)) => self.template(v, &join(field, "prompt")),
            None => {
                self.at(
                    node.pos,
                    Some(&join(field, "prompt")),
                    "missing required field `prompt` (the agent's task)",
                );
                None
            }
        };
        let mut tools = Vec::new();
        if let Some((_, v)) = f.get("tools") {
            let tf = join(field, "tools");
            match &v.value {
                Yaml::Seq(items) => {
                    for (i, item) in items.iter().enumerate() {
                        let itf = format!("{tf}[{i}]");
                        let Some(name) = self.string(item, &itf) else {
                            continue;
                        };
                        if tools.contains(&name) {
                            self.at(
                                item.pos,
                                Some(&itf),
                                format!("tool `{name}` is listed twice"),
                            );
                        } else if AGENT_TOOLS.contains(&name.as_str()) {
                            tools.push(name);
                        } else if let Some((server, tool)) = name.split_once('.') {
                            // An MCP server's tool, or all of them: the
                            // server is checked once the file is read.
                            if is_node_id(server) && !tool.is_empty() && !tool.contains('.') {
                                tools.push(name);
                            } else {
                                self.at_hint(
                                    item.pos,
                                    Some(&itf),
                                    format!("`{name}` is not an MCP tool name"),
                                    Some("write `server.tool`, or `server.*` for all of a server's tools".into()),
                                );
                            }
                        } else {
                            let mut hint = String::new();
                            if let Some(c) = closest(&name, AGENT_TOOLS.iter().copied()) {
                                hint.push_str(&format!("did you mean `{c}`? "));
                            }
                            hint.push_str(&format!("the tools are: {}", AGENT_TOOLS.join(", ")));
                            self.at_hint(
                                item.pos,
                                Some(&itf),
                                format!("unknown tool `{name}`"),
                                Some(hint),
                            );
                        }
                    }
                }
                other => self.at(
                    v.pos,
                    Some(&tf),
                    format!("expected a list of tool names, found {}", other.type_name()),
                ),
            }
        }
        let max_steps = match f.get("max_steps") {
            Some((_, v)) => self
                .uint(v, &join(field, "max_steps"), 1)
                .map(|n| n.min(100_000) as u32),
            None => Some(40),
        };
        let output_schema = match f.get("output_schema") {
            Some((_, v)) => Some(self.json_schema(v, &join(field, "output_schema"))?),
            None => None,
        };
        let schema_retries = match f.get("schema_retries") {
            Some((_, v)) => self
                .uint(v, &join(field, "schema_retries"), 0)
                .map(|n| n.min(100) as u32),
            None => Some(2),
        };
        let max_cost_usd = match f.get("max_cost_usd") {
            Some((_, v)) => Some(self.positive(v, &join(field, "max_cost_usd"))?),
            None => None,
        };
        Some(AgentSpec {
            model,
            engine,
            engine_command,
            system,
            prompt: prompt?,
            tools,
            delegates,
            max_steps: max_steps?,
            output_schema,
            schema_retries: schema_retries?,
            max_cost_usd,
        })
    }

    /// The path of a child workflow (`workflow:` and each delegate): a
    /// plain relative or absolute path, not a template, so that the files a
    /// workflow runs are known before it starts.
    fn child_path(&mut self, node: &Node, field: &str) -> Option<String> {
        let path = self.string(node, field)?;
        if path.trim().is_empty() {
            self.at(node.pos, Some(field), "the workflow path is empty");
            return None;
        }
        if path.contains("{{") || path.contains("{%") {
            self.at_hint(
                node.pos,
                Some(field),
                "a child workflow's path cannot be a template",
                Some("name the file; pass what varies as its `input`".into()),
            );
            return None;
        }
        Some(path)
    }

    /// An agent's `delegates`: tool names to child workflow paths. The
    /// names become tools the model calls, so they follow the tools' rule
    /// and must not hide a built-in tool.
    fn delegates(&mut self, node: &Node, field: &str) -> Option<BTreeMap<String, String>> {
        let Yaml::Map(entries) = &node.value else {
            self.at(
                node.pos,
                Some(field),
                format!(
                    "expected a mapping of tool names to workflow files, found {}",
                    node.value.type_name()
                ),
            );
            return None;
        };
        let mut out = BTreeMap::new();
        let mut ok = true;
        for (k, v) in entries {
            let name = k.key_text();
            let ef = join(field, &name);
            let valid = !name.is_empty()
                && name.len() <= 64
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
            if !valid {
                self.at_hint(
                    k.pos,
                    Some(&ef),
                    format!("`{name}` is not a valid delegate name"),
                    Some("use 1 to 64 letters, digits, `_` and `-`: it is the tool's name".into()),
                );
                ok = false;
                continue;
            }
            if AGENT_TOOLS.contains(&name.as_str()) {
                self.at_hint(
                    k.pos,
                    Some(&ef),
                    format!("delegate `{name}` has the name of a built-in tool"),
                    Some("give the delegate another name".into()),
                );
                ok = false;
                continue;
            }
            match self.child_path(v, &ef) {
                Some(p) => {
                    out.insert(name, p);
                }
                None => ok = false,
            }
        }
        ok.then_some(out)
    }

    /// Every agent names a model the workflow declares (checked once the
    /// whole file is read: `models` may come after `nodes`).
    fn agent_models(
        &mut self,
        nodes: &[NodeSpec],
        field: &str,
        models: &BTreeMap<String, ModelDef>,
    ) {
        for (i, n) in nodes.iter().enumerate() {
            let nf = format!("{field}[{i}]");
            match &n.kind {
                NodeKind::Agent(a) => {
                    if let Some(m) = &a.model {
                        if !models.contains_key(m) {
                            let hint = unknown_model_hint(models);
                            self.at_hint(
                                Pos {
                                    line: n.line,
                                    col: 1,
                                },
                                Some(&format!("{nf}.agent.model")),
                                format!(
                                    "node `{}` names model `{m}`, which `models` does not declare",
                                    n.id
                                ),
                                Some(hint),
                            );
                        }
                    }
                }
                NodeKind::Loop { nodes, .. } => {
                    self.agent_models(nodes, &format!("{nf}.loop.nodes"), models)
                }
                NodeKind::ForEach { nodes, .. } => {
                    self.agent_models(nodes, &format!("{nf}.nodes"), models)
                }
                _ => {}
            }
        }
    }

    fn nodes(&mut self, node: &Node, field: &str) -> Vec<NodeSpec> {
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
        let at = |i: usize, what: &str| format!("{field}[{i}].{what}");
        // Each id's first node.
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
        // Cycles: depth-first search in file order; each cycle is reported once, at the
        // node where the search first entered it. Edges in one flat list (`starts[v]..
        // starts[v + 1]`), and the search keeps its own stack: a chain of 100,000 nodes is
        // as deep as the search goes.
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
        let mut state = vec![0u8; partials.len()]; // 0 new, 1 on stack, 2 done
        let mut reported: HashSet<Vec<usize>> = HashSet::new();
        let mut cycles: Vec<Vec<usize>> = Vec::new();
        // The search's path, and for each vertex on it the next edge to follow.
        let mut path: Vec<usize> = Vec::new();
        let mut next_edge: Vec<usize> = Vec::new();
        for root in 0..partials.len() {
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
        for cycle in cycles {
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
        let kinds: Vec<&str> = entries
            .iter()
            .filter_map(|(k, _)| match &k.value {
                Yaml::Str(s) => KIND_KEYS.iter().copied().find(|kk| kk == s),
                _ => None,
            })
            .collect();
        let kind = match kinds.as_slice() {
            [one] => Some(*one),
            [] => {
                self.at_hint(
                    node.pos,
                    Some(field),
                    "node has no kind",
                    Some(format!("give exactly one of: {}", KIND_KEYS.join(", "))),
                );
                None
            }
            many => {
                let list: Vec<String> = many.iter().map(|k| format!("`{k}`")).collect();
                self.at_hint(
                    node.pos,
                    Some(field),
                    format!("node has more than one kind: {}", list.join(" and ")),
                    Some("give exactly one kind key per node".into()),
                );
                None
            }
        };
        let mut allowed: Vec<&str> = COMMON_NODE_FIELDS.to_vec();
        match kind {
            Some("command") => allowed.extend(["command", "env", "cwd", "output", "sandbox"]),
            Some("for_each") => allowed.extend(["for_each", "as", "nodes"]),
            Some("tool") => allowed.extend(["tool", "args", "max_output_bytes", "sandbox"]),
            Some("ask") => allowed.extend(["ask", "schema"]),
            Some("workflow") => allowed.extend(["workflow", "input"]),
            Some(k) => allowed.push(k),
            // Unknown kind: accept every field some kind allows, so only true typos show.
            None => allowed.extend(KIND_KEYS.iter().copied().chain([
                "env", "cwd", "output", "as", "nodes", "args", "sandbox", "schema", "input",
            ])),
        }
        let what = match kind {
            Some(k) => format!("on a `{k}` node"),
            None => "on a node".to_string(),
        };
        // Fields that exist but belong to another kind get a sharper message than "unknown".
        let mut misplaced = HashSet::new();
        for (k, _) in entries {
            let key = k.key_text();
            if kind.is_some() && !allowed.contains(&key.as_str()) {
                let owner = match key.as_str() {
                    "env" | "cwd" | "output" => Some("command"),
                    "as" => Some("for_each"),
                    "nodes" => Some("for_each"),
                    "args" => Some("tool"),
                    "schema" => Some("ask"),
                    "input" => Some("workflow"),
                    _ => None,
                };
                if let Some(owner) = owner {
                    let hint = if key == "nodes" && kind == Some("loop") {
                        Some("a loop's nodes go inside `loop:`".to_string())
                    } else {
                        None
                    };
                    self.at_hint(
                        k.pos,
                        Some(&join(field, &key)),
                        format!("`{key}` is only allowed on `{owner}` nodes"),
                        hint,
                    );
                    misplaced.insert(key);
                }
            }
        }
        let f = self.fields_in(
            entries
                .iter()
                .filter(|(k, _)| !misplaced.contains(&k.key_text())),
            field,
            &allowed,
            &what,
        );

        // id
        let id = match f.get("id") {
            Some((_, v)) => self.string(v, &join(field, "id")).and_then(|id| {
                if is_node_id(&id) {
                    partial.id = Some((id.clone(), v.pos));
                    Some(id)
                } else {
                    self.at_hint(
                        v.pos,
                        Some(&join(field, "id")),
                        format!("`{id}` is not a valid node id"),
                        Some("use letters, digits, `_` and `-`; `.`, `[` and `]` are reserved for paths".into()),
                    );
                    None
                }
            }),
            None => {
                self.at(node.pos, Some(&join(field, "id")), "missing required field `id`");
                None
            }
        };

        // needs
        if let Some((_, v)) = f.get("needs") {
            let nf = join(field, "needs");
            match &v.value {
                Yaml::Str(s) => {
                    partial.needs.push(s.clone());
                    partial.needs_pos.push(v.pos);
                }
                Yaml::Seq(items) => {
                    partial.needs.reserve_exact(items.len());
                    partial.needs_pos.reserve_exact(items.len());
                    for item in items {
                        if let Some(s) = self.string(item, &nf) {
                            partial.needs.push(s);
                            partial.needs_pos.push(item.pos);
                        }
                    }
                }
                other => self.at(
                    v.pos,
                    Some(&nf),
                    format!("expected a list of node ids, found {}", other.type_name()),
                ),
            }
        }
        let before = self.problems.len();

        let if_ = f
            .get("if")
            .and_then(|(_, v)| self.expr(v, &join(field, "if")));
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
        let node_sandbox = match f.get("sandbox") {
            Some((_, v)) => self.node_sandbox(v, &join(field, "sandbox")),
            None => NodeSandbox::default(),
        };
        let on_failure = match f.get("on_failure") {
            Some((_, v)) => {
                let of = join(field, "on_failure");
                match self.string(v, &of).as_deref() {
                    Some("fail") | None => OnFailure::Fail,
                    Some("continue") => OnFailure::Continue,
                    Some(other) => {
                        self.at(
                            v.pos,
                            Some(&of),
                            format!(
                                "`{other}` is not an on_failure policy; use `fail` or `continue`"
                            ),
                        );
                        OnFailure::Fail
                    }
                }
            }
            None => OnFailure::Fail,
        };
        let on_interrupt = match f.get("on_interrupt") {
            Some((_, v)) => {
                let of = join(field, "on_interrupt");
                match self.string(v, &of).as_deref() {
                    Some("rerun") | None => OnInterrupt::Rerun,
                    Some("fail") => OnInterrupt::Fail,
                    Some(other) => {
                        self.at(
                            v.pos,
                            Some(&of),
                            format!(
                                "`{other}` is not an on_interrupt policy; use `rerun` or `fail`"
                            ),
                        );
                        OnInterrupt::Rerun
                    }
                }
            }
            None => OnInterrupt::Rerun,
        };
        let on_retry = match f.get("on_retry") {
            Some((_, v)) => {
                let of = join(field, "on_retry");
                match self.string(v, &of).as_deref() {
                    Some("keep") | None => OnRetry::Keep,
                    Some("revert") if !kind.is_some_and(|k| CHANGES_FILES.contains(&k)) => {
                        self.at(
                            v.pos,
                            Some(&of),
                            "`on_retry: revert` restores the files a node changed; only \
                             `agent`, `command` and `tool` nodes change files"
                                .to_string(),
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
            None => OnRetry::Keep,
        };
        let mut env = BTreeMap::new();
        if let Some((_, v)) = f.get("env") {
            let ef = join(field, "env");
            match &v.value {
                Yaml::Map(entries) => {
                    for (k, val) in entries {
                        let key = k.key_text();
                        let kf = join(&ef, &key);
                        if let Some(text) = self.text(val, &kf) {
                            self.check_template_at(&text, val.pos, &kf);
                            env.insert(key, text);
                        }
                    }
                }
                other => self.at(
                    v.pos,
                    Some(&ef),
                    format!(
                        "expected a mapping of variables, found {}",
                        other.type_name()
                    ),
                ),
            }
        }
        let cwd = f
            .get("cwd")
            .and_then(|(_, v)| self.template(v, &join(field, "cwd")));
        let output = match f.get("output") {
            Some((_, v)) => {
                let of = join(field, "output");
                match self.string(v, &of).as_deref() {
                    Some("text") | None => OutputFormat::Text,
                    Some("json") => OutputFormat::Json,
                    Some("lines") => OutputFormat::Lines,
                    Some(other) => {
                        self.at(
                            v.pos,
                            Some(&of),
                            format!(
                                "`{other}` is not an output format; use `text`, `json` or `lines`"
                            ),
                        );
                        OutputFormat::Text
                    }
                }
            }
            None => OutputFormat::Text,
        };
        let scorers = match f.get("scorers") {
            Some((_, v)) => self.scorers(v, &join(field, "scorers")),
            None => Vec::new(),
        };

        let kind = kind.and_then(|k| self.kind(k, &f, field));
        if self.problems.len() != before {
            return partial;
        }
        if let (Some(id), Some(kind)) = (id, kind) {
            let settings = self.shared_settings(NodeSettings {
                if_,
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
                sandbox: node_sandbox,
                scorers,
            });
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

    fn kind(
        &mut self,
        kind: &str,
        f: &BTreeMap<String, (&Node, &Node)>,
        field: &str,
    ) -> Option<NodeKind> {
        let (_, v) = f.get(kind)?;
        let kf = join(field, kind);
        match kind {
            "command" => {
                let Yaml::Seq(items) = &v.value else {
                    self.at_hint(
                        v.pos,
                        Some(&kf),
                        format!("expected a list (the argv), found {}", v.value.type_name()),
                        Some("commands run without a shell; write [\"sh\", \"-c\", \"...\"] to use one".into()),
                    );
                    return None;
                };
                if items.is_empty() {
                    self.at(v.pos, Some(&kf), "the argv is empty");
                    return None;
                }
                let mut argv = Vec::new();
                for (i, item) in items.iter().enumerate() {
                    let af = format!("{kf}[{i}]");
                    let text = self.text(item, &af)?;
                    self.check_template_at(&text, item.pos, &af);
                    argv.push(text);
                }
                Some(NodeKind::Command(argv))
            }
            "value" => {
                if !self.shallow(v, &kf) {
                    return None;
                }
                self.check_templates_in(v, &kf);
                Some(NodeKind::Value(v.to_json()))
            }
            "approval" => self.template(v, &kf).map(NodeKind::Approval),
            "ask" => {
                let prompt = self.template(v, &kf)?;
                let schema = match f.get("schema") {
                    Some((_, sch)) => Some(self.json_schema(sch, &join(field, "schema"))?),
                    None => None,
                };
                Some(NodeKind::Ask { prompt, schema })
            }
            "agent" => self.agent(v, &kf).map(|a| NodeKind::Agent(Box::new(a))),
            "workflow" => {
                let path = self.child_path(v, &kf)?;
                let input = match f.get("input") {
                    Some((_, i)) => {
                        self.check_templates_in(i, &join(field, "input"));
                        Some(i.to_json())
                    }
                    None => None,
                };
                Some(NodeKind::Workflow { path, input })
            }
            "tool" => {
                let tool = self.string(v, &kf)?;
                if tool.trim().is_empty() {
                    self.at(v.pos, Some(&kf), "the tool name is empty");
                    return None;
                }
                let args = match f.get("args") {
                    Some((_, a)) => {
                        let af = join(field, "args");
                        if !matches!(a.value, Yaml::Map(_)) {
                            self.at(
                                a.pos,
                                Some(&af),
                                format!(
                                    "expected a mapping of arguments, found {}",
                                    a.value.type_name()
                                ),
                            );
                            return None;
                        }
                        if !self.shallow(a, &af) {
                            return None;
                        }
                        self.check_templates_in(a, &af);
                        a.to_json()
                    }
                    None => serde_json::Value::Object(Default::default()),
                };
                Some(NodeKind::Tool { tool, args })
            }
            "loop" => {
                let lf = self.fields(v, &kf, LOOP_FIELDS, "in loop")?;
                let until = match lf.get("until") {
                    Some((_, u)) => self.expr(u, &join(&kf, "until")),
                    None => {
                        self.at(
                            v.pos,
                            Some(&join(&kf, "until")),
                            "missing required field `until` (the expression that ends the loop)",
                        );
                        None
                    }
                };
                let max_iterations = match lf.get("max_iterations") {
                    Some((_, m)) => self.uint(m, &join(&kf, "max_iterations"), 1).and_then(|n| {
                        u32::try_from(n).ok().or_else(|| {
                            self.at(m.pos, Some(&join(&kf, "max_iterations")), "too large");
                            None
                        })
                    }),
                    None => {
                        self.at(
                            v.pos,
                            Some(&join(&kf, "max_iterations")),
                            "missing required field `max_iterations` (the most passes the loop makes)",
                        );
                        None
                    }
                };
                let nodes = match lf.get("nodes") {
                    Some((_, n)) => self.nodes(n, &join(&kf, "nodes")),
                    None => {
                        self.at(
                            v.pos,
                            Some(&join(&kf, "nodes")),
                            "missing required field `nodes` (the loop's body)",
                        );
                        Vec::new()
                    }
                };
                Some(NodeKind::Loop {
                    until: until?,
                    max_iterations: max_iterations?,
                    nodes,
                })
            }
            "for_each" => {
                let list = self.expr(v, &kf);
                let mut as_ok = true;
                let as_name = match f.get("as") {
                    Some((_, a)) => {
                        let af = join(field, "as");
                        let name = self.string(a, &af);
                        match name {
                            Some(name) if !is_identifier(&name) => {
                                self.at(
                                    a.pos,
                                    Some(&af),
                                    format!("`{name}` is not a valid name; use letters, digits and `_`, not starting with a digit"),
                                );
                                as_ok = false;
                                None
                            }
                            Some(name) if RESERVED_NAMES.contains(&name.as_str()) => {
                                self.at(
                                    a.pos,
                                    Some(&af),
                                    format!(
                                        "`{name}` is already a name in templates; choose another"
                                    ),
                                );
                                as_ok = false;
                                None
                            }
                            Some(name) => Some(name),
                            None => {
                                as_ok = false;
                                None
                            }
                        }
                    }
                    None => None,
                };
                let nodes = match f.get("nodes") {
                    Some((_, n)) => self.nodes(n, &join(field, "nodes")),
                    None => {
                        self.at(
                            v.pos,
                            Some(&join(field, "nodes")),
                            "missing required field `nodes` (mounted once per element)",
                        );
                        Vec::new()
                    }
                };
                if !as_ok {
                    return None;
                }
                Some(NodeKind::ForEach {
                    list: list?,
                    as_name,
                    nodes,
                })
            }
            _ => None,
        }
    }
}

/// A list of nodes being read: the specs so far, what sibling checks need of each node, and
/// the problems found before the list (set aside while the list collects its own).
struct OpenList {
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

impl Cx {
    /// Whether `node` nests at most [`MAX_VALUE_DEPTH`] lists and mappings deep; reports the
    /// first one past the limit when not.
    fn shallow(&mut self, node: &Node, field: &str) -> bool {
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

/// What to tell of a model name `models` does not declare.
pub(crate) fn unknown_model_hint(models: &BTreeMap<String, ModelDef>) -> String {
    if models.is_empty() {
        "declare it under `models:` at the top level".to_string()
    } else {
        format!(
            "the workflow's models are: {}",
            models.keys().cloned().collect::<Vec<_>>().join(", ")
        )
    }
}
