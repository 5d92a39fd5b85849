//! `cairn revert`: the paths the run changed since an attempt of a node
//! started put back as they were then (docs/snapshots.md).

use cairn_engine::{FilesPlan, RevertRequest, Reverted};

use crate::cli::{Global, RevertArgs};
use crate::store;

/// Restores the files; exit 0 when they are as the snapshot has them, 1
/// when the restore failed (the log says why; running it again finishes
/// it), 4 for an unknown run, node or attempt, or a run a process drives,
/// 5 for conflicts without `--force` (nothing done). `--dry-run` prints
/// the plan and exits as the revert would (0, or 5 for conflicts).
pub async fn revert(g: &Global, a: RevertArgs) -> anyhow::Result<u8> {
    let engine = store::engine(g, false)?;
    let run = store::require_run(engine.journal(), &a.run)?.run_id;
    let r = engine
        .revert(
            &run,
            RevertRequest {
                node: a.node,
                iteration: a.iteration,
                attempt: a.attempt,
                force: a.force,
                dry_run: a.dry_run,
            },
        )
        .await;
    engine.journal().close();
    let r = r?;
    if a.json {
        println!("{}", as_json(&r, a.dry_run));
    }
    if !r.applied {
        if !a.json {
            println!(
                "{} of node {} (pass {}, attempt {}) to snapshot {}:",
                if a.dry_run {
                    "the plan"
                } else {
                    "refused: the revert"
                },
                r.node,
                r.iteration,
                r.attempt,
                r.snapshot
            );
            print_plan(&r.plan);
        }
        if r.plan.refused() {
            eprintln!("{}", refusal(&r.plan, "revert"));
            return Ok(crate::EXIT_CONFLICT);
        }
        return Ok(crate::EXIT_OK);
    }
    if a.json {
        return Ok(match r.error {
            Some(_) => crate::EXIT_FAILED,
            None => crate::EXIT_OK,
        });
    }
    if let Some(node) = &r.finished_open {
        println!("finished the revert of node {node} that a stopped process left half-way");
    }
    if let Some(e) = &r.error {
        eprintln!(
            "error: the revert of node {} (pass {}, attempt {}) to snapshot {} failed: {}",
            r.node, r.iteration, r.attempt, r.snapshot, e.message
        );
        return Ok(crate::EXIT_FAILED);
    }
    println!(
        "reverted the files to snapshot {} (before node {} pass {} attempt {}): {} written, {} removed",
        r.snapshot, r.node, r.iteration, r.attempt, r.written, r.removed
    );
    println!(
        "the files as they were before this revert are snapshot {}",
        r.before
    );
    for c in &r.plan.conflicts {
        println!(
            "overwrote (--force) {}: {}",
            String::from_utf8_lossy(&c.path),
            c.why
        );
    }
    for u in &r.plan.unknown {
        println!("note: {u}");
    }
    Ok(crate::EXIT_OK)
}

/// The plan, one path a line, indented.
pub fn print_plan(plan: &FilesPlan) {
    let lines = plan.lines();
    if lines.is_empty() {
        println!("  nothing to write or remove");
    }
    for l in lines {
        println!("  {l}");
    }
}

/// Why a plan with conflicts was refused, for stderr.
pub fn refusal(plan: &FilesPlan, what: &str) -> String {
    format!(
        "error: {} path(s) the run changed were changed since by something else; nothing was \
         done. Look at them, then {what} again, with --force to overwrite them",
        plan.conflicts.len()
    )
}

fn as_json(r: &Reverted, dry_run: bool) -> serde_json::Value {
    let mut v = r.plan.to_json();
    let o = v.as_object_mut().expect("a plan is an object");
    o.insert("node".into(), r.node.clone().into());
    o.insert("iteration".into(), r.iteration.into());
    o.insert("attempt".into(), r.attempt.into());
    o.insert("dryRun".into(), dry_run.into());
    o.insert("applied".into(), r.applied.into());
    o.insert("before".into(), r.before.clone().into());
    o.insert("written".into(), r.written.into());
    o.insert("removed".into(), r.removed.into());
    o.insert(
        "error".into(),
        r.error
            .as_ref()
            .map_or(serde_json::Value::Null, |e| e.message.clone().into()),
    );
    v
}
