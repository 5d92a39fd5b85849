//! A small YAML tree that keeps the position of every node, built a node list at a time.
//!
//! Semantic errors (an unknown field, a `needs` naming a missing node) must point at a line and
//! column, which serde-based YAML loaders forget once syntax is checked. So the tree is built
//! from saphyr's positioned event stream, resolving plain scalars by the YAML 1.2 core schema.
//!
//! A large workflow is mostly its lists of nodes, so those are not kept as trees: each item of
//! the top-level `nodes`, of a `for_each`'s `nodes` and of a `loop`'s `nodes` is handed to a
//! [`Lists`] sink as soon as its subtree is complete (the sink reads it into a spec and drops
//! it), and the list stands in the tree as the [`Streamed`] result. Memory while loading is
//! then the specs read so far plus one node's subtree, not the whole file's tree.
//!
//! The builder keeps its own stack instead of recursing, and refuses input bombs before they
//! cost memory or stack: nesting deeper than [`MAX_YAML_DEPTH`], node lists nested deeper
//! than [`MAX_GROUP_DEPTH`], and aliases that expand past [`MAX_ALIAS_NODES`].

use std::cell::RefCell;
use std::collections::HashMap;

use saphyr_parser::{Event, Parser, ScalarStyle, Span};

use crate::error::Problem;
use crate::limits::{MAX_ALIAS_NODES, MAX_GROUP_DEPTH, MAX_YAML_DEPTH};
use crate::model::NodeSpec;

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
    Str(String),
    Seq(Vec<Node>),
    /// Entries in file order; keys are kept as nodes so errors can point at them.
    Map(Vec<(Node, Node)>),
    /// A list of workflow nodes, already read into specs by the [`Lists`] sink.
    Nodes(Slot),
}

/// What a [`Lists`] sink made of one list of workflow nodes: the specs of the nodes that read
/// cleanly, and the problems found in the list (kept apart until someone takes the list, so
/// that a list the parse ends up ignoring reports nothing, as before streaming).
#[derive(Debug, Clone, Default)]
pub(crate) struct Streamed {
    pub specs: Vec<NodeSpec>,
    pub problems: Vec<Problem>,
}

/// A [`Streamed`] list that the parse takes once, through a shared reference to the tree.
#[derive(Debug, Default)]
pub(crate) struct Slot(RefCell<Option<Box<Streamed>>>);

impl Slot {
    /// The list, once; empty after that.
    pub fn take(&self) -> Streamed {
        self.0.borrow_mut().take().map(|b| *b).unwrap_or_default()
    }
}

impl Clone for Slot {
    // An alias repeats the list: its copy is read again where the alias stands.
    fn clone(&self) -> Self {
        Slot(RefCell::new(self.0.borrow().clone()))
    }
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
            Yaml::Seq(_) | Yaml::Nodes(_) => "a list",
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

    /// Whether this is the string `s` (a mapping key the builder looks for).
    fn is_str(&self, s: &str) -> bool {
        matches!(&self.value, Yaml::Str(k) if k == s)
    }

