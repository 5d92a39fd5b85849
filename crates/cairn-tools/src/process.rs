//! The process runner behind the `bash` tool and the engine's `command` nodes.
//!
//! A process is spawned without a shell, as the leader of its own process
//! group, with stdin closed and stdout/stderr piped. Output is streamed to a
//! [`ProcessObserver`] as it arrives and captured up to a per-stream cap; past
//! the cap it is still read (so the child never blocks on a full pipe) but
//! dropped, which keeps memory flat however much a command prints.
//!
//! Ending a process means ending its whole group: on timeout or cancel the
//! group gets SIGKILL (no SIGTERM grace: a grandchild that ignores SIGTERM must
//! not outlive the limit). When the leader exits on its own, whatever it left
//! running in its group is killed as well, so no command leaves processes
//! behind. After a kill the pipes are read only until EOF or a short grace,
//! because a process that escaped the group (via `setsid`) could hold them
//! open forever.
//!
//! A confined process with limits runs in a control group of its own where
//! the machine offers one (`cairn_sandbox::cgroup`): the group is killed
//! with the process group, its CPU time is read every 100 ms while
//! it runs (and the tree killed once over its limit), its counters say
//! which limit was hit ([`ProcessOutcome::tree`]), and it is removed when
//! the process has ended.

use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::AsyncReadExt;
use tokio_util::sync::CancellationToken;

use crate::netfilter::{ListenerChannel, NetFilter, Refusal, Supervisor};
use crate::proxy::HostRules;

/// How long the pipes are still read after the group was killed: long enough
/// to collect what is already buffered, short enough that a pipe held by an
/// escaped process cannot hang the caller.
const DRAIN_GRACE: Duration = Duration::from_millis(250);

/// How often the CPU time of a tree with a CPU limit is read: a tree
/// overruns its limit by at most about this much.
const CPU_POLL: Duration = Duration::from_millis(100);

/// Size of each read from a pipe; also the most memory one stream uses beyond
/// its captured bytes.
const READ_CHUNK: usize = 64 * 1024;

/// Variables kept from the engine's environment when [`ProcessSpec::clear_env`]
/// is set: what ordinary programs need to run, nothing that carries secrets.
pub const MINIMAL_ENV_KEYS: &[&str] = &[
    "PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TERM", "USER", "LOGNAME", "TMPDIR", "TZ",
    "SHELL",
];

/// PATH given to a child when the engine itself has none.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Everything needed to run one process.
#[derive(Debug, Clone)]
pub struct ProcessSpec {
    /// The program and its arguments; `argv[0]` is looked up in `PATH`.
    pub argv: Vec<String>,
    /// Working directory of the child.
    pub cwd: PathBuf,
    /// Variables added to (or overriding) the child's environment.
    pub env: Vec<(String, String)>,
    /// Start from [`MINIMAL_ENV_KEYS`] instead of the engine's whole
    /// environment, so the engine's secrets never reach the child.
    pub clear_env: bool,
    /// Wall-clock limit; on expiry the whole group is killed.
    pub timeout: Option<Duration>,
    /// Bytes captured per stream; beyond it output is drained and dropped.
    pub max_output_bytes: usize,
    /// Whether the child may open internet sockets.
    pub network: NetworkPolicy,
    /// The namespaces, file-system view and limits the child runs in;
    /// `None` runs it unconfined (the caller's explicit choice). Its
    /// `network` is derived from [`ProcessSpec::network`]: shut means a
    /// network namespace of its own.
    pub confine: Option<cairn_sandbox::Confinement>,
    /// With [`NetworkPolicy::Proxy`]: the hosts the proxy lets through.
    pub proxy: Option<Arc<HostRules>>,
}

impl ProcessSpec {
    /// A spec with a clean environment, no timeout, a 200,000-byte cap and the
    /// network shut: the safe defaults, to be loosened explicitly.
    pub fn new(argv: Vec<String>, cwd: impl Into<PathBuf>) -> Self {
        ProcessSpec {
            argv,
            cwd: cwd.into(),
            env: Vec::new(),
            clear_env: true,
            timeout: None,
            max_output_bytes: 200_000,
            network: NetworkPolicy::Deny,
            confine: None,
            proxy: None,
        }
    }
}

/// Whether a child may reach the network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetworkPolicy {
    /// No restriction.
    Allow,
    /// Internet sockets are refused by a seccomp filter in the child
    /// (see the crate docs for why seccomp); each refusal is reported through
    /// [`ProcessObserver::network_refused`].
    Deny,
    /// Only through the filtering proxy, to the hosts of
    /// [`ProcessSpec::proxy`]; each connection is reported through
    /// [`ProcessObserver::network_allowed`] or
    /// [`ProcessObserver::network_refused`]. Needs the sandbox (its own
    /// network namespace): an unconfined process gets [`NetworkPolicy::Deny`].
    Proxy,
}

/// Which of the child's output streams a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

