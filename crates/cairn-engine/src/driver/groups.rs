//! Groups (`loop`, `for_each`): entering one computes its shape (the pass,
//! the list), and a group ends a pass when its last child ends.

use super::*;
use cairn_events::Output;
use cairn_workflow::Group;

impl Driver {
    /// Marks a group instance started and computes its shape (pass, list).
    pub(super) fn enter_group(&mut self, key: &Key, resuming: bool) -> Result<(), NodeError> {
        let inst = self.sched.plan().insts[key].clone();
        match inst.spec.kind.group() {
            Some(Group::Loop { .. }) => {
                let pass = if resuming {
                    let prefix = inst.child_prefix();
                    self.state
                        .nodes
                        .iter()
                        .filter(|n| {
                            n.node_id
                                .strip_prefix(&prefix)
                                .is_some_and(|rest| !rest.contains(['.', '[']))
                        })
                        .map(|n| n.iteration)
                        .max()
                        .unwrap_or(0)
                } else {
                    0
                };
                self.sched.enter_loop(key, pass);
            }
            Some(Group::ForEach { list, .. }) => {
                let ctx = self.context_for(&inst, inst.key.1);
                let value = self
                    .templates
                    .eval_in(list, &ctx)
                    .map_err(|e| NodeError::fatal("template", format!("for_each: {e}")))?;
                let items = match value {
                    Value::Array(a) => a,
                    Value::Null => Vec::new(),
                    other => {
                        return Err(NodeError::fatal(
                            "for_each",
                            format!(
                                "for_each `{list}` must yield a list, got {}",
                                json_type(&other)
                            ),
                        ))
                    }
                };
                self.sched.enter_for_each(key, items);
            }
            None => return Err(NodeError::fatal("internal", "not a group")),
        }
        Ok(())
    }

    pub(super) fn finish_group_pass(&mut self, key: &Key) {
        let inst = self.sched.plan().insts[key].clone();
        let children = self.sched.tree().children(&inst.spec);
        match inst.spec.kind.group() {
            Some(Group::Loop {
                until,
                max_iterations,
                ..
            }) => {
                let pass = self.sched.loop_pass(key);
                let prefix = inst.child_prefix();
                let members: Vec<(&str, Option<Output>)> = children
                    .iter()
                    .map(|c| {
                        let path = format!("{prefix}{}", c.id);
                        let o = self.state.node(&path, pass).and_then(|n| n.output.clone());
                        (c.id.as_str(), o)
                    })
                    .collect();
                let out = members_object(&members);
                let holds = {
                    let ctx = self.context_for(&inst, pass);
                    self.templates.eval_bool_in(until, &ctx)
                };
                match holds {
                    Ok(done) if done || pass + 1 >= max_iterations => {
                        if !done {
                            self.emit(
                                Scope::run(),
                                EventKind::Diagnostic {
                                    level: Level::Warn,
                                    source: "loop".into(),
                                    message: format!(
                                        "loop `{}` stopped after {max_iterations} passes without `{until}` holding",
                                        key.0
                                    ),
                                },
                            );
                        }
                        self.finish_group(key, out);
                    }
                    Ok(_) => {
                        self.sched.next_pass(key);
                        self.rerender_group(key);
                        if self.sched.remaining(key) == 0 {
                            self.finish_group_pass(key);
                        }
                    }
                    Err(e) => {
                        let attempt = self.state.node(&key.0, key.1).map_or(1, |n| n.attempt);
                        let err = NodeError::fatal("template", format!("until: {e}"));
                        self.fail_attempt(key, &inst, attempt, err);
                    }
                }
            }
            Some(Group::ForEach { .. }) => {
                // Put together as text from the members' texts, as a loop's
                // output is: a list of 100,000 small objects is about 1 MB
                // of text and 18 MB as a tree, which is made only if
                // something reads the list.
                let len = self.sched.list_len(key);
                let mut text = String::from("[");
                let mut members: Vec<(&str, Option<Output>)> = Vec::with_capacity(children.len());
                for i in 0..len {
                    members.clear();
                    for c in children {
                        let path = format!("{}[{i}].{}", key.0, c.id);
                        let o = self.state.node(&path, key.1).and_then(|n| n.output.clone());
                        members.push((c.id.as_str(), o));
                    }
                    if i > 0 {
                        text.push(',');
                    }
                    write_members(&mut text, &members);
                }
                text.push(']');
                let out = Output::from_json_text(text).unwrap_or_else(|| Value::Null.into());
                self.finish_group(key, out);
            }
            None => {}
        }
    }

    pub(super) fn finish_group(&mut self, key: &Key, output: Output) {
        let n = self.state.node(&key.0, key.1).cloned();
        let attempt = n.as_ref().map_or(1, |n| n.attempt);
        let started = n
            .as_ref()
            .and_then(|n| n.attempts.last().map(|a| a.started_ms));
        let duration_ms = started.map_or(0, |s| (crate::node::now_ms() - s).max(0) as u64);
        let scope = self.node_scope(key).with_attempt(attempt);
        self.emit(
            scope,
            EventKind::NodeFinished {
                duration_ms,
                output: Some(output),
                cached: None,
                snapshot: None,
            },
        );
        self.node_done(key);
    }
}

/// A group's output object, `{member id: its output}`, put together from
/// the members' JSON texts: a group's output holds its members' outputs, so
/// loops nested in loops would otherwise parse and copy every level again.
fn members_object(members: &[(&str, Option<Output>)]) -> Output {
    let mut text = String::new();
    write_members(&mut text, members);
    Output::from_json_text(text).unwrap_or_else(|| Value::Null.into())
}

/// Writes `{member id: its output}` as JSON (`null` for a member without
/// one).
fn write_members(text: &mut String, members: &[(&str, Option<Output>)]) {
    text.push('{');
    for (i, (id, out)) in members.iter().enumerate() {
        if i > 0 {
            text.push(',');
        }
        text.push_str(&serde_json::to_string(id).unwrap_or_default());
        text.push(':');
        match out {
            Some(o) => match o.as_text() {
                Some(t) => text.push_str(t),
                None => text.push_str(&serde_json::to_string(&*o.value()).unwrap_or_default()),
            },
            None => text.push_str("null"),
        }
    }
    text.push('}');
}

pub(super) fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}
