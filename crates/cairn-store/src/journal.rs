//! The journal: per-run sequencers, the group-committing writer thread, the
//! NDJSON mirror and live fan-out.
//!
//! An event's way through: [`RunLog::append`] stamps and sequences it under
//! the run's lock and queues it for the writer thread. The writer takes
//! everything queued (up to [`MAX_BATCH`]), commits it in one transaction,
//! appends the lines to the NDJSON mirror, publishes them to live
//! subscribers and only then advances the run's committed seq, which
//! [`RunLog::append_durable`] and [`RunLog::sync`] wait for. So whatever a
//! subscriber or a waiter sees is already in the store.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use cairn_events::{Event, EventKind, RunId, Scope};
use tokio::sync::{broadcast, watch};

use crate::mirror::{Mirrors, WrapWriter};
use cairn_sqlite::SqliteBackend;
use cairn_storage::prelude::*;
use cairn_storage::{
    EventQuery, GenerationRecord, NewRun, RunLease, RunRecord, StoreError, StoredEvent,
    ToolCallRecord, Topic,
};

/// Most events one transaction commits; more wait for the next one.
const MAX_BATCH: usize = 4096;
/// Live events a run's channel keeps for subscribers that are behind. A
/// subscriber further behind reads the store from its last seq instead (the
/// writer publishes only what is committed), so this bounds memory, not
/// what a subscriber sees. Every run written or watched in this process has
/// one, allocated whole: at 16,384 slots a run's channel took 650 KB, and a
/// server with a thousand runs under way held 650 MB in them.
const LIVE_CAPACITY: usize = 256;
/// Capacity of the all-runs feed for dashboards. Its slots are allocated
/// whole (about 640 KB, a fifth of the pages a short `cairn run` touches),
/// so the feed is made when the first dashboard subscribes.
const ALL_CAPACITY: usize = 16 * 1024;

/// The all-runs feed, made by its first subscriber: until then nobody would
/// receive what it carries.
type AllFeed = Arc<std::sync::OnceLock<broadcast::Sender<Arc<StoredEvent>>>>;
/// How often a subscription looks at the store for runs written in this
/// process (a safety net: the writer's live feed wakes it).
const POLL_INTERVAL: Duration = Duration::from_millis(100);
/// How often a subscription to a run written by another process looks at
/// the store when no wake-up came: wake-ups are best effort.
const REMOTE_POLL_INTERVAL: Duration = Duration::from_secs(1);
/// Events a subscription reads from the store at a time.
const PAGE: usize = 1000;

/// How a journal mirrors events to files.
#[derive(Debug, Clone, Default)]
pub struct JournalOptions {
    /// Where `<runId>/events.ndjson` mirrors go; `None` disables the mirror
    /// (`--no-log`).
    pub log_dir: Option<PathBuf>,
}

/// Why the events after the committed seq will not be committed.
#[derive(Debug, Clone)]
enum Failure {
    Commit(Arc<str>),
    Closed,
}

impl Failure {
    fn to_error(&self) -> StoreError {
        match self {
            Failure::Commit(m) => StoreError::Commit(m.clone()),
            Failure::Closed => StoreError::Closed,
        }
    }
}

/// Where a run's committed log stands.
#[derive(Debug, Clone, Default)]
struct Committed {
    seq: u64,
    /// Set when events past `seq` were lost; later events of the run are
    /// refused so the log keeps no gap.
    failure: Option<Failure>,
}

/// What this process shares about one run: its live feed and how far its
/// log is committed. Lives while a `RunLog` or a subscription needs it.
struct RunShared {
    live: broadcast::Sender<Arc<StoredEvent>>,
    /// `RunLog`s of this run in this process (0 or 1; the lease sees to it).
    owners: AtomicUsize,
    committed: watch::Sender<Committed>,
    /// Wakes `sync_blocking` waiters; paired with the watch.
    cv_lock: Mutex<()>,
    cv: Condvar,
    /// A task of this process reads the run's new events from the store at
    /// each wake-up and publishes them on `live`, for the subscriptions to
    /// a run written by another process (see [`remote_reader`]).
    reader: AtomicBool,
}

impl RunShared {
    fn new() -> Self {
        RunShared {
            live: broadcast::channel(LIVE_CAPACITY).0,
            owners: AtomicUsize::new(0),
            committed: watch::channel(Committed::default()).0,
            cv_lock: Mutex::new(()),
            cv: Condvar::new(),
            reader: AtomicBool::new(false),
        }
    }

    fn update(&self, f: impl FnOnce(&mut Committed)) {
        self.committed.send_modify(f);
        let _g = self.cv_lock.lock().unwrap_or_else(|p| p.into_inner());
        self.cv.notify_all();
    }

    /// Ok when `seq` is committed, the failure when it never will be, None
    /// while it may still be.
    fn check(&self, seq: u64) -> Option<Result<(), StoreError>> {
        let c = self.committed.borrow();
        if c.seq >= seq {
            Some(Ok(()))
        } else {
            c.failure.as_ref().map(|f| Err(f.to_error()))
        }
    }
}

enum Msg {
    Event(StoredEvent, Arc<RunShared>),
    /// A tool call's row, committed with the events queued beside it
    /// ([`RunLog::record_tool_call`]).
    Call(Box<ToolCallRecord>, Arc<RunShared>),
    /// A run's first event, committed already with the run's row
    /// ([`Journal::start_run`]): to be mirrored and published only.
    Started(StoredEvent, Arc<RunShared>),
    /// The run's `RunLog` was dropped: release its lease once everything
    /// queued before is committed, so no other process reads a stale last seq.
    Release(Box<dyn RunLease>, Arc<RunShared>, RunId),
    /// [`Journal::settle`]: answered once everything queued before it is
    /// committed and every lease queued for release is released.
    Settle(std::sync::mpsc::Sender<()>),
    Stop,
}

/// The runs this process writes or watches, by id: shared by the journal
/// and its writer thread, which each forget a run when they let go of it
/// last.
#[derive(Default)]
struct Runs(Mutex<HashMap<RunId, Arc<RunShared>>>);

