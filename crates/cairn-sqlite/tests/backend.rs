//! The SQLite backend on real files: opening, damage, gc, the inbox,
//! process records and wake-ups. What every backend must do is in
//! `tests/conformance.rs`.

use std::sync::Arc;

use cairn_events::{EventKind, RunCommand, RunId, Scope};
use cairn_sqlite::SqliteBackend;
use cairn_storage::conformance::{finished, node, output, record as run_record, rid, started};
use cairn_storage::prelude::*;
use cairn_storage::{RunFilter, StoreError, Topic};

fn files_in(dir: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn garbage_file_is_corrupt_and_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("cairn.db");
    let garbage: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
    std::fs::write(&db, &garbage).unwrap();
    let err = SqliteBackend::open(&db).unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains("cairn.db") && msg.contains("not a Cairn database"),
        "{msg}"
    );
    assert_eq!(std::fs::read(&db).unwrap(), garbage);
    assert_eq!(files_in(dir.path()), vec!["cairn.db"]);
}

/// A new store is made without waiting for the disk: a power cut soon
/// after can leave its file as zeros (written back never, or only the
/// allocation). Such a file holds nothing and is made again; a file with
/// one byte that is not zero is somebody's, and left alone.
#[test]
fn a_store_file_of_zeros_is_made_again_and_one_with_data_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("cairn.db");
    std::fs::write(&db, vec![0u8; 8192]).unwrap();
    let b = SqliteBackend::open(&db).expect("a file of zeros is a store not yet written");
    assert!(b.list_runs(&RunFilter::default()).unwrap().is_empty());
    drop(b);
    assert_eq!(&std::fs::read(&db).unwrap()[..16], b"SQLite format 3\0");

    let other = dir.path().join("other.db");
    let mut almost = vec![0u8; 8192];
    almost[5000] = 1;
    std::fs::write(&other, &almost).unwrap();
    let err = SqliteBackend::open(&other).unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}");
    assert_eq!(std::fs::read(&other).unwrap(), almost);
}

#[test]
fn foreign_sqlite_database_is_rejected_and_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("other.db");
    {
        let c = rusqlite::Connection::open(&db).unwrap();
        c.execute_batch("CREATE TABLE accounts (id INTEGER PRIMARY KEY, name TEXT)")
            .unwrap();
    }
    let before = std::fs::read(&db).unwrap();
    let err = SqliteBackend::open(&db).unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}");
    assert!(err.to_string().contains("accounts"), "{err}");
    assert_eq!(std::fs::read(&db).unwrap(), before);
}

#[test]
fn damaged_store_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("cairn.db");
    {
        let b = SqliteBackend::open(&db).unwrap();
        b.create_run(&run_record("r1", "pending", 1)).unwrap();
        let evs: Vec<_> = (1..=200)
            .map(|i| {
                cairn_store::StoredEvent::from_event(&cairn_events::Event {
                    run_id: cairn_events::RunId::parse("r1").unwrap(),
                    seq: cairn_events::Seq(i),
                    timestamp_ms: 1,
                    scope: node("a"),
                    kind: output(&"x".repeat(200)),
                })
            })
            .collect();
        b.append(&evs).unwrap();
    }
    // Merge the WAL into the file so the damage below hits the real pages.
    {
        let c = rusqlite::Connection::open(&db).unwrap();
        c.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)").unwrap();
    }
    let mut bytes = std::fs::read(&db).unwrap();
    assert!(bytes.len() > 8192);
    // Keep page 1 (header and schema), scribble over everything after it.
    for (i, b) in bytes.iter_mut().enumerate().skip(4096) {
        *b = (i % 251) as u8;
    }
    std::fs::write(&db, &bytes).unwrap();
    let err = SqliteBackend::open(&db).unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}");
}

