//! A node's output as the run state keeps it: compact when small.
//!
//! A run keeps the output of every node instance that ended, for templates
//! (`nodes.<id>.output`), for the summary and for the API. As
//! `serde_json::Value`s, small outputs cost several times their text: an
//! object of one field is a hash table, an entry list and a key, about 200
//! bytes before its value. Worse, a group's output holds its members'
//! outputs, so loops nested twenty deep hold twenty copies of the innermost
//! output, each a tree of small objects. Kept as JSON text, the same outputs
//! cost their length. Large outputs are shared, and parsed at most once:
//! templates may read one element of a large list from every instance of a
//! `for_each`, and parsing the whole list each time would make that
//! quadratic. A large output this process put together as text (a
//! `for_each`'s list) stays text until something reads it: a list of
//! 100,000 small objects is about 1 MB as text, 18 MB as a tree.

use std::fmt;
use std::sync::{Arc, OnceLock};

use serde::{Serialize, Serializer};
use serde_json::value::RawValue;
use serde_json::Value;

/// Outputs whose JSON text is at most this long are kept as text. Every
/// template read of a kept text parses it again, so this bounds what one
/// read costs (a few microseconds) where a template reads an element of
/// another node's output from each of many instances.
pub const OUTPUT_TEXT_MAX: usize = 4 * 1024;

/// A node instance's output: JSON text up to [`OUTPUT_TEXT_MAX`], a shared
/// parsed value beyond. Serializes as the JSON value either way.
#[derive(Clone)]
pub struct Output(Repr);

#[derive(Clone)]
enum Repr {
    Text(Arc<RawValue>),
    Parsed(Arc<Value>),
    Large(Arc<Large>),
}

/// A large output kept as text, with its tree once something asked for it.
struct Large {
    text: Box<RawValue>,
    parsed: OnceLock<Arc<Value>>,
}

impl Output {
    /// The output `value`, shared as is when large.
    pub fn new(value: &Arc<Value>) -> Output {
        if let Ok(raw) = serde_json::value::to_raw_value(&**value) {
            if raw.get().len() <= OUTPUT_TEXT_MAX {
                return Output(Repr::Text(Arc::from(raw)));
            }
        }
        Output(Repr::Parsed(value.clone()))
    }

    /// An output from JSON text this process wrote (a group's output put
    /// together from its members' texts): kept as text when small, parsed
    /// otherwise. `None` when the text is not one JSON value.
    pub fn from_json_text(text: String) -> Option<Output> {
        let mut de = serde_json::Deserializer::from_str(&text);
        de.disable_recursion_limit();
        let raw: Box<RawValue> = serde::Deserialize::deserialize(&mut de).ok()?;
        de.end().ok()?;
        if raw.get().len() <= OUTPUT_TEXT_MAX {
            return Some(Output(Repr::Text(Arc::from(raw))));
        }
        Some(Output(Repr::Large(Arc::new(Large {
            text: raw,
            parsed: OnceLock::new(),
        }))))
    }

    /// The JSON text, when kept as text.
    pub fn as_text(&self) -> Option<&str> {
        match &self.0 {
            Repr::Text(raw) => Some(raw.get()),
            Repr::Large(l) => Some(l.text.get()),
            Repr::Parsed(_) => None,
        }
    }

    /// The value: shared when kept parsed, parsed anew from a small text,
    /// parsed once and shared from then on for a large one.
    pub fn value(&self) -> Arc<Value> {
        match &self.0 {
            Repr::Parsed(v) => v.clone(),
            Repr::Text(raw) => Arc::new(parse(raw.get())),
            Repr::Large(l) => l
                .parsed
                .get_or_init(|| Arc::new(parse(l.text.get())))
                .clone(),
        }
    }

    /// The value as an owned `Value`.
    pub fn to_value(&self) -> Value {
        match &self.0 {
            Repr::Parsed(v) => (**v).clone(),
            Repr::Text(raw) => parse(raw.get()),
            Repr::Large(_) => (*self.value()).clone(),
        }
    }
}

/// Text this module wrote from a value, so it parses; its depth is the
/// value's, which was held in memory already, hence no recursion limit.
fn parse(text: &str) -> Value {
    let mut de = serde_json::Deserializer::from_str(text);
    de.disable_recursion_limit();
    serde::Deserialize::deserialize(&mut de).unwrap_or(Value::Null)
}

impl From<Value> for Output {
    fn from(value: Value) -> Output {
        Output::new(&Arc::new(value))
    }
}

impl<'de> serde::Deserialize<'de> for Output {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Output, D::Error> {
        <Value as serde::Deserialize>::deserialize(d).map(Output::from)
    }
}

impl Serialize for Output {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match &self.0 {
            Repr::Text(raw) => raw.serialize(s),
            Repr::Large(l) => l.text.serialize(s),
            Repr::Parsed(v) => v.serialize(s),
        }
    }
}

impl PartialEq for Output {
    fn eq(&self, other: &Output) -> bool {
        match (self.as_text(), other.as_text()) {
            (Some(a), Some(b)) if a == b => true,
            _ => *self.value() == *other.value(),
        }
    }
}

impl PartialEq<Value> for Output {
    fn eq(&self, other: &Value) -> bool {
        *self.value() == *other
    }
}

impl fmt::Debug for Output {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.value(), f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn small_outputs_are_text_and_read_back_equal() {
        let v = json!({"b": [1, 2, {"c": null}], "a": "x\"y"});
        let o = Output::from(v.clone());
        assert!(matches!(o.0, Repr::Text(_)));
        assert_eq!(*o.value(), v);
        assert_eq!(o.to_value(), v);
        // Key order is kept, and it serializes as the value itself.
        assert_eq!(serde_json::to_string(&o).unwrap(), v.to_string());
        assert_eq!(o, v);
    }

    #[test]
    fn large_outputs_stay_parsed_and_shared() {
        let v = Arc::new(json!(vec!["0123456789"; OUTPUT_TEXT_MAX / 10]));
        let o = Output::new(&v);
        assert!(matches!(o.0, Repr::Parsed(_)));
        assert!(Arc::ptr_eq(&o.value(), &v));
        assert_eq!(serde_json::to_string(&o).unwrap(), v.to_string());
    }

    #[test]
    fn large_texts_stay_text_until_read_then_parse_once() {
        let v = json!(vec![json!({"v": "0123456789"}); OUTPUT_TEXT_MAX / 10]);
        let o = Output::from_json_text(v.to_string()).unwrap();
        assert!(matches!(&o.0, Repr::Large(l) if l.parsed.get().is_none()));
        assert_eq!(o.as_text(), Some(v.to_string().as_str()));
        assert_eq!(serde_json::to_string(&o).unwrap(), v.to_string());
        let shared = o.clone();
        assert_eq!(*o.value(), v);
        // Parsed once, for every holder of the output.
        assert!(Arc::ptr_eq(&o.value(), &shared.value()));
        assert_eq!(o, Output::from(v.clone()));
        assert!(Output::from_json_text("[1,".into()).is_none());
        assert!(Output::from_json_text("[1] 2".into()).is_none());
    }

    #[test]
    fn deep_outputs_read_back() {
        let mut v = json!(1);
        for _ in 0..400 {
            v = json!({ "x": v });
        }
        let o = Output::from(v.clone());
        assert_eq!(o.to_value(), v);
        let text = o.as_text().expect("small: kept as text").to_string();
        assert_eq!(Output::from_json_text(text).unwrap(), o);
    }
}
