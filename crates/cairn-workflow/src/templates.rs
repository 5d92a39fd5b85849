//! Templates and expressions: Jinja syntax through minijinja, with strict undefined so a
//! misspelt variable is an error instead of an empty string.

use std::fmt;
use std::sync::Arc;

use minijinja::value::{Enumerator, Object, ObjectRepr};
use minijinja::{Environment, UndefinedBehavior, Value};

/// A render context shared without copying: templates read it lazily, converting only the
/// parts they touch.
///
/// Converting a whole JSON context into template values costs time in proportion to its size
/// (about 10 ms for 10,000 node entries), paid on every render. Holding the context in an
/// `Arc` and looking values up on demand makes a render cost what the template reads. An
/// engine that keeps its context in an `Arc` (updating it with `Arc::make_mut`) can build a
/// `Context` per render for free.
#[derive(Clone, Debug)]
pub struct Context(Value);

impl Context {
    /// Wraps a shared JSON context.
    pub fn new(ctx: Arc<serde_json::Value>) -> Self {
        Context(lazy(&ctx, &[]).unwrap_or(Value::UNDEFINED))
    }
}

impl Context {
    /// A few per-render variables (`vars`, converted on every call, so keep
    /// them small) beside one large shared map under `name`, read lazily.
    ///
    /// Inside `name`, a plain key (no `.` or `[`) is looked up first as
    /// `scope_prefix` + key, so that a group's members can name each other
    /// by their plain ids; any key can still be named in full.
    pub fn scoped(
        vars: serde_json::Map<String, serde_json::Value>,
        name: &str,
        shared: Arc<serde_json::Value>,
        scope_prefix: &str,
    ) -> Self {
        Self::scoped_in(vars, name, Arc::new(JsonEntries(shared)), scope_prefix)
    }

    /// As [`Context::scoped`], with the ended nodes' entries as the shared
    /// map: each entry reads as `{output, status, attempt}` without being
    /// kept as a JSON object of its own.
    pub fn scoped_nodes(
        vars: serde_json::Map<String, serde_json::Value>,
        name: &str,
        nodes: Arc<NodeEntries>,
        scope_prefix: &str,
    ) -> Self {
        Self::scoped_in(vars, name, nodes, scope_prefix)
    }

    fn scoped_in(
        vars: serde_json::Map<String, serde_json::Value>,
        name: &str,
        shared: Arc<dyn Entries>,
        scope_prefix: &str,
    ) -> Self {
        Context(Value::from_object(Scoped {
            vars: Value::from_serialize(&vars),
            name: name.to_string(),
            map: Arc::new(ScopedMap {
                shared,
                prefix: scope_prefix.to_string(),
            }),
        }))
    }
}

/// The status functions an `if` may call (WORKFLOW.md, "Failure
/// handlers").
pub const STATUS_FUNCTIONS: &[&str] = &["success", "failure", "cancelled", "always"];

/// How a node's needs ended, as the status functions of its `if` tell it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NeedsEnded {
    /// `success()`: every need finished.
    pub success: bool,
    /// `failure()`: a need failed, or did not finish because something
    /// before it failed.
    pub failure: bool,
    /// `cancelled()`: the run is being cancelled, or a need was.
    pub cancelled: bool,
}

impl Context {
    /// This context with the status functions (`always()` is true).
    pub fn with_status(&self, status: NeedsEnded) -> Context {
        Context(Value::from_object(WithStatus {
            base: self.0.clone(),
            status,
        }))
    }
}

/// A context with the status functions beside its names.
#[derive(Debug)]
struct WithStatus {
    base: Value,
    status: NeedsEnded,
}

impl Object for WithStatus {
    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        let holds = match key.as_str()? {
            "success" => self.status.success,
            "failure" => self.status.failure,
            "cancelled" => self.status.cancelled,
            "always" => true,
            _ => return self.base.get_item(key).ok().filter(|v| !v.is_undefined()),
        };
        Some(Value::from_function(move || holds))
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        let mut keys: Vec<Value> = self
            .base
            .try_iter()
            .map(|i| i.collect())
            .unwrap_or_default();
        keys.extend(STATUS_FUNCTIONS.iter().map(|f| Value::from(*f)));
        Enumerator::Values(keys)
    }
}

