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
//!
//! A name in the list is not an address: the proxy resolves the name
//! itself, refuses it when any address it resolves to is on the machine or
//! its private networks (loopback, private, link-local, metadata, ... see
//! [`special_range`]) unless the list names that address literally, and
//! connects to exactly the address it checked. A plain HTTP request goes
//! upstream with the `Host` the proxy allowed, never the client's, and
//! `Connection: close`, so one connection carries one judged request.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
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
/// How long resolving a name may take.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(15);
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

    /// Whether a rule names `ip` literally (an address, not a pattern or a
    /// name), for `port`.
    pub fn names_address(&self, ip: IpAddr, port: u16) -> bool {
        let ip = ip.to_canonical();
        self.rules.iter().any(|r| {
            r.port.is_none_or(|p| p == port)
                && r.pattern
                    .parse::<IpAddr>()
                    .is_ok_and(|a| a.to_canonical() == ip)
        })
    }

    /// The addresses a connection to `port` may use, out of those its name
    /// resolved to: all of them, or an error naming the first one that is
    /// in a [`special_range`] the list does not name literally. One such
    /// address refuses the name (a name that resolves both outside and to
    /// the machine is not trusted with either).
    pub fn check_addresses(&self, addrs: &[IpAddr], port: u16) -> Result<(), String> {
        if addrs.is_empty() {
            return Err("the name resolves to no address".into());
        }
        for ip in addrs {
            if let Some(class) = special_range(*ip) {
                if !self.names_address(*ip, port) {
                    return Err(format!(
                        "it resolves to {ip}, {class} address the network list does not name literally"
                    ));
                }
            }
        }
        Ok(())
    }
}

/// The kind of address `ip` is when it is not a public internet address
/// (`"a loopback"`, `"a private"`, ...), or `None` for a public one. An
/// IPv6 address that carries an IPv4 one (mapped `::ffff:a.b.c.d`,
/// compatible `::a.b.c.d`, NAT64 `64:ff9b::/96`, 6to4 `2002::/16`) is
/// judged by the IPv4 address it carries too.
pub fn special_range(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => special_v4(v4),
        IpAddr::V6(v6) => special_v6(v6),
    }
}

fn special_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let o = ip.octets();
    let class =
        if ip == Ipv4Addr::new(169, 254, 169, 254) || ip == Ipv4Addr::new(100, 100, 100, 200) {
            // The cloud metadata services (AWS, GCP, Azure, OpenStack; Alibaba).
            "a cloud metadata"
        } else if ip.is_unspecified() || o[0] == 0 {
            "an unspecified (`0.0.0.0/8`)"
        } else if ip.is_loopback() {
            "a loopback"
        } else if ip.is_private() {
            "a private (RFC 1918)"
        } else if ip.is_link_local() {
            "a link-local"
        } else if o[0] == 100 && (o[1] & 0xc0) == 64 {
            "a carrier-grade NAT (`100.64.0.0/10`)"
        } else if ip.is_broadcast() {
            "a broadcast"
        } else if ip.is_multicast() {
            "a multicast"
        } else if o[0] == 192 && o[1] == 0 && o[2] == 0 {
            "an IETF protocol (`192.0.0.0/24`)"
        } else if o[0] == 198 && (o[1] & 0xfe) == 18 {
            "a benchmarking (`198.18.0.0/15`)"
        } else if o[0] >= 240 {
            "a reserved (`240.0.0.0/4`)"
        } else {
            return None;
        };
    Some(class)
}

