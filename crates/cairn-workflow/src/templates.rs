use std::fmt;

/// Jinja templates and expressions with strict undefined; built once, reused for every render.
pub struct Templates {
    env: minijinja::Environment<'static>,
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
            write!(f, " (line {l})")?;
        }
        write!(f, " in `{}`", self.source_text)
    }
}

impl Default for Templates {
    fn default() -> Self {
        Self::new()
    }
}

impl Templates {
    /// A template environment with strict undefined.
    pub fn new() -> Self {
        let _ = &Self::dummy;
        todo!()
    }

    fn dummy(&self) -> &minijinja::Environment<'static> {
        &self.env
    }

    /// A string that is exactly one `{{ expr }}` yields the expression's native JSON value;
    /// any other string renders to a string.
    pub fn render(
        &self,
        template: &str,
        ctx: &serde_json::Value,
    ) -> Result<serde_json::Value, TemplateError> {
        let _ = (template, ctx);
        todo!()
    }

    /// Renders a template to a string.
    pub fn render_string(
        &self,
        template: &str,
        ctx: &serde_json::Value,
    ) -> Result<String, TemplateError> {
        let _ = (template, ctx);
        todo!()
    }

    /// Renders every string inside a JSON value (objects, arrays) with [`Templates::render`].
    pub fn render_value(
        &self,
        v: &serde_json::Value,
        ctx: &serde_json::Value,
    ) -> Result<serde_json::Value, TemplateError> {
        let _ = (v, ctx);
        todo!()
    }

    /// Evaluates an expression to its JSON value.
    pub fn eval(
        &self,
        expr: &str,
        ctx: &serde_json::Value,
    ) -> Result<serde_json::Value, TemplateError> {
        let _ = (expr, ctx);
        todo!()
    }

    /// Evaluates an expression with Jinja truthiness.
    pub fn eval_bool(&self, expr: &str, ctx: &serde_json::Value) -> Result<bool, TemplateError> {
        let _ = (expr, ctx);
        todo!()
    }

    /// Checks a template's syntax only.
    pub fn check_template(&self, template: &str) -> Result<(), TemplateError> {
        let _ = template;
        todo!()
    }

    /// Checks an expression's syntax only.
    pub fn check_expr(&self, expr: &str) -> Result<(), TemplateError> {
        let _ = expr;
        todo!()
    }
}
