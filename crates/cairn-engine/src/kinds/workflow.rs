//! `workflow`: runs another workflow file as a child run (`crate::child`)
//! and ends with its output.

use async_trait::async_trait;
use cairn_workflow::{NodeKind, NodeSpec};
use serde_json::{json, Value};

use crate::child::{child_run_id, origin, ChildSpec};
use crate::node::{NodeCtx, NodeError, NodeRunner};

/// The `workflow` node kind.
pub(crate) struct WorkflowNode;

#[async_trait]
impl NodeRunner for WorkflowNode {
    async fn run(&self, spec: &NodeSpec, ctx: &NodeCtx) -> Result<Value, NodeError> {
        let NodeKind::Workflow { path, input } = &spec.kind else {
            return Err(NodeError::fatal("internal", "not a workflow node"));
        };
        let input = match input {
            Some(v) => ctx.render_value(v)?,
            None => json!({}),
        };
        let origin = origin(ctx).await?;
        let place = format!("{}\0{}\0{origin}", ctx.node_id, ctx.iteration);
        let child = ChildSpec {
            run_id: child_run_id(&ctx.run_id, ctx.depth, &place),
            path: path.clone(),
            agent: "workflow".into(),
            input,
        };
        ctx.run_child(child).await
    }
}
