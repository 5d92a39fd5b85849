//! `switch`: the label its expression chooses is its output. The driver
//! resolves switch nodes in the round they start in, logging
//! `BranchResolved`, without this runner; the runner is what a switch is
//! when it is run as an attempt.

use async_trait::async_trait;
use cairn_workflow::{NodeKind, NodeSpec};
use serde_json::Value;

use crate::node::{NodeCtx, NodeError, NodeRunner};

/// `switch`: the chosen label.
pub(crate) struct SwitchNode;

#[async_trait]
impl NodeRunner for SwitchNode {
    async fn run(&self, spec: &NodeSpec, ctx: &NodeCtx) -> Result<Value, NodeError> {
        let NodeKind::Switch(sw) = &spec.kind else {
            unreachable!("runner_for maps only switch nodes here")
        };
        let v = ctx
            .templates
            .eval(&sw.on, &ctx.vars)
            .map_err(|e| NodeError::fatal("template", format!("switch.on: {e}")))?;
        choose(sw, &v).map(Value::from)
    }
}

/// The label `v` chooses, or the node's error when none does.
pub(crate) fn choose(sw: &cairn_workflow::SwitchSpec, v: &Value) -> Result<String, NodeError> {
    sw.choose(v).map(str::to_string).ok_or_else(|| {
        let shown = match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        NodeError::fatal(
            "switch",
            format!(
                "no case for `{shown}` (cases: {}) and no `default`",
                sw.labels().join(", ")
            ),
        )
    })
}