/// One ended node instance as templates see it under `nodes`.
#[derive(Debug, Clone)]
pub struct NodeEntry {
    /// Its output (`null` when it had none), shared with the run state.
    pub output: cairn_events::Output,
    /// `finished`, `failed`, `skipped` or `cancelled`.
    pub status: &'static str,
    /// Its latest attempt.
    pub attempt: u32,
    /// Why it failed (templates see `{kind, message}`, or none).
    pub error: Option<Box<cairn_events::ErrorInfo>>,
    /// Which pass of the node this is (templates see the latest). Not
    /// shown to templates: the engine uses it to let go of the output of
    /// the pass an entry replaces.
    pub iteration: u32,
}

impl NodeEntry {
    /// The entry as the JSON object templates read, for contexts that are
    /// copied rather than shared.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "output": self.output.to_value(),
            "status": self.status,
            "attempt": self.attempt,
            "error": self.error.as_deref().map(error_json),
        })
    }
}

/// A node's error as templates read it.
fn error_json(e: &cairn_events::ErrorInfo) -> serde_json::Value {
    serde_json::json!({ "kind": e.kind, "message": e.message })
}

/// Every ended node instance by path, in the order they first ended (so
/// that a template that walks `nodes` sees one order on every run).
///
/// An entry costs a few dozen bytes beside its output, where a JSON object
/// of three fields costs a few hundred: at 100,000 nodes that is most of
/// what the template context weighs.
pub type NodeEntries = indexmap::IndexMap<Arc<str>, NodeEntry>;

/// A large map that templates read lazily, one entry at a time.
trait Entries: Send + Sync + fmt::Debug + 'static {
    /// The template value of the entry under `key`.
    fn lookup(&self, key: &str) -> Option<Value>;
    /// Whether there is an entry under `key`.
    fn contains(&self, key: &str) -> bool;
    /// Every key, in the map's order.
    fn key_list(&self) -> Vec<&str>;
}

/// A JSON object as [`Entries`].
#[derive(Debug)]
struct JsonEntries(Arc<serde_json::Value>);

impl Entries for JsonEntries {
    fn lookup(&self, key: &str) -> Option<Value> {
        self.0.get(key)?;
        lazy(&self.0, &[Step::Key(key.to_string())])
    }

    fn contains(&self, key: &str) -> bool {
        self.0.get(key).is_some()
    }

    fn key_list(&self) -> Vec<&str> {
        self.0
            .as_object()
            .map(|m| m.keys().map(String::as_str).collect())
            .unwrap_or_default()
    }
}

impl Entries for NodeEntries {
    fn lookup(&self, key: &str) -> Option<Value> {
        let entry = self.get(key)?;
        Some(Value::from_object(entry.clone()))
    }

    fn contains(&self, key: &str) -> bool {
        self.contains_key(key)
    }

    fn key_list(&self) -> Vec<&str> {
        self.keys().map(|k| &**k).collect()
    }
}

impl Object for NodeEntry {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Map
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        match key.as_str()? {
            "output" => lazy(&self.output.value(), &[]),
            "status" => Some(Value::from(self.status)),
            "attempt" => Some(Value::from(self.attempt)),
            "error" => Some(match self.error.as_deref() {
                Some(e) => Value::from_serialize(error_json(e)),
                None => Value::from(()),
            }),
            _ => None,
        }
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Str(&["output", "status", "attempt", "error"])
    }
}

/// The root of a [`Context::scoped`]: small variables and one shared map.
#[derive(Debug)]
struct Scoped {
    vars: Value,
    name: String,
    map: Arc<ScopedMap>,
}

impl Object for Scoped {
    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        if key.as_str() == Some(self.name.as_str()) {
            return Some(Value::from_dyn_object(self.map.clone()));
        }
        self.vars.get_item(key).ok().filter(|v| !v.is_undefined())
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        let mut keys: Vec<Value> = self
            .vars
            .try_iter()
            .map(|i| i.collect())
            .unwrap_or_default();
        keys.push(Value::from(self.name.as_str()));
        Enumerator::Values(keys)
    }
}