/// Scribbles over page `page` (1-based) of the checkpointed store at `db`.
fn scribble_page(db: &std::path::Path, page: i64) {
    let c = rusqlite::Connection::open(db).unwrap();
    c.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)").unwrap();
    let size: i64 = c.query_row("PRAGMA page_size", [], |r| r.get(0)).unwrap();
    drop(c);
    let mut bytes = std::fs::read(db).unwrap();
    let start = ((page - 1) * size) as usize;
    for (i, b) in bytes[start..start + size as usize].iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    std::fs::write(db, &bytes).unwrap();
}

/// A store of many runs, with its `runs` table's root page and one of its
/// leaves, as SQLite numbers them.
fn store_of_runs(db: &std::path::Path, runs: usize) -> (i64, i64) {
    let b = SqliteBackend::open(db).unwrap();
    for i in 0..runs {
        b.create_run(&run_record(&format!("r{i}"), "pending", i as i64))
            .unwrap();
    }
    drop(b);
    let c = rusqlite::Connection::open(db).unwrap();
    let root: i64 = c
        .query_row(
            "SELECT rootpage FROM sqlite_master WHERE name = 'runs'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    let size: i64 = c.query_row("PRAGMA page_size", [], |r| r.get(0)).unwrap();
    c.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)").unwrap();
    drop(c);
    // An interior page of a table (type 5) names its right-most child at
    // bytes 8..12 of its header: the leaf of the last rows.
    let bytes = std::fs::read(db).unwrap();
    let at = ((root - 1) * size) as usize;
    assert_eq!(bytes[at], 5, "the root of 300 runs is an interior page");
    let leaf = u32::from_be_bytes(bytes[at + 8..at + 12].try_into().unwrap()) as i64;
    (root, leaf)
}

#[test]
fn a_damaged_root_page_fails_the_open() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("cairn.db");
    let (root, _) = store_of_runs(&db, 300);
    scribble_page(&db, root);
    let err = SqliteBackend::open(&db).unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}");
}

/// The open reads a table's first rows only (its cost must not grow with
/// the store); a page damaged further in is reported when it is read, as
/// corruption, never a panic or a wrong answer.
#[test]
fn a_damaged_leaf_is_corrupt_when_read() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("cairn.db");
    let (root, leaf) = store_of_runs(&db, 300);
    assert_ne!(root, leaf, "300 runs take more than one page");
    scribble_page(&db, leaf);
    let b = match SqliteBackend::open(&db) {
        Ok(b) => b,
        // The first leaf may be the one damaged.
        Err(StoreError::Corrupt { .. }) => return,
        Err(e) => panic!("{e:?}"),
    };
    let err = b.list_runs(&RunFilter::default()).unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}");
}

#[test]
fn missing_parent_directory_is_created() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("a/b/cairn.db");
    let b = SqliteBackend::open(&db).unwrap();
    assert_eq!(b.path(), db.as_path());
    assert!(db.exists());
    // Reopening an existing store works and keeps its rows.
    b.create_run(&run_record("r", "pending", 1)).unwrap();
    drop(b);
    let b = SqliteBackend::open(&db).unwrap();
    assert!(b.get_run(&rid("r")).unwrap().is_some());
}

/// Another process's notification reaches a listener (a second handle on
/// the same file stands for the other process).
#[tokio::test]
async fn wake_ups_cross_handles_of_one_store() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("s.db");
    let b = SqliteBackend::open(&db).unwrap();
    let other = SqliteBackend::open(&db).unwrap();
    let elsewhere = SqliteBackend::open(&dir.path().join("t.db")).unwrap();
    let mut inbox = b.listen(Topic::Inbox("r")).unwrap();
    elsewhere.notify(Topic::Inbox("r"));
    let quiet = tokio::time::timeout(std::time::Duration::from_millis(200), inbox.wait()).await;
    assert!(quiet.is_err(), "a notification of another store woke it");
    other.notify(Topic::Inbox("r"));
    tokio::time::timeout(std::time::Duration::from_secs(10), inbox.wait())
        .await
        .expect("the inbox listener is woken");
}

