//! The [`Backend`] conformance suite: what every storage backend must do, as
//! the trait's docs state it, checked the same way for each.
//!
//! A backend's tests hand the suite a factory of fresh, empty backends and
//! get one test per check:
//!
//! ```ignore
//! fn fresh() -> std::sync::Arc<dyn cairn_store::Backend> {
//!     // a new, empty store each call
//! }
//! cairn_store::backend_conformance_tests!(fresh);
//! ```
//!
//! Each check panics, naming what differed, when the backend breaks the
//! contract.

use std::sync::Arc;

use cairn_events::{
    ErrorInfo, Event, EventKind, NodePath, OutputStream, RunCommand, RunId, RunStatus, Scope,
};
use serde_json::json;

use crate::prelude::*;
use crate::{
    EventQuery, GenerationRecord, NewRun, ProcessRecord, RecordStatus, RunFilter, RunRecord,
    StoreError, StoredEvent, ToolCallRecord, ToolCallStatus, Topic,
};

/// Makes a fresh, empty backend each call.
pub type Factory<'a> = &'a dyn Fn() -> Arc<dyn Backend>;

/// One conformance check.
pub type Check = fn(Factory<'_>);

/// Every check, by name, in the order [`run_all`] runs them.
pub const CHECKS: &[(&str, Check)] = &[
    ("append_and_read", append_and_read),
    (
        "tool_calls_commit_with_their_events",
        tool_calls_commit_with_their_events,
    ),
    (
        "batches_are_atomic_and_seqs_unique",
        batches_are_atomic_and_seqs_unique,
    ),
    (
        "run_status_follows_lifecycle_events",
        run_status_follows_lifecycle_events,
    ),
    (
        "runs_are_created_got_and_listed",
        runs_are_created_got_and_listed,
    ),
    (
        "finished_runs_are_deleted_before_a_cutoff",
        finished_runs_are_deleted_before_a_cutoff,
    ),
    (
        "runs_start_whole_or_not_at_all",
        runs_start_whole_or_not_at_all,
    ),
    (
        "leases_are_exclusive_until_dropped",
        leases_are_exclusive_until_dropped,
    ),
    ("tool_calls_are_kept_by_key", tool_calls_are_kept_by_key),
    ("bad_rows_are_refused", bad_rows_are_refused),
    (
        "appenders_of_different_runs_run_at_once",
        appenders_of_different_runs_run_at_once,
    ),
    ("checkpoint_keeps_everything", checkpoint_keeps_everything),
    (
        "inbox_commands_are_kept_in_order_and_taken_once",
        inbox_commands_are_kept_in_order_and_taken_once,
    ),
    (
        "process_records_are_kept_until_removed",
        process_records_are_kept_until_removed,
    ),
    (
        "wake_ups_reach_the_listeners_of_their_topic",
        wake_ups_reach_the_listeners_of_their_topic,
    ),
    (
        "workflow_generations_are_kept_per_run",
        workflow_generations_are_kept_per_run,
    ),
    (
        "async_reads_answer_what_the_blocking_ones_do",
        async_reads_answer_what_the_blocking_ones_do,
    ),
    (
        "schedules_move_on_by_compare_and_set",
        schedules_move_on_by_compare_and_set,
    ),
];

/// Runs every check on backends from `fresh`, panicking at the first one that
/// fails.
pub fn run_all(fresh: Factory<'_>) {
    for (_, check) in CHECKS {
        check(fresh);
    }
}

/// One `#[test]` per conformance check, each on backends from `$fresh` (a
/// path to, or a closure, `Fn() -> Arc<dyn Backend>`).
#[macro_export]
macro_rules! backend_conformance_tests {
    ($fresh:expr) => {
        $crate::backend_conformance_tests!(@tests $fresh;
            append_and_read,
            batches_are_atomic_and_seqs_unique,
            run_status_follows_lifecycle_events,
            runs_are_created_got_and_listed,
            finished_runs_are_deleted_before_a_cutoff,
            runs_start_whole_or_not_at_all,
            leases_are_exclusive_until_dropped,
            tool_calls_are_kept_by_key,
            tool_calls_commit_with_their_events,
            bad_rows_are_refused,
            appenders_of_different_runs_run_at_once,
            checkpoint_keeps_everything,
            inbox_commands_are_kept_in_order_and_taken_once,
            process_records_are_kept_until_removed,
            wake_ups_reach_the_listeners_of_their_topic,
            workflow_generations_are_kept_per_run,
            async_reads_answer_what_the_blocking_ones_do,
            schedules_move_on_by_compare_and_set
        );
    };
    (@tests $fresh:expr; $($check:ident),*) => {
        $(
            #[test]
            fn $check() {
                $crate::conformance::$check(&$fresh);
            }
        )*
    };
}

/// A stored event of `run` at `seq`, for fixtures.
pub fn event(run: &str, seq: u64, ts: i64, scope: Scope, kind: EventKind) -> StoredEvent {
    StoredEvent::from_event(&Event {
        run_id: rid(run),
        seq: cairn_events::Seq(seq),
        timestamp_ms: ts,
        scope,
        kind,
    })
}

/// A node's scope (pass 0, attempt 1).
pub fn node(id: &str) -> Scope {
    Scope::node(id, 0).with_attempt(1)
}

/// A `NodeOutput` on stdout.
pub fn output(text: &str) -> EventKind {
    EventKind::NodeOutput {
        text: text.into(),
        stream: OutputStream::Stdout,
    }
}

/// A first `RunStarted`.
pub fn started() -> EventKind {
    EventKind::RunStarted {
        workflow: "wf".into(),
        workflow_hash: "abc".into(),
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

/// A `RunFinished`.
pub fn finished() -> EventKind {
    EventKind::RunFinished {
        output: None,
        duration_ms: 1,
    }
}

/// A `RunFailed`.
pub fn failed() -> EventKind {
    EventKind::RunFailed {
        error: ErrorInfo::new("boom", "it broke"),
    }
}

/// A `RunCancelled` with no reason.
pub fn cancelled() -> EventKind {
    EventKind::RunCancelled { reason: None }
}

/// A `RunStatusChanged` to `s`.
pub fn status(s: RunStatus) -> EventKind {
    EventKind::RunStatusChanged { status: s }
}

/// A run id for fixtures (panics on text that is none).
pub fn rid(run: &str) -> RunId {
    RunId::parse(run).expect("a fixture's run id")
}

/// A run's row with fixed fields and the given status and creation time.
pub fn record(run: &str, status: &str, created_ms: i64) -> RunRecord {
    RunRecord {
        run_id: rid(run),
        workflow: "wf".into(),
        workflow_path: "flows/wf.yaml".into(),
        workflow_hash: "abc".into(),
        workflow_source: "name: wf\nnodes: []\n".into(),
        input: json!({"n": 1, "text": "ünïcode \"quoted\"\n"}),
        status: RecordStatus::parse(status).expect("a run row's status"),
        created_ms,
        updated_ms: created_ms,
        parent_run_id: None,
    }
}

/// The seqs of events, in order.
pub fn seqs(evs: &[StoredEvent]) -> Vec<u64> {
    evs.iter().map(|e| e.seq).collect()
}

/// An event query from its parts.
pub fn query(after: u64, types: &[&str], node: Option<&str>, limit: Option<usize>) -> EventQuery {
    EventQuery {
        after,
        types: types
            .iter()
            .map(|t| t.parse().expect("an event type of the contract"))
            .collect(),
        node: node.map(str::to_string),
        limit,
    }
}

/// The status of a run's row (panics when it has none).
pub fn status_of(b: &dyn Backend, run: &str) -> String {
    b.get_run(&rid(run))
        .unwrap()
        .unwrap_or_else(|| panic!("run `{run}` has no row"))
        .status
        .as_str()
        .to_string()
}

/// Appending stores events byte for byte; reading honours every
/// [`EventQuery`] field, alone and together; `last_seq` follows.
pub fn append_and_read(fresh: Factory<'_>) {
    let b = fresh();
    b.create_run(&record("r", "pending", 1)).unwrap();
    let r = |seq, scope, kind| event("r", seq, 100 + seq as i64, scope, kind);
    let batch = vec![
        r(1, Scope::run(), started()),
        event("other", 1, 5, Scope::run(), started()),
        r(
            2,
            Scope::node("a", 0),
            EventKind::NodePending {
                layer_index: Some(0),
            },
        ),
        r(
            3,
            Scope::node("b", 0),
            EventKind::NodePending {
                layer_index: Some(0),
            },
        ),
        r(4, node("a"), EventKind::NodeStarted { snapshot: None }),
        event("other", 2, 6, node("a"), output("elsewhere")),
        r(5, node("a"), output("one \"quoted\" ünïcode\n\ttab")),
        r(6, node("b"), EventKind::NodeStarted { snapshot: None }),
    ];
    b.append(&batch).unwrap();
    let more = vec![
        r(7, node("a"), output("two")),
        r(8, Scope::run(), finished()),
    ];
    b.append(&more).unwrap();
    b.append(&[]).unwrap();

    let all = b.read_events(&rid("r"), &EventQuery::default()).unwrap();
    let mut want: Vec<StoredEvent> = batch
        .iter()
        .chain(&more)
        .filter(|e| e.run_id == "r")
        .cloned()
        .collect();
    assert_eq!(all, want, "events must come back as appended, in seq order");
    assert_eq!(
        all[4].json.as_ref(),
        want[4].json.as_ref(),
        "JSON must be kept byte for byte"
    );
    assert_eq!(all[0].node_id, None);
    assert_eq!(all[3].node_id.as_deref(), Some("a"));
    assert_eq!(b.last_seq(&rid("r")).unwrap(), 8);
    assert_eq!(b.last_seq(&rid("other")).unwrap(), 2);
    assert_eq!(b.last_seq(&rid("nobody")).unwrap(), 0);
    assert!(b
        .read_events(&rid("nobody"), &EventQuery::default())
        .unwrap()
        .is_empty());

    let read = |q: EventQuery| seqs(&b.read_events(&rid("r"), &q).unwrap());
    assert_eq!(read(query(5, &[], None, None)), [6, 7, 8], "after");
    assert_eq!(
        read(query(8, &[], None, None)),
        Vec::<u64>::new(),
        "after the end"
    );
    assert_eq!(
        read(query(u64::MAX, &[], None, None)),
        Vec::<u64>::new(),
        "after u64::MAX"
    );
    assert_eq!(
        read(query(0, &[], None, Some(2))),
        [1, 2],
        "limit keeps the lowest seqs"
    );
    assert_eq!(
        read(query(0, &[], None, Some(0))),
        Vec::<u64>::new(),
        "limit 0"
    );
    assert_eq!(
        read(query(3, &[], None, Some(2))),
        [4, 5],
        "after and limit"
    );
    assert_eq!(
        read(query(0, &["NodeOutput"], None, None)),
        [5, 7],
        "one type"
    );
    assert_eq!(
        read(query(0, &["NodeStarted", "RunFinished"], None, None)),
        [4, 6, 8],
        "two types"
    );
    assert_eq!(
        read(query(0, &["NodeOutput", "RunStarted"], None, None)),
        [1, 5, 7],
        "output and another type"
    );
    // A name that is no event type cannot reach a backend (EventQuery
    // holds EventTypes: the edges refuse unknown names); a type the log
    // lacks selects nothing.
    assert_eq!(
        read(query(0, &["ApprovalDenied"], None, None)),
        Vec::<u64>::new(),
        "a type the log lacks"
    );
    assert_eq!(read(query(0, &[], Some("a"), None)), [2, 4, 5, 7], "node");
    assert_eq!(
        read(query(0, &[], Some("zz"), None)),
        Vec::<u64>::new(),
        "unknown node"
    );
    assert_eq!(
        read(query(0, &["NodeStarted", "NodePending"], Some("b"), None)),
        [3, 6],
        "types and node"
    );
    assert_eq!(
        read(query(2, &["NodeStarted", "NodeOutput"], Some("a"), Some(2))),
        [4, 5],
        "every field"
    );
    assert_eq!(
        read(query(4, &["NodeOutput"], Some("a"), Some(1))),
        [5],
        "every field, output"
    );

    // A later batch continues the run.
    let next = r(9, Scope::run(), started());
    b.append(std::slice::from_ref(&next)).unwrap();
    want.push(next);
    assert_eq!(
        b.read_events(&rid("r"), &EventQuery::default()).unwrap(),
        want
    );
}

/// A batch is committed whole or not at all, and a `(run, seq)` is stored
/// once: the log of each run stays gapless whatever batches fail.
pub fn batches_are_atomic_and_seqs_unique(fresh: Factory<'_>) {
    let b = fresh();
    let out = |run: &str, seq| event(run, seq, 10, node("a"), output(&format!("{run} {seq}")));
    b.append(&[out("r", 1), out("r", 2), out("r", 3)]).unwrap();
    // A duplicate at the end of a batch undoes the whole batch.
    let err = b
        .append(&[out("r", 4), out("r", 5), out("r", 3)])
        .unwrap_err();
    assert!(
        matches!(err, StoreError::BadRow { ref run, .. } if run == "r"),
        "{err:?}"
    );
    assert_eq!(
        b.last_seq(&rid("r")).unwrap(),
        3,
        "a failed batch must store nothing"
    );
    // Also when the batch spans runs.
    let err = b
        .append(&[out("s", 1), out("r", 4), out("r", 2)])
        .unwrap_err();
    assert!(matches!(err, StoreError::BadRow { .. }), "{err:?}");
    assert_eq!(
        b.last_seq(&rid("s")).unwrap(),
        0,
        "a failed batch must store nothing of any run"
    );
    assert_eq!(b.last_seq(&rid("r")).unwrap(), 3);
    // A batch that fails leaves the store writable.
    b.append(&[out("r", 4), out("s", 1), out("r", 5)]).unwrap();
    let all = b.read_events(&rid("r"), &EventQuery::default()).unwrap();
    assert_eq!(seqs(&all), [1, 2, 3, 4, 5]);
    assert_eq!(all[3].json.as_ref(), out("r", 4).json.as_ref());
    assert_eq!(
        seqs(&b.read_events(&rid("s"), &EventQuery::default()).unwrap()),
        [1]
    );
}

/// The runs table's `status` and `updated_ms` follow the lifecycle events.
pub fn run_status_follows_lifecycle_events(fresh: Factory<'_>) {
    let b = fresh();
    for run in ["r", "f", "c"] {
        b.create_run(&record(run, "pending", 1)).unwrap();
        assert_eq!(status_of(&*b, run), "pending");
    }
    b.append(&[event("r", 1, 10, Scope::run(), started())])
        .unwrap();
    assert_eq!(status_of(&*b, "r"), "running");
    assert_eq!(b.get_run(&rid("r")).unwrap().unwrap().updated_ms, 10);
    b.append(&[
        event("r", 2, 20, Scope::run(), status(RunStatus::WaitingApproval)),
        event(
            "r",
            3,
            20,
            node("gate"),
            output("output does not change the status"),
        ),
    ])
    .unwrap();
    assert_eq!(status_of(&*b, "r"), "waiting-approval");
    // A clock that went back does not move updated_ms back.
    b.append(&[event("r", 4, 15, node("gate"), output("late"))])
        .unwrap();
    let rec = b.get_run(&rid("r")).unwrap().unwrap();
    assert_eq!(
        (rec.status.as_str(), rec.updated_ms),
        ("waiting-approval", 20)
    );
    // Within a batch the last lifecycle event wins.
    b.append(&[
        event("r", 5, 30, Scope::run(), status(RunStatus::Running)),
        event("r", 6, 31, Scope::run(), failed()),
        event("r", 7, 32, node("a"), output("after the end")),
    ])
    .unwrap();
    let rec = b.get_run(&rid("r")).unwrap().unwrap();
    assert_eq!((rec.status.as_str(), rec.updated_ms), ("failed", 32));
    // Terminal events of several runs in one batch.
    b.append(&[
        event("f", 1, 40, Scope::run(), started()),
        event("c", 1, 41, Scope::run(), started()),
        event("f", 2, 42, Scope::run(), finished()),
        event("c", 2, 43, Scope::run(), cancelled()),
    ])
    .unwrap();
    assert_eq!(status_of(&*b, "f"), "finished");
    assert_eq!(status_of(&*b, "c"), "cancelled");
    assert_eq!(b.get_run(&rid("c")).unwrap().unwrap().updated_ms, 43);
    // A resume starts it again.
    b.append(&[event("f", 3, 50, Scope::run(), started())])
        .unwrap();
    assert_eq!(status_of(&*b, "f"), "running");
    // Events of a run without a row are kept, and make no row.
    b.append(&[event("rowless", 1, 5, Scope::run(), started())])
        .unwrap();
    assert_eq!(b.last_seq(&rid("rowless")).unwrap(), 1);
    assert!(b.get_run(&rid("rowless")).unwrap().is_none());
}

/// Creating, getting and listing runs: every field kept, ids unique and
/// valid, lists filtered, newest first, with limit and offset.
pub fn runs_are_created_got_and_listed(fresh: Factory<'_>) {
    let b = fresh();
    let mut child = record("child", "running", 50);
    child.parent_run_id = Some(rid("r0"));
    child.input = json!([1, {"deep": null}]);
    b.create_run(&child).unwrap();
    assert_eq!(
        b.get_run(&rid("child")).unwrap(),
        Some(child.clone()),
        "every field must come back"
    );
    assert!(b.get_run(&rid("nobody")).unwrap().is_none());
    assert!(b
        .list_runs(&RunFilter::default())
        .unwrap()
        .iter()
        .all(|r| r.run_id == "child"));
    let children = |parent: &str| -> Vec<String> {
        b.list_runs(&RunFilter {
            parent: Some(rid(parent)),
            ..RunFilter::default()
        })
        .unwrap()
        .into_iter()
        .map(|r| r.run_id.to_string())
        .collect()
    };
    assert_eq!(children("r0"), ["child"], "a parent lists its children");
    assert!(children("child").is_empty());

    let b = fresh();
    // r0..r4 by creation time; t1 and t2 share r2's millisecond, created
    // after it.
    for (id, st, created) in [
        ("r0", "finished", 0),
        ("r1", "failed", 1),
        ("r2", "finished", 2),
        ("r3", "failed", 3),
        ("r4", "finished", 4),
        ("t1", "running", 2),
        ("t2", "running", 2),
    ] {
        let mut r = record(id, st, created);
        if id == "r4" {
            r.workflow = "other".into();
        }
        b.create_run(&r).unwrap();
    }
    let err = b.create_run(&record("r1", "pending", 9)).unwrap_err();
    assert!(
        matches!(err, StoreError::RunExists(ref r) if r == "r1"),
        "{err:?}"
    );
    assert_eq!(
        b.get_run(&rid("r1")).unwrap().unwrap().created_ms,
        1,
        "a refused create must change nothing"
    );

    let ids = |f: RunFilter| -> Vec<String> {
        b.list_runs(&f)
            .unwrap()
            .into_iter()
            .map(|r| r.run_id.to_string())
            .collect()
    };
    let filter = |status: Option<&str>, workflow: Option<&str>, limit, offset| RunFilter {
        status: status.map(|s| RecordStatus::parse(s).expect("a run row's status")),
        workflow: workflow.map(str::to_string),
        limit,
        offset,
        parent: None,
    };
    assert_eq!(
        ids(RunFilter::default()),
        ["r4", "r3", "t2", "t1", "r2", "r1", "r0"],
        "newest first"
    );
    assert_eq!(
        ids(filter(Some("finished"), None, None, None)),
        ["r4", "r2", "r0"]
    );
    assert_eq!(ids(filter(None, Some("other"), None, None)), ["r4"]);
    assert_eq!(
        ids(filter(Some("finished"), Some("wf"), None, None)),
        ["r2", "r0"]
    );
    assert_eq!(
        ids(filter(Some("waiting-input"), None, None, None)),
        Vec::<String>::new()
    );
    assert_eq!(
        ids(filter(None, Some("wf"), Some(2), Some(1))),
        ["t2", "t1"]
    );
    assert_eq!(ids(filter(None, None, Some(3), None)), ["r4", "r3", "t2"]);
    assert_eq!(ids(filter(None, None, None, Some(5))), ["r1", "r0"]);
    assert_eq!(ids(filter(None, None, Some(0), None)), Vec::<String>::new());
    assert_eq!(
        ids(filter(None, None, Some(10), Some(7))),
        Vec::<String>::new()
    );
    assert_eq!(
        b.get_run(&rid("r3")).unwrap(),
        Some(record("r3", "failed", 3))
    );
}

/// `delete_finished_before` removes exactly the finished, failed and
/// cancelled runs last updated before the cutoff, with their events and tool
/// calls, and leaves a leased run alone.
pub fn finished_runs_are_deleted_before_a_cutoff(fresh: Factory<'_>) {
    let b = fresh();
    // (run, its events' timestamp, how it ends)
    let runs: [(&str, i64, Option<EventKind>); 6] = [
        ("old-finished", 100, Some(finished())),
        ("old-failed", 100, Some(failed())),
        ("old-cancelled-leased", 100, Some(cancelled())),
        ("old-running", 100, None),
        ("new-finished", 5_000, Some(finished())),
        ("old-waiting", 100, Some(status(RunStatus::WaitingInput))),
    ];
    for (id, ts, end) in &runs {
        b.create_run(&record(id, "pending", 1)).unwrap();
        let mut evs = vec![
            event(id, 1, *ts, Scope::run(), started()),
            event(id, 2, *ts, node("a"), output("hi")),
        ];
        if let Some(end) = end {
            evs.push(event(id, 3, *ts, Scope::run(), end.clone()));
        }
        b.append(&evs).unwrap();
        b.put_tool_call(&tool_call(id, 1, 1)).unwrap();
    }
    // A run whose row says it ended, without events.
    b.create_run(&record("old-imported", "finished", 1))
        .unwrap();
    b.create_run(&record("old-pending", "pending", 1)).unwrap();

    let held = b
        .try_lock_run(&rid("old-cancelled-leased"))
        .unwrap()
        .expect("the lease is free");
    let mut deleted = b.delete_finished_before(1_000).unwrap();
    deleted.sort();
    assert_eq!(deleted, ["old-failed", "old-finished", "old-imported"]);
    for id in ["old-failed", "old-finished", "old-imported"] {
        assert!(b.get_run(&rid(id)).unwrap().is_none(), "{id}: row");
        assert_eq!(b.last_seq(&rid(id)).unwrap(), 0, "{id}: events");
        assert!(
            b.read_events(&rid(id), &EventQuery::default())
                .unwrap()
                .is_empty(),
            "{id}: events"
        );
        assert!(
            b.tool_calls(&rid(id), &NodePath::from("agent"), 0)
                .unwrap()
                .is_empty(),
            "{id}: tool calls"
        );
    }
    for (id, _, end) in &runs {
        if matches!(*id, "old-failed" | "old-finished") {
            continue;
        }
        assert!(b.get_run(&rid(id)).unwrap().is_some(), "{id}: row");
        assert_eq!(
            b.last_seq(&rid(id)).unwrap(),
            if end.is_some() { 3 } else { 2 },
            "{id}: events"
        );
        assert_eq!(
            b.tool_calls(&rid(id), &NodePath::from("agent"), 0)
                .unwrap()
                .len(),
            1,
            "{id}: tool calls"
        );
    }
    assert!(b.get_run(&rid("old-pending")).unwrap().is_some());
    assert!(
        b.delete_finished_before(1_000).unwrap().is_empty(),
        "nothing more is due"
    );
    drop(held);
    assert_eq!(
        b.delete_finished_before(1_000).unwrap(),
        ["old-cancelled-leased"]
    );
    assert_eq!(b.delete_finished_before(10_000).unwrap(), ["new-finished"]);
}

/// `start_run` writes a run's row, its pinned files and its first event in
/// one transaction: all of them, or (the id taken, the event refused, the
/// row missing) none.
pub fn runs_start_whole_or_not_at_all(fresh: Factory<'_>) {
    let b = fresh();
    let pinned = GenerationRecord {
        run_id: rid("r"),
        generation: 0,
        workflow_hash: "hash".into(),
        workflow_source: "name: r".into(),
        files: vec![crate::PinnedFile {
            path: "/w/child.yaml".into(),
            hash: "hash of child".into(),
            text: "name: child".into(),
        }],
        created_ms: 1,
    };
    let start = |run: &str, rec: Option<&RunRecord>, pinned, seq| {
        let _lease = b.try_lock_run(&rid(run)).unwrap().expect("a free lease");
        let first = event(run, seq, 5, Scope::run(), started());
        b.start_run(&NewRun {
            record: rec,
            pinned,
            first: &first,
        })
    };
    start("r", Some(&record("r", "pending", 1)), Some(&pinned), 1).unwrap();
    assert_eq!(status_of(&*b, "r"), "running");
    let evs = b.read_events(&rid("r"), &EventQuery::default()).unwrap();
    assert_eq!(seqs(&evs), [1]);
    assert_eq!(evs[0].type_name, "RunStarted");
    assert_eq!(b.generation(&rid("r"), 0).unwrap(), Some(pinned.clone()));

    // The id is taken: refused, and the run is as it was.
    let err = start("r", Some(&record("r", "pending", 2)), None, 2).unwrap_err();
    assert!(matches!(err, StoreError::RunExists(_)), "{err:?}");
    assert_eq!(b.last_seq(&rid("r")).unwrap(), 1);

    // The first event cannot be stored (its seq is taken): the row goes
    // with it.
    b.append(&[event("s", 1, 1, Scope::run(), started())])
        .unwrap();
    let err = start("s", Some(&record("s", "pending", 1)), None, 1).unwrap_err();
    assert!(matches!(err, StoreError::BadRow { .. }), "{err:?}");
    assert!(b.get_run(&rid("s")).unwrap().is_none());

    // Pinned files of a run without a row: refused, and no event is kept.
    let orphan = GenerationRecord {
        run_id: rid("u"),
        ..pinned.clone()
    };
    let err = start("u", None, Some(&orphan), 1).unwrap_err();
    assert!(matches!(err, StoreError::RunNotFound(_)), "{err:?}");
    assert_eq!(b.last_seq(&rid("u")).unwrap(), 0);

    // A row that exists already gets its first event.
    b.create_run(&record("t", "pending", 1)).unwrap();
    start("t", None, None, 1).unwrap();
    assert_eq!(status_of(&*b, "t"), "running");
    assert_eq!(b.last_seq(&rid("t")).unwrap(), 1);
}

/// A run's lease is exclusive, per run, and released when dropped, on any
/// thread.
pub fn leases_are_exclusive_until_dropped(fresh: Factory<'_>) {
    let b = fresh();
    let first = b
        .try_lock_run(&rid("r"))
        .unwrap()
        .expect("a free lease is granted");
    assert!(
        b.try_lock_run(&rid("r")).unwrap().is_none(),
        "a held lease is refused"
    );
    let other = b
        .try_lock_run(&rid("s"))
        .unwrap()
        .expect("other runs' leases are separate");
    drop(first);
    let again = b
        .try_lock_run(&rid("r"))
        .unwrap()
        .expect("a dropped lease is released");
    // Dropped on another thread.
    std::thread::spawn(move || drop(again)).join().unwrap();
    let last = b.try_lock_run(&rid("r")).unwrap();
    assert!(
        last.is_some(),
        "a lease dropped on another thread is released"
    );
    drop(other);
    // Threads racing for one lease: every lease taken is kept until all
    // have tried, so exactly one may win.
    drop(last);
    let winners: usize = std::thread::scope(|s| {
        let tries: Vec<_> = (0..4)
            .map(|_| {
                let b = &b;
                s.spawn(move || b.try_lock_run(&rid("race")).unwrap())
            })
            .collect();
        let got: Vec<_> = tries.into_iter().map(|t| t.join().unwrap()).collect();
        got.iter().filter(|l| l.is_some()).count()
    });
    assert_eq!(winners, 1, "racing for a free lease, exactly one must win");
    assert!(b.try_lock_run(&rid("race")).unwrap().is_some());
}

fn tool_call(run: &str, attempt: u32, tool_seq: u32) -> ToolCallRecord {
    ToolCallRecord {
        run_id: rid(run),
        node_id: "agent".into(),
        iteration: 0,
        attempt,
        tool_seq,
        tool: "write".into(),
        idempotency_key: format!("{run}/agent/0/{attempt}/{tool_seq}"),
        side_effect: true,
        idempotent: false,
        input: json!({"path": "a.txt", "text": "ünïcode"}),
        output: None,
        started_ms: 10,
        finished_ms: None,
        status: ToolCallStatus::Running,
        error: None,
    }
}

/// Tool calls: every field kept, replaced by key, listed per node pass by
/// attempt then tool_seq, refused for a run without a row.
pub fn tool_calls_are_kept_by_key(fresh: Factory<'_>) {
    let b = fresh();
    b.create_run(&record("r", "running", 1)).unwrap();
    let mut first = tool_call("r", 1, 1);
    b.put_tool_call(&first).unwrap();
    first.status = ToolCallStatus::Success;
    first.output = Some(json!({"bytes": 3}));
    first.finished_ms = Some(12);
    first.side_effect = false;
    first.idempotent = true;
    b.put_tool_call(&first).unwrap();
    let second = ToolCallRecord {
        status: ToolCallStatus::Error,
        error: Some(json!({"kind": "io", "message": "nope"})),
        finished_ms: Some(13),
        ..tool_call("r", 1, 2)
    };
    let retry = tool_call("r", 2, 1);
    // Out of order on purpose.
    b.put_tool_call(&retry).unwrap();
    b.put_tool_call(&second).unwrap();
    b.put_tool_call(&ToolCallRecord {
        iteration: 1,
        ..tool_call("r", 1, 1)
    })
    .unwrap();
    b.put_tool_call(&ToolCallRecord {
        node_id: "other".into(),
        ..tool_call("r", 1, 1)
    })
    .unwrap();
    assert_eq!(
        b.tool_calls(&rid("r"), &NodePath::from("agent"), 0)
            .unwrap(),
        vec![first, second, retry]
    );
    assert_eq!(
        b.tool_calls(&rid("r"), &NodePath::from("agent"), 1)
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        b.tool_calls(&rid("r"), &NodePath::from("other"), 0)
            .unwrap()
            .len(),
        1
    );
    assert!(b
        .tool_calls(&rid("r"), &NodePath::from("agent"), 7)
        .unwrap()
        .is_empty());
    assert!(b
        .tool_calls(&rid("nobody"), &NodePath::from("agent"), 0)
        .unwrap()
        .is_empty());
    let err = b.put_tool_call(&tool_call("ghost", 1, 1)).unwrap_err();
    assert!(
        matches!(err, StoreError::RunNotFound(ref r) if r == "ghost"),
        "{err:?}"
    );
}

/// Tool calls' rows committed with a batch of events: kept with it, replaced
/// by key as `put_tool_call` replaces them, alone when the batch is empty,
/// and not kept at all when the batch fails.
pub fn tool_calls_commit_with_their_events(fresh: Factory<'_>) {
    let b = fresh();
    b.create_run(&record("r", "running", 1)).unwrap();
    b.create_run(&record("s", "running", 1)).unwrap();
    let out = |run: &str, seq| event(run, seq, 10, node("a"), output(&format!("{run} {seq}")));
    let mut first = tool_call("r", 1, 1);
    let other = tool_call("s", 1, 1);
    b.append_with_calls(&[first.clone(), other.clone()], &[out("r", 1), out("s", 1)])
        .unwrap();
    assert_eq!(b.last_seq(&rid("r")).unwrap(), 1);
    assert_eq!(b.last_seq(&rid("s")).unwrap(), 1);
    let calls = |run: &str| {
        b.tool_calls(&rid(run), &NodePath::from("agent"), 0)
            .unwrap()
    };
    assert_eq!(calls("r"), vec![first.clone()]);
    assert_eq!(calls("s"), vec![other]);
    // The finished row replaces the running one; rows alone are kept too.
    first.status = ToolCallStatus::Success;
    first.output = Some(json!({"bytes": 3}));
    first.finished_ms = Some(12);
    b.append_with_calls(std::slice::from_ref(&first), &[])
        .unwrap();
    assert_eq!(calls("r"), vec![first.clone()]);
    // A batch that fails takes its rows with it, of every run.
    let second = tool_call("r", 1, 2);
    let err = b
        .append_with_calls(&[second, tool_call("s", 1, 2)], &[out("s", 2), out("r", 1)])
        .unwrap_err();
    assert!(
        matches!(err, StoreError::BadRow { ref run, .. } if run == "r"),
        "{err:?}"
    );
    assert_eq!(calls("r"), vec![first], "a failed batch must store no row");
    assert_eq!(
        calls("s").len(),
        1,
        "a failed batch must store no row of any run"
    );
    assert_eq!(b.last_seq(&rid("s")).unwrap(), 1);
    // A row of a run without a row is refused, and its batch with it.
    let err = b
        .append_with_calls(&[tool_call("ghost", 1, 1)], &[out("r", 2)])
        .unwrap_err();
    assert!(
        matches!(err, StoreError::RunNotFound(ref r) if r == "ghost"),
        "{err:?}"
    );
    assert_eq!(b.last_seq(&rid("r")).unwrap(), 1);
}

/// A row the store cannot take is refused with [`StoreError::BadRow`] naming
/// its run, and the message says which seq.
pub fn bad_rows_are_refused(fresh: Factory<'_>) {
    let b = fresh();
    let e = event("r", 1, 1, Scope::run(), started());
    b.append(std::slice::from_ref(&e)).unwrap();
    let again = event(
        "r",
        1,
        2,
        node("a"),
        output("another event at the same seq"),
    );
    match b.append(&[again]).unwrap_err() {
        StoreError::BadRow { run, detail } => {
            assert_eq!(run, "r");
            assert!(
                detail.contains('1'),
                "the detail should name the seq: {detail}"
            );
        }
        other => panic!("expected BadRow, got {other:?}"),
    }
    assert_eq!(
        b.read_events(&rid("r"), &EventQuery::default()).unwrap(),
        vec![e],
        "the first event stays"
    );
}

/// Threads appending to different runs at once each get their whole,
/// gapless log, and readers meanwhile only ever see a gapless prefix.
pub fn appenders_of_different_runs_run_at_once(fresh: Factory<'_>) {
    const RUNS: usize = 4;
    const EVENTS: u64 = 400;
    let b = fresh();
    for i in 0..RUNS {
        b.create_run(&record(&format!("run{i}"), "pending", i as i64))
            .unwrap();
    }
    std::thread::scope(|s| {
        for i in 0..RUNS {
            let b = &b;
            s.spawn(move || {
                let run = format!("run{i}");
                let mut seq = 0;
                let mut size = 1 + i as u64;
                while seq < EVENTS {
                    let n = size.min(EVENTS - seq);
                    let batch: Vec<StoredEvent> = (seq + 1..=seq + n)
                        .map(|k| {
                            let kind = if k == 1 {
                                started()
                            } else {
                                output(&format!("{run} {k}"))
                            };
                            event(&run, k, k as i64, node("a"), kind)
                        })
                        .collect();
                    b.append(&batch).unwrap();
                    seq += n;
                    size = size % 7 + 1;
                }
            });
        }
        let b = &b;
        s.spawn(move || {
            for round in 0..50 {
                let run = format!("run{}", round % RUNS);
                let evs = b.read_events(&rid(&run), &EventQuery::default()).unwrap();
                let want: Vec<u64> = (1..=evs.len() as u64).collect();
                assert_eq!(seqs(&evs), want, "{run}: a reader saw a gap");
            }
        });
    });
    for i in 0..RUNS {
        let run = format!("run{i}");
        let evs = b.read_events(&rid(&run), &EventQuery::default()).unwrap();
        assert_eq!(seqs(&evs), (1..=EVENTS).collect::<Vec<_>>(), "{run}");
        assert!(
            evs.iter().all(|e| e.run_id == run),
            "{run}: another run's event"
        );
        assert_eq!(b.last_seq(&rid(&run)).unwrap(), EVENTS);
        assert_eq!(status_of(&*b, &run), "running");
    }
}

/// A checkpoint, whenever it comes, loses and changes nothing.
pub fn checkpoint_keeps_everything(fresh: Factory<'_>) {
    let b = fresh();
    b.checkpoint().unwrap();
    b.create_run(&record("r", "pending", 1)).unwrap();
    let evs: Vec<StoredEvent> = (1..=50)
        .map(|k| event("r", k, k as i64, node("a"), output(&k.to_string())))
        .collect();
    b.append(&evs).unwrap();
    b.checkpoint().unwrap();
    b.checkpoint().unwrap();
    assert_eq!(
        b.read_events(&rid("r"), &EventQuery::default()).unwrap(),
        evs
    );
    b.append(&[event("r", 51, 51, Scope::run(), finished())])
        .unwrap();
    assert_eq!(b.last_seq(&rid("r")).unwrap(), 51);
    assert_eq!(status_of(&*b, "r"), "finished");
}

/// The run inbox: commands come back in the order they were put, with every
/// field; taking one removes it from the pending list and keeps its first
/// outcome; a command for an unknown run is refused with `NotFound`, taking
/// an unknown id with `RecordNotFound`; gc removes a deleted run's commands.
pub fn inbox_commands_are_kept_in_order_and_taken_once(fresh: Factory<'_>) {
    let b = fresh();
    let approve = RunCommand::Approve {
        node_id: "gate".into(),
        note: Some("ok".into()),
        by: Some("ann".into()),
    };
    let answer = RunCommand::Answer {
        request_id: "q1".into(),
        answer: json!({"pick": [1, 2], "why": "ünïcode"}),
        by: None,
    };
    let cancel = RunCommand::Cancel {
        graceful: true,
        reason: Some("late".into()),
        by: None,
    };
    let err = b.put_command(&rid("ghost"), &approve).unwrap_err();
    assert!(
        matches!(err, StoreError::RunNotFound(ref r) if r == "ghost"),
        "{err:?}"
    );
    b.create_run(&record("r", "running", 1)).unwrap();
    b.create_run(&record("s", "running", 1)).unwrap();
    let a = b.put_command(&rid("r"), &approve).unwrap();
    let other = b.put_command(&rid("s"), &cancel).unwrap();
    let q = b.put_command(&rid("r"), &answer).unwrap();
    let c = b.put_command(&rid("r"), &cancel).unwrap();
    assert!(a < q && q < c, "ids grow: {a} {q} {c}");
    let pending = b.pending_commands(&rid("r")).unwrap();
    let got: Vec<(u64, &RunCommand)> = pending.iter().map(|e| (e.id, &e.command)).collect();
    assert_eq!(got, [(a, &approve), (q, &answer), (c, &cancel)]);
    assert!(pending.iter().all(|e| e.run_id == "r" && e.created_ms > 0));
    b.take_command(q, "applied").unwrap();
    b.take_command(q, "refused: twice").unwrap();
    let ids: Vec<u64> = b
        .pending_commands(&rid("r"))
        .unwrap()
        .iter()
        .map(|e| e.id)
        .collect();
    assert_eq!(ids, [a, c]);
    assert_eq!(b.pending_commands(&rid("s")).unwrap()[0].id, other);
    let err = b.take_command(u64::MAX / 2, "applied").unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::RecordNotFound {
                what: "command",
                ..
            }
        ),
        "{err:?}"
    );
    b.append(&[event(
        "r",
        1,
        1,
        Scope::run(),
        EventKind::RunFailed {
            error: ErrorInfo::new("x", "y"),
        },
    )])
    .unwrap();
    assert_eq!(b.delete_finished_before(i64::MAX).unwrap(), ["r"]);
    assert!(b.pending_commands(&rid("r")).unwrap().is_empty());
    assert_eq!(b.pending_commands(&rid("s")).unwrap().len(), 1);
}

/// Process records: kept with every field, listed per run in insertion
/// order, forgotten one by one, refused for an unknown run.
pub fn process_records_are_kept_until_removed(fresh: Factory<'_>) {
    let b = fresh();
    b.create_run(&record("r", "running", 1)).unwrap();
    let rec = |pgid| ProcessRecord {
        id: 0,
        run_id: rid("r"),
        node_id: "loop.build".into(),
        iteration: 2,
        attempt: 3,
        pgid,
        started_ms: 7,
    };
    let a = b.put_process(&rec(100)).unwrap();
    let c = b.put_process(&rec(200)).unwrap();
    assert_eq!(
        b.processes(&rid("r")).unwrap(),
        [
            ProcessRecord { id: a, ..rec(100) },
            ProcessRecord { id: c, ..rec(200) }
        ]
    );
    b.remove_process(a).unwrap();
    assert_eq!(
        b.processes(&rid("r")).unwrap(),
        [ProcessRecord { id: c, ..rec(200) }]
    );
    assert!(b.processes(&rid("nobody")).unwrap().is_empty());
    let err = b
        .put_process(&ProcessRecord {
            run_id: rid("ghost"),
            ..rec(1)
        })
        .unwrap_err();
    assert!(
        matches!(err, StoreError::RunNotFound(ref r) if r == "ghost"),
        "{err:?}"
    );
}

/// Workflow generations: kept per run and generation with every field, a
/// second write of one replacing it (what a reload that a crash cut short
/// left behind), refused for an unknown run, and deleted with their run.
pub fn workflow_generations_are_kept_per_run(fresh: Factory<'_>) {
    let b = fresh();
    b.create_run(&record("r", "running", 1)).unwrap();
    b.create_run(&record("s", "running", 1)).unwrap();
    let gen = |run: &str, n: u64, text: &str| GenerationRecord {
        run_id: rid(run),
        generation: n,
        workflow_hash: format!("hash of {text}"),
        workflow_source: text.into(),
        files: vec![crate::PinnedFile {
            path: format!("/w/child-{n}.yaml"),
            hash: format!("hash of child {n}"),
            text: format!("name: child-{n} # {text}"),
        }],
        created_ms: 10 + n as i64,
    };
    assert_eq!(b.generation(&rid("r"), 1).unwrap(), None);
    b.put_generation(&gen("r", 1, "name: one")).unwrap();
    b.put_generation(&gen("r", 2, "name: two")).unwrap();
    b.put_generation(&gen("s", 1, "name: other")).unwrap();
    assert_eq!(
        b.generation(&rid("r"), 1).unwrap(),
        Some(gen("r", 1, "name: one"))
    );
    assert_eq!(
        b.generation(&rid("r"), 2).unwrap(),
        Some(gen("r", 2, "name: two"))
    );
    assert_eq!(
        b.generation(&rid("s"), 1).unwrap(),
        Some(gen("s", 1, "name: other"))
    );
    assert_eq!(b.generation(&rid("r"), 3).unwrap(), None);
    assert_eq!(b.generation(&rid("nobody"), 1).unwrap(), None);
    // Megabytes of text and every character come back as written.
    let long = format!("name: long\n# {}\u{e9}\u{1f600}\n", "x".repeat(1 << 20));
    b.put_generation(&gen("r", 2, &long)).unwrap();
    assert_eq!(
        b.generation(&rid("r"), 2).unwrap(),
        Some(gen("r", 2, &long))
    );
    let err = b.put_generation(&gen("ghost", 1, "name: x")).unwrap_err();
    assert!(
        matches!(err, StoreError::RunNotFound(ref r) if r == "ghost"),
        "{err:?}"
    );
    b.append(&[
        event("r", 1, 100, Scope::run(), started()),
        event("r", 2, 100, Scope::run(), finished()),
    ])
    .unwrap();
    assert_eq!(b.delete_finished_before(i64::MAX).unwrap(), ["r"]);
    assert_eq!(b.generation(&rid("r"), 1).unwrap(), None);
    assert_eq!(b.generation(&rid("r"), 2).unwrap(), None);
    assert_eq!(
        b.generation(&rid("s"), 1).unwrap(),
        Some(gen("s", 1, "name: other"))
    );
    // A run made again with the same id starts without generations.
    b.create_run(&record("r", "running", 1)).unwrap();
    assert_eq!(b.generation(&rid("r"), 1).unwrap(), None);
}

/// Wake-ups: a listener is woken by a notification of its topic only;
/// notifications that came before a wait make one wake-up; dropping a
/// listener unregisters it, and notifying nobody is harmless.
pub fn wake_ups_reach_the_listeners_of_their_topic(fresh: Factory<'_>) {
    use std::time::Duration;
    let b = fresh();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime for the listeners");
    rt.block_on(async {
        let long = Duration::from_secs(10);
        let short = Duration::from_millis(200);
        b.notify(Topic::Inbox("r"));
        let mut inbox = b.listen(Topic::Inbox("r")).unwrap();
        let mut events = b.listen(Topic::Events("r")).unwrap();
        let mut other = b.listen(Topic::Inbox("s")).unwrap();
        assert!(
            tokio::time::timeout(short, inbox.wait()).await.is_err(),
            "woken by a notification sent before it listened"
        );
        b.notify(Topic::Inbox("r"));
        tokio::time::timeout(long, inbox.wait())
            .await
            .expect("the inbox listener is woken");
        assert!(tokio::time::timeout(short, events.wait()).await.is_err());
        assert!(tokio::time::timeout(short, other.wait()).await.is_err());
        b.notify(Topic::Events("r"));
        b.notify(Topic::Events("r"));
        tokio::time::timeout(long, events.wait())
            .await
            .expect("the events listener is woken");
        assert!(
            tokio::time::timeout(short, events.wait()).await.is_err(),
            "wake-ups that queued before a wait were not made one"
        );
        drop(inbox);
        b.notify(Topic::Inbox("r"));
        b.notify(Topic::Inbox("nobody"));
    });
}

/// [`AsyncReads`]: each future answers what its blocking twin does, awaited
/// on a runtime that is not the backend's own (as the server's is), many
/// at once, and a future dropped unawaited leaves the backend as it was.
pub fn async_reads_answer_what_the_blocking_ones_do(fresh: Factory<'_>) {
    let b = fresh();
    let mut child = record("kid", "pending", 20);
    child.parent_run_id = Some(rid("r"));
    b.create_run(&record("r", "pending", 10)).unwrap();
    b.create_run(&child).unwrap();
    let batch: Vec<StoredEvent> = (1..=40)
        .map(|seq| {
            let (scope, kind) = match seq {
                1 => (Scope::run(), started()),
                s if s % 3 == 0 => (node("a"), output(&format!("line {s}"))),
                s => (node("b"), output(&format!("other {s}"))),
            };
            event("r", seq, 100 + seq as i64, scope, kind)
        })
        .collect();
    b.append(&batch).unwrap();
    let queries = [
        EventQuery::default(),
        query(5, &[], None, Some(7)),
        query(0, &["RunStarted"], None, None),
        query(0, &[], Some("a"), Some(3)),
        query(40, &[], None, None),
    ];
    let filters = [
        RunFilter::default(),
        RunFilter {
            parent: Some(rid("r")),
            ..RunFilter::default()
        },
        RunFilter {
            status: Some(RecordStatus::Run(RunStatus::Running)),
            ..RunFilter::default()
        },
        RunFilter {
            limit: Some(1),
            offset: Some(1),
            ..RunFilter::default()
        },
    ];
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime of the caller's");
    rt.block_on(async {
        for q in &queries {
            for run in ["r", "kid", "nobody"] {
                assert_eq!(
                    b.read_events_async(&rid(run), q).await.unwrap(),
                    b.read_events(&rid(run), q).unwrap(),
                    "{run} {q:?}"
                );
            }
        }
        for run in ["r", "kid", "nobody"] {
            assert_eq!(
                b.last_seq_async(&rid(run)).await.unwrap(),
                b.last_seq(&rid(run)).unwrap()
            );
            assert_eq!(
                b.get_run_async(&rid(run)).await.unwrap(),
                b.get_run(&rid(run)).unwrap()
            );
        }
        assert_eq!(b.last_seq_async(&rid("r")).await.unwrap(), 40);
        for f in &filters {
            assert_eq!(
                b.list_runs_async(f).await.unwrap(),
                b.list_runs(f).unwrap(),
                "{f:?}"
            );
        }
        // Many at once, as a server's handlers make them.
        let many: Vec<_> = (0..64)
            .map(|i| b.read_events_async(&rid("r"), &query(i % 40, &[], None, Some(5))))
            .collect();
        for (i, fut) in many.into_iter().enumerate() {
            let got = fut.await.unwrap();
            let first = (i % 40) as u64 + 1;
            assert_eq!(seqs(&got), (first..(first + 5).min(41)).collect::<Vec<_>>());
        }
        // Made and dropped before it is awaited.
        drop(b.get_run_async(&rid("r")));
        drop(b.list_runs_async(&RunFilter::default()));
    });
    drop(rt);
    assert_eq!(b.last_seq(&rid("r")).unwrap(), 40);
    assert!(b.get_run(&rid("kid")).unwrap().is_some());
}

/// Schedules (for a backend that keeps them): a row written once unless
/// replaced; the cursor moved only from what it is, so that of two
/// instances deciding the same due time one does; the history kept per due
/// time, a second row for one left as it is; a paused schedule not moved;
/// a delete taking the history along.
pub fn schedules_move_on_by_compare_and_set(fresh: Factory<'_>) {
    use crate::{Cursor, FireOutcome, FireRecord, ScheduleRecord};
    let b = fresh();
    let Some(s) = b.schedules() else { return };
    let at = |next: i64| Cursor {
        next_due_ms: Some(next),
        pending_due_ms: None,
    };
    let rec = ScheduleRecord {
        name: "tick".into(),
        definition: serde_json::json!({"name": "tick", "every": "1000ms"}),
        from_file: true,
        paused: false,
        cursor: at(1_000),
        last_run_id: None,
        updated_ms: 1,
    };
    assert!(s.put_schedule(&rec, false).unwrap());
    assert!(
        !s.put_schedule(&rec, false).unwrap(),
        "a name is taken once"
    );
    assert_eq!(s.get_schedule("tick").unwrap().unwrap(), rec);
    let fire = |due: i64, outcome: FireOutcome| FireRecord {
        schedule: "tick".into(),
        due_ms: due,
        decided_ms: due + 1,
        outcome,
        run_id: (outcome == FireOutcome::Firing).then(|| rid(&format!("sched-tick-{due}"))),
        detail: None,
    };
    // Two deciders read cursor 1000; one moves it.
    assert!(s
        .advance_schedule(
            "tick",
            at(1_000),
            at(2_000),
            &[fire(1_000, FireOutcome::Firing)]
        )
        .unwrap());
    assert!(!s
        .advance_schedule(
            "tick",
            at(1_000),
            at(2_000),
            &[fire(1_000, FireOutcome::Skipped)]
        )
        .unwrap());
    let got = s.get_schedule("tick").unwrap().unwrap();
    assert_eq!(got.cursor, at(2_000));
    assert_eq!(got.last_run_id, Some(rid("sched-tick-1000")));
    assert_eq!(s.firing().unwrap(), vec![fire(1_000, FireOutcome::Firing)]);
    let mut started = fire(1_000, FireOutcome::Started);
    started.run_id = None;
    s.update_fire(&started).unwrap();
    assert!(s.firing().unwrap().is_empty());
    let h = s.fires("tick", 10).unwrap();
    assert_eq!(h.len(), 1);
    assert_eq!(h[0].outcome, FireOutcome::Started);
    assert_eq!(
        h[0].run_id,
        Some(rid("sched-tick-1000")),
        "an update keeps the run"
    );
    // A pending due time is part of the cursor.
    let pending = Cursor {
        next_due_ms: Some(3_000),
        pending_due_ms: Some(2_000),
    };
    assert!(s
        .advance_schedule(
            "tick",
            at(2_000),
            pending,
            &[fire(2_000, FireOutcome::Queued)]
        )
        .unwrap());
    assert!(!s
        .advance_schedule("tick", at(3_000), at(4_000), &[])
        .unwrap());
    // Paused: nothing moves it, until resumed.
    assert!(s.set_paused("tick", true, pending).unwrap());
    assert!(!s.advance_schedule("tick", pending, at(4_000), &[]).unwrap());
    assert!(s.set_paused("tick", false, at(9_000)).unwrap());
    assert!(!s.set_paused("nope", true, at(0)).unwrap());
    let got = s.get_schedule("tick").unwrap().unwrap();
    assert_eq!((got.paused, got.cursor), (false, at(9_000)));
    // Newest first, bounded.
    let h = s.fires("tick", 10).unwrap();
    assert_eq!(
        h.iter().map(|f| f.due_ms).collect::<Vec<_>>(),
        [2_000, 1_000]
    );
    assert_eq!(s.fires("tick", 1).unwrap().len(), 1);
    // Replaced, listed, deleted with its history.
    let mut other = rec.clone();
    other.name = "a-first".into();
    assert!(s.put_schedule(&other, false).unwrap());
    let mut changed = rec.clone();
    changed.from_file = false;
    assert!(s.put_schedule(&changed, true).unwrap());
    let names: Vec<String> = s
        .list_schedules()
        .unwrap()
        .into_iter()
        .map(|r| r.name)
        .collect();
    assert_eq!(names, ["a-first", "tick"]);
    assert!(!s.get_schedule("tick").unwrap().unwrap().from_file);
    assert!(s.delete_schedule("tick").unwrap());
    assert!(!s.delete_schedule("tick").unwrap());
    assert!(s.fires("tick", 10).unwrap().is_empty());
}
