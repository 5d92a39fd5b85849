//! The journal on real files: sequencing, durability waits, the NDJSON
//! mirror, subscriptions and leases (also across a real child process).

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cairn_events::{Event, EventKind, Scope};
use cairn_store::{EventQuery, StoreError};
use common::*;

fn seqs(evs: &[cairn_store::StoredEvent]) -> Vec<u64> {
    evs.iter().map(|e| e.seq).collect()
}

#[tokio::test]
async fn append_read_and_filter() {
    let dir = tempfile::tempdir().unwrap();
    let j = open(&dir.path().join("s.db"), None);
    j.backend()
        .create_run(&run_record("r", "pending", 1))
        .unwrap();
    let log = j
        .run_log(&cairn_events::RunId::parse("r").unwrap())
        .unwrap();
    let e1 = log.append_durable(Scope::run(), started()).await.unwrap();
    assert_eq!((e1.seq.get(), e1.run_id.as_str()), (1, "r"));
    log.append(
        Scope::node("a", 0),
        EventKind::NodePending {
            layer_index: Some(0),
        },
    );
    log.append(
        Scope::node("b", 0),
        EventKind::NodePending {
            layer_index: Some(0),
        },
    );
    log.append(node("a"), EventKind::NodeStarted { snapshot: None });
    log.append(node("a"), output("one"));
    log.append(node("b"), EventKind::NodeStarted { snapshot: None });
    log.append(node("a"), output("two"));
    let last = log.append(Scope::run(), finished());
    assert_eq!(last.seq, cairn_events::Seq(8));
    log.sync().await.unwrap();

    let b = j.backend();
    let all = b
        .read_events(
            &cairn_events::RunId::parse("r").unwrap(),
            &EventQuery::default(),
        )
        .unwrap();
    assert_eq!(seqs(&all), (1..=8).collect::<Vec<_>>());
    // Every stored line decodes to the event that was appended.
    assert_eq!(all[7].decode().unwrap(), last);
    assert_eq!(all[0].decode().unwrap(), e1);
    let q = |types: &[&str], node: Option<&str>, after: u64, limit: Option<usize>| EventQuery {
        after,
        types: types.iter().map(|s| s.parse().unwrap()).collect(),
        node: node.map(str::to_string),
        limit,
    };
    assert_eq!(
        seqs(
            &b.read_events(
                &cairn_events::RunId::parse("r").unwrap(),
                &q(&["NodeOutput"], None, 0, None)
            )
            .unwrap()
        ),
        [5, 7]
    );
    assert_eq!(
        seqs(
            &b.read_events(
                &cairn_events::RunId::parse("r").unwrap(),
                &q(&[], Some("a"), 0, None)
            )
            .unwrap()
        ),
        [2, 4, 5, 7]
    );
    assert_eq!(
        seqs(
            &b.read_events(
                &cairn_events::RunId::parse("r").unwrap(),
                &q(&["NodeStarted", "NodePending"], Some("b"), 0, None)
            )
            .unwrap()
        ),
        [3, 6]
    );
    assert_eq!(
        seqs(
            &b.read_events(
                &cairn_events::RunId::parse("r").unwrap(),
                &q(&[], None, 5, Some(2))
            )
            .unwrap()
        ),
        [6, 7]
    );
    assert_eq!(
        b.last_seq(&cairn_events::RunId::parse("r").unwrap())
            .unwrap(),
        8
    );
    assert_eq!(
        b.last_seq(&cairn_events::RunId::parse("other").unwrap())
            .unwrap(),
        0
    );
    j.close();
}