/// A listener's marker goes with it, and a topic makes no folder of its
/// own (a folder holds a disk block, which a run's end would give back); a
/// topic's other listener stays and is still woken.
#[tokio::test]
async fn wake_up_markers_go_with_their_listener() {
    let dir = tempfile::tempdir().unwrap();
    let b = SqliteBackend::open(&dir.path().join("s.db")).unwrap();
    // Markers: `wake/<store>/<kind>/<topic>-<listener>`.
    let wake = dir.path().join("wake");
    let markers = || -> usize {
        walk(&wake)
            .iter()
            .filter(|p| {
                p.parent().and_then(|k| k.parent()).and_then(|s| s.parent()) == Some(&*wake)
            })
            .inspect(|p| assert!(p.is_file(), "{} is not a marker file", p.display()))
            .count()
    };
    let before = markers();
    let first = b.listen(Topic::Inbox("r")).unwrap();
    let mut second = b.listen(Topic::Inbox("r")).unwrap();
    assert_eq!(markers(), before + 2);
    drop(first);
    assert_eq!(markers(), before + 1, "the first listener's marker stayed");
    b.notify(Topic::Inbox("r"));
    tokio::time::timeout(std::time::Duration::from_secs(10), second.wait())
        .await
        .expect("the remaining listener is woken");
    drop(second);
    assert_eq!(markers(), before, "the second listener's marker stayed");
    let mut again = b.listen(Topic::Inbox("r")).unwrap();
    b.notify(Topic::Inbox("r"));
    tokio::time::timeout(std::time::Duration::from_secs(10), again.wait())
        .await
        .expect("a new listener is woken");
}

/// Waking the runs of a commit at once reaches the listeners among them,
/// and only those: an inbox listener of the same run hears nothing of its
/// events.
#[tokio::test]
async fn a_commits_runs_are_woken_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let b = SqliteBackend::open(&dir.path().join("s.db")).unwrap();
    let mut events = b.listen(Topic::Events("r7")).unwrap();
    let mut inbox = b.listen(Topic::Inbox("r7")).unwrap();
    let runs: Vec<String> = (0..50).map(|i| format!("r{i}")).collect();
    let topics: Vec<Topic<'_>> = runs.iter().map(|r| Topic::Events(r)).collect();
    b.notify_all(&topics);
    tokio::time::timeout(std::time::Duration::from_secs(10), events.wait())
        .await
        .expect("the events listener among the batch is woken");
    assert!(
        tokio::time::timeout(std::time::Duration::from_millis(200), inbox.wait())
            .await
            .is_err(),
        "an inbox listener was woken by events"
    );
    // Nobody listening: nothing to do, and no error.
    drop(events);
    b.notify_all(&topics);
}

/// Every path under `dir`, folders and files.
fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let p = e.path();
            out.push(p.clone());
            if p.is_dir() {
                out.extend(walk(&p));
            }
        }
    }
    out
}

