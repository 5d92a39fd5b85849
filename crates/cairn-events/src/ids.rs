//! Identifiers with one validation rule each, for every layer.
//!
//! A run id is also a file name (the NDJSON mirror's folder, the run's lock)
//! and part of a URL path, so every part of Cairn accepts exactly the same
//! ones: the store, the engine, the CLI and the server all call
//! [`RunId::parse`]. A node path names a node instance in every event of a
//! large run and in every structure the engine keeps about it, so it is
//! shared text ([`NodePath`]) that clones without copying; text that comes
//! from outside (a command, a URL) goes through [`NodePath::parse`].

use std::borrow::Borrow;
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The longest run id.
pub const MAX_RUN_ID_LEN: usize = 128;

/// A run's id: 1 to 128 ASCII letters, digits, `-`, `_`, `.` or `:`, not
/// starting with `.` (so it can never be `.` or `..` as a file name).
///
/// Every event, row and request of a run carries its id, so the text is
/// shared (`Arc<str>`): a clone copies no bytes. The only way to make one is
/// [`RunId::parse`] (or its `FromStr`/`TryFrom`/serde forms, which call it),
/// so a `RunId` in hand is always a valid one. It serializes as the plain
/// string, compares and hashes as `str`, and maps keyed by it are looked up
/// with a plain `&str`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RunId(Arc<str>);

/// Why a text is not a run id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("run id `{0}` is not allowed: use 1 to 128 letters, digits, `-`, `_`, `.` or `:`, not starting with `.`")]
pub struct InvalidRunId(pub String);

impl RunId {
    /// Checks a text against the rule.
    pub fn parse(text: &str) -> Result<RunId, InvalidRunId> {
        let ok = !text.is_empty()
            && text.len() <= MAX_RUN_ID_LEN
            && !text.starts_with('.')
            && text
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'));
        if ok {
            Ok(RunId(Arc::from(text)))
        } else {
            Err(InvalidRunId(
                text.chars().take(MAX_RUN_ID_LEN + 8).collect(),
            ))
        }
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(&self.0)
    }
}

impl AsRef<str> for RunId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl Deref for RunId {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for RunId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl std::str::FromStr for RunId {
    type Err = InvalidRunId;
    fn from_str(text: &str) -> Result<Self, InvalidRunId> {
        RunId::parse(text)
    }
}

impl TryFrom<&str> for RunId {
    type Error = InvalidRunId;
    fn try_from(text: &str) -> Result<Self, InvalidRunId> {
        RunId::parse(text)
    }
}

impl TryFrom<String> for RunId {
    type Error = InvalidRunId;
    fn try_from(text: String) -> Result<Self, InvalidRunId> {
        RunId::parse(&text)
    }
}

impl TryFrom<&String> for RunId {
    type Error = InvalidRunId;
    fn try_from(text: &String) -> Result<Self, InvalidRunId> {
        RunId::parse(text)
    }
}

impl From<RunId> for String {
    fn from(id: RunId) -> String {
        id.0.to_string()
    }
}

impl From<&RunId> for String {
    fn from(id: &RunId) -> String {
        id.0.to_string()
    }
}

impl PartialEq<str> for RunId {
    fn eq(&self, other: &str) -> bool {
        &*self.0 == other
    }
}

impl PartialEq<&str> for RunId {
    fn eq(&self, other: &&str) -> bool {
        &*self.0 == *other
    }
}

impl PartialEq<String> for RunId {
    fn eq(&self, other: &String) -> bool {
        *self.0 == **other
    }
}

impl PartialEq<RunId> for str {
    fn eq(&self, other: &RunId) -> bool {
        self == &*other.0
    }
}

impl PartialEq<RunId> for &str {
    fn eq(&self, other: &RunId) -> bool {
        *self == &*other.0
    }
}

impl PartialEq<RunId> for String {
    fn eq(&self, other: &RunId) -> bool {
        **self == *other.0
    }
}

impl Serialize for RunId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

/// A run id read from JSON (an event, a request's body) is checked like any
/// other: text that breaks the rule fails the whole value.
impl<'de> Deserialize<'de> for RunId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        RunId::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// The longest node path accepted from outside ([`NodePath::parse`]).
pub const MAX_NODE_PATH_LEN: usize = 16 * 1024;

/// A node instance's path, the `nodeId` of events: the node's id, prefixed
/// inside groups by its group's path (`review.fix`), a `for_each` element
/// (`fan[3].fetch`) or a loop's outer pass (`review.inner@2.fix`).
///
/// The text is shared (`Arc<str>`): the plan, the run state, the template
/// context and every event of the instance hold the same allocation. It
/// compares, hashes and borrows as `str`, so maps keyed by paths are looked
/// up with a plain `&str`.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodePath(Arc<str>);

/// Why a text is not a node path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("node path `{0}` is not allowed: use node ids (letters, digits, `_`, `-`) joined by `.`, each optionally followed by `[n]` or `@n`")]
pub struct InvalidNodePath(pub String);

impl NodePath {
    /// Checks a text from outside (a command, a URL) against the rule.
    ///
    /// ```
    /// use cairn_events::NodePath;
    /// assert!(NodePath::parse("review.inner@2.fix").is_ok());
    /// assert!(NodePath::parse("fan[3].fetch").is_ok());
    /// assert!(NodePath::parse("../etc").is_err());
    /// ```
    pub fn parse(text: &str) -> Result<NodePath, InvalidNodePath> {
        if text.len() <= MAX_NODE_PATH_LEN && is_node_path(text) {
            Ok(NodePath(Arc::from(text)))
        } else {
            Err(InvalidNodePath(text.chars().take(200).collect()))
        }
    }

