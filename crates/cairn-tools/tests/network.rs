//! Network policy against a real listener on 127.0.0.1.

mod common;

use std::net::TcpListener;
use std::time::Duration;

use cairn_tools::{
    run_process, NetworkAction, NetworkPolicy, ProcessSpec, Sandbox, ToolContext, ToolError,
    ToolRegistry,
};
use common::{argv, Recorder};
use serde_json::json;
use tokio_util::sync::CancellationToken;

fn connect_script(port: u16) -> String {
    format!(
        "import socket; s = socket.create_connection(('127.0.0.1', {port}), timeout=5); s.sendall(b'hi'); s.close(); print('connected')"
    )
}

fn listener() -> (TcpListener, u16) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.set_nonblocking(true).unwrap();
    let port = l.local_addr().unwrap().port();
    (l, port)
}

/// Runs a script and returns what the observer heard about refusals too.
async fn python_seen(
    script: &str,
    network: NetworkPolicy,
) -> (cairn_tools::ProcessOutcome, Vec<(String, String)>) {
    run_seen(argv(&["python3", "-c", script]), network).await
}

async fn run_seen(
    argv: Vec<String>,
    network: NetworkPolicy,
) -> (cairn_tools::ProcessOutcome, Vec<(String, String)>) {
    let mut spec = ProcessSpec::new(argv, std::env::temp_dir());
    spec.network = network;
    spec.timeout = Some(Duration::from_secs(30));
    let rec = Recorder::default();
    let out = run_process(spec, &rec, CancellationToken::new())
        .await
        .unwrap();
    let refused = rec.refused.lock().unwrap().clone();
    (out, refused)
}

#[tokio::test]
async fn tcp_connect_is_refused_while_shut_and_reaches_the_listener_while_allowed() {
    let (l, port) = listener();
    let (denied, refused) = python_seen(&connect_script(port), NetworkPolicy::Deny).await;
    assert_ne!(denied.exit_code, Some(0));
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(refused[0].0, "socket(AF_INET, SOCK_STREAM)");
    assert!(refused[0].1.contains("network is shut"), "{}", refused[0].1);
    assert!(refused[0].1.contains("python3"), "{}", refused[0].1);
    assert!(
        denied.stderr.contains("PermissionError"),
        "{}",
        denied.stderr
    );
    assert!(l.accept().is_err(), "nothing may have reached the listener");

    let (allowed, refused) = python_seen(&connect_script(port), NetworkPolicy::Allow).await;
    assert_eq!(allowed.exit_code, Some(0), "{}", allowed.stderr);
    assert!(refused.is_empty(), "{refused:?}");
    assert_eq!(allowed.stdout, "connected\n");
    let (mut conn, _) = l.accept().expect("the allowed child reached the listener");
    conn.set_nonblocking(false).unwrap();
    let mut buf = Vec::new();
    std::io::Read::read_to_end(&mut conn, &mut buf).unwrap();
    assert_eq!(buf, b"hi");
}

#[tokio::test]
async fn udp_ipv6_and_raw_sockets_are_refused_but_unix_sockets_work() {
    let script = r#"
import socket
for fam, kind in [(socket.AF_INET, socket.SOCK_DGRAM), (socket.AF_INET6, socket.SOCK_STREAM),
                  (socket.AF_PACKET, socket.SOCK_RAW), (socket.AF_NETLINK, socket.SOCK_RAW)]:
    try:
        socket.socket(fam, kind)
        print('opened', fam)
    except OSError as e:
        print('refused', fam, e.errno)
a, b = socket.socketpair(socket.AF_UNIX)
a.sendall(b'x')
print('unix', b.recv(1))
"#;
    let (out, reported) = python_seen(script, NetworkPolicy::Deny).await;
    assert_eq!(out.exit_code, Some(0), "{}", out.stderr);
    let targets: Vec<&str> = reported.iter().map(|r| r.0.as_str()).collect();
    assert_eq!(
        targets,
        [
            "socket(AF_INET, SOCK_DGRAM)",
            "socket(AF_INET6, SOCK_STREAM)",
            "socket(AF_PACKET, SOCK_RAW)",
            "socket(AF_NETLINK, SOCK_RAW)",
        ],
        "the AF_UNIX socketpair is not a refusal"
    );
    let refused = out
        .stdout
        .lines()
        .filter(|l| l.starts_with("refused"))
        .count();
    assert_eq!(refused, 4, "{}", out.stdout);
    assert!(
        out.stdout.lines().all(|l| !l.starts_with("opened")),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout
            .lines()
            .all(|l| !l.starts_with("refused") || l.ends_with(" 13")),
        "EACCES expected: {}",
        out.stdout
    );
    assert!(out.stdout.contains("unix b'x'"), "{}", out.stdout);
}

