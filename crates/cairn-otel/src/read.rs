//! What spans need from the store: a run's log, read page by page so that
//! memory follows the spans and not the log, and the chain of parents that
//! says which trace a child run belongs to. A store is one such reader; a
//! server's API is another ([`RunReader`]), so `cairn trace --server`
//! builds the same spans as `cairn trace` on the store.

use std::collections::{HashSet, VecDeque};

use cairn_events::{EventKind, EventType, RunId};
use cairn_store::{Backend, EventQuery, RunFilter, StoreError, StoredEvent};
use opentelemetry_proto::tonic::trace::v1::Span;

use crate::spans::{Lineage, ParentSpan, TraceBuilder};

/// Most parents walked up from a run to find its root. The engine's own
/// limit on nesting is far below; a store that claims more (or a loop of
/// parents) is cut off here.
pub const MAX_ANCESTORS: usize = 32;
/// Most runs one tree export reads (a run and its descendants).
pub const MAX_TREE_RUNS: usize = 10_000;
/// Events read from the store at a time.
const PAGE: usize = 1024;

/// What spans are built from: a run's record, its events, its children.
pub trait RunReader {
    /// What a read fails with; a run that is not there is
    /// [`StoreError::RunNotFound`], converted.
    type Error: From<StoreError>;

    /// The run's parent as its record names it; `None` when there is no
    /// such run.
    fn run_parent(&self, run_id: &RunId) -> Result<Option<Option<RunId>>, Self::Error>;

    /// A page of the run's events, as the store's query selects them.
    fn read_events(&self, run_id: &RunId, q: &EventQuery) -> Result<Vec<StoredEvent>, Self::Error>;

    /// The runs whose parent is this run.
    fn children(&self, run_id: &RunId) -> Result<Vec<RunId>, Self::Error>;
}

impl<B: Backend + ?Sized> RunReader for B {
    type Error = StoreError;

    fn run_parent(&self, run_id: &RunId) -> Result<Option<Option<RunId>>, StoreError> {
        Ok(self.get_run(run_id)?.map(|r| r.parent_run_id))
    }

    fn read_events(&self, run_id: &RunId, q: &EventQuery) -> Result<Vec<StoredEvent>, StoreError> {
        cairn_store::EventLog::read_events(self, run_id, q)
    }

    fn children(&self, run_id: &RunId) -> Result<Vec<RunId>, StoreError> {
        Ok(self
            .list_runs(&RunFilter {
                parent: Some(run_id.clone()),
                ..Default::default()
            })?
            .into_iter()
            .map(|r| r.run_id)
            .collect())
    }
}

/// The run's parent and the node in it that started the run, from its
/// first `RunStarted` (or its row, when the log has none yet).
fn parent_of<R: RunReader + ?Sized>(
    backend: &R,
    run_id: &RunId,
) -> Result<Option<(RunId, Option<String>)>, R::Error> {
    let first = backend.read_events(
        run_id,
        &EventQuery {
            types: vec![EventType::RunStarted],
            limit: Some(1),
            ..Default::default()
        },
    )?;
    if let Some(Ok(ev)) = first.first().map(|s| s.decode()) {
        if let EventKind::RunStarted {
            parent_run_id,
            parent_node_id,
            ..
        } = ev.kind
        {
            return Ok(parent_run_id.map(|p| (p, parent_node_id)));
        }
    }
    Ok(backend.run_parent(run_id)?.flatten().map(|p| (p, None)))
}

/// The attempt of `parent` whose `DelegationStarted` first named `child`,
/// looked for among `node`'s events when the child's log names its node
/// (a parent with many children is not read whole for each of them).
fn delegating_attempt<R: RunReader + ?Sized>(
    backend: &R,
    parent: &RunId,
    node: Option<&str>,
    child: &str,
) -> Result<Option<ParentSpan>, R::Error> {
    let mut after = 0;
    loop {
        let page = backend.read_events(
            parent,
            &EventQuery {
                after,
                types: vec![EventType::DelegationStarted],
                node: node.map(str::to_string),
                limit: Some(PAGE),
            },
        )?;
        for stored in &page {
            after = stored.seq;
            let Ok(ev) = stored.decode() else { continue };
            let EventKind::DelegationStarted { child_run_id, .. } = &ev.kind else {
                continue;
            };
            if child_run_id != child {
                continue;
            }
            if let (Some((node, iteration)), Some(attempt)) = (ev.node_key(), ev.scope.attempt) {
                return Ok(Some(ParentSpan::Attempt {
                    run_id: parent.clone(),
                    node_id: node.to_string(),
                    iteration,
                    attempt,
                }));
            }
        }
        if page.len() < PAGE {
            return Ok(None);
        }
    }
}

