//! `/metrics` for the whole store: every run in it, whichever process
//! drives it, folded from the store's logs rather than from what this
//! process happened to commit.
//!
//! The store keeps no order across runs, so the fold keeps one cursor per
//! run (the last seq it folded) and catches up when asked: runs created
//! since the last look (the run list is newest first, so the first page of
//! runs it already knows ends the search), runs someone resumed (running
//! again), and every run it has not yet seen end. A server that starts
//! folds the whole store once, so counters survive a restart; what `cairn
//! gc` deleted meanwhile is no longer counted (a counter reset, which
//! Prometheus' `rate` and `increase` take in their stride).

use std::collections::{HashMap, HashSet};
use std::time::{SystemTime, UNIX_EPOCH};

use cairn_events::{EventKind, Metrics, RunId, RunStatus};
use cairn_store::{Backend, EventQuery, RecordStatus, RunFilter, StoreError};

/// Runs listed per page while looking for new ones.
const PAGE: usize = 200;

/// Events read per query while catching a run up.
const EVENTS_PAGE: usize = 2000;

/// The metrics of every run of a store, and where each run's fold stands.
pub(crate) struct StoreMetrics {
    metrics: Metrics,
    /// The last seq folded of every run seen.
    cursors: HashMap<RunId, u64>,
    /// The runs whose end has not been folded.
    open: HashSet<RunId>,
    /// When this process began counting (Unix seconds).
    started: f64,
}

impl StoreMetrics {
    /// Nothing folded yet.
    pub(crate) fn new() -> StoreMetrics {
        StoreMetrics {
            metrics: Metrics::new(),
            cursors: HashMap::new(),
            open: HashSet::new(),
            started: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
        }
    }

    /// Folds what the store's logs gained since the last call.
    pub(crate) fn catch_up(&mut self, store: &dyn Backend) -> Result<(), StoreError> {
        self.discover(store)?;
        let open: Vec<RunId> = self.open.iter().cloned().collect();
        for run in open {
            self.follow(store, &run)?;
        }
        Ok(())
    }

    /// Adds the runs created since the last look, and those running again.
    fn discover(&mut self, store: &dyn Backend) -> Result<(), StoreError> {
        let mut offset = 0;
        loop {
            let page = store.list_runs(&RunFilter {
                limit: Some(PAGE),
                offset: Some(offset),
                ..RunFilter::default()
            })?;
            let mut new = 0;
            for rec in &page {
                if !self.cursors.contains_key(&rec.run_id) {
                    self.cursors.insert(rec.run_id.clone(), 0);
                    self.open.insert(rec.run_id.clone());
                    new += 1;
                }
            }
            if page.len() < PAGE || new == 0 {
                break;
            }
            offset += page.len();
        }
        let running = store.list_runs(&RunFilter {
            status: Some(RecordStatus::Run(RunStatus::Running)),
            ..RunFilter::default()
        })?;
        for rec in running {
            self.cursors.entry(rec.run_id.clone()).or_insert(0);
            self.open.insert(rec.run_id);
        }
        Ok(())
    }

    /// Folds one run's events after its cursor; a run whose log ends with
    /// its end is no longer followed (until it runs again).
    fn follow(&mut self, store: &dyn Backend, run: &RunId) -> Result<(), StoreError> {
        loop {
            let after = self.cursors.get(run).copied().unwrap_or(0);
            let page = match store.read_events(
                run,
                &EventQuery {
                    after,
                    limit: Some(EVENTS_PAGE),
                    ..EventQuery::default()
                },
            ) {
                Ok(p) => p,
                // Deleted meanwhile (`cairn gc`): nothing more to fold.
                Err(StoreError::RunNotFound(_)) => {
                    self.open.remove(run);
                    self.cursors.remove(run);
                    return Ok(());
                }
                Err(e) => return Err(e),
            };
            let mut ended = false;
            for stored in &page {
                if let Ok(ev) = stored.decode() {
                    ended = matches!(
                        ev.kind,
                        EventKind::RunFinished { .. }
                            | EventKind::RunFailed { .. }
                            | EventKind::RunCancelled { .. }
                    );
                    self.metrics.apply(&ev);
                }
                self.cursors.insert(run.clone(), stored.seq);
            }
            if page.len() < EVENTS_PAGE {
                if ended {
                    self.open.remove(run);
                }
                return Ok(());
            }
        }
    }

    /// The counters in Prometheus' text format, with when this process
    /// began counting and how many runs it has seen.
    pub(crate) fn render(&self) -> String {
        let mut out = self.metrics.render_prometheus();
        out.push_str(
            "# HELP cairn_metrics_start_time_seconds When this server began counting (Unix time); \
             the counters are every run in the store, folded from its logs when the server \
             started and kept up since.\n\
             # TYPE cairn_metrics_start_time_seconds gauge\n",
        );
        out.push_str(&format!(
            "cairn_metrics_start_time_seconds {:.3}\n",
            self.started
        ));
        out.push_str(
            "# HELP cairn_store_runs Runs in the store that the metrics count.\n\
             # TYPE cairn_store_runs gauge\n",
        );
        out.push_str(&format!("cairn_store_runs {}\n", self.cursors.len()));
        out
    }
}
