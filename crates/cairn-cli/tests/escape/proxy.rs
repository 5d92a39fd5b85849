//! The filtering proxy judged by name alone: a name in the host list that
//! resolves to the machine (`localhost`), and a `Host` header naming
//! another virtual host than the target the proxy allowed. The proxy must
//! refuse the first (a loopback address the list does not name literally,
//! for that port) and send the second upstream with the allowed target's
//! `Host`.

use std::io::{Read, Write};
use std::net::TcpListener;

use super::{dump, ended, node, of, py, python, sandbox_available, Env};

/// An HTTP server on the host that answers each request with the head it
/// received, and counts the requests it saw.
fn echo_server() -> (
    u16,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
    std::thread::JoinHandle<()>,
) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let seen = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = seen.clone();
    let h = std::thread::spawn(move || {
        for s in l.incoming().take(8) {
            let Ok(mut s) = s else { continue };
            let mut buf = [0u8; 4096];
            let mut got = Vec::new();
            while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                got.len()
            );
            let _ = s.write_all(head.as_bytes());
            let _ = s.write_all(&got);
        }
    });
    (port, seen, h)
}

/// Python that sends `GET http://<target>/h` through the sandbox's proxy
/// with `Host: <host>` and prints the answer's body; exits 1 on a refusal.
fn get_via_proxy(target: &str, host: &str) -> String {
    format!(
        "import http.client, sys\nc = http.client.HTTPConnection('127.0.0.1', 3128, timeout=10)\nc.putrequest('GET', 'http://{target}/h', skip_host=True)\nc.putheader('Host', '{host}')\nc.endheaders()\nr = c.getresponse()\nbody = r.read().decode()\nprint(body)\nsys.exit(0 if r.status == 200 else 1)"
    )
}

#[test]
fn the_proxy_judges_addresses_and_sends_the_host_it_allowed() {
    if !sandbox_available() || !python() {
        return;
    }
    let env = Env::new();
    // The server reached by name, and the one listed by address (a port
    // of its own, so that the literal entry does not also admit the name).
    let (by_name, seen, _a) = echo_server();
    let (port, seen_literal, _b) = echo_server();
    let mut yaml = format!(
        "name: proxy-walls\nsandbox: {{ network: [\"localhost:{by_name}\", \"127.0.0.1:{port}\"] }}\nnodes:\n"
    );
    for kind in ["command", "bash"] {
        yaml.push_str(&node(
            kind,
            "by_name",
            &py(&get_via_proxy(&format!("localhost:{by_name}"), "localhost")),
            true,
        ));
        yaml.push_str(&node(
            kind,
            "host_swap",
            &py(&get_via_proxy(
                &format!("127.0.0.1:{port}"),
                "metadata.google.internal",
            )),
            false,
        ));
    }
    let (_, err, events) = env.run(&yaml, "p1");
    for prefix in ["c", "b"] {
        let n = format!("{prefix}_by_name");
        assert_eq!(ended(&events, &n), "failed", "{err}\n{}", dump(&events, &n));
        assert!(
            of(&events, &n).iter().any(|e| e["type"] == "NetworkAccess"
                && e["action"] == "blocked"
                && e["target"] == format!("localhost:{by_name}")
                && e["reason"].as_str().is_some_and(|r| r.contains("loopback"))),
            "{}",
            dump(&events, &n)
        );

        let n = format!("{prefix}_host_swap");
        assert_eq!(
            ended(&events, &n),
            "finished",
            "{err}\n{}",
            dump(&events, &n)
        );
        let out = dump(&events, &n);
        assert!(out.contains(&format!("Host: 127.0.0.1:{port}")), "{out}");
        assert!(!out.contains("Host: metadata"), "{out}");
    }
    // Nothing reached the server by its name; both allowed requests
    // reached the other.
    assert_eq!(seen.load(std::sync::atomic::Ordering::SeqCst), 0);
    assert_eq!(seen_literal.load(std::sync::atomic::Ordering::SeqCst), 2);
}