    /// The path as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The shared text itself, for maps outside this crate that key by
    /// `Arc<str>` (the templates' `nodes`): no copy.
    pub fn shared_text(&self) -> Arc<str> {
        self.0.clone()
    }
}

/// Segments joined by `.`; each a node id, then any number of `[digits]`
/// and `@digits` suffixes.
fn is_node_path(text: &str) -> bool {
    !text.is_empty() && text.split('.').all(is_segment)
}

fn is_segment(seg: &str) -> bool {
    let b = seg.as_bytes();
    let id_len = b
        .iter()
        .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-'))
        .count();
    if id_len == 0 {
        return false;
    }
    let mut i = id_len;
    while i < b.len() {
        let digits = |from: usize| b[from..].iter().take_while(|c| c.is_ascii_digit()).count();
        match b[i] {
            b'[' => {
                let n = digits(i + 1);
                if n == 0 || b.get(i + 1 + n) != Some(&b']') {
                    return false;
                }
                i += n + 2;
            }
            b'@' => {
                let n = digits(i + 1);
                if n == 0 {
                    return false;
                }
                i += n + 1;
            }
            _ => return false,
        }
    }
    true
}

/// Paths the engine builds from a loaded workflow's ids, and paths read
/// back from the engine's own log, take no check: the ids were checked when
/// the workflow was loaded. Text from anywhere else goes through
/// [`NodePath::parse`].
impl From<String> for NodePath {
    fn from(s: String) -> Self {
        NodePath(Arc::from(s))
    }
}

impl From<&str> for NodePath {
    fn from(s: &str) -> Self {
        NodePath(Arc::from(s))
    }
}

impl From<&String> for NodePath {
    fn from(s: &String) -> Self {
        NodePath::from(s.as_str())
    }
}

impl From<&NodePath> for NodePath {
    fn from(p: &NodePath) -> Self {
        p.clone()
    }
}

impl Deref for NodePath {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for NodePath {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for NodePath {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl PartialEq<str> for NodePath {
    fn eq(&self, other: &str) -> bool {
        &*self.0 == other
    }
}

impl PartialEq<&str> for NodePath {
    fn eq(&self, other: &&str) -> bool {
        &*self.0 == *other
    }
}

impl PartialEq<String> for NodePath {
    fn eq(&self, other: &String) -> bool {
        *self.0 == **other
    }
}

impl PartialEq<NodePath> for str {
    fn eq(&self, other: &NodePath) -> bool {
        self == &*other.0
    }
}

impl PartialEq<NodePath> for &str {
    fn eq(&self, other: &NodePath) -> bool {
        *self == &*other.0
    }
}

impl PartialEq<NodePath> for String {
    fn eq(&self, other: &NodePath) -> bool {
        **self == *other.0
    }
}

impl fmt::Display for NodePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for NodePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl Serialize for NodePath {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

/// Events read back from a store carry paths the engine wrote; they are
/// taken as they are, like any other field of a stored event.
impl<'de> Deserialize<'de> for NodePath {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Ok(NodePath(Arc::from(&*s)))
    }
}

/// An event's place in its run's log: 1, 2, 3, … with no gaps.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Seq(pub u64);

impl Seq {
    /// The seq of a log's first event.
    pub const FIRST: Seq = Seq(1);

