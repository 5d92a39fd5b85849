//! Accepting connections: a cap on how many are open at once and a bound on
//! how long a client may take to send a request's headers, so neither many
//! sockets nor slow ones can pin the server's memory or tasks.
//!
//! Over the cap, a new connection is answered `503` with `Retry-After` and
//! closed at once, rather than left waiting in the kernel's queue where a
//! client cannot tell a busy server from a dead one. A connection upgraded
//! to a WebSocket keeps its place until the socket closes.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use std::net::SocketAddr;

use axum::extract::ConnectInfo;
use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};

/// How connections are admitted and read.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// Connections open at once (WebSockets included).
    pub max_connections: usize,
    /// Longest wait for a request's headers, also between requests on a
    /// kept-alive connection.
    pub header_read_timeout: Duration,
}

/// What a connection over the cap is told before it is closed.
const BUSY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: 94\r\n\r\n{\"error\":{\"code\":\"too_many_connections\",\"message\":\"the server has too many open connections\"}}";

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
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            // Best effort: a client that already sent its request may see
            // a reset instead, which says the same.
            let _ = tcp.try_write(BUSY);
            continue;
        };
        // Events are small writes a client is waiting for: Nagle's
        // algorithm would hold one back until the previous one was acked.
        let _ = tcp.set_nodelay(true);
        let io = Counted { tcp, _slot: slot };
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
    // Handlers that need the client's address (the login's throttle) read
    // it as axum's `ConnectInfo`.
    let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
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

/// A connection's socket holding its slot: the slot is freed when the
/// socket is dropped, whether by hyper or, after an upgrade, by the
/// WebSocket that took it over.
struct Counted {
    tcp: TcpStream,
    _slot: OwnedSemaphorePermit,
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
    #[test]
    fn busy_reply_has_its_length() {
        let text = std::str::from_utf8(super::BUSY).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(
            head.contains(&format!("Content-Length: {}\r", body.len()))
                || head.ends_with(&format!("Content-Length: {}", body.len()))
        );
        serde_json::from_str::<serde_json::Value>(body).unwrap();
    }
}
