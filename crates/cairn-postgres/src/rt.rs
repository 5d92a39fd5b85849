//! The bridge from the [`cairn_storage::Backend`] methods to the async
//! PostgreSQL client: a small runtime of the backend's own, on which every
//! query runs, while a blocking method's calling thread waits or an
//! [`cairn_storage::AsyncReads`] future is awaited.

use std::future::Future;
use std::panic::AssertUnwindSafe;

use futures::FutureExt;
use tokio::runtime::{Handle, Runtime};

use cairn_storage::{StoreError, StoreFuture};

/// Worker threads of the backend's runtime: the client only waits on
/// sockets, so two are plenty, and the machine may have few cores.
const WORKERS: usize = 2;

/// A multi-thread tokio runtime owned by one backend.
///
/// The calling thread never enters it: work is spawned onto it and the
/// caller waits on a channel. That is what makes the bridge usable from any
/// thread, even from inside another runtime's task (where
/// `Runtime::block_on` would panic), at the price of blocking that task's
/// worker while it waits.
pub(crate) struct Bridge {
    /// `None` only while dropping.
    rt: Option<Runtime>,
}

impl Bridge {
    /// Starts the runtime (threads named `cairn-pg`).
    pub(crate) fn new() -> std::io::Result<Bridge> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(WORKERS)
            .thread_name("cairn-pg")
            .enable_all()
            .build()?;
        Ok(Bridge { rt: Some(rt) })
    }

    /// The runtime's handle, to spawn background tasks.
    pub(crate) fn handle(&self) -> &Handle {
        self.rt
            .as_ref()
            .expect("the runtime lives as long as the bridge")
            .handle()
    }

    /// Runs `fut` on the runtime and blocks the calling thread until it is
    /// done. A panic in `fut` is resumed on the caller, so it is not lost in
    /// a worker thread.
    pub(crate) fn run<T, F>(&self, fut: F) -> Result<T, StoreError>
    where
        F: Future<Output = Result<T, StoreError>> + Send + 'static,
        T: Send + 'static,
    {
        // A std channel, not `block_on` of a tokio or futures executor: both
        // refuse (panic) on some threads this is called from.
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.handle().spawn(async move {
            let out = AssertUnwindSafe(fut).catch_unwind().await;
            let _ = tx.send(out);
        });
        match rx.recv() {
            Ok(Ok(out)) => out,
            Ok(Err(panic)) => std::panic::resume_unwind(panic),
            // The task was dropped unrun: the runtime is shutting down.
            Err(_) => Err(StoreError::Closed),
        }
    }

    /// Runs `fut` on the runtime and returns a future of its result that
    /// any runtime can await without blocking a thread: the async callers'
    /// path ([`cairn_storage::AsyncReads`]). The query's connections stay
    /// on this runtime, whose tasks drive them, whatever runtime awaits.
    pub(crate) fn spawn<T, F>(&self, fut: F) -> StoreFuture<T>
    where
        F: Future<Output = Result<T, StoreError>> + Send + 'static,
        T: Send + 'static,
    {
        let task = self.handle().spawn(fut);
        Box::pin(async move {
            match task.await {
                Ok(out) => out,
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                // The task was dropped unrun: the runtime is shutting down.
                Err(_) => Err(StoreError::Closed),
            }
        })
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        // Not a plain drop: that waits for the runtime's threads and panics
        // when the backend is dropped inside another runtime's task.
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}
