//! One live feed per watched run, shared by all of the run's watchers.
//!
//! A store subscription per watcher would have the store's writer wake every
//! watcher itself, and every watcher register with the run's broadcast and
//! arm a poll timer at every event; with a thousand watchers that
//! bookkeeping, not the sockets, set the latency. Instead the first watcher
//! of a run starts a *hub*: one task that holds the run's only store
//! subscription, builds each event's frames once and offers them to every
//! watcher's queue.
//!
//! A watcher first replays the store from where it asked, then joins the hub
//! once it has reached the hub's window of recent frames. Joining happens
//! under the hub's lock, so the switch from replay to live has no gap and no
//! duplicate (contract, guarantee 3).
//!
//! Nobody waits on a watcher. A watcher whose queue is full when the hub
//! offers it an event is dropped by the hub: it still delivers what it had
//! queued, then reports [`Cut::Lagged`] with its last seq so its client can
//! reconnect from there. The store does not wait on the hub either: a hub
//! that falls behind the store's live buffer subscribes again from its last
//! seq and reads the rest from the store.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use cairn_events::RunId;
use cairn_store::{Backend, EventQuery, Journal, StoreError, SubscribeError, Subscription};
use tokio::sync::mpsc::{self, error::TryRecvError};
use tokio::sync::{Notify, Semaphore};

use crate::frames::Frame;

/// Recent frames a hub keeps, so that a watcher done replaying the store can
/// join although the run went on meanwhile (a few more events than a store
/// read takes).
const WINDOW: usize = 256;
/// Store reads for replaying watchers at once. A thousand watchers
/// connecting together would otherwise hold a thousand blocking threads
/// that wait on the same database.
const READS: usize = 8;
/// Events read from the store per replay page.
const PAGE: usize = 1000;

// Why the hub closed a watcher's queue, told to the watcher once it has
// drained what was queued.
const OPEN: u8 = 0;
const LAGGED: u8 = 1;
/// The hub's events stopped following on (the run was deleted and written
/// again under its id): read the store again.
const REPLAY: u8 = 2;
const FAILED: u8 = 3;
/// The server is stopping.
const CLOSED: u8 = 4;

/// Why a watcher's stream ends before the run does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Cut {
    /// It fell behind by a whole queue; [`Watcher::last_seq`] is where to
    /// resume.
    Lagged,
    /// The run's feed failed (the store could not be read).
    Failed(String),
    /// The server is stopping ([`Feeds::close`]).
    Closed,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Every watched run's hub.
pub(crate) struct Feeds {
    hubs: Mutex<HashMap<RunId, Arc<Hub>>>,
    closed: AtomicBool,
    reads: Semaphore,
}

impl Default for Feeds {
    fn default() -> Self {
        Feeds {
            hubs: Mutex::default(),
            closed: AtomicBool::new(false),
            reads: Semaphore::new(READS),
        }
    }
}

struct Hub {
    run_id: RunId,
    state: Mutex<HubState>,
    /// Tells the hub's task that its last watcher left.
    stop: Notify,
    /// Watchers holding the hub; changed only under the `Feeds` lock, so a
    /// hub is never handed out after its last holder removed it.
    holders: AtomicUsize,
}

struct HubState {
    /// The seq just before the window's first frame. A watcher that has
    /// delivered at least this far can join.
    base: u64,
    window: VecDeque<Arc<Frame>>,
    slots: Vec<Slot>,
    /// Set when the hub stopped for good.
    failed: Option<String>,
}

impl HubState {
    /// The last seq the hub has offered.
    fn last(&self) -> u64 {
        self.base + self.window.len() as u64
    }

    /// Drops every watcher's sender, telling it why once it has drained
    /// what was queued.
    fn close_slots(&mut self, why: u8) {
        for s in self.slots.drain(..) {
            s.queue.why.store(why, Ordering::SeqCst);
        }
    }
}

/// One live watcher, as the hub sees it.
struct Slot {
    tx: mpsc::UnboundedSender<Arc<Frame>>,
    /// The watcher has (or has buffered) every event up to here.
    after: u64,
    queue: Arc<Queue>,
}

