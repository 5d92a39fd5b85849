use std::fmt;
use std::path::PathBuf;

/// Everything wrong with a workflow file, found before anything runs.
#[derive(Debug, thiserror::Error)]
pub struct WorkflowError {
    /// Each problem found, in file order.
    pub problems: Vec<Problem>,
}

impl fmt::Display for WorkflowError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.problems.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{p}")?;
        }
        Ok(())
    }
}

/// One problem in a workflow file, located by line, column and field path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The workflow file.
    pub file: PathBuf,
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// 1-based column, when known.
    pub column: Option<usize>,
    /// The field path, e.g. `nodes[2].retry.attempts`.
    pub field: Option<String>,
    /// What is wrong.
    pub message: String,
    /// How to fix it, when we can guess.
    pub hint: Option<String>,
}

impl Problem {
    /// The problem as one JSON object (`file`, `line`, `column`, `field`,
    /// `message`, `hint`): what `cairn validate --json` prints and a failed
    /// reload's `details` carry.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "file": self.file.display().to_string(),
            "line": self.line,
            "column": self.column,
            "field": self.field,
            "message": self.message,
            "hint": self.hint,
        })
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(l) = self.line {
            write!(f, ":{l}")?;
            if let Some(c) = self.column {
                write!(f, ":{c}")?;
            }
        }
        write!(f, ": ")?;
        if let Some(field) = &self.field {
            write!(f, "{field}: ")?;
        }
        write!(f, "{}", self.message)?;
        if let Some(h) = &self.hint {
            write!(f, " ({h})")?;
        }
        Ok(())
    }
}

/// A run input that breaks the workflow's input schema.
#[derive(Debug, thiserror::Error)]
pub struct InputError {
    /// Each violation found.
    pub violations: Vec<InputViolation>,
}

/// One schema violation in a run input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputViolation {
    /// JSON pointer into the input (empty string for the root).
    pub pointer: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for InputError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "input does not match the workflow's schema:")?;
        for v in &self.violations {
            let ptr = if v.pointer.is_empty() {
                "/"
            } else {
                &v.pointer
            };
            write!(f, "\n  {ptr}: {}", v.message)?;
        }
        Ok(())
    }
}
