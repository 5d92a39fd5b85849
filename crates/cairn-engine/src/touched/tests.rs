use super::*;

use cairn_events::{ErrorInfo, Scope, Seq};

fn blob(n: u8) -> ObjectId {
    ObjectId([n; 20])
}

fn flat(entries: &[(&str, u8)]) -> Flat {
    entries
        .iter()
        .map(|(p, n)| (p.as_bytes().to_vec(), (Mode::File, blob(*n))))
        .collect()
}

fn left(entries: &[(&str, Option<u8>)]) -> Left {
    entries
        .iter()
        .map(|(p, n)| (p.as_bytes().to_vec(), n.map(|n| (Mode::File, blob(n)))))
        .collect()
}

fn current(entries: &[(&str, u8)]) -> Current {
    Current {
        flat: flat(entries),
        unknown: BTreeSet::new(),
    }
}

fn paths(v: &[RelPath]) -> Vec<&str> {
    v.iter().map(|p| std::str::from_utf8(p).unwrap()).collect()
}

fn conflicted(p: &FilesPlan) -> Vec<&str> {
    p.conflicts
        .iter()
        .map(|c| std::str::from_utf8(&c.path).unwrap())
        .collect()
}

#[test]
fn diff_names_what_changed_with_what_was_left() {
    let a = flat(&[("same", 1), ("edited", 2), ("gone", 3)]);
    let b = flat(&[("same", 1), ("edited", 4), ("new", 5)]);
    assert_eq!(
        diff(&a, &b),
        left(&[("edited", Some(4)), ("gone", None), ("new", Some(5))])
    );
    // An execute bit alone is a change.
    let mut x = a.clone();
    x.insert(b"same".to_vec(), (Mode::Executable, blob(1)));
    assert_eq!(diff(&a, &x).len(), 1);
}

#[test]
fn only_the_paths_the_run_changed_are_touched() {
    // At the point: a, b. The run edited a, made n, deleted b. Something
    // else made other.txt and changed keep.txt; neither is the run's.
    let target = flat(&[("a", 1), ("b", 2), ("keep.txt", 7)]);
    let changes = [Change {
        seq: 10,
        left: left(&[("a", Some(3)), ("n", Some(4)), ("b", None)]),
    }];
    let now = current(&[("a", 3), ("n", 4), ("other.txt", 9), ("keep.txt", 8)]);
    let p = plan(&changes, &target, &now, false);
    assert_eq!(paths(&p.write), ["a", "b"]);
    assert_eq!(paths(&p.remove), ["n"]);
    assert!(p.conflicts.is_empty() && !p.refused());
    assert_eq!(paths(&p.paths()), ["a", "b", "n"]);
}

#[test]
fn a_path_something_else_changed_since_is_a_conflict_unless_forced() {
    let target = flat(&[("a", 1), ("b", 2)]);
    let changes = [Change {
        seq: 10,
        left: left(&[("a", Some(3)), ("b", None), ("n", Some(4))]),
    }];
    // a changed again, b made again, n deleted: all by something else.
    let now = current(&[("a", 5), ("b", 6)]);
    let p = plan(&changes, &target, &now, false);
    assert!(p.refused());
    assert!(p.write.is_empty() && p.remove.is_empty());
    assert_eq!(conflicted(&p), ["a", "b"]);
    // n is gone already, as the point has it: nothing to do, no conflict.
    assert!(
        p.conflicts[0].why.contains("changed it since"),
        "{:?}",
        p.conflicts
    );
    assert!(
        p.conflicts[1].why.contains("made it since"),
        "{:?}",
        p.conflicts
    );

    let p = plan(&changes, &target, &now, true);
    assert!(!p.refused());
    assert_eq!(paths(&p.write), ["a", "b"]);
    assert_eq!(conflicted(&p), ["a", "b"]);
    assert!(p.lines().iter().any(|l| l.starts_with("forced")));
}

#[test]
fn a_deleted_file_of_the_run_that_another_deleted_too_is_a_conflict() {
    // The run left a; something else deleted it; the point has it as 1.
    let target = flat(&[("a", 1)]);
    let changes = [Change {
        seq: 3,
        left: left(&[("a", Some(2))]),
    }];
    let p = plan(&changes, &target, &current(&[]), false);
    assert_eq!(conflicted(&p), ["a"]);
    assert!(p.conflicts[0].why.contains("deleted it since"));
}

