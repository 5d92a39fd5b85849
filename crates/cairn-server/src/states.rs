//! A bounded cache of folded run states.
//!
//! Listing runs shows each one's progress, tokens and cost, and the web page
//! reads a run's state on every load: folding each run's whole log for every
//! request would cost a full replay per run listed. Each cached state
//! remembers the last seq it folded; a request folds only the events after
//! it. The result is the one reducer's fold over the same log (contract,
//! guarantee 4), just not recomputed from the start.
//!
//! The cache is bounded twice: by the number of runs, and by the bytes of
//! event text folded into the states it keeps, a cheap upper measure of what
//! a state holds (a state keeps a subset of what its events say). The least
//! recently used run goes first; the run just used always stays.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cairn_events::{RunId, RunState};
use cairn_store::{Backend, EventQuery, RunRecord, StoreError};

/// Runs whose states are kept by default.
pub(crate) const DEFAULT_MAX_RUNS: usize = 256;
/// Event text folded into the kept states, at most, by default (64 MiB).
pub(crate) const DEFAULT_MAX_BYTES: usize = 64 << 20;

/// Why a run's state could not be brought up to date.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StateError {
    /// The store could not be read.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// An event in the store is not one this build can read.
    #[error("run `{run}` event {seq}: {message}")]
    Decode {
        /// The run.
        run: String,
        /// The event's place in the log.
        seq: u64,
        /// What is wrong with it.
        message: String,
    },
}

impl From<StateError> for crate::error::ApiError {
    fn from(e: StateError) -> Self {
        match e {
            StateError::Store(s) => s.into(),
            // The run's damage, named as the engine names it.
            StateError::Decode { run, seq, message } => StoreError::BadRow {
                run,
                detail: format!("event {seq}: {message}"),
            }
            .into(),
        }
    }
}

/// One run's folded state.
struct Folded {
    state: RunState,
    /// The run's creation time: a run deleted and created again under the
    /// same id starts a new log, which must not be folded onto the old one.
    created_ms: i64,
    /// Event text folded so far, in bytes.
    bytes: usize,
}

struct Slot {
    /// Locked while it is brought up to date, so that concurrent readers of
    /// a busy run fold its new events once, not once each.
    folded: Arc<Mutex<Folded>>,
    last_used: u64,
    bytes: usize,
}

#[derive(Default)]
struct Slots {
    by_run: HashMap<RunId, Slot>,
    clock: u64,
    bytes: usize,
}

/// Folded run states, by run id; see the module's documentation.
pub(crate) struct StateCache {
    slots: Mutex<Slots>,
    max_runs: usize,
    max_bytes: usize,
}

impl Default for StateCache {
    fn default() -> Self {
        StateCache::new(DEFAULT_MAX_RUNS, DEFAULT_MAX_BYTES)
    }
}

impl StateCache {
    /// A cache of at most `max_runs` states holding at most `max_bytes` of
    /// folded event text (the run used last is kept whatever its size).
    pub(crate) fn new(max_runs: usize, max_bytes: usize) -> Self {
        StateCache {
            slots: Mutex::default(),
            max_runs: max_runs.max(1),
            max_bytes,
        }
    }

    /// Calls `f` with the state of `rec`'s run as of its latest committed
    /// event. Blocking: reads the store.
    pub(crate) fn with_state<T>(
        &self,
        backend: &dyn Backend,
        rec: &RunRecord,
        f: impl FnOnce(&RunState) -> T,
    ) -> Result<T, StateError> {
        let folded = self.slot(rec);
        let mut guard = folded.lock().unwrap_or_else(|p| p.into_inner());
        if guard.created_ms != rec.created_ms {
            *guard = Folded {
                state: RunState::new(rec.run_id.clone()),
                created_ms: rec.created_ms,
                bytes: 0,
            };
        }
        let q = EventQuery {
            after: guard.state.last_seq,
            ..EventQuery::default()
        };
        let fresh = backend.read_events(&rec.run_id, &q)?;
        if !fresh.is_empty() {
            for stored in &fresh {
                let ev = stored.decode().map_err(|e| StateError::Decode {
                    run: rec.run_id.to_string(),
                    seq: stored.seq,
                    message: e.to_string(),
                })?;
                guard.state.apply(&ev);
                guard.bytes += stored.json.len();
            }
            let bytes = guard.bytes;
            self.account(&rec.run_id, &folded, bytes);
        }
        Ok(f(&guard.state))
    }

    /// The run's slot, made when missing, marked as used now.
    fn slot(&self, rec: &RunRecord) -> Arc<Mutex<Folded>> {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        slots.clock += 1;
        let now = slots.clock;
        let slot = slots
            .by_run
            .entry(rec.run_id.clone())
            .or_insert_with(|| Slot {
                folded: Arc::new(Mutex::new(Folded {
                    state: RunState::new(rec.run_id.clone()),
                    created_ms: rec.created_ms,
                    bytes: 0,
                })),
                last_used: now,
                bytes: 0,
            });
        slot.last_used = now;
        let folded = slot.folded.clone();
        self.evict(&mut slots, &rec.run_id);
        folded
    }

