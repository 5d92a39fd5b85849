//! `cairn revert`: the paths the run changed since an attempt of a node
//! started put back as they were then (docs/snapshots.md).

use cairn_api::{FilesPlan, RevertBody, Reverted};
use cairn_client::ClientError;
use cairn_engine::RevertRequest;

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
                node: a.node.clone(),
                iteration: a.iteration,
                attempt: a.attempt,
                force: a.force,
                dry_run: a.dry_run,
            },
        )
        .await;
    engine.journal().close();
    let r = r?;
    Ok(report(
        &a,
        &cairn_server::files::reverted_body(r, a.dry_run),
    ))
}

/// `cairn revert` through a server: the files put back on the server's
/// machine, told here as a local revert tells them.
pub async fn revert_remote(url: &str, g: &Global, a: RevertArgs) -> anyhow::Result<u8> {
    let c = crate::remote::client(url, g)?;
    let run = store::run_id(&a.run)?;
    let body = RevertBody {
        node: a.node.clone(),
        iteration: a.iteration,
        attempt: a.attempt,
        force: a.force,
        dry_run: a.dry_run,
    };
    let r = match c.revert(&run, &body).await {
        Ok(r) => r,
        Err(e) => match refused_answer::<Reverted>(&e) {
            Some(r) => r,
            None => return Err(crate::remote::client_error(e)),
        },
    };
    Ok(report(&a, &r))
}

/// A 409 `files_conflict`'s refused answer, from its details.
pub fn refused_answer<T: serde::de::DeserializeOwned>(e: &ClientError) -> Option<T> {
    match e {
        ClientError::Status {
            status: 409,
            code,
            details: Some(d),
            ..
        } if code == "files_conflict" => serde_json::from_value(d.clone()).ok(),
        _ => None,
    }
}

/// Prints what the revert did, planned or refused; its exit code.
fn report(a: &RevertArgs, r: &Reverted) -> u8 {
    if a.json {
        println!(
            "{}",
            serde_json::to_string(r).expect("an answer serializes")
        );
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
                r.plan.snapshot
            );
            print_plan(&r.plan);
        }
        if r.plan.refused() {
            eprintln!("{}", refusal(&r.plan, "revert"));
            return crate::EXIT_CONFLICT;
        }
        return crate::EXIT_OK;
    }
    if a.json {
        return match r.error {
            Some(_) => crate::EXIT_FAILED,
            None => crate::EXIT_OK,
        };
    }
    if let Some(node) = &r.finished_open {
        println!("finished the revert of node {node} that a stopped process left half-way");
    }
    if let Some(e) = &r.error {
        eprintln!(
            "error: the revert of node {} (pass {}, attempt {}) to snapshot {} failed: {e}",
            r.node, r.iteration, r.attempt, r.plan.snapshot
        );
        return crate::EXIT_FAILED;
    }
    println!(
        "reverted the files to snapshot {} (before node {} pass {} attempt {}): {} written, {} removed",
        r.plan.snapshot, r.node, r.iteration, r.attempt, r.written, r.removed
    );
    println!(
        "the files as they were before this revert are snapshot {}",
        r.before
    );
    for c in &r.plan.conflicts {
        println!("overwrote (--force) {}: {}", c.path, c.why);
    }
    for u in &r.plan.unknown {
        println!("note: {u}");
    }
    crate::EXIT_OK
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