/// What the hub and a watcher share about the watcher's queue. The queue is
/// an unbounded channel bounded by `len` here: a bounded channel's receiver
/// takes a lock to return each permit.
struct Queue {
    /// Frames sent and not yet received.
    len: AtomicUsize,
    /// How many may wait.
    cap: usize,
    /// Why the hub dropped the sender.
    why: AtomicU8,
}

/// Keeps a hub alive; the last one dropped stops it.
struct HubRef {
    feeds: Arc<Feeds>,
    hub: Arc<Hub>,
}

impl Drop for HubRef {
    fn drop(&mut self) {
        let mut hubs = lock(&self.feeds.hubs);
        if self.hub.holders.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.hub.unregister(&mut hubs);
            self.hub.stop.notify_one();
        }
    }
}

impl Feeds {
    /// A watcher of `run_id`'s events after `after`. It ends after the
    /// run's terminal event unless `follow`; `queue` is how many events may
    /// wait for it before it is cut off.
    pub async fn watch(
        self: &Arc<Self>,
        journal: &Journal,
        run_id: &RunId,
        after: u64,
        follow: bool,
        queue: usize,
    ) -> Result<Watcher, StoreError> {
        let hub = self.hub(journal, run_id).await?;
        Ok(Watcher {
            hub,
            backend: journal.backend().clone(),
            queue: queue.max(1),
            live: None,
            buffer: VecDeque::new(),
            last: after,
            last_terminal: false,
            stop_at_terminal: !follow,
            started: false,
            done: false,
        })
    }

    /// Ends every watcher (with [`Cut::Closed`]) and refuses new ones: the
    /// server is stopping. Watchers learn it from their queues, so a live
    /// watcher checks nothing more per event than its queue.
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let hubs: Vec<Arc<Hub>> = lock(&self.hubs).values().cloned().collect();
        for hub in hubs {
            let mut st = lock(&hub.state);
            st.close_slots(CLOSED);
        }
    }

    fn held(self: &Arc<Self>, hubs: &HashMap<RunId, Arc<Hub>>, run_id: &RunId) -> Option<HubRef> {
        let hub = hubs.get(run_id)?;
        hub.holders.fetch_add(1, Ordering::SeqCst);
        Some(HubRef {
            feeds: self.clone(),
            hub: hub.clone(),
        })
    }

    async fn hub(
        self: &Arc<Self>,
        journal: &Journal,
        run_id: &RunId,
    ) -> Result<HubRef, StoreError> {
        if let Some(h) = self.held(&lock(&self.hubs), run_id) {
            return Ok(h);
        }
        // Start one, from the end of the run's committed log: watchers read
        // what came before from the store themselves.
        let (j, run) = (journal.clone(), run_id.clone());
        let (sub, base) = tokio::task::spawn_blocking(move || {
            let base = j.backend().last_seq(&run)?;
            Ok::<_, StoreError>((j.subscribe(&run, base)?.stop_at_terminal(false), base))
        })
        .await
        .map_err(|_| StoreError::Closed)??;
        let mut hubs = lock(&self.hubs);
        if let Some(h) = self.held(&hubs, run_id) {
            // Another watcher started it meanwhile; `sub` goes unused.
            return Ok(h);
        }
        let hub = Arc::new(Hub {
            run_id: run_id.clone(),
            state: Mutex::new(HubState {
                base,
                window: VecDeque::with_capacity(64),
                slots: Vec::new(),
                failed: None,
            }),
            stop: Notify::new(),
            holders: AtomicUsize::new(1),
        });
        hubs.insert(run_id.clone(), hub.clone());
        tokio::spawn(run_hub(self.clone(), hub.clone(), sub, journal.clone()));
        Ok(HubRef {
            feeds: self.clone(),
            hub,
        })
    }

    /// Runs with a live hub (for tests).
    #[cfg(test)]
    fn live_runs(&self) -> usize {
        lock(&self.hubs).len()
    }
}