#[test]
fn the_last_change_of_a_path_is_what_the_run_left() {
    let target = flat(&[("a", 1)]);
    // A segment wrote 2, a later revert put 1 back, a later segment wrote 3;
    // given in any order.
    let changes = [
        Change {
            seq: 30,
            left: left(&[("a", Some(3))]),
        },
        Change {
            seq: 10,
            left: left(&[("a", Some(2))]),
        },
        Change {
            seq: 20,
            left: left(&[("a", Some(1))]),
        },
    ];
    let p = plan(&changes, &target, &current(&[("a", 3)]), false);
    assert_eq!(paths(&p.write), ["a"]);
    assert!(p.conflicts.is_empty());
    let p = plan(&changes, &target, &current(&[("a", 2)]), false);
    assert_eq!(conflicted(&p), ["a"]);
}

#[test]
fn a_file_too_large_to_snapshot_is_never_overwritten_unasked() {
    let target = flat(&[("big", 1)]);
    let changes = [Change {
        seq: 3,
        left: left(&[("big", None)]),
    }];
    let mut now = current(&[]);
    now.unknown.insert(b"big".to_vec());
    let p = plan(&changes, &target, &now, false);
    assert_eq!(conflicted(&p), ["big"]);
    assert!(p.write.is_empty());
    assert!(p.conflicts[0].why.contains("not known"));
}

#[test]
fn a_write_that_would_destroy_anothers_file_on_its_way_is_a_conflict() {
    // The run deleted d/f; something else made a file `d` meanwhile.
    let target = flat(&[("d/f", 1)]);
    let changes = [Change {
        seq: 3,
        left: left(&[("d/f", None)]),
    }];
    let p = plan(&changes, &target, &current(&[("d", 5)]), false);
    assert_eq!(conflicted(&p), ["d/f"]);
    assert!(p.write.is_empty());
    assert!(p.conflicts[0].why.contains("`d` on its way"));

    // The run deleted file `e`; something else made a folder `e/` since.
    let target = flat(&[("e", 1)]);
    let changes = [Change {
        seq: 3,
        left: left(&[("e", None)]),
    }];
    let p = plan(&changes, &target, &current(&[("e/theirs", 5)]), false);
    assert_eq!(conflicted(&p), ["e"]);
    assert!(
        p.conflicts[0].why.contains("`e/theirs`"),
        "{:?}",
        p.conflicts
    );

    // But a folder the run itself made there is deleted by the plan: fine.
    let changes = [Change {
        seq: 3,
        left: left(&[("e", None), ("e/mine", Some(6))]),
    }];
    let p = plan(&changes, &target, &current(&[("e/mine", 6)]), false);
    assert!(p.conflicts.is_empty(), "{:?}", p.conflicts);
    assert_eq!(paths(&p.write), ["e"]);
    assert_eq!(paths(&p.remove), ["e/mine"]);
}

#[test]
fn the_plan_reads_as_json_and_lines() {
    let target = flat(&[("a", 1)]);
    let changes = [Change {
        seq: 3,
        left: left(&[("a", Some(2)), ("n", Some(3)), ("x", Some(4))]),
    }];
    let p = plan(
        &changes,
        &target,
        &current(&[("a", 2), ("n", 3), ("x", 9)]),
        false,
    );
    let j = p.to_json();
    assert_eq!(j["write"], json!(["a"]));
    assert_eq!(j["remove"], json!(["n"]));
    assert_eq!(j["conflicts"][0]["path"], "x");
    assert_eq!(
        p.lines()[..2],
        ["write   a".to_string(), "remove  n".to_string()]
    );
    assert!(p.lines()[2].starts_with("conflict x: "));
}

fn ev(seq: u64, node: &str, attempt: u32, kind: EventKind) -> Event {
    Event {
        run_id: cairn_events::RunId::parse("r").unwrap(),
        seq: Seq(seq),
        timestamp_ms: 0,
        scope: Scope::node(node.to_string(), 1).with_attempt(attempt),
        kind,
    }
}

fn started(seq: u64, node: &str, attempt: u32, s: &str) -> Event {
    ev(
        seq,
        node,
        attempt,
        EventKind::NodeStarted {
            snapshot: Some(s.into()),
        },
    )
}

fn failed(seq: u64, node: &str, attempt: u32, s: Option<&str>) -> Event {
    ev(
        seq,
        node,
        attempt,
        EventKind::NodeFailed {
            error: ErrorInfo::new("x", "y"),
            will_retry: true,
            snapshot: s.map(String::from),
        },
    )
}