#[test]
fn gc_deletes_only_finished_old_runs() {
    let dir = tempfile::tempdir().unwrap();
    let b = Arc::new(SqliteBackend::open(&dir.path().join("s.db")).unwrap());
    let j = cairn_store::Journal::open(b.clone(), Default::default()).unwrap();
    // (run, final event kind or None for still running)
    let runs: [(&str, Option<EventKind>); 5] = [
        ("old-finished", Some(finished())),
        (
            "old-failed",
            Some(EventKind::RunFailed {
                error: cairn_events::ErrorInfo::new("x", "y"),
            }),
        ),
        (
            "old-cancelled-leased",
            Some(EventKind::RunCancelled { reason: None }),
        ),
        ("old-running", None),
        ("new-finished", Some(finished())),
    ];
    for (id, end) in runs.iter() {
        b.create_run(&run_record(id, "pending", 1)).unwrap();
        let log = j.run_log(&rid(id)).unwrap();
        log.append(Scope::run(), started());
        log.append(node("a"), output("hi"));
        if let Some(end) = end {
            log.append(Scope::run(), end.clone());
        }
        log.sync_blocking().unwrap();
        b.put_command(
            &rid(id),
            &RunCommand::Cancel {
                graceful: false,
                reason: None,
                by: None,
            },
        )
        .unwrap();
    }
    assert_eq!(
        b.get_run(&rid("old-failed"))
            .unwrap()
            .unwrap()
            .status
            .as_str(),
        "failed"
    );
    assert_eq!(
        b.get_run(&rid("old-running"))
            .unwrap()
            .unwrap()
            .status
            .as_str(),
        "running"
    );

    // Age every run but one by rewriting its row's and its events' times on
    // a side connection (a run's `updated_ms` is the later of the two).
    {
        let c = rusqlite::Connection::open(b.path()).unwrap();
        c.execute(
            "UPDATE runs SET updated_ms = 100 WHERE run_id LIKE 'old-%'",
            [],
        )
        .unwrap();
        c.execute(
            "UPDATE events SET ts = 100 WHERE run IN \
             (SELECT run FROM event_runs WHERE run_id LIKE 'old-%')",
            [],
        )
        .unwrap();
    }
    // A run whose lease is held (being resumed) is left alone.
    let held = loop {
        match b.try_lock_run(&rid("old-cancelled-leased")).unwrap() {
            Some(l) => break l,
            None => std::thread::sleep(std::time::Duration::from_millis(10)),
        }
    };
    let mut deleted = b.delete_finished_before(1_000).unwrap();
    deleted.sort();
    assert_eq!(deleted, ["old-failed", "old-finished"]);
    for id in ["old-failed", "old-finished"] {
        assert!(b.get_run(&rid(id)).unwrap().is_none());
        assert_eq!(b.last_seq(&rid(id)).unwrap(), 0);
        assert!(b.pending_commands(&rid(id)).unwrap().is_empty());
    }
    for id in ["old-cancelled-leased", "old-running", "new-finished"] {
        assert!(b.get_run(&rid(id)).unwrap().is_some(), "{id}");
        assert!(b.last_seq(&rid(id)).unwrap() >= 2, "{id}");
        assert_eq!(b.pending_commands(&rid(id)).unwrap().len(), 1, "{id}");
    }
    drop(held);
    assert_eq!(
        b.delete_finished_before(1_000).unwrap(),
        ["old-cancelled-leased"]
    );
    j.close();
}

#[test]
fn a_damaged_row_is_a_bad_row_of_its_run() {
    let dir = tempfile::tempdir().unwrap();
    let b = SqliteBackend::open(&dir.path().join("s.db")).unwrap();
    b.create_run(&run_record("r", "running", 1)).unwrap();
    {
        let c = rusqlite::Connection::open(b.path()).unwrap();
        c.execute("UPDATE runs SET input = '{not json' WHERE run_id = 'r'", [])
            .unwrap();
    }
    for err in [
        b.get_run(&rid("r")).unwrap_err(),
        b.list_runs(&RunFilter::default()).unwrap_err(),
    ] {
        match &err {
            StoreError::BadRow { run, detail } => {
                assert_eq!(run, "r");
                assert!(detail.contains("input"), "{detail}");
            }
            other => panic!("expected BadRow, got {other:?}"),
        }
    }
}

