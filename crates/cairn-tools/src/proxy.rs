//! The filtering proxy behind `network: [hosts]`.
//!
//! A confined process with a host list gets a network namespace with only
//! loopback, where its PID 1 listens on `127.0.0.1:3128` and hands the
//! listening socket to the engine ([`cairn_sandbox::Network::Proxy`]). The
//! engine accepts on it (the socket lives in the sandbox's namespace, the
//! accepting task in the engine's) and forwards what the rules allow:
//! `CONNECT host:port` (HTTPS and any TCP) and plain HTTP requests in
//! absolute form (`GET http://host/path`). Each connection is one
//! `NetworkAccess` event, allowed or blocked, with `host:port`. The process
//! finds the proxy through `HTTP_PROXY`/`HTTPS_PROXY`; nothing else is
//! reachable from its namespace.

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

/// Largest request head the proxy reads before refusing the connection.
const MAX_HEAD: usize = 16 * 1024;
/// How long a client may take to send its request head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(30);
/// How long connecting upstream may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// Connections reported per process; past this they are still judged.
const MAX_REPORTS: usize = 1000;

/// One rule of a host list: a host glob (`*` matches any run of
/// characters) and an optional port.
#[derive(Debug, Clone, PartialEq, Eq)]
struct HostRule {
    pattern: String,
    port: Option<u16>,
}

/// The hosts a sandbox may reach through the proxy: `pypi.org` (any port),
/// `*.github.com:443`, `10.0.0.5:8080`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HostRules {
    rules: Vec<HostRule>,
}

impl HostRules {
    /// Parses a workflow's host list; the error names the bad entry.
    pub fn parse(items: &[String]) -> Result<HostRules, String> {
        let mut rules = Vec::new();
        for item in items {
            let t = item.trim().to_ascii_lowercase();
            let (host, port) = match t.rsplit_once(':') {
                Some((h, p)) if !h.contains(':') || h.ends_with(']') => {
                    let port = p
                        .parse::<u16>()
                        .map_err(|_| format!("`{item}`: `{p}` is not a port"))?;
                    (h.to_string(), Some(port))
                }
                _ => (t.clone(), None),
            };
            let host = host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string();
            if host.is_empty() || host.chars().any(|c| c.is_whitespace() || c == '/') {
                return Err(format!("`{item}` is not a host name or pattern"));
            }
            rules.push(HostRule {
                pattern: host,
                port,
            });
        }
        Ok(HostRules { rules })
    }

    /// Whether `host:port` matches a rule.
    pub fn allows(&self, host: &str, port: u16) -> bool {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        self.rules.iter().any(|r| {
            r.port.is_none_or(|p| p == port) && glob(r.pattern.as_bytes(), host.as_bytes())
        })
    }
}

/// `*` matches any run of characters (dots included); everything else
/// matches itself.
fn glob(p: &[u8], s: &[u8]) -> bool {
    match p.split_first() {
        None => s.is_empty(),
        Some((b'*', rest)) => (0..=s.len()).any(|i| glob(rest, &s[i..])),
        Some((c, rest)) => s.first() == Some(c) && glob(rest, &s[1..]),
    }
}

/// One connection the proxy judged.
#[derive(Debug, Clone)]
pub(crate) struct ProxyEvent {
    pub(crate) allowed: bool,
    pub(crate) target: String,
    pub(crate) reason: String,
}

/// Accepts on `listener` until the returned set is dropped (which ends the
/// accept loop and every connection).
pub(crate) fn serve(
    listener: OwnedFd,
    rules: Arc<HostRules>,
    tx: mpsc::UnboundedSender<ProxyEvent>,
) -> std::io::Result<JoinSet<()>> {
    let std_listener = std::net::TcpListener::from(listener);
    std_listener.set_nonblocking(true)?;
    let listener = TcpListener::from_std(std_listener)?;
    let mut set = JoinSet::new();
    set.spawn(async move {
        let mut conns = JoinSet::new();
        let reported = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        loop {
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((client, _)) => {
                        conns.spawn(handle(client, rules.clone(), tx.clone(), reported.clone()));
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                },
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
            }
        }
    });
    Ok(set)
}

