//! `cairn revert`: the sandbox root put back as it was before an attempt of
//! a node (docs/snapshots.md).

use cairn_engine::RevertRequest;

use crate::cli::{Global, RevertArgs};
use crate::store;

/// Restores the files; exit 0 when they are as the snapshot has them, 1
/// when the restore failed (the log says why; running it again finishes
/// it), 4 for an unknown run, node or attempt, or a run a process drives.
pub async fn revert(g: &Global, a: RevertArgs) -> anyhow::Result<u8> {
    let engine = store::engine(g, false)?;
    store::require_run(engine.journal(), &a.run)?;
    let r = engine
        .revert(
            &a.run,
            RevertRequest {
                node: a.node,
                iteration: a.iteration,
                attempt: a.attempt,
            },
        )
        .await;
    engine.journal().close();
    let r = r?;
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
    Ok(crate::EXIT_OK)
}