impl Runs {
    fn shared(&self, run_id: &RunId) -> Arc<RunShared> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(run_id.clone())
            .or_insert_with(|| Arc::new(RunShared::new()))
            .clone()
    }

    /// Forgets a run nobody in this process writes or watches any more.
    /// Whoever lets go of a run's state calls this after dropping its own
    /// reference, so the last one to let go finds only the registry's.
    fn maybe_forget(&self, run_id: &str) {
        let mut runs = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = runs.get(run_id) {
            // The registry holds one reference; anything else is a RunLog,
            // a subscription or a queued message.
            if Arc::strong_count(s) == 1
                && s.owners.load(Ordering::SeqCst) == 0
                && s.live.receiver_count() == 0
            {
                runs.remove(run_id);
            }
        }
    }

    fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

struct Inner {
    backend: Arc<dyn Backend>,
    tx: Mutex<Option<mpsc::Sender<Msg>>>,
    writer: Mutex<Option<JoinHandle<()>>>,
    runs: Arc<Runs>,
    all: AllFeed,
    /// Set by the writer when it stops committing.
    closed: Arc<AtomicBool>,
    /// `RunLog`s alive in this process, of every run; the writer checkpoints
    /// the store when the last one goes.
    logs: Arc<AtomicUsize>,
    /// Where the NDJSON mirrors go, if anywhere.
    log_dir: Option<PathBuf>,
}

impl Inner {
    fn shared(&self, run_id: &RunId) -> Arc<RunShared> {
        self.runs.shared(run_id)
    }

    fn maybe_forget(&self, run_id: &str) {
        self.runs.maybe_forget(run_id)
    }
}

/// The store as the engine, CLI and server use it: sequencers, the writer
/// thread, the NDJSON mirror and subscriptions over one [`Backend`].
/// Cheap to clone.
#[derive(Clone)]
pub struct Journal {
    inner: Arc<Inner>,
}

impl Journal {
    /// Starts a journal (and its writer thread) over a backend. The writer
    /// holds no database lock while idle, so other processes can read and
    /// write the same store meanwhile.
    pub fn open(backend: Arc<dyn Backend>, opts: JournalOptions) -> Result<Journal, StoreError> {
        Journal::start(backend, opts, None)
    }

    /// Like [`Journal::open`], with every append to an NDJSON mirror going
    /// through `wrap(file)`. A mirror write that fails part-way (a full disk)
    /// is repaired from the store on the run's next write; this is how a test
    /// makes one fail. Repairs themselves write to the file directly.
    pub fn open_with_mirror_writer(
        backend: Arc<dyn Backend>,
        opts: JournalOptions,
        wrap: impl Fn(File) -> Box<dyn Write + Send> + Send + Sync + 'static,
    ) -> Result<Journal, StoreError> {
        Journal::start(backend, opts, Some(Arc::new(wrap)))
    }

    fn start(
        backend: Arc<dyn Backend>,
        opts: JournalOptions,
        wrap: Option<WrapWriter>,
    ) -> Result<Journal, StoreError> {
        let (tx, rx) = mpsc::channel();
        let all = AllFeed::default();
        let closed = Arc::new(AtomicBool::new(false));
        let logs = Arc::new(AtomicUsize::new(0));
        let runs = Arc::new(Runs::default());
        let inner = Arc::new(Inner {
            logs: logs.clone(),
            backend: backend.clone(),
            tx: Mutex::new(Some(tx)),
            writer: Mutex::new(None),
            runs: runs.clone(),
            all: all.clone(),
            closed: closed.clone(),
            log_dir: opts.log_dir.clone(),
        });
        let writer = Writer {
            backend,
            runs,
            all,
            closed,
            logs,
            mirrors: opts.log_dir.map(|d| Mirrors::new(d, wrap)),
        };
        let handle = std::thread::Builder::new()
            .name("cairn-store-writer".into())
            .spawn(move || writer.run(rx))
            .map_err(|e| StoreError::io("cairn-store-writer thread", e))?;
        *inner.writer.lock().unwrap() = Some(handle);
        Ok(Journal { inner })
    }

    /// Opens the SQLite store at `path` and starts a journal over it.
    pub fn open_sqlite(path: &Path, opts: JournalOptions) -> Result<Journal, StoreError> {
        let backend = SqliteBackend::open(path)?;
        Journal::open(Arc::new(backend), opts)
    }

