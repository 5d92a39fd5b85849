//! Cairn's sandboxed tools and the process runner they share with the engine.
//!
//! See [`process`] for how child processes are run, limited and killed.

mod netfilter;
pub mod process;

pub use process::{
    kill_group, run_process, NetworkPolicy, NoopObserver, ProcessError, ProcessObserver,
    ProcessOutcome, ProcessSpec, Stream,
};
