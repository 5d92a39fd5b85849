//! Limits on what a workflow file, a run's input and a node's output may be.
//!
//! Workflow files and inputs come from people and programs Cairn does not control, and what
//! is accepted is written to the run's log, which must stay readable for good. So sizes and
//! nesting are bounded where they enter: a file is refused before it is read whole, a YAML
//! alias bomb before it expands, and a value too deep for the log's JSON reader (whose
//! recursion limit is 128, envelope included) before it is written.

use std::fmt;

/// The largest workflow file read, in bytes (64 MiB). A larger file is refused before it is
/// read; a 100,000-node workflow is about 6 MB.
pub const MAX_FILE_BYTES: u64 = 64 << 20;

/// The deepest YAML nesting of a workflow file (mappings and lists in each other). Enough for
/// [`MAX_GROUP_DEPTH`] groups (three levels each) with values of [`MAX_VALUE_DEPTH`] inside.
pub const MAX_YAML_DEPTH: usize = 1024;

/// The most groups (`loop`, `for_each`) nested in each other. A group's output holds its
/// members' (one level per `loop`, two per `for_each`), so with values of
/// [`MAX_VALUE_DEPTH`] inside, an event of such a run nests at most about 470 deep: within
/// what the log reads back (`cairn_events::MAX_EVENT_DEPTH`, 512).
pub const MAX_GROUP_DEPTH: usize = 200;

/// The deepest nesting of lists and objects in a value: a `value` node, a tool's `args`, the
/// input schema, a run's input, a node's output. `1` and `"a"` are 0 deep, `[1]` 1, `{"a":
/// [1]}` 2. Well below the 128 levels that the log's JSON reader accepts, so that an event
/// carrying such a value (and the views that nest it further) can always be read back.
pub const MAX_VALUE_DEPTH: usize = 64;

/// The YAML nodes that aliases may copy in all, while loading one file: this many, or as
/// many nodes as the file has itself (read so far) when that is more.
pub const MAX_ALIAS_NODES: usize = 100_000;

/// How deep lists and objects nest in `v` (0 for a scalar). Walks without recursing, so any
/// depth is safe to measure.
pub fn json_depth(v: &serde_json::Value) -> usize {
    let mut deepest = 0;
    let mut stack: Vec<(&serde_json::Value, usize)> = vec![(v, 0)];
    while let Some((v, above)) = stack.pop() {
        let children: Box<dyn Iterator<Item = &serde_json::Value>> = match v {
            serde_json::Value::Array(items) => Box::new(items.iter()),
            serde_json::Value::Object(map) => Box::new(map.values()),
            _ => continue,
        };
        let level = above + 1;
        deepest = deepest.max(level);
        stack.extend(children.map(|c| (c, level)));
    }
    deepest
}

/// A value nested deeper than [`MAX_VALUE_DEPTH`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct DepthError {
    /// JSON pointer to the first list or object past the limit (empty string for the root).
    pub pointer: String,
    /// How deep the value nests.
    pub depth: usize,
}

impl fmt::Display for DepthError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let at = if self.pointer.is_empty() {
            "/"
        } else {
            &self.pointer
        };
        write!(
            f,
            "nested {} levels deep, more than the {MAX_VALUE_DEPTH} allowed (at {at})",
            self.depth
        )
    }
}

/// Checks that `v` nests at most [`MAX_VALUE_DEPTH`] lists and objects deep.
pub fn check_depth(v: &serde_json::Value) -> Result<(), DepthError> {
    let depth = json_depth(v);
    if depth <= MAX_VALUE_DEPTH {
        return Ok(());
    }
    Err(DepthError {
        pointer: pointer_past(v, MAX_VALUE_DEPTH),
        depth,
    })
}

/// The pointer to the first list or object (in document order) nested `limit + 1` deep.
fn pointer_past(v: &serde_json::Value, limit: usize) -> String {
    let mut stack: Vec<(&serde_json::Value, usize, String)> = vec![(v, 0, String::new())];
    while let Some((v, above, ptr)) = stack.pop() {
        let level = above + 1;
        let children: Vec<(&serde_json::Value, String)> = match v {
            serde_json::Value::Array(items) => items
                .iter()
                .enumerate()
                .map(|(i, c)| (c, format!("{ptr}/{i}")))
                .collect(),
            serde_json::Value::Object(map) => map
                .iter()
                .map(|(k, c)| {
                    let k = k.replace('~', "~0").replace('/', "~1");
                    (c, format!("{ptr}/{k}"))
                })
                .collect(),
            _ => continue,
        };
        if level > limit {
            return ptr;
        }
        // Reversed, so the first child is looked at first.
        for (c, p) in children.into_iter().rev() {
            if c.is_array() || c.is_object() {
                stack.push((c, level, p));
            }
        }
    }
    String::new()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn nested(levels: usize) -> serde_json::Value {
        let mut v = json!(1);
        for _ in 0..levels {
            v = json!({ "a": [v] });
        }
        v
    }

    #[test]
    fn depth_counts_lists_and_objects() {
        assert_eq!(json_depth(&json!(1)), 0);
        assert_eq!(json_depth(&json!([])), 1);
        assert_eq!(json_depth(&json!({"a": [1]})), 2);
        assert_eq!(json_depth(&json!([1, [2, [3]], {}])), 3);
        assert_eq!(json_depth(&nested(1000)), 2000);
    }

    #[test]
    fn check_depth_points_past_the_limit() {
        let mut v = json!(1);
        for _ in 0..MAX_VALUE_DEPTH {
            v = json!([v]);
        }
        check_depth(&v).unwrap();
        let deep = json!({"x": 1, "y/z": [v]});
        let e = check_depth(&deep).unwrap_err();
        assert_eq!(e.depth, MAX_VALUE_DEPTH + 2);
        assert_eq!(
            e.pointer,
            format!("/y~1z{}", "/0".repeat(MAX_VALUE_DEPTH - 1))
        );
        assert!(e.to_string().contains("more than the 64 allowed"), "{e}");
    }
}