/// A shared map whose plain keys are looked up under a prefix first.
#[derive(Debug)]
struct ScopedMap {
    shared: Arc<dyn Entries>,
    prefix: String,
}

impl ScopedMap {
    fn scoped_key(&self, k: &str) -> Option<String> {
        if self.prefix.is_empty() || k.contains(['.', '[']) {
            return None;
        }
        let full = format!("{}{k}", self.prefix);
        self.shared.contains(&full).then_some(full)
    }
}

impl Object for ScopedMap {
    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        let k = key.as_str()?;
        match self.scoped_key(k) {
            Some(full) => self.shared.lookup(&full),
            None => self.shared.lookup(k),
        }
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        let all = self.shared.key_list();
        let mut keys: Vec<Value> = all.iter().map(|k| Value::from(*k)).collect();
        if !self.prefix.is_empty() {
            for k in &all {
                if let Some(rest) = k.strip_prefix(&self.prefix) {
                    if !rest.contains(['.', '[']) && !self.shared.contains(rest) {
                        keys.push(Value::from(rest));
                    }
                }
            }
        }
        Enumerator::Values(keys)
    }
}

impl From<serde_json::Value> for Context {
    fn from(v: serde_json::Value) -> Self {
        Context::new(Arc::new(v))
    }
}

/// One step from a JSON value to a child.
#[derive(Debug, Clone)]
enum Step {
    Key(String),
    Index(usize),
}

/// A JSON object or array inside a shared root, found by its path from the root.
#[derive(Debug)]
struct LazyJson {
    root: Arc<serde_json::Value>,
    path: Vec<Step>,
}

impl LazyJson {
    fn node(&self) -> &serde_json::Value {
        let mut cur = &*self.root;
        for step in &self.path {
            cur = match step {
                Step::Key(k) => &cur[k.as_str()],
                Step::Index(i) => &cur[*i],
            };
        }
        cur
    }

    fn child(&self, step: Step) -> Option<Value> {
        let mut path = Vec::with_capacity(self.path.len() + 1);
        path.extend(self.path.iter().cloned());
        path.push(step);
        lazy(&self.root, &path)
    }
}

/// The template value at `path`: containers stay lazy, scalars are converted directly.
fn lazy(root: &Arc<serde_json::Value>, path: &[Step]) -> Option<Value> {
    let mut cur = &**root;
    for step in path {
        cur = match step {
            Step::Key(k) => cur.get(k.as_str())?,
            Step::Index(i) => cur.get(*i)?,
        };
    }
    Some(match cur {
        serde_json::Value::Object(_) | serde_json::Value::Array(_) => {
            Value::from_object(LazyJson {
                root: root.clone(),
                path: path.to_vec(),
            })
        }
        scalar => Value::from_serialize(scalar),
    })
}

impl Object for LazyJson {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        match self.node() {
            serde_json::Value::Array(_) => ObjectRepr::Seq,
            _ => ObjectRepr::Map,
        }
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        match self.node() {
            serde_json::Value::Object(map) => {
                let k = key.as_str()?;
                map.contains_key(k)
                    .then(|| self.child(Step::Key(k.to_string())))?
            }
            serde_json::Value::Array(items) => {
                let i = i64::try_from(key.clone()).ok()?;
                let i = if i < 0 { items.len() as i64 + i } else { i };
                let i = usize::try_from(i).ok().filter(|&i| i < items.len())?;
                self.child(Step::Index(i))
            }
            _ => None,
        }
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        match self.node() {
            serde_json::Value::Object(map) => {
                Enumerator::Values(map.keys().map(|k| Value::from(k.as_str())).collect())
            }
            serde_json::Value::Array(items) => Enumerator::Seq(items.len()),
            _ => Enumerator::Empty,
        }
    }
}

/// Jinja templates and expressions with strict undefined; built once, reused for every render.
pub struct Templates {
    env: Environment<'static>,
}

/// A template or expression that failed to parse or render.
#[derive(Debug, thiserror::Error)]
pub struct TemplateError {
    /// What went wrong.
    pub message: String,
    /// 1-based line inside the template, when known.
    pub line: Option<usize>,
    /// 1-based column (in characters) inside the template of the `{{` whose
    /// expression failed, when known.
    pub column: Option<usize>,
    /// The template or expression text.
    pub source_text: String,
}

