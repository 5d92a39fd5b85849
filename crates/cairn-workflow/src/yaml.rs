//! A small YAML tree that keeps the position of every node.
//!
//! Semantic errors (an unknown field, a `needs` naming a missing node) must point at a line and
//! column, which serde-based YAML loaders forget once syntax is checked. So the tree is built
//! from saphyr's positioned event stream, resolving plain scalars by the YAML 1.2 core schema.

use std::borrow::Cow;
use std::collections::HashMap;

use saphyr_parser::{Event, Parser, ScalarStyle, Span};

/// A position in the source: 1-based line and column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Pos {
    pub line: usize,
    pub col: usize,
}

impl Pos {
    fn from_span(span: &Span) -> Self {
        Pos {
            line: span.start.line(),
            col: span.start.col() + 1,
        }
    }
}

/// A YAML value with its position.
#[derive(Debug, Clone)]
pub(crate) struct Node {
    pub pos: Pos,
    pub value: Yaml,
}

/// A resolved YAML value.
#[derive(Debug, Clone)]
pub(crate) enum Yaml {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    /// A string; `plain` is true for an unquoted scalar (kept to stringify numbers in argv).
    Str(String),
    Seq(Vec<Node>),
    /// Entries in file order; keys are kept as nodes so errors can point at them.
    Map(Vec<(Node, Node)>),
}

impl Yaml {
    /// A word for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Yaml::Null => "null",
            Yaml::Bool(_) => "a boolean",
            Yaml::Int(_) => "an integer",
            Yaml::Float(_) => "a number",
            Yaml::Str(_) => "a string",
            Yaml::Seq(_) => "a list",
            Yaml::Map(_) => "a mapping",
        }
    }
}

impl Node {
    /// The scalar's text when it is a string, number or boolean (for argv and env, where
    /// `20` and `"20"` mean the same thing).
    pub fn scalar_text(&self) -> Option<String> {
        match &self.value {
            Yaml::Str(s) => Some(s.clone()),
            Yaml::Int(i) => Some(i.to_string()),
            Yaml::Float(f) => Some(f.to_string()),
            Yaml::Bool(b) => Some(b.to_string()),
            _ => None,
        }
    }

    /// The key as a string (keys that are not strings are rendered by their text).
    pub fn key_text(&self) -> String {
        self.scalar_text().unwrap_or_else(|| match self.value {
            Yaml::Null => "null".into(),
            _ => format!("<{}>", self.value.type_name()),
        })
    }

    /// The value as JSON (mapping keys become strings).
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::Value as J;
        match &self.value {
            Yaml::Null => J::Null,
            Yaml::Bool(b) => J::Bool(*b),
            Yaml::Int(i) => J::from(*i),
            Yaml::Float(f) => serde_json::Number::from_f64(*f)
                .map(J::Number)
                .unwrap_or(J::Null),
            Yaml::Str(s) => J::String(s.clone()),
            Yaml::Seq(items) => J::Array(items.iter().map(Node::to_json).collect()),
            Yaml::Map(entries) => J::Object(
                entries
                    .iter()
                    .map(|(k, v)| (k.key_text(), v.to_json()))
                    .collect(),
            ),
        }
    }
}

/// A YAML syntax error.
#[derive(Debug)]
pub(crate) struct SyntaxError {
    pub pos: Pos,
    pub message: String,
}

/// Parses one YAML document (an empty file gives `Null`).
pub(crate) fn load(source: &str) -> Result<Node, SyntaxError> {
    let mut b = Builder {
        parser: Parser::new_from_str(source),
        anchors: HashMap::new(),
    };
    let mut doc: Option<Node> = None;
    loop {
        let (ev, span) = b.next()?;
        match ev {
            Event::StreamStart | Event::DocumentEnd | Event::Nothing => {}
            Event::StreamEnd => break,
            Event::DocumentStart(_) => {
                if doc.is_some() {
                    return Err(SyntaxError {
                        pos: Pos::from_span(&span),
                        message: "a workflow file holds one YAML document, found a second".into(),
                    });
                }
                let (ev, span) = b.next()?;
                doc = Some(b.node(ev, span)?);
            }
            other => {
                return Err(SyntaxError {
                    pos: Pos::from_span(&span),
                    message: format!("unexpected YAML event {other:?}"),
                })
            }
        }
    }
    Ok(doc.unwrap_or(Node {
        pos: Pos { line: 1, col: 1 },
        value: Yaml::Null,
    }))
}

