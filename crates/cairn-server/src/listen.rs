//! Accepting connections: a cap on how many are open at once, a smaller cap
//! on how many one client address holds, and bounds on how long a client
//! may take to send a request's headers and its body, so neither many
//! sockets nor slow ones can pin the server's memory or tasks, and one
//! client cannot take every place.
//!
//! Over the cap, a new connection is answered `503` with `Retry-After` and
//! closed at once, rather than left waiting in the kernel's queue where a
//! client cannot tell a busy server from a dead one; over its own cap, a
//! client's new connection is answered `429` the same way. A body still
//! arriving when its deadline (counted from the end of the headers) passes
//! fails the request (`408 body_timeout`) and the connection is closed.
//! A connection upgraded to a WebSocket keeps its place until the socket
//! closes.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::Router;
use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

/// How connections are admitted and read.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// Connections open at once (WebSockets included).
    pub max_connections: usize,
    /// Connections one client (an IPv4 address, an IPv6 /64) holds at once.
    pub max_connections_per_client: usize,
    /// Longest wait for a request's headers, also between requests on a
    /// kept-alive connection.
    pub header_read_timeout: Duration,
    /// Longest a request's body may take to arrive, from the end of its
    /// headers.
    pub body_read_timeout: Duration,
}

/// What a connection over the cap is told before it is closed.
const BUSY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: 94\r\n\r\n{\"error\":{\"code\":\"too_many_connections\",\"message\":\"the server has too many open connections\"}}";

/// What a client over its own connection cap is told before its new
/// connection is closed.
const CLIENT_BUSY: &[u8] = b"HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: 109\r\n\r\n{\"error\":{\"code\":\"too_many_connections\",\"message\":\"this client has as many connections open as it may have\"}}";

/// Serves `router` on `listener` until `shutdown` completes; then stops
/// accepting, asks every connection to finish its current request, and
/// returns once all are closed.
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let clients = Arc::new(Clients::default());
    // Every connection holds a receiver; a send asks them all to finish.
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    accept_failed(e).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        // Replies are best effort: a client that already sent its request
        // may see a reset instead, which says the same. A full server is
        // the server's state (503) whoever asks; a client over its own cap
        // while there is room is told it is its own (429). Either way the
        // connection holds nothing past this point.
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            let _ = tcp.try_write(BUSY);
            continue;
        };
        let Some(client) = clients.admit(peer.ip(), limits.max_connections_per_client) else {
            let _ = tcp.try_write(CLIENT_BUSY);
            continue;
        };
        // Events are small writes a client is waiting for: Nagle's
        // algorithm would hold one back until the previous one was acked.
        let _ = tcp.set_nodelay(true);
        let io = Counted {
            tcp,
            _slot: slot,
            _client: client,
        };
        tokio::spawn(connection(
            io,
            peer,
            router.clone(),
            limits,
            stop_rx.clone(),
        ));
    }
    drop(listener);
    stop_tx.send_replace(true);
    // Each connection holds one slot until it closes: all slots free means
    // every connection, upgraded ones included, is gone.
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    let _ = slots.acquire_many(all).await;
    Ok(())
}

/// Errors of `accept` that concern one connection go unnoticed; running
/// out of file descriptors or memory is waited out, as axum does.
async fn accept_failed(e: io::Error) {
    use io::ErrorKind::*;
    if matches!(
        e.kind(),
        ConnectionRefused | ConnectionAborted | ConnectionReset
    ) {
        return;
    }
    tracing::warn!("accept failed: {e}");
    eprintln!("cairn serve: cannot accept a connection: {e}; retrying in 1 s");
    tokio::time::sleep(Duration::from_secs(1)).await;
}

async fn connection(
    io: Counted,
    peer: SocketAddr,
    router: Router,
    limits: Limits,
    mut stop: watch::Receiver<bool>,
) {
    let inner = TowerToHyperService::new(router);
    let body_timeout = limits.body_read_timeout;
    // Handlers that need the client's address (the login's throttle) read
    // it as axum's `ConnectInfo`.
    let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
        // The headers are in: the body's deadline starts now.
        let deadline = Instant::now() + body_timeout;
        let mut req =
            req.map(|b| axum::body::Body::new(DeadlineBody::new(b, deadline, body_timeout)));
        req.extensions_mut().insert(ConnectInfo(peer));
        hyper::service::Service::call(&inner, req)
    });
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    let conn = builder
        .serve_connection(TokioIo::new(io), service)
        .with_upgrades();
    let mut conn = std::pin::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => return,
        _ = stop.wait_for(|s| *s) => {}
    }
    conn.as_mut().graceful_shutdown();
    let _ = conn.await;
}

/// The connections each client holds, by [`client_key`].
#[derive(Default)]
struct Clients {
    open: Mutex<HashMap<IpAddr, usize>>,
}

