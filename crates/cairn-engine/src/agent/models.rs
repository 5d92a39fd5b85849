//! From a workflow's `models:` entry to a provider's client.

use std::sync::Arc;

use cairn_agent::{Gate, ModelClient, Script};
use cairn_events::ErrorInfo;
use cairn_workflow::{AgentSpec, ModelConfig, Workflow};

use crate::node::{NodeCtx, NodeError};

/// A model as an agent step calls it: its client, the budget it shares
/// with every agent of the process, and what the step needs of its
/// settings.
pub(super) struct Model {
    /// Its name in the workflow's `models:`.
    pub name: String,
    pub client: Arc<dyn ModelClient>,
    pub gate: Arc<Gate>,
    /// The most tokens one request may hold, when known.
    pub context_window: Option<u64>,
    /// The most tokens of one answer, when set.
    pub max_tokens: Option<u32>,
    /// The models asked instead when this one's retries ran out.
    pub fallback: Vec<String>,
    /// Its shared limits, and the key a store that many processes share
    /// counts them under.
    pub limits: cairn_workflow::Limits,
    pub budget_key: String,
    /// Longest a call may hold its place in a shared budget if its
    /// process dies: the model's `timeout`, else ten minutes.
    pub lease: std::time::Duration,
}

/// The model an agent node names.
pub(super) fn client(ctx: &NodeCtx, spec: &AgentSpec) -> Result<Model, NodeError> {
    model(ctx, spec.model.as_deref().unwrap_or_default())
}

/// The model of the workflow named `name`, its key read from the secret
/// it names, if any.
pub(super) fn model(ctx: &NodeCtx, name: &str) -> Result<Model, NodeError> {
    let def = ctx.workflow.models.get(name).ok_or_else(|| {
        NodeError::fatal(
            "config",
            format!("the workflow has no model named `{name}`"),
        )
    })?;
    let script = script(&ctx.workflow, name, def)?;
    let mut keyed;
    let def = match def
        .api_key_secret
        .as_deref()
        .and_then(|s| ctx.secrets.get(s))
    {
        Some(key) => {
            keyed = def.clone();
            keyed.api_key = Some(cairn_workflow::ApiKey(key.to_string()));
            &keyed
        }
        None => def,
    };
    let client = cairn_agent::client_for(def, script).map_err(|e| NodeError {
        info: Box::new(ErrorInfo::new(
            e.kind.as_str(),
            format!("model `{name}`: {e}"),
        )),
        retryable: e.kind.retryable(),
        cancelled: false,
    })?;
    Ok(Model {
        name: name.to_string(),
        client,
        gate: cairn_agent::gate_for(def),
        context_window: def.context_window.or_else(|| def.builtin_context_window()),
        max_tokens: def.max_tokens,
        fallback: def.fallback.clone(),
        limits: def.limits,
        budget_key: cairn_agent::budget_key(def),
        lease: def.timeout.unwrap_or(std::time::Duration::from_secs(600)),
    })
}

/// A scripted model's turns, read (relative to the workflow's folder, as
/// the run pinned the file) and checked; `None` for a model of another
/// provider. The rest of the model is the workflow's `ModelConfig` as it
/// is: the provider's client applies the defaults.
pub(crate) fn script(
    wf: &Workflow,
    name: &str,
    def: &ModelConfig,
) -> Result<Option<Arc<Script>>, NodeError> {
    let Some(file) = &def.script else {
        return Ok(None);
    };
    let path = wf.base_dir.join(file);
    // The script as pinned when the run began, not as a node left it.
    let data = wf
        .referenced_text(&path)
        .and_then(|text| cairn_workflow::parse_data(&text, &path))
        .map_err(|e| NodeError::fatal("config", format!("model `{name}`: {e}")))?;
    let script = Script::from_value(data).map_err(|e| {
        NodeError::fatal("config", format!("model `{name}`: {}: {e}", path.display()))
    })?;
    Ok(Some(Arc::new(script)))
}