#[test]
fn seq_continues_across_reopen_and_observer_sees_seq_order() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("s.db");
    {
        let j = open(&db, None);
        let log = j
            .run_log(&cairn_events::RunId::parse("r").unwrap())
            .unwrap();
        for i in 0..3 {
            log.append(node("a"), output(&i.to_string()));
        }
        // Not synced: close must still commit them.
        j.close();
    }
    let j = open(&db, None);
    let log = Arc::new(
        j.run_log(&cairn_events::RunId::parse("r").unwrap())
            .unwrap(),
    );
    assert_eq!(log.last_seq(), 3);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s2 = seen.clone();
    log.set_observer(Box::new(move |e: &Event| s2.lock().unwrap().push(e.seq)));
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let log = log.clone();
            std::thread::spawn(move || {
                for i in 0..250 {
                    log.append(node(&format!("n{t}")), output(&i.to_string()));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    log.sync_blocking().unwrap();
    assert_eq!(*seen.lock().unwrap(), (4..=1003).collect::<Vec<_>>());
    let all = j
        .backend()
        .read_events(
            &cairn_events::RunId::parse("r").unwrap(),
            &EventQuery::default(),
        )
        .unwrap();
    assert_eq!(seqs(&all), (1..=1003).collect::<Vec<_>>());
    // Timestamps never go backwards within a run.
    assert!(all
        .windows(2)
        .all(|w| w[0].timestamp_ms <= w[1].timestamp_ms));
    j.close();
}

/// A tool call's row queued on the log is committed with the event
/// appended after it: whoever waits for that event finds the row; a row
/// the store refuses stops the run's log, as a lost event does.
#[tokio::test]
async fn tool_call_rows_commit_with_the_events_after_them() {
    use cairn_store::{ToolCallRecord, ToolCallStatus};
    let dir = tempfile::tempdir().unwrap();
    let j = open(&dir.path().join("s.db"), None);
    let call = |run: &str, seq: u32| ToolCallRecord {
        run_id: cairn_events::RunId::parse(run).unwrap(),
        node_id: "a".into(),
        iteration: 0,
        attempt: 1,
        tool_seq: seq,
        tool: "read".into(),
        idempotency_key: format!("{run}/a/0/1/{seq}"),
        side_effect: false,
        idempotent: true,
        input: serde_json::json!({"path": "x"}),
        output: None,
        started_ms: 1,
        finished_ms: None,
        status: ToolCallStatus::Running,
        error: None,
    };
    let rows = |run: &str| {
        j.backend()
            .tool_calls(
                &cairn_events::RunId::parse(run).unwrap(),
                &cairn_events::NodePath::from("a"),
                0,
            )
            .unwrap()
    };
    j.backend()
        .create_run(&run_record("r", "running", 1))
        .unwrap();
    let log = j
        .run_log(&cairn_events::RunId::parse("r").unwrap())
        .unwrap();
    log.append_durable(Scope::run(), started()).await.unwrap();
    for seq in 1..=50 {
        log.record_tool_call(call("r", seq));
        log.append(node("a"), output("between"));
    }
    let mut done = call("r", 50);
    done.status = ToolCallStatus::Success;
    done.finished_ms = Some(2);
    log.record_tool_call(done.clone());
    log.append_durable(node("a"), output("after"))
        .await
        .unwrap();
    let kept = rows("r");
    assert_eq!(kept.len(), 50);
    assert_eq!(kept[49], done, "the later row replaces the earlier");

    // A run with no row: its call is refused, and the log stops there.
    let ghost = j
        .run_log(&cairn_events::RunId::parse("ghost").unwrap())
        .unwrap();
    ghost.append_durable(Scope::run(), started()).await.unwrap();
    ghost.record_tool_call(call("ghost", 1));
    let err = ghost
        .append_durable(node("a"), output("after the call"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("ghost"), "{err}");
    assert_eq!(
        j.backend()
            .last_seq(&cairn_events::RunId::parse("ghost").unwrap())
            .unwrap(),
        1
    );
    // The other run's log goes on.
    log.record_tool_call(call("r", 51));
    log.append_durable(node("a"), output("still"))
        .await
        .unwrap();
    assert_eq!(rows("r").len(), 51);
}

#[tokio::test]
async fn appends_after_close_fail_their_waiters() {
    let dir = tempfile::tempdir().unwrap();
    let j = open(&dir.path().join("s.db"), None);
    let log = j
        .run_log(&cairn_events::RunId::parse("r").unwrap())
        .unwrap();
    log.append_durable(Scope::run(), started()).await.unwrap();
    j.close();
    let err = log
        .append_durable(node("a"), output("late"))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Closed), "{err:?}");
    assert!(matches!(log.sync_blocking(), Err(StoreError::Closed)));
    assert_eq!(
        j.backend()
            .last_seq(&cairn_events::RunId::parse("r").unwrap())
            .unwrap(),
        1
    );
    assert!(matches!(
        j.run_log(&cairn_events::RunId::parse("x").unwrap()),
        Err(StoreError::Closed)
    ));
}

#[test]
fn ndjson_mirror_is_byte_identical_and_export_regenerates_it() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("s.db");
    let logs = dir.path().join("logs");
    let j = open(&db, Some(&logs));
    let log = j
        .run_log(&cairn_events::RunId::parse("r").unwrap())
        .unwrap();
    log.append(Scope::run(), started());
    for i in 0..500 {
        log.append(node("a"), output(&format!("line {i} \"quoted\" ünïcode\n")));
    }
    log.sync_blocking().unwrap();
    drop(log);
    // A resume appends to the same file.
    let log = loop {
        match j.run_log(&cairn_events::RunId::parse("r").unwrap()) {
            Ok(l) => break l,
            Err(StoreError::LeaseHeld { .. }) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => panic!("{e}"),
        }
    };
    log.append(Scope::run(), finished());
    log.sync_blocking().unwrap();

    let from_store = || -> String {
        j.backend()
            .read_events(
                &cairn_events::RunId::parse("r").unwrap(),
                &EventQuery::default(),
            )
            .unwrap()
            .iter()
            .map(|e| format!("{}\n", e.json))
            .collect()
    };
    let mirror = logs.join("r/events.ndjson");
    let expected = from_store();
    assert_eq!(expected.lines().count(), 502);
    assert_eq!(std::fs::read_to_string(&mirror).unwrap(), expected);

    // Damage the mirror; export rewrites it from the store.
    std::fs::write(&mirror, "garbage\n").unwrap();
    let out = dir.path().join("exported");
    let path = j
        .export(&cairn_events::RunId::parse("r").unwrap(), &out)
        .unwrap();
    assert_eq!(path, out.join("r/events.ndjson"));
    assert_eq!(std::fs::read_to_string(&path).unwrap(), expected);
    let path = j
        .export(&cairn_events::RunId::parse("r").unwrap(), &logs)
        .unwrap();
    assert_eq!(std::fs::read_to_string(&path).unwrap(), expected);
    assert!(matches!(
        j.export(&cairn_events::RunId::parse("ghost").unwrap(), &out),
        Err(StoreError::RunNotFound(_))
    ));
    j.close();
}

