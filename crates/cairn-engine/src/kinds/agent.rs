//! `agent`: a model asked in a loop with the sandbox's tools, or an
//! external agent CLI; the loop itself is `crate::agent`.

use async_trait::async_trait;
use cairn_workflow::{NodeKind, NodeSpec};
use serde_json::Value;

use crate::node::{NodeCtx, NodeError, NodeRunner};

/// The runner of `agent` nodes.
pub(crate) struct AgentNode;

#[async_trait]
impl NodeRunner for AgentNode {
    async fn run(&self, spec: &NodeSpec, ctx: &NodeCtx) -> Result<Value, NodeError> {
        let NodeKind::Agent(agent) = &spec.kind else {
            return Err(NodeError::fatal("internal", "not an agent node"));
        };
        crate::agent::run(agent, ctx).await
    }
}