    /// The backend, for run rows, controls and tool calls.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.inner.backend
    }

    /// Files and folders of the store and its NDJSON mirrors: what the
    /// processes a run starts must never see, even inside their sandbox.
    pub fn files(&self) -> Vec<PathBuf> {
        let mut files = self.inner.backend.files();
        files.extend(self.inner.log_dir.iter().cloned());
        files
    }

    /// Where the NDJSON mirrors go, if anywhere.
    pub fn log_dir(&self) -> Option<&Path> {
        self.inner.log_dir.as_deref()
    }

    /// Takes the run's lease ([`StoreError::LeaseHeld`] if another process or
    /// another `RunLog` here holds it) and returns its sequencer, continuing
    /// from the store's last seq. The lease is released when the `RunLog` is
    /// dropped, after its queued events are committed.
    pub fn run_log(&self, run_id: &RunId) -> Result<RunLog, StoreError> {
        let (tx, lease) = self.take_run(run_id)?;
        let last = self.inner.backend.last_seq(run_id)?;
        Ok(self.log_after(run_id.clone(), tx, lease, last, 0, None))
    }

    /// The sequencer of a run whose lease is taken already (a claim,
    /// [`cairn_storage::Claims::claim`]), continuing from the store's last
    /// seq. The lease goes as [`Journal::run_log`]'s does.
    pub fn claimed_log(
        &self,
        run_id: &RunId,
        lease: Box<dyn RunLease>,
    ) -> Result<RunLog, StoreError> {
        let tx = self.writer()?;
        let last = self.inner.backend.last_seq(run_id)?;
        Ok(self.log_after(run_id.clone(), tx, lease, last, 0, None))
    }

    /// Starts a new run: takes its lease, then writes its row, its pinned
    /// files and its first event (`first`, stamped now, seq 1 after a row
    /// made here) in one transaction ([`Runs::start_run`]), and returns its
    /// sequencer with the event, durable. A refusal (`RunExists`, a full
    /// disk) leaves nothing behind, not even the lease. `observer` becomes
    /// the log's callback (see [`RunLog::set_observer`]) and sees the first
    /// event too.
    ///
    /// One commit, made on the caller's thread, where the row, the store's
    /// last seq and an append through the writer made three round trips:
    /// most of what a short run wrote.
    pub fn start_run(&self, start: RunStart) -> Result<(RunLog, Event), StoreError> {
        let run_id = start.run_id;
        let (tx, lease) = self.take_run(&run_id)?;
        let backend = &self.inner.backend;
        // A row that exists already (a child a crash left without its first
        // event) may, in principle, have events: continue after them.
        let last = match start.record {
            Some(_) => 0,
            None => backend.last_seq(&run_id)?,
        };
        let ev = Event {
            run_id: run_id.clone(),
            seq: cairn_events::Seq(last + 1),
            timestamp_ms: now_ms(),
            scope: start.scope,
            kind: start.first,
        };
        let stored = StoredEvent::from_event(&ev);
        backend.start_run(&NewRun {
            record: start.record.as_ref(),
            pinned: start.pinned.as_ref(),
            first: &stored,
        })?;
        let log = self.log_after(
            run_id,
            tx,
            lease,
            ev.seq.get(),
            ev.timestamp_ms,
            start.observer,
        );
        // The writer mirrors and publishes it before anything appended
        // later: the queue is in order.
        if log
            .tx
            .send(Msg::Started(stored, log.shared().clone()))
            .is_err()
        {
            log.shared().update(|c| {
                c.failure.get_or_insert(Failure::Closed);
            });
        }
        if let Some(obs) = &log.lock().observer {
            obs(&ev);
        }
        Ok((log, ev))
    }

    /// The writer's queue and the run's lease ([`StoreError::LeaseHeld`]
    /// when another process, or another `RunLog` here, holds it): what
    /// every `RunLog` holds.
    fn take_run(
        &self,
        run_id: &RunId,
    ) -> Result<(mpsc::Sender<Msg>, Box<dyn RunLease>), StoreError> {
        let tx = self.writer()?;
        let lease =
            self.inner
                .backend
                .try_lock_run(run_id)?
                .ok_or_else(|| StoreError::LeaseHeld {
                    run: run_id.to_string(),
                })?;
        Ok((tx, lease))
    }

    /// The writer's queue; [`StoreError::Closed`] once the journal is.
    fn writer(&self) -> Result<mpsc::Sender<Msg>, StoreError> {
        self.inner
            .tx
            .lock()
            .unwrap()
            .clone()
            .ok_or(StoreError::Closed)
    }

    /// A run's log over its lease, whose events up to `last` (the latest
    /// stamped `last_ts`) are committed.
    fn log_after(
        &self,
        run_id: RunId,
        tx: mpsc::Sender<Msg>,
        lease: Box<dyn RunLease>,
        last: u64,
        last_ts: i64,
        observer: Option<Observer>,
    ) -> RunLog {
        let shared = self.inner.shared(&run_id);
        shared.owners.fetch_add(1, Ordering::SeqCst);
        self.inner.logs.fetch_add(1, Ordering::SeqCst);
        shared.update(|c| {
            *c = Committed {
                seq: last,
                failure: None,
            }
        });
        RunLog {
            run_id,
            inner: self.inner.clone(),
            shared: Some(shared),
            tx,
            lease: Mutex::new(Some(lease)),
            seq: Mutex::new(Sequencer {
                last_seq: last,
                last_ts,
                observer,
                redactor: Default::default(),
            }),
        }
    }

    /// Events of a run after `after`: first from the store, then live, with
    /// no gap or duplicate at the switch-over (guarantee 3). Live events come
    /// straight from this process's writer when the run is written here;
    /// otherwise the subscription polls the store every ~100 ms.
    pub fn subscribe(&self, run_id: &RunId, after: u64) -> Result<Subscription, StoreError> {
        let shared = self.inner.shared(run_id);
        // Register for live events before reading the store: anything
        // committed from here on is either in the first read or in `rx`.
        let rx = shared.live.subscribe();
        let backend = &self.inner.backend;
        let mut buffer = VecDeque::new();
        let mut after_terminal = false;
        let caught_up;
        if after > 0 {
            let q = EventQuery {
                after: after - 1,
                limit: Some(PAGE + 1),
                ..Default::default()
            };
            let mut page = backend.read_events(run_id, &q)?;
            caught_up = page.len() < PAGE + 1;
            if page.first().is_some_and(|e| e.seq == after) {
                after_terminal = page.remove(0).is_terminal();
            }
            buffer.extend(page.into_iter().map(Arc::new));
        } else {
            let q = EventQuery {
                limit: Some(PAGE),
                ..Default::default()
            };
            let page = backend.read_events(run_id, &q)?;
            caught_up = page.len() < PAGE;
            buffer.extend(page.into_iter().map(Arc::new));
        }
        Ok(Subscription {
            inner: self.inner.clone(),
            run_id: run_id.clone(),
            shared: Some(shared),
            rx,
            buffer,
            last: after,
            last_terminal: after_terminal,
            caught_up,
            stop_at_terminal: true,
            done: false,
            end_checked: false,
        })
    }

    /// A subscription to a run that this process is about to start with
    /// [`Journal::start_run`], from its first event. Its log is empty until
    /// then, so, unlike [`Journal::subscribe`], nothing is read from the
    /// store: every event comes live. (Should the id turn out to be taken,
    /// the start is refused and the subscription has nothing to give.)
    pub fn subscribe_to_new(&self, run_id: &RunId) -> Subscription {
        let shared = self.inner.shared(run_id);
        let rx = shared.live.subscribe();
        Subscription {
            inner: self.inner.clone(),
            run_id: run_id.clone(),
            shared: Some(shared),
            rx,
            buffer: VecDeque::new(),
            last: 0,
            last_terminal: false,
            caught_up: true,
            stop_at_terminal: true,
            done: false,
            end_checked: false,
        }
    }

    /// How many runs this process keeps state for (a live channel, the
    /// committed seq): those with a `RunLog` or a subscription here, or
    /// whose release the writer has not reached yet. For tests that check
    /// a long-lived process forgets finished runs.
    #[doc(hidden)]
    pub fn runs_in_memory(&self) -> usize {
        self.inner.runs.len()
    }

    /// Every event committed by this process from now on, of every run, for
    /// dashboards. A receiver that falls behind gets `Lagged` from tokio.
    pub fn subscribe_all(&self) -> broadcast::Receiver<Arc<StoredEvent>> {
        self.inner
            .all
            .get_or_init(|| broadcast::channel(ALL_CAPACITY).0)
            .subscribe()
    }

    /// Rewrites `<log_dir>/<run>/events.ndjson` from the store (a temporary
    /// file renamed over the old one) and returns its path. Meant for runs
    /// not being written by this process: the writer keeps its own handle on
    /// the file it appends to.
    pub fn export(&self, run_id: &RunId, log_dir: &Path) -> Result<PathBuf, StoreError> {
        let backend = &self.inner.backend;
        if backend.get_run(run_id)?.is_none() && backend.last_seq(run_id)? == 0 {
            return Err(StoreError::RunNotFound(run_id.to_string()));
        }
        let dir = log_dir.join(run_id.as_str());
        std::fs::create_dir_all(&dir).map_err(|e| StoreError::io(&dir, e))?;
        let path = dir.join("events.ndjson");
        let tmp = dir.join(format!("events.ndjson.tmp-{}", std::process::id()));
        let write = || -> Result<(), StoreError> {
            let file = File::create(&tmp).map_err(|e| StoreError::io(&tmp, e))?;
            let mut out = std::io::BufWriter::new(file);
            let mut q = EventQuery {
                limit: Some(PAGE * 10),
                ..Default::default()
            };
            loop {
                let page = backend.read_events(run_id, &q)?;
                for ev in &page {
                    out.write_all(ev.json.as_bytes())
                        .and_then(|_| out.write_all(b"\n"))
                        .map_err(|e| StoreError::io(&tmp, e))?;
                }
                match page.last() {
                    Some(l) if page.len() == PAGE * 10 => q.after = l.seq,
                    _ => break,
                }
            }
            let file = out
                .into_inner()
                .map_err(|e| StoreError::io(&tmp, e.into_error()))?;
            file.sync_all().map_err(|e| StoreError::io(&tmp, e))?;
            std::fs::rename(&tmp, &path).map_err(|e| StoreError::io(&path, e))
        };
        let r = write();
        if r.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        r.map(|_| path)
    }

    /// How many `RunLog`s of this journal hold their run's lease: those
    /// alive, and those dropped whose lease the writer has not given back
    /// yet.
    pub fn held_runs(&self) -> usize {
        self.inner.logs.load(Ordering::SeqCst)
    }

    /// Waits until everything appended so far is committed and the leases
    /// of every dropped `RunLog` are given back: what another process sees
    /// of this one's runs once this returns. Blocks; returns at once when
    /// the journal is closed.
    pub fn settle(&self) {
        let (done, wait) = std::sync::mpsc::channel();
        let sent = match &*self.inner.tx.lock().unwrap() {
            Some(tx) => tx.send(Msg::Settle(done)).is_ok(),
            None => false,
        };
        if sent {
            let _ = wait.recv();
        }
    }

    /// Waits until everything appended so far is committed, then stops the
    /// writer. Appends after this are refused (their waiters get
    /// [`StoreError::Closed`]). Call it before the process exits: events
    /// still queued when the process ends are lost.
    pub fn close(&self) {
        let tx = self.inner.tx.lock().unwrap().take();
        if let Some(tx) = tx {
            let _ = tx.send(Msg::Stop);
        }
        let handle = self.inner.writer.lock().unwrap().take();
        if let Some(h) = handle {
            if h.join().is_err() {
                tracing::error!("the store's writer thread panicked");
            }
        }
    }
}

