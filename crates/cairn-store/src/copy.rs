//! Runs moved from one store to another (SQLite or PostgreSQL, either way),
//! their events byte for byte: what `cairn store copy` does, over any two
//! backends.
//!
//! The source is only read, besides taking each run's lease while the run
//! is copied: a run whose lease is held is being driven right now, and is
//! refused rather than copied half-way through a step. The destination
//! gets, per run, its row (the very record: created_ms, status, input,
//! workflow text, parent), then its events appended as the same
//! [`StoredEvent`]s in pages (each page read back and compared), then the
//! tool calls of every node pass its events name, then the workflow
//! generations its reloads adopted, then its pending inbox commands.
//! Process records are not copied: the process groups of another
//! machine (or of a process that is gone) mean nothing to the destination.
//!
//! Nothing spans the two stores transactionally, so a copy that fails part
//! of the way leaves a destination run that is a prefix of the source's. A
//! later copy with `skip_existing` does not take such a run for done: an
//! existing run is only skipped once it is checked to hold everything the
//! source's does (same record, every event equal, tool calls and pending
//! commands there; or, for a run that went on in the destination, the
//! source's whole log as the start of its own), and a prefix is completed
//! from where it stopped.

use std::collections::{BTreeSet, HashSet, VecDeque};

use cairn_events::{DecodeError, EventType, NodePath, RunId};
use cairn_storage::{Backend, EventQuery, RunFilter, RunRecord, StoreError, StoredEvent};

/// Events read (and appended, and read back) at a time.
const EVENT_PAGE: usize = 2_000;
/// Runs listed at a time.
const RUN_PAGE: usize = 200;

/// Which of the two stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The store runs are copied from.
    Source,
    /// The store runs are copied to.
    Destination,
}

impl std::fmt::Display for Side {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Side::Source => "source",
            Side::Destination => "destination",
        })
    }
}

/// Why a run was not copied.
///
/// [`CopyError::is_refusal`] tells the two kinds apart: a refusal is about
/// what was asked (a run being driven, already there, another run by the
/// same id), which the caller can change; anything else is a failure of
/// the moment or a destination that cannot be trusted.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    /// `runs` named a run the source does not hold.
    #[error("no run `{0}` in the source store (--run)")]
    NoSuchRun(String),
    /// A process drives the run in one of the stores right now.
    #[error("run `{run}` is being driven by a process of the {side} store right now; not copied{}",
        if *side == Side::Source { " (copy it once that process is done or waits)" } else { "" })]
    Driven {
        /// The run.
        run: String,
        /// Where its lease is held.
        side: Side,
    },
    /// The run left the source between listing and copying.
    #[error("run `{0}` is no longer in the source store")]
    Vanished(String),
    /// The destination holds the run and skipping was not asked for.
    #[error("run `{run}` already exists in the destination store {}",
        if *meanwhile { "(created meanwhile)" } else { "(--skip-existing skips runs copied before)" })]
    Exists {
        /// The run.
        run: String,
        /// It appeared while this copy was under way.
        meanwhile: bool,
    },
    /// The destination holds another run under the same id.
    #[error("run `{0}` exists in the destination store but is another run (its workflow, input, parent or creation time differ); not copied")]
    AnotherRun(String),
    /// The destination's log of the run is not the source's.
    #[error("run `{run}` exists in the destination store with a log that differs from the source's (between seq {from} and {to}); not copied")]
    LogDiffers {
        /// The run.
        run: String,
        /// The first seq of the range that differs.
        from: u64,
        /// The last seq of the range that differs.
        to: u64,
    },
    /// An event of the source does not decode.
    #[error("run `{run}`: event {seq} does not decode: {source}")]
    Undecodable {
        /// The run.
        run: String,
        /// The event.
        seq: u64,
        /// Why.
        #[source]
        source: DecodeError,
    },
    /// The destination does not hold what was written to it.
    #[error("{0}")]
    Untrustworthy(String),
    /// A store failed while doing `doing`.
    #[error("{doing}: {source}")]
    Store {
        /// What the copy was doing.
        doing: String,
        /// The store's error.
        #[source]
        source: StoreError,
    },
    /// A store failed.
    #[error(transparent)]
    Backend(#[from] StoreError),
}