impl fmt::Display for TemplateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.message)?;
        match (self.line, self.column) {
            (Some(l), Some(c)) => write!(f, " (line {l}, column {c} of the template)")?,
            (Some(l), None) => write!(f, " (line {l} of the template)")?,
            _ => {}
        }
        write!(f, " in `{}`", self.source_text)
    }
}

impl TemplateError {
    fn from_jinja(err: minijinja::Error, source: &str) -> Self {
        // minijinja's Display appends "(in <name>:line)"; we report the line ourselves, so
        // build the message from the kind and detail only.
        let mut message = err.kind().to_string();
        if let Some(detail) = err.detail() {
            message.push_str(": ");
            message.push_str(detail);
        }
        // Errors raised inside filters carry their cause in the source chain.
        let mut cause = std::error::Error::source(&err);
        while let Some(c) = cause {
            message.push_str(": ");
            message.push_str(&c.to_string());
            cause = c.source();
        }
        TemplateError {
            message,
            line: err.line(),
            column: None,
            source_text: source.to_string(),
        }
    }

    fn new(message: impl Into<String>, source: &str) -> Self {
        TemplateError {
            message: message.into(),
            line: None,
            column: None,
            source_text: source.to_string(),
        }
    }

    fn at(message: impl Into<String>, source: &str, line: usize, column: usize) -> Self {
        TemplateError {
            message: message.into(),
            line: Some(line),
            column: Some(column),
            source_text: source.to_string(),
        }
    }

    /// This error of the expression of the `{{` at `line` and `column`,
    /// placed in `template`: its line counted from the template's start.
    fn in_template(mut self, template: &str, line: usize, column: usize) -> Self {
        let inner = self.line.unwrap_or(1);
        self.line = Some(line + inner - 1);
        self.column = Some(column);
        self.source_text = template.to_string();
        self
    }
}

impl Default for Templates {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for Templates {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Templates").finish_non_exhaustive()
    }
}

/// One part of a template string: literal text, or the expression inside a
/// `{{ … }}`.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Piece<'a> {
    /// Text copied as it is.
    Text(&'a str),
    /// An expression, and where its `{{` is in the template (1-based line
    /// and column) for its errors.
    Expr {
        expr: &'a str,
        line: usize,
        column: usize,
    },
}

/// Cuts a template string into text and `{{ … }}` expressions.
///
/// Only `{{ … }}` is template syntax: `{%`, `%}`, `{#` and `#}` are text,
/// so shell code such as `${#N}`, `{%s}` or `$((…))` in a command passes
/// through untouched. Inside an expression, a `}}` in a string literal or
/// closing a nested map (`{{ {'a': {'b': 1}} }}`) does not end it.
/// `{{-` and `-}}` trim the whitespace before and after, as in Jinja.
fn pieces(template: &str) -> Result<Vec<Piece<'_>>, TemplateError> {
    let mut out = Vec::new();
    let mut rest = template;
    let mut offset = 0;
    let mut trim_next = false;
    while let Some(open) = rest.find("{{") {
        let mut text = &rest[..open];
        if trim_next {
            text = text.trim_start();
        }
        let after = &rest[open + 2..];
        let (trim_before, body_start) = match after.as_bytes().first() {
            Some(b'-') => (true, 1),
            Some(b'+') => (false, 1),
            _ => (false, 0),
        };
        if trim_before {
            text = text.trim_end();
        }
        if !text.is_empty() {
            out.push(Piece::Text(text));
        }
        let (line, column) = line_col(template, offset + open);
        let body = &after[body_start..];
        let Some((len, trim_after, marker)) = expression_end(body) else {
            return Err(TemplateError::at(
                format!("`{{{{` at line {line}, column {column} is never closed by `}}}}`"),
                template,
                line,
                column,
            ));
        };
        let expr = &body[..len];
        if expr.trim().is_empty() {
            return Err(TemplateError::at(
                "empty expression in `{{ }}`",
                template,
                line,
                column,
            ));
        }
        out.push(Piece::Expr { expr, line, column });
        let consumed = open + 2 + body_start + len + marker;
        offset += consumed;
        rest = &rest[consumed..];
        trim_next = trim_after;
    }
    let text = if trim_next { rest.trim_start() } else { rest };
    if !text.is_empty() {
        out.push(Piece::Text(text));
    }
    Ok(out)
}