    /// The number.
    pub fn get(self) -> u64 {
        self.0
    }

    /// The seq after this one.
    pub fn next(self) -> Seq {
        Seq(self.0 + 1)
    }
}

impl fmt::Display for Seq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// A seq compares with a plain number, as the contract writes them.
impl PartialEq<u64> for Seq {
    fn eq(&self, other: &u64) -> bool {
        self.0 == *other
    }
}

impl PartialEq<Seq> for u64 {
    fn eq(&self, other: &Seq) -> bool {
        *self == other.0
    }
}

impl From<u64> for Seq {
    fn from(n: u64) -> Self {
        Seq(n)
    }
}

impl From<Seq> for u64 {
    fn from(s: Seq) -> Self {
        s.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_node_path_rule() {
        for ok in [
            "a",
            "build-1",
            "a_b.c",
            "fan[3].fetch",
            "review.inner@2.fix",
            "x[1]@2.y",
            "a.b.c.d",
        ] {
            assert_eq!(NodePath::parse(ok).unwrap().as_str(), ok);
        }
        let long = "x".repeat(MAX_NODE_PATH_LEN + 1);
        for bad in [
            "", ".", "a.", ".a", "a..b", "../etc", "a/b", "a b", "a[", "a[]", "a[x]", "a@", "a@x",
            "[1]", "é", "a\0", &long,
        ] {
            assert!(NodePath::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_node_path_is_looked_up_as_str() {
        let mut m = std::collections::HashMap::new();
        m.insert(NodePath::from("a.b"), 1);
        assert_eq!(m.get("a.b"), Some(&1));
        assert_eq!(
            serde_json::to_string(&NodePath::from("a.b")).unwrap(),
            "\"a.b\""
        );
        let back: NodePath = serde_json::from_str("\"a.b\"").unwrap();
        assert_eq!(back, "a.b");
    }

    #[test]
    fn the_rule() {
        for ok in ["a", "run-1", "A_b.c:d", &"x".repeat(128)] {
            assert_eq!(RunId::parse(ok).unwrap().as_str(), ok);
        }
        for bad in [
            "",
            ".",
            "..",
            ".hidden",
            "a/b",
            "../x",
            "sp ace",
            "é",
            "a\0b",
            &"x".repeat(129),
        ] {
            assert!(RunId::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_run_id_is_plain_json_text_and_checked_when_read() {
        let id = RunId::parse("run-1").unwrap();
        assert_eq!(serde_json::to_string(&id).unwrap(), "\"run-1\"");
        let back: RunId = serde_json::from_str("\"run-1\"").unwrap();
        assert_eq!(back, id);
        assert!(serde_json::from_str::<RunId>("\"../x\"").is_err());
        let mut m = std::collections::HashMap::new();
        m.insert(id.clone(), 1);
        assert_eq!(m.get("run-1"), Some(&1));
    }
}