/// Collects a subscription until it ends, checking there is no gap or
/// duplicate.
async fn drain(mut sub: cairn_store::Subscription, after: u64) -> Vec<u64> {
    let mut got = Vec::new();
    while let Some(ev) = sub.next().await {
        let ev = ev.unwrap();
        got.push(ev.seq);
    }
    let want: Vec<u64> = (after + 1..=after + got.len() as u64).collect();
    assert_eq!(
        got, want,
        "subscription after {after} had a gap or duplicate"
    );
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribe_replays_then_follows_live_without_seam() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("s.db");
    let j = open(&db, None);
    // A second journal on the same file sees the runs only through the
    // store, as another process would.
    let other = open(&db, None);
    for iter in 0..20u64 {
        let run = format!("r{iter}");
        let log = Arc::new(
            j.run_log(&cairn_events::RunId::parse(&run).unwrap())
                .unwrap(),
        );
        let total = 300 + iter * 37;
        let writer = {
            let log = log.clone();
            tokio::task::spawn_blocking(move || {
                log.append(Scope::run(), started());
                for i in 1..total - 1 {
                    log.append(node("a"), output(&i.to_string()));
                    if i % 50 == 0 {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
                log.append(Scope::run(), finished());
            })
        };
        let mut subs = Vec::new();
        for k in 0..6u64 {
            // Subscribe at different moments, from different points.
            tokio::time::sleep(Duration::from_micros(300 * k)).await;
            let committed = j
                .backend()
                .last_seq(&cairn_events::RunId::parse(&run).unwrap())
                .unwrap();
            let after = (committed * k / 6).min(total - 1);
            let journal = if k % 3 == 2 { &other } else { &j };
            let sub = journal
                .subscribe(&cairn_events::RunId::parse(&run).unwrap(), after)
                .unwrap();
            subs.push(tokio::spawn(
                async move { (after, drain(sub, after).await) },
            ));
        }
        writer.await.unwrap();
        for s in subs {
            let (after, got) = tokio::time::timeout(Duration::from_secs(30), s)
                .await
                .expect("subscription did not end")
                .unwrap();
            assert_eq!(got.last().copied(), Some(total), "after {after}");
        }
        // Subscribing right after the terminal event ends at once.
        let mut sub = j
            .subscribe(&cairn_events::RunId::parse(&run).unwrap(), total)
            .unwrap();
        assert!(sub.next().await.is_none());
    }
    j.close();
    other.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscription_continues_across_resume_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let j = open(&dir.path().join("s.db"), None);
    let log = j
        .run_log(&cairn_events::RunId::parse("r").unwrap())
        .unwrap();
    log.append(Scope::run(), started());
    log.append(Scope::run(), finished());
    log.sync().await.unwrap();
    let mut sub = j
        .subscribe(&cairn_events::RunId::parse("r").unwrap(), 0)
        .unwrap()
        .stop_at_terminal(false);
    assert_eq!(sub.next().await.unwrap().unwrap().seq, 1);
    assert_eq!(sub.next().await.unwrap().unwrap().seq, 2);
    drop(log);
    let log = loop {
        match j.run_log(&cairn_events::RunId::parse("r").unwrap()) {
            Ok(l) => break l,
            Err(StoreError::LeaseHeld { .. }) => tokio::time::sleep(Duration::from_millis(5)).await,
            Err(e) => panic!("{e}"),
        }
    };
    log.append(Scope::run(), started());
    let ev = tokio::time::timeout(Duration::from_secs(10), sub.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!((ev.seq, ev.type_name.as_str()), (3, "RunStarted"));
    j.close();
}

#[tokio::test]
async fn lagging_subscriber_catches_up_from_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let j = open(&dir.path().join("s.db"), None);
    let log = j
        .run_log(&cairn_events::RunId::parse("r").unwrap())
        .unwrap();
    log.append_durable(Scope::run(), started()).await.unwrap();
    let mut sub = j
        .subscribe(&cairn_events::RunId::parse("r").unwrap(), 0)
        .unwrap();
    let mut all = j.subscribe_all();
    assert_eq!(sub.next().await.unwrap().unwrap().seq, 1);
    // Far more than the live channels keep, while the subscriber reads
    // nothing.
    for i in 0..20_000 {
        log.append(node("a"), output(&i.to_string()));
    }
    log.append(Scope::run(), finished());
    log.sync().await.unwrap();
    assert!(matches!(
        all.try_recv(),
        Err(tokio::sync::broadcast::error::TryRecvError::Lagged(_))
    ));
    // What the live channel dropped comes from the store: every event
    // once, in order, to the run's end.
    let mut expect = 2;
    while let Some(ev) = sub.next().await {
        assert_eq!(ev.unwrap().seq, expect);
        expect += 1;
    }
    assert_eq!(expect, 20_003);
    j.close();
}

/// A subscriber that falls behind while the run goes on, over and over:
/// it reads between live events and the store with no gap and no
/// duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_falling_behind_again_and_again_sees_every_event_once() {
    let dir = tempfile::tempdir().unwrap();
    let j = open(&dir.path().join("s.db"), None);
    let log = Arc::new(
        j.run_log(&cairn_events::RunId::parse("r").unwrap())
            .unwrap(),
    );
    log.append_durable(Scope::run(), started()).await.unwrap();
    let mut sub = j
        .subscribe(&cairn_events::RunId::parse("r").unwrap(), 0)
        .unwrap();
    let writer = {
        let log = log.clone();
        tokio::spawn(async move {
            for burst in 0..50 {
                for i in 0..(burst * 37 % 900 + 1) {
                    log.append(node("a"), output(&format!("{burst}.{i}")));
                }
                log.sync().await.unwrap();
                tokio::task::yield_now().await;
            }
            log.append_durable(Scope::run(), finished()).await.unwrap();
        })
    };
    let mut expect = 1;
    let mut n = 0u64;
    while let Some(ev) = sub.next().await {
        assert_eq!(ev.unwrap().seq, expect);
        expect += 1;
        n += 1;
        // Slow now and then, so that the channel overflows.
        if n.is_multiple_of(500) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    writer.await.unwrap();
    assert_eq!(expect, log.last_seq() + 1);
    drop(log);
    j.close();
}

/// A long-lived process keeps nothing of a run once no `RunLog` or
/// subscription of it is left here, whichever goes last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finished_runs_are_forgotten() {
    let dir = tempfile::tempdir().unwrap();
    let j = open(&dir.path().join("s.db"), None);
    for i in 0..60 {
        let run = format!("r{i}");
        let log = j
            .run_log(&cairn_events::RunId::parse(&run).unwrap())
            .unwrap();
        let sub = (i % 3 != 0).then(|| {
            j.subscribe(&cairn_events::RunId::parse(&run).unwrap(), 0)
                .unwrap()
        });
        log.append(Scope::run(), started());
        log.append_durable(Scope::run(), finished()).await.unwrap();
        if let Some(mut sub) = sub {
            if i % 3 == 1 {
                // The subscription outlives the log.
                drop(log);
                while sub.next().await.is_some() {}
                drop(sub);
            } else {
                while sub.next().await.is_some() {}
                drop(sub);
                drop(log);
            }
        } else {
            drop(log);
        }
        // A watcher of a finished run, from the store alone.
        let mut late = j
            .subscribe(&cairn_events::RunId::parse(&run).unwrap(), 1)
            .unwrap();
        assert_eq!(late.next().await.unwrap().unwrap().seq, 2);
        assert!(late.next().await.is_none());
    }
    // The writer releases each run's lease after committing what it
    // queued; the run is forgotten then.
    let t0 = std::time::Instant::now();
    while j.runs_in_memory() > 0 && t0.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(j.runs_in_memory(), 0, "runs kept after their end");
    j.close();
}

#[test]
fn lease_is_exclusive_across_journals() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("s.db");
    let a = open(&db, None);
    let b = open(&db, None);
    let log = a
        .run_log(&cairn_events::RunId::parse("r").unwrap())
        .unwrap();
    log.append(Scope::run(), started());
    assert!(
        matches!(b.run_log(&cairn_events::RunId::parse("r").unwrap()), Err(StoreError::LeaseHeld { ref run }) if run == "r")
    );
    assert!(matches!(
        a.run_log(&cairn_events::RunId::parse("r").unwrap()),
        Err(StoreError::LeaseHeld { .. })
    ));
    // Other runs and other writes are not blocked meanwhile.
    let other = b
        .run_log(&cairn_events::RunId::parse("s").unwrap())
        .unwrap();
    b.backend()
        .create_run(&run_record("s", "pending", 1))
        .unwrap();
    drop(other);
    drop(log);
    // The lease goes once the writer has committed what was queued before.
    let log = loop {
        match b.run_log(&cairn_events::RunId::parse("r").unwrap()) {
            Ok(l) => break l,
            Err(StoreError::LeaseHeld { .. }) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(log.last_seq(), 1);
    a.close();
    b.close();
}

/// Run by `lease_is_held_by_another_process_until_it_dies` in a child
/// process: takes the lease, says so, and waits to be killed.
#[test]
#[ignore = "helper, run as a child process"]
fn child_holds_lease() {
    let Ok(db) = std::env::var("CAIRN_STORE_TEST_DB") else {
        return;
    };
    let j = open(std::path::Path::new(&db), None);
    let log = j
        .run_log(&cairn_events::RunId::parse("shared").unwrap())
        .unwrap();
    log.append(Scope::run(), started());
    log.sync_blocking().unwrap();
    println!("LOCKED");
    std::io::stdout().flush().unwrap();
    std::thread::sleep(Duration::from_secs(60));
}

#[test]
fn lease_is_held_by_another_process_until_it_dies() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("s.db");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "child_holds_lease",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("CAIRN_STORE_TEST_DB", &db)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    loop {
        let line = lines.next().expect("child ended before locking").unwrap();
        if line.contains("LOCKED") {
            break;
        }
    }
    let j = open(&db, None);
    assert!(matches!(
        j.run_log(&cairn_events::RunId::parse("shared").unwrap()),
        Err(StoreError::LeaseHeld { .. })
    ));
    // Another process may still read and queue controls while it runs.
    j.backend()
        .create_run(&run_record("shared", "running", 1))
        .unwrap();
    assert_eq!(
        j.backend()
            .last_seq(&cairn_events::RunId::parse("shared").unwrap())
            .unwrap(),
        1
    );
    child.kill().unwrap(); // SIGKILL: the kernel releases the flock.
    child.wait().unwrap();
    let log = j
        .run_log(&cairn_events::RunId::parse("shared").unwrap())
        .unwrap();
    assert_eq!(
        log.append(Scope::run(), started()).seq,
        cairn_events::Seq(2)
    );
    log.sync_blocking().unwrap();
    j.close();
}

#[tokio::test]
async fn subscribing_after_a_finished_runs_end_ends_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let j = open(&dir.path().join("s.db"), None);
    j.backend()
        .create_run(&run_record("r", "pending", 1))
        .unwrap();
    let log = j
        .run_log(&cairn_events::RunId::parse("r").unwrap())
        .unwrap();
    log.append(Scope::run(), started());
    log.append_durable(
        Scope::run(),
        EventKind::RunFinished {
            output: None,
            duration_ms: 1,
        },
    )
    .await
    .unwrap();
    drop(log);
    // Let the writer give the lease back, as a finished `cairn run` would.
    tokio::time::sleep(Duration::from_millis(50)).await;
    for after in [2, 5] {
        let mut sub = j
            .subscribe(&cairn_events::RunId::parse("r").unwrap(), after)
            .unwrap();
        let next = tokio::time::timeout(Duration::from_secs(5), sub.next())
            .await
            .expect("a subscription past a finished run's end must end, not hang");
        assert!(next.is_none());
    }
}

