//! Cairn's storage API: what a database must do to keep Cairn's runs,
//! whatever the database is.
//!
//! This crate is the contract and nothing else: the rows ([`records`]), the
//! traits split by concern ([`EventLog`], [`Runs`], [`Generations`],
//! [`Leases`], [`ToolCalls`], [`Inbox`], [`Processes`], [`Wakeups`], and
//! [`Backend`], all of them), backend-neutral errors ([`StoreError`]), and
//! the one parser of store addresses ([`StoreUrl`]). The backends live
//! beside it (`cairn-sqlite`, `cairn-postgres`); the journal, opening a
//! store by address and copying between stores sit above it (`cairn-store`).
//!
//! With the `conformance` feature, [`conformance`] holds the checks every
//! backend must pass; each backend's tests run them.

mod backend;
#[cfg(feature = "conformance")]
pub mod conformance;
pub mod envelope;
mod error;
pub mod records;
mod schedules;
mod url;

pub use backend::{
    fair_share, hex_prefix, AsyncReads, Backend, BudgetLimits, BudgetWait, Claimed, Claims,
    EventLog, Fleet, Generations, Inbox, InstanceLoad, Leases, Listener, ModelBudgets, Processes,
    RunLease, Runs, SnapshotObjects, StoreFuture, StoredObject, ToolCalls, Wakeups,
};
pub use error::StoreError;
pub use records::{
    check_instance_name, default_instance_name, run_id_from_row, EventQuery, GenerationRecord,
    InboxEntry, LeaseHolder, NewRun, PinnedFile, ProcessRecord, RecordStatus, RunFilter, RunRecord,
    StoredEvent, ToolCallRecord, ToolCallStatus, Topic,
};
pub use schedules::{Cursor, FireOutcome, FireRecord, ScheduleRecord, Schedules, FIRES_KEPT};
pub use url::{redact, BadStoreUrl, StoreUrl};

/// The storage traits, for callers of a [`Backend`]'s methods: a trait's
/// methods can be called only where it is in scope.
pub mod prelude {
    pub use crate::backend::{
        AsyncReads, Backend, Claims, EventLog, Generations, Inbox, Leases, Processes, Runs,
        ToolCalls, Wakeups,
    };
}