/// Where a run sits in its tree: its root (walking up at most
/// [`MAX_ANCESTORS`] parents, stopping at a loop) and the span of the
/// parent's attempt that started it.
pub fn lineage<R: RunReader + ?Sized>(backend: &R, run_id: &RunId) -> Result<Lineage, R::Error> {
    let Some((parent, node)) = parent_of(backend, run_id)? else {
        return Ok(Lineage::root(run_id));
    };
    let span =
        delegating_attempt(backend, &parent, node.as_deref(), run_id)?.unwrap_or(ParentSpan::Run {
            run_id: parent.clone(),
        });
    let mut seen = HashSet::from([run_id.clone(), parent.clone()]);
    let mut root = parent;
    for _ in 0..MAX_ANCESTORS {
        match parent_of(backend, &root)? {
            Some((p, _)) if seen.insert(p.clone()) => root = p,
            Some((p, _)) => {
                tracing::warn!(run = %run_id, at = %p, "the store's chain of parent runs loops; the trace is cut there");
                break;
            }
            None => break,
        }
    }
    Ok(Lineage {
        root_run_id: root,
        parent: Some(span),
    })
}

/// Folds a run's stored log into `builder`, a page at a time.
fn fold<R: RunReader + ?Sized>(
    backend: &R,
    run_id: &RunId,
    builder: &mut TraceBuilder,
) -> Result<(), R::Error> {
    let mut after = 0;
    loop {
        let page = backend.read_events(
            run_id,
            &EventQuery {
                after,
                limit: Some(PAGE),
                ..Default::default()
            },
        )?;
        for stored in &page {
            after = stored.seq;
            match stored.decode() {
                Ok(ev) => builder.push(&ev),
                Err(_) => builder.skip_unreadable(),
            }
        }
        if page.len() < PAGE {
            return Ok(());
        }
    }
}

/// The spans of one run's whole log, in the trace of its tree.
/// [`StoreError::RunNotFound`] when the store has no such run.
pub fn run_spans<R: RunReader + ?Sized>(
    backend: &R,
    run_id: &RunId,
) -> Result<Vec<Span>, R::Error> {
    if backend.run_parent(run_id)?.is_none() {
        return Err(StoreError::RunNotFound(run_id.to_string()).into());
    }
    let mut builder = TraceBuilder::new(lineage(backend, run_id)?);
    fold(backend, run_id, &mut builder)?;
    Ok(builder.finish())
}

