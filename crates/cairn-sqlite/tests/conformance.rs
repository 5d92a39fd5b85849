//! The backend conformance suite on SQLite: each check on a fresh store file.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use cairn_sqlite::SqliteBackend;
use cairn_storage::Backend;

/// A directory of this test run's stores, emptied when the run starts.
fn stores() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cairn-sqlite-conformance");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    })
}

fn fresh() -> Arc<dyn Backend> {
    static N: AtomicUsize = AtomicUsize::new(0);
    let n = N.fetch_add(1, Ordering::SeqCst);
    let path = stores().join(format!("{n}")).join("cairn.db");
    Arc::new(SqliteBackend::open(&path).unwrap())
}

cairn_storage::backend_conformance_tests!(fresh);

#[test]
fn run_all_runs_every_check() {
    assert_eq!(cairn_storage::conformance::CHECKS.len(), 18);
    cairn_storage::conformance::run_all(&fresh);
}
