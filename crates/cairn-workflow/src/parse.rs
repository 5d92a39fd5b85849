use std::path::Path;

use crate::error::WorkflowError;
use crate::model::Workflow;

/// Reads and parses a workflow file.
pub fn load(path: &Path) -> Result<Workflow, WorkflowError> {
    let _ = path;
    todo!()
}

/// Parses and validates workflow text; `path` names the file in errors.
pub fn parse(source: &str, path: &Path) -> Result<Workflow, WorkflowError> {
    let _ = (source, path);
    todo!()
}
