//! Templates and expressions: Jinja syntax through minijinja, with strict undefined so a
//! misspelt variable is an error instead of an empty string.

use std::fmt;

use minijinja::{Environment, UndefinedBehavior, Value};

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
    serde_json::to_value(v).map_err(|e| TemplateError::new(e.to_string(), source))
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
    /// a string.
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

    /// Renders every string inside a JSON value (objects, arrays) with [`Templates::render`].
    /// Object keys are left as written.
    pub fn render_value(
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
                    .map(|i| self.render_value(i, ctx))
                    .collect::<Result<_, _>>()?,
            ),
            J::Object(map) => {
                let mut out = serde_json::Map::with_capacity(map.len());
                for (k, v) in map {
                    out.insert(k.clone(), self.render_value(v, ctx)?);
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
        let compiled = self
            .env
            .compile_expression(expr)
            .map_err(|e| TemplateError::from_jinja(e, expr))?;
        compiled
            .eval(Value::from_serialize(ctx))
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
