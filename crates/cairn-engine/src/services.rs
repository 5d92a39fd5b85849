//! What every run of an engine shares: the journal and the tools.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cairn_store::Journal;
use cairn_tools::process::NetworkPolicy;
use cairn_tools::{Limits, Sandbox, ToolRegistry};
use cairn_workflow::Workflow;

use crate::node::NodeError;

pub(crate) struct Services {
    pub journal: Journal,
    pub tools: ToolRegistry,
    sandboxes: Mutex<HashMap<String, Arc<Sandbox>>>,
}

impl Services {
    pub fn new(journal: Journal, tools: ToolRegistry) -> Self {
        Services {
            journal,
            tools,
            sandboxes: Mutex::new(HashMap::new()),
        }
    }

    /// The sandbox a workflow's tools run in, built once per workflow text.
    pub fn sandbox_for(&self, wf: &Workflow) -> Result<Arc<Sandbox>, NodeError> {
        if let Some(s) = self.sandboxes.lock().unwrap().get(&wf.hash) {
            return Ok(s.clone());
        }
        let root = match &wf.sandbox.root {
            Some(r) if std::path::Path::new(r).is_absolute() => r.into(),
            Some(r) => wf.base_dir.join(r),
            None => wf.base_dir.clone(),
        };
        let defaults = Limits::default();
        let limits = Limits {
            max_output_bytes: wf
                .sandbox
                .max_output_bytes
                .map_or(defaults.max_output_bytes, |b| b as usize),
            timeout: wf.sandbox.tool_timeout.unwrap_or(defaults.timeout),
        }
        .capped();
        let network = if wf.sandbox.network {
            NetworkPolicy::Allow
        } else {
            NetworkPolicy::Deny
        };
        let sandbox = Sandbox::new(&root)
            .map_err(|e| NodeError::fatal("sandbox", e.to_string()))?
            .with_network(network)
            .with_limits(limits);
        let sandbox = Arc::new(sandbox);
        self.sandboxes
            .lock()
            .unwrap()
            .insert(wf.hash.clone(), sandbox.clone());
        Ok(sandbox)
    }
}

#[allow(dead_code)]
const _: Duration = Duration::ZERO;
