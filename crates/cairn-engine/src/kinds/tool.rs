//! `tool`: calls one sandboxed tool with rendered arguments, as a recorded
//! call.

use async_trait::async_trait;
use cairn_workflow::{NodeKind, NodeSpec};
use serde_json::Value;

use crate::node::{NodeCtx, NodeError, NodeRunner};

/// `tool`: calls one sandboxed tool with rendered arguments.
pub(crate) struct ToolNode;

#[async_trait]
impl NodeRunner for ToolNode {
    async fn run(&self, spec: &NodeSpec, ctx: &NodeCtx) -> Result<Value, NodeError> {
        let NodeKind::Tool { tool, args } = &spec.kind else {
            unreachable!("runner_for maps only tool nodes here")
        };
        let args = ctx.render_value(args)?;
        ctx.call_tool_in(tool, args, &spec.sandbox).await
    }
}