impl Stream {
    /// The name used in `NodeOutput.stream`.
    pub fn as_str(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

/// Hears about a process while it runs. Every method defaults to doing nothing.
pub trait ProcessObserver: Send + Sync {
    /// The child started; `pid` is also its process-group id. The engine
    /// records it so that a resume after a crash can kill leftovers with
    /// [`kill_group`].
    fn spawned(&self, pid: u32) {
        let _ = pid;
    }
    /// A chunk of output, as it arrives, cut on UTF-8 character boundaries
    /// (invalid bytes replaced). Only the captured part (up to the cap) is
    /// streamed.
    fn output(&self, stream: Stream, text: &str) {
        let _ = (stream, text);
    }
    /// With [`NetworkPolicy::Deny`], the kernel filter refused the process
    /// (or one of its descendants) a socket. `target` names the call, e.g.
    /// `socket(AF_INET, SOCK_STREAM)`; `reason` says why and which process.
    /// Called on the task running the process, before [`run_process`]
    /// returns; at most 100 times per process.
    fn network_refused(&self, target: &str, reason: &str) {
        let _ = (target, reason);
    }
    /// With [`NetworkPolicy::Proxy`], the proxy let a connection through to
    /// `target` (`host:port`).
    fn network_allowed(&self, target: &str, reason: &str) {
        let _ = (target, reason);
    }
    /// The process's resource limits apply less than fully (`why` says
    /// how); called once, after the spawn.
    fn limits_weakened(&self, why: &str) {
        let _ = why;
    }
}

/// An observer that ignores everything.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoopObserver;

impl ProcessObserver for NoopObserver {}

/// How a process ended and what it printed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessOutcome {
    /// Exit code, when the process exited rather than died of a signal.
    pub exit_code: Option<i32>,
    /// The signal that ended the process, if any (9 after a timeout or cancel).
    pub signal: Option<i32>,
    /// Captured standard output (lossy UTF-8, at most the cap).
    pub stdout: String,
    /// Captured standard error (lossy UTF-8, at most the cap).
    pub stderr: String,
    /// Standard output went past the cap.
    pub stdout_truncated: bool,
    /// Standard error went past the cap.
    pub stderr_truncated: bool,
    /// The time limit ended the process.
    pub timed_out: bool,
    /// The cancellation token ended the process.
    pub cancelled: bool,
    /// From spawn to the end of reading.
    pub duration: Duration,
    /// What the tree's control group counted and saw, when one counted
    /// its limits; `None` when the limits were rlimits only.
    pub tree: Option<TreeLimits>,
}

/// The limits a process tree's control group counted, and the one its
/// counters show was hit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TreeLimits {
    /// The memory limit was the group's.
    pub memory: bool,
    /// The process limit was the group's.
    pub processes: bool,
    /// The CPU-time limit was the group's (enforced by the runner).
    pub cpu: bool,
    /// The limit the kernel's counters (or the runner, for CPU time) show
    /// was hit.
    pub hit: Option<cairn_sandbox::cgroup::Limit>,
}

impl ProcessOutcome {
    /// Exited by itself with code 0.
    pub fn success(&self) -> bool {
        self.exit_code == Some(0) && !self.timed_out && !self.cancelled
    }

    /// When the process failed because of one of `limits`, which one.
    /// Never after a timeout or cancel, which are reported as such.
    ///
    /// A limit counted by the tree's control group is known exactly: its
    /// counters say whether the OOM killer ran or a `fork` was refused, and
    /// the runner itself ended a tree over its CPU time. Rlimits do not
    /// announce themselves: the CPU limit ends the process with SIGXCPU (or
    /// SIGKILL a second later), the memory limit makes allocations fail
    /// (the program then aborts, crashes or says so), the process limit
    /// makes `fork` fail with EAGAIN. So for those alone this reads the
    /// signal and the usual messages on stderr.
    pub fn resource_limit(&self, limits: &cairn_sandbox::ResourceLimits) -> Option<String> {
        use cairn_sandbox::cgroup::Limit;
        if self.timed_out || self.cancelled {
            return None;
        }
        // A hit the counters show fails the process even when it exited 0:
        // a process of the tree was killed or a fork refused, so its work
        // is not what it would have been.
        let tree = self.tree.unwrap_or_default();
        match tree.hit {
            Some(Limit::Memory) => {
                return Some(format!(
                    "the memory limit ({} bytes) was reached by the process tree; the kernel's OOM killer ended it",
                    limits.memory_bytes.unwrap_or(0)
                ))
            }
            Some(Limit::Processes) => {
                return Some(format!(
                    "the process limit ({}) was reached by the process tree; a fork was refused",
                    limits.processes.unwrap_or(0)
                ))
            }
            Some(Limit::CpuTime) => {
                return Some(format!(
                    "the CPU-time limit ({}s) was reached by the process tree, which was killed",
                    limits.cpu_seconds.unwrap_or(0)
                ))
            }
            None => {}
        }
        if self.success() {
            return None;
        }
        let err = self.stderr.to_ascii_lowercase();
        if let Some(cpu) = limits.cpu_seconds.filter(|_| !tree.cpu) {
            if matches!(self.signal, Some(libc::SIGXCPU) | Some(libc::SIGKILL)) {
                return Some(format!("the CPU-time limit ({cpu}s) was reached"));
            }
        }
        if let Some(mem) = limits.memory_bytes.filter(|_| !tree.memory) {
            let said = [
                "memoryerror",
                "cannot allocate memory",
                "out of memory",
                "memory allocation of",
                "std::bad_alloc",
            ]
            .iter()
            .any(|m| err.contains(m));
            let died = matches!(
                self.signal,
                Some(libc::SIGSEGV)
                    | Some(libc::SIGABRT)
                    | Some(libc::SIGBUS)
                    | Some(libc::SIGKILL)
            );
            if said || died {
                return Some(format!("the memory limit ({mem} bytes) was likely reached"));
            }
        }
        if let Some(n) = limits.processes.filter(|_| !tree.processes) {
            let said = [
                "resource temporarily unavailable",
                "cannot fork",
                "fork: retry",
                "can't fork",
            ]
            .iter()
            .any(|m| err.contains(m));
            if said {
                return Some(format!("the process limit ({n}) was reached"));
            }
        }
        None
    }
}