impl CopyError {
    /// Whether the run was refused for what was asked, rather than failed.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            CopyError::NoSuchRun(_)
                | CopyError::Driven { .. }
                | CopyError::Vanished(_)
                | CopyError::Exists { .. }
                | CopyError::AnotherRun(_)
                | CopyError::LogDiffers { .. }
        )
    }

    /// The store's own error, when a store failed.
    pub fn store_error(&self) -> Option<&StoreError> {
        match self {
            CopyError::Store { source, .. } | CopyError::Backend(source) => Some(source),
            _ => None,
        }
    }
}

/// What became of one run.
#[derive(Debug)]
pub enum Done {
    /// Copied whole into the destination.
    Copied(Counts),
    /// It was there already, as a prefix of the source's (an earlier copy
    /// that stopped part-way, or the source went on since): completed.
    Completed(Counts),
    /// It was there already, with everything of the source's; `further`
    /// events more when it went on in the destination.
    Skipped {
        /// Events the destination holds past the source's last.
        further: u64,
    },
}

/// What was written to the destination for one run.
#[derive(Debug, Default, Clone)]
pub struct Counts {
    /// Events appended.
    pub events: u64,
    /// The run's events in all.
    pub total: u64,
    /// Tool calls written.
    pub tool_calls: usize,
    /// Inbox commands written.
    pub commands: usize,
}

impl Counts {
    /// Adds another run's counts to these.
    pub fn add(&mut self, c: &Counts) {
        self.events += c.events;
        self.total += c.total;
        self.tool_calls += c.tool_calls;
        self.commands += c.commands;
    }
}

/// One run's copy: what became of it, and what looked wrong without
/// stopping it (for people to read).
#[derive(Debug)]
pub struct RunCopy {
    /// Copied, completed or skipped.
    pub done: Done,
    /// Things to warn about, each a sentence naming the run.
    pub warnings: Vec<String>,
}

/// Every run of the store, oldest first: parents before their children,
/// and runs created in the same millisecond in the order they were created,
/// so the destination lists them as the source does. Runs started while
/// the list is read may be left out.
pub fn all_runs(src: &dyn Backend) -> Result<Vec<RunId>, CopyError> {
    let mut seen = HashSet::new();
    let mut ids = Vec::new();
    let mut offset = 0;
    loop {
        let page = src.list_runs(&RunFilter {
            limit: Some(RUN_PAGE),
            offset: Some(offset),
            ..Default::default()
        })?;
        let n = page.len();
        // A run started meanwhile shifts the pages by one: the run at a
        // page's edge comes twice.
        for r in page {
            if seen.insert(r.run_id.clone()) {
                ids.push(r.run_id);
            }
        }
        if n < RUN_PAGE {
            break;
        }
        offset += n;
    }
    ids.reverse();
    Ok(ids)
}

/// The runs named and their child runs (and theirs), oldest first. An
/// unknown run is refused before anything is copied.
pub fn named_runs(src: &dyn Backend, named: &[RunId]) -> Result<Vec<RunId>, CopyError> {
    let mut seen = HashSet::new();
    // (created_ms, discovery order, id)
    let mut found: Vec<(i64, usize, RunId)> = Vec::new();
    let mut queue: VecDeque<RunRecord> = VecDeque::new();
    for id in named {
        let rec = src
            .get_run(id)?
            .ok_or_else(|| CopyError::NoSuchRun(id.to_string()))?;
        if seen.insert(rec.run_id.clone()) {
            queue.push_back(rec);
        }
    }
    while let Some(rec) = queue.pop_front() {
        let mut offset = 0;
        loop {
            let kids = src.list_runs(&RunFilter {
                parent: Some(rec.run_id.clone()),
                limit: Some(RUN_PAGE),
                offset: Some(offset),
                ..Default::default()
            })?;
            let n = kids.len();
            for k in kids {
                if seen.insert(k.run_id.clone()) {
                    queue.push_back(k);
                }
            }
            if n < RUN_PAGE {
                break;
            }
            offset += n;
        }
        found.push((rec.created_ms, found.len(), rec.run_id));
    }
    found.sort();
    Ok(found.into_iter().map(|(_, _, id)| id).collect())
}

