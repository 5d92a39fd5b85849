//! How the events of a hot reload read for people (`cairn run --watch`):
//! one line each, and a failure's problems one per line, each with its file
//! and line as the parser reports them.

use cairn_events::EventKind;

/// The files of a reload event, as a short list.
fn files(changed: &[String]) -> String {
    match changed.len() {
        0 => "no file".to_string(),
        1..=3 => changed.join(", "),
        n => format!("{}, and {} more", changed[..3].join(", "), n - 3),
    }
}

/// What a reload event says, for the live display; `None` for every
/// other event.
pub fn reload_line(kind: &EventKind) -> Option<String> {
    Some(match kind {
        EventKind::WorkflowReloadDetected { changed_files } => {
            format!("reload: {} changed", files(changed_files))
        }
        EventKind::WorkflowReloaded {
            generation,
            changed_files,
        } => format!(
            "reload: the run now uses generation {generation} of the workflow ({})",
            files(changed_files)
        ),
        EventKind::WorkflowReloadFailed {
            error,
            changed_files,
        } => {
            let mut s = format!(
                "reload failed ({}); the run goes on with the definition it has:",
                files(changed_files)
            );
            for line in error.message.lines() {
                s.push_str("\n  ");
                s.push_str(line);
            }
            s
        }
        EventKind::WorkflowReloadUnsafe {
            reason,
            changed_files,
        } => format!(
            "reload refused ({}): {reason}; the run goes on with the definition it has",
            files(changed_files)
        ),
        _ => return None,
    })
}

/// What a reload event says after its type, for `cairn logs`.
pub fn reload_detail(kind: &EventKind) -> Option<String> {
    Some(match kind {
        EventKind::WorkflowReloadDetected { changed_files } => files(changed_files),
        EventKind::WorkflowReloaded {
            generation,
            changed_files,
        } => format!("generation {generation}: {}", files(changed_files)),
        EventKind::WorkflowReloadFailed {
            error,
            changed_files,
        } => format!(
            "{}: {}",
            files(changed_files),
            error.message.lines().collect::<Vec<_>>().join("; ")
        ),
        EventKind::WorkflowReloadUnsafe {
            reason,
            changed_files,
        } => format!("{}: {reason}", files(changed_files)),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_events::ErrorInfo;

    #[test]
    fn a_failed_reload_shows_each_problem_with_its_place() {
        let kind = EventKind::WorkflowReloadFailed {
            error: ErrorInfo::new(
                "workflow",
                "flow.yaml:7:5: nodes[1]: unknown field `comand`\nflow.yaml:9: nodes[2]: x",
            ),
            changed_files: vec!["flow.yaml".into()],
        };
        let line = reload_line(&kind).unwrap();
        assert_eq!(
            line,
            "reload failed (flow.yaml); the run goes on with the definition it has:\n  \
             flow.yaml:7:5: nodes[1]: unknown field `comand`\n  flow.yaml:9: nodes[2]: x"
        );
        assert_eq!(
            reload_detail(&kind).unwrap(),
            "flow.yaml: flow.yaml:7:5: nodes[1]: unknown field `comand`; flow.yaml:9: nodes[2]: x"
        );
        let many: Vec<String> = (1..=5).map(|i| format!("f{i}.yaml")).collect();
        assert_eq!(files(&many), "f1.yaml, f2.yaml, f3.yaml, and 2 more");
        assert_eq!(reload_line(&EventKind::RunCancelled { reason: None }), None);
    }
}