/// The events of run `r` in a copy of the database file alone, without its
/// write-ahead log: what a backup of `cairn.db` would hold.
fn events_in_main_file(db: &std::path::Path) -> i64 {
    let copy_dir = tempfile::tempdir().unwrap();
    let copy = copy_dir.path().join("copy.db");
    std::fs::copy(db, &copy).unwrap();
    let c = rusqlite::Connection::open(&copy).unwrap();
    c.query_row(
        "SELECT count(*) FROM events WHERE run = \
         (SELECT run FROM event_runs WHERE run_id = 'r')",
        [],
        |r| r.get(0),
    )
    .unwrap_or(0)
}

fn wal_len(db: &std::path::Path) -> u64 {
    let mut wal = db.as_os_str().to_owned();
    wal.push("-wal");
    std::fs::metadata(wal).map(|m| m.len()).unwrap_or(0)
}

/// Appends `n` output lines of about 1.5 KB to `log` (a log of the store
/// `db`): 3,000 of them grow the write-ahead log past
/// [`cairn_sqlite::CHECKPOINT_FROM`], the size from which a process that
/// stops writing moves it into the database file, and stay under the 1,000
/// pages at which SQLite checkpoints on its own. They must go in a few
/// large commits for that: the log holds every page a commit changed, so
/// lines committed a few at a time (as a fast writer on an idle machine
/// commits them) outgrow it, and SQLite's own checkpoint would do what the
/// tests check the journal does. Holding the database's write lock while
/// appending makes the writer wait and then take the lines in one batch.
fn append_lines(db: &std::path::Path, log: &cairn_store::RunLog, n: usize) {
    let lock = rusqlite::Connection::open(db).unwrap();
    lock.execute_batch("BEGIN IMMEDIATE").unwrap();
    let pad = "x".repeat(1500);
    for i in 0..n {
        log.append(node("a"), output(&format!("line {i} {pad}")));
    }
    lock.execute_batch("COMMIT").unwrap();
}

