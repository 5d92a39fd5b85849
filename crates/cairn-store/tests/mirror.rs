//! The NDJSON mirror after failures: a write that stops part-way (a full
//! disk), a process that died between a commit and its mirror write, a
//! mirror damaged between two runs of the process. Whatever happened, the
//! mirror ends byte for byte the store's events in seq order.

mod common;

use std::fs::File;
use std::io::{self, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cairn_events::{EventKind, Scope};
use cairn_store::{
    Backend, EventQuery, Journal, JournalOptions, RunLog, SqliteBackend, StoreError,
};
use common::*;

/// A mirror file that writes only as many bytes as its budget allows, then
/// fails as a full disk does. A negative budget means no limit.
struct Budgeted {
    file: File,
    budget: Arc<AtomicI64>,
}

impl Write for Budgeted {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let left = self.budget.load(Ordering::SeqCst);
        if left < 0 {
            return self.file.write(buf);
        }
        if left == 0 {
            return Err(io::Error::from_raw_os_error(ENOSPC));
        }
        let n = buf.len().min(left as usize);
        let n = self.file.write(&buf[..n])?;
        self.budget.fetch_sub(n as i64, Ordering::SeqCst);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

/// "No space left on device" on Linux and the BSDs.
const ENOSPC: i32 = 28;

struct Setup {
    _dir: tempfile::TempDir,
    db: PathBuf,
    logs: PathBuf,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    Setup {
        db: dir.path().join("cairn.db"),
        logs: dir.path().join("logs"),
        _dir: dir,
    }
}

fn journal_with_budget(s: &Setup, budget: &Arc<AtomicI64>) -> Journal {
    let backend = Arc::new(SqliteBackend::open(&s.db).unwrap());
    let budget = budget.clone();
    Journal::open_with_mirror_writer(
        backend,
        JournalOptions {
            log_dir: Some(s.logs.clone()),
        },
        move |file| {
            Box::new(Budgeted {
                file,
                budget: budget.clone(),
            })
        },
    )
    .unwrap()
}

fn from_store(b: &Arc<dyn Backend>, run: &str) -> String {
    b.read_events(
        &cairn_events::RunId::parse(run).unwrap(),
        &EventQuery::default(),
    )
    .unwrap()
    .iter()
    .map(|e| format!("{}\n", e.json))
    .collect()
}

fn mirror_of(s: &Setup, run: &str) -> String {
    std::fs::read_to_string(s.logs.join(run).join("events.ndjson")).unwrap()
}

fn take_log(j: &Journal, run: &str) -> RunLog {
    loop {
        match j.run_log(&cairn_events::RunId::parse(run).unwrap()) {
            Ok(l) => return l,
            Err(StoreError::LeaseHeld { .. }) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => panic!("{e}"),
        }
    }
}

fn write_lines(log: &RunLog, from: usize, n: usize) {
    for i in from..from + n {
        log.append(node("a"), output(&format!("line {i} of the build")));
    }
    log.sync_blocking().unwrap();
}

#[test]
fn a_write_that_stops_part_way_is_repaired_by_the_next_append() {
    let s = setup();
    let budget = Arc::new(AtomicI64::new(-1));
    let j = journal_with_budget(&s, &budget);
    let log = j
        .run_log(&cairn_events::RunId::parse("r").unwrap())
        .unwrap();
    log.append(Scope::run(), started());
    write_lines(&log, 0, 100);
    // The disk fills up half-way through the next line (one event, so one
    // batch: a later batch would repair the line before failing in turn).
    budget.store(40, Ordering::SeqCst);
    write_lines(&log, 100, 1);
    let torn = mirror_of(&s, "r");
    assert!(!torn.ends_with('\n'), "the failure must leave a torn line");
    assert_eq!(torn.lines().count(), 102);
    // Still full: the next batches are committed but the mirror cannot follow.
    budget.store(0, Ordering::SeqCst);
    write_lines(&log, 101, 5);
    // Space again: the next append repairs the mirror from the store.
    budget.store(-1, Ordering::SeqCst);
    write_lines(&log, 106, 3);
    let b = j.backend().clone();
    assert_eq!(
        b.last_seq(&cairn_events::RunId::parse("r").unwrap())
            .unwrap(),
        110
    );
    assert_eq!(mirror_of(&s, "r"), from_store(&b, "r"));
    drop(log);
    j.close();
}

#[test]
fn a_run_that_ends_right_after_a_failed_write_leaves_a_whole_mirror() {
    let s = setup();
    let budget = Arc::new(AtomicI64::new(-1));
    let j = journal_with_budget(&s, &budget);
    let log = j
        .run_log(&cairn_events::RunId::parse("r").unwrap())
        .unwrap();
    log.append(Scope::run(), started());
    write_lines(&log, 0, 50);
    budget.store(25, Ordering::SeqCst);
    log.append(node("a"), output("last words"));
    log.append(Scope::run(), finished());
    log.sync_blocking().unwrap();
    assert_eq!(
        budget.load(Ordering::SeqCst),
        0,
        "the budget must have cut a write"
    );
    // The terminal event closes the mirror; closing repairs it. The repair
    // writes to the file itself, so the budget does not stop it.
    assert_eq!(mirror_of(&s, "r"), from_store(j.backend(), "r"));
    drop(log);
    j.close();
}

#[test]
fn a_resume_repairs_a_mirror_left_torn_or_behind() {
    let s = setup();
    let write_run = |from: usize, n: usize| {
        let j = open(&s.db, Some(&s.logs));
        let log = take_log(&j, "r");
        if from == 0 {
            log.append(Scope::run(), started());
        }
        write_lines(&log, from, n);
        drop(log);
        j.close();
    };
    let path = s.logs.join("r/events.ndjson");
    let expect = || {
        let j = open(&s.db, None);
        let text = from_store(j.backend(), "r");
        j.close();
        text
    };
    write_run(0, 200);
    let whole = std::fs::read(&path).unwrap();

    // A torn last line, as a crash in the middle of a write leaves it.
    std::fs::write(&path, &whole[..whole.len() - 30]).unwrap();
    write_run(200, 5);
    assert_eq!(mirror_of(&s, "r"), expect());

    // Whole lines missing, as a crash between a commit and its mirror write
    // leaves it (and a torn line after them).
    let whole = std::fs::read(&path).unwrap();
    let cut = whole.len() - 1200;
    std::fs::write(&path, &whole[..cut]).unwrap();
    write_run(205, 5);
    assert_eq!(mirror_of(&s, "r"), expect());

    // Lines the store does not have (another run under the same id, since
    // deleted): the mirror is rewritten from the store.
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    f.write_all(b"{\"runId\":\"r\",\"seq\":9999}\n").unwrap();
    drop(f);
    write_run(210, 5);
    assert_eq!(mirror_of(&s, "r"), expect());

    // Garbage.
    std::fs::write(&path, "not json\nat all").unwrap();
    write_run(215, 1);
    assert_eq!(mirror_of(&s, "r"), expect());
    assert_eq!(expect().lines().count(), 217);
}

#[test]
fn a_mirror_missing_its_start_is_filled_from_the_store() {
    // The first events were written without a mirror (`--no-log`), the rest
    // with one.
    let s = setup();
    {
        let j = open(&s.db, None);
        let log = j
            .run_log(&cairn_events::RunId::parse("r").unwrap())
            .unwrap();
        log.append(Scope::run(), started());
        write_lines(&log, 0, 20);
        drop(log);
        j.close();
    }
    let j = open(&s.db, Some(&s.logs));
    let log = take_log(&j, "r");
    write_lines(&log, 20, 3);
    assert_eq!(mirror_of(&s, "r"), from_store(j.backend(), "r"));
    drop(log);
    j.close();
}

#[test]
fn a_failing_mirror_never_fails_the_run() {
    let s = setup();
    let budget = Arc::new(AtomicI64::new(0));
    let j = journal_with_budget(&s, &budget);
    let log = j
        .run_log(&cairn_events::RunId::parse("r").unwrap())
        .unwrap();
    log.append(Scope::run(), started());
    write_lines(&log, 0, 10);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let ev = rt
        .block_on(log.append_durable(Scope::run(), EventKind::RunCancelled { reason: None }))
        .unwrap();
    assert_eq!(ev.seq, cairn_events::Seq(12));
    assert_eq!(
        j.backend()
            .last_seq(&cairn_events::RunId::parse("r").unwrap())
            .unwrap(),
        12
    );
    drop(log);
    j.close();
    assert_eq!(mirror_of(&s, "r"), from_store(j.backend(), "r"));
}

#[test]
fn lines_longer_than_a_read_chunk_are_repaired_too() {
    // The repair looks for line ends backwards, 64 KiB at a time.
    let s = setup();
    let big = |n: usize| "ü".repeat(n);
    {
        let j = open(&s.db, Some(&s.logs));
        let log = j
            .run_log(&cairn_events::RunId::parse("r").unwrap())
            .unwrap();
        log.append(Scope::run(), started());
        log.append(node("a"), output(&big(50_000)));
        log.append(node("a"), output(&big(90_000)));
        log.sync_blocking().unwrap();
        drop(log);
        j.close();
    }
    let path = s.logs.join("r/events.ndjson");
    let whole = std::fs::read(&path).unwrap();
    assert!(whole.len() > 3 * 64 * 1024);
    // Torn in the middle of the last, 180 KB line.
    std::fs::write(&path, &whole[..whole.len() - 70_000]).unwrap();
    let j = open(&s.db, Some(&s.logs));
    let log = take_log(&j, "r");
    log.append(node("a"), output(&big(10)));
    log.sync_blocking().unwrap();
    assert_eq!(mirror_of(&s, "r"), from_store(j.backend(), "r"));
    drop(log);
    j.close();
}
