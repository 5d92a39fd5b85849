//! `cairn store copy`: the command's side of `cairn_store::copy` (which
//! does the copying, over any two backends): opening the stores from
//! `--from` and `--to`, the runs to copy, a line per run, the summary and
//! the exit code.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use cairn_store::copy::{all_runs, copy_run, named_runs, Counts, Done};
use cairn_store::{Backend, StoreError, StoreUrl};

use crate::bad_input;
use crate::cli::{Global, StoreCopyArgs};

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
        // Reads are a copy's bulk, made in one go: nothing to make ahead.
        reads_first: false,
        instance: crate::store::instance_name(g)?,
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
        let named = a
            .runs
            .iter()
            .map(|r| crate::store::run_id(r))
            .collect::<anyhow::Result<Vec<_>>>()?;
        named_runs(&*src, &named)?
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
        let result = copy_run(&*src, &*dst, id, a.skip_existing, !shared_locks).map(|copy| {
            for w in &copy.warnings {
                eprintln!("warning: {w}");
            }
            copy.done
        });
        match result {
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
                let e = anyhow::Error::new(e);
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