/// What a client asked for.
struct Request {
    host: String,
    port: u16,
    /// `None` for CONNECT; else the head to send upstream (origin form).
    forward_head: Option<Vec<u8>>,
}

async fn handle(
    mut client: TcpStream,
    rules: Arc<HostRules>,
    tx: mpsc::UnboundedSender<ProxyEvent>,
    reported: Arc<std::sync::atomic::AtomicUsize>,
) {
    let report = |allowed: bool, target: String, reason: String| {
        if reported.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < MAX_REPORTS {
            let _ = tx.send(ProxyEvent {
                allowed,
                target,
                reason,
            });
        }
    };
    let Ok(Ok((head, rest))) = tokio::time::timeout(HEAD_TIMEOUT, read_head(&mut client)).await
    else {
        let _ = reply(
            &mut client,
            "400 Bad Request",
            "cannot read the request head",
        )
        .await;
        return;
    };
    let req = match parse_head(&head) {
        Ok(r) => r,
        Err(msg) => {
            let _ = reply(&mut client, "400 Bad Request", &msg).await;
            return;
        }
    };
    let target = format!("{}:{}", req.host, req.port);
    if !rules.allows(&req.host, req.port) {
        report(
            false,
            target.clone(),
            "not in the workflow's network list".into(),
        );
        let _ = reply(
            &mut client,
            "403 Forbidden",
            &format!("{target} is not in the workflow's network list"),
        )
        .await;
        return;
    }
    let upstream = tokio::time::timeout(
        CONNECT_TIMEOUT,
        TcpStream::connect((req.host.as_str(), req.port)),
    )
    .await;
    let mut upstream = match upstream {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            report(
                true,
                target.clone(),
                format!("in the network list; connecting failed: {e}"),
            );
            let _ = reply(
                &mut client,
                "502 Bad Gateway",
                &format!("cannot reach {target}: {e}"),
            )
            .await;
            return;
        }
        Err(_) => {
            report(
                true,
                target.clone(),
                "in the network list; connecting timed out".into(),
            );
            let _ = reply(
                &mut client,
                "504 Gateway Timeout",
                &format!("{target} did not answer"),
            )
            .await;
            return;
        }
    };
    report(true, target, "in the workflow's network list".into());
    let sent = match &req.forward_head {
        None => {
            client
                .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                .await
        }
        Some(h) => upstream.write_all(h).await,
    };
    if sent.is_err() || upstream.write_all(&rest).await.is_err() {
        return;
    }
    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
}

/// Reads until the end of the head; returns it and any bytes after it.
async fn read_head(client: &mut TcpStream) -> std::io::Result<(Vec<u8>, Vec<u8>)> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 2048];
    loop {
        let n = client.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buf.split_off(end + 4);
            return Ok((buf, rest));
        }
        if buf.len() > MAX_HEAD {
            return Err(std::io::ErrorKind::InvalidData.into());
        }
    }
}

