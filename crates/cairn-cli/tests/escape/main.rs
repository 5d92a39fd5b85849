//! The escape suite: hostile nodes, run as real workflows by the real
//! `cairn` binary, try to leave their sandbox. Each attack must fail (its
//! node fails with the kernel's refusal, network attempts are reported as
//! blocked `NetworkAccess` events) while a harmless control next to it
//! works. Every attack runs twice: from a `command` node and from a `bash`
//! tool call.
//!
//! The attacks of each wall live in a module of this folder; this file
//! holds the shared fixtures and the first walls (processes, network,
//! limits).

#[path = "../common/mod.rs"]
mod common;
use common::*;
mod cli_args;
mod kept_files;
mod pinning;
mod proxy;
mod revert_race;
mod serve;
use std::io::{Read, Write};
use std::net::{TcpListener, UdpSocket};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use cairn_store::prelude::*;
use cairn_store::{EventQuery, SqliteBackend};
use serde_json::Value;

/// A temporary folder holding the sandbox root (`root/`, where the
/// workflow and the store live) and files outside it.
struct Env {
    _tmp: tempfile::TempDir,
    top: PathBuf,
    root: PathBuf,
    secret: String,
}

impl Env {
    fn new() -> Env {
        let tmp = tempfile::tempdir().unwrap();
        let top = tmp.path().canonicalize().unwrap();
        let root = top.join("root");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::write(top.join("secret.txt"), "outside secret").unwrap();
        std::fs::create_dir_all(top.join("beside")).unwrap();
        Env {
            _tmp: tmp,
            top,
            root,
            secret: format!("s3cr3t-{}", std::process::id()),
        }
    }

    fn cairn(&self, args: &[&str]) -> Child {
        Command::new(env!("CARGO_BIN_EXE_cairn"))
            .current_dir(&self.root)
            .args(args)
            .args(["--store", ".cairn/cairn.db"])
            .env_remove("CAIRN_STORE")
            .env_remove("CAIRN_LOG_DIR")
            .env("CAIRN_ESCAPE_SECRET", &self.secret)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn cairn")
    }

    /// Runs `yaml` as run `run` to its end; the engine's pid is written to
    /// `engine.pid` in the root for the attacks that aim at it.
    fn run(&self, yaml: &str, run: &str) -> (ExitStatus, String, Vec<Value>) {
        std::fs::write(self.root.join(format!("{run}.yaml")), yaml).unwrap();
        let mut child = self.cairn(&["run", &format!("{run}.yaml"), "--run-id", run]);
        std::fs::write(self.root.join("engine.pid"), child.id().to_string()).unwrap();
        let status = wait_exit(&mut child);
        let err = stderr_of(&mut child);
        (status, err, self.events(run))
    }

    fn events(&self, run: &str) -> Vec<Value> {
        let backend =
            SqliteBackend::open(&self.root.join(".cairn/cairn.db")).expect("open the store");
        backend
            .read_events(
                &cairn_events::RunId::parse(run).unwrap(),
                &EventQuery::default(),
            )
            .expect("read events")
            .iter()
            .map(|s| serde_json::from_str(&s.json).unwrap())
            .collect()
    }
}

fn python() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import ctypes, socket"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("skipped: the python3 probes (python3 with ctypes is not installed)");
    }
    ok
}

fn sandbox_available() -> bool {
    let out = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .arg("doctor")
        .output()
        .expect("run cairn doctor");
    if !out.status.success() {
        eprintln!(
            "skipped: this machine cannot build the process sandbox:\n{}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    out.status.success()
}

/// The events of one node.
fn of<'a>(events: &'a [Value], node: &str) -> Vec<&'a Value> {
    events
        .iter()
        .filter(|e| e["nodeId"].as_str() == Some(node))
        .collect()
}

fn ended(events: &[Value], node: &str) -> &'static str {
    for e in of(events, node).iter().rev() {
        match e["type"].as_str() {
            Some("NodeFinished") => return "finished",
            Some("NodeFailed") => return "failed",
            Some("NodeCancelled") => return "cancelled",
            Some("NodeSkipped") => return "skipped",
            _ => {}
        }
    }
    "never ended"
}