/// Builds the spans of a run and of every run below it (children, their
/// children, ...: at most [`MAX_TREE_RUNS`] runs), each in the trace of the
/// tree's root, and hands them to `each` one run at a time, so that a large
/// tree is never held whole. `each` returns `false` to stop. Returns how
/// many runs were handed over; [`StoreError::RunNotFound`] when the store has
/// no such run.
pub fn visit_tree<R: RunReader + ?Sized>(
    backend: &R,
    run_id: &RunId,
    mut each: impl FnMut(Vec<Span>) -> bool,
) -> Result<usize, R::Error> {
    if backend.run_parent(run_id)?.is_none() {
        return Err(StoreError::RunNotFound(run_id.to_string()).into());
    }
    let mut seen = HashSet::from([run_id.clone()]);
    let mut queue = VecDeque::from([(run_id.clone(), lineage(backend, run_id)?)]);
    let mut visited = 0;
    while let Some((run, lin)) = queue.pop_front() {
        let mut builder = TraceBuilder::new(lin);
        fold(backend, &run, &mut builder)?;
        let children = backend.children(&run)?;
        for child in children {
            if seen.len() >= MAX_TREE_RUNS {
                tracing::warn!(
                    run = %run_id,
                    "more than {MAX_TREE_RUNS} runs in the tree; the rest are not exported"
                );
                break;
            }
            if seen.insert(child.clone()) {
                let lin = builder.child_lineage(&child);
                queue.push_back((child, lin));
            }
        }
        visited += 1;
        if !each(builder.finish()) {
            break;
        }
    }
    Ok(visited)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_events::{Event, Scope, Seq};
    use cairn_store::prelude::*;
    use cairn_store::{RunRecord, SqliteBackend, StoredEvent};

    fn record(run: &str, parent: Option<&str>) -> RunRecord {
        RunRecord {
            run_id: RunId::parse(run).unwrap(),
            workflow: "w".into(),
            workflow_path: "w.yaml".into(),
            workflow_hash: "h".into(),
            workflow_source: String::new(),
            input: serde_json::json!({}),
            status: cairn_store::RecordStatus::Pending,
            created_ms: 1,
            updated_ms: 1,
            parent_run_id: parent.map(|p| RunId::parse(p).unwrap()),
        }
    }

    /// Stores a run whose log starts it under `parent` (delegated by its
    /// node `node`) and, when `child` is given, delegates that child from
    /// its node `sub`.
    fn store_run(b: &SqliteBackend, run: &str, parent: Option<(&str, &str)>, child: Option<&str>) {
        b.create_run(&record(run, parent.map(|p| p.0))).unwrap();
        let mut events = vec![(
            Scope::run(),
            EventKind::RunStarted {
                workflow: "w".into(),
                workflow_hash: "h".into(),
                input: None,
                resumed: false,
                parent_run_id: parent.map(|p| RunId::parse(p.0).unwrap()),
                parent_node_id: parent.map(|p| p.1.to_string()),
                depth: 0,
                forked_from: None,
                trigger: None,
                replay_of: None,
            },
        )];
        if let Some(c) = child {
            let scope = Scope::node("sub", 0).with_attempt(1);
            events.push((scope.clone(), EventKind::NodeStarted { snapshot: None }));
            events.push((
                scope,
                EventKind::DelegationStarted {
                    child_run_id: RunId::parse(c).unwrap(),
                    agent: "workflow".into(),
                    workflow: "c.yaml".into(),
                },
            ));
        }
        let stored: Vec<StoredEvent> = events
            .into_iter()
            .enumerate()
            .map(|(i, (scope, kind))| {
                StoredEvent::from_event(&Event {
                    run_id: cairn_events::RunId::parse(run).unwrap(),
                    seq: Seq(i as u64 + 1),
                    timestamp_ms: 1_000 + i as i64,
                    scope,
                    kind,
                })
            })
            .collect();
        b.append(&stored).unwrap();
    }

    #[test]
    fn a_grandchild_is_in_its_root_s_trace_under_the_attempt_that_started_it() {
        let dir = tempfile::tempdir().unwrap();
        let b = SqliteBackend::open(&dir.path().join("c.db")).unwrap();
        store_run(&b, "r", None, Some("r.c"));
        store_run(&b, "r.c", Some(("r", "sub")), Some("r.c.g"));
        store_run(&b, "r.c.g", Some(("r.c", "sub")), None);
        let lin = lineage(&b, &RunId::parse("r.c.g").unwrap()).unwrap();
        assert_eq!(
            lin,
            Lineage {
                root_run_id: RunId::parse("r").unwrap(),
                parent: Some(ParentSpan::Attempt {
                    run_id: RunId::parse("r.c").unwrap(),
                    node_id: "sub".into(),
                    iteration: 0,
                    attempt: 1,
                }),
            }
        );
        assert_eq!(
            lineage(&b, &RunId::parse("r").unwrap()).unwrap(),
            Lineage::root(&RunId::parse("r").unwrap())
        );

        // The whole tree from its root: one trace, each run under the
        // attempt that started it; the same as each run exported alone.
        let mut runs = Vec::new();
        let n = visit_tree(&b, &RunId::parse("r").unwrap(), |spans| {
            runs.push(spans);
            true
        })
        .unwrap();
        assert_eq!(n, 3);
        let trace = crate::trace_id("r").to_vec();
        assert!(runs.iter().flatten().all(|s| s.trace_id == trace));
        let attempt_of = |spans: &[Span]| spans[1].span_id.clone();
        assert_eq!(runs[1][0].parent_span_id, attempt_of(&runs[0]));
        assert_eq!(runs[2][0].parent_span_id, attempt_of(&runs[1]));
        assert_eq!(
            run_spans(&b, &RunId::parse("r.c.g").unwrap()).unwrap(),
            runs[2]
        );
        assert!(matches!(
            run_spans(&b, &RunId::parse("nope").unwrap()),
            Err(StoreError::RunNotFound(_))
        ));
    }

    #[test]
    fn a_loop_of_parents_ends_the_walk() {
        let dir = tempfile::tempdir().unwrap();
        let b = SqliteBackend::open(&dir.path().join("c.db")).unwrap();
        store_run(&b, "a", Some(("b", "n")), None);
        store_run(&b, "b", Some(("a", "n")), None);
        let lin = lineage(&b, &RunId::parse("a").unwrap()).unwrap();
        assert_eq!(lin.root_run_id, "b");
        assert_eq!(
            lin.parent,
            Some(ParentSpan::Run {
                run_id: RunId::parse("b").unwrap()
            })
        );
    }
}
