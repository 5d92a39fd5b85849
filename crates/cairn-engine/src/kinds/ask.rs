//! `ask`: asks a person a question; the answer is the output.

use async_trait::async_trait;
use cairn_workflow::{NodeKind, NodeSpec};
use serde_json::Value;

use crate::node::{NodeCtx, NodeError, NodeRunner};

/// `ask`: asks a person a question; the answer is the output.
pub(crate) struct AskNode;

#[async_trait]
impl NodeRunner for AskNode {
    async fn run(&self, spec: &NodeSpec, ctx: &NodeCtx) -> Result<Value, NodeError> {
        let NodeKind::Ask { prompt, schema } = &spec.kind else {
            unreachable!("runner_for maps only ask nodes here")
        };
        let prompt = ctx
            .templates
            .render_string(prompt, &ctx.vars)
            .map_err(|e| NodeError::fatal("template", e.to_string()))?;
        ctx.ask_person(prompt, schema.as_deref().cloned(), None)
            .await
    }
}