fn special_v6(ip: Ipv6Addr) -> Option<&'static str> {
    let s = ip.segments();
    if let Some(v4) = ip.to_ipv4_mapped() {
        return special_v4(v4).map(|_| "an IPv4-mapped non-public");
    }
    let class = if ip == Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254) {
        "a cloud metadata"
    } else if ip.is_unspecified() {
        "an unspecified"
    } else if ip.is_loopback() {
        "a loopback"
    } else if s[0] & 0xfe00 == 0xfc00 {
        "a unique local (`fc00::/7`)"
    } else if s[0] & 0xffc0 == 0xfe80 {
        "a link-local (`fe80::/10`)"
    } else if s[0] & 0xffc0 == 0xfec0 {
        "a site-local (`fec0::/10`)"
    } else if ip.is_multicast() {
        "a multicast"
    } else if s[..6] == [0; 6] {
        // IPv4-compatible `::a.b.c.d` (deprecated, still routed by some
        // stacks to the IPv4 address).
        "an IPv4-compatible"
    } else if s[0] == 0x64 && s[1] == 0xff9b {
        // NAT64 `64:ff9b::/96` and `64:ff9b:1::/48`: the IPv4 address is
        // the low 32 bits.
        let v4 = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
        return special_v4(v4).map(|_| "a NAT64 non-public");
    } else if s[0] == 0x2002 {
        let v4 = Ipv4Addr::new((s[1] >> 8) as u8, s[1] as u8, (s[2] >> 8) as u8, s[2] as u8);
        return special_v4(v4).map(|_| "a 6to4 non-public");
    } else if s[0] == 0x100 && s[1..4] == [0; 3] {
        "a discard-only (`100::/64`)"
    } else {
        return None;
    };
    Some(class)
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
    let mut upstream = match dial(&rules, &req, &target).await {
        Ok(s) => s,
        Err(no) => {
            report(no.allowed, target, no.reason);
            let _ = reply(&mut client, no.status, &no.message).await;
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

/// Why a request was not connected: whether the network list allowed it
/// and why not (for the report), and the status and text the client gets.
struct NotDialled {
    allowed: bool,
    reason: String,
    status: &'static str,
    message: String,
}

/// Connects to what `req` asks for if the rules allow the name and every
/// address it resolves to (resolved once: what is checked is what is
/// dialled).
async fn dial(rules: &HostRules, req: &Request, target: &str) -> Result<TcpStream, NotDialled> {
    if !rules.allows(&req.host, req.port) {
        return Err(NotDialled {
            allowed: false,
            reason: "not in the workflow's network list".into(),
            status: "403 Forbidden",
            message: format!("{target} is not in the workflow's network list"),
        });
    }
    let addrs = resolve(&req.host, req.port).await.map_err(|e| NotDialled {
        allowed: true,
        reason: format!("in the network list; resolving failed: {e}"),
        status: "502 Bad Gateway",
        message: format!("cannot resolve {}: {e}", req.host),
    })?;
    let ips: Vec<IpAddr> = addrs.iter().map(SocketAddr::ip).collect();
    if let Err(why) = rules.check_addresses(&ips, req.port) {
        return Err(NotDialled {
            allowed: false,
            message: format!("{target} is refused: {why}"),
            reason: why,
            status: "403 Forbidden",
        });
    }
    match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&addrs[..])).await {
        Ok(Ok(s)) => Ok(s),
        Ok(Err(e)) => Err(NotDialled {
            allowed: true,
            reason: format!("in the network list; connecting failed: {e}"),
            status: "502 Bad Gateway",
            message: format!("cannot reach {target}: {e}"),
        }),
        Err(_) => Err(NotDialled {
            allowed: true,
            reason: "in the network list; connecting timed out".into(),
            status: "504 Gateway Timeout",
            message: format!("{target} did not answer"),
        }),
    }
}