#[tokio::test]
async fn bash_tool_cheap_refusal_emits_blocked_and_kernel_refusal_fails_the_call() {
    let dir = tempfile::tempdir().unwrap();
    let sandbox = Sandbox::new(dir.path()).unwrap();
    let rec = Recorder::default();
    let reg = ToolRegistry::builtin();
    let ctx = ToolContext::new(
        &sandbox,
        "run1",
        "net",
        0,
        1,
        1,
        &rec,
        CancellationToken::new(),
    );

    let err = reg
        .call(
            "bash",
            json!({"argv": ["curl", "https://example.org/x"]}),
            &ctx,
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind(), "network_refused");
    let events = rec.network.lock().unwrap().clone();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].0, NetworkAction::Blocked);
    assert_eq!(events[0].1, "https://example.org/x");
    assert!(events[0].2.contains("curl"), "{}", events[0].2);

    let err = reg
        .call("bash", json!({"argv": ["git", "push", "origin"]}), &ctx)
        .await
        .unwrap_err();
    assert!(matches!(err, ToolError::NetworkRefused { .. }), "{err}");
    assert_eq!(rec.network.lock().unwrap().len(), 2);

    // Nothing in this argv looks like the network: the kernel refuses it.
    let (l, port) = listener();
    let err = reg
        .call(
            "bash",
            json!({"argv": ["python3", "-c", connect_script(port)]}),
            &ctx,
        )
        .await
        .unwrap_err();
    match &err {
        ToolError::Exit { code, stderr, .. } => {
            assert_eq!(*code, Some(1));
            assert!(stderr.contains("Permission denied"), "{stderr}");
        }
        other => panic!("expected an exit error, got {other}"),
    }
    assert!(l.accept().is_err());
    // ... and the refusal is reported like the cheap ones.
    let events = rec.network.lock().unwrap().clone();
    assert_eq!(events.len(), 3, "{events:?}");
    assert_eq!(events[2].0, NetworkAction::Blocked);
    assert_eq!(events[2].1, "socket(AF_INET, SOCK_STREAM)");
    assert!(events[2].2.contains("seccomp"), "{}", events[2].2);

    // Allowed: the same call reaches the listener.
    let open = Sandbox::new(dir.path())
        .unwrap()
        .with_network(NetworkPolicy::Allow);
    let ctx = ToolContext::new(
        &open,
        "run1",
        "net",
        0,
        1,
        2,
        &rec,
        CancellationToken::new(),
    );
    let out = reg
        .call(
            "bash",
            json!({"argv": ["python3", "-c", connect_script(port)]}),
            &ctx,
        )
        .await
        .unwrap();
    assert_eq!(out["stdout"], "connected\n");
    assert!(l.accept().is_ok());
    assert_eq!(
        rec.network.lock().unwrap().len(),
        3,
        "an allowed connection is not a refusal"
    );
}

#[tokio::test]
async fn refusals_in_grandchildren_are_reported_to_the_same_run() {
    let (l, port) = listener();
    // The shell forks python twice in the background; both inherit the filter.
    let script = connect_script(port);
    let cmd = format!(
        "python3 -c \"{s}\" & python3 -c \"{s}\" & wait; echo done",
        s = script
    );
    let (out, refused) = run_seen(argv(&["sh", "-c", &cmd]), NetworkPolicy::Deny).await;
    assert_eq!(out.exit_code, Some(0), "{}", out.stderr);
    assert_eq!(out.stdout, "done\n");
    assert_eq!(
        out.stderr.matches("PermissionError").count(),
        2,
        "{}",
        out.stderr
    );
    assert_eq!(refused.len(), 2, "{refused:?}");
    assert!(refused
        .iter()
        .all(|r| r.0 == "socket(AF_INET, SOCK_STREAM)"));
    assert!(l.accept().is_err());
}

#[tokio::test]
async fn a_socket_loop_is_refused_every_time_but_reported_at_most_100_times() {
    let script = r#"
import socket
n = 0
for _ in range(150):
    try:
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    except PermissionError:
        n += 1
print(n)
"#;
    let (out, refused) = python_seen(script, NetworkPolicy::Deny).await;
    assert_eq!(out.stdout, "150\n", "{}", out.stderr);
    assert_eq!(refused.len(), 100);
    assert!(refused[99].1.contains("not reported"), "{}", refused[99].1);
}
