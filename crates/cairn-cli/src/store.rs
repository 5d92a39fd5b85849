//! Opening the store: created only by commands that start runs, so a typo
//! in `--store` never leaves an empty database behind.

use cairn_engine::{Engine, EngineOptions};
use cairn_store::{Journal, JournalOptions};

use crate::bad_input;
use crate::cli::Global;

/// Opens the store, creating it when `create` is set; otherwise a missing
/// store is bad input.
pub fn open(g: &Global, create: bool) -> anyhow::Result<Journal> {
    if !create && !g.store.exists() {
        return Err(bad_input(format!(
            "no store at {} (no run was started with this --store yet)",
            g.store.display()
        )));
    }
    let opts = JournalOptions {
        log_dir: if g.no_log { None } else { Some(g.log_dir()) },
    };
    Ok(Journal::open_sqlite(&g.store, opts)?)
}

/// An engine over the store (see [`open`]).
pub fn engine(g: &Global, create: bool) -> anyhow::Result<Engine> {
    Ok(Engine::new(open(g, create)?, EngineOptions::default()))
}

/// Fails with bad input unless the store holds this run.
pub fn require_run(j: &Journal, run_id: &str) -> anyhow::Result<cairn_store::RunRecord> {
    j.backend()
        .get_run(run_id)?
        .ok_or_else(|| bad_input(format!("no run `{run_id}` in this store")))
}