/// The waits between tries of a spawn that failed for want of file
/// descriptors (about 6 s in all).
const SPAWN_WAITS: &[Duration] = &[
    Duration::from_millis(50),
    Duration::from_millis(100),
    Duration::from_millis(200),
    Duration::from_millis(400),
    Duration::from_millis(800),
    Duration::from_millis(1600),
    Duration::from_millis(3000),
];

/// Why a process could not be run at all.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// The argv was empty.
    #[error("cannot start a process: argv is empty")]
    EmptyArgv,
    /// An argv entry or an environment variable contains a NUL byte.
    #[error("cannot start `{program}`: {what} contains a NUL byte")]
    Nul {
        /// `argv[0]`.
        program: String,
        /// Which part held the NUL.
        what: String,
    },
    /// The kernel refused to start the program (not found, not executable,
    /// bad working directory, ...).
    #[error("cannot start `{program}`: {source}")]
    Spawn {
        /// `argv[0]`.
        program: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The network could not be shut on this platform, so the process was
    /// not started rather than started unrestricted.
    #[error("cannot start `{program}` with the network shut: {reason}")]
    NetworkFilter {
        /// `argv[0]`.
        program: String,
        /// Why no filter is available.
        reason: String,
    },
    /// The process sandbox could not be built (or the confinement is
    /// wrong), so the process was not started rather than started
    /// unconfined.
    #[error("cannot start `{program}`: {source}")]
    Sandbox {
        /// `argv[0]`.
        program: String,
        /// What is missing or wrong.
        #[source]
        source: cairn_sandbox::SandboxError,
    },
    /// Waiting for the process failed.
    #[error("waiting for `{program}` failed: {source}")]
    Wait {
        /// `argv[0]`.
        program: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

impl ProcessError {
    /// Whether the process could not be started because this process (or
    /// the system) ran out of file descriptors, `EMFILE` or `ENFILE`: a
    /// condition that passes, unlike a missing program or a sandbox the
    /// kernel refuses. The sandbox's child reports its errors as text.
    pub fn out_of_descriptors(&self) -> bool {
        let io = |e: &std::io::Error| matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE));
        match self {
            ProcessError::Spawn { source, .. } => io(source),
            ProcessError::Sandbox { source, .. } => match source {
                cairn_sandbox::SandboxError::Io(e) => io(e),
                other => {
                    let text = other.to_string();
                    text.contains("(os error 24)") || text.contains("(os error 23)")
                }
            },
            ProcessError::NetworkFilter { reason, .. } => {
                reason.contains("(os error 24)") || reason.contains("(os error 23)")
            }
            _ => false,
        }
    }
}

/// Sends SIGKILL to a whole process group. Used to clean up a group left behind
/// by a crashed run; a group that no longer exists is not an error. Ids 0 and 1
/// are ignored, as killing "our own group" or "every process" is never meant.
pub fn kill_group(pgid: u32) {
    if pgid <= 1 || pgid > i32::MAX as u32 {
        return;
    }
    // SAFETY: kill(2) with a negative pid targets the group; no memory involved.
    unsafe {
        libc::kill(-(pgid as i32), libc::SIGKILL);
    }
}

/// Captured bytes of one stream plus the not-yet-streamed tail of a UTF-8
/// character cut by a read boundary.
struct Capture {
    stream: Stream,
    cap: usize,
    bytes: Vec<u8>,
    streamed: usize,
    truncated: bool,
}

impl Capture {
    fn new(stream: Stream, cap: usize) -> Self {
        Capture {
            stream,
            cap,
            bytes: Vec::new(),
            streamed: 0,
            truncated: false,
        }
    }

    fn push(&mut self, chunk: &[u8], observer: &dyn ProcessObserver) {
        let room = self.cap.saturating_sub(self.bytes.len());
        if chunk.len() > room {
            self.truncated = true;
        }
        let take = chunk.len().min(room);
        if take == 0 {
            return;
        }
        self.bytes.extend_from_slice(&chunk[..take]);
        let pending = &self.bytes[self.streamed..];
        let complete = complete_prefix_len(pending);
        if complete > 0 {
            observer.output(self.stream, &String::from_utf8_lossy(&pending[..complete]));
            self.streamed += complete;
        }
    }