/// Where the expression that starts `body` ends: its length, whether its
/// end marker trims the whitespace after it (`-}}`), and the marker's
/// length. `None` when nothing closes it.
fn expression_end(body: &str) -> Option<(usize, bool, usize)> {
    let bytes = body.as_bytes();
    let mut depth = 0usize;
    let mut quote: Option<u8> = None;
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if let Some(q) = quote {
            if b == b'\\' {
                i += 2;
                continue;
            }
            if b == q {
                quote = None;
            }
            i += 1;
            continue;
        }
        if depth == 0 {
            let rest = &bytes[i..];
            if rest.starts_with(b"}}") {
                return Some((i, false, 2));
            }
            if rest.starts_with(b"-}}") {
                return Some((i, true, 3));
            }
            if rest.starts_with(b"+}}") {
                return Some((i, false, 3));
            }
        }
        match b {
            b'\'' | b'"' => quote = Some(b),
            b'{' | b'[' | b'(' => depth += 1,
            b'}' | b']' | b')' => depth = depth.saturating_sub(1),
            _ => {}
        }
        i += 1;
    }
    None
}

/// The expressions of a template string's `{{ … }}`, or `None` when it
/// does not parse.
pub(crate) fn expressions(template: &str) -> Option<Vec<String>> {
    Some(
        pieces(template)
            .ok()?
            .into_iter()
            .filter_map(|p| match p {
                Piece::Expr { expr, .. } => Some(expr.to_string()),
                Piece::Text(_) => None,
            })
            .collect(),
    )
}