async fn run_hub(feeds: Arc<Feeds>, hub: Arc<Hub>, mut sub: Subscription, journal: Journal) {
    loop {
        let next = tokio::select! {
            biased;
            _ = hub.stop.notified() => return,
            next = sub.next() => next,
        };
        match next {
            Some(Ok(ev)) => hub.offer(Frame::build(&ev)),
            Some(Err(SubscribeError::Lagged { last_seq })) => {
                // Behind the store's live buffer: the store has the rest.
                let (j, run) = (journal.clone(), hub.run_id.clone());
                match tokio::task::spawn_blocking(move || j.subscribe(&run, last_seq)).await {
                    Ok(Ok(s)) => sub = s.stop_at_terminal(false),
                    Ok(Err(e)) => return hub.fail(&feeds, e.to_string()),
                    Err(_) => return hub.fail(&feeds, StoreError::Closed.to_string()),
                }
            }
            Some(Err(SubscribeError::Store(e))) => return hub.fail(&feeds, e.to_string()),
            None => return hub.fail(&feeds, StoreError::Closed.to_string()),
        }
    }
}

impl Hub {
    /// Offers the next event to every watcher. A full queue cuts its
    /// watcher off; nothing here waits.
    fn offer(&self, frame: Arc<Frame>) {
        let mut st = lock(&self.state);
        if frame.seq != st.last() + 1 {
            // Not the event after the last one: the run's log was replaced.
            // Everyone goes back to the store, which has the truth.
            st.window.clear();
            st.base = frame.seq.saturating_sub(1);
            st.close_slots(REPLAY);
        }
        if st.window.len() == WINDOW {
            st.window.pop_front();
            st.base += 1;
        }
        st.window.push_back(frame.clone());
        st.slots.retain(|s| {
            if frame.seq <= s.after {
                return true;
            }
            if s.queue.len.load(Ordering::Acquire) >= s.queue.cap {
                s.queue.why.store(LAGGED, Ordering::SeqCst);
                return false;
            }
            s.queue.len.fetch_add(1, Ordering::AcqRel);
            // Fails only when the watcher is gone.
            s.tx.send(frame.clone()).is_ok()
        });
    }

    /// Takes this hub (not a newer one of the same run) out of the map.
    fn unregister(&self, hubs: &mut HashMap<RunId, Arc<Hub>>) {
        if hubs
            .get(&self.run_id)
            .is_some_and(|h| std::ptr::eq(&**h, self))
        {
            hubs.remove(&self.run_id);
        }
    }

    fn fail(&self, feeds: &Feeds, message: String) {
        self.unregister(&mut lock(&feeds.hubs));
        let mut st = lock(&self.state);
        st.failed = Some(message);
        st.close_slots(FAILED);
    }
}

/// One run's events for one client, in seq order: replayed from the store,
/// then live from the run's hub.
pub(crate) struct Watcher {
    hub: HubRef,
    backend: Arc<dyn Backend>,
    queue: usize,
    live: Option<(mpsc::UnboundedReceiver<Arc<Frame>>, Arc<Queue>)>,
    /// Frames to deliver before anything live.
    buffer: VecDeque<Arc<Frame>>,
    /// The last seq delivered (or the `after` asked for).
    last: u64,
    last_terminal: bool,
    stop_at_terminal: bool,
    /// The store has been read once (which also tells whether the watcher
    /// starts right after the run's end).
    started: bool,
    done: bool,
}

