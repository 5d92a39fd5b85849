//! The score report over both backends: `aggregate_scores` reads only
//! through the storage traits, so it must give the same report on SQLite
//! and on PostgreSQL.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use cairn_events::{ErrorInfo, EventKind, Scope};
use cairn_store::conformance::{event, record, started};
use cairn_store::prelude::*;
use cairn_store::{aggregate_scores, GenerationRecord, GenerationScores, ScoreFilter};

type Factory<'a> = &'a dyn Fn() -> Arc<dyn Backend>;

/// `aggregate_scores` reads the scorers' ends of every run: per workflow,
/// node and scorer, and per generation (workflow hash), newest first, with
/// failures counted apart and the filters applied.
pub fn scores_are_aggregated_per_generation(fresh: Factory<'_>) {
    let b = fresh();
    let ended = |score: Option<f64>| match score {
        Some(score) => EventKind::ScorerFinished {
            scorer_id: "len".into(),
            scorer_name: "length".into(),
            score,
            reason: None,
        },
        None => EventKind::ScorerFailed {
            scorer_id: "len".into(),
            scorer_name: "length".into(),
            error: ErrorInfo::new("bad_output", "not a score"),
        },
    };
    // Generation `old` (runs at 1 and 2), then `new` (run at 3); one run of
    // another workflow, and one without scores. Each: (run, workflow, its
    // hash, created, its scorer's ends).
    type Scored<'a> = (&'a str, &'a str, &'a str, i64, Vec<Option<f64>>);
    let runs: [Scored; 5] = [
        ("s1", "wf", "old", 1, vec![Some(0.2), None]),
        ("s2", "wf", "old", 2, vec![Some(0.4)]),
        ("s3", "wf", "new", 3, vec![Some(0.9), Some(0.7)]),
        ("s4", "other", "x", 4, vec![Some(1.0)]),
        ("s5", "wf", "new", 5, vec![]),
    ];
    for (id, wf, hash, created, scores) in &runs {
        let mut r = record(id, "finished", *created);
        r.workflow = wf.to_string();
        r.workflow_hash = hash.to_string();
        b.create_run(&r).unwrap();
        let mut evs = vec![event(id, 1, 0, Scope::run(), started())];
        for (i, sc) in scores.iter().enumerate() {
            let node = if i == 1 && *id == "s3" { "b" } else { "a" };
            let seq = evs.len() as u64 + 1;
            evs.push(event(id, seq, 0, Scope::node(node, 0), ended(*sc)));
        }
        b.append(&evs).unwrap();
    }
    // A run of `old` reloaded to `new` mid-run (at time 7): node `c`'s score
    // before the reload is `old`'s, the one after it `new`'s.
    let mut r = record("s6", "finished", 6);
    r.workflow = "wf".into();
    r.workflow_hash = "old".into();
    b.create_run(&r).unwrap();
    b.put_generation(&GenerationRecord {
        run_id: cairn_events::RunId::parse("s6").unwrap(),
        generation: 1,
        workflow_hash: "new".into(),
        workflow_source: "name: wf".into(),
        files: Vec::new(),
        created_ms: 7,
    })
    .unwrap();
    let scored = |x| EventKind::ScorerFinished {
        scorer_id: "len".into(),
        scorer_name: "length".into(),
        score: x,
        reason: None,
    };
    b.append(&[
        event("s6", 1, 6, Scope::run(), started()),
        event("s6", 2, 6, Scope::node("c", 0), scored(0.5)),
        event(
            "s6",
            3,
            7,
            Scope::run(),
            EventKind::WorkflowReloaded {
                generation: 1,
                changed_files: vec!["wf.yaml".into()],
            },
        ),
        event("s6", 4, 7, Scope::node("c", 0), scored(0.1)),
    ])
    .unwrap();
    let all = aggregate_scores(b.as_ref(), &ScoreFilter::default()).unwrap();
    let names: Vec<&str> = all.workflows.iter().map(|w| w.workflow.as_str()).collect();
    assert_eq!(names, ["other", "wf"]);
    let wf = &all.workflows[1];
    let hashes: Vec<&str> = wf
        .generations
        .iter()
        .map(|g| g.workflow_hash.as_str())
        .collect();
    assert_eq!(hashes, ["new", "old"], "newest generation first");
    let old = &wf.generations[1];
    assert_eq!(old.runs, 3);
    assert_eq!((old.first_run_ms, old.last_run_ms), (1, 6));
    let new = &wf.generations[0];
    assert_eq!((new.runs, new.first_run_ms, new.last_run_ms), (2, 3, 7));
    let c_of = |g: &GenerationScores| {
        g.scorers
            .iter()
            .find(|s| s.node_id == "c")
            .map(|s| (s.count, s.mean))
    };
    assert_eq!(c_of(old), Some((1, Some(0.5))));
    assert_eq!(c_of(new), Some((1, Some(0.1))));
    let a = &old.scorers[0];
    assert_eq!((a.node_id.as_str(), a.scorer_id.as_str()), ("a", "len"));
    assert_eq!(a.scorer_name, "length");
    assert_eq!((a.count, a.failed), (2, 1));
    assert!((a.mean.unwrap() - 0.3).abs() < 1e-9);
    assert_eq!((a.min, a.max), (Some(0.2), Some(0.4)));
    assert!((a.stddev.unwrap() - 0.1).abs() < 1e-9);
    // Over every generation: node `a` scored 0.2, 0.4, 0.9; node `b` 0.7.
    let overall: Vec<(&str, u64)> = wf
        .scorers
        .iter()
        .map(|s| (s.node_id.as_str(), s.count))
        .collect();
    assert_eq!(overall, [("a", 3), ("b", 1), ("c", 2)]);
    let only = aggregate_scores(
        b.as_ref(),
        &ScoreFilter {
            workflow: Some("wf".into()),
            node: Some("b".into()),
        },
    )
    .unwrap();
    assert_eq!(only.workflows.len(), 1);
    assert_eq!(
        only.workflows[0].generations.len(),
        1,
        "only runs with scores of `b`"
    );
    assert_eq!(only.workflows[0].scorers[0].mean, Some(0.7));
}

fn sqlite() -> Arc<dyn Backend> {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cairn-store-scores");
    let n = N.fetch_add(1, Ordering::SeqCst);
    let path = dir
        .join(format!("{}-{n}", std::process::id()))
        .join("cairn.db");
    Arc::new(cairn_store::SqliteBackend::open(&path).unwrap())
}

#[test]
fn scores_on_sqlite() {
    scores_are_aggregated_per_generation(&sqlite);
}

#[test]
fn scores_on_postgres() {
    let Some(scratch) = cairn_postgres::testing::Scratch::new() else {
        return;
    };
    scores_are_aggregated_per_generation(&|| scratch.fresh());
}