    /// Streams any cut-off tail and returns the captured text.
    fn finish(mut self, observer: &dyn ProcessObserver) -> (String, bool) {
        if self.truncated {
            // The cap may have cut a character in half; drop the fragment
            // rather than turning it into U+FFFD.
            let keep = self.streamed + complete_prefix_len(&self.bytes[self.streamed..]);
            self.bytes.truncate(keep);
        }
        if self.streamed < self.bytes.len() {
            observer.output(
                self.stream,
                &String::from_utf8_lossy(&self.bytes[self.streamed..]),
            );
        }
        let text = match String::from_utf8(self.bytes) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        };
        (text, self.truncated)
    }
}

/// Length of the longest prefix that does not end inside a multi-byte UTF-8
/// character (invalid bytes count as complete: they become U+FFFD).
fn complete_prefix_len(b: &[u8]) -> usize {
    let mut start = 0;
    loop {
        match std::str::from_utf8(&b[start..]) {
            Ok(_) => return b.len(),
            Err(e) => match e.error_len() {
                None => return start + e.valid_up_to(),
                Some(n) => start += e.valid_up_to() + n,
            },
        }
    }
}

async fn drain<R: tokio::io::AsyncRead + Unpin>(
    pipe: Option<R>,
    capture: &mut Capture,
    observer: &dyn ProcessObserver,
) {
    let Some(mut pipe) = pipe else { return };
    let mut buf = vec![0u8; READ_CHUNK];
    loop {
        match pipe.read(&mut buf).await {
            Ok(0) => return,
            Ok(n) => capture.push(&buf[..n], observer),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        }
    }
}

/// The next refusal from the supervisor; pending forever once there is none.
async fn next_refusal(rx: &mut Option<Supervisor>) -> Option<Refusal> {
    match rx {
        Some(sup) => sup.refusals.recv().await,
        None => std::future::pending().await,
    }
}

/// Why the runner ended the group itself.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stop {
    Timeout,
    Cancel,
}

/// A process set up to be spawned: its command (environment, pipes, and
/// the `pre_exec` that confines it), the planned sandbox, and the channel
/// its kernel network filter comes back over.
struct Spawning {
    program: String,
    cmd: tokio::process::Command,
    proxied: bool,
    prepared: Option<Arc<cairn_sandbox::Prepared>>,
    channel: Option<ListenerChannel>,
}

/// Checks `spec` and builds its command: `stdin` as given, stdout and
/// stderr piped, a process group of its own, the environment the spec
/// allows, the sandbox entered and (with the network denied and
/// `filter_network`) the kernel filter installed between fork and exec,
/// and death with the engine.
fn spawning(
    spec: &ProcessSpec,
    stdin: Stdio,
    filter_network: bool,
) -> Result<Spawning, ProcessError> {
    // Where control groups go is decided before the first process starts,
    // whatever starts it, while the engine's group holds only the engine
    // (on cgroup v2 the engine may move itself into a leaf, which another
    // process in its group would prevent). A run that starts no process
    // never looks.
    let _ = cairn_sandbox::cgroup::support();
    let program = spec.argv.first().ok_or(ProcessError::EmptyArgv)?.clone();
    check_no_nul(spec, &program)?;

    // Through the proxy only from a network namespace of its own; without
    // one, the proxy could be bypassed, so the network is shut instead.
    let proxied = spec.network == NetworkPolicy::Proxy && spec.confine.is_some();
    let policy = match spec.network {
        NetworkPolicy::Proxy if !proxied => NetworkPolicy::Deny,
        p => p,
    };
    // A confined process without network is in a network namespace of its
    // own already; the filter adds the reports of what it tried.
    let filter = match policy {
        NetworkPolicy::Deny if filter_network || spec.confine.is_none() => Some(
            NetFilter::build().map_err(|reason| ProcessError::NetworkFilter {
                program: program.clone(),
                reason: reason.to_string(),
            })?,
        ),
        _ => None,
    };

    let mut cmd = command(spec, &program, stdin, proxied);

    // The child sends its seccomp listener back over this, so refusals can
    // be answered and reported here.
    let channel = match &filter {
        Some(_) => Some(
            ListenerChannel::new().map_err(|e| ProcessError::NetworkFilter {
                program: program.clone(),
                reason: format!("cannot create the listener channel: {e}"),
            })?,
        ),
        None => None,
    };
    let report_fd = channel.as_ref().map(ListenerChannel::child_fd);

    let prepared = prepare_sandbox(spec, policy, &program)?;
    let in_child = prepared.clone();

    // SAFETY: getpid has no preconditions.
    let parent = unsafe { libc::getpid() };
    // SAFETY: the closure runs between fork and exec and only makes
    // async-signal-safe calls (prctl, getppid, unshare, mount, seccomp,
    // sendmsg, close, ...) without allocating.
    unsafe {
        cmd.pre_exec(move || {
            // A direct child dies with the engine even if the engine is
            // SIGKILLed and cannot clean up.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have died before the prctl took effect.
            if libc::getppid() != parent {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            // Returns only in PID 1 of the sandbox; the process spawned
            // here waits for it and mirrors its end.
            if let Some(p) = &in_child {
                p.enter()?;
            }
            if let Some(filter) = &filter {
                filter.install(report_fd)?;
            }
            Ok(())
        });
    }
    Ok(Spawning {
        program,
        cmd,
        proxied,
        prepared,
        channel,
    })
}

/// Refuses a NUL byte in an argument or in the environment (and `=` or an
/// empty name in a variable's name), which `exec` would cut short silently.
fn check_no_nul(spec: &ProcessSpec, program: &str) -> Result<(), ProcessError> {
    for (i, arg) in spec.argv.iter().enumerate() {
        if arg.contains('\0') {
            return Err(ProcessError::Nul {
                program: program.to_string(),
                what: format!("argv[{i}]"),
            });
        }
    }
    for (k, v) in &spec.env {
        if k.contains('\0') || v.contains('\0') || k.contains('=') || k.is_empty() {
            return Err(ProcessError::Nul {
                program: program.to_string(),
                what: format!(
                    "environment variable `{}` (name or value)",
                    k.replace('\0', "\\0")
                ),
            });
        }
    }

    Ok(())
}

/// The command itself: its arguments and folder, its pipes, a process
/// group of its own, and the environment the spec allows (with the
/// proxy's address when it goes through the proxy).
fn command(
    spec: &ProcessSpec,
    program: &str,
    stdin: Stdio,
    proxied: bool,
) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(&spec.argv[1..])
        .current_dir(&spec.cwd)
        .stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(false);
    if spec.clear_env {
        cmd.env_clear();
        for key in MINIMAL_ENV_KEYS {
            if let Some(v) = std::env::var_os(key) {
                cmd.env(key, v);
            }
        }
        if std::env::var_os("PATH").is_none() {
            cmd.env("PATH", DEFAULT_PATH);
        }
        // The engine's home folder is not in a sandbox's view; its private
        // /tmp is, and is writable (caches, dotfiles).
        if spec.confine.is_some() {
            cmd.env("HOME", "/tmp");
        }
    }
    for (k, v) in &spec.env {
        cmd.env(k, v);
    }
    if proxied {
        let url = format!("http://127.0.0.1:{}", cairn_sandbox::PROXY_PORT);
        for k in [
            "HTTP_PROXY",
            "HTTPS_PROXY",
            "http_proxy",
            "https_proxy",
            "ALL_PROXY",
            "all_proxy",
        ] {
            cmd.env(k, &url);
        }
        cmd.env_remove("NO_PROXY").env_remove("no_proxy");
    }

    cmd
}