/// The writer thread's state.
struct Writer {
    backend: Arc<dyn Backend>,
    /// The journal's registry of runs: a released run is forgotten here.
    runs: Arc<Runs>,
    all: AllFeed,
    closed: Arc<AtomicBool>,
    logs: Arc<AtomicUsize>,
    /// The NDJSON mirrors, unless disabled.
    mirrors: Option<Mirrors>,
}

impl Writer {
    fn run(mut self, rx: mpsc::Receiver<Msg>) {
        let mut stopping = false;
        while let Ok(first) = rx.recv() {
            let mut pending = Pending::default();
            let mut releases = Vec::new();
            let mut msg = Some(first);
            loop {
                match msg.take() {
                    Some(Msg::Event(e, s)) => pending.events.push((e, s)),
                    Some(Msg::Call(c, s)) => pending.calls.push((*c, s)),
                    Some(Msg::Started(e, s)) => {
                        // What was queued before it is committed and
                        // published first, so every feed keeps commit order.
                        self.commit(std::mem::take(&mut pending));
                        self.publish(vec![e], vec![s]);
                    }
                    Some(Msg::Release(l, s, r)) => releases.push((l, s, r)),
                    Some(Msg::Settle(done)) => {
                        self.commit(std::mem::take(&mut pending));
                        self.release(std::mem::take(&mut releases));
                        let _ = done.send(());
                    }
                    Some(Msg::Stop) => stopping = true,
                    None => {}
                }
                if pending.len() >= MAX_BATCH {
                    break;
                }
                match rx.try_recv() {
                    Ok(m) => msg = Some(m),
                    Err(_) => break,
                }
            }
            self.commit(pending);
            self.release(releases);
            if stopping {
                // Take what was queued before the stop too, then end.
                let rest: Vec<Msg> = rx.try_iter().collect();
                let mut pending = Pending::default();
                let mut releases = Vec::new();
                for m in rest {
                    match m {
                        Msg::Event(e, s) => pending.events.push((e, s)),
                        Msg::Call(c, s) => pending.calls.push((*c, s)),
                        Msg::Started(e, s) => {
                            self.commit(std::mem::take(&mut pending));
                            self.publish(vec![e], vec![s]);
                        }
                        Msg::Release(l, s, r) => releases.push((l, s, r)),
                        Msg::Settle(done) => {
                            self.commit(std::mem::take(&mut pending));
                            self.release(std::mem::take(&mut releases));
                            let _ = done.send(());
                        }
                        Msg::Stop => {}
                    }
                    if pending.len() >= MAX_BATCH {
                        self.commit(std::mem::take(&mut pending));
                    }
                }
                self.commit(pending);
                self.release(releases);
                if let Some(m) = &mut self.mirrors {
                    m.close_all(&*self.backend);
                }
                self.checkpoint();
                break;
            }
        }
        // From here on nothing is committed. Appenders check this flag after
        // queueing, so an event that slips in now still fails its waiters
        // instead of leaving them waiting.
        self.closed.store(true, Ordering::SeqCst);
        for m in rx.try_iter() {
            match m {
                Msg::Event(_, s) | Msg::Call(_, s) => s.update(|c| {
                    c.failure.get_or_insert(Failure::Closed);
                }),
                // Committed already; only its mirror line and live
                // subscribers miss it, and they read the store.
                Msg::Started(..) => {}
                Msg::Release(l, s, run_id) => {
                    drop(l);
                    s.owners.fetch_sub(1, Ordering::SeqCst);
                    self.logs.fetch_sub(1, Ordering::SeqCst);
                    drop(s);
                    self.runs.maybe_forget(&run_id);
                }
                Msg::Settle(done) => {
                    let _ = done.send(());
                }
                Msg::Stop => {}
            }
        }
    }

