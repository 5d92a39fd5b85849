//! Checks every request passes before anything else, token or not, so that
//! a web page the user visits can neither start runs nor decide gates:
//!
//! - `Host` (DNS rebinding): must name this server: a loopback name
//!   (`localhost`, `127.0.0.1`, `[::1]`) or the address it is bound to, with
//!   its port, or a name given with `--allow-host`;
//! - `Origin` (cross-site requests and WebSocket upgrades): when present,
//!   must be this server's own origin (the request's `Host`, or a loopback
//!   name with the server's port) or one given with `--allow-origin`;
//! - `Content-Type` on `POST`: must be `application/json`, which a browser
//!   cannot send cross-site without a CORS preflight this server never
//!   grants, so a form or a "simple" request cannot post.

use std::net::{IpAddr, SocketAddr};

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::api::AppState;
use crate::error::ApiError;

/// What the server accepts as its own names and origins.
#[derive(Debug, Clone)]
pub(crate) struct Guard {
    port: u16,
    /// The bound address when it names one interface (not 0.0.0.0 / ::).
    bound: Option<IpAddr>,
    /// `--allow-host` entries, lowercased: `name` (any port) or `name:port`.
    hosts: Vec<String>,
    /// `--allow-origin` entries, lowercased, without a trailing `/`.
    origins: Vec<String>,
}

/// Why the server's admission settings were refused.
#[derive(Debug, thiserror::Error)]
pub enum GuardConfigError {
    /// A connection cap (of all clients, or of one) of 0 would refuse
    /// every client.
    #[error("the connection caps must be at least 1")]
    NoConnections,
    /// Not a host name or `host:port`.
    #[error("allowed host `{0}`: write a host name or address, optionally with `:PORT` (e.g. cairn.example.com or 10.0.0.5:7700)")]
    Host(String),
    /// Not `scheme://host[:port]`.
    #[error("allowed origin `{0}`: write SCHEME://HOST[:PORT] (e.g. https://cairn.example.com)")]
    Origin(String),
}