/// Lines of [`append_lines`] that grow the log past the checkpoint's size.
const LARGE: usize = 3000;

#[test]
fn closing_the_journal_moves_the_log_into_the_database_file() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("cairn.db");
    let j = open(&db, None);
    // Hold a RunLog of another run so that dropping `r`'s is not this
    // process's last: only the close checkpoints here.
    let other = j
        .run_log(&cairn_events::RunId::parse("other").unwrap())
        .unwrap();
    let log = j
        .run_log(&cairn_events::RunId::parse("r").unwrap())
        .unwrap();
    append_lines(&db, &log, LARGE);
    log.sync_blocking().unwrap();
    assert!(wal_len(&db) >= cairn_sqlite::CHECKPOINT_FROM);
    assert_eq!(events_in_main_file(&db), 0, "the data is still in the WAL");
    drop(log);
    drop(other);
    j.close();
    // The backend (and its connections) is still alive through `j`.
    assert_eq!(
        j.backend()
            .last_seq(&cairn_events::RunId::parse("r").unwrap())
            .unwrap(),
        LARGE as u64
    );
    assert_eq!(wal_len(&db), 0);
    assert_eq!(events_in_main_file(&db), LARGE as i64);
}

#[test]
fn dropping_the_last_run_log_checkpoints_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("cairn.db");
    let j = open(&db, None);
    let log = j
        .run_log(&cairn_events::RunId::parse("r").unwrap())
        .unwrap();
    append_lines(&db, &log, LARGE);
    log.sync_blocking().unwrap();
    assert_eq!(events_in_main_file(&db), 0, "the data is still in the WAL");
    drop(log);
    // The writer releases the lease, then checkpoints; nothing tells when it
    // is done but the file itself.
    for _ in 0..1000 {
        if wal_len(&db) == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(wal_len(&db), 0);
    assert_eq!(events_in_main_file(&db), LARGE as i64);
    j.close();
}