/// The addresses `host` stands for: itself when it is an address, else
/// what the system's resolver answers (once; the caller connects to these).
async fn resolve(host: &str, port: u16) -> std::io::Result<Vec<SocketAddr>> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    let found = tokio::time::timeout(RESOLVE_TIMEOUT, tokio::net::lookup_host((host, port)))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "timed out"))??;
    let mut addrs: Vec<SocketAddr> = Vec::new();
    for a in found {
        if !addrs.contains(&a) {
            addrs.push(a);
        }
    }
    Ok(addrs)
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
    // A lone CR or LF ends a line for some servers and not for the proxy:
    // a header hidden that way would reach the upstream unjudged.
    if text.split("\r\n").any(|l| l.contains(['\r', '\n', '\0'])) {
        return Err("the request head has a line break that is not CRLF".into());
    }
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
    if host.is_empty() {
        return Err("the request names no host".into());
    }
    // The upstream hears of the host the proxy allowed, not of the one the
    // client wrote in `Host` (another virtual host on the same address).
    let shown = if host.contains(':') {
        format!("[{host}]")
    } else {
        host.clone()
    };
    let host_header = if port == 80 {
        shown
    } else {
        format!("{shown}:{port}")
    };
    let mut out = format!("{method} {path} {version}\r\nHost: {host_header}\r\n");
    for line in lines {
        if line.is_empty() {
            continue;
        }
        if line.starts_with([' ', '\t']) {
            // A folded line continues a header the proxy may have dropped.
            return Err("the request head folds a header over lines".into());
        }
        let name = line.split(':').next().unwrap_or_default().trim();
        if [
            "host",
            "connection",
            "keep-alive",
            "proxy-connection",
            "proxy-authorization",
        ]
        .iter()
        .any(|h| name.eq_ignore_ascii_case(h))
        {
            continue;
        }
        out.push_str(line);
        out.push_str("\r\n");
    }
    // One request per connection: a second one on a kept-alive
    // connection would reach this upstream without being judged.
    out.push_str("Connection: close\r\n\r\n");
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
            "GET /a?b HTTP/1.1\r\nHost: example.org:8080\r\nConnection: close\r\n\r\n"
        );
        let c = parse_head(b"CONNECT pypi.org:443 HTTP/1.1\r\n\r\n").unwrap();
        assert_eq!(
            (c.host.as_str(), c.port, c.forward_head),
            ("pypi.org", 443, None)
        );
        assert!(parse_head(b"GET /relative HTTP/1.1\r\n\r\n").is_err());
    }

    #[test]
    fn the_host_header_is_the_allowed_target() {
        let head =
            |h: &[u8]| String::from_utf8(parse_head(h).unwrap().forward_head.unwrap()).unwrap();
        // The client's own Host (any case, twice) and keep-alive go; the
        // target's Host and `Connection: close` come.
        let out = head(b"POST http://api.example.org/v1 HTTP/1.1\r\nhost: metadata.internal\r\nX-A: 1\r\nHOST: 10.0.0.1\r\nConnection: keep-alive\r\nKeep-Alive: 5\r\n\r\n");
        assert_eq!(
            out,
            "POST /v1 HTTP/1.1\r\nHost: api.example.org\r\nX-A: 1\r\nConnection: close\r\n\r\n"
        );
        let out = head(b"GET http://[::1]:8080/ HTTP/1.1\r\n\r\n");
        assert!(out.contains("\r\nHost: [::1]:8080\r\n"), "{out}");
        // A header hidden behind a lone LF or CR, or a folded line.
        for bad in [
            &b"GET http://a.org/ HTTP/1.1\r\nX-A: 1\nHost: evil\r\n\r\n"[..],
            b"GET http://a.org/ HTTP/1.1\nHost: evil\r\n\r\n",
            b"GET http://a.org/ HTTP/1.1\r\nX-A: 1\rHost: evil\r\n\r\n",
            b"GET http://a.org/ HTTP/1.1\r\nX-A: 1\r\n Host: evil\r\n\r\n",
            b"GET http:///x HTTP/1.1\r\n\r\n",
        ] {
            assert!(parse_head(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn machine_and_private_addresses_are_special() {
        for a in [
            "127.0.0.1",
            "127.255.0.9",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.0.1",
            "169.254.169.254",
            "100.100.100.200",
            "100.64.0.1",
            "100.127.255.255",
            "0.0.0.0",
            "0.1.2.3",
            "255.255.255.255",
            "224.0.0.1",
            "239.255.255.250",
            "192.0.0.170",
            "198.18.0.1",
            "240.0.0.1",
            "::",
            "::1",
            "fc00::1",
            "fd12:3456::1",
            "fd00:ec2::254",
            "fe80::1",
            "febf::1",
            "fec0::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "::ffff:169.254.169.254",
            "::127.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "64:ff9b::7f00:1",
            "2002:7f00:1::",
            "2002:c0a8:101::1",
            "100::1",
        ] {
            assert!(special_range(ip(a)).is_some(), "{a} passed as public");
        }
        for a in [
            "8.8.8.8",
            "1.1.1.1",
            "172.32.0.1",
            "172.15.255.255",
            "100.63.255.255",
            "100.128.0.1",
            "169.253.0.1",
            "192.0.1.1",
            "198.20.0.1",
            "2606:4700::1111",
            "2001:4860:4860::8888",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
            "2002:808:808::1",
        ] {
            assert_eq!(special_range(ip(a)), None, "{a} refused as special");
        }
        assert_eq!(
            special_range(ip("169.254.169.254")),
            Some("a cloud metadata")
        );
        assert_eq!(special_range(ip("127.0.0.1")), Some("a loopback"));
    }

    #[test]
    fn a_special_address_needs_its_literal_in_the_list() {
        let r = HostRules::parse(&[
            "*.example.org".into(),
            "127.0.0.1:8080".into(),
            "10.0.0.5".into(),
            "[fd00::7]:443".into(),
        ])
        .unwrap();
        assert!(r.check_addresses(&[ip("93.184.216.34")], 443).is_ok());
        assert!(r.check_addresses(&[ip("127.0.0.1")], 8080).is_ok());
        assert!(r.check_addresses(&[ip("::ffff:127.0.0.1")], 8080).is_ok());
        let e = r.check_addresses(&[ip("127.0.0.1")], 8081).unwrap_err();
        assert!(e.contains("127.0.0.1") && e.contains("loopback"), "{e}");
        assert!(r.check_addresses(&[ip("10.0.0.5")], 22).is_ok());
        assert!(r.check_addresses(&[ip("10.0.0.6")], 22).is_err());
        assert!(r.check_addresses(&[ip("fd00::7")], 443).is_ok());
        assert!(r.check_addresses(&[ip("fd00::7")], 80).is_err());
        // One special address among public ones refuses the name.
        assert!(r
            .check_addresses(&[ip("93.184.216.34"), ip("169.254.169.254")], 80)
            .is_err());
        assert!(r.check_addresses(&[], 80).is_err());
        // A pattern that matches an address is not the address named.
        let star = HostRules::parse(&["*".into()]).unwrap();
        assert!(star.allows("127.0.0.1", 80));
        assert!(star.check_addresses(&[ip("127.0.0.1")], 80).is_err());
    }

    /// A proxy on 127.0.0.1 with `rules`, and the events it reports.
    fn proxy(rules: &[String]) -> (SocketAddr, JoinSet<()>, mpsc::UnboundedReceiver<ProxyEvent>) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let (tx, rx) = mpsc::unbounded_channel();
        let set = serve(
            OwnedFd::from(l),
            Arc::new(HostRules::parse(rules).unwrap()),
            tx,
        )
        .unwrap();
        (addr, set, rx)
    }

    /// An upstream on 127.0.0.1 that answers every request with the head it
    /// received.
    async fn echo_upstream() -> u16 {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut c, _)) = l.accept().await {
                tokio::spawn(async move {
                    let Ok((head, _)) = read_head(&mut c).await else {
                        return;
                    };
                    let resp = format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                        head.len()
                    );
                    let _ = c.write_all(resp.as_bytes()).await;
                    let _ = c.write_all(&head).await;
                });
            }
        });
        port
    }

    /// Sends `request` through the proxy and returns everything it answers.
    async fn through(proxy: SocketAddr, request: &str) -> String {
        let mut c = TcpStream::connect(proxy).await.unwrap();
        c.write_all(request.as_bytes()).await.unwrap();
        let mut out = Vec::new();
        tokio::time::timeout(Duration::from_secs(30), c.read_to_end(&mut out))
            .await
            .expect("the proxy answers within 30 s")
            .unwrap();
        String::from_utf8_lossy(&out).into_owned()
    }

    #[tokio::test]
    async fn an_allowed_name_that_resolves_to_the_machine_is_refused() {
        let port = echo_upstream().await;
        let (addr, _set, mut rx) = proxy(&[format!("localhost:{port}")]);
        let get = format!("GET http://localhost:{port}/x HTTP/1.1\r\nHost: localhost\r\n\r\n");
        let out = through(addr, &get).await;
        assert!(out.starts_with("HTTP/1.1 403"), "{out}");
        assert!(out.contains("loopback"), "{out}");
        let ev = rx.recv().await.unwrap();
        assert!(!ev.allowed, "{ev:?}");
        assert_eq!(ev.target, format!("localhost:{port}"));
        assert!(ev.reason.contains("does not name literally"), "{ev:?}");
        // The same for a tunnel, and for an address a pattern matches.
        let out = through(addr, &format!("CONNECT localhost:{port} HTTP/1.1\r\n\r\n")).await;
        assert!(out.starts_with("HTTP/1.1 403"), "{out}");
        let (star, _set2, _rx2) = proxy(&["*".into()]);
        for target in [
            format!("127.0.0.1:{port}"),
            format!("2130706433:{port}"),
            format!("127.1:{port}"),
        ] {
            let out = through(star, &format!("CONNECT {target} HTTP/1.1\r\n\r\n")).await;
            assert!(out.starts_with("HTTP/1.1 403"), "{target}: {out}");
        }
    }

    #[tokio::test]
    async fn a_literal_address_in_the_list_is_reached_with_the_host_it_allowed() {
        let port = echo_upstream().await;
        let (addr, _set, mut rx) = proxy(&[format!("127.0.0.1:{port}")]);
        let get = format!(
            "GET http://127.0.0.1:{port}/x HTTP/1.1\r\nHost: metadata.google.internal\r\nConnection: keep-alive\r\n\r\n"
        );
        let out = through(addr, &get).await;
        assert!(out.starts_with("HTTP/1.1 200"), "{out}");
        let seen = out.split("\r\n\r\n").nth(1).unwrap_or_default();
        assert!(
            seen.starts_with(&format!("GET /x HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n")),
            "{seen}"
        );
        assert!(!seen.contains("metadata"), "{seen}");
        assert!(seen.contains("Connection: close"), "{seen}");
        let ev = rx.recv().await.unwrap();
        assert!(ev.allowed, "{ev:?}");
        // A tunnel to it works too.
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(
            format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\nGET /t HTTP/1.1\r\nHost: x\r\n\r\n")
                .as_bytes(),
        )
        .await
        .unwrap();
        let mut out = Vec::new();
        tokio::time::timeout(Duration::from_secs(30), c.read_to_end(&mut out))
            .await
            .unwrap()
            .unwrap();
        let out = String::from_utf8_lossy(&out);
        assert!(
            out.starts_with("HTTP/1.1 200 Connection established"),
            "{out}"
        );
        assert!(out.contains("GET /t HTTP/1.1"), "{out}");
    }
}