    /// The value as JSON (mapping keys become strings). Callers check the depth first
    /// ([`crate::limits::MAX_VALUE_DEPTH`]), which bounds this recursion.
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::Value as J;
        match &self.value {
            Yaml::Null | Yaml::Nodes(_) => J::Null,
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

/// Why the file could not be read as YAML.
#[derive(Debug)]
pub(crate) struct YamlError {
    pub pos: Pos,
    /// The field path of the list or node where a limit was hit, when known.
    pub field: Option<String>,
    pub message: String,
    /// A limit of ours (nesting, aliases) rather than a syntax error.
    pub limit: bool,
}

impl YamlError {
    fn syntax(pos: Pos, message: impl Into<String>) -> Self {
        YamlError {
            pos,
            field: None,
            message: message.into(),
            limit: false,
        }
    }
}

/// Receives the lists of workflow nodes as the builder reads them.
pub(crate) trait Lists {
    /// A list being read.
    type Open;
    /// A list of nodes starts at `field` (`nodes`, `nodes[3].loop.nodes`, ...).
    fn open(&mut self, field: &str) -> Self::Open;
    /// Its next item, complete, at `field` (`nodes[3]`).
    fn item(&mut self, list: &mut Self::Open, field: &str, item: &Node);
    /// The list ended; `pos` is where it started.
    fn close(&mut self, list: Self::Open, pos: Pos) -> Streamed;
}

/// Parses one YAML document (an empty file gives `Null`), handing node lists to `lists`.
pub(crate) fn load<L: Lists>(source: &str, lists: &mut L) -> Result<Node, YamlError> {
    let mut b = Builder {
        parser: Parser::new_from_str(source),
        anchors: HashMap::new(),
        read: 0,
        copied: 0,
    };
    let mut doc: Option<Node> = None;
    loop {
        let (ev, span) = b.next()?;
        match ev {
            Event::StreamStart | Event::DocumentEnd | Event::Nothing => {}
            Event::StreamEnd => break,
            Event::DocumentStart(_) => {
                if doc.is_some() {
                    return Err(YamlError::syntax(
                        Pos::from_span(&span),
                        "a workflow file holds one YAML document, found a second",
                    ));
                }
                doc = Some(b.document(lists)?);
            }
            other => {
                return Err(YamlError::syntax(
                    Pos::from_span(&span),
                    format!("unexpected YAML event {other:?}"),
                ))
            }
        }
    }
    Ok(doc.unwrap_or(Node {
        pos: Pos { line: 1, col: 1 },
        value: Yaml::Null,
    }))
}

/// Where a node stands, as far as streaming cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ctx {
    /// Anything not below.
    Plain,
    /// The document's root (its `nodes` is the top-level list).
    Root,
    /// A list of workflow nodes.
    List,
    /// One workflow node (its `nodes`, and the `nodes` of a mapping that
    /// holds a group's body, `loop`, lead to lists).
    Node,
    /// A node's mapping that holds its body (`loop`; its `nodes` is the body).
    Loop,
}

/// A collection being read.
enum Body<O> {
    Seq(Vec<Node>),
    /// A list of workflow nodes handed to the sink item by item; `index` is the next item's.
    Stream {
        list: O,
        index: usize,
    },
    /// `key` is the entry's key once read, until its value is.
    Map {
        entries: Vec<(Node, Node)>,
        key: Option<Node>,
    },
}

struct Frame<O> {
    pos: Pos,
    anchor: usize,
    ctx: Ctx,
    /// The field path of a list or workflow node (empty for plain frames).
    field: String,
    /// `read + copied` when the frame started: an anchor's size is what its frame adds.
    start: usize,
    body: Body<O>,
}

impl<O> Frame<O> {
    /// The context of the next node read inside this frame.
    fn child_ctx(&self) -> Ctx {
        match &self.body {
            Body::Seq(_) => Ctx::Plain,
            Body::Stream { .. } => Ctx::Node,
            Body::Map { key: None, .. } => Ctx::Plain,
            Body::Map { key: Some(k), .. } => match self.ctx {
                Ctx::Root | Ctx::Loop if k.is_str("nodes") => Ctx::List,
                Ctx::Node if k.is_str("nodes") => Ctx::List,
                Ctx::Node if matches!(&k.value, Yaml::Str(s) if crate::kinds::body_under(s)) => {
                    Ctx::Loop
                }
                _ => Ctx::Plain,
            },
        }
    }

    /// The field path of the next node read inside this frame, for lists and workflow nodes.
    fn child_field(&self) -> String {
        match &self.body {
            Body::Stream { index, .. } => format!("{}[{index}]", self.field),
            Body::Map { key: Some(k), .. } => match &k.value {
                Yaml::Str(k) if self.field.is_empty() => k.clone(),
                Yaml::Str(k) => format!("{}.{k}", self.field),
                _ => String::new(),
            },
            _ => String::new(),
        }
    }
}

struct Builder<'a> {
    parser: Parser<'a, saphyr_parser::StrInput<'a>>,
    /// Each anchor's node and its size in nodes (what an alias to it copies).
    anchors: HashMap<usize, (Node, usize)>,
    /// Nodes read from the file so far.
    read: usize,
    /// Nodes copied by aliases so far.
    copied: usize,
}

