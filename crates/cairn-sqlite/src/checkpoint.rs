//! Moving the write-ahead log into the database file, beside the writer
//! rather than in its way.
//!
//! SQLite checkpoints in the commit that takes the log past 1,000 pages:
//! the committing thread copies the log's pages into the file and syncs both
//! to disk before its caller hears of the commit. On a busy server that
//! thread is the journal's writer, and every event queued meanwhile waited
//! for the copy and the syncs (tens of milliseconds, several times a second
//! with a thousand runs streaming). Here the write connection never
//! checkpoints on its own: a commit that leaves the log past
//! [`CHECKPOINT_PAGES`] wakes a thread with a connection of its own, whose
//! PASSIVE checkpoint copies what it can while the writer goes on.
//!
//! A checkpoint that runs beside the writer rarely ends with the whole log
//! copied, and SQLite starts the log over only after one that did; so once
//! the log is past [`INLINE_PAGES`], the writer finishes the copy itself
//! (only the pages the thread has not copied yet), and the next commit
//! starts the log over.

use std::cell::Cell;
use std::os::raw::c_int;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use rusqlite::hooks::Wal;
use rusqlite::Connection;

/// Log pages past which a commit wakes the checkpointing thread: SQLite's
/// own default for its automatic checkpoint.
pub(crate) const CHECKPOINT_PAGES: c_int = 1000;

/// Log pages past which the writer completes the checkpoint itself, so that
/// the log starts over instead of growing while the writer never pauses.
pub(crate) const INLINE_PAGES: c_int = 4 * CHECKPOINT_PAGES;

thread_local! {
    /// The log's length in pages after this thread's last commit, as
    /// SQLite's write-ahead-log hook reports it (the hook takes a plain
    /// function, so it leaves the number here for the committer to read).
    static LOG_PAGES: Cell<c_int> = const { Cell::new(0) };
}

fn note_log_pages(_: &Wal, pages: c_int) -> rusqlite::Result<()> {
    LOG_PAGES.with(|c| c.set(pages));
    Ok(())
}

/// Turns off the connection's own checkpoints and has its commits report
/// the log's length (see [`log_pages_after_commit`]).
pub(crate) fn watch_log(conn: &Connection) -> rusqlite::Result<()> {
    // The pragma sets SQLite's own hook, so it comes first.
    conn.execute_batch("PRAGMA wal_autocheckpoint = 0")?;
    conn.wal_hook(Some(note_log_pages));
    Ok(())
}

/// The log's length in pages after the commit this thread just made on a
/// connection given to [`watch_log`]; 0 when it made none since.
pub(crate) fn log_pages_after_commit() -> c_int {
    LOG_PAGES.with(|c| c.replace(0))
}

#[derive(Default)]
struct State {
    asked: bool,
    stop: bool,
}

/// The checkpointing thread of one store, started by the first commit that
/// needs it and stopped when the store is dropped: a checkpoint under way
/// then ends first, so that nothing of a dropped store still works on its
/// files.
pub(crate) struct Checkpointer {
    path: PathBuf,
    shared: Arc<(Mutex<State>, Condvar)>,
    /// The thread, once started; `Err` when it could not be (the writer
    /// then leaves the log to its own inline checkpoints).
    thread: Mutex<Option<Result<JoinHandle<()>, ()>>>,
}

impl Checkpointer {
    pub(crate) fn new(path: &Path) -> Checkpointer {
        Checkpointer {
            path: path.to_path_buf(),
            shared: Arc::new((Mutex::new(State::default()), Condvar::new())),
            thread: Mutex::new(None),
        }
    }

    /// Asks for a checkpoint soon; asks made while one runs are one ask.
    pub(crate) fn ask(&self) {
        {
            let mut thread = self.thread.lock().unwrap_or_else(|p| p.into_inner());
            let thread = thread.get_or_insert_with(|| self.start().ok_or(()));
            if thread.is_err() {
                return;
            }
        }
        let (lock, cv) = &*self.shared;
        lock.lock().unwrap_or_else(|p| p.into_inner()).asked = true;
        cv.notify_one();
    }

    fn start(&self) -> Option<JoinHandle<()>> {
        let conn = match crate::open_conn(&self.path, false) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(store = %self.path.display(), error = %e, "no connection for checkpoints; the writer makes them");
                return None;
            }
        };
        let shared = self.shared.clone();
        let path = self.path.clone();
        std::thread::Builder::new()
            .name("cairn-checkpoint".into())
            .spawn(move || run(conn, &path, &shared))
            .ok()
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        let (lock, cv) = &*self.shared;
        lock.lock().unwrap_or_else(|p| p.into_inner()).stop = true;
        cv.notify_one();
        let thread = self.thread.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Some(Ok(t)) = thread.take() {
            let _ = t.join();
        }
    }
}

fn run(conn: Connection, path: &Path, shared: &(Mutex<State>, Condvar)) {
    let (lock, cv) = shared;
    loop {
        {
            let mut st = lock.lock().unwrap_or_else(|p| p.into_inner());
            while !st.asked && !st.stop {
                st = cv.wait(st).unwrap_or_else(|p| p.into_inner());
            }
            if st.stop {
                return;
            }
            st.asked = false;
        }
        // PASSIVE never waits for a reader or the writer: what a reader
        // still needs stays in the log for the next checkpoint.
        if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
            tracing::debug!(store = %path.display(), error = %e, "a checkpoint beside the writer failed; the next one takes its pages");
        }
    }
}