/// The sandbox the spec asks for, planned with the network policy that
/// applies (a proxy without a namespace of its own became a denial).
fn prepare_sandbox(
    spec: &ProcessSpec,
    policy: NetworkPolicy,
    program: &str,
) -> Result<Option<Arc<cairn_sandbox::Prepared>>, ProcessError> {
    Ok(match &spec.confine {
        Some(c) => {
            let mut c = c.clone();
            c.network = match policy {
                NetworkPolicy::Allow => cairn_sandbox::Network::Host,
                NetworkPolicy::Deny => cairn_sandbox::Network::None,
                NetworkPolicy::Proxy => cairn_sandbox::Network::Proxy,
            };
            Some(Arc::new(c.prepare(&spec.cwd).map_err(|source| {
                ProcessError::Sandbox {
                    program: program.to_string(),
                    source,
                }
            })?))
        }
        None => None,
    })
}

/// The error of a spawn that failed: the sandbox's, when a step of it did.
fn spawn_error(
    program: String,
    prepared: Option<&Arc<cairn_sandbox::Prepared>>,
    source: std::io::Error,
) -> ProcessError {
    match prepared.and_then(|p| p.failure()) {
        Some(f) => ProcessError::Sandbox {
            program,
            source: f.into_error(),
        },
        None => ProcessError::Spawn { program, source },
    }
}

/// A long-running process the caller talks to over its pipes (an MCP
/// server), confined like every other: its sandbox, its network (the
/// filtering proxy serves it while it runs), its own process group, death
/// with the engine. Dropping it kills the group (and the control group).
pub struct Service {
    child: tokio::process::Child,
    pid: u32,
    prepared: Option<Arc<cairn_sandbox::Prepared>>,
    _proxy: Option<tokio::task::JoinSet<()>>,
    _supervisor: Option<Supervisor>,
}

impl Service {
    /// The process, for its pipes and its end.
    pub fn child_mut(&mut self) -> &mut tokio::process::Child {
        &mut self.child
    }

    /// Its process id, which is also its process group's.
    pub fn pid(&self) -> u32 {
        self.pid
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        kill_group(self.pid);
        let _ = self.child.start_kill();
        if let Some(g) = self.prepared.as_ref().and_then(|p| p.cgroup()) {
            g.kill();
            g.remove();
        }
    }
}