impl Clients {
    /// A place for one more connection of `ip`, or `None` when it holds
    /// `cap` already.
    fn admit(self: &Arc<Self>, ip: IpAddr, cap: usize) -> Option<ClientPlace> {
        let key = client_key(ip);
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let n = open.entry(key).or_insert(0);
        if *n >= cap {
            return None;
        }
        *n += 1;
        Some(ClientPlace {
            key,
            clients: self.clone(),
        })
    }
}

/// Who counts as one client: an IPv4 address (an IPv4-mapped IPv6 one
/// included), or an IPv6 /64, the block one host or site is usually
/// given, so that its many addresses count as one.
fn client_key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let s = v6.segments();
            IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
        }
        v4 => v4,
    }
}

/// One connection's place in its client's count, given back on drop.
struct ClientPlace {
    key: IpAddr,
    clients: Arc<Clients>,
}

impl Drop for ClientPlace {
    fn drop(&mut self) {
        let mut open = self.clients.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = open.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.key);
            }
        }
    }
}

/// A request body that fails once its deadline passes with bytes still to
/// come: a client trickling a body cannot hold its connection (and its
/// place) for longer than that.
struct DeadlineBody {
    inner: Incoming,
    deadline: Instant,
    limit: Duration,
    /// Made on the first wait only: a body that is there at once costs no
    /// timer.
    sleep: Option<Pin<Box<Sleep>>>,
    expired: bool,
}

impl DeadlineBody {
    fn new(inner: Incoming, deadline: Instant, limit: Duration) -> Self {
        DeadlineBody {
            inner,
            deadline,
            limit,
            sleep: None,
            expired: false,
        }
    }
}

/// A request body that did not arrive in time.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within {0:?} of its headers")]
pub(crate) struct BodyTimeout(Duration);

impl Body for DeadlineBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.expired {
            return Poll::Ready(None);
        }
        if let Poll::Ready(frame) = Pin::new(&mut self.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|r| r.map_err(Into::into)));
        }
        let deadline = self.deadline;
        let sleep = self
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if sleep.as_mut().poll(cx).is_ready() {
            self.expired = true;
            let limit = self.limit;
            return Poll::Ready(Some(Err(Box::new(BodyTimeout(limit)))));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.expired || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// True when `e`, or an error it was caused by, is a [`BodyTimeout`].
pub(crate) fn is_body_timeout(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if err.is::<BodyTimeout>() {
            return true;
        }
        cur = err.source();
    }
    false
}

/// A connection's socket holding its slot and its client's place: both are
/// freed when the socket is dropped, whether by hyper or, after an
/// upgrade, by the WebSocket that took it over.
struct Counted {
    tcp: TcpStream,
    _slot: OwnedSemaphorePermit,
    _client: ClientPlace,
}

impl AsyncRead for Counted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_read(cx, buf)
    }
}

impl AsyncWrite for Counted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_replies_have_their_length() {
        for reply in [BUSY, CLIENT_BUSY] {
            let text = std::str::from_utf8(reply).unwrap();
            let (head, body) = text.split_once("\r\n\r\n").unwrap();
            assert!(
                head.contains(&format!("Content-Length: {}\r", body.len()))
                    || head.ends_with(&format!("Content-Length: {}", body.len())),
                "{text}"
            );
            serde_json::from_str::<serde_json::Value>(body).unwrap();
        }
    }

    #[test]
    fn a_clients_places_are_counted_and_given_back() {
        let clients = Arc::new(Clients::default());
        let a: IpAddr = "127.0.0.1".parse().unwrap();
        let b: IpAddr = "127.0.0.2".parse().unwrap();
        let first = clients.admit(a, 2).unwrap();
        let _second = clients.admit(a, 2).unwrap();
        assert!(clients.admit(a, 2).is_none());
        // The same address written as IPv4-mapped IPv6 is the same client.
        assert!(clients
            .admit("::ffff:127.0.0.1".parse().unwrap(), 2)
            .is_none());
        assert!(clients.admit(b, 2).is_some());
        drop(first);
        assert!(clients.admit(a, 2).is_some());
        // Addresses of one IPv6 /64 are one client; another /64 is not.
        let _x = clients
            .admit("2001:db8:0:1::1".parse().unwrap(), 1)
            .unwrap();
        assert!(clients
            .admit("2001:db8:0:1::ffff".parse().unwrap(), 1)
            .is_none());
        assert!(clients
            .admit("2001:db8:0:2::1".parse().unwrap(), 1)
            .is_some());
    }

    #[test]
    fn a_body_timeout_is_found_through_its_wrappers() {
        let wrapped = axum::Error::new(BodyTimeout(Duration::from_secs(1)));
        assert!(is_body_timeout(&wrapped));
        assert!(!is_body_timeout(&std::io::Error::other("x")));
    }
}