#[test]
fn a_short_runs_log_stays_in_the_wal_for_the_next_process() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("cairn.db");
    let j = open(&db, None);
    let log = j
        .run_log(&cairn_events::RunId::parse("r").unwrap())
        .unwrap();
    for i in 0..300 {
        log.append(node("a"), output(&format!("line {i}")));
    }
    log.sync_blocking().unwrap();
    drop(log);
    j.close();
    drop(j);
    // Neither the end of the process's runs nor the last connection's close
    // paid for a checkpoint: the log is still there, with everything in it.
    assert!(wal_len(&db) > 0);
    assert!(wal_len(&db) < cairn_sqlite::CHECKPOINT_FROM);
    assert_eq!(events_in_main_file(&db), 0, "the data is in the WAL");
    // The next process reads it back as part of the store.
    let again = open(&db, None);
    assert_eq!(
        again
            .backend()
            .last_seq(&cairn_events::RunId::parse("r").unwrap())
            .unwrap(),
        300
    );
    let evs = again
        .backend()
        .read_events(
            &cairn_events::RunId::parse("r").unwrap(),
            &EventQuery::default(),
        )
        .unwrap();
    assert_eq!(seqs(&evs), (1..=300).collect::<Vec<_>>());
    again.close();
}

#[test]
fn a_reader_in_another_connection_does_not_fail_or_block_the_close() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("cairn.db");
    let j = open(&db, None);
    let log = j
        .run_log(&cairn_events::RunId::parse("r").unwrap())
        .unwrap();
    append_lines(&db, &log, LARGE);
    log.sync_blocking().unwrap();
    // Another process in the middle of a read transaction.
    let reader = rusqlite::Connection::open(&db).unwrap();
    reader.execute_batch("BEGIN").unwrap();
    let n: i64 = reader
        .query_row("SELECT count(*) FROM events", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, LARGE as i64);
    drop(log);
    j.close();
    // The log could not be emptied under the reader, but its frames are in
    // the database file.
    assert_eq!(events_in_main_file(&db), LARGE as i64);
    reader.execute_batch("COMMIT").unwrap();
}