/// Starts `spec` as a [`Service`] with piped stdin, stdout and stderr. Its
/// timeout and output cap do not apply: the caller decides how long it
/// runs and reads what it writes. Must be called within a tokio runtime.
pub fn spawn_service(spec: ProcessSpec) -> Result<Service, ProcessError> {
    let Spawning {
        program,
        mut cmd,
        proxied,
        prepared,
        channel,
    } = spawning(&spec, Stdio::piped(), false)?;
    let child = cmd
        .spawn()
        .map_err(|e| spawn_error(program, prepared.as_ref(), e))?;
    let pid = child.id().unwrap_or(0);
    let proxy = match (&prepared, proxied) {
        (Some(p), true) => p.take_proxy_listener().and_then(|l| {
            let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
            crate::proxy::serve(l, spec.proxy.clone().unwrap_or_default(), tx).ok()
        }),
        _ => None,
    };
    let supervisor = channel
        .and_then(ListenerChannel::receive)
        .and_then(|listener| Supervisor::start(listener).ok());
    Ok(Service {
        child,
        pid,
        prepared,
        _proxy: proxy,
        _supervisor: supervisor,
    })
}

/// Runs one process to completion, timeout or cancellation.
///
/// A non-zero exit is not an error here: it is reported in the outcome, and
/// callers decide what it means. Errors are for processes that could not be
/// started or waited for.
pub async fn run_process(
    spec: ProcessSpec,
    observer: &dyn ProcessObserver,
    cancel: CancellationToken,
) -> Result<ProcessOutcome, ProcessError> {
    run_with(spec, None, observer, cancel).await
}

/// [`run_process`] with `input` written to the process's stdin (then
/// closed). A process that exits without reading it all is not an error.
pub async fn run_process_with_input(
    spec: ProcessSpec,
    input: Vec<u8>,
    observer: &dyn ProcessObserver,
    cancel: CancellationToken,
) -> Result<ProcessOutcome, ProcessError> {
    run_with(spec, Some(input), observer, cancel).await
}

/// A process spawned, with what its run needs: its program's name, the
/// child, whether it goes through the proxy, its sandbox and the channel
/// its seccomp listener comes back over.
type Spawned = (
    String,
    tokio::process::Child,
    bool,
    Option<Arc<cairn_sandbox::Prepared>>,
    Option<ListenerChannel>,
);

/// Spawns `spec`; a spawn that fails for want of file descriptors is
/// tried again after a wait, until the waits run out or the run is
/// cancelled.
async fn spawn_retrying(
    spec: &ProcessSpec,
    with_input: bool,
    cancel: &CancellationToken,
) -> Result<Spawned, ProcessError> {
    // A spawn that fails for want of file descriptors (the pipes, the
    // sandbox's report pipe, a descriptor in the child) is tried again a
    // few times, as a model call is after a failed connection: the
    // descriptors other work holds come free.
    let mut waits = SPAWN_WAITS.iter();
    loop {
        let stdin = if with_input {
            Stdio::piped()
        } else {
            Stdio::null()
        };
        let tried = spawning(spec, stdin, true).and_then(|s| {
            let Spawning {
                program,
                mut cmd,
                proxied,
                prepared,
                channel,
            } = s;
            match cmd.spawn() {
                Ok(c) => Ok((program, c, proxied, prepared, channel)),
                Err(source) => Err(spawn_error(program, prepared.as_ref(), source)),
            }
        });
        match tried {
            Ok(spawned) => return Ok(spawned),
            Err(e) if e.out_of_descriptors() => {
                let Some(wait) = waits.next() else {
                    return Err(e);
                };
                tokio::select! {
                    _ = tokio::time::sleep(*wait) => {}
                    _ = cancel.cancelled() => return Err(e),
                }
            }
            Err(e) => return Err(e),
        }
    }
}

/// The group is dead: stops the supervisor and reports what it queued.
/// Each refusal is queued before it is answered, so none the program saw
/// is missed; the grace only bounds the wait for the thread to notice.
async fn report_queued(sup: Supervisor, observer: &dyn ProcessObserver) {
    let mut rx = sup.stop();
    let _ = tokio::time::timeout(DRAIN_GRACE, async {
        while let Some(r) = rx.recv().await {
            observer.network_refused(&r.target, &r.reason);
        }
    })
    .await;
}