fn seg(node: &str, attempt: u32, before: &str, after: After, end: u64) -> Segment {
    Segment {
        key: AttemptKey {
            node: node.into(),
            iteration: 1,
            attempt,
        },
        before: before.into(),
        after,
        end_seq: end,
    }
}

#[test]
fn the_history_bounds_each_attempts_work_by_its_snapshots() {
    let step = |seq, s: &str| {
        ev(
            seq,
            "a",
            1,
            EventKind::AgentStepStarted {
                step: 2,
                model: String::new(),
                snapshot: Some(s.into()),
                request_hash: None,
                prompt: None,
            },
        )
    };
    let events = vec![
        started(2, "a", 1, "s0"),
        started(3, "c", 1, "c0"),
        step(4, "s1"),
        failed(5, "c", 1, Some("c1")),
        ev(
            6,
            "a",
            1,
            EventKind::NodeFinished {
                duration_ms: 1,
                output: None,
                cached: None,
                snapshot: Some("s2".into()),
            },
        ),
    ];
    let h = History::of(&events, false);
    assert_eq!(
        h.segments,
        [
            seg("a", 1, "s0", After::Snapshot("s1".into()), 4),
            seg("c", 1, "c0", After::Snapshot("c1".into()), 5),
            seg("a", 1, "s1", After::Snapshot("s2".into()), 6),
        ]
    );
    assert!(h.unclosed.is_empty());
    // After seq 4 (the step's snapshot): the two segments ending later.
    assert_eq!(h.covered(&Point::After(4), u64::MAX).0, [1, 2]);
    let c = AttemptKey {
        node: "c".into(),
        iteration: 1,
        attempt: 1,
    };
    assert_eq!(h.covered(&Point::Attempt(c), u64::MAX).0, [1]);
}

#[test]
fn an_attempt_cut_short_is_closed_by_the_next_snapshot_or_left_unknown() {
    let events = vec![
        started(2, "a", 1, "s0"),
        failed(3, "a", 1, None),
        started(4, "b", 1, "b0"),
        ev(5, "b", 1, EventKind::NodeCancelled { reason: None }),
    ];
    let h = History::of(&events, false);
    assert_eq!(
        h.segments,
        [seg("a", 1, "s0", After::Snapshot("b0".into()), 4)]
    );
    assert_eq!(h.unclosed.len(), 1);
    assert_eq!(h.unclosed[0].1, "b0");
    // For an on_retry revert, the root as it is now closes it.
    let h = History::of(&events, true);
    assert_eq!(h.segments[1], seg("b", 1, "b0", After::Now, u64::MAX));
    assert!(h.unclosed.is_empty());
}

#[test]
fn a_revert_after_a_retry_is_told_from_a_persons() {
    let events = vec![
        started(2, "a", 1, "s0"),
        failed(3, "a", 1, Some("s1")),
        ev(4, "a", 2, EventKind::NodeRetrying { delay_ms: 0 }),
        ev(
            5,
            "a",
            1,
            EventKind::RevertStarted {
                snapshot: "s0".into(),
            },
        ),
        ev(
            6,
            "a",
            1,
            EventKind::RevertFinished {
                snapshot: "s0".into(),
                success: true,
                error: None,
            },
        ),
        started(7, "a", 2, "s0"),
        failed(8, "a", 2, Some("s3")),
        ev(
            9,
            "a",
            1,
            EventKind::RevertStarted {
                snapshot: "s0".into(),
            },
        ),
    ];
    let h = History::of(&events, false);
    assert_eq!(h.reverts.len(), 2);
    assert!(h.reverts[0].on_retry && h.reverts[0].finished == Some(6));
    assert!(!h.reverts[1].on_retry && h.reverts[1].finished.is_none());
    assert_eq!(History::revert_seq(&h.reverts[0]), 6);
    let a1 = AttemptKey {
        node: "a".into(),
        iteration: 1,
        attempt: 1,
    };
    assert_eq!(h.point_of(&h.reverts[0]), Point::Attempt(a1));
    // A person's revert to attempt 1 covers what came after its start.
    assert_eq!(h.point_of(&h.reverts[1]), Point::After(2));
    let (segs, reverts) = h.covered(&Point::After(2), 9);
    assert_eq!(segs, [0, 1]);
    assert_eq!(reverts, [0]);
}