impl Guard {
    pub(crate) fn new(
        addr: SocketAddr,
        hosts: &[String],
        origins: &[String],
    ) -> Result<Guard, GuardConfigError> {
        let hosts = hosts
            .iter()
            .map(|h| {
                let h = h.trim().to_ascii_lowercase();
                split_authority(&h)
                    .filter(|(name, _)| !name.is_empty())
                    .map(|_| h.clone())
                    .ok_or(GuardConfigError::Host(h))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let origins = origins
            .iter()
            .map(|o| {
                let o = o.trim().trim_end_matches('/').to_ascii_lowercase();
                parse_origin(&o)
                    .map(|_| o.clone())
                    .ok_or(GuardConfigError::Origin(o))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let bound = Some(addr.ip()).filter(|ip| !ip.is_unspecified());
        Ok(Guard {
            port: addr.port(),
            bound,
            hosts,
            origins,
        })
    }

    /// True when `authority` (a `Host` value) names this server.
    fn host_allowed(&self, authority: &str) -> bool {
        let authority = authority.to_ascii_lowercase();
        let Some((name, port)) = split_authority(&authority) else {
            return false;
        };
        if self.hosts.iter().any(|h| *h == authority || *h == name) {
            return true;
        }
        let ours = matches!(name, "localhost" | "127.0.0.1" | "[::1]")
            || self.bound.is_some_and(|ip| name == authority_of(ip));
        let port_ok = match port {
            Some(p) => p == self.port,
            None => self.port == 80,
        };
        ours && port_ok
    }

    /// True when `origin` is this server's own (through the request's
    /// `host`, or a loopback name with its port) or an allowed one.
    fn origin_allowed(&self, origin: &str, host: &str) -> bool {
        let origin = origin.trim().trim_end_matches('/').to_ascii_lowercase();
        if self.origins.contains(&origin) {
            return true;
        }
        let Some((scheme, authority)) = parse_origin(&origin) else {
            return false;
        };
        let default_port = if scheme == "https" { 443 } else { 80 };
        let Some((name, port)) = split_authority(authority) else {
            return false;
        };
        let port = port.unwrap_or(default_port);
        // The page's own server is the one the request reached under the
        // same name and port.
        let same_as_host = split_authority(&host.to_ascii_lowercase())
            .is_some_and(|(h, p)| h == name && p.unwrap_or(default_port) == port);
        let loopback = matches!(name, "localhost" | "127.0.0.1" | "[::1]") && port == self.port;
        same_as_host || loopback
    }
}

/// `host[:port]` split, with an IPv6 literal kept in its brackets; `None`
/// for something that is not an authority.
fn split_authority(a: &str) -> Option<(&str, Option<u16>)> {
    let (name, port) = if a.starts_with('[') {
        let end = a.find(']')?;
        let (name, rest) = a.split_at(end + 1);
        match rest {
            "" => (name, None),
            r => (name, Some(r.strip_prefix(':')?)),
        }
    } else {
        match a.rsplit_once(':') {
            Some((n, p)) => (n, Some(p)),
            None => (a, None),
        }
    };
    let name_ok = match name.strip_prefix('[').and_then(|n| n.strip_suffix(']')) {
        Some(v6) => {
            !v6.is_empty()
                && v6
                    .bytes()
                    .all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.')
        }
        None => {
            !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'))
        }
    };
    if !name_ok {
        return None;
    }
    let port = match port {
        Some(p) => Some(p.parse::<u16>().ok()?),
        None => None,
    };
    Some((name, port))
}

/// `scheme://authority` of an origin; only `http` and `https` are origins
/// of pages that could reach this server.
fn parse_origin(o: &str) -> Option<(&str, &str)> {
    let (scheme, authority) = o.split_once("://")?;
    (matches!(scheme, "http" | "https") && split_authority(authority).is_some())
        .then_some((scheme, authority))
}

/// How an address appears in a `Host` header.
fn authority_of(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("[{v6}]"),
    }
}

fn forbidden(code: &'static str, message: String) -> Response {
    ApiError::new(StatusCode::FORBIDDEN, code, message).into_response()
}

/// The `Host` a request names: the request line's authority when it has
/// one (absolute form), else the header.
fn host_of(req: &Request) -> Option<String> {
    if let Some(a) = req.uri().authority() {
        return Some(a.as_str().to_string());
    }
    // Bytes that are not text still name a host, just not this one.
    let h = req.headers().get(header::HOST)?;
    Some(String::from_utf8_lossy(h.as_bytes()).into_owned())
}

fn header_str(h: &HeaderMap, name: header::HeaderName) -> Option<&str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

/// True for `application/json`, with or without parameters.
fn is_json(content_type: &str) -> bool {
    content_type
        .split(';')
        .next()
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
}

/// The middleware of every request, routed or not: `Host`, then `Origin`.
pub(crate) async fn check(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let guard = state.guard();
    let Some(host) = host_of(&req) else {
        return ApiError::new(
            StatusCode::BAD_REQUEST,
            "missing_host",
            "the request has no `Host` header",
        )
        .into_response();
    };
    if !guard.host_allowed(&host) {
        return forbidden(
            "host_not_allowed",
            format!(
                "header `Host`: `{}` is not a name this server answers to; use a loopback name with port {} or start the server with `--allow-host NAME`",
                host.escape_debug(),
                guard.port
            ),
        );
    }
    if let Some(origin) = req.headers().get(header::ORIGIN) {
        let ok = origin
            .to_str()
            .is_ok_and(|o| guard.origin_allowed(o, &host));
        if !ok {
            return forbidden(
                "origin_not_allowed",
                format!(
                    "header `Origin`: `{}` is not this server's origin; requests from web pages elsewhere are refused (`cairn serve --allow-origin ORIGIN` allows one)",
                    String::from_utf8_lossy(origin.as_bytes()).escape_debug()
                ),
            );
        }
    }
    next.run(req).await
}

/// On every `POST` route (only routed ones, so that a method a path does
/// not take is still a 405): the body must be declared JSON.
pub(crate) async fn require_json(req: Request, next: Next) -> Response {
    if header_str(req.headers(), header::CONTENT_TYPE).is_some_and(is_json) {
        return next.run(req).await;
    }
    ApiError::new(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "unsupported_media_type",
        "header `Content-Type`: a POST must send `Content-Type: application/json` (even with an empty body)",
    )
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard(addr: &str, hosts: &[&str], origins: &[&str]) -> Guard {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        Guard::new(addr.parse().unwrap(), &s(hosts), &s(origins)).unwrap()
    }

    #[test]
    fn hosts_are_loopback_names_with_the_port_or_allowed_ones() {
        let g = guard(
            "127.0.0.1:7700",
            &["cairn.example.com", "10.0.0.5:8000"],
            &[],
        );
        for ok in [
            "127.0.0.1:7700",
            "localhost:7700",
            "LOCALHOST:7700",
            "[::1]:7700",
            "cairn.example.com",
            "cairn.example.com:443",
            "10.0.0.5:8000",
        ] {
            assert!(g.host_allowed(ok), "{ok}");
        }
        for bad in [
            "127.0.0.1:7701",
            "localhost",
            "evil.example:7700",
            "127.0.0.1.nip.io:7700",
            "10.0.0.5:8001",
            "localhost:7700:1",
            "",
            "[::1",
        ] {
            assert!(!g.host_allowed(bad), "{bad}");
        }
        let g = guard("0.0.0.0:80", &[], &[]);
        assert!(g.host_allowed("localhost"));
        assert!(!g.host_allowed("0.0.0.0"));
        let g = guard("192.168.1.9:7700", &[], &[]);
        assert!(g.host_allowed("192.168.1.9:7700"));
    }

    #[test]
    fn origins_are_the_servers_own_or_allowed_ones() {
        let g = guard("127.0.0.1:7700", &[], &["https://ui.example.com/"]);
        let host = "127.0.0.1:7700";
        for ok in [
            "http://127.0.0.1:7700",
            "http://localhost:7700",
            "https://ui.example.com",
            "HTTPS://UI.EXAMPLE.COM",
        ] {
            assert!(g.origin_allowed(ok, host), "{ok}");
        }
        for bad in [
            "null",
            "http://evil.example",
            "http://localhost:3000",
            "http://127.0.0.1",
            "file://",
            "https://ui.example.com:8443",
            "",
        ] {
            assert!(!g.origin_allowed(bad, host), "{bad}");
        }
        assert!(g.origin_allowed("https://cairn.example.com", "cairn.example.com"));
        assert!(!g.origin_allowed("https://cairn.example.com", "cairn.example.com:7700"));
    }

    #[test]
    fn bad_allowed_values_are_refused() {
        let a: SocketAddr = "127.0.0.1:1".parse().unwrap();
        assert!(Guard::new(a, &["a b".into()], &[]).is_err());
        assert!(Guard::new(a, &["x:99999".into()], &[]).is_err());
        assert!(Guard::new(a, &[], &["ui.example.com".into()]).is_err());
        assert!(Guard::new(a, &[], &["ftp://x".into()]).is_err());
    }

    #[test]
    fn json_media_type() {
        assert!(is_json("application/json"));
        assert!(is_json("Application/JSON; charset=utf-8"));
        assert!(!is_json("text/plain"));
        assert!(!is_json("application/x-www-form-urlencoded"));
        assert!(!is_json("application/jsonx"));
    }
}