async fn run_with(
    spec: ProcessSpec,
    input: Option<Vec<u8>>,
    observer: &dyn ProcessObserver,
    cancel: CancellationToken,
) -> Result<ProcessOutcome, ProcessError> {
    let (program, mut child, proxied, prepared, channel) =
        spawn_retrying(&spec, input.is_some(), &cancel).await?;
    let started = Instant::now();
    if let (Some(input), Some(mut pipe)) = (input, child.stdin.take()) {
        // Written beside the reads of stdout and stderr, so that a program
        // that writes before it reads cannot deadlock on full pipes; the
        // write ends (broken pipe) when the group dies.
        tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            let _ = pipe.write_all(&input).await;
        });
    }
    let pid = child.id().unwrap_or(0);
    // The proxy runs until this function returns (dropping the set aborts
    // it); its verdicts come back over `proxy_rx`.
    let (proxy_tx, proxy_rx) = tokio::sync::mpsc::unbounded_channel();
    let _proxy = match (&prepared, proxied) {
        (Some(p), true) => p.take_proxy_listener().and_then(|l| {
            crate::proxy::serve(l, spec.proxy.clone().unwrap_or_default(), proxy_tx).ok()
        }),
        _ => None,
    };
    // Until the supervisor runs, a refused call in the child just waits.
    let supervisor = channel
        .and_then(ListenerChannel::receive)
        .and_then(|listener| Supervisor::start(listener).ok());
    observer.spawned(pid);
    if let Some(why) = prepared.as_ref().and_then(|p| p.limits_note()) {
        observer.limits_weakened(why);
    }

    let mut out = Capture::new(Stream::Stdout, spec.max_output_bytes);
    let mut err = Capture::new(Stream::Stderr, spec.max_output_bytes);
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();

    let mut tree = Tree::new(pid, prepared.as_ref().and_then(|p| p.cgroup()));

    let mut watch = Watch {
        timeout: spec.timeout,
        cancel: &cancel,
        supervisor,
        proxy_rx,
        observer,
    };
    let pipes = async {
        tokio::join!(
            drain(stdout, &mut out, observer),
            drain(stderr, &mut err, observer)
        )
    };
    let (status, stop) = wait_for_end(&mut child, &mut tree, pipes, &mut watch).await;
    if let Some(sup) = watch.supervisor.take() {
        report_queued(sup, observer).await;
    }
    let status = status.map_err(|source| ProcessError::Wait {
        program: program.clone(),
        source,
    })?;

    let tree = tree.finish().await;

    let (stdout, stdout_truncated) = out.finish(observer);
    let (stderr, stderr_truncated) = err.finish(observer);
    Ok(ProcessOutcome {
        exit_code: status.code(),
        signal: status.signal(),
        stdout,
        stderr,
        stdout_truncated,
        stderr_truncated,
        timed_out: stop == Some(Stop::Timeout),
        cancelled: stop == Some(Stop::Cancel),
        duration: started.elapsed(),
        tree,
    })
}

/// What a program's run is watched for besides its end: its deadline, the
/// run's cancel, and the network verdicts of its filter and its proxy.
struct Watch<'a> {
    timeout: Option<Duration>,
    cancel: &'a CancellationToken,
    supervisor: Option<Supervisor>,
    proxy_rx: tokio::sync::mpsc::UnboundedReceiver<crate::proxy::ProxyEvent>,
    observer: &'a dyn ProcessObserver,
}