/// A run started through the journal: its row, its first event and what
/// follows reach the store, the in-process callback, a subscription made
/// before the start (which reads nothing) and the NDJSON mirror, each in
/// seq order, the first event included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_started_run_reaches_every_watcher_from_its_first_event() {
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("logs");
    let j = open(&dir.path().join("s.db"), Some(&logs));
    let run = cairn_events::RunId::parse("r").unwrap();
    let sub = j.subscribe_to_new(&run);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen_by = seen.clone();
    let (log, first) = j
        .start_run(cairn_store::RunStart {
            run_id: run.clone(),
            record: Some(run_record("r", "pending", 1)),
            pinned: None,
            scope: Scope::run(),
            first: started(),
            observer: Some(Box::new(move |e: &Event| {
                seen_by.lock().unwrap().push(e.seq.get())
            })),
        })
        .unwrap();
    assert_eq!(first.seq.get(), 1);
    // Durable when start_run returns: nothing waits for the writer.
    assert_eq!(j.backend().last_seq(&run).unwrap(), 1);
    assert_eq!(
        j.backend().get_run(&run).unwrap().unwrap().status.as_str(),
        "running"
    );
    log.append(node("a"), output("one"));
    log.append(Scope::run(), finished());
    log.sync().await.unwrap();
    assert_eq!(*seen.lock().unwrap(), [1, 2, 3]);
    assert_eq!(drain(sub, 0).await, [1, 2, 3]);
    drop(log);
    j.close();
    let mirror = std::fs::read_to_string(logs.join("r/events.ndjson")).unwrap();
    let types: Vec<&str> = mirror
        .lines()
        .map(|l| {
            l.split('"')
                .nth(3)
                .expect("every line begins with its type")
        })
        .collect();
    assert_eq!(types, ["RunStarted", "NodeOutput", "RunFinished"]);
}