    /// Gives back the leases of dropped `RunLog`s (everything they queued is
    /// committed by now). When they were this process's last, the store is
    /// then checkpointed, so that a `cairn run` that ends leaves its data in
    /// the database file and not only in the write-ahead log. The leases go
    /// first: whoever waits for one (a resume) does not wait for the
    /// checkpoint too.
    fn release(&mut self, releases: Vec<(Box<dyn RunLease>, Arc<RunShared>, RunId)>) {
        if releases.is_empty() {
            return;
        }
        let count = releases.len();
        for (lease, shared, run_id) in releases {
            if let Some(m) = &mut self.mirrors {
                m.close(&*self.backend, &run_id);
            }
            drop(lease);
            shared.owners.fetch_sub(1, Ordering::SeqCst);
            // The run's `RunLog` is gone; unless a subscription still
            // watches it, so is everything this process kept about it.
            drop(shared);
            self.runs.maybe_forget(&run_id);
        }
        if self.logs.fetch_sub(count, Ordering::SeqCst) == count {
            self.checkpoint();
        }
    }

    fn checkpoint(&self) {
        if let Err(e) = self.backend.checkpoint() {
            tracing::warn!(error = %e, "checkpointing the store failed; its data stays in the write-ahead log until the next checkpoint");
        }
    }

    fn commit(&mut self, pending: Pending) {
        // Events and rows of runs whose log already lost events are refused:
        // storing them would leave a gap in seq. The events go to the
        // backend as they are, without a copy; their runs' shared states
        // follow beside them.
        let ok = |s: &Arc<RunShared>| s.committed.borrow().failure.is_none();
        let (batch, shared): (Vec<StoredEvent>, Vec<Arc<RunShared>>) =
            pending.events.into_iter().filter(|(_, s)| ok(s)).unzip();
        let (calls, call_shared): (Vec<ToolCallRecord>, Vec<Arc<RunShared>>) =
            pending.calls.into_iter().filter(|(_, s)| ok(s)).unzip();
        if batch.is_empty() && calls.is_empty() {
            return;
        }
        match self.backend.append_with_calls(&calls, &batch) {
            Ok(()) => self.publish(batch, shared),
            Err(e) => self.retry_by_run(batch, shared, calls, call_shared, e),
        }
    }

    /// One run's bad batch should not sink the others: retry run by run, and
    /// fail only the runs that fail alone.
    fn retry_by_run(
        &mut self,
        batch: Vec<StoredEvent>,
        shared: Vec<Arc<RunShared>>,
        calls: Vec<ToolCallRecord>,
        call_shared: Vec<Arc<RunShared>>,
        e: StoreError,
    ) {
        tracing::error!(error = %e, "committing {} events and {} tool calls failed", batch.len(), calls.len());
        /// One run's share of the failed batch.
        struct RunPart {
            run: RunId,
            shared: Arc<RunShared>,
            events: Vec<StoredEvent>,
            event_shared: Vec<Arc<RunShared>>,
            calls: Vec<ToolCallRecord>,
        }
        let mut parts: Vec<RunPart> = Vec::new();
        let mut index: HashMap<RunId, usize> = HashMap::new();
        let mut part_of = |run: &RunId, s: &Arc<RunShared>, parts: &mut Vec<RunPart>| {
            *index.entry(run.clone()).or_insert_with(|| {
                parts.push(RunPart {
                    run: run.clone(),
                    shared: s.clone(),
                    events: Vec::new(),
                    event_shared: Vec::new(),
                    calls: Vec::new(),
                });
                parts.len() - 1
            })
        };
        for (c, s) in calls.into_iter().zip(call_shared) {
            let i = part_of(&c.run_id, &s, &mut parts);
            parts[i].calls.push(c);
        }
        for (ev, s) in batch.into_iter().zip(shared) {
            let i = part_of(&ev.run_id, &s, &mut parts);
            parts[i].events.push(ev);
            parts[i].event_shared.push(s);
        }
        let single = parts.len() == 1;
        for p in parts {
            let result = if single {
                Err(e.to_string())
            } else {
                self.backend
                    .append_with_calls(&p.calls, &p.events)
                    .map_err(|e| e.to_string())
            };
            match result {
                Ok(()) => self.publish(p.events, p.event_shared),
                Err(msg) => {
                    tracing::error!(run = %p.run, error = %msg, "events lost; the run's log stops here");
                    let failure = Failure::Commit(Arc::from(msg));
                    p.shared.update(|c| c.failure = Some(failure));
                }
            }
        }
    }

    /// After a commit: mirror, then live subscribers, then waiters.
    fn publish(&mut self, events: Vec<StoredEvent>, shared: Vec<Arc<RunShared>>) {
        if self.mirrors.is_some() {
            self.mirror(&events);
        }
        // Each run of the batch once, in order of first appearance, with its
        // last seq here. A busy server's batch holds a thousand runs, so
        // they are found by id, not by a scan per event.
        let mut runs: Vec<(RunId, Arc<RunShared>, u64)> = Vec::new();
        let mut index: HashMap<RunId, usize> = HashMap::new();
        for (ev, shared) in events.into_iter().zip(shared) {
            let seq = ev.seq;
            match runs.last_mut() {
                Some(last) if last.0 == ev.run_id => last.2 = seq,
                _ => match index.get(&ev.run_id) {
                    Some(&i) => runs[i].2 = seq,
                    None => {
                        index.insert(ev.run_id.clone(), runs.len());
                        runs.push((ev.run_id.clone(), shared.clone(), seq));
                    }
                },
            }
            let ev = Arc::new(ev);
            let _ = shared.live.send(ev.clone());
            if let Some(all) = self.all.get() {
                let _ = all.send(ev);
            }
        }
        for (_, shared, seq) in &runs {
            shared.update(|c| c.seq = c.seq.max(*seq));
        }
        // Subscribers in other processes learn of the commit without polling.
        let topics: Vec<Topic<'_>> = runs.iter().map(|(r, _, _)| Topic::Events(r)).collect();
        self.backend.notify_all(&topics);
    }