/// Waits until the program has ended and its pipes are drained, its
/// deadline passes or the run is cancelled, reporting network verdicts
/// meanwhile; the group is ended and the leader reaped whichever comes
/// first. Returns the leader's status and why it was stopped, if it was.
async fn wait_for_end(
    child: &mut tokio::process::Child,
    tree: &mut Tree<'_>,
    pipes: impl std::future::Future,
    w: &mut Watch<'_>,
) -> (std::io::Result<std::process::ExitStatus>, Option<Stop>) {
    tokio::pin!(pipes);
    let mut stop: Option<Stop> = None;
    let deadline = async {
        match w.timeout {
            Some(t) => tokio::time::sleep(t).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(deadline);

    let mut pipes_done = false;
    let mut exited = None;
    loop {
        tokio::select! {
            _ = &mut pipes, if !pipes_done => {
                pipes_done = true;
                if exited.is_some() { break; }
            }
            res = child.wait(), if exited.is_none() => {
                exited = Some(res);
                if pipes_done { break; }
                // The leader is gone but something in its group still
                // holds a pipe: end the group, keep what is buffered.
                tree.end();
                let _ = tokio::time::timeout(DRAIN_GRACE, &mut pipes).await;
                break;
            }
            // Over its CPU time, the tree is ended like a killed one
            // and the loop reaps it as usual.
            _ = tree.cpu_tick(), if tree.watching() && exited.is_none() => tree.check_cpu(),
            _ = &mut deadline, if stop.is_none() => {
                stop = Some(Stop::Timeout);
                break;
            }
            _ = w.cancel.cancelled(), if stop.is_none() => {
                stop = Some(Stop::Cancel);
                break;
            }
            refusal = next_refusal(&mut w.supervisor) => match refusal {
                Some(r) => w.observer.network_refused(&r.target, &r.reason),
                None => w.supervisor = None,
            },
            Some(ev) = w.proxy_rx.recv() => {
                if ev.allowed {
                    w.observer.network_allowed(&ev.target, &ev.reason);
                } else {
                    w.observer.network_refused(&ev.target, &ev.reason);
                }
            }
        }
    }

    let status = match exited {
        Some(res) => {
            // Stragglers that closed their pipes but still run.
            tree.end();
            res
        }
        None => {
            // Kill before reaping: while the leader is an unreaped zombie
            // its pid, and so the group id, cannot be reused.
            tree.end();
            let res = child.wait().await;
            if !pipes_done {
                let _ = tokio::time::timeout(DRAIN_GRACE, &mut pipes).await;
            }
            res
        }
    };
    (status, stop)
}

/// The process tree while it runs: its process group and, when its limits
/// are counted in one, its control group.
struct Tree<'a> {
    pid: u32,
    group: Option<&'a cairn_sandbox::cgroup::Group>,
    cpu_limit: Option<Duration>,
    ticks: tokio::time::Interval,
    cpu_over: bool,
}

impl<'a> Tree<'a> {
    fn new(pid: u32, group: Option<&'a cairn_sandbox::cgroup::Group>) -> Self {
        let mut ticks = tokio::time::interval(CPU_POLL);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Tree {
            pid,
            group,
            cpu_limit: group.and_then(|g| g.cpu_limit()),
            ticks,
            cpu_over: false,
        }
    }

    /// Kills the process group and the control group.
    fn end(&self) {
        kill_group(self.pid);
        if let Some(g) = self.group {
            g.kill();
        }
    }

    /// Whether the tree's CPU time is to be read.
    fn watching(&self) -> bool {
        self.cpu_limit.is_some() && !self.cpu_over
    }

    async fn cpu_tick(&mut self) {
        self.ticks.tick().await;
    }

    /// Ends the tree once its CPU time is over the limit.
    fn check_cpu(&mut self) {
        let (Some(g), Some(limit)) = (self.group, self.cpu_limit) else {
            return;
        };
        if g.cpu_used().is_some_and(|used| used >= limit) {
            self.cpu_over = true;
            self.end();
        }
    }

    /// Once the process has ended: what the group counted and saw. Then
    /// removes the group once its processes are gone (they may take a
    /// moment to leave after the kill); whatever remains is retried when
    /// the sandbox plan is dropped, and swept by the next engine.
    async fn finish(self) -> Option<TreeLimits> {
        let g = self.group?;
        let (memory, processes, cpu) = g.counts();
        let seen = TreeLimits {
            memory,
            processes,
            cpu,
            hit: if self.cpu_over {
                Some(cairn_sandbox::cgroup::Limit::CpuTime)
            } else {
                g.hit()
            },
        };
        for _ in 0..50 {
            if g.remove() {
                break;
            }
            g.kill();
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        Some(seen)
    }
}

#[cfg(test)]
mod tests {
    use super::{complete_prefix_len, ProcessOutcome, TreeLimits};
    use cairn_sandbox::cgroup::Limit;
    use cairn_sandbox::ResourceLimits;
    use std::time::Duration;

    fn outcome(code: Option<i32>, signal: Option<i32>, stderr: &str) -> ProcessOutcome {
        ProcessOutcome {
            exit_code: code,
            signal,
            stdout: String::new(),
            stderr: stderr.into(),
            stdout_truncated: false,
            stderr_truncated: false,
            timed_out: false,
            cancelled: false,
            duration: Duration::ZERO,
            tree: None,
        }
    }

    const ALL: ResourceLimits = ResourceLimits {
        memory_bytes: Some(1 << 20),
        processes: Some(20),
        cpu_seconds: Some(1),
    };

    #[test]
    fn a_counted_hit_names_its_limit_even_after_exit_0() {
        let mut o = outcome(Some(0), None, "");
        o.tree = Some(TreeLimits {
            memory: true,
            processes: true,
            cpu: true,
            hit: Some(Limit::Processes),
        });
        let why = o.resource_limit(&ALL).unwrap();
        assert!(why.contains("process limit (20)"), "{why}");
        o.tree.as_mut().unwrap().hit = Some(Limit::Memory);
        assert!(o.resource_limit(&ALL).unwrap().contains("memory limit"));
        o.tree.as_mut().unwrap().hit = Some(Limit::CpuTime);
        assert!(o
            .resource_limit(&ALL)
            .unwrap()
            .contains("CPU-time limit (1s)"));
        // A timeout is reported as one, whatever the counters say.
        o.timed_out = true;
        assert_eq!(o.resource_limit(&ALL), None);
    }

    #[test]
    fn counted_limits_are_not_guessed_from_stderr() {
        // Killed, with an allocation failure on stderr: evidence enough for
        // an rlimit, none for a limit the group counted and saw no hit of.
        let mut o = outcome(
            None,
            Some(libc::SIGKILL),
            "Cannot allocate memory; fork: retry",
        );
        assert!(o.resource_limit(&ALL).is_some());
        o.tree = Some(TreeLimits {
            memory: true,
            processes: true,
            cpu: true,
            hit: None,
        });
        assert_eq!(o.resource_limit(&ALL), None);
        // A limit the group does not count still falls back.
        o.tree.as_mut().unwrap().processes = false;
        let why = o.resource_limit(&ALL).unwrap();
        assert!(why.contains("process limit"), "{why}");
    }

    #[test]
    fn utf8_prefix_stops_before_a_cut_character() {
        let s = "aé€😀".as_bytes();
        assert_eq!(complete_prefix_len(s), s.len());
        assert_eq!(complete_prefix_len(&s[..2]), 1); // cut inside é
        assert_eq!(complete_prefix_len(&s[..5]), 3); // cut inside €
        assert_eq!(complete_prefix_len(&s[..8]), 6); // cut inside 😀
        assert_eq!(complete_prefix_len(b"a\xffb"), 3); // invalid byte is not "incomplete"
    }
}
