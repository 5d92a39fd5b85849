//! `cairn store copy`: moves runs from one store to another (SQLite file or
//! PostgreSQL URL, either way), their events byte for byte.
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
//! later `--skip-existing` does not take such a run for done: an existing
//! run is only skipped once it is checked to hold everything the source's
//! does (same record, every event equal, tool calls and pending commands
//! there; or, for a run that went on in the destination, the source's
//! whole log as the start of its own), and a prefix is completed from
//! where it stopped.

use std::collections::{BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{anyhow, Context};
use cairn_store::{Backend, EventQuery, RunFilter, RunRecord, StoreError, StoreUrl, StoredEvent};

use crate::bad_input;
use crate::cli::{Global, StoreCopyArgs};

/// Events read (and appended, and read back) at a time.
const EVENT_PAGE: usize = 2_000;
/// Runs listed at a time.
const RUN_PAGE: usize = 200;

/// Opens a store: `create` makes a missing SQLite file (the destination);
/// otherwise a missing one is bad input (the source).
fn open(
    g: &Global,
    place: &StoreUrl,
    create: bool,
    role: &str,
) -> anyhow::Result<Arc<dyn Backend>> {
    let opts = cairn_store::OpenOptions {
        create,
        lease_ttl: Some(crate::store::lease_ttl(g)?),
    };
    match cairn_store::open(place, &opts) {
        Err(StoreError::Missing { .. }) => {
            Err(bad_input(format!("no store at {place} (--{role})")))
        }
        Err(e @ StoreError::Open { .. }) => {
            Err(anyhow::Error::new(e).context(format!("opening the --{role} store {place}")))
        }
        r => Ok(r?),
    }
}

/// Whether two SQLite stores keep their run locks in one place: a store's
/// locks are `locks/<run>.lock` beside its file, so two stores in one
/// folder share them, and the source's lease of a run is the
/// destination's too (taking it twice would fail).
fn shared_locks(from: &StoreUrl, to: &StoreUrl) -> bool {
    let dir = |p: &Path| {
        let parent = match p.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        std::fs::canonicalize(parent).ok()
    };
    match (from, to) {
        (StoreUrl::Sqlite(a), StoreUrl::Sqlite(b)) => match (dir(a), dir(b)) {
            (Some(a), Some(b)) => a == b,
            _ => false,
        },
        _ => false,
    }
}

/// What became of one run.
enum Done {
    /// Copied whole into the destination.
    Copied(Counts),
    /// It was there already, as a prefix of the source's (an earlier copy
    /// that stopped part-way, or the source went on since): completed.
    Completed(Counts),
    /// It was there already, with everything of the source's; `further`
    /// events more when it went on in the destination.
    Skipped { further: u64 },
}

/// What was written to the destination for one run.
#[derive(Default)]
struct Counts {
    /// Events appended.
    events: u64,
    /// The run's events in all.
    total: u64,
    /// Tool calls written.
    tool_calls: usize,
    /// Inbox commands written.
    commands: usize,
}

fn plural(n: impl Into<u64>, one: &str, many: &str) -> String {
    let n = n.into();
    format!("{n} {}", if n == 1 { one } else { many })
}

/// `cairn store copy`.
///
/// Exit code: 0 when every run was copied (or, with `--skip-existing`,
/// found complete in the destination); otherwise 1 if any run failed for a
/// reason other than bad input (an I/O or database error, a destination
/// that does not read back what was written), else 4 (a run being driven,
/// a run already in the destination, one there that is another run or has
/// another history).
/// Refused runs do not stop the others.
pub fn copy(g: &Global, a: StoreCopyArgs) -> anyhow::Result<u8> {
    let (from, to) = (&a.from, &a.to);
    let src = open(g, from, false, "from")?;
    // The runs first: an unknown `--run` leaves no destination behind.
    let ids = if a.runs.is_empty() {
        all_runs(&*src)?
    } else {
        named_runs(&*src, &a.runs)?
    };
    let dst = open(g, to, true, "to")?;
    // The store's own name, so that one database reached by two URLs (or
    // one file by two paths) is recognized.
    if src.store_id() == dst.store_id() {
        return Err(bad_input(format!(
            "--from and --to name the same store ({})",
            from
        )));
    }
    let shared_locks = shared_locks(from, to);

    let (mut copied, mut skipped, mut failed) = (0usize, 0usize, 0usize);
    let mut totals = Counts::default();
    let mut code = crate::EXIT_OK;
    for id in &ids {
        match copy_run(&*src, &*dst, id, a.skip_existing, !shared_locks) {
            Ok(Done::Copied(c)) => {
                println!("copied {id}: {}", describe(&c));
                copied += 1;
                totals.add(&c);
            }
            Ok(Done::Completed(c)) => {
                println!(
                    "completed {id}: {} ({} in all){}",
                    plural(c.events, "more event", "more events"),
                    c.total,
                    extras(&c)
                );
                copied += 1;
                totals.add(&c);
            }
            Ok(Done::Skipped { further: 0 }) => {
                println!("skipped {id}: already in the destination");
                skipped += 1;
            }
            Ok(Done::Skipped { further }) => {
                println!(
                    "skipped {id}: already in the destination, where it went on ({} more)",
                    plural(further, "event", "events")
                );
                skipped += 1;
            }
            Err(e) => {
                let msg = crate::render_error(&e);
                if msg.contains(&format!("`{id}`")) {
                    eprintln!("error: {msg}");
                } else {
                    eprintln!("error: run `{id}`: {msg}");
                }
                failed += 1;
                code = match (code, crate::exit_code_of(&e)) {
                    (crate::EXIT_FAILED, _) | (_, crate::EXIT_FAILED) => crate::EXIT_FAILED,
                    (_, c) => c,
                };
            }
        }
    }
    let mut summary = format!(
        "copied {} ({}, {}, {}) from {} to {}",
        plural(copied as u64, "run", "runs"),
        plural(totals.events, "event", "events"),
        plural(totals.tool_calls as u64, "tool call", "tool calls"),
        plural(totals.commands as u64, "command", "commands"),
        from,
        to
    );
    if skipped > 0 {
        summary.push_str(&format!("; skipped {skipped}"));
    }
    if failed > 0 {
        summary.push_str(&format!("; {failed} failed"));
    }
    println!("{summary}");
    Ok(code)
}

impl Counts {
    fn add(&mut self, c: &Counts) {
        self.events += c.events;
        self.total += c.total;
        self.tool_calls += c.tool_calls;
        self.commands += c.commands;
    }
}

/// `123 events, 4 tool calls` (and the commands, when there are any).
fn describe(c: &Counts) -> String {
    format!(
        "{}, {}{}",
        plural(c.events, "event", "events"),
        plural(c.tool_calls as u64, "tool call", "tool calls"),
        if c.commands > 0 {
            format!(
                ", {}",
                plural(c.commands as u64, "pending command", "pending commands")
            )
        } else {
            String::new()
        }
    )
}

/// `, 2 tool calls, 1 pending command` for what a completion wrote besides events.
fn extras(c: &Counts) -> String {
    let mut s = String::new();
    if c.tool_calls > 0 {
        s.push_str(&format!(
            ", {}",
            plural(c.tool_calls as u64, "tool call", "tool calls")
        ));
    }
    if c.commands > 0 {
        s.push_str(&format!(
            ", {}",
            plural(c.commands as u64, "pending command", "pending commands")
        ));
    }
    s
}

/// Every run of the store, oldest first: parents before their children,
/// and runs created in the same millisecond in the order they were created,
/// so the destination lists them as the source does. Runs started while
/// the list is read may be left out.
fn all_runs(src: &dyn Backend) -> anyhow::Result<Vec<String>> {
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

/// The runs `--run` names and their child runs (and theirs), oldest first.
/// An unknown run is bad input, before anything is copied.
fn named_runs(src: &dyn Backend, named: &[String]) -> anyhow::Result<Vec<String>> {
    let mut seen = HashSet::new();
    // (created_ms, discovery order, id)
    let mut found: Vec<(i64, usize, String)> = Vec::new();
    let mut queue: std::collections::VecDeque<RunRecord> = Default::default();
    for id in named {
        let rec = src
            .get_run(id)?
            .ok_or_else(|| bad_input(format!("no run `{id}` in the source store (--run)")))?;
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

/// Copies one run (see the module's docs), holding its lease in the source
/// and (unless `dst_lease` is false: the source's is the same lock) in the
/// destination meanwhile.
fn copy_run(
    src: &dyn Backend,
    dst: &dyn Backend,
    id: &str,
    skip_existing: bool,
    dst_lease: bool,
) -> anyhow::Result<Done> {
    // Held until the end: no process drives the run in the source while it
    // is read, nor in the destination while it is written.
    let _src_lease = src.try_lock_run(id)?.ok_or_else(|| {
        bad_input(format!(
            "run `{id}` is being driven by a process of the source store right now; \
             not copied (copy it once that process is done or waits)"
        ))
    })?;
    let rec = src
        .get_run(id)?
        .ok_or_else(|| bad_input(format!("run `{id}` is no longer in the source store")))?;
    let src_last = src.last_seq(id)?;
    if !skip_existing && dst.get_run(id)?.is_some() {
        return Err(bad_input(format!(
            "run `{id}` already exists in the destination store \
             (--skip-existing skips runs copied before)"
        )));
    }
    let _dst_lease = if dst_lease {
        Some(dst.try_lock_run(id)?.ok_or_else(|| {
            bad_input(format!(
                "run `{id}` is being driven by a process of the destination store right now; \
                 not copied"
            ))
        })?)
    } else {
        None
    };

    // Where the destination's log stands: events up to `start` are there.
    let (start, fresh) = match dst.get_run(id)? {
        None => (0, true),
        Some(_) if !skip_existing => {
            return Err(bad_input(format!(
                "run `{id}` already exists in the destination store (created meanwhile)"
            )))
        }
        Some(there) => {
            if !same_run(&there, &rec) {
                return Err(bad_input(format!(
                    "run `{id}` exists in the destination store but is another run \
                     (its workflow, input, parent or creation time differ); not copied"
                )));
            }
            let dst_last = dst.last_seq(id)?;
            if dst_last > src_last {
                // It went on in the destination: skipped, if the source's
                // whole log is where it came from.
                let mut after = 0;
                while after < src_last {
                    let ours = read_range(src, id, after, EVENT_PAGE)?;
                    let Some(last) = ours.last().map(|e| e.seq) else {
                        break;
                    };
                    let theirs = read_range(dst, id, after, ours.len())?;
                    if theirs != ours {
                        return Err(bad_input(format!(
                            "run `{id}` exists in the destination store with a log that \
                             differs from the source's (between seq {} and {last}); not copied",
                            after + 1
                        )));
                    }
                    after = last;
                }
                return Ok(Done::Skipped {
                    further: dst_last - src_last,
                });
            }
            (dst_last, false)
        }
    };

    if fresh {
        dst.create_run(&rec).map_err(|e| match e {
            StoreError::RunExists(_) => bad_input(format!(
                "run `{id}` already exists in the destination store (created meanwhile)"
            )),
            e => e.into(),
        })?;
    }

    // The events, page by page: appended past `start`, and every page read
    // back from the destination and compared, the part that was there
    // already included.
    let mut counts = Counts {
        total: src_last,
        ..Default::default()
    };
    let mut passes: BTreeSet<(String, u32)> = BTreeSet::new();
    let mut after = 0;
    while after < src_last {
        let mut page = src.read_events(
            id,
            &EventQuery {
                after,
                limit: Some(EVENT_PAGE),
                ..Default::default()
            },
        )?;
        // The lease keeps the log still; should a writer ignore it, what it
        // adds is not copied half.
        page.retain(|e| e.seq <= src_last);
        let Some(last) = page.last().map(|e| e.seq) else {
            break;
        };
        for ev in page.iter().filter(|e| e.node_id.is_some()) {
            let decoded = ev
                .decode()
                .with_context(|| format!("run `{id}`: event {} does not decode", ev.seq))?;
            if let (Some(node), Some(iteration)) = (decoded.scope.node_id, decoded.scope.iteration)
            {
                passes.insert((node.to_string(), iteration));
            }
        }
        let split = page.partition_point(|e| e.seq <= start);
        let (there, new) = page.split_at(split);
        if !there.is_empty() {
            // Compared before anything is appended after them.
            let theirs = read_range(dst, id, after, there.len())?;
            if theirs.as_slice() != there {
                return Err(bad_input(format!(
                    "run `{id}` exists in the destination store with a log that differs \
                     from the source's (between seq {} and {}); not copied",
                    there[0].seq,
                    there[there.len() - 1].seq
                )));
            }
        }
        if !new.is_empty() {
            dst.append(new)
                .with_context(|| format!("appending events {}..={last}", new[0].seq))?;
            counts.events += new.len() as u64;
            let back = read_range(dst, id, new[0].seq - 1, new.len())?;
            if back.as_slice() != new {
                return Err(anyhow!(
                    "the destination does not read back events {}..={last} as they were \
                     written; the copy of `{id}` there is not to be trusted",
                    new[0].seq
                ));
            }
        }
        after = last;
    }
    let dst_last = dst.last_seq(id)?;
    if dst_last != src_last {
        return Err(anyhow!(
            "the destination holds {dst_last} events of `{id}` after the copy, \
             the source {src_last}"
        ));
    }

    // Tool calls of every node pass the log names, upserted where the
    // destination does not hold them exactly.
    for (node, iteration) in &passes {
        let ours = src.tool_calls(id, node, *iteration)?;
        if ours.is_empty() && fresh {
            continue;
        }
        let theirs = dst.tool_calls(id, node, *iteration)?;
        if theirs == ours {
            continue;
        }
        for call in &ours {
            if !theirs.contains(call) {
                dst.put_tool_call(call).with_context(|| {
                    format!(
                        "copying tool call {node}#{iteration}@{}.{}",
                        call.attempt, call.tool_seq
                    )
                })?;
                counts.tool_calls += 1;
            }
        }
        if dst.tool_calls(id, node, *iteration)? != ours {
            return Err(anyhow!(
                "the tool calls of `{id}` {node}#{iteration} in the destination differ \
                 from the source's after the copy"
            ));
        }
    }

    // The files the run pinned when it started (generation 0's row), so
    // that the destination's resume uses them rather than the disk.
    if let Some(g) = src.generation(id, 0)? {
        if dst.generation(id, 0)?.as_ref() != Some(&g) {
            dst.put_generation(&g)
                .context("copying the files the run pinned when it started")?;
        }
    }
    // The workflow generations the log's reloads name, so that a resume in
    // the destination runs the run's last definition.
    let reloads = src.read_events(
        id,
        &EventQuery {
            types: vec!["WorkflowReloaded".to_string()],
            ..Default::default()
        },
    )?;
    for ev in reloads.iter().filter(|e| e.seq <= src_last) {
        let Ok(cairn_events::EventKind::WorkflowReloaded { generation, .. }) =
            ev.decode().map(|e| e.kind)
        else {
            continue;
        };
        match src.generation(id, generation)? {
            Some(g) => {
                if dst.generation(id, generation)?.as_ref() != Some(&g) {
                    dst.put_generation(&g)
                        .with_context(|| format!("copying generation {generation}"))?;
                }
            }
            None => eprintln!(
                "warning: {id}: the source holds no text for generation {generation} of its \
                 workflow; the run cannot be resumed in either store"
            ),
        }
    }

    // Pending inbox commands, in order; those the destination holds
    // already (from an earlier copy) are not repeated. Their ids and
    // times are the destination's own.
    let ours = src.pending_commands(id)?;
    let mut theirs: Vec<_> = if fresh {
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
            .context("copying a pending command")?;
        counts.commands += 1;
    }
    if !theirs.is_empty() {
        eprintln!(
            "warning: {id}: the destination holds {} the source does not",
            plural(theirs.len() as u64, "pending command", "pending commands")
        );
    }

    // The row: `create_run` wrote the source's record, status included, and
    // each appended batch then set the status from its last lifecycle event
    // (RunStarted, RunStatusChanged, RunFinished...), as it did in the
    // source; `updated_ms` reads as the later of the record's and the last
    // event's time in both backends. So the two rows agree; checked here,
    // since a row that says "finished" over a log that waits would mislead
    // whoever reads the destination.
    let there = dst
        .get_run(id)?
        .ok_or_else(|| anyhow!("run `{id}` vanished from the destination store"))?;
    if !same_run(&there, &rec) || there.status != rec.status {
        return Err(anyhow!(
            "the row of `{id}` in the destination (status {}) differs from the source's \
             (status {}) after the copy",
            there.status,
            rec.status
        ));
    }
    if there.updated_ms != rec.updated_ms {
        eprintln!(
            "warning: {id}: last change at {} ms in the destination, {} ms in the source",
            there.updated_ms, rec.updated_ms
        );
    }

    Ok(if fresh {
        Done::Copied(counts)
    } else if counts.events == 0 && counts.tool_calls == 0 && counts.commands == 0 {
        Done::Skipped { further: 0 }
    } else {
        Done::Completed(counts)
    })
}

/// A store's events of `run` after `after`, at most `n`.
fn read_range(
    b: &dyn Backend,
    run: &str,
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
