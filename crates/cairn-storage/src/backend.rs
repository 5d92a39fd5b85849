//! The storage contract, split by concern: what the journal, the engine and
//! the server need from a database, whatever the database is.
//!
//! Each concern is a trait of its own ([`EventLog`], [`Runs`],
//! [`Generations`], [`Leases`], [`ToolCalls`], [`Inbox`], [`Processes`],
//! [`Wakeups`]), so a reader sees what a part of Cairn touches from the
//! traits it names; [`Backend`] is all of them, the one thing a database
//! implements. Callers bring the traits into scope with
//! `use cairn_storage::prelude::*`.
//!
//! The methods of those traits are synchronous and may block on I/O: the
//! journal calls them from its writer thread. The reads that async code
//! makes while it serves people (a run's row, a page of runs, a run's
//! events, its last seq) are also futures, in [`AsyncReads`]: a backend
//! whose client is async answers them without holding a thread while the
//! database works, and one whose calls block runs them on tokio's blocking
//! pool itself, so the caller need not know which it has.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;

use cairn_events::{NodePath, RunCommand, RunId};

use crate::error::StoreError;
use crate::records::*;

/// The first 8 bytes of a digest in hex: enough to tell stores apart.
pub fn hex_prefix(digest: &[u8]) -> String {
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// One registration for wake-ups of a [`Topic`]; dropping it unregisters.
pub trait Listener: Send + Sync {
    /// Resolves at the next wake-up since the previous call (at once if one
    /// already came). A wake-up says "look again", nothing more: callers
    /// read the store for what changed, and poll slowly as a fallback.
    fn wait(&mut self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>>;
}

/// Exclusive ownership of a run across processes. Released when dropped, and
/// by the operating system when the owning process dies.
pub trait RunLease: Send + Sync {}

/// The runs' event logs: append-only, in seq order.
pub trait EventLog {
    /// Commits a batch of events, of one run or several, in one transaction:
    /// all of it or none. A `(run, seq)` already stored fails the batch with
    /// [`StoreError::BadRow`] naming the run. Sequencing is the journal's
    /// work; the backend keeps what it is given, byte for byte.
    ///
    /// It keeps each run row's `status`/`updated_ms` in step with the batch:
    /// `updated_ms` becomes the larger of itself and the run's latest event
    /// timestamp, and the run's last lifecycle event in the batch sets its
    /// status (`RunStarted` → running, `RunStatusChanged` → its status,
    /// `RunFinished`/`RunFailed`/`RunCancelled` → finished/failed/cancelled).
    /// Events of a run that has no row are stored all the same; no row is
    /// made for them.
    fn append(&self, batch: &[StoredEvent]) -> Result<(), StoreError>;
    /// A run's events in seq order, as the query selects them (every field
    /// applies; `limit` keeps the lowest seqs). An unknown run has none.
    fn read_events(&self, run_id: &RunId, q: &EventQuery) -> Result<Vec<StoredEvent>, StoreError>;
    /// The highest committed seq of a run (0 when it has none).
    fn last_seq(&self, run_id: &RunId) -> Result<u64, StoreError>;
    /// Moves whatever the database keeps beside its main file (SQLite's
    /// write-ahead log) into it, so that the store's data is where a copy of
    /// the store would look for it. Best effort and brief: it gives up rather
    /// than wait for another process's readers or writers. The journal calls
    /// it when it closes and when this process stops writing runs. A
    /// backend may leave a small log where it is, when moving it costs more
    /// than keeping it (SQLite's, under `cairn_sqlite::CHECKPOINT_FROM`).
    /// The default does nothing, for databases that need no such step.
    fn checkpoint(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

/// The runs' rows: what was started, with what, and where it stands.
pub trait Runs {
    /// Inserts a run row; `RunExists` if the id is taken.
    fn create_run(&self, rec: &RunRecord) -> Result<(), StoreError>;
    /// Starts a run: its row (`RunExists` if the id is taken), its pinned
    /// files and its first event, in one transaction, so that a crash or a
    /// refusal leaves either all of them or nothing. A run's start is one
    /// commit instead of three, which is most of a short run's writes. On a
    /// backend with leases the caller holds the run's lease (the event is
    /// fenced as an append is).
    fn start_run(&self, start: &NewRun<'_>) -> Result<(), StoreError>;
    /// A run's row, if it exists.
    fn get_run(&self, run_id: &RunId) -> Result<Option<RunRecord>, StoreError>;
    /// Runs matching the filter, newest first (by `created_ms`; of runs
    /// created in the same millisecond, the one created last comes first),
    /// `offset` skipped, at most `limit` kept.
    fn list_runs(&self, f: &RunFilter) -> Result<Vec<RunRecord>, StoreError>;
    /// Deletes finished, failed and cancelled runs last updated before
    /// `cutoff_ms` (their events, tool calls, inbox, process records,
    /// workflow generations and row) and returns their ids. A run whose lease is held (being resumed)
    /// is left alone.
    fn delete_finished_before(&self, cutoff_ms: i64) -> Result<Vec<RunId>, StoreError>;
}

/// The texts a run's reloads adopted, with the files they pinned.
pub trait Generations {
    /// Stores a generation of a run's workflow, replacing one with the same
    /// (run, generation): a generation written by a reload that a crash cut
    /// short before its `WorkflowReloaded` was committed is no generation
    /// of the run, and the next reload reuses its number. `RunNotFound` when
    /// the run has no row. Durable when it returns, since the reload's
    /// event follows it.
    fn put_generation(&self, rec: &GenerationRecord) -> Result<(), StoreError>;
    /// One generation of a run's workflow, if stored.
    fn generation(
        &self,
        run_id: &RunId,
        generation: u64,
    ) -> Result<Option<GenerationRecord>, StoreError>;
}

/// Who drives a run: one lease per run across processes and machines.
pub trait Leases {
    /// Takes the run's lease; `None` when another process (or another lease
    /// in this process) holds it. Dropping the lease, on any thread,
    /// releases it.
    fn try_lock_run(&self, run_id: &RunId) -> Result<Option<Box<dyn RunLease>>, StoreError>;
    /// Who holds the run's lease now, when the backend can tell: `None`
    /// when the lease is free, held by this backend, or would be taken at
    /// once by [`Leases::try_lock_run`] (its holder is known to be dead).
    /// For people deciding whether to wait; [`Leases::try_lock_run`] alone
    /// decides. The default tells nothing, which suits a lease the operating
    /// system drops when its holder dies (SQLite's lock): a held one
    /// belongs to a live process.
    fn lease_holder(&self, run_id: &RunId) -> Result<Option<LeaseHolder>, StoreError> {
        let _ = run_id;
        Ok(None)
    }
    /// The instance driving each of `runs` now, by name: every run of
    /// `runs` whose lease is held, by this backend too. Runs with no live
    /// lease are left out. For people (`cairn runs`, the API); one look at
    /// the store for the whole list.
    fn drivers(&self, runs: &[RunId]) -> Result<HashMap<RunId, String>, StoreError> {
        let _ = runs;
        Ok(HashMap::new())
    }
}

/// The rows of agents' tool calls, which tell a resume what already happened.
pub trait ToolCalls {
    /// Inserts or replaces a tool call, keyed by (run, node, iteration,
    /// attempt, tool_seq); `RunNotFound` when the run has no row.
    fn put_tool_call(&self, rec: &ToolCallRecord) -> Result<(), StoreError>;
    /// The tool calls of one node pass, by attempt then tool_seq.
    fn tool_calls(
        &self,
        run_id: &RunId,
        node_id: &NodePath,
        iteration: u32,
    ) -> Result<Vec<ToolCallRecord>, StoreError>;
}

/// Commands to runs (approve, answer, cancel, ...), kept until their run's
/// driver takes them.
pub trait Inbox {
    /// Records a command in the run's inbox durably and returns its id;
    /// `RunNotFound` for an unknown run.
    fn put_command(&self, run_id: &RunId, command: &RunCommand) -> Result<u64, StoreError>;
    /// The run's commands not yet taken, oldest first.
    fn pending_commands(&self, run_id: &RunId) -> Result<Vec<InboxEntry>, StoreError>;
    /// Marks a command taken, with what became of it (`applied`, or why it
    /// was refused). Taking one twice keeps the first outcome.
    fn take_command(&self, id: u64, outcome: &str) -> Result<(), StoreError>;
}

/// The process groups node attempts started, so a resume can kill what a
/// dead engine left running.
pub trait Processes {
    /// Records a process group a node attempt started; returns its id.
    fn put_process(&self, rec: &ProcessRecord) -> Result<u64, StoreError>;
    /// Forgets a process group that ended.
    fn remove_process(&self, id: u64) -> Result<(), StoreError>;
    /// The process groups recorded for a run and not forgotten.
    fn processes(&self, run_id: &RunId) -> Result<Vec<ProcessRecord>, StoreError>;
}

/// Wake-ups between processes: "look again", nothing more.
pub trait Wakeups {
    /// Wakes the listeners of a topic, in this process and others. Best
    /// effort: listeners also poll, slowly.
    fn notify(&self, topic: Topic<'_>);
    /// Wakes the listeners of each topic, as [`Wakeups::notify`] does one.
    /// A commit of a busy server touches a thousand runs; a backend can
    /// find their listeners at once rather than one lookup each.
    fn notify_all(&self, topics: &[Topic<'_>]) {
        for t in topics {
            self.notify(*t);
        }
    }
    /// [`Wakeups::notify`], returning once the wake-up has left this
    /// process: for a process about to exit, whose queued wake-ups would
    /// go with it. The default's wake-ups leave at once.
    fn notify_sent(&self, topic: Topic<'_>) {
        self.notify(topic);
    }
    /// Registers for wake-ups of a topic.
    fn listen(&self, topic: Topic<'_>) -> Result<Box<dyn Listener>, StoreError>;
}

/// What an [`AsyncReads`] method returns: a future that owns what it needs
/// (it does not borrow the backend or the arguments), to be awaited on a
/// tokio runtime.
pub type StoreFuture<T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'static>>;

/// The reads of async callers (the server's handlers, the engine's waits),
/// as futures. Each answers what its blocking twin in [`EventLog`] or
/// [`Runs`] answers, with the same errors; the conformance suite holds the
/// two together.
pub trait AsyncReads {
    /// [`EventLog::read_events`], awaited.
    fn read_events_async(&self, run_id: &RunId, q: &EventQuery) -> StoreFuture<Vec<StoredEvent>>;
    /// [`EventLog::last_seq`], awaited.
    fn last_seq_async(&self, run_id: &RunId) -> StoreFuture<u64>;
    /// [`Runs::get_run`], awaited.
    fn get_run_async(&self, run_id: &RunId) -> StoreFuture<Option<RunRecord>>;
    /// [`Runs::list_runs`], awaited.
    fn list_runs_async(&self, f: &RunFilter) -> StoreFuture<Vec<RunRecord>>;
}

/// A database that keeps Cairn's runs: every concern, and who the store is.
///
/// `cairn_storage::conformance` (feature `conformance`) checks an
/// implementation against what these docs promise.
pub trait Backend:
    EventLog
    + Runs
    + AsyncReads
    + Generations
    + Leases
    + ToolCalls
    + Inbox
    + Processes
    + Wakeups
    + Send
    + Sync
    + 'static
{
    /// Commits tool calls' rows ([`ToolCalls::put_tool_call`]) and a batch
    /// of events ([`EventLog::append`]) in one transaction: all of it or
    /// none. The journal's writer commits the rows an agent records beside
    /// the events queued with them, so that a thousand agents calling tools
    /// at once share a commit instead of taking a transaction each. The
    /// default writes the rows, then the batch, each alone.
    fn append_with_calls(
        &self,
        calls: &[ToolCallRecord],
        batch: &[StoredEvent],
    ) -> Result<(), StoreError> {
        for c in calls {
            self.put_tool_call(c)?;
        }
        self.append(batch)
    }
    /// A name for this store, the same in every process that opens it and
    /// different for another store: the engine marks the processes it
    /// starts with it, so that a resume kills only its own store's
    /// leftovers. The default hashes the first of [`Backend::files`] (its
    /// canonical path); a backend without files must say who it is.
    fn store_id(&self) -> String {
        use sha2::{Digest, Sha256};
        let first = self.files().into_iter().next().unwrap_or_default();
        let path = first.canonicalize().unwrap_or(first);
        hex_prefix(&Sha256::digest(path.as_os_str().as_encoded_bytes()))
    }
    /// Files and folders this backend keeps on the local disk (database,
    /// journals, locks, wake-up markers), so the engine can hide them from
    /// the processes it starts. A remote backend has none.
    fn files(&self) -> Vec<std::path::PathBuf> {
        Vec::new()
    }
    /// The models' budgets every process on this store shares, for a
    /// backend that many machines share (PostgreSQL); `None` where each
    /// process keeps its own (the default).
    fn model_budgets(&self) -> Option<&dyn ModelBudgets> {
        None
    }
    /// Runs as shared work that any instance of the store claims, for a
    /// backend that many machines share (PostgreSQL); `None` where the
    /// process that starts a run drives it (the default).
    fn claims(&self) -> Option<&dyn Claims> {
        None
    }
    /// Workspace snapshot objects kept in the store, for a backend that
    /// many machines share (PostgreSQL), so that a snapshot taken on one
    /// restores on another; `None` where the local snapshot repository is
    /// the only one (the default).
    fn snapshot_objects(&self) -> Option<&dyn SnapshotObjects> {
        None
    }
    /// The schedules of `cairn serve` (its triggers), where the backend
    /// keeps them; `None` for one that does not (the default).
    fn schedules(&self) -> Option<&dyn crate::Schedules> {
        None
    }
}

/// Workspace snapshot objects (git blobs and trees, named by the SHA-1 of
/// their kind, length and bytes) kept in the store beside the runs that
/// name them. An id names its bytes: writing one that is there changes
/// nothing, so any process may write any object.
pub trait SnapshotObjects: Send + Sync {
    /// Which of `ids` the store holds.
    fn objects_held(&self, ids: &[[u8; 20]]) -> Result<Vec<[u8; 20]>, StoreError>;
    /// Stores objects, leaving those it holds as they are.
    fn put_objects(&self, objects: &[StoredObject]) -> Result<(), StoreError>;
    /// The objects of `ids` the store holds.
    fn get_objects(&self, ids: &[[u8; 20]]) -> Result<Vec<StoredObject>, StoreError>;
    /// Deletes every object not in `live` stored before `before_ms` (Unix
    /// ms); returns the objects and bytes deleted and the objects kept.
    fn retain_objects(
        &self,
        live: &std::collections::HashSet<[u8; 20]>,
        before_ms: i64,
    ) -> Result<(u64, u64, u64), StoreError>;
}

/// A snapshot object as the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredObject {
    /// Its id.
    pub id: [u8; 20],
    /// `blob` or `tree`.
    pub kind: String,
    /// Its bytes, uncompressed.
    pub body: Vec<u8>,
}

/// Runs as work any instance of a shared store claims: a run is queued
/// (its row, no event), and each instance with room claims queued runs,
/// no more than its share while another has room. A claim is the run's
/// lease ([`Leases`]), so the fence guards it as any other.
///
/// An instance registers with its capacity and is seen live while its
/// backend runs (it stays registered until [`Claims::leave`], or until it
/// is no longer seen for a lease's ttl). Its load is the runs whose lease
/// it holds and that are not waiting for a person: a waiting run holds no
/// capacity.
pub trait Claims: Send + Sync {
    /// Writes a run as work to claim: its row, status
    /// [`crate::RecordStatus::Queued`], with its pinned files, in one
    /// transaction ([`StoreError::RunExists`] if the id is taken); then
    /// wakes the claimers ([`crate::Topic::Queued`]).
    fn queue_run(
        &self,
        rec: &crate::RunRecord,
        pinned: Option<&crate::GenerationRecord>,
    ) -> Result<(), StoreError>;
    /// Registers this backend's instance as a claimer with room for
    /// `capacity` runs at once (again: a new capacity).
    fn join(&self, capacity: usize) -> Result<(), StoreError>;
    /// Takes this instance out of the claimers (it stops).
    fn leave(&self) -> Result<(), StoreError>;
    /// Claims up to `max` claimable runs, oldest first: queued ones, and
    /// those not ended that nobody drives (their instance gave them back
    /// or died: a failover is a claim). As many as this
    /// instance's share allows, given the queue and the load and capacity
    /// of every live claimer, decided under one lock so that two claimers
    /// never judge the same picture. Each claimed run comes with its lease.
    fn claim(&self, max: usize) -> Result<Vec<Claimed>, StoreError>;
    /// Every live claimer with its capacity and load, and the claimable
    /// runs.
    fn fleet(&self) -> Result<Fleet, StoreError>;
}

/// A run claimed ([`Claims::claim`]), with its lease.
pub type Claimed = (RunId, Box<dyn RunLease>);

/// The claimers of a store, as [`Claims::fleet`] sees them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fleet {
    /// Every live claimer.
    pub instances: Vec<InstanceLoad>,
    /// Runs waiting for an instance: queued and not yet claimed, or not
    /// ended and driven by nobody.
    pub queued: u64,
}

/// One claimer of a store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceLoad {
    /// Its name (`--instance-name`).
    pub instance: String,
    /// Most runs it drives at once.
    pub capacity: u64,
    /// Runs it drives that are not waiting for a person.
    pub driving: u64,
    /// This backend's own instance.
    pub me: bool,
}

/// How many queued runs an instance may claim now, out of `queued`: its
/// fair share of the work (queued and driven) by capacity, never beyond
/// its room, and at least one while it is the least loaded claimer with
/// room (so that rounding never leaves work unclaimed). `instances` holds
/// every live claimer, this one marked [`InstanceLoad::me`].
pub fn fair_share(instances: &[InstanceLoad], queued: u64) -> u64 {
    let Some(me) = instances.iter().find(|i| i.me) else {
        return 0;
    };
    let room = me.capacity.saturating_sub(me.driving);
    if room == 0 || queued == 0 {
        return 0;
    }
    // Others that are full take nothing: the work is shared among the
    // claimers with room, by capacity.
    let open: Vec<&InstanceLoad> = instances
        .iter()
        .filter(|i| i.me || i.driving < i.capacity)
        .collect();
    let work: u64 = queued + open.iter().map(|i| i.driving).sum::<u64>();
    let capacity: u64 = open.iter().map(|i| i.capacity.max(1)).sum();
    let share = (work * me.capacity.max(1)).div_ceil(capacity.max(1));
    let mut take = share.saturating_sub(me.driving);
    let least = open
        .iter()
        .filter(|i| !i.me)
        .all(|i| i.driving >= me.driving);
    if take == 0 && least {
        take = 1;
    }
    take.min(room).min(queued)
}

/// The limits of one model that every process on a store shares: calls
/// in flight, calls begun and tokens used in the last minute. A call is a
/// row while it runs and for a minute after; a process that dies in a
/// call leaves its row until the call's lease runs out.
pub trait ModelBudgets: Send + Sync {
    /// Begins a call of about `estimate` tokens on the model `key` names,
    /// if `limits` allow it now: the call's id, else why and how long to
    /// wait (`None`: until another call ends). `lease` is how long the
    /// call may hold its place if its process dies.
    fn begin_call(
        &self,
        key: &str,
        limits: &BudgetLimits,
        estimate: u64,
        lease: std::time::Duration,
    ) -> Result<Result<u64, BudgetWait>, StoreError>;
    /// Ends a call, counting the tokens it really used.
    fn end_call(&self, id: u64, tokens: u64) -> Result<(), StoreError>;
}

/// A model's shared limits (`max_concurrency`, `requests_per_minute`,
/// `tokens_per_minute`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BudgetLimits {
    /// Most calls in flight at once.
    pub max_concurrency: Option<u32>,
    /// Most calls begun in any minute.
    pub requests_per_minute: Option<u32>,
    /// Most tokens in any minute.
    pub tokens_per_minute: Option<u64>,
}

/// Why a call may not begin yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetWait {
    /// `concurrency`, `requests_per_minute` or `tokens_per_minute`.
    pub reason: &'static str,
    /// How long until the limit lets a call through, when known.
    pub wait: Option<std::time::Duration>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inst(me: bool, capacity: u64, driving: u64) -> InstanceLoad {
        InstanceLoad {
            instance: String::new(),
            capacity,
            driving,
            me,
        }
    }

    #[test]
    fn a_claimer_takes_its_share_and_no_more() {
        // Three equal instances, 300 runs queued: a third each.
        let idle = [
            inst(true, 1000, 0),
            inst(false, 1000, 0),
            inst(false, 1000, 0),
        ];
        assert_eq!(fair_share(&idle, 300), 100);
        // The first took its third: it takes nothing more while the others
        // have room and nothing.
        let mine = [
            inst(true, 1000, 100),
            inst(false, 1000, 0),
            inst(false, 1000, 0),
        ];
        assert_eq!(fair_share(&mine, 200), 0);
        // ... but the second takes its part.
        let second = [
            inst(false, 1000, 100),
            inst(true, 1000, 0),
            inst(false, 1000, 0),
        ];
        assert_eq!(fair_share(&second, 200), 100);
        // Alone, it takes what its room allows.
        assert_eq!(fair_share(&[inst(true, 10, 4)], 300), 6);
        // Others full: the work is this one's.
        let full = [inst(true, 100, 0), inst(false, 5, 5)];
        assert_eq!(fair_share(&full, 50), 50);
        // Twice the capacity, twice the share.
        let big = [inst(true, 20, 0), inst(false, 10, 0)];
        assert_eq!(fair_share(&big, 30), 20);
        // Rounding never leaves a run behind: the least loaded takes it.
        let one = [inst(true, 10, 1), inst(false, 10, 1), inst(false, 10, 1)];
        assert_eq!(fair_share(&one, 1), 1);
        let busier = [inst(true, 10, 2), inst(false, 10, 1)];
        assert_eq!(fair_share(&busier, 1), 0);
        // No room, no queue, not registered: nothing.
        assert_eq!(fair_share(&[inst(true, 3, 3)], 9), 0);
        assert_eq!(fair_share(&idle, 0), 0);
        assert_eq!(fair_share(&[inst(false, 3, 0)], 9), 0);
    }
}
