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

async fn python(script: &str, network: NetworkPolicy) -> cairn_tools::ProcessOutcome {
    let mut spec = ProcessSpec::new(argv(&["python3", "-c", script]), std::env::temp_dir());
    spec.network = network;
    spec.timeout = Some(Duration::from_secs(30));
    run_process(spec, &Recorder::default(), CancellationToken::new())
        .await
        .unwrap()
}

#[tokio::test]
async fn tcp_connect_is_refused_while_shut_and_reaches_the_listener_while_allowed() {
    let (l, port) = listener();
    let denied = python(&connect_script(port), NetworkPolicy::Deny).await;
    assert_ne!(denied.exit_code, Some(0));
    assert!(
        denied.stderr.contains("PermissionError"),
        "{}",
        denied.stderr
    );
    assert!(l.accept().is_err(), "nothing may have reached the listener");

    let allowed = python(&connect_script(port), NetworkPolicy::Allow).await;
    assert_eq!(allowed.exit_code, Some(0), "{}", allowed.stderr);
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
    let out = python(script, NetworkPolicy::Deny).await;
    assert_eq!(out.exit_code, Some(0), "{}", out.stderr);
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
}
