//! What the engine's integration tests share: a store in a folder, and the
//! log of a run, checked against the contract's rules as it is read.

#![allow(dead_code)]

use std::path::Path;

use cairn_engine::Engine;
use cairn_events::Event;
use cairn_store::{Journal, JournalOptions};

/// A SQLite store in `dir/.cairn`, its NDJSON mirror in `dir/.cairn/logs`.
pub fn journal(dir: &Path) -> Journal {
    Journal::open_sqlite(
        &dir.join(".cairn/cairn.db"),
        JournalOptions {
            log_dir: Some(dir.join(".cairn/logs")),
        },
    )
    .unwrap()
}

/// An engine over a SQLite store in `dir` (`cairn.db`, its mirror in
/// `logs`), and `yaml` written to `dir/wf.yaml` and loaded from there (so
/// that files it names are found beside it).
pub fn setup(dir: &Path, yaml: &str) -> (Engine, cairn_workflow::Workflow) {
    let journal = Journal::open_sqlite(
        &dir.join("cairn.db"),
        JournalOptions {
            log_dir: Some(dir.join("logs")),
        },
    )
    .unwrap();
    let path = dir.join("wf.yaml");
    std::fs::write(&path, yaml).unwrap();
    let wf = cairn_workflow::load(&path).unwrap_or_else(|e| panic!("{e}"));
    (
        Engine::new(journal, cairn_engine::EngineOptions::default()),
        wf,
    )
}

/// A run's stored events, which must keep the contract's rules
/// ([`cairn_events::check_log`]; a log still being written is a prefix
/// that keeps them too).
pub fn stored(engine: &Engine, run: &str) -> Vec<Event> {
    let events: Vec<Event> = engine
        .journal()
        .backend()
        .read_events(
            &cairn_events::RunId::parse(run).unwrap(),
            &Default::default(),
        )
        .unwrap()
        .iter()
        .map(|s| s.decode().unwrap())
        .collect();
    if let Err(e) = cairn_events::check_log(&events) {
        panic!("run `{run}`'s log breaks the contract: {e}");
    }
    events
}

/// Stops `engine` at once (its run is left interrupted, as a crash
/// leaves it), then resumes `run` with a new engine on the same store and
/// waits for its end.
pub async fn stop_and_resume(
    dir: &Path,
    engine: Engine,
    handle: cairn_engine::RunHandle,
    run: &str,
) -> (Engine, cairn_engine::RunOutcome) {
    engine.shutdown(std::time::Duration::ZERO).await;
    assert_eq!(handle.wait().await, cairn_engine::RunOutcome::Interrupted);
    drop(engine);
    let engine = Engine::new(journal(dir), cairn_engine::EngineOptions::default());
    let outcome = engine
        .resume(
            &cairn_events::RunId::parse(run).unwrap(),
            cairn_engine::StartOptions::default(),
        )
        .await
        .unwrap()
        .wait()
        .await;
    (engine, outcome)
}

/// The error of a node's first attempt.
pub fn first_error(engine: &Engine, run: &str, node: &str) -> cairn_events::ErrorInfo {
    let st = engine
        .state(&cairn_events::RunId::parse(run).unwrap())
        .unwrap();
    (*st.node(node, 0).unwrap().attempts[0].error.clone().unwrap()).clone()
}
