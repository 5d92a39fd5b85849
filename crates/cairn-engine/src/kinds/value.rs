//! `value`: its rendered value is its output. The driver finishes value
//! nodes in the round they start in without this runner (they take no
//! slot); the runner is what a value node is when it is run as an attempt.

use async_trait::async_trait;
use cairn_workflow::{NodeKind, NodeSpec};
use serde_json::Value;

use crate::node::{NodeCtx, NodeError, NodeRunner};

/// `value`: its rendered value is its output.
pub(crate) struct ValueNode;

#[async_trait]
impl NodeRunner for ValueNode {
    async fn run(&self, spec: &NodeSpec, ctx: &NodeCtx) -> Result<Value, NodeError> {
        let NodeKind::Value(v) = &spec.kind else {
            unreachable!("runner_for maps only value nodes here")
        };
        ctx.render_value(&v.value())
    }
}