    fn mirror(&mut self, events: &[StoredEvent]) {
        let Some(mirrors) = &mut self.mirrors else {
            return;
        };
        /// One run's share of the batch: its seq range, its lines, and
        /// whether it ended the run.
        struct Lines<'a> {
            run: &'a RunId,
            first: u64,
            last: u64,
            text: String,
            ended: bool,
        }
        let mut runs: Vec<Lines<'_>> = Vec::new();
        let mut index: HashMap<&RunId, usize> = HashMap::new();
        for ev in events {
            let l = match index.get(&ev.run_id) {
                Some(&i) => &mut runs[i],
                None => {
                    index.insert(&ev.run_id, runs.len());
                    runs.push(Lines {
                        run: &ev.run_id,
                        first: ev.seq,
                        last: ev.seq,
                        text: String::new(),
                        ended: false,
                    });
                    runs.last_mut().expect("just pushed")
                }
            };
            l.last = ev.seq;
            l.ended |= ev.is_terminal();
            l.text.push_str(&ev.json);
            l.text.push('\n');
        }
        for l in runs {
            mirrors.append(&*self.backend, l.run, l.first, l.last, l.text.as_bytes());
            // A finished run's mirror is reopened if the run is resumed;
            // closing it keeps a long-lived server from holding a file per
            // run ever run.
            if l.ended {
                mirrors.close(&*self.backend, l.run);
            }
        }
    }
}

/// The in-process callback of a run's log: every event, in seq order,
/// synchronously from the append (see [`RunLog::set_observer`]).
pub type Observer = Box<dyn Fn(&Event) + Send + Sync>;
/// An event waiting for the writer, with its run's shared state.
type Queued = (StoredEvent, Arc<RunShared>);

/// What the writer commits next, in one transaction.
#[derive(Default)]
struct Pending {
    events: Vec<Queued>,
    /// Tool calls' rows, with their runs' shared states.
    calls: Vec<(ToolCallRecord, Arc<RunShared>)>,
}

impl Pending {
    fn len(&self) -> usize {
        self.events.len() + self.calls.len()
    }
}

/// A new run's start, for [`Journal::start_run`].
pub struct RunStart {
    /// The run.
    pub run_id: RunId,
    /// The run's row (with the same `run_id`); `None` when it exists
    /// already (a child whose row a crash left without its first event).
    pub record: Option<RunRecord>,
    /// Generation 0 with the files the run pinned, when it pinned any.
    pub pinned: Option<GenerationRecord>,
    /// The first event's scope.
    pub scope: Scope,
    /// The first event (`RunStarted`).
    pub first: EventKind,
    /// The log's in-process callback, from the first event on.
    pub observer: Option<Observer>,
}

struct Sequencer {
    last_seq: u64,
    last_ts: i64,
    observer: Option<Observer>,
    /// The run's secret values, masked in every event before it is
    /// sequenced (so before the store, the mirror and any subscriber).
    redactor: cairn_events::Redactor,
}

/// A run's sequencer: the one place its events get their `seq`. Send + Sync;
/// share it as `Arc<RunLog>`. Holds the run's lease until dropped.
pub struct RunLog {
    run_id: RunId,
    inner: Arc<Inner>,
    /// Taken only when the log is dropped, so that the registry can forget
    /// the run once the writer has released it too.
    shared: Option<Arc<RunShared>>,
    tx: mpsc::Sender<Msg>,
    lease: Mutex<Option<Box<dyn RunLease>>>,
    seq: Mutex<Sequencer>,
}

impl RunLog {
    /// The run id.
    pub fn run_id(&self) -> &RunId {
        &self.run_id
    }

    /// The seq of the latest appended event (committed or not).
    pub fn last_seq(&self) -> u64 {
        self.lock().last_seq
    }

    /// Masks `redactor`'s values in every event appended from now on
    /// (WORKFLOW.md, "Secrets and environment").
    pub fn set_redactor(&self, redactor: cairn_events::Redactor) {
        self.lock().redactor = redactor;
    }

    /// The values this log masks, for records written beside its events
    /// (tool calls).
    pub fn redactor(&self) -> cairn_events::Redactor {
        self.lock().redactor.clone()
    }

