//! Helpers shared by the store's tests.
#![allow(dead_code)]

use std::path::Path;

use cairn_events::{EventKind, OutputStream, RunStatus, Scope};
use cairn_store::{Journal, JournalOptions, RunRecord};

pub fn run_record(run_id: &str, status: &str, created_ms: i64) -> RunRecord {
    RunRecord {
        run_id: cairn_events::RunId::parse(run_id).unwrap(),
        workflow: "wf".into(),
        workflow_path: "wf.yaml".into(),
        workflow_hash: "abc".into(),
        workflow_source: "name: wf\n".into(),
        input: serde_json::json!({"n": 1}),
        status: cairn_store::RecordStatus::parse(status).expect("a run row's status"),
        created_ms,
        updated_ms: created_ms,
        parent_run_id: None,
    }
}

pub fn open(db: &Path, log_dir: Option<&Path>) -> Journal {
    Journal::open_sqlite(
        db,
        JournalOptions {
            log_dir: log_dir.map(Path::to_path_buf),
        },
    )
    .unwrap()
}

pub fn started() -> EventKind {
    EventKind::RunStarted {
        workflow: "wf".into(),
        workflow_hash: "abc".into(),
        input: None,
        resumed: false,
        parent_run_id: None,
        parent_node_id: None,
        depth: 0,
        forked_from: None,
        trigger: None,
        replay_of: None,
    }
}

pub fn output(text: &str) -> EventKind {
    EventKind::NodeOutput {
        text: text.into(),
        stream: OutputStream::Stdout,
    }
}

pub fn status(s: RunStatus) -> EventKind {
    EventKind::RunStatusChanged { status: s }
}

pub fn finished() -> EventKind {
    EventKind::RunFinished {
        output: None,
        duration_ms: 1,
    }
}

pub fn node(id: &str) -> Scope {
    Scope::node(id, 0).with_attempt(1)
}