/// Whether two records are the same run (their status and last change
/// aside, which follow the log).
fn same_run(a: &RunRecord, b: &RunRecord) -> bool {
    a.run_id == b.run_id
        && a.workflow == b.workflow
        && a.workflow_path == b.workflow_path
        && a.workflow_hash == b.workflow_hash
        && a.workflow_source == b.workflow_source
        && a.input == b.input
        && a.created_ms == b.created_ms
        && a.parent_run_id == b.parent_run_id
}

/// Wraps a store error with what the copy was doing.
fn doing(what: impl Into<String>) -> impl FnOnce(StoreError) -> CopyError {
    let doing = what.into();
    move |source| CopyError::Store { doing, source }
}

/// One run's copy under way: the two stores, the run, and what is known.
struct RunCopier<'a> {
    src: &'a dyn Backend,
    dst: &'a dyn Backend,
    id: &'a RunId,
    /// The source's record.
    rec: RunRecord,
    /// The source's last seq when the copy began (the lease keeps it).
    src_last: u64,
    /// The destination had no row: everything is written.
    fresh: bool,
    counts: Counts,
    warnings: Vec<String>,
}

/// Copies one run (see the module's docs), holding its lease in the source
/// and (unless `dst_lease` is false: the source's is the same lock) in the
/// destination meanwhile.
pub fn copy_run(
    src: &dyn Backend,
    dst: &dyn Backend,
    id: &RunId,
    skip_existing: bool,
    dst_lease: bool,
) -> Result<RunCopy, CopyError> {
    // Held until the end: no process drives the run in the source while it
    // is read, nor in the destination while it is written.
    let _src_lease = src.try_lock_run(id)?.ok_or_else(|| CopyError::Driven {
        run: id.to_string(),
        side: Side::Source,
    })?;
    let rec = src
        .get_run(id)?
        .ok_or_else(|| CopyError::Vanished(id.to_string()))?;
    let src_last = src.last_seq(id)?;
    if !skip_existing && dst.get_run(id)?.is_some() {
        return Err(CopyError::Exists {
            run: id.to_string(),
            meanwhile: false,
        });
    }
    let _dst_lease = if dst_lease {
        Some(dst.try_lock_run(id)?.ok_or_else(|| CopyError::Driven {
            run: id.to_string(),
            side: Side::Destination,
        })?)
    } else {
        None
    };

    let mut copier = RunCopier {
        src,
        dst,
        id,
        rec,
        src_last,
        fresh: false,
        counts: Counts {
            total: src_last,
            ..Default::default()
        },
        warnings: Vec::new(),
    };
    let start = match copier.destination_start(skip_existing)? {
        Start::At(start) => start,
        Start::WentOn(further) => {
            return Ok(RunCopy {
                done: Done::Skipped { further },
                warnings: Vec::new(),
            })
        }
    };
    if copier.fresh {
        copier.dst.create_run(&copier.rec).map_err(|e| match e {
            StoreError::RunExists(_) => CopyError::Exists {
                run: id.to_string(),
                meanwhile: true,
            },
            e => e.into(),
        })?;
    }
    let passes = copier.events(start)?;
    copier.tool_calls(&passes)?;
    copier.generations()?;
    copier.commands()?;
    copier.check_row()?;

    let RunCopier {
        fresh,
        counts,
        warnings,
        ..
    } = copier;
    let done = if fresh {
        Done::Copied(counts)
    } else if counts.events == 0 && counts.tool_calls == 0 && counts.commands == 0 {
        Done::Skipped { further: 0 }
    } else {
        Done::Completed(counts)
    };
    Ok(RunCopy { done, warnings })
}

/// Where the destination's log stands before the copy.
enum Start {
    /// Events up to this seq are there (0: none).
    At(u64),
    /// The run went on in the destination past the source's whole log, by
    /// this many events: nothing to copy.
    WentOn(u64),
}