impl<'a> Builder<'a> {
    fn next(&mut self) -> Result<(Event<'a>, Span), YamlError> {
        match self.parser.next_event() {
            Some(Ok(x)) => Ok(x),
            Some(Err(e)) => Err(YamlError::syntax(
                Pos {
                    line: e.marker().line(),
                    col: e.marker().col() + 1,
                },
                e.info().to_string(),
            )),
            None => Err(YamlError::syntax(Pos::default(), "unexpected end of YAML")),
        }
    }

    /// Reads the document's root node, and hands node lists to `lists` on the way.
    fn document<L: Lists>(&mut self, lists: &mut L) -> Result<Node, YamlError> {
        let mut stack: Vec<Frame<L::Open>> = Vec::new();
        // Lists of nodes open on the stack: the top-level list is 1, a group's body 2, ...
        let mut lists_open = 0usize;
        loop {
            let (ev, span) = self.next()?;
            let pos = Pos::from_span(&span);
            let done = match ev {
                Event::Scalar(text, style, anchor, tag) => {
                    let is_str_tag = tag.as_ref().is_some_and(|t| t.suffix == "str");
                    self.scalar(
                        text,
                        style == ScalarStyle::Plain && !is_str_tag,
                        anchor,
                        pos,
                    )
                }
                Event::Alias(id) => self.alias(id, pos, &stack)?,
                Event::SequenceStart(anchor, _) | Event::MappingStart(anchor, _) => {
                    let is_seq = matches!(ev, Event::SequenceStart(..));
                    let frame = self.open(pos, anchor, is_seq, &stack, lists, &mut lists_open)?;
                    stack.push(frame);
                    continue;
                }
                Event::SequenceEnd | Event::MappingEnd => {
                    let Some(frame) = stack.pop() else {
                        return Err(YamlError::syntax(
                            pos,
                            format!("unexpected YAML event {ev:?}"),
                        ));
                    };
                    self.close(frame, lists, &mut lists_open)
                }
                other => {
                    return Err(YamlError::syntax(
                        pos,
                        format!("unexpected YAML event {other:?}"),
                    ))
                }
            };
            let Some(parent) = stack.last_mut() else {
                return Ok(done);
            };
            match &mut parent.body {
                Body::Seq(items) => items.push(done),
                Body::Stream { list, index } => {
                    let field = format!("{}[{index}]", parent.field);
                    *index += 1;
                    lists.item(list, &field, &done);
                }
                Body::Map { entries, key } => match key.take() {
                    None => *key = Some(done),
                    Some(k) => entries.push((k, done)),
                },
            }
        }
    }

    /// A scalar: typed by its text when `plain` (unquoted, untagged), a
    /// string otherwise; remembered when anchored.
    fn scalar(
        &mut self,
        text: std::borrow::Cow<'_, str>,
        plain: bool,
        anchor: usize,
        pos: Pos,
    ) -> Node {
        self.read += 1;
        let value = if plain {
            resolve_plain(&text)
        } else {
            Yaml::Str(text.into_owned())
        };
        let node = Node { pos, value };
        if anchor != 0 {
            self.anchors.insert(anchor, (node.clone(), 1));
        }
        node
    }

