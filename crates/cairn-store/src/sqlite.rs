//! The SQLite backend.

use std::path::{Path, PathBuf};

use crate::backend::*;

/// Cairn's store in one SQLite file (WAL mode).
pub struct SqliteBackend {
    path: PathBuf,
}

impl SqliteBackend {
    /// Opens (creating if needed) the database at `path`.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let _ = path;
        todo!()
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Backend for SqliteBackend {
    fn append(&self, _batch: &[StoredEvent]) -> Result<(), StoreError> {
        todo!()
    }
    fn read_events(&self, _run_id: &str, _q: &EventQuery) -> Result<Vec<StoredEvent>, StoreError> {
        todo!()
    }
    fn last_seq(&self, _run_id: &str) -> Result<u64, StoreError> {
        todo!()
    }
    fn create_run(&self, _rec: &RunRecord) -> Result<(), StoreError> {
        todo!()
    }
    fn get_run(&self, _run_id: &str) -> Result<Option<RunRecord>, StoreError> {
        todo!()
    }
    fn list_runs(&self, _f: &RunFilter) -> Result<Vec<RunRecord>, StoreError> {
        todo!()
    }
    fn delete_finished_before(&self, _cutoff_ms: i64) -> Result<Vec<String>, StoreError> {
        todo!()
    }
    fn try_lock_run(&self, _run_id: &str) -> Result<Option<Box<dyn RunLease>>, StoreError> {
        todo!()
    }
    fn put_control(&self, _req: &ControlRequest) -> Result<i64, StoreError> {
        todo!()
    }
    fn pending_controls(&self, _run_id: &str) -> Result<Vec<ControlRequest>, StoreError> {
        todo!()
    }
    fn ack_control(&self, _id: i64) -> Result<(), StoreError> {
        todo!()
    }
    fn put_tool_call(&self, _rec: &ToolCallRecord) -> Result<(), StoreError> {
        todo!()
    }
    fn tool_calls(
        &self,
        _run_id: &str,
        _node_id: &str,
        _iteration: u32,
    ) -> Result<Vec<ToolCallRecord>, StoreError> {
        todo!()
    }
}