impl RunCopier<'_> {
    /// Where the destination's log stands, checking that a run already
    /// there is this one with a prefix of this log (or all of it and more).
    fn destination_start(&mut self, skip_existing: bool) -> Result<Start, CopyError> {
        let id = self.id;
        let Some(there) = self.dst.get_run(id)? else {
            self.fresh = true;
            return Ok(Start::At(0));
        };
        if !skip_existing {
            return Err(CopyError::Exists {
                run: id.to_string(),
                meanwhile: true,
            });
        }
        if !same_run(&there, &self.rec) {
            return Err(CopyError::AnotherRun(id.to_string()));
        }
        let dst_last = self.dst.last_seq(id)?;
        if dst_last <= self.src_last {
            return Ok(Start::At(dst_last));
        }
        // It went on in the destination: skipped, if the source's whole log
        // is where it came from.
        let mut after = 0;
        while after < self.src_last {
            let ours = read_range(self.src, id, after, EVENT_PAGE)?;
            let Some(last) = ours.last().map(|e| e.seq) else {
                break;
            };
            let theirs = read_range(self.dst, id, after, ours.len())?;
            if theirs != ours {
                return Err(CopyError::LogDiffers {
                    run: id.to_string(),
                    from: after + 1,
                    to: last,
                });
            }
            after = last;
        }
        Ok(Start::WentOn(dst_last - self.src_last))
    }

    /// The events, page by page: appended past `start`, and every page read
    /// back from the destination and compared, the part that was there
    /// already included. Returns the node passes the log names.
    fn events(&mut self, start: u64) -> Result<BTreeSet<(NodePath, u32)>, CopyError> {
        let (src, dst, id) = (self.src, self.dst, self.id);
        let mut passes = BTreeSet::new();
        let mut after = 0;
        while after < self.src_last {
            let mut page = src.read_events(
                id,
                &EventQuery {
                    after,
                    limit: Some(EVENT_PAGE),
                    ..Default::default()
                },
            )?;
            // The lease keeps the log still; should a writer ignore it, what
            // it adds is not copied half.
            page.retain(|e| e.seq <= self.src_last);
            let Some(last) = page.last().map(|e| e.seq) else {
                break;
            };
            for ev in page.iter().filter(|e| e.node_id.is_some()) {
                let decoded = ev.decode().map_err(|source| CopyError::Undecodable {
                    run: id.to_string(),
                    seq: ev.seq,
                    source,
                })?;
                if let (Some(node), Some(iteration)) =
                    (decoded.scope.node_id, decoded.scope.iteration)
                {
                    passes.insert((node, iteration));
                }
            }
            let split = page.partition_point(|e| e.seq <= start);
            let (there, new) = page.split_at(split);
            if !there.is_empty() {
                // Compared before anything is appended after them.
                let theirs = read_range(dst, id, after, there.len())?;
                if theirs.as_slice() != there {
                    return Err(CopyError::LogDiffers {
                        run: id.to_string(),
                        from: there[0].seq,
                        to: there[there.len() - 1].seq,
                    });
                }
            }
            if !new.is_empty() {
                dst.append(new)
                    .map_err(doing(format!("appending events {}..={last}", new[0].seq)))?;
                self.counts.events += new.len() as u64;
                let back = read_range(dst, id, new[0].seq - 1, new.len())?;
                if back.as_slice() != new {
                    return Err(CopyError::Untrustworthy(format!(
                        "the destination does not read back events {}..={last} as they were \
                         written; the copy of `{id}` there is not to be trusted",
                        new[0].seq
                    )));
                }
            }
            after = last;
        }
        let dst_last = dst.last_seq(id)?;
        if dst_last != self.src_last {
            return Err(CopyError::Untrustworthy(format!(
                "the destination holds {dst_last} events of `{id}` after the copy, \
                 the source {}",
                self.src_last
            )));
        }
        Ok(passes)
    }

    /// Tool calls of every node pass the log names, upserted where the
    /// destination does not hold them exactly.
    fn tool_calls(&mut self, passes: &BTreeSet<(NodePath, u32)>) -> Result<(), CopyError> {
        let (src, dst, id) = (self.src, self.dst, self.id);
        for (node, iteration) in passes {
            let ours = src.tool_calls(id, node, *iteration)?;
            if ours.is_empty() && self.fresh {
                continue;
            }
            let theirs = dst.tool_calls(id, node, *iteration)?;
            if theirs == ours {
                continue;
            }
            for call in &ours {
                if !theirs.contains(call) {
                    dst.put_tool_call(call).map_err(doing(format!(
                        "copying tool call {node}#{iteration}@{}.{}",
                        call.attempt, call.tool_seq
                    )))?;
                    self.counts.tool_calls += 1;
                }
            }
            if dst.tool_calls(id, node, *iteration)? != ours {
                return Err(CopyError::Untrustworthy(format!(
                    "the tool calls of `{id}` {node}#{iteration} in the destination differ \
                     from the source's after the copy"
                )));
            }
        }
        Ok(())
    }

    /// The files the run pinned when it started (generation 0's row), so
    /// that the destination's resume uses them rather than the disk; and
    /// the workflow generations the log's reloads name, so that a resume in
    /// the destination runs the run's last definition.
    fn generations(&mut self) -> Result<(), CopyError> {
        let (src, dst, id) = (self.src, self.dst, self.id);
        if let Some(g) = src.generation(id, 0)? {
            if dst.generation(id, 0)?.as_ref() != Some(&g) {
                dst.put_generation(&g)
                    .map_err(doing("copying the files the run pinned when it started"))?;
            }
        }
        let reloads = src.read_events(
            id,
            &EventQuery {
                types: vec![EventType::WorkflowReloaded],
                ..Default::default()
            },
        )?;
        for ev in reloads.iter().filter(|e| e.seq <= self.src_last) {
            let Ok(cairn_events::EventKind::WorkflowReloaded { generation, .. }) =
                ev.decode().map(|e| e.kind)
            else {
                continue;
            };
            match src.generation(id, generation)? {
                Some(g) => {
                    if dst.generation(id, generation)?.as_ref() != Some(&g) {
                        dst.put_generation(&g)
                            .map_err(doing(format!("copying generation {generation}")))?;
                    }
                }
                None => self.warnings.push(format!(
                    "{id}: the source holds no text for generation {generation} of its \
                     workflow; the run cannot be resumed in either store"
                )),
            }
        }
        Ok(())
    }

    /// Pending inbox commands, in order; those the destination holds
    /// already (from an earlier copy) are not repeated. Their ids and
    /// times are the destination's own.
    fn commands(&mut self) -> Result<(), CopyError> {
        let (src, dst, id) = (self.src, self.dst, self.id);
        let ours = src.pending_commands(id)?;
        let mut theirs: Vec<_> = if self.fresh {
            Vec::new()
        } else {
            dst.pending_commands(id)?
                .into_iter()
                .map(|e| e.command)
                .collect()
        };
        for entry in &ours {
            if let Some(i) = theirs.iter().position(|c| *c == entry.command) {
                theirs.remove(i);
                continue;
            }
            dst.put_command(id, &entry.command)
                .map_err(doing("copying a pending command"))?;
            self.counts.commands += 1;
        }
        if !theirs.is_empty() {
            let n = theirs.len();
            self.warnings.push(format!(
                "{id}: the destination holds {n} {} the source does not",
                if n == 1 {
                    "pending command"
                } else {
                    "pending commands"
                }
            ));
        }
        Ok(())
    }

    /// The row: `create_run` wrote the source's record, status included,
    /// and each appended batch then set the status from its last lifecycle
    /// event (RunStarted, RunStatusChanged, RunFinished...), as it did in
    /// the source; `updated_ms` reads as the later of the record's and the
    /// last event's time in both backends. So the two rows agree; checked
    /// here, since a row that says "finished" over a log that waits would
    /// mislead whoever reads the destination.
    fn check_row(&mut self) -> Result<(), CopyError> {
        let id = self.id;
        let there = self.dst.get_run(id)?.ok_or_else(|| {
            CopyError::Untrustworthy(format!("run `{id}` vanished from the destination store"))
        })?;
        if !same_run(&there, &self.rec) || there.status != self.rec.status {
            return Err(CopyError::Untrustworthy(format!(
                "the row of `{id}` in the destination (status {}) differs from the source's \
                 (status {}) after the copy",
                there.status, self.rec.status
            )));
        }
        if there.updated_ms != self.rec.updated_ms {
            self.warnings.push(format!(
                "{id}: last change at {} ms in the destination, {} ms in the source",
                there.updated_ms, self.rec.updated_ms
            ));
        }
        Ok(())
    }
}

/// A store's events of `run` after `after`, at most `n`.
fn read_range(
    b: &dyn Backend,
    run: &RunId,
    after: u64,
    n: usize,
) -> Result<Vec<StoredEvent>, StoreError> {
    b.read_events(
        run,
        &EventQuery {
            after,
            limit: Some(n),
            ..Default::default()
        },
    )
}
