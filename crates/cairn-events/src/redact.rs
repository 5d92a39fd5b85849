//! Secrets kept out of what a run writes: every string inside an event is
//! searched for the run's secret values, each found replaced by `***`,
//! before the event is sequenced. The log, the NDJSON mirror, live
//! subscribers, metrics, traces and the web page all read events, so this
//! one place covers them (WORKFLOW.md, "Secrets and environment").

use std::sync::Arc;

use crate::EventKind;

/// What a secret's value becomes wherever Cairn would write it.
pub const MASK: &str = "***";

/// Values shorter than this are not searched for: a one- or two-letter
/// secret would mask that text everywhere in the log and protect nothing.
pub const MIN_SECRET_LEN: usize = 3;

/// The secret values of a run, to mask in what it writes. Cheap to clone.
#[derive(Clone, Default)]
pub struct Redactor {
    /// Longest first, so that a value containing another is masked whole.
    values: Arc<[String]>,
}

impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the values themselves.
        write!(f, "Redactor({} values)", self.values.len())
    }
}

impl Redactor {
    /// A redactor of `values` (those shorter than [`MIN_SECRET_LEN`] left
    /// out).
    pub fn new(values: impl IntoIterator<Item = String>) -> Redactor {
        let mut v: Vec<String> = values
            .into_iter()
            .filter(|s| s.len() >= MIN_SECRET_LEN)
            .collect();
        v.sort_by_key(|s| std::cmp::Reverse(s.len()));
        v.dedup();
        Redactor { values: v.into() }
    }

    /// Whether there is nothing to mask.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// `s` with every value masked, when it held one.
    pub fn text(&self, s: &str) -> Option<String> {
        let mut out: Option<String> = None;
        for v in self.values.iter() {
            let cur = out.as_deref().unwrap_or(s);
            if cur.contains(v.as_str()) {
                out = Some(cur.replace(v.as_str(), MASK));
            }
        }
        out
    }

    /// Masks every value in the strings (and object keys) of `v`; true
    /// when it changed anything.
    pub fn value(&self, v: &mut serde_json::Value) -> bool {
        use serde_json::Value as J;
        if self.is_empty() {
            return false;
        }
        match v {
            J::String(s) => match self.text(s) {
                Some(masked) => {
                    *s = masked;
                    true
                }
                None => false,
            },
            J::Array(items) => items.iter_mut().fold(false, |c, i| self.value(i) | c),
            J::Object(map) => {
                let mut changed = false;
                let keys: Vec<String> = map.keys().cloned().collect();
                for k in keys {
                    let mut item = map.remove(&k).expect("a key just listed");
                    changed |= self.value(&mut item);
                    match self.text(&k) {
                        Some(masked) => {
                            changed = true;
                            map.insert(masked, item);
                        }
                        None => {
                            map.insert(k, item);
                        }
                    }
                }
                changed
            }
            J::Null | J::Bool(_) | J::Number(_) => false,
        }
    }

    /// `kind` with every value masked in its strings.
    pub fn event(&self, kind: EventKind) -> EventKind {
        if self.is_empty() {
            return kind;
        }
        let Ok(mut v) = serde_json::to_value(&kind) else {
            return kind;
        };
        if !self.value(&mut v) {
            return kind;
        }
        // The masked JSON has the same shape: only strings changed.
        serde_json::from_value(v).unwrap_or(kind)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorInfo;
    use serde_json::json;

    #[test]
    fn values_are_masked_in_strings_keys_and_events() {
        let r = Redactor::new(["s3cret-token".to_string(), "ab".into(), "s3cret".into()]);
        assert_eq!(
            r.text("x s3cret-token y s3cret"),
            Some("x *** y ***".into())
        );
        assert_eq!(r.text("ab is too short to mask"), None);
        let mut v = json!({"s3cret": ["a s3cret-token", 1, null], "k": {"deep": "s3cret"}});
        assert!(r.value(&mut v));
        assert_eq!(v, json!({"***": ["a ***", 1, null], "k": {"deep": "***"}}));
        let kind = EventKind::NodeFailed {
            error: ErrorInfo::new("exit", "curl: auth s3cret-token refused"),
            will_retry: false,
            snapshot: None,
        };
        match r.event(kind) {
            EventKind::NodeFailed { error, .. } => {
                assert_eq!(error.message, "curl: auth *** refused")
            }
            other => panic!("{other:?}"),
        }
        assert!(!format!("{r:?}").contains("s3cret"));
    }
}