fn parse_head(head: &[u8]) -> Result<Request, String> {
    let text =
        std::str::from_utf8(head).map_err(|_| "the request head is not UTF-8".to_string())?;
    let mut lines = text.split("\r\n");
    let first = lines.next().unwrap_or_default();
    let mut parts = first.split(' ');
    let (Some(method), Some(target), Some(version)) = (parts.next(), parts.next(), parts.next())
    else {
        return Err(format!("malformed request line `{first}`"));
    };
    if method.eq_ignore_ascii_case("CONNECT") {
        let (host, port) = split_host_port(target, 443)?;
        return Ok(Request {
            host,
            port,
            forward_head: None,
        });
    }
    let Some(after) = target
        .strip_prefix("http://")
        .or_else(|| target.strip_prefix("HTTP://"))
    else {
        return Err(format!(
            "`{target}`: the proxy takes CONNECT or absolute http:// requests"
        ));
    };
    let (authority, path) = match after.find('/') {
        Some(i) => (&after[..i], &after[i..]),
        None => (after, "/"),
    };
    let (host, port) = split_host_port(authority, 80)?;
    let mut out = format!("{method} {path} {version}\r\n");
    for line in lines {
        let lower = line.to_ascii_lowercase();
        if lower.starts_with("proxy-connection:") || lower.starts_with("proxy-authorization:") {
            continue;
        }
        out.push_str(line);
        out.push_str("\r\n");
    }
    // `lines` ended with the two empty strings of the final CRLFCRLF; the
    // loop wrote one CRLF for each, which ends the head.
    while out.ends_with("\r\n\r\n\r\n") {
        out.truncate(out.len() - 2);
    }
    Ok(Request {
        host,
        port,
        forward_head: Some(out.into_bytes()),
    })
}

fn split_host_port(authority: &str, default_port: u16) -> Result<(String, u16), String> {
    let authority = authority.rsplit_once('@').map_or(authority, |(_, a)| a);
    if let Some(rest) = authority.strip_prefix('[') {
        let (host, tail) = rest
            .split_once(']')
            .ok_or_else(|| format!("`{authority}` is not a host"))?;
        let port = match tail.strip_prefix(':') {
            Some(p) => p.parse().map_err(|_| format!("`{p}` is not a port"))?,
            None => default_port,
        };
        return Ok((host.to_ascii_lowercase(), port));
    }
    match authority.rsplit_once(':') {
        Some((h, p)) => Ok((
            h.to_ascii_lowercase(),
            p.parse().map_err(|_| format!("`{p}` is not a port"))?,
        )),
        None if authority.is_empty() => Err("the request names no host".into()),
        None => Ok((authority.to_ascii_lowercase(), default_port)),
    }
}

async fn reply(client: &mut TcpStream, status: &str, message: &str) -> std::io::Result<()> {
    let body = format!("cairn proxy: {message}\n");
    let resp = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    client.write_all(resp.as_bytes()).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_match_hosts_and_ports() {
        let r = HostRules::parse(&[
            "pypi.org".into(),
            "*.github.com:443".into(),
            "127.0.0.1:8080".into(),
        ])
        .unwrap();
        assert!(r.allows("pypi.org", 443));
        assert!(r.allows("PyPI.org.", 80));
        assert!(r.allows("api.github.com", 443));
        assert!(!r.allows("api.github.com", 80));
        assert!(!r.allows("github.com", 443));
        assert!(!r.allows("evil.com", 443));
        assert!(r.allows("127.0.0.1", 8080));
        assert!(!r.allows("127.0.0.1", 8081));
        assert!(HostRules::parse(&["a.com:http".into()]).is_err());
        assert!(HostRules::parse(&["".into()]).is_err());
    }

    #[test]
    fn heads_become_origin_form() {
        let r = parse_head(b"GET http://example.org:8080/a?b HTTP/1.1\r\nHost: example.org\r\nProxy-Connection: keep-alive\r\n\r\n").unwrap();
        assert_eq!((r.host.as_str(), r.port), ("example.org", 8080));
        assert_eq!(
            String::from_utf8(r.forward_head.unwrap()).unwrap(),
            "GET /a?b HTTP/1.1\r\nHost: example.org\r\n\r\n"
        );
        let c = parse_head(b"CONNECT pypi.org:443 HTTP/1.1\r\n\r\n").unwrap();
        assert_eq!(
            (c.host.as_str(), c.port, c.forward_head),
            ("pypi.org", 443, None)
        );
        assert!(parse_head(b"GET /relative HTTP/1.1\r\n\r\n").is_err());
    }
}
