//! Opening the store: created only by commands that start runs, so a typo
//! in `--store` never leaves an empty database behind.

use std::time::Duration;

use cairn_engine::{Engine, EngineOptions};
use cairn_store::{Journal, JournalOptions};

use crate::bad_input;
use crate::cli::Global;
use crate::trace::{Report, Telemetry};

/// Opens the store, creating it when `create` is set; otherwise a missing
/// store is bad input.
pub fn open(g: &Global, create: bool) -> anyhow::Result<Journal> {
    open_for(g, create, true)
}

/// [`open`], saying whether the command reads the store first (see
/// `cairn_store::OpenOptions::reads_first`).
fn open_for(g: &Global, create: bool, reads_first: bool) -> anyhow::Result<Journal> {
    let opts = JournalOptions {
        log_dir: if g.no_log { None } else { Some(g.log_dir()) },
    };
    let backend = cairn_store::open(
        &g.store,
        &cairn_store::OpenOptions {
            create,
            lease_ttl: Some(lease_ttl(g)?),
            reads_first,
            instance: instance_name(g)?,
        },
    )?;
    Ok(Journal::open(backend, opts)?)
}

/// `--instance-name`, checked.
pub fn instance_name(g: &Global) -> anyhow::Result<Option<String>> {
    match &g.instance_name {
        Some(n) => {
            cairn_store::check_instance_name(n)
                .map_err(|e| bad_input(format!("--instance-name: {e}")))?;
            Ok(Some(n.clone()))
        }
        None => Ok(None),
    }
}

/// `--lease-ttl`, checked.
pub fn lease_ttl(g: &Global) -> anyhow::Result<Duration> {
    cairn_workflow::parse_duration(&g.lease_ttl)
        .ok()
        .filter(|d| *d >= Duration::from_millis(300))
        .ok_or_else(|| {
            bad_input(format!(
                "--lease-ttl `{}`: write a duration of at least 300ms, e.g. 5s",
                g.lease_ttl
            ))
        })
}

/// An engine over the store (see [`open`]).
pub fn engine(g: &Global, create: bool) -> anyhow::Result<Engine> {
    let opts = EngineOptions {
        snapshot_dir: snapshot_dir(g),
        ..Default::default()
    };
    Ok(Engine::new(open(g, create)?, opts))
}

/// Where workspace snapshots go: `snapshots` beside a SQLite store (the
/// engine's default), `.cairn/snapshots` here for a PostgreSQL one.
pub fn snapshot_dir(g: &Global) -> Option<std::path::PathBuf> {
    g.store
        .is_postgres()
        .then(|| std::path::PathBuf::from(".cairn/snapshots"))
}

/// An engine for a command that may drive runs, with the exporter of their
/// traces (docs/otel.md): each run's trace is queued for export when one of
/// the engine's drivers stops driving it. The `OTEL_*` settings are checked
/// before the store is opened; call [`Telemetry::finish`] after closing the
/// journal.
pub fn driving_engine(g: &Global, create: bool) -> anyhow::Result<(Engine, Telemetry)> {
    let client = crate::trace::otlp_client()?;
    // A new run (`create`) is written before anything is read: its store
    // needs no read connection made ahead.
    let journal = open_for(g, create, !create)?;
    let telemetry = Telemetry::start(client, &journal, Report::AtEnd);
    let opts = EngineOptions {
        on_run_stopped: telemetry.hook(),
        snapshot_dir: snapshot_dir(g),
        ..Default::default()
    };
    Ok((Engine::new(journal, opts), telemetry))
}

/// A run id given on the command line; bad input when it can name no run.
pub fn run_id(text: &str) -> anyhow::Result<cairn_events::RunId> {
    cairn_events::RunId::parse(text).map_err(|e| bad_input(e.to_string()))
}

/// Fails with bad input unless the store holds this run (or the text can
/// name no run at all).
pub fn require_run(j: &Journal, run_id: &str) -> anyhow::Result<cairn_store::RunRecord> {
    j.backend()
        .get_run(&self::run_id(run_id)?)?
        .ok_or_else(|| bad_input(format!("no run `{run_id}` in this store")))
}
