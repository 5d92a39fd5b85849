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

/// A shared JSON object whose plain keys are looked up under a prefix first.
#[derive(Debug)]
struct ScopedMap {
    shared: Arc<serde_json::Value>,
    prefix: String,
}

impl ScopedMap {
    fn scoped_key(&self, k: &str) -> Option<String> {
        if self.prefix.is_empty() || k.contains(['.', '[']) {
            return None;
        }
        let full = format!("{}{k}", self.prefix);
        self.shared.get(&full).is_some().then_some(full)
    }
}

impl Object for ScopedMap {
    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        let k = key.as_str()?;
        let full = self.scoped_key(k).unwrap_or_else(|| k.to_string());
        self.shared.get(&full)?;
        lazy(&self.shared, &[Step::Key(full)])
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        let Some(map) = self.shared.as_object() else {
            return Enumerator::Empty;
        };
        let mut keys: Vec<Value> = map.keys().map(|k| Value::from(k.as_str())).collect();
        if !self.prefix.is_empty() {
            for k in map.keys() {
                if let Some(rest) = k.strip_prefix(&self.prefix) {
                    if !rest.contains(['.', '[']) && !map.contains_key(rest) {
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
    /// The template or expression text.
    pub source_text: String,
}

impl fmt::Display for TemplateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.message)?;
        if let Some(l) = self.line {
            write!(f, " (line {l} of the template)")?;
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
            source_text: source.to_string(),
        }
    }

    fn new(message: impl Into<String>, source: &str) -> Self {
        TemplateError {
            message: message.into(),
            line: None,
            source_text: source.to_string(),
        }
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

/// The expression inside a string that is exactly one `{{ expr }}`, if it is one.
fn single_expression(template: &str) -> Option<&str> {
    let t = template.trim();
    let inner = t.strip_prefix("{{")?.strip_suffix("}}")?;
    // Whitespace-control markers (`{{- x -}}`) do not change the value.
    let inner = inner.strip_prefix(['-', '+']).unwrap_or(inner);
    let inner = inner.strip_suffix(['-', '+']).unwrap_or(inner);
    if inner.contains("}}") || inner.contains("{{") || inner.contains("{%") || inner.contains("{#")
    {
        return None;
    }
    let inner = inner.trim();
    if inner.is_empty() {
        None
    } else {
        Some(inner)
    }
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
        if let Some(expr) = single_expression(template) {
            // Fall through to string rendering when the inside is not a plain expression
            // (it might use syntax only templates accept); the template path reports errors.
            if self.env.compile_expression(expr).is_ok() {
                return self
                    .eval(expr, ctx)
                    .map_err(|e| TemplateError::new(e.message, template));
            }
        }
        if !template.contains("{{") && !template.contains("{%") && !template.contains("{#") {
            return Ok(serde_json::Value::String(template.to_string()));
        }
        self.render_string(template, ctx)
            .map(serde_json::Value::String)
    }

    /// Renders a template to a string.
    pub fn render_string(
        &self,
        template: &str,
        ctx: &serde_json::Value,
    ) -> Result<String, TemplateError> {
        let tmpl = self
            .env
            .template_from_str(template)
            .map_err(|e| TemplateError::from_jinja(e, template))?;
        tmpl.render(Value::from_serialize(ctx))
            .map_err(|e| TemplateError::from_jinja(e, template))
    }

    /// [`Templates::render`] against a shared [`Context`] (no copy of the context).
    pub fn render_in(
        &self,
        template: &str,
        ctx: &Context,
    ) -> Result<serde_json::Value, TemplateError> {
        if let Some(expr) = single_expression(template) {
            if self.env.compile_expression(expr).is_ok() {
                return self
                    .eval_in(expr, ctx)
                    .map_err(|e| TemplateError::new(e.message, template));
            }
        }
        if !template.contains("{{") && !template.contains("{%") && !template.contains("{#") {
            return Ok(serde_json::Value::String(template.to_string()));
        }
        self.render_string_in(template, ctx)
            .map(serde_json::Value::String)
    }

    /// [`Templates::render_string`] against a shared [`Context`].
    pub fn render_string_in(&self, template: &str, ctx: &Context) -> Result<String, TemplateError> {
        let tmpl = self
            .env
            .template_from_str(template)
            .map_err(|e| TemplateError::from_jinja(e, template))?;
        tmpl.render(ctx.0.clone())
            .map_err(|e| TemplateError::from_jinja(e, template))
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

    /// Checks a template's syntax only.
    pub fn check_template(&self, template: &str) -> Result<(), TemplateError> {
        self.env
            .template_from_str(template)
            .map(|_| ())
            .map_err(|e| TemplateError::from_jinja(e, template))
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
