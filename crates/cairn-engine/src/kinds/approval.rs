//! `approval`: waits for a person to grant or deny.

use async_trait::async_trait;
use cairn_workflow::{NodeKind, NodeSpec};
use serde_json::{json, Value};

use crate::node::{NodeCtx, NodeError, NodeRunner};

/// `approval`: waits for a person; a denial fails the node.
pub(crate) struct ApprovalNode;

#[async_trait]
impl NodeRunner for ApprovalNode {
    async fn run(&self, spec: &NodeSpec, ctx: &NodeCtx) -> Result<Value, NodeError> {
        let NodeKind::Approval(message) = &spec.kind else {
            unreachable!("runner_for maps only approval nodes here")
        };
        let message = ctx
            .templates
            .render_string(message, &ctx.vars)
            .map_err(|e| NodeError::fatal("template", e.to_string()))?;
        let d = ctx.ask_approval(Some(message)).await?;
        if d.approved {
            Ok(json!({ "approved": true, "note": d.note, "by": d.by }))
        } else {
            Err(NodeError::fatal(
                "denied",
                match &d.note {
                    Some(n) => format!("approval denied: {n}"),
                    None => "approval denied".to_string(),
                },
            )
            .with_details(json!({ "approved": false, "note": d.note, "by": d.by })))
        }
    }
}