impl Watcher {
    /// The next event. `None` once the run's terminal event was delivered
    /// (unless following), also when the watcher started right after it and
    /// nothing followed. After a [`Cut`], `None`.
    pub async fn next(&mut self) -> Option<Result<Arc<Frame>, Cut>> {
        loop {
            if self.done {
                return None;
            }
            if let Some(f) = self.buffered() {
                return Some(Ok(f));
            }
            if let Some((rx, queue)) = &mut self.live {
                match rx.recv().await {
                    Some(f) => {
                        queue.len.fetch_sub(1, Ordering::AcqRel);
                        self.buffer.push_back(f);
                    }
                    None => {
                        if let Some(cut) = self.closed() {
                            return Some(Err(cut));
                        }
                    }
                }
                continue;
            }
            // Replaying: join the hub once its window reaches back to here,
            // else read on in the store.
            if self.started {
                match self.join() {
                    Ok(true) => continue,
                    Ok(false) => {}
                    Err(cut) => return Some(Err(self.cut(cut))),
                }
            }
            if self.hub.feeds.closed.load(Ordering::SeqCst) {
                return Some(Err(self.cut(Cut::Closed)));
            }
            if let Err(e) = self.read_page().await {
                return Some(Err(self.cut(Cut::Failed(e.to_string()))));
            }
        }
    }

    /// What is ready now without waiting: `Some(next)` when [`next`] would
    /// return at once, `None` when it would wait (or read the store).
    ///
    /// [`next`]: Watcher::next
    pub fn try_next(&mut self) -> Option<Option<Result<Arc<Frame>, Cut>>> {
        loop {
            if self.done {
                return Some(None);
            }
            if let Some(f) = self.buffered() {
                return Some(Some(Ok(f)));
            }
            let (rx, queue) = self.live.as_mut()?;
            match rx.try_recv() {
                Ok(f) => {
                    queue.len.fetch_sub(1, Ordering::AcqRel);
                    self.buffer.push_back(f);
                }
                Err(TryRecvError::Empty) => return None,
                Err(TryRecvError::Disconnected) => {
                    if let Some(cut) = self.closed() {
                        return Some(Some(Err(cut)));
                    }
                    return None;
                }
            }
        }
    }

    /// The last seq delivered so far.
    pub fn last_seq(&self) -> u64 {
        self.last
    }

    /// The next buffered event, if any.
    fn buffered(&mut self) -> Option<Arc<Frame>> {
        while let Some(f) = self.buffer.pop_front() {
            if f.seq == self.last + 1 {
                return Some(self.deliver(f));
            }
            if f.seq > self.last + 1 {
                // Never expected (replay pages and the hub's frames run on
                // without gaps), but a gap must not reach a client: read the
                // store again from the last seq delivered.
                self.buffer.clear();
                self.live = None;
                return None;
            }
        }
        None
    }

    /// The hub closed the live queue and it is drained: the cut it left, or
    /// `None` when the watcher is to read the store again.
    fn closed(&mut self) -> Option<Cut> {
        let (_, queue) = self.live.take()?;
        let cut = match queue.why.load(Ordering::SeqCst) {
            REPLAY | OPEN => return None,
            FAILED => Cut::Failed(
                lock(&self.hub.hub.state)
                    .failed
                    .clone()
                    .unwrap_or_else(|| StoreError::Closed.to_string()),
            ),
            CLOSED => Cut::Closed,
            _ => Cut::Lagged,
        };
        Some(self.cut(cut))
    }

    fn deliver(&mut self, f: Arc<Frame>) -> Arc<Frame> {
        self.last = f.seq;
        self.last_terminal = f.terminal;
        if self.last_terminal && self.stop_at_terminal {
            self.done = true;
        }
        f
    }

    fn cut(&mut self, cut: Cut) -> Cut {
        self.done = true;
        self.live = None;
        cut
    }

    /// Joins the hub when its window reaches back to the last seq delivered:
    /// the window's later frames are buffered and the hub queues the rest.
    fn join(&mut self) -> Result<bool, Cut> {
        let mut st = lock(&self.hub.hub.state);
        if let Some(msg) = &st.failed {
            return Err(Cut::Failed(msg.clone()));
        }
        // Checked under the hub's lock, which `Feeds::close` takes after
        // setting the flag: no watcher joins after its slots were closed.
        if self.hub.feeds.closed.load(Ordering::SeqCst) {
            return Err(Cut::Closed);
        }
        if self.last < st.base {
            return Ok(false);
        }
        let last = self.last;
        self.buffer
            .extend(st.window.iter().filter(|f| f.seq > last).cloned());
        let (tx, rx) = mpsc::unbounded_channel();
        let queue = Arc::new(Queue {
            len: AtomicUsize::new(0),
            cap: self.queue,
            why: AtomicU8::new(OPEN),
        });
        let after = st.last().max(self.last);
        st.slots.push(Slot {
            tx,
            after,
            queue: queue.clone(),
        });
        self.live = Some((rx, queue));
        Ok(true)
    }

