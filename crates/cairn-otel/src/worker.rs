//! Exports off the run's path: a run that stops is queued (a bounded
//! queue, never waited on), and one task reads its whole log and sends its
//! spans. Whatever fails is logged; nothing of it reaches the run.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cairn_events::RunId;
use cairn_store::Backend;
use tokio::sync::{mpsc, watch};

use crate::export::{ExportError, OtlpClient};

/// Runs waiting for their export at most; a stop beyond is dropped (and
/// logged): `cairn trace` can send that run later.
pub const QUEUE_CAPACITY: usize = 1024;

/// Told about each export that failed: the run's id and why.
pub type ErrorHook = Arc<dyn Fn(&str, &ExportError) + Send + Sync>;

/// What the queue and its task share.
struct State {
    /// Runs queued and not yet taken: a second stop of one of them needs no
    /// second export, since the export reads the whole log when it starts.
    queued: Mutex<HashSet<RunId>>,
    /// Exports queued or under way.
    outstanding: watch::Sender<usize>,
}

/// The background exporter of runs' traces. Cheap to clone; the task ends
/// when the last clone is dropped.
#[derive(Clone)]
pub struct TraceExporter {
    tx: mpsc::Sender<RunId>,
    state: Arc<State>,
    timeout: Duration,
}

impl TraceExporter {
    /// Starts the exporting task on the current tokio runtime. `on_error`
    /// hears of each failed export, besides the `tracing` warning.
    pub fn start(
        client: OtlpClient,
        backend: Arc<dyn Backend>,
        on_error: Option<ErrorHook>,
    ) -> TraceExporter {
        let (tx, rx) = mpsc::channel(QUEUE_CAPACITY);
        let state = Arc::new(State {
            queued: Mutex::new(HashSet::new()),
            outstanding: watch::channel(0).0,
        });
        let timeout = client.config().timeout;
        tokio::spawn(work(rx, state.clone(), client, backend, on_error));
        TraceExporter { tx, state, timeout }
    }

    /// The export timeout: the longest one request may take.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Queues the export of a run's trace, built from its whole log when
    /// its turn comes. Returns at once, whatever happens.
    pub fn run_stopped(&self, run_id: &RunId) {
        let mut queued = self.state.queued.lock().unwrap_or_else(|p| p.into_inner());
        if queued.contains(run_id) {
            return;
        }
        match self.tx.try_send(run_id.clone()) {
            Ok(()) => {
                queued.insert(run_id.clone());
                self.state.outstanding.send_modify(|n| *n += 1);
            }
            Err(mpsc::error::TrySendError::Full(_)) => {
                tracing::warn!(
                    run = %run_id,
                    "{QUEUE_CAPACITY} traces already wait for export; this run's is skipped (`cairn trace {run_id}` sends it)"
                );
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {}
        }
    }

    /// Waits until every queued export is done, or `limit` has passed.
    /// Returns whether everything was done.
    pub async fn flush(&self, limit: Duration) -> bool {
        let mut rx = self.state.outstanding.subscribe();
        tokio::time::timeout(limit, rx.wait_for(|n| *n == 0))
            .await
            .is_ok_and(|r| r.is_ok())
    }
}

/// The exporting task: one run at a time, in the order they stopped.
async fn work(
    mut rx: mpsc::Receiver<RunId>,
    state: Arc<State>,
    client: OtlpClient,
    backend: Arc<dyn Backend>,
    on_error: Option<ErrorHook>,
) {
    while let Some(run) = rx.recv().await {
        state
            .queued
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&run);
        let (b, r) = (backend.clone(), run.clone());
        // Store reads block: they go to the blocking pool.
        let spans =
            tokio::task::spawn_blocking(move || crate::read::run_spans(b.as_ref(), &r)).await;
        let result = match spans {
            Ok(Ok(spans)) => client.export(spans).await,
            Ok(Err(e)) => Err(ExportError::Store(e)),
            Err(e) => Err(ExportError::Client(format!(
                "reading the run's events stopped: {e}"
            ))),
        };
        match result {
            Ok(()) => tracing::debug!(run = %run, "trace exported"),
            Err(e) => {
                tracing::warn!(run = %run, error = %e, "trace export failed");
                if let Some(hook) = &on_error {
                    hook(&run, &e);
                }
            }
        }
        state.outstanding.send_modify(|n| *n = n.saturating_sub(1));
    }
}