    /// The frame of a list or mapping that starts at `pos`: a list of
    /// workflow nodes streams to `lists`, within the depth limits.
    fn open<L: Lists>(
        &mut self,
        pos: Pos,
        anchor: usize,
        is_seq: bool,
        stack: &[Frame<L::Open>],
        lists: &mut L,
        lists_open: &mut usize,
    ) -> Result<Frame<L::Open>, YamlError> {
        self.read += 1;
        if stack.len() >= MAX_YAML_DEPTH {
            return Err(limit_error(
                pos,
                stack,
                format!("YAML nested deeper than {MAX_YAML_DEPTH} levels"),
            ));
        }
        let ctx = stack.last().map_or(Ctx::Root, Frame::child_ctx);
        let field = if ctx == Ctx::Plain {
            String::new()
        } else {
            stack.last().map_or_else(String::new, Frame::child_field)
        };
        let body = if !is_seq {
            Body::Map {
                entries: Vec::new(),
                key: None,
            }
        } else if ctx == Ctx::List {
            if *lists_open > MAX_GROUP_DEPTH {
                return Err(YamlError {
                    pos,
                    field: Some(elide(&field)),
                    message: format!(
                        "groups (loop, for_each) nested deeper than {MAX_GROUP_DEPTH} levels"
                    ),
                    limit: true,
                });
            }
            *lists_open += 1;
            Body::Stream {
                list: lists.open(&field),
                index: 0,
            }
        } else {
            Body::Seq(Vec::new())
        };
        Ok(Frame {
            pos,
            anchor,
            ctx,
            field,
            start: self.read + self.copied - 1,
            body,
        })
    }

    /// The node a frame becomes when its list or mapping ends; remembered
    /// when anchored, with its size for the alias budget.
    fn close<L: Lists>(
        &mut self,
        frame: Frame<L::Open>,
        lists: &mut L,
        lists_open: &mut usize,
    ) -> Node {
        let value = match frame.body {
            Body::Seq(mut items) => {
                // No room past the last item: a workflow's values stay for the run.
                items.shrink_to_fit();
                Yaml::Seq(items)
            }
            Body::Stream { list, .. } => {
                *lists_open -= 1;
                Yaml::Nodes(Slot(RefCell::new(Some(Box::new(
                    lists.close(list, frame.pos),
                )))))
            }
            Body::Map { mut entries, .. } => {
                entries.shrink_to_fit();
                Yaml::Map(entries)
            }
        };
        let node = Node {
            pos: frame.pos,
            value,
        };
        if frame.anchor != 0 {
            let size = self.read + self.copied - frame.start;
            self.anchors.insert(frame.anchor, (node.clone(), size));
        }
        node
    }

    /// A copy of an anchored node, within the alias budget.
    fn alias<O>(&mut self, id: usize, pos: Pos, stack: &[Frame<O>]) -> Result<Node, YamlError> {
        let Some((target, size)) = self.anchors.get(&id) else {
            return Err(YamlError::syntax(pos, "alias to an unknown anchor"));
        };
        self.read += 1;
        self.copied += size;
        // Aliases may copy as many nodes as the file itself holds (read so far), and at
        // least MAX_ALIAS_NODES: enough for any reuse, never a billion laughs.
        if self.copied > MAX_ALIAS_NODES.max(self.read) {
            return Err(limit_error(
                pos,
                stack,
                format!(
                    "alias expansion exceeds {MAX_ALIAS_NODES} nodes (aliases may copy at most \
                     that many YAML nodes, or as many as the file holds when it holds more)"
                ),
            ));
        }
        let mut n = target.clone();
        n.pos = pos;
        Ok(n)
    }
}

/// An error for a limit, naming the innermost list or workflow node being read.
fn limit_error<O>(pos: Pos, stack: &[Frame<O>], message: String) -> YamlError {
    let field = stack
        .iter()
        .rev()
        .find(|f| !f.field.is_empty())
        .map(|f| elide(&f.field));
    YamlError {
        pos,
        field,
        message,
        limit: true,
    }
}

/// A field path short enough to read: the middle of a very deep one is left out.
fn elide(field: &str) -> String {
    const KEEP: usize = 60;
    if field.len() <= 3 * KEEP {
        return field.to_string();
    }
    let mut head = KEEP;
    while !field.is_char_boundary(head) {
        head += 1;
    }
    let mut tail = field.len() - KEEP;
    while !field.is_char_boundary(tail) {
        tail += 1;
    }
    format!("{}...{}", &field[..head], &field[tail..])
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
