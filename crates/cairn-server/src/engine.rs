//! The engine surface the server drives, until `cairn-engine` exports it.
//! Only the read side works here; every command answers `Unavailable`.

use std::path::Path;
use std::time::Duration;

use cairn_events::{Event, RunState};
use cairn_store::{EventQuery, Journal, StoreError};
use cairn_workflow::{InputError, Workflow, WorkflowError};

/// Engine settings.
#[derive(Debug, Default, Clone)]
pub struct EngineOptions {}

/// How to start or resume a run.
#[derive(Debug, Default, Clone)]
pub struct StartOptions {
    /// The new run's id; generated when absent.
    pub run_id: Option<String>,
    /// Most nodes running at once.
    pub max_concurrency: Option<usize>,
}

/// A started run.
pub struct RunHandle {
    /// The run's id.
    pub run_id: String,
}

/// What the engine refuses.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// A bad workflow file.
    #[error(transparent)]
    Workflow(#[from] WorkflowError),
    /// An input that breaks the workflow's schema.
    #[error(transparent)]
    Input(#[from] InputError),
    /// No such run, node or request.
    #[error("{0}")]
    NotFound(String),
    /// The request conflicts with the run's state.
    #[error("{0}")]
    Conflict(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The command is not available.
    #[error("{0}")]
    Unavailable(String),
}

impl EngineError {
    /// The HTTP status that fits the error.
    pub fn http_status(&self) -> u16 {
        match self {
            EngineError::Workflow(_) => 400,
            EngineError::Input(_) => 422,
            EngineError::NotFound(_) => 404,
            EngineError::Conflict(_) => 409,
            EngineError::Store(StoreError::NotFound(_)) => 404,
            EngineError::Store(StoreError::Busy { .. }) => 409,
            EngineError::Store(_) => 500,
            EngineError::Unavailable(_) => 503,
        }
    }
}

/// Runs workflows over a journal.
#[derive(Clone)]
pub struct Engine {
    journal: Journal,
}

fn unavailable() -> EngineError {
    EngineError::Unavailable("this server cannot run workflows".into())
}

impl Engine {
    /// An engine over a journal.
    pub fn new(journal: Journal, _opts: EngineOptions) -> Engine {
        Engine { journal }
    }
    /// The journal.
    pub fn journal(&self) -> &Journal {
        &self.journal
    }
    /// Loads a workflow by name or path.
    pub fn load_workflow(&self, _name: &str, _dir: Option<&Path>) -> Result<Workflow, EngineError> {
        Err(unavailable())
    }
    /// Starts a run.
    pub async fn start(
        &self,
        _wf: Workflow,
        _input: serde_json::Value,
        _o: StartOptions,
    ) -> Result<RunHandle, EngineError> {
        Err(unavailable())
    }
    /// Resumes a run.
    pub async fn resume(&self, _run: &str, _o: StartOptions) -> Result<RunHandle, EngineError> {
        Err(unavailable())
    }
    /// Decides an approval.
    pub async fn decide(
        &self,
        _r: &str,
        _n: &str,
        _a: bool,
        _note: Option<String>,
        _by: Option<String>,
    ) -> Result<(), EngineError> {
        Err(unavailable())
    }
    /// Answers an input request.
    pub async fn answer(
        &self,
        _r: &str,
        _q: &str,
        _v: serde_json::Value,
        _by: Option<String>,
    ) -> Result<(), EngineError> {
        Err(unavailable())
    }
    /// Cancels a run.
    pub async fn cancel(
        &self,
        _r: &str,
        _g: bool,
        _reason: Option<String>,
        _by: Option<String>,
    ) -> Result<(), EngineError> {
        Err(unavailable())
    }
    /// A run's state, folded from its log.
    pub fn state(&self, run_id: &str) -> Result<RunState, EngineError> {
        let b = self.journal.backend();
        if b.get_run(run_id)?.is_none() {
            return Err(EngineError::NotFound(format!("no run `{run_id}`")));
        }
        let evs = b.read_events(run_id, &EventQuery::default())?;
        let mut s = RunState::new(run_id);
        for e in evs {
            let ev: Event = e
                .decode()
                .map_err(|e| EngineError::Unavailable(e.to_string()))?;
            s.apply(&ev);
        }
        Ok(s)
    }
    /// Runs executing here.
    pub fn active_runs(&self) -> Vec<String> {
        Vec::new()
    }
    /// Stops the engine.
    pub async fn shutdown(&self, _grace: Duration) {}
    /// Resumes runs left running.
    pub async fn resume_interrupted(&self) -> Vec<String> {
        Vec::new()
    }
}
