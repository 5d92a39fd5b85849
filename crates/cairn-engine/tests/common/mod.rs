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

/// A run's stored events, which must keep the contract's rules
/// ([`cairn_events::check_log`]; a log still being written is a prefix
/// that keeps them too).
pub fn stored(engine: &Engine, run: &str) -> Vec<Event> {
    let events: Vec<Event> = engine
        .journal()
        .backend()
        .read_events(run, &Default::default())
        .unwrap()
        .iter()
        .map(|s| s.decode().unwrap())
        .collect();
    if let Err(e) = cairn_events::check_log(&events) {
        panic!("run `{run}`'s log breaks the contract: {e}");
    }
    events
}