/// A run id is checked where text becomes one: a row whose id is no run id
/// (written by hand, or damaged) reads back as a bad row, never a panic.
#[test]
fn a_row_with_an_invalid_run_id_is_a_bad_row() {
    let dir = tempfile::tempdir().unwrap();
    let b = SqliteBackend::open(&dir.path().join("s.db")).unwrap();
    b.create_run(&run_record("r", "running", 1)).unwrap();
    let mut child = run_record("c", "running", 2);
    child.parent_run_id = Some(rid("r"));
    b.create_run(&child).unwrap();
    {
        let c = rusqlite::Connection::open(b.path()).unwrap();
        c.execute_batch(
            "PRAGMA foreign_keys = OFF; \
             UPDATE runs SET parent_run_id = '../up' WHERE run_id = 'c'; \
             UPDATE runs SET run_id = 'a b' WHERE run_id = 'r'; \
             UPDATE workflow_sources SET run_id = 'a b' WHERE run_id = 'r';",
        )
        .unwrap();
    }
    match b.get_run(&rid("c")).unwrap_err() {
        StoreError::BadRow { run, detail } => {
            assert_eq!(run, "c");
            assert!(detail.contains("parent_run_id"), "{detail}");
        }
        other => panic!("expected BadRow, got {other:?}"),
    }
    match b.list_runs(&RunFilter::default()).unwrap_err() {
        StoreError::BadRow { run, detail } => {
            assert!(run == "a b" || run == "c", "{run}");
            assert!(detail.contains("run_id"), "{detail}");
        }
        other => panic!("expected BadRow, got {other:?}"),
    }
}

/// A new store is made without a rollback journal (its first page is
/// written to an empty file): it must still come out in WAL mode with the
/// store's page size, and read back whole from a fresh connection, as the
/// next process would.
#[test]
fn a_new_store_is_a_wal_database_with_its_page_size() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("cairn.db");
    let b = SqliteBackend::open(&db).unwrap();
    b.create_run(&run_record("r", "pending", 1)).unwrap();
    let conn = rusqlite::Connection::open(&db).unwrap();
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    let page: i64 = conn
        .query_row("PRAGMA page_size", [], |r| r.get(0))
        .unwrap();
    assert_eq!(page, 8192);
    let runs: i64 = conn
        .query_row("SELECT count(*) FROM runs", [], |r| r.get(0))
        .unwrap();
    assert_eq!(runs, 1);
    drop(conn);
    drop(b);
    // The file's own header says WAL (bytes 18 and 19), so a process that
    // opens it later reads the log.
    let head = std::fs::read(&db).unwrap();
    assert_eq!(&head[18..20], &[2, 2]);
    let b = SqliteBackend::open(&db).unwrap();
    assert!(b.get_run(&rid("r")).unwrap().is_some());
}

/// Who drives a run: the instance named by the backend that holds its lock,
/// as every backend on the store sees it (its own runs included), and nobody
/// once the lock is given back, though the lock file stays.
#[test]
fn drivers_name_the_instance_that_holds_each_run() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("s.db");
    let alpha = SqliteBackend::open(&db).unwrap();
    alpha.name_instance("alpha").unwrap();
    let beta = SqliteBackend::open(&db).unwrap();
    beta.name_instance("beta:2").unwrap();
    assert!(alpha.name_instance("has space").is_err());
    let (r, s) = (RunId::parse("r").unwrap(), RunId::parse("s").unwrap());
    let lease = alpha.try_lock_run(&r).unwrap().unwrap();
    let theirs = beta.try_lock_run(&s).unwrap().unwrap();
    let both = [r.clone(), s.clone()];
    for b in [&alpha, &beta] {
        let d = b.drivers(&both).unwrap();
        assert_eq!(d.get(&r).map(String::as_str), Some("alpha"));
        assert_eq!(d.get(&s).map(String::as_str), Some("beta:2"));
    }
    drop(lease);
    assert_eq!(beta.drivers(&both).unwrap().len(), 1);
    // The next holder's name replaces the last one's.
    let again = beta.try_lock_run(&r).unwrap().unwrap();
    assert_eq!(
        alpha.drivers(&both).unwrap().get(&r).map(String::as_str),
        Some("beta:2")
    );
    drop((again, theirs));
    assert!(alpha.drivers(&both).unwrap().is_empty());
}