fn dump(events: &[Value], node: &str) -> String {
    of(events, node)
        .iter()
        .map(|e| e.to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

/// A node running `argv` as a command (`c_<id>`) or a bash call (`b_<id>`).
fn node(kind: &str, id: &str, argv: &[String], needs_fail: bool) -> String {
    let argv = serde_json::to_string(argv).unwrap();
    let cont = if needs_fail {
        "    on_failure: continue\n"
    } else {
        ""
    };
    match kind {
        "command" => format!(
            "  - id: c_{id}\n    command: {argv}\n    env: {{ DECLARED: \"yes\" }}\n{cont}"
        ),
        _ => format!(
            "  - id: b_{id}\n    tool: bash\n    args: {{ argv: {argv}, env: {{ DECLARED: \"yes\" }} }}\n{cont}"
        ),
    }
}

fn sh(script: &str) -> Vec<String> {
    vec!["sh".into(), "-c".into(), script.into()]
}

fn py(script: &str) -> Vec<String> {
    vec!["python3".into(), "-c".into(), script.into()]
}

/// Python that waits for `engine.pid`, then tries every way into the
/// engine's process; exits 0 only if one worked.
const INTO_THE_ENGINE: &str = r#"
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
for _ in range(1000):
    if os.path.exists("engine.pid"): break
    time.sleep(0.01)
pid = int(open("engine.pid").read())
won = []
if libc.ptrace(16, pid, 0, 0) == 0: won.append("ptrace attach")
print("ptrace:", os.strerror(ctypes.get_errno()), file=sys.stderr)
fd = libc.syscall(434, pid, 0)
print("pidfd_open:", fd, os.strerror(ctypes.get_errno()), file=sys.stderr)
if fd >= 0:
    if libc.syscall(438, fd, 2, 0) >= 0: won.append("pidfd_getfd")
    print("pidfd_getfd:", os.strerror(ctypes.get_errno()), file=sys.stderr)
me = libc.syscall(434, os.getpid(), 0)
if me >= 0 and libc.syscall(438, me, 1, 0) >= 0: won.append("pidfd_getfd on itself")
print("pidfd_getfd(self):", os.strerror(ctypes.get_errno()), file=sys.stderr)
buf = ctypes.create_string_buffer(8)
class iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
local = iovec(ctypes.cast(buf, ctypes.c_void_p), 8)
remote = iovec(0x400000, 8)
if libc.syscall(310, pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0) > 0: won.append("process_vm_readv")
print("process_vm_readv:", os.strerror(ctypes.get_errno()), file=sys.stderr)
try:
    open("/proc/%d/environ" % pid, "rb").read(); won.append("environ")
except OSError as e:
    print("environ:", e, file=sys.stderr)
print(won)
sys.exit(0 if won else 1)
"#;

fn connect_unix(path: &str) -> String {
    format!(
        "import socket, sys\ns = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\ntry:\n    s.connect({path})\nexcept OSError as e:\n    print(e, file=sys.stderr); sys.exit(1)\nprint('connected')"
    )
}

fn connect_tcp(port: u16) -> String {
    format!(
        "import socket, sys\ntry:\n    s = socket.create_connection(('127.0.0.1', {port}), timeout=5)\nexcept OSError as e:\n    print(e, file=sys.stderr); sys.exit(1)\nprint('connected')"
    )
}

fn send_udp(port: u16) -> String {
    format!(
        "import socket, sys\ntry:\n    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n    s.sendto(b'hello', ('127.0.0.1', {port}))\nexcept OSError as e:\n    print(e, file=sys.stderr); sys.exit(1)\nprint('sent')"
    )
}

const UNIX_INSIDE: &str = "import socket, os\np = 'inside-%s.sock' % os.urandom(4).hex()\nl = socket.socket(socket.AF_UNIX)\nl.bind(p); l.listen(1)\nc = socket.socket(socket.AF_UNIX); c.connect(p)\nprint('ok')";

#[test]
fn attacks_fail_and_controls_work_in_commands_and_bash_calls() {
    if !sandbox_available() {
        return;
    }
    let env = Env::new();
    let with_python = python();
    let pg = Path::new("/var/run/postgresql/.s.PGSQL.5432");
    let pg = pg.exists().then(|| pg.to_string_lossy().into_owned());
    if pg.is_none() {
        eprintln!(
            "skipped: the PostgreSQL socket probe (no /var/run/postgresql/.s.PGSQL.5432 here)"
        );
    }
    // Listeners of the test itself, outside the sandbox.
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    tcp.set_nonblocking(true).unwrap();
    let tcp_port = tcp.local_addr().unwrap().port();
    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    udp.set_nonblocking(true).unwrap();
    let udp_port = udp.local_addr().unwrap().port();
    let unix_path = env.top.join("test.sock");
    let _unix = UnixListener::bind(&unix_path).unwrap();
    let abstract_name = format!("cairn-escape-{}", std::process::id());
    let _abstract = {
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(&abstract_name).unwrap();
        UnixListener::bind_addr(&addr).unwrap()
    };
    let shadow_has_content = std::fs::metadata("/etc/shadow").is_ok_and(|m| m.len() > 0);

    // (id, argv): each must fail.
    let top = env.top.display().to_string();
    let mut attacks: Vec<(&str, Vec<String>)> =
        vec![
        ("store_write", sh("echo x >> .cairn/cairn.db")),
        ("store_seen", sh("test -e .cairn/cairn.db")),
        ("store_create", sh("echo x > .cairn/evil")),
        ("store_logs", sh("ls .cairn/logs")),
        ("outside_write", sh(&format!("echo x > {top}/beside/outside.txt"))),
        ("outside_read", sh(&format!("cat {top}/secret.txt"))),
        ("usr_write", sh("echo x > /usr/cairn-escape")),
        // Machine-wide settings: writable by uid 0 without any capability
        // unless the sandbox makes them read-only.
        ("sysctl", sh("test -w /proc/sys/kernel/core_pattern")),
        ("sysrq", sh("test -w /proc/sysrq-trigger")),
        ("nested_userns", sh("command -v unshare >/dev/null && unshare -U true")),
        (
            "environ",
            sh("cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' | grep CAIRN_ESCAPE_SECRET"),
        ),
    ];
    if shadow_has_content {
        attacks.push(("shadow", sh("test -s /etc/shadow")));
    }
    if with_python {
        attacks.push(("into_engine", py(INTO_THE_ENGINE)));
        attacks.push((
            "sysctl_open",
            py("import os\nos.open('/proc/sys/kernel/core_pattern', os.O_WRONLY)"),
        ));
        attacks.push((
            "unix_outside",
            py(&connect_unix(&format!(
                "{:?}",
                unix_path.display().to_string()
            ))),
        ));
        attacks.push((
            "unix_abstract",
            py(&connect_unix(&format!("'\\0{abstract_name}'"))),
        ));
        attacks.push(("tcp", py(&connect_tcp(tcp_port))));
        attacks.push(("udp", py(&send_udp(udp_port))));
        if let Some(pg) = &pg {
            attacks.push(("postgres", py(&connect_unix(&format!("{pg:?}")))));
        }
    }
    // Each must work.
    let mut controls: Vec<(&str, Vec<String>)> = vec![
        (
            "write_inside",
            sh("echo ok > inside-$DECLARED.txt && cat inside-$DECLARED.txt"),
        ),
        ("declared_env", sh("test \"$DECLARED\" = yes")),
        ("tmp", sh("echo x > /tmp/x && test -s /tmp/x")),
        (
            "home",
            sh("test \"$HOME\" = /tmp && echo x > \"$HOME/.probe\""),
        ),
        (
            "system",
            sh("ls /usr/bin >/dev/null && cat /etc/passwd >/dev/null"),
        ),
    ];
    if with_python {
        controls.push(("python", py("print(1)")));
        controls.push(("unix_inside", py(UNIX_INSIDE)));
    }

    let mut yaml = String::from("name: escape\nconcurrency: 8\nnodes:\n");
    for kind in ["command", "bash"] {
        for (id, argv) in &attacks {
            yaml.push_str(&node(kind, id, argv, true));
        }
        for (id, argv) in &controls {
            yaml.push_str(&node(kind, id, argv, false));
        }
    }
    let (status, err, events) = env.run(&yaml, "e1");

    let mut problems = Vec::new();
    for prefix in ["c", "b"] {
        for (id, _) in &attacks {
            let n = format!("{prefix}_{id}");
            if ended(&events, &n) != "failed" {
                problems.push(format!(
                    "attack {n} was not refused:\n{}",
                    dump(&events, &n)
                ));
            }
        }
        for (id, _) in &controls {
            let n = format!("{prefix}_{id}");
            if ended(&events, &n) != "finished" {
                problems.push(format!("control {n} did not work:\n{}", dump(&events, &n)));
            }
        }
        if with_python {
            for id in ["tcp", "udp"] {
                let n = format!("{prefix}_{id}");
                let reported = of(&events, &n)
                    .iter()
                    .any(|e| e["type"] == "NetworkAccess" && e["action"] == "blocked");
                if !reported {
                    problems.push(format!(
                        "{n}: no blocked NetworkAccess event:\n{}",
                        dump(&events, &n)
                    ));
                }
            }
        }
    }
    let all = events.iter().map(|e| e.to_string()).collect::<String>();
    if all.contains(&env.secret) {
        problems.push("the engine's secret appears in the run's events".into());
    }
    assert!(
        problems.is_empty(),
        "{}\n(cairn exited {status}: {err})",
        problems.join("\n\n")
    );

    // Nothing reached the host.
    assert!(!env.top.join("beside/outside.txt").exists());
    assert!(!env.root.join(".cairn/evil").exists());
    assert!(!Path::new("/usr/cairn-escape").exists());
    assert_eq!(
        std::fs::read_to_string(env.root.join("inside-yes.txt")).unwrap(),
        "ok\n"
    );
    let mut buf = [0u8; 16];
    assert!(
        udp.recv_from(&mut buf).is_err(),
        "a datagram reached the test's UDP socket"
    );
    assert!(
        tcp.accept().is_err(),
        "a connection reached the test's TCP listener"
    );
    // The store is intact: the run's log reads back whole.
    let last = events.last().unwrap()["type"].as_str().unwrap().to_string();
    assert!(
        last == "RunFinished" || last == "RunFailed",
        "{last}: {err}"
    );
}

#[test]
fn with_the_network_open_the_same_connection_works() {
    if !sandbox_available() || !python() {
        return;
    }
    let env = Env::new();
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = tcp.local_addr().unwrap().port();
    let accepted = std::thread::spawn(move || {
        let mut n = 0;
        tcp.set_nonblocking(false).unwrap();
        for _ in 0..2 {
            if let Ok((mut s, _)) = tcp.accept() {
                let _ = s.write_all(b"hi");
                n += 1;
            }
        }
        n
    });
    let mut yaml = String::from("name: open\nsandbox: { network: true }\nnodes:\n");
    for kind in ["command", "bash"] {
        yaml.push_str(&node(kind, "tcp", &py(&connect_tcp(port)), false));
    }
    let (status, err, events) = env.run(&yaml, "o1");
    assert!(status.success(), "{err}\n{}", dump(&events, "c_tcp"));
    assert_eq!(accepted.join().unwrap(), 2);
}

/// Processes whose argv has an argument equal to `marker`.
fn marked(marker: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(cmd) = std::fs::read(e.path().join("cmdline")) {
            if cmd.split(|b| *b == 0).any(|a| a == marker.as_bytes()) {
                out.push(pid);
            }
        }
    }
    out
}

fn wait_gone(marker: &str, within: Duration) -> Vec<u32> {
    let t0 = Instant::now();
    loop {
        let left = marked(marker);
        if left.is_empty() || t0.elapsed() > within {
            return left;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A node that leaves a `setsid` sleeper and a plain one behind, tagged
/// with `marker`, then sleeps; run again (after `again-<kind>` exists) it
/// ends at once.
fn leaver(kind: &str, marker: &str, timeout: Option<&str>) -> String {
    let script = format!(
        "if [ -f again-{kind} ]; then exit 0; fi; touch again-{kind}; \
         setsid sh -c 'sleep 300; true' {marker} & \
         sh -c 'sleep 300; true' {marker} & \
         sleep 300"
    );
    let mut n = node(kind, "leave", &sh(&script), true);
    if let Some(t) = timeout {
        n.push_str(&format!("    timeout: {t}\n"));
    }
    n
}

#[test]
fn setsid_children_die_with_a_timed_out_node() {
    if !sandbox_available() {
        return;
    }
    let env = Env::new();
    let marker = format!("cairn-escape-timeout-{}", std::process::id());
    let mut yaml = String::from("name: timeouts\nnodes:\n");
    for kind in ["command", "bash"] {
        yaml.push_str(&leaver(kind, &marker, Some("1s")));
    }
    let (_, err, events) = env.run(&yaml, "t1");
    for n in ["c_leave", "b_leave"] {
        assert_eq!(ended(&events, n), "failed", "{err}\n{}", dump(&events, n));
    }
    assert_eq!(
        wait_gone(&marker, Duration::from_secs(5)),
        Vec::<u32>::new()
    );
}

#[test]
fn setsid_children_die_with_a_killed_engine() {
    if !sandbox_available() {
        return;
    }
    let env = Env::new();
    let marker = format!("cairn-escape-kill-{}", std::process::id());
    let mut yaml = String::from("name: killed\nnodes:\n");
    for kind in ["command", "bash"] {
        yaml.push_str(&leaver(kind, &marker, None));
    }
    std::fs::write(env.root.join("killed.yaml"), yaml).unwrap();
    let mut child = env.cairn(&["run", "killed.yaml", "--run-id", "k1"]);
    let t0 = Instant::now();
    // Two nodes, each with two tagged sleepers (and their shells).
    while marked(&marker).len() < 4 {
        assert!(
            t0.elapsed() < PATIENCE,
            "the nodes never started their sleepers"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    child.kill().unwrap(); // SIGKILL: no cleanup by the engine
    wait_exit(&mut child);
    // No resume: the kernel alone must end them.
    assert_eq!(
        wait_gone(&marker, Duration::from_secs(5)),
        Vec::<u32>::new()
    );

    let mut resume = env.cairn(&["resume", "k1"]);
    let status = wait_exit(&mut resume);
    let err = stderr_of(&mut resume);
    assert_eq!(status.code(), Some(0), "{err}");
}

fn error_kind(events: &[Value], node: &str) -> Option<String> {
    of(events, node)
        .iter()
        .rev()
        .find(|e| e["type"] == "NodeFailed")
        .and_then(|e| e["error"]["kind"].as_str().map(str::to_string))
}

/// Node `n` failed with kind `resource_limit`, its message naming the limit.
fn assert_limit_hit(events: &[Value], n: &str, says: &str, stderr: &str) {
    assert_eq!(
        error_kind(events, n).as_deref(),
        Some("resource_limit"),
        "{stderr}\n{}",
        dump(events, n)
    );
    let msg = error_message(events, n);
    assert!(msg.contains(says), "{msg}\n{}", dump(events, n));
}

#[test]
fn resource_limits_fail_the_node_with_resource_limit() {
    if !sandbox_available() || !python() {
        return;
    }
    let env = Env::new();
    let hog = "x = bytearray(512 * 1024 * 1024); print(len(x))";
    let small = "x = bytearray(64 * 1024 * 1024); print(len(x))";
    let mut yaml = String::from("name: limits\nsandbox:\n  limits: { memory: 256MiB }\nnodes:\n");
    for kind in ["command", "bash"] {
        yaml.push_str(&node(kind, "memory", &py(hog), true));
        // Alone: zeroing the hogs' pages takes CPU time of its own.
        yaml.push_str(&node(kind, "cpu", &sh("while :; do :; done"), true));
        yaml.push_str("    sandbox: { limits: { cpu: 1s } }\n");
        yaml.push_str(&node(kind, "small", &py(small), false));
        // The node's own limit replaces the workflow's.
        yaml.push_str(&node(kind, "raised", &py(hog), false));
        yaml.push_str("    sandbox: { limits: { memory: 2GiB } }\n");
    }
    let (_, err, events) = env.run(&yaml, "l1");
    for prefix in ["c", "b"] {
        for (id, says) in [("memory", "memory limit"), ("cpu", "CPU-time limit")] {
            assert_limit_hit(&events, &format!("{prefix}_{id}"), says, &err);
        }
        for id in ["small", "raised"] {
            let n = format!("{prefix}_{id}");
            assert_eq!(ended(&events, &n), "finished", "{}", dump(&events, &n));
        }
    }
}

fn error_message(events: &[Value], node: &str) -> String {
    of(events, node)
        .iter()
        .rev()
        .find(|e| e["type"] == "NodeFailed")
        .and_then(|e| e["error"]["message"].as_str().map(str::to_string))
        .unwrap_or_default()
}

/// Which limits a control group counts here, from what `cairn doctor`
/// says (`memory: cgroup v1, processes: ...`).
fn counted_in_a_group() -> Vec<&'static str> {
    let out = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .arg("doctor")
        .output()
        .expect("run cairn doctor");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.contains("cgroups (tree-wide limits)"))
        .unwrap_or_default()
        .to_string();
    ["memory", "processes", "cpu"]
        .into_iter()
        .filter(|l| line.contains(&format!("{l}: cgroup")))
        .collect()
}

#[test]
fn tree_wide_limits_name_the_limit_and_leave_no_group() {
    if !sandbox_available() || !python() {
        return;
    }
    let counted = counted_in_a_group();
    if counted.is_empty() {
        eprintln!("skipped: no control group counts limits here (see `cairn doctor`)");
        return;
    }
    let env = Env::new();
    let mut yaml = String::from("name: tree\nnodes:\n");
    // Each tree stays under a per-process limit and goes over the tree's.
    let hold =
        |n: u32| format!("python3 -c 'import time; x = b\"{n}\" * (100 << 20); time.sleep(3)'");
    let work = "python3 -c 'import time\nwhile time.process_time() < 0.6: pass'";
    let cases = [
        (
            "processes",
            "processes: 20",
            "for i in $(seq 1 60); do sleep 5 & done; wait".to_string(),
            "process limit (20)",
        ),
        (
            "memory",
            "memory: 160MiB",
            format!(
                "{} & a=$!; {} & b=$!; wait $a; s=$?; wait $b; exit $(( s + $? ))",
                hold(1),
                hold(2)
            ),
            "memory limit",
        ),
        (
            "cpu",
            "cpu: 1s",
            format!("{work} & {work} & {work} & wait"),
            "CPU-time limit (1s)",
        ),
    ];
    for (id, limit, script, _) in &cases {
        if !counted.contains(id) {
            eprintln!("skipped: the {id} limit is not counted in a group here");
            continue;
        }
        for kind in ["command", "bash"] {
            yaml.push_str(&node(kind, id, &sh(script), true));
            yaml.push_str(&format!("    sandbox: {{ limits: {{ {limit} }} }}\n"));
        }
    }
    let (_, err, events) = env.run(&yaml, "t1");
    let engine: u32 = std::fs::read_to_string(env.root.join("engine.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    for (id, _, _, says) in &cases {
        if !counted.contains(id) {
            continue;
        }
        for prefix in ["c", "b"] {
            assert_limit_hit(&events, &format!("{prefix}_{id}"), says, &err);
        }
        let failed = of(&events, &format!("c_{id}"))
            .into_iter()
            .rev()
            .find(|e| e["type"] == "NodeFailed")
            .cloned()
            .unwrap();
        assert_eq!(failed["error"]["details"]["limit"], *id, "{failed}");
    }
    // The engine has ended: none of its groups is left.
    let mine = format!("cairn-sbx-{engine}-");
    for base in cairn_sandbox::cgroup::inspect().bases() {
        let left: Vec<String> = std::fs::read_dir(&base)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(&mine))
            .collect();
        assert!(left.is_empty(), "left in {}: {left:?}", base.display());
    }
}

#[test]
fn opting_out_is_explicit_and_logged() {
    if !sandbox_available() {
        return;
    }
    let env = Env::new();
    // The store is visible only to a node that opts out.
    let yaml = "name: optout\nnodes:\n  - id: confined\n    command: [\"sh\", \"-c\", \"test -e .cairn/cairn.db\"]\n    on_failure: continue\n  - id: open\n    command: [\"sh\", \"-c\", \"test -e .cairn/cairn.db\"]\n    sandbox: { isolation: none }\n  - id: open_bash\n    tool: bash\n    args: { argv: [\"sh\", \"-c\", \"test -e .cairn/cairn.db\"] }\n    sandbox: { isolation: none }\n";
    let (_, err, events) = env.run(yaml, "x1");
    assert_eq!(ended(&events, "confined"), "failed", "{err}");
    for n in ["open", "open_bash"] {
        assert_eq!(ended(&events, n), "finished", "{err}\n{}", dump(&events, n));
        assert!(
            of(&events, n).iter().any(|e| e["type"] == "Diagnostic"
                && e["source"] == "sandbox"
                && e["level"] == "warn"),
            "no Diagnostic for the opt-out of {n}:\n{}",
            dump(&events, n)
        );
    }
    assert!(!of(&events, "confined")
        .iter()
        .any(|e| e["type"] == "Diagnostic"));
}

/// A tiny HTTP server on the host: answers every request with `hello`.
fn http_server() -> (u16, std::thread::JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let h = std::thread::spawn(move || {
        for s in l.incoming().take(4) {
            let Ok(mut s) = s else { continue };
            let mut buf = [0u8; 4096];
            let mut got = Vec::new();
            while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
            let _ = s.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
            );
        }
    });
    (port, h)
}

#[test]
fn a_host_list_lets_through_its_hosts_only_via_the_proxy() {
    if !sandbox_available() || !python() {
        return;
    }
    let env = Env::new();
    let (port, _server) = http_server();
    let other = TcpListener::bind("127.0.0.1:0").unwrap();
    let other_port = other.local_addr().unwrap().port();
    let get = |p: u16| {
        format!("import urllib.request, sys\ntry:\n    print(urllib.request.urlopen('http://127.0.0.1:{p}/x', timeout=10).read().decode())\nexcept Exception as e:\n    print(e, file=sys.stderr); sys.exit(1)")
    };
    let tunnel = format!(
        "import http.client, os\nc = http.client.HTTPConnection('127.0.0.1', 3128, timeout=10)\nc.set_tunnel('127.0.0.1', {port})\nc.request('GET', '/t')\nprint(c.getresponse().read().decode())"
    );
    let mut yaml = format!("name: hosts\nsandbox: {{ network: [\"127.0.0.1:{port}\"] }}\nnodes:\n");
    for kind in ["command", "bash"] {
        yaml.push_str(&node(kind, "allowed", &py(&get(port)), false));
        yaml.push_str(&node(kind, "tunnel", &py(&tunnel), false));
        yaml.push_str(&node(kind, "blocked", &py(&get(other_port)), true));
        yaml.push_str(&node(kind, "direct", &py(&connect_tcp(port)), true));
    }
    let (_, err, events) = env.run(&yaml, "h1");
    for prefix in ["c", "b"] {
        for id in ["allowed", "tunnel"] {
            let n = format!("{prefix}_{id}");
            assert_eq!(
                ended(&events, &n),
                "finished",
                "{err}\n{}",
                dump(&events, &n)
            );
            assert!(
                of(&events, &n).iter().any(|e| e["type"] == "NetworkAccess"
                    && e["action"] == "allowed"
                    && e["target"] == format!("127.0.0.1:{port}")),
                "{}",
                dump(&events, &n)
            );
            assert!(dump(&events, &n).contains("hello"), "{}", dump(&events, &n));
        }
        let n = format!("{prefix}_blocked");
        assert_eq!(ended(&events, &n), "failed", "{}", dump(&events, &n));
        assert!(
            of(&events, &n).iter().any(|e| e["type"] == "NetworkAccess"
                && e["action"] == "blocked"
                && e["target"] == format!("127.0.0.1:{other_port}")),
            "{}",
            dump(&events, &n)
        );
        let n = format!("{prefix}_direct");
        assert_eq!(ended(&events, &n), "failed", "{}", dump(&events, &n));
    }
    other.set_nonblocking(true).unwrap();
    assert!(
        other.accept().is_err(),
        "a blocked connection reached its host"
    );
}

/// Runs `script` (with `$CAIRN` the binary) in a user namespace of its own
/// where no further user namespace may be created: a machine without
/// unprivileged user namespaces, as far as Cairn can tell.
fn without_user_namespaces(dir: &Path, script: &str) -> Option<std::process::Output> {
    let out = Command::new("unshare")
        .args(["-Ur", "sh", "-c"])
        .arg(format!(
            "echo 0 > /proc/sys/user/max_user_namespaces || exit 97; {script}"
        ))
        .current_dir(dir)
        .env("CAIRN", env!("CARGO_BIN_EXE_cairn"))
        .env_remove("CAIRN_STORE")
        .env_remove("CAIRN_LOG_DIR")
        .output();
    match out {
        Ok(o) if o.status.code() != Some(97) => Some(o),
        _ => {
            eprintln!("skipped: cannot simulate a machine without user namespaces (no `unshare`, or user.max_user_namespaces not writable)");
            None
        }
    }
}

#[test]
fn without_user_namespaces_processes_are_refused_with_the_way_out() {
    if !sandbox_available() {
        return;
    }
    let env = Env::new();
    std::fs::write(
        env.root.join("r.yaml"),
        "name: refused\nnodes:\n  - id: c\n    command: [\"sh\", \"-c\", \"echo ran > ran-c.txt\"]\n    on_failure: continue\n  - id: b\n    tool: bash\n    args: { argv: [\"sh\", \"-c\", \"echo ran > ran-b.txt\"] }\n    on_failure: continue\n  - id: out\n    command: [\"sh\", \"-c\", \"echo ran > ran-out.txt\"]\n    sandbox: { isolation: none }\n",
    )
    .unwrap();
    let Some(doctor) = without_user_namespaces(&env.root, "\"$CAIRN\" doctor") else {
        return;
    };
    assert_eq!(doctor.status.code(), Some(1));
    let text = String::from_utf8_lossy(&doctor.stdout);
    assert!(text.contains("FAIL user namespace"), "{text}");
    assert!(text.contains("isolation: none"), "{text}");

    let run = without_user_namespaces(
        &env.root,
        "\"$CAIRN\" run r.yaml --run-id r1 --store .cairn/cairn.db",
    )
    .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    let events = env.events("r1");
    for n in ["c", "b"] {
        let failed = of(&events, n)
            .into_iter()
            .find(|e| e["type"] == "NodeFailed")
            .unwrap_or_else(|| panic!("{n} was not refused: {stderr}\n{}", dump(&events, n)));
        let msg = failed["error"]["message"].as_str().unwrap();
        assert!(
            msg.contains("unshare (user and PID namespaces) failed"),
            "{msg}"
        );
        assert!(msg.contains("isolation: none"), "{msg}");
        assert!(
            !env.root.join(format!("ran-{n}.txt")).exists(),
            "{n} ran unconfined"
        );
    }
    assert_eq!(
        of(&events, "c")
            .iter()
            .find(|e| e["type"] == "NodeFailed")
            .unwrap()["error"]["kind"],
        "sandbox"
    );
    // The explicit opt-out still runs.
    assert_eq!(ended(&events, "out"), "finished", "{stderr}");
    assert!(env.root.join("ran-out.txt").exists());
}
