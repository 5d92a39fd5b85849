//! What an expression refers to, read from its syntax tree: each name it
//! reads with the constant steps after it (`nodes.build.output.files`,
//! `nodes['review.fix'].status`), and each name it calls.
//!
//! The workflow checker uses this to find a reference that cannot resolve
//! before a run starts, and the parser to tell a failure handler's `if`
//! (one that calls a status function) from a plain one. minijinja's own
//! `undeclared_variables` names only the first name of a path and follows
//! no `['…']` subscript, which is how a node inside a group is named.

use minijinja::machinery::{ast, parse_expr};

/// One step of a reference after its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// `.key` or `['key']`.
    Key(String),
    /// `[3]`.
    Index(i64),
}

/// A name an expression reads, and the constant steps read after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    /// The name (`nodes`, `input`, `item`).
    pub root: String,
    /// The steps after it, up to the first that is not a constant.
    pub path: Vec<Step>,
    /// 1-based line of the name inside the expression.
    pub line: usize,
    /// 1-based column of the name inside the expression.
    pub column: usize,
}

/// What an expression refers to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Refs {
    /// The names it reads, with their paths, in the order written.
    pub reads: Vec<Reference>,
    /// The names it calls as functions (`failure()`), in the order written.
    pub calls: Vec<String>,
}

impl Refs {
    /// Whether it calls `name`.
    pub fn calls(&self, name: &str) -> bool {
        self.calls.iter().any(|c| c == name)
    }
}

/// What `expr` refers to; an error when it does not parse.
pub fn references(expr: &str) -> Result<Refs, minijinja::Error> {
    let tree = parse_expr(expr)?;
    let mut refs = Refs::default();
    walk(&tree, &mut refs);
    Ok(refs)
}

fn walk(e: &ast::Expr<'_>, out: &mut Refs) {
    use ast::Expr as E;
    match e {
        E::Var(v) => out.reads.push(reference(v.id, Vec::new(), v.span())),
        E::Const(_) => {}
        E::GetAttr(_) | E::GetItem(_) => chain(e, out),
        E::Slice(s) => {
            walk(&s.expr, out);
            for part in [&s.start, &s.stop, &s.step].into_iter().flatten() {
                walk(part, out);
            }
        }
        E::UnaryOp(u) => walk(&u.expr, out),
        E::BinOp(b) => {
            walk(&b.left, out);
            walk(&b.right, out);
        }
        E::Compare(c) => {
            walk(&c.expr, out);
            for op in &c.ops {
                walk(&op.expr, out);
            }
        }
        E::IfExpr(i) => {
            walk(&i.test_expr, out);
            walk(&i.true_expr, out);
            if let Some(f) = &i.false_expr {
                walk(f, out);
            }
        }
        E::Filter(f) => {
            if let Some(inner) = &f.expr {
                walk(inner, out);
            }
            args(&f.args, out);
        }
        E::Test(t) => {
            walk(&t.expr, out);
            args(&t.args, out);
        }
        E::Call(c) => {
            match &c.expr {
                E::Var(v) => out.calls.push(v.id.to_string()),
                other => walk(other, out),
            }
            args(&c.args, out);
        }
        E::List(l) => {
            for item in &l.items {
                walk(item, out);
            }
        }
        E::Map(m) => {
            for item in m.keys.iter().chain(&m.values) {
                walk(item, out);
            }
        }
    }
}

fn args(args: &[ast::CallArg<'_>], out: &mut Refs) {
    for a in args {
        match a {
            ast::CallArg::Pos(e)
            | ast::CallArg::Kwarg(_, e)
            | ast::CallArg::PosSplat(e)
            | ast::CallArg::KwargSplat(e) => walk(e, out),
        }
    }
}

/// A run of `.key` and `[…]` steps: a reference when it starts at a name,
/// its constant steps kept up to the first that is not one.
fn chain(e: &ast::Expr<'_>, out: &mut Refs) {
    use ast::Expr as E;
    // Steps from the outside in; reversed once the base is found.
    let mut steps: Vec<Option<Step>> = Vec::new();
    let mut cur = e;
    loop {
        match cur {
            E::GetAttr(a) => {
                steps.push(Some(Step::Key(a.name.to_string())));
                cur = &a.expr;
            }
            E::GetItem(i) => {
                let step = constant_step(&i.subscript_expr);
                if step.is_none() {
                    walk(&i.subscript_expr, out);
                }
                steps.push(step);
                cur = &i.expr;
            }
            E::Var(v) => {
                steps.reverse();
                let path = steps.into_iter().map_while(|s| s).collect();
                out.reads.push(reference(v.id, path, v.span()));
                return;
            }
            other => {
                walk(other, out);
                return;
            }
        }
    }
}

fn constant_step(e: &ast::Expr<'_>) -> Option<Step> {
    let c = match e {
        ast::Expr::Const(c) => c,
        // `[-1]` is the negation of a constant.
        ast::Expr::UnaryOp(u) if matches!(u.op, ast::UnaryOpKind::Neg) => {
            return match constant_step(&u.expr)? {
                Step::Index(i) => Some(Step::Index(-i)),
                Step::Key(_) => None,
            };
        }
        _ => return None,
    };
    if let Some(s) = c.value.as_str() {
        return Some(Step::Key(s.to_string()));
    }
    i64::try_from(c.value.clone()).ok().map(Step::Index)
}

fn reference(root: &str, path: Vec<Step>, span: minijinja::machinery::Span) -> Reference {
    Reference {
        root: root.to_string(),
        path,
        line: span.start_line as usize,
        column: span.start_col as usize + 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(k: &str) -> Step {
        Step::Key(k.into())
    }

    #[test]
    fn paths_follow_attributes_and_constant_subscripts() {
        let r = references("nodes.build.output.files | length > input['n'] and nodes['review.fix'].status == 'failed'").unwrap();
        let got: Vec<(&str, &[Step])> = r
            .reads
            .iter()
            .map(|r| (r.root.as_str(), r.path.as_slice()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("nodes", &[key("build"), key("output"), key("files")][..]),
                ("input", &[key("n")][..]),
                ("nodes", &[key("review.fix"), key("status")][..]),
            ]
        );
        assert_eq!((r.reads[1].line, r.reads[1].column), (1, 37));
    }

    #[test]
    fn a_computed_subscript_ends_the_path_and_is_read_itself() {
        let r = references("nodes.log.output[index].x[0]").unwrap();
        assert_eq!(r.reads[0].root, "index");
        assert_eq!(r.reads[1].path, vec![key("log"), key("output")]);
        let r = references("input.tags[-1]").unwrap();
        assert_eq!(r.reads[0].path, vec![key("tags"), Step::Index(-1)]);
    }

    #[test]
    fn calls_are_told_from_reads() {
        let r = references("failure() or (always() and not cancelled)").unwrap();
        assert!(r.calls("failure") && r.calls("always") && !r.calls("cancelled"));
        assert_eq!(r.reads.len(), 1);
        assert_eq!(r.reads[0].root, "cancelled");
        let r = references("(nodes | dictsort)[0].x | map(attribute=item)").unwrap();
        let roots: Vec<&str> = r.reads.iter().map(|r| r.root.as_str()).collect();
        assert_eq!(roots, ["nodes", "item"]);
    }
}
