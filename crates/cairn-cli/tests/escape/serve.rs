//! Starving `cairn serve` from outside, without a token: clients that send
//! a request's headers at once and then trickle its body a byte at a time
//! would hold every connection place for as long as they like. The real
//! binary must keep answering another client (another source address)
//! while they try, refuse a client's connections over its own cap, and cut
//! the trickling ones once their body deadline passes.

use std::net::{IpAddr, SocketAddr};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// `cairn serve` on a free port of 127.0.0.1 with a small cap, a smaller
/// per-client cap and a short body deadline.
struct Serve {
    child: Child,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve() -> Serve {
    let dir = tempfile::tempdir().unwrap();
    let port = super::free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .current_dir(dir.path())
        .args(["--store", "cairn.db", "serve", "--addr"])
        .arg(format!("127.0.0.1:{port}"))
        .args([
            "--max-connections",
            "8",
            "--max-connections-per-client",
            "4",
        ])
        .args(["--body-timeout", "10s", "--header-timeout", "30s"])
        .env_remove("CAIRN_TOKEN")
        .env_remove("CAIRN_STORE")
        .env_remove("CAIRN_LOG_DIR")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn cairn serve");
    Serve {
        child,
        addr: SocketAddr::from(([127, 0, 0, 1], port)),
        _dir: dir,
    }
}

/// A connection to `to` from the source address `from`.
async fn connect_from(from: IpAddr, to: SocketAddr) -> std::io::Result<TcpStream> {
    let s = TcpSocket::new_v4()?;
    s.bind(SocketAddr::new(from, 0))?;
    s.connect(to).await
}

/// Everything the server sends until it closes (or 60 s pass, so a broken
/// server fails the test instead of hanging it).
async fn read_all(s: &mut TcpStream) -> String {
    let mut got = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(60), s.read_to_end(&mut got)).await;
    String::from_utf8_lossy(&got).into_owned()
}

/// Sends `request` on a fresh connection from `from` and returns the answer.
async fn ask(from: IpAddr, to: SocketAddr, request: &str) -> String {
    let mut s = connect_from(from, to).await.expect("connect");
    s.write_all(request.as_bytes()).await.expect("send");
    read_all(&mut s).await
}

fn healthz(addr: SocketAddr) -> String {
    format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")
}

/// One trickling client: the headers of a 1,000-byte `POST /v1/runs`, then
/// a byte every 200 ms until the server closes the connection. `open` is
/// cleared then; returns what the server said.
async fn trickle(mut s: TcpStream, addr: SocketAddr, open: Arc<AtomicBool>) -> String {
    let head = format!(
        "POST /v1/runs HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{"
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let (mut rd, mut wr) = s.into_split();
    let reader = tokio::spawn(async move {
        let mut got = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(120), rd.read_to_end(&mut got)).await;
        String::from_utf8_lossy(&got).into_owned()
    });
    while !reader.is_finished() {
        if wr.write_all(b" ").await.is_err() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let said = reader.await.unwrap();
    open.store(false, Ordering::SeqCst);
    said
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trickling_clients_cannot_starve_the_server() {
    let srv = serve();
    let addr = srv.addr;
    let local: IpAddr = "127.0.0.1".parse().unwrap();
    let other: IpAddr = "127.0.0.2".parse().unwrap();
    // Readiness is probed from the other address, so that no probe of the
    // server's counts among the trickling address's connections.
    let mut up = false;
    for _ in 0..600 {
        if let Ok(mut s) = connect_from(other, addr).await {
            if s.write_all(healthz(addr).as_bytes()).await.is_ok()
                && read_all(&mut s).await.starts_with("HTTP/1.1 200")
            {
                up = true;
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(up, "cairn serve did not answer within a minute");

    // Eight trickling clients from one address: four get places (its
    // cap), the others are refused.
    let mut trickling = Vec::new();
    for _ in 0..8 {
        let s = connect_from(local, addr).await.unwrap();
        let open = Arc::new(AtomicBool::new(true));
        let task = tokio::spawn(trickle(s, addr, open.clone()));
        trickling.push((open, task));
    }

    // Another client is answered while they hold their places: /healthz,
    // and a request with a body.
    let health = ask(other, addr, &healthz(addr)).await;
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    let body = r#"{"workflow":"none"}"#;
    let post = format!(
        "POST /v1/runs HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let answer = ask(other, addr, &post).await;
    assert!(
        answer.starts_with("HTTP/1.1 4") && answer.contains("workflows"),
        "{answer}"
    );
    // The server accepts in order: the eight came before the other
    // client, so four hold their places now and one more from their
    // address is told so before it says anything.
    let mut ninth = connect_from(local, addr).await.unwrap();
    let told = read_all(&mut ninth).await;
    assert!(told.starts_with("HTTP/1.1 429"), "{told}");
    assert!(told.contains("too_many_connections"), "{told}");
    let still_open = trickling
        .iter()
        .filter(|(o, _)| o.load(Ordering::SeqCst))
        .count();
    assert!(
        still_open > 0,
        "the other client was answered while the trickling ones held the cap"
    );

    // Each admitted trickling client is cut at its body deadline, with the
    // reason; the others were refused (429, or a reset that lost it).
    let mut cut = 0;
    for (open, task) in trickling {
        let said = task.await.unwrap();
        assert!(!open.load(Ordering::SeqCst));
        if said.starts_with("HTTP/1.1 408") {
            assert!(said.contains("body_timeout"), "{said}");
            cut += 1;
        } else {
            assert!(
                said.is_empty() || said.starts_with("HTTP/1.1 429"),
                "{said}"
            );
        }
    }
    assert_eq!(cut, 4, "the per-client cap admits four");
    // Their places are given back.
    let mut again = String::new();
    for _ in 0..100 {
        again = ask(local, addr, &healthz(addr)).await;
        if again.starts_with("HTTP/1.1 200") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(again.starts_with("HTTP/1.1 200"), "{again}");
}
