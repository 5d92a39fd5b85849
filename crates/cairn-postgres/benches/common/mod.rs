//! What the PostgreSQL benches share: a backend that counts what the
//! journal asks of the store.
#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use cairn_events::{NodePath, RunCommand, RunId};
use cairn_store::prelude::*;
use cairn_store::{
    EventQuery, InboxEntry, Listener, NewRun, ProcessRecord, RunFilter, RunLease, RunRecord,
    StoreError, StoreFuture, StoredEvent, ToolCallRecord, Topic,
};

/// A pass-through backend that counts what the journal asks of the store:
/// the batches its writer commits, their events and the time `append`
/// takes; the reads subscriptions make and their time (waiting for a pooled
/// connection included). If asked, it drops the wake-ups the writer sends
/// after each commit (a NOTIFY on PostgreSQL), to see what they cost.
pub struct Counting {
    pub inner: Arc<dyn Backend>,
    pub batches: AtomicU64,
    pub events: AtomicU64,
    pub append_ns: AtomicU64,
    pub reads: AtomicU64,
    pub last_seqs: AtomicU64,
    pub read_ns: Arc<AtomicU64>,
    pub mute: bool,
}

impl Counting {
    pub fn new(inner: Arc<dyn Backend>) -> Counting {
        Counting {
            inner,
            batches: AtomicU64::new(0),
            events: AtomicU64::new(0),
            append_ns: AtomicU64::new(0),
            reads: AtomicU64::new(0),
            last_seqs: AtomicU64::new(0),
            read_ns: Arc::new(AtomicU64::new(0)),
            mute: false,
        }
    }

    fn timed_async<T: Send + 'static>(&self, fut: StoreFuture<T>) -> StoreFuture<T> {
        let read_ns = Arc::clone(&self.read_ns);
        Box::pin(async move {
            let t = Instant::now();
            let out = fut.await;
            read_ns.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
            out
        })
    }

    fn timed<T>(&self, f: impl FnOnce() -> T) -> T {
        let t = Instant::now();
        let out = f();
        self.read_ns
            .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        out
    }
}

impl EventLog for Counting {
    fn append(&self, batch: &[StoredEvent]) -> Result<(), StoreError> {
        let t = Instant::now();
        let r = self.inner.append(batch);
        self.append_ns
            .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.events.fetch_add(batch.len() as u64, Ordering::Relaxed);
        r
    }

    fn read_events(&self, run_id: &RunId, q: &EventQuery) -> Result<Vec<StoredEvent>, StoreError> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.timed(|| self.inner.read_events(run_id, q))
    }

    fn last_seq(&self, run_id: &RunId) -> Result<u64, StoreError> {
        self.last_seqs.fetch_add(1, Ordering::Relaxed);
        self.timed(|| self.inner.last_seq(run_id))
    }

    fn checkpoint(&self) -> Result<(), StoreError> {
        self.inner.checkpoint()
    }
}

impl Runs for Counting {
    fn create_run(&self, rec: &RunRecord) -> Result<(), StoreError> {
        self.inner.create_run(rec)
    }

    fn start_run(&self, start: &NewRun<'_>) -> Result<(), StoreError> {
        let t = Instant::now();
        let r = self.inner.start_run(start);
        self.append_ns
            .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.events.fetch_add(1, Ordering::Relaxed);
        r
    }

    fn get_run(&self, run_id: &RunId) -> Result<Option<RunRecord>, StoreError> {
        self.inner.get_run(run_id)
    }

    fn list_runs(&self, f: &RunFilter) -> Result<Vec<RunRecord>, StoreError> {
        self.inner.list_runs(f)
    }

    fn delete_finished_before(&self, cutoff_ms: i64) -> Result<Vec<RunId>, StoreError> {
        self.inner.delete_finished_before(cutoff_ms)
    }
}

impl Generations for Counting {
    fn put_generation(&self, rec: &cairn_store::GenerationRecord) -> Result<(), StoreError> {
        self.inner.put_generation(rec)
    }

    fn generation(
        &self,
        run_id: &RunId,
        generation: u64,
    ) -> Result<Option<cairn_store::GenerationRecord>, StoreError> {
        self.inner.generation(run_id, generation)
    }
}

impl Leases for Counting {
    fn try_lock_run(&self, run_id: &RunId) -> Result<Option<Box<dyn RunLease>>, StoreError> {
        self.inner.try_lock_run(run_id)
    }
}

impl ToolCalls for Counting {
    fn put_tool_call(&self, rec: &ToolCallRecord) -> Result<(), StoreError> {
        self.inner.put_tool_call(rec)
    }

    fn tool_calls(
        &self,
        run_id: &RunId,
        node_id: &NodePath,
        iteration: u32,
    ) -> Result<Vec<ToolCallRecord>, StoreError> {
        self.inner.tool_calls(run_id, node_id, iteration)
    }
}

impl Inbox for Counting {
    fn put_command(&self, run_id: &RunId, command: &RunCommand) -> Result<u64, StoreError> {
        self.inner.put_command(run_id, command)
    }

    fn pending_commands(&self, run_id: &RunId) -> Result<Vec<InboxEntry>, StoreError> {
        self.inner.pending_commands(run_id)
    }

    fn take_command(&self, id: u64, outcome: &str) -> Result<(), StoreError> {
        self.inner.take_command(id, outcome)
    }
}

impl Processes for Counting {
    fn put_process(&self, rec: &ProcessRecord) -> Result<u64, StoreError> {
        self.inner.put_process(rec)
    }

    fn remove_process(&self, id: u64) -> Result<(), StoreError> {
        self.inner.remove_process(id)
    }

    fn processes(&self, run_id: &RunId) -> Result<Vec<ProcessRecord>, StoreError> {
        self.inner.processes(run_id)
    }
}

impl Wakeups for Counting {
    fn notify(&self, topic: Topic<'_>) {
        if !self.mute {
            self.inner.notify(topic)
        }
    }

    fn listen(&self, topic: Topic<'_>) -> Result<Box<dyn Listener>, StoreError> {
        self.inner.listen(topic)
    }
}

/// The journal's subscriptions read through these: counted and timed like
/// the blocking reads.
impl AsyncReads for Counting {
    fn read_events_async(&self, run_id: &RunId, q: &EventQuery) -> StoreFuture<Vec<StoredEvent>> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.timed_async(self.inner.read_events_async(run_id, q))
    }

    fn last_seq_async(&self, run_id: &RunId) -> StoreFuture<u64> {
        self.last_seqs.fetch_add(1, Ordering::Relaxed);
        self.timed_async(self.inner.last_seq_async(run_id))
    }

    fn get_run_async(&self, run_id: &RunId) -> StoreFuture<Option<RunRecord>> {
        self.inner.get_run_async(run_id)
    }

    fn list_runs_async(&self, f: &RunFilter) -> StoreFuture<Vec<RunRecord>> {
        self.inner.list_runs_async(f)
    }
}

impl Backend for Counting {
    fn files(&self) -> Vec<std::path::PathBuf> {
        self.inner.files()
    }

    fn store_id(&self) -> String {
        self.inner.store_id()
    }
}