    /// Reads the next page of the run's log after the last seq delivered.
    async fn read_page(&mut self) -> Result<(), StoreError> {
        // The first read starts one event early to learn whether the event
        // the watcher starts after ended the run.
        let peek = !self.started && self.last > 0;
        let q = EventQuery {
            after: if peek { self.last - 1 } else { self.last },
            limit: Some(PAGE + usize::from(peek)),
            ..Default::default()
        };
        let _turn = self
            .hub
            .feeds
            .reads
            .acquire()
            .await
            .map_err(|_| StoreError::Closed)?;
        let mut page = self
            .backend
            .read_events_async(&self.hub.hub.run_id, &q)
            .await?;
        if peek && page.first().is_some_and(|e| e.seq == self.last) {
            self.last_terminal = page.remove(0).is_terminal();
        }
        self.started = true;
        if page.is_empty() && self.stop_at_terminal && self.last_terminal {
            // Asked for what follows the run's end: nothing does.
            self.done = true;
        }
        self.buffer.extend(page.iter().map(Frame::build));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_events::{EventKind, OutputStream, Scope};
    use cairn_store::{JournalOptions, RunLog, RunRecord};
    use std::time::Duration;

    fn journal(dir: &std::path::Path) -> Journal {
        Journal::open_sqlite(&dir.join("cairn.db"), JournalOptions { log_dir: None }).unwrap()
    }

    fn run(j: &Journal, id: &str) -> RunLog {
        let id = RunId::parse(id).unwrap();
        j.backend()
            .create_run(&RunRecord {
                run_id: id.clone(),
                workflow: "w".into(),
                workflow_path: "w.yaml".into(),
                workflow_hash: "h".into(),
                workflow_source: String::new(),
                input: serde_json::json!({}),
                status: cairn_events::RunStatus::Running.into(),
                created_ms: 0,
                updated_ms: 0,
                parent_run_id: None,
            })
            .unwrap();
        j.run_log(&id).unwrap()
    }

    fn out(log: &RunLog, n: usize) {
        for i in 0..n {
            log.append(
                Scope::node("n", 0).with_attempt(1),
                EventKind::NodeOutput {
                    text: format!("line {i}"),
                    stream: OutputStream::Stdout,
                },
            );
        }
    }

    async fn finish(log: &RunLog) {
        log.append_durable(
            Scope::run(),
            EventKind::RunFinished {
                output: None,
                duration_ms: 0,
            },
        )
        .await
        .unwrap();
    }

    async fn drain(w: &mut Watcher) -> (Vec<u64>, Option<Cut>) {
        let mut seqs = Vec::new();
        loop {
            match tokio::time::timeout(Duration::from_secs(20), w.next())
                .await
                .expect("the watcher ends")
            {
                Some(Ok(f)) => seqs.push(f.seq),
                Some(Err(c)) => return (seqs, Some(c)),
                None => return (seqs, None),
            }
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn watchers_switch_from_replay_to_live_without_gap_or_duplicate() {
        let dir = tempfile::tempdir().unwrap();
        let j = journal(dir.path());
        let log = run(&j, "r");
        out(&log, 2500);
        log.sync().await.unwrap();
        let feeds = Arc::new(Feeds::default());
        // Watchers from the start, from the middle and from the end, joined
        // while the run keeps writing.
        let mut tasks = Vec::new();
        for after in [0, 1, 1200, 2500] {
            let w = feeds
                .watch(&j, &RunId::parse("r").unwrap(), after, false, 100_000)
                .await
                .unwrap();
            tasks.push(tokio::spawn(async move {
                let mut w = w;
                (after, drain(&mut w).await)
            }));
            out(&log, 700);
        }
        finish(&log).await;
        let total = log.last_seq();
        for t in tasks {
            let (after, (seqs, cut)) = t.await.unwrap();
            assert_eq!(cut, None);
            assert_eq!(seqs, ((after + 1)..=total).collect::<Vec<_>>());
        }
        // The last watcher gone, the hub goes too.
        assert_eq!(feeds.live_runs(), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_watcher_that_stops_reading_is_cut_off_and_the_others_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let j = journal(dir.path());
        let log = run(&j, "r");
        out(&log, 3);
        log.sync().await.unwrap();
        let feeds = Arc::new(Feeds::default());
        let mut slow = feeds
            .watch(&j, &RunId::parse("r").unwrap(), 0, false, 16)
            .await
            .unwrap();
        let fast = feeds
            .watch(&j, &RunId::parse("r").unwrap(), 0, false, 64)
            .await
            .unwrap();
        for _ in 0..3 {
            slow.next().await.unwrap().unwrap();
        }
        // Caught up: the next wait joins the hub, then nothing comes.
        assert!(tokio::time::timeout(Duration::from_millis(50), slow.next())
            .await
            .is_err());
        let fast = tokio::spawn(async move {
            let mut fast = fast;
            drain(&mut fast).await
        });
        for _ in 0..50 {
            out(&log, 10);
            log.sync().await.unwrap();
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        finish(&log).await;
        let (seqs, cut) = drain(&mut slow).await;
        assert_eq!(cut, Some(Cut::Lagged));
        assert_eq!(seqs.first(), Some(&4));
        assert_eq!(*seqs.last().unwrap(), slow.last_seq());
        assert!(slow.last_seq() < log.last_seq());
        let (seqs, cut) = fast.await.unwrap();
        assert_eq!(cut, None);
        assert_eq!(seqs.len() as u64, log.last_seq());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn closing_ends_live_and_replaying_watchers_and_refuses_new_ones() {
        let dir = tempfile::tempdir().unwrap();
        let j = journal(dir.path());
        let log = run(&j, "r");
        out(&log, 2500);
        log.sync().await.unwrap();
        let feeds = Arc::new(Feeds::default());
        let mut live = feeds
            .watch(&j, &RunId::parse("r").unwrap(), 2500, true, 16)
            .await
            .unwrap();
        assert!(tokio::time::timeout(Duration::from_millis(50), live.next())
            .await
            .is_err());
        let mut replaying = feeds
            .watch(&j, &RunId::parse("r").unwrap(), 0, true, 16)
            .await
            .unwrap();
        assert_eq!(replaying.next().await.unwrap().unwrap().seq, 1);
        feeds.close();
        assert_eq!(drain(&mut live).await, (vec![], Some(Cut::Closed)));
        let (seqs, cut) = drain(&mut replaying).await;
        assert_eq!(cut, Some(Cut::Closed));
        assert!(seqs.len() < 2500, "stops at the next page, not the end");
        let mut late = feeds
            .watch(&j, &RunId::parse("r").unwrap(), 2500, true, 16)
            .await
            .unwrap();
        assert_eq!(drain(&mut late).await, (vec![], Some(Cut::Closed)));
    }

    #[tokio::test]
    async fn after_the_end_there_is_nothing_unless_following() {
        let dir = tempfile::tempdir().unwrap();
        let j = journal(dir.path());
        let log = run(&j, "r");
        out(&log, 2);
        finish(&log).await;
        let feeds = Arc::new(Feeds::default());
        let mut w = feeds
            .watch(&j, &RunId::parse("r").unwrap(), 3, false, 16)
            .await
            .unwrap();
        assert_eq!(drain(&mut w).await, (vec![], None));
        let mut w = feeds
            .watch(&j, &RunId::parse("r").unwrap(), 3, true, 16)
            .await
            .unwrap();
        assert!(tokio::time::timeout(Duration::from_millis(300), w.next())
            .await
            .is_err());
        // A resume writes on; the follower sees it.
        out(&log, 1);
        assert_eq!(w.next().await.unwrap().unwrap().seq, 4);
    }
}