struct Builder<'a> {
    parser: Parser<'a, saphyr_parser::StrInput<'a>>,
    anchors: HashMap<usize, Node>,
}

impl<'a> Builder<'a> {
    fn next(&mut self) -> Result<(Event<'a>, Span), SyntaxError> {
        match self.parser.next_event() {
            Some(Ok(x)) => Ok(x),
            Some(Err(e)) => Err(SyntaxError {
                pos: Pos {
                    line: e.marker().line(),
                    col: e.marker().col() + 1,
                },
                message: e.info().to_string(),
            }),
            None => Err(SyntaxError {
                pos: Pos::default(),
                message: "unexpected end of YAML".into(),
            }),
        }
    }

    fn node(&mut self, ev: Event<'a>, span: Span) -> Result<Node, SyntaxError> {
        let pos = Pos::from_span(&span);
        let (node, anchor) = match ev {
            Event::Scalar(text, style, anchor, tag) => {
                let is_str_tag = tag.as_ref().is_some_and(|t| t.suffix == "str");
                let value = if style == ScalarStyle::Plain && !is_str_tag {
                    resolve_plain(&text)
                } else {
                    Yaml::Str(Cow::into_owned(text))
                };
                (Node { pos, value }, anchor)
            }
            Event::SequenceStart(anchor, _) => {
                let mut items = Vec::new();
                loop {
                    let (ev, span) = self.next()?;
                    if matches!(ev, Event::SequenceEnd) {
                        break;
                    }
                    items.push(self.node(ev, span)?);
                }
                // A large file holds its whole tree until parsed: no slack
                // past the last item (a node's `needs: [a]` would keep room for four).
                items.shrink_to_fit();
                (
                    Node {
                        pos,
                        value: Yaml::Seq(items),
                    },
                    anchor,
                )
            }
            Event::MappingStart(anchor, _) => {
                let mut entries = Vec::new();
                loop {
                    let (ev, span) = self.next()?;
                    if matches!(ev, Event::MappingEnd) {
                        break;
                    }
                    let key = self.node(ev, span)?;
                    let (ev, span) = self.next()?;
                    let value = self.node(ev, span)?;
                    entries.push((key, value));
                }
                entries.shrink_to_fit();
                (
                    Node {
                        pos,
                        value: Yaml::Map(entries),
                    },
                    anchor,
                )
            }
            Event::Alias(id) => {
                let Some(target) = self.anchors.get(&id) else {
                    return Err(SyntaxError {
                        pos,
                        message: "alias to an unknown anchor".into(),
                    });
                };
                let mut n = target.clone();
                n.pos = pos;
                return Ok(n);
            }
            other => {
                return Err(SyntaxError {
                    pos,
                    message: format!("unexpected YAML event {other:?}"),
                })
            }
        };
        if anchor != 0 {
            self.anchors.insert(anchor, node.clone());
        }
        Ok(node)
    }
}

/// YAML 1.2 core schema resolution of an unquoted scalar.
fn resolve_plain(s: &str) -> Yaml {
    match s {
        "" | "~" | "null" | "Null" | "NULL" => return Yaml::Null,
        "true" | "True" | "TRUE" => return Yaml::Bool(true),
        "false" | "False" | "FALSE" => return Yaml::Bool(false),
        ".inf" | ".Inf" | ".INF" | "+.inf" | "+.Inf" | "+.INF" => {
            return Yaml::Float(f64::INFINITY)
        }
        "-.inf" | "-.Inf" | "-.INF" => return Yaml::Float(f64::NEG_INFINITY),
        ".nan" | ".NaN" | ".NAN" => return Yaml::Float(f64::NAN),
        _ => {}
    }
    let digits = s.strip_prefix(['-', '+']).unwrap_or(s);
    if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
        if let Ok(i) = s.parse::<i64>() {
            return Yaml::Int(i);
        }
    }
    if let Some(hex) = s.strip_prefix("0x") {
        if let Ok(i) = i64::from_str_radix(hex, 16) {
            return Yaml::Int(i);
        }
    }
    if let Some(oct) = s.strip_prefix("0o") {
        if let Ok(i) = i64::from_str_radix(oct, 8) {
            return Yaml::Int(i);
        }
    }
    let looks_numeric = s
        .bytes()
        .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'-' | b'+'))
        && s.bytes().any(|b| b.is_ascii_digit());
    if looks_numeric {
        if let Ok(f) = s.parse::<f64>() {
            return Yaml::Float(f);
        }
    }
    Yaml::Str(s.to_string())
}