/// A start the store refuses (the id is taken) leaves the run as it was
/// and its lease free.
#[test]
fn a_refused_start_keeps_nothing_not_even_the_lease() {
    let dir = tempfile::tempdir().unwrap();
    let j = open(&dir.path().join("s.db"), None);
    let run = cairn_events::RunId::parse("taken").unwrap();
    j.backend()
        .create_run(&run_record("taken", "pending", 1))
        .unwrap();
    let refused = j.start_run(cairn_store::RunStart {
        run_id: run.clone(),
        record: Some(run_record("taken", "pending", 2)),
        pinned: None,
        scope: Scope::run(),
        first: started(),
        observer: None,
    });
    assert!(
        matches!(refused, Err(StoreError::RunExists(_))),
        "{refused:?}"
    );
    assert_eq!(j.backend().last_seq(&run).unwrap(), 0);
    assert_eq!(
        j.backend().get_run(&run).unwrap().unwrap().created_ms,
        1,
        "the row is the first start's"
    );
    // The lease went with the refusal: the run can be taken at once.
    drop(j.run_log(&run).expect("the lease is free"));
    j.close();
}

/// `settle` returns once the leases of dropped logs are given back: another
/// process (here another journal on the same store) can take the run at
/// once, with nothing left queued, and `held_runs` counts it no more.
#[test]
fn settle_waits_for_given_back_leases() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("s.db");
    let j = open(&db, None);
    let other = open(&db, None);
    let id = cairn_events::RunId::parse("r").unwrap();
    for round in 0..20 {
        let log = j.run_log(&id).unwrap();
        assert_eq!(j.held_runs(), 1);
        log.append(Scope::run(), started());
        for i in 0..50 {
            log.append(node("a"), output(&format!("{round} {i}")));
        }
        drop(log);
        j.settle();
        assert_eq!(j.held_runs(), 0, "round {round}");
        let theirs = other
            .run_log(&id)
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert_eq!(
            theirs.last_seq(),
            51 * (round + 1),
            "round {round}: the other journal saw a stale last seq"
        );
        drop(theirs);
        other.settle();
    }
    j.close();
    other.close();
}
