//! From a workflow's `models:` entry to a provider's client.

use std::sync::Arc;

use cairn_agent::{ModelClient, ModelConfig, Price, ProviderKind, RetryPolicy, Script};
use cairn_events::ErrorInfo;
use cairn_workflow::{AgentSpec, Backoff, ModelDef, Workflow};

use crate::node::{NodeCtx, NodeError};

/// The client of the model an agent node names.
pub(super) fn client(ctx: &NodeCtx, spec: &AgentSpec) -> Result<Arc<dyn ModelClient>, NodeError> {
    let name = spec.model.as_deref().unwrap_or_default();
    let def = ctx.workflow.models.get(name).ok_or_else(|| {
        NodeError::fatal(
            "config",
            format!("the workflow has no model named `{name}`"),
        )
    })?;
    let config = config(&ctx.workflow, name, def)?;
    cairn_agent::client_for(&config).map_err(|e| NodeError {
        info: Box::new(ErrorInfo::new(
            e.kind.as_str(),
            format!("model `{name}`: {e}"),
        )),
        retryable: e.kind.retryable(),
        cancelled: false,
    })
}

/// The provider's configuration of a declared model; a scripted model's
/// turns are read (relative to the workflow's folder) and checked here.
pub(crate) fn config(wf: &Workflow, name: &str, def: &ModelDef) -> Result<ModelConfig, NodeError> {
    let provider = ProviderKind::parse(&def.provider).ok_or_else(|| {
        NodeError::fatal(
            "config",
            format!("model `{name}`: unknown provider `{}`", def.provider),
        )
    })?;
    let mut c = ModelConfig::new(provider, def.model.clone());
    c.api_key_env = def.api_key_env.clone();
    c.base_url = def.base_url.clone();
    c.max_tokens = def.max_tokens;
    c.temperature = def.temperature;
    if let Some(t) = def.idle_timeout {
        c.idle_timeout = t;
    }
    c.call_timeout = def.timeout;
    if let Some(r) = &def.retry {
        c.retry = RetryPolicy {
            attempts: r.attempts.max(1),
            delay: r.delay,
            exponential: r.backoff == Backoff::Exponential,
            max_delay: r.max_delay,
        };
    }
    c.price = def.price.map(|p| Price {
        input: p.input,
        output: p.output,
        cache_read: p.cache_read,
        cache_write: p.cache_write,
    });
    if let Some(file) = &def.script {
        let path = wf.base_dir.join(file);
        // The script as pinned when the run began, not as a node left it.
        let data = wf
            .referenced_text(&path)
            .and_then(|text| cairn_workflow::parse_data(&text, &path))
            .map_err(|e| NodeError::fatal("config", format!("model `{name}`: {e}")))?;
        let script = Script::from_value(data).map_err(|e| {
            NodeError::fatal("config", format!("model `{name}`: {}: {e}", path.display()))
        })?;
        c.script = Some(Arc::new(script));
    }
    Ok(c)
}