    fn shared(&self) -> &Arc<RunShared> {
        self.shared.as_ref().expect("a live RunLog keeps its run")
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Sequencer> {
        // An observer that panicked must not take the run's log with it.
        self.seq.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stamps (now), sequences and queues one event, and returns it. Never
    /// blocks on I/O. The observer, if set, sees it before this returns; the
    /// observer must not append to this log (it runs under the sequencer's
    /// lock, which is what keeps one order everywhere).
    pub fn append(&self, scope: Scope, kind: EventKind) -> Event {
        let mut s = self.lock();
        let kind = s.redactor.event(kind);
        s.last_seq += 1;
        // Timestamps never go backwards within a run, whatever the clock does.
        s.last_ts = s.last_ts.max(now_ms());
        let ev = Event {
            run_id: self.run_id.clone(),
            seq: cairn_events::Seq(s.last_seq),
            timestamp_ms: s.last_ts,
            scope,
            kind,
        };
        let stored = StoredEvent::from_event(&ev);
        let sent = self.tx.send(Msg::Event(stored, self.shared().clone()));
        if sent.is_err() || self.inner.closed.load(Ordering::SeqCst) {
            self.shared().update(|c| {
                c.failure.get_or_insert(Failure::Closed);
            });
        }
        if let Some(obs) = &s.observer {
            obs(&ev);
        }
        ev
    }

    /// Queues a tool call's row, to be committed with the events queued
    /// beside it (in one transaction where the backend can) and never after
    /// an event appended later. Never blocks: a thousand agents calling
    /// tools at once share the writer's commits instead of each taking the
    /// store's write lock on a runtime thread. A row that cannot be stored
    /// fails the run's log as an event would: the next
    /// [`RunLog::append_durable`] or [`RunLog::sync`] says so.
    pub fn record_tool_call(&self, rec: ToolCallRecord) {
        let sent = self
            .tx
            .send(Msg::Call(Box::new(rec), self.shared().clone()));
        if sent.is_err() || self.inner.closed.load(Ordering::SeqCst) {
            self.shared().update(|c| {
                c.failure.get_or_insert(Failure::Closed);
            });
        }
    }

    /// Appends and waits until the event is committed. Use it for lifecycle
    /// events before acting on them (guarantee 2).
    pub async fn append_durable(&self, scope: Scope, kind: EventKind) -> Result<Event, StoreError> {
        let ev = self.append(scope, kind);
        self.wait(ev.seq.get()).await?;
        Ok(ev)
    }

    /// Waits until every event appended so far on this log is committed.
    pub async fn sync(&self) -> Result<(), StoreError> {
        let target = self.last_seq();
        self.wait(target).await
    }

    async fn wait(&self, seq: u64) -> Result<(), StoreError> {
        let mut rx = self.shared().committed.subscribe();
        let r = rx
            .wait_for(|c| c.seq >= seq || c.failure.is_some())
            .await
            .map_err(|_| StoreError::Closed)?;
        if r.seq >= seq {
            Ok(())
        } else {
            Err(r
                .failure
                .as_ref()
                .map_or(StoreError::Closed, Failure::to_error))
        }
    }

    /// Blocking form of [`RunLog::sync`], for code outside an async runtime.
    pub fn sync_blocking(&self) -> Result<(), StoreError> {
        let target = self.last_seq();
        let shared = self.shared();
        let mut g = shared.cv_lock.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(r) = shared.check(target) {
                return r;
            }
            g = shared
                .cv
                .wait_timeout(g, Duration::from_millis(100))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Sets the in-process callback that receives every event in seq order
    /// (synchronously, from `append`). It replaces any earlier one.
    pub fn set_observer(&self, f: Box<dyn Fn(&Event) + Send + Sync>) {
        self.lock().observer = Some(f);
    }
}

impl Drop for RunLog {
    fn drop(&mut self) {
        let lease = self.lease.lock().unwrap_or_else(|p| p.into_inner()).take();
        let Some(shared) = self.shared.take() else {
            return;
        };
        if let Some(lease) = lease {
            let msg = Msg::Release(lease, shared.clone(), self.run_id.clone());
            if let Err(mpsc::SendError(msg)) = self.tx.send(msg) {
                // The writer is gone, so nothing of ours is queued: release now.
                drop(msg);
                shared.owners.fetch_sub(1, Ordering::SeqCst);
                self.inner.logs.fetch_sub(1, Ordering::SeqCst);
            }
        }
        // Whichever of this and the writer's release lets go last forgets
        // the run (see `Runs::maybe_forget`).
        drop(shared);
        self.inner.maybe_forget(&self.run_id);
    }
}

impl std::fmt::Debug for RunLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunLog")
            .field("run_id", &self.run_id)
            .field("last_seq", &self.last_seq())
            .finish_non_exhaustive()
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Why a subscription ended early.
#[derive(Debug, thiserror::Error)]
pub enum SubscribeError {
    /// The subscriber fell too far behind the live stream; it has seen
    /// everything up to `last_seq` and may subscribe again from there.
    /// The journal's own subscriptions no longer end this way: one that
    /// falls behind its run's live channel reads the store from its last
    /// seq and goes on.
    #[error(
        "subscriber lagged behind the live stream after seq {last_seq}; resubscribe from there"
    )]
    Lagged {
        /// The last seq delivered.
        last_seq: u64,
    },
    /// Reading the store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A run's events in seq order: replay from the store, then live.
pub struct Subscription {
    inner: Arc<Inner>,
    run_id: RunId,
    shared: Option<Arc<RunShared>>,
    rx: broadcast::Receiver<Arc<StoredEvent>>,
    /// Events read from the store, not yet delivered.
    buffer: VecDeque<Arc<StoredEvent>>,
    /// The last seq delivered (or the `after` asked for).
    last: u64,
    last_terminal: bool,
    /// The last store read came back short: the replay has reached the end
    /// of what was committed, so live events (when written here) suffice.
    caught_up: bool,
    stop_at_terminal: bool,
    done: bool,
    /// Whether it was checked, once, that the run did not end before the
    /// subscription's start (nothing would ever come).
    end_checked: bool,
}

enum Live {
    Event(Arc<StoredEvent>),
    Lagged,
    Nothing,
}

impl Subscription {
    /// The next event in seq order. `None` once the run's terminal event
    /// (`RunFinished`, `RunFailed`, `RunCancelled`) has been delivered when
    /// stopping at terminal events (the default), also when the subscription
    /// started right after one and nothing followed. After an error it
    /// returns `None`.
    pub async fn next(&mut self) -> Option<Result<Arc<StoredEvent>, SubscribeError>> {
        loop {
            if self.done {
                return None;
            }
            // The store is the truth: what it holds is delivered as it is.
            while let Some(ev) = self.buffer.pop_front() {
                if ev.seq > self.last {
                    return Some(Ok(self.deliver(ev)));
                }
            }
            // Live events already here?
            match self.try_live() {
                Live::Event(ev) => {
                    if let Some(out) = self.on_live(ev).await {
                        return Some(out);
                    }
                    continue;
                }
                Live::Lagged => {
                    // Further behind than the live channel keeps: what it
                    // dropped is committed, so it is read from the store.
                    if let Err(e) = self.fill().await {
                        return Some(Err(e));
                    }
                    continue;
                }
                Live::Nothing => {}
            }
            // Nothing buffered or live. The live feed carries what is
            // committed from now on when this process writes the run, or
            // when its reader of the store runs; otherwise (or while the
            // replay is not finished) the store is read here.
            let shared = self
                .shared
                .clone()
                .expect("a live subscription keeps its run");
            let owned = shared.owners.load(Ordering::SeqCst) > 0;
            let fed = owned || shared.reader.load(Ordering::SeqCst);
            if !fed || !self.caught_up {
                if let Err(e) = self.fill().await {
                    return Some(Err(e));
                }
                if !self.buffer.is_empty() {
                    continue;
                }
            }
            if !owned && !self.end_checked {
                self.end_checked = true;
                if self.stop_at_terminal && self.ended_before_start().await {
                    // Asked for events after the run's end: there will be none.
                    self.done = true;
                    return None;
                }
            }
            if self.stop_at_terminal && self.last_terminal {
                self.done = true;
                return None;
            }
            if !fed
                && shared
                    .reader
                    .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok()
            {
                // One reader per run and process, whatever the number of
                // watchers: a commit elsewhere costs one read here, not one
                // per subscription. It starts where this subscription is;
                // one further behind sees a gap and reads the store itself.
                tokio::spawn(remote_reader(
                    self.inner.clone(),
                    self.run_id.clone(),
                    shared.clone(),
                    self.last,
                ));
                continue;
            }
            if let Some(out) = self.wait_live().await {
                return Some(out);
            }
        }
    }

    /// A live event: delivered if it is the next, else the store is read
    /// when nothing is buffered. `None`: look again.
    async fn on_live(
        &mut self,
        ev: Arc<StoredEvent>,
    ) -> Option<Result<Arc<StoredEvent>, SubscribeError>> {
        if let Some(ev) = self.take_live(ev) {
            return Some(Ok(ev));
        }
        if self.buffer.is_empty() {
            if let Err(e) = self.fill().await {
                return Some(Err(e));
            }
        }
        None
    }

    /// Waits for the live feed, at most [`POLL_INTERVAL`]; what lagged is
    /// read from the store. `None`: look again.
    async fn wait_live(&mut self) -> Option<Result<Arc<StoredEvent>, SubscribeError>> {
        let live = tokio::select! {
            r = self.rx.recv() => Ok(r),
            _ = tokio::time::sleep(POLL_INTERVAL) => Err(()),
        };
        match live {
            Ok(Ok(ev)) => self.on_live(ev).await,
            Ok(Err(broadcast::error::RecvError::Lagged(_))) => self.fill().await.err().map(Err),
            Ok(Err(broadcast::error::RecvError::Closed)) | Err(_) => None,
        }
    }

    fn try_live(&mut self) -> Live {
        loop {
            match self.rx.try_recv() {
                Ok(ev) if ev.seq <= self.last => continue,
                Ok(ev) => return Live::Event(ev),
                Err(broadcast::error::TryRecvError::Lagged(_)) => return Live::Lagged,
                Err(_) => return Live::Nothing,
            }
        }
    }

    /// Delivers a live event if it is the next one. A later one means the
    /// store has what lies between (the writer publishes after commit), so
    /// the caller reads it from there.
    fn take_live(&mut self, ev: Arc<StoredEvent>) -> Option<Arc<StoredEvent>> {
        if ev.seq == self.last + 1 {
            Some(self.deliver(ev))
        } else {
            None
        }
    }

    fn deliver(&mut self, ev: Arc<StoredEvent>) -> Arc<StoredEvent> {
        self.last = ev.seq;
        self.last_terminal = ev.is_terminal();
        if self.last_terminal && self.stop_at_terminal {
            self.done = true;
        }
        ev
    }

    /// Reads the next page after the last delivered seq from the store,
    /// off the async threads.
    /// Whether the run's last stored event is terminal and at or before
    /// where this subscription starts, so nothing will ever follow.
    async fn ended_before_start(&self) -> bool {
        let backend = &self.inner.backend;
        let Ok(end) = backend.last_seq_async(&self.run_id).await else {
            return false;
        };
        if end == 0 || end > self.last {
            return false;
        }
        let q = EventQuery {
            after: end - 1,
            limit: Some(1),
            ..Default::default()
        };
        backend
            .read_events_async(&self.run_id, &q)
            .await
            .ok()
            .and_then(|p| p.into_iter().next())
            .is_some_and(|e| e.is_terminal())
    }

    async fn fill(&mut self) -> Result<(), SubscribeError> {
        let q = EventQuery {
            after: self.last,
            limit: Some(PAGE),
            ..Default::default()
        };
        let page = self.inner.backend.read_events_async(&self.run_id, &q).await;
        match page {
            Ok(p) => {
                self.caught_up = p.len() < PAGE;
                self.buffer.extend(p.into_iter().map(Arc::new));
                Ok(())
            }
            Err(e) => {
                self.done = true;
                Err(SubscribeError::Store(e))
            }
        }
    }

    /// Whether to end at terminal events (default true). With `false` the
    /// subscription keeps going across resumes.
    pub fn stop_at_terminal(mut self, yes: bool) -> Self {
        self.stop_at_terminal = yes;
        self
    }

    /// The last seq delivered so far.
    pub fn last_seq(&self) -> u64 {
        self.last
    }
}

/// Feeds a run's live channel from the store while this process has
/// subscribers to it and does not write it: at each wake-up from the writing
/// process (or every [`REMOTE_POLL_INTERVAL`] without one) it reads what was
/// committed after `hwm` and publishes it. Ends once nobody listens.
async fn remote_reader(inner: Arc<Inner>, run: RunId, shared: Arc<RunShared>, mut hwm: u64) {
    let mut listener = match inner.backend.listen(Topic::Events(&run)) {
        Ok(l) => Some(l),
        Err(e) => {
            tracing::debug!(error = %e, run = %run, "no wake-ups for this run's watchers; polling");
            None
        }
    };
    let poll = if listener.is_some() {
        REMOTE_POLL_INTERVAL
    } else {
        POLL_INTERVAL
    };
    loop {
        // While this process writes the run, its writer publishes.
        if shared.owners.load(Ordering::SeqCst) == 0 {
            hwm = publish_new(&inner, &run, &shared, hwm).await;
        }
        if shared.live.receiver_count() == 0 || inner.closed.load(Ordering::SeqCst) {
            break;
        }
        let woken = async {
            match listener.as_mut() {
                Some(l) => l.wait().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = woken => {}
            _ = tokio::time::sleep(poll) => {}
        }
    }
    shared.reader.store(false, Ordering::SeqCst);
    drop(shared);
    inner.maybe_forget(&run);
}

/// Reads the run's events after `hwm` and publishes them; returns the new
/// high-water mark. A failed read is tried again at the next wake-up.
async fn publish_new(inner: &Arc<Inner>, run: &RunId, shared: &RunShared, mut hwm: u64) -> u64 {
    loop {
        let q = EventQuery {
            after: hwm,
            limit: Some(PAGE),
            ..Default::default()
        };
        let page = match inner.backend.read_events_async(run, &q).await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(error = %e, run = %run, "reading new events for watchers failed; trying again at the next wake-up");
                return hwm;
            }
        };
        let short = page.len() < PAGE;
        for ev in page {
            hwm = ev.seq;
            let _ = shared.live.send(Arc::new(ev));
        }
        if short {
            return hwm;
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        // The receiver must go before the registry checks its count.
        let (tx, rx) = broadcast::channel(1);
        drop(tx);
        drop(std::mem::replace(&mut self.rx, rx));
        self.shared = None;
        self.inner.maybe_forget(&self.run_id);
    }
}