    /// Records the new size of `run`'s state and evicts what no longer fits.
    fn account(&self, run: &str, folded: &Arc<Mutex<Folded>>, bytes: usize) {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let Slots {
            by_run,
            bytes: total,
            ..
        } = &mut *slots;
        // The slot may have been evicted meanwhile: then the state just
        // folded is not kept, and the next request folds it again.
        if let Some(slot) = by_run.get_mut(run) {
            if Arc::ptr_eq(&slot.folded, folded) {
                *total = *total - slot.bytes + bytes;
                slot.bytes = bytes;
            }
        }
        self.evict(&mut slots, run);
    }

    /// Drops the least recently used states, never `keep`'s, until both
    /// bounds hold.
    fn evict(&self, slots: &mut Slots, keep: &str) {
        while slots.by_run.len() > self.max_runs || slots.bytes > self.max_bytes {
            let oldest = slots
                .by_run
                .iter()
                .filter(|(run, _)| run.as_str() != keep)
                .min_by_key(|(_, s)| s.last_used)
                .map(|(run, _)| run.clone());
            let Some(run) = oldest else { return };
            if let Some(slot) = slots.by_run.remove(&run) {
                slots.bytes -= slot.bytes;
            }
        }
    }

    /// How many runs' states are kept (for tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.slots.lock().unwrap().by_run.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_events::{EventKind, NodeStatus, Scope};
    use cairn_store::{Journal, JournalOptions};

    fn record(id: &str, created_ms: i64) -> RunRecord {
        RunRecord {
            run_id: RunId::parse(id).unwrap(),
            workflow: "w".into(),
            workflow_path: "w.yaml".into(),
            workflow_hash: "h".into(),
            workflow_source: String::new(),
            input: serde_json::json!({}),
            status: cairn_events::RunStatus::Running.into(),
            created_ms,
            updated_ms: created_ms,
            parent_run_id: None,
        }
    }

    fn started() -> EventKind {
        EventKind::RunStarted {
            workflow: "w".into(),
            workflow_hash: "h".into(),
            input: None,
            resumed: false,
            parent_run_id: None,
            parent_node_id: None,
            depth: 0,
            forked_from: None,
            trigger: None,
            replay_of: None,
        }
    }

    #[test]
    fn a_cached_state_folds_only_new_events_and_equals_a_whole_fold() {
        let dir = tempfile::tempdir().unwrap();
        let journal =
            Journal::open_sqlite(&dir.path().join("c.db"), JournalOptions::default()).unwrap();
        let backend = journal.backend().clone();
        let rec = record("r1", 1);
        backend.create_run(&rec).unwrap();
        let log = journal.run_log(&rec.run_id).unwrap();
        log.append(Scope::run(), started());
        log.append(
            Scope::node("a", 0),
            EventKind::NodePending {
                layer_index: Some(0),
            },
        );
        log.sync_blocking().unwrap();
        let cache = StateCache::default();
        let seq = cache
            .with_state(backend.as_ref(), &rec, |s| s.last_seq)
            .unwrap();
        assert_eq!(seq, 2);
        log.append(
            Scope::node("a", 0).with_attempt(1),
            EventKind::NodeStarted { snapshot: None },
        );
        log.sync_blocking().unwrap();
        let (seq, status) = cache
            .with_state(backend.as_ref(), &rec, |s| {
                (s.last_seq, s.node("a", 0).unwrap().status)
            })
            .unwrap();
        assert_eq!((seq, status), (3, NodeStatus::Running));
        let whole = RunState::from_events(
            &rec.run_id,
            &backend
                .read_events(&rec.run_id, &EventQuery::default())
                .unwrap()
                .iter()
                .map(|s| s.decode().unwrap())
                .collect::<Vec<_>>(),
        );
        let cached = cache
            .with_state(backend.as_ref(), &rec, |s| serde_json::to_value(s).unwrap())
            .unwrap();
        assert_eq!(cached, serde_json::to_value(&whole).unwrap());
        // The same id created anew is a new log.
        let again = record("r1", 2);
        let seq = cache
            .with_state(backend.as_ref(), &again, |s| s.last_seq)
            .unwrap();
        assert_eq!(seq, 3, "refolded from the start, not from seq 3");
        log.sync_blocking().unwrap();
    }

    #[test]
    fn the_cache_keeps_at_most_its_bound_of_runs() {
        let dir = tempfile::tempdir().unwrap();
        let journal =
            Journal::open_sqlite(&dir.path().join("c.db"), JournalOptions::default()).unwrap();
        let backend = journal.backend().clone();
        let cache = StateCache::new(3, usize::MAX);
        for i in 0..5 {
            let id = format!("r{i}");
            let rec = record(&id, 1);
            backend.create_run(&rec).unwrap();
            let log = journal.run_log(&rec.run_id).unwrap();
            log.append(Scope::run(), started());
            log.sync_blocking().unwrap();
            cache.with_state(backend.as_ref(), &rec, |_| ()).unwrap();
        }
        assert_eq!(cache.len(), 3);
        // A byte bound smaller than any state keeps only the latest.
        let tiny = StateCache::new(10, 1);
        for i in 0..5 {
            let id = RunId::parse(&format!("r{i}")).unwrap();
            let rec = backend.get_run(&id).unwrap().unwrap();
            tiny.with_state(backend.as_ref(), &rec, |_| ()).unwrap();
        }
        assert_eq!(tiny.len(), 1);
    }
}
