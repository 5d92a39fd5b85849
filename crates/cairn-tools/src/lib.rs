//! Cairn's sandboxed tools (`read`, `write`, `edit`, `grep`, `bash`) and the
//! process runner they share with the engine's `command` nodes.
//!
//! # The sandbox
//!
//! * **Paths.** Every path resolves beneath the [`Sandbox`] root with
//!   `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)`: resolution and open
//!   are one system call, so `..`, symlinks leading out, symlink chains,
//!   `/proc/self/root` and symlinks swapped in by a racing process are all
//!   refused by the kernel rather than by string checks. Absolute paths must
//!   start with the (canonical) root. Writes go to a temporary file in the
//!   target's folder, then `renameat` over it.
//! * **Network.** With [`NetworkPolicy::Deny`] (the default), `bash` first
//!   refuses argvs that plainly mean the network (see [`bash::network_use`]),
//!   reporting each refusal through [`ToolObserver::network`]. Then the child
//!   runs under a **seccomp filter** that refuses `socket`/`socketpair` for
//!   every address family except `AF_UNIX` (with `EACCES`) and refuses
//!   `io_uring_setup`. A confined process also has a network namespace of
//!   its own, which alone shuts the network; the filter stays because it
//!   reports what was tried. It hands those calls to a supervisor thread in the engine
//!   (`SECCOMP_RET_USER_NOTIF`), which answers `EACCES` (the command sees an
//!   ordinary "permission denied") and reports each refusal through
//!   [`ProcessObserver::network_refused`]; `bash` forwards it as a blocked
//!   [`ToolObserver::network`].
//! * **Environment.** Children start from a minimal environment
//!   ([`process::MINIMAL_ENV_KEYS`]) plus what the workflow passes.
//! * **Processes.** Each command leads its own process group; timeouts and
//!   cancellation SIGKILL the whole group, and a direct child dies with the
//!   engine (`PR_SET_PDEATHSIG`). With a [`ProcessSpec::confine`] (what
//!   [`Sandbox::confinement`] gives unless the workflow opts out with
//!   [`Isolation::None`]), the process runs in the `cairn-sandbox`: its own
//!   user, mount, PID and network namespaces, the system folders read-only,
//!   the root read-write, the store hidden, no capabilities. It is PID 1 of
//!   its PID namespace, so everything it starts (`setsid` included) dies
//!   with it.
//!
//! # Side effects
//!
//! Each tool's [`ToolSpec`] declares `side_effect` and `idempotent`; every call
//! carries an [`idempotency_key`] that is the same across retries and resumes.
//! Recording calls (the `tool_calls` table, `ToolCall*` events) is the engine's
//! part.

#![warn(missing_docs)]

pub mod bash;
pub mod edit;
mod error;
pub mod fs;
pub mod grep;
mod netfilter;
pub mod process;
mod proxy;
mod sandbox;
mod tool;

pub use error::ToolError;
pub use process::{
    kill_group, run_process, NetworkPolicy, NoopObserver, ProcessError, ProcessObserver,
    ProcessOutcome, ProcessSpec, Stream,
};
pub use proxy::HostRules;
pub use sandbox::{Isolation, Limits, Sandbox, SandboxError};

/// The process sandbox, re-exported so the engine configures it through
/// this crate.
pub use cairn_sandbox;
pub use tool::{
    agent_call_key, idempotency_key, Tool, ToolContext, ToolObserver, ToolRegistry, ToolSpec,
};

/// Re-exported so observers can be written without depending on
/// `cairn-events` directly.
pub use cairn_events::NetworkAction;

/// The environment variable every process a run starts gets (commands and
/// `bash` calls), holding the run's id: a resume finds and kills what a
/// crashed engine left running by it, even a process that left its group.
pub const RUN_ENV: &str = "CAIRN_RUN_ID";

/// The environment variable naming the store of the run a process belongs
/// to (a hash of its path): run ids repeat across stores (two checkouts,
/// tests side by side), and a resume must kill only its own run's leftovers.
pub const STORE_ENV: &str = "CAIRN_STORE_ID";