/// The 1-based line and column (in characters) of byte `offset` in `s`.
fn line_col(s: &str, offset: usize) -> (usize, usize) {
    let before = &s[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    (line, before[line_start..].chars().count() + 1)
}

/// The expression inside a string that is exactly one `{{ expr }}`
/// (whitespace around allowed), if it is one.
fn single_expression(template: &str) -> Option<(&str, usize, usize)> {
    let pieces = pieces(template).ok()?;
    let mut found = None;
    for p in pieces {
        match p {
            Piece::Text(t) if t.trim().is_empty() => {}
            Piece::Expr { expr, line, column } if found.is_none() => {
                found = Some((expr.trim(), line, column))
            }
            _ => return None,
        }
    }
    found
}

fn to_json(v: &Value, source: &str) -> Result<serde_json::Value, TemplateError> {
    if v.is_undefined() {
        return Err(TemplateError::new("undefined value", source));
    }
    let v = serde_json::to_value(v).map_err(|e| TemplateError::new(e.to_string(), source))?;
    shallow(v, || source.to_string())
}

/// `v` when it nests at most [`crate::limits::MAX_VALUE_DEPTH`] deep: a rendered value
/// becomes a node's output or a tool's arguments, written to the log.
fn shallow(
    v: serde_json::Value,
    source: impl FnOnce() -> String,
) -> Result<serde_json::Value, TemplateError> {
    match crate::limits::check_depth(&v) {
        Ok(()) => Ok(v),
        Err(e) => Err(TemplateError::new(format!("the value is {e}"), &source())),
    }
}

/// The start of a value's JSON, to name it in an error.
fn snippet(v: &serde_json::Value) -> String {
    const MAX: usize = 120;
    let mut s = v.to_string();
    if s.len() > MAX {
        let mut end = MAX;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push_str("...");
    }
    s
}

impl Templates {
    /// A template environment with strict undefined and minijinja's built-in filters
    /// (plus `tojson`).
    pub fn new() -> Self {
        let mut env = Environment::new();
        env.set_undefined_behavior(UndefinedBehavior::Strict);
        // Output goes to argv, files and JSON, never to HTML: escaping would corrupt it.
        env.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
        // Templates are single strings; keep a trailing newline that the author wrote.
        env.set_keep_trailing_newline(true);
        Templates { env }
    }

    /// A string that is exactly one `{{ expr }}` (whitespace around allowed) yields the
    /// expression's native JSON value (number, list, object...); any other string renders to
    /// a string. Copies `ctx` into template values on every call; for large contexts use
    /// [`Templates::render_in`] with a shared [`Context`].
    pub fn render(
        &self,
        template: &str,
        ctx: &serde_json::Value,
    ) -> Result<serde_json::Value, TemplateError> {
        if !template.contains("{{") {
            return Ok(serde_json::Value::String(template.to_string()));
        }
        let ctx = Value::from_serialize(ctx);
        if let Some((expr, line, column)) = single_expression(template) {
            return self
                .eval_value(expr, ctx)
                .map_err(|e| e.in_template(template, line, column));
        }
        self.render_pieces(template, ctx)
            .map(serde_json::Value::String)
    }

    /// Renders a template to a string.
    pub fn render_string(
        &self,
        template: &str,
        ctx: &serde_json::Value,
    ) -> Result<String, TemplateError> {
        self.render_pieces(template, Value::from_serialize(ctx))
    }

    /// [`Templates::render`] against a shared [`Context`] (no copy of the context).
    pub fn render_in(
        &self,
        template: &str,
        ctx: &Context,
    ) -> Result<serde_json::Value, TemplateError> {
        if !template.contains("{{") {
            return Ok(serde_json::Value::String(template.to_string()));
        }
        if let Some((expr, line, column)) = single_expression(template) {
            return self
                .eval_value(expr, ctx.0.clone())
                .map_err(|e| e.in_template(template, line, column));
        }
        self.render_pieces(template, ctx.0.clone())
            .map(serde_json::Value::String)
    }

    /// [`Templates::render_string`] against a shared [`Context`].
    pub fn render_string_in(&self, template: &str, ctx: &Context) -> Result<String, TemplateError> {
        self.render_pieces(template, ctx.0.clone())
    }

    /// The text of `template` with each `{{ … }}` replaced by its
    /// expression's value as Jinja prints it.
    fn render_pieces(&self, template: &str, ctx: Value) -> Result<String, TemplateError> {
        use std::fmt::Write as _;
        let mut out = String::with_capacity(template.len());
        for piece in pieces(template)? {
            match piece {
                Piece::Text(t) => out.push_str(t),
                Piece::Expr { expr, line, column } => {
                    let v = self
                        .eval_raw_value(expr, ctx.clone())
                        .map_err(|e| e.in_template(template, line, column))?;
                    if v.is_undefined() {
                        return Err(TemplateError::at(
                            format!("undefined value: `{}`", expr.trim()),
                            template,
                            line,
                            column,
                        ));
                    }
                    write!(out, "{v}")
                        .map_err(|e| TemplateError::at(e.to_string(), template, line, column))?;
                }
            }
        }
        Ok(out)
    }

    /// An expression's JSON value; an undefined one is an error.
    fn eval_value(&self, expr: &str, ctx: Value) -> Result<serde_json::Value, TemplateError> {
        let v = self.eval_raw_value(expr, ctx)?;
        to_json(&v, expr)
    }

    /// [`Templates::render_value`] against a shared [`Context`].
    pub fn render_value_in(
        &self,
        v: &serde_json::Value,
        ctx: &Context,
    ) -> Result<serde_json::Value, TemplateError> {
        // Values rendered inside lists and objects nest deeper than each alone.
        shallow(self.render_value_in_at(v, ctx)?, || snippet(v))
    }

    fn render_value_in_at(
        &self,
        v: &serde_json::Value,
        ctx: &Context,
    ) -> Result<serde_json::Value, TemplateError> {
        use serde_json::Value as J;
        Ok(match v {
            J::String(s) => self.render_in(s, ctx)?,
            J::Array(items) => J::Array(
                items
                    .iter()
                    .map(|i| self.render_value_in_at(i, ctx))
                    .collect::<Result<_, _>>()?,
            ),
            J::Object(map) => {
                let mut out = serde_json::Map::with_capacity(map.len());
                for (k, v) in map {
                    out.insert(k.clone(), self.render_value_in_at(v, ctx)?);
                }
                J::Object(out)
            }
            other => other.clone(),
        })
    }

    /// [`Templates::eval`] against a shared [`Context`].
    pub fn eval_in(&self, expr: &str, ctx: &Context) -> Result<serde_json::Value, TemplateError> {
        let v = self.eval_raw_value(expr, ctx.0.clone())?;
        to_json(&v, expr)
    }

    /// [`Templates::eval_bool`] against a shared [`Context`].
    pub fn eval_bool_in(&self, expr: &str, ctx: &Context) -> Result<bool, TemplateError> {
        let v = self.eval_raw_value(expr, ctx.0.clone())?;
        if v.is_undefined() {
            return Err(TemplateError::new("undefined value", expr));
        }
        Ok(v.is_true())
    }

    /// Renders every string inside a JSON value (objects, arrays) with [`Templates::render`].
    /// Object keys are left as written. A result nested deeper than
    /// [`crate::limits::MAX_VALUE_DEPTH`] is an error.
    pub fn render_value(
        &self,
        v: &serde_json::Value,
        ctx: &serde_json::Value,
    ) -> Result<serde_json::Value, TemplateError> {
        shallow(self.render_value_at(v, ctx)?, || snippet(v))
    }

    fn render_value_at(
        &self,
        v: &serde_json::Value,
        ctx: &serde_json::Value,
    ) -> Result<serde_json::Value, TemplateError> {
        use serde_json::Value as J;
        Ok(match v {
            J::String(s) => self.render(s, ctx)?,
            J::Array(items) => J::Array(
                items
                    .iter()
                    .map(|i| self.render_value_at(i, ctx))
                    .collect::<Result<_, _>>()?,
            ),
            J::Object(map) => {
                let mut out = serde_json::Map::with_capacity(map.len());
                for (k, v) in map {
                    out.insert(k.clone(), self.render_value_at(v, ctx)?);
                }
                J::Object(out)
            }
            other => other.clone(),
        })
    }

    /// Evaluates an expression to its JSON value; an undefined result is an error.
    pub fn eval(
        &self,
        expr: &str,
        ctx: &serde_json::Value,
    ) -> Result<serde_json::Value, TemplateError> {
        let v = self.eval_raw(expr, ctx)?;
        to_json(&v, expr)
    }

    /// Evaluates an expression with Jinja truthiness; an undefined result is an error, so a
    /// misspelt name does not silently read as false.
    pub fn eval_bool(&self, expr: &str, ctx: &serde_json::Value) -> Result<bool, TemplateError> {
        let v = self.eval_raw(expr, ctx)?;
        if v.is_undefined() {
            return Err(TemplateError::new("undefined value", expr));
        }
        Ok(v.is_true())
    }

    fn eval_raw(&self, expr: &str, ctx: &serde_json::Value) -> Result<Value, TemplateError> {
        self.eval_raw_value(expr, Value::from_serialize(ctx))
    }

    fn eval_raw_value(&self, expr: &str, ctx: Value) -> Result<Value, TemplateError> {
        let compiled = self
            .env
            .compile_expression(expr)
            .map_err(|e| TemplateError::from_jinja(e, expr))?;
        compiled
            .eval(ctx)
            .map_err(|e| TemplateError::from_jinja(e, expr))
    }

    /// Checks a template's syntax only: each `{{ … }}` closes and holds an
    /// expression that parses.
    pub fn check_template(&self, template: &str) -> Result<(), TemplateError> {
        for piece in pieces(template)? {
            if let Piece::Expr { expr, line, column } = piece {
                self.env.compile_expression(expr).map_err(|e| {
                    TemplateError::from_jinja(e, expr).in_template(template, line, column)
                })?;
            }
        }
        Ok(())
    }

    /// Whether an expression calls a status function
    /// ([`STATUS_FUNCTIONS`]); false when it does not parse.
    pub fn calls_status(&self, expr: &str) -> bool {
        crate::refs::references(expr).is_ok_and(|r| STATUS_FUNCTIONS.iter().any(|f| r.calls(f)))
    }

    /// Checks an expression's syntax only.
    pub fn check_expr(&self, expr: &str) -> Result<(), TemplateError> {
        if expr.trim().is_empty() {
            return Err(TemplateError::new("empty expression", expr));
        }
        self.env
            .compile_expression(expr)
            .map(|_| ())
            .map_err(|e| TemplateError::from_jinja(e, expr))
    }
}
