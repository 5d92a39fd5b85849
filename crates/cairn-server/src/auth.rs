//! Token authentication: `Authorization: Bearer <token>`, or the session
//! cookie a browser gets from `POST /v1/session` with the token.
//!
//! The cookie is not the token: it is HMAC-SHA256 keyed by the token over a
//! fixed label. So it tells nothing of the token if it leaks, several
//! servers sharing a token accept each other's cookies, and changing the
//! token ends every session. It is `HttpOnly` (no script reads it) and
//! `SameSite=Strict` (no other site's page sends it); with the `Origin`
//! check and the JSON-only `POST`s of [`crate::guard`], another site can
//! neither read through it nor act with it.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use cairn_api::{LoginBody, Session};
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::api::{AppState, JsonBody};
use crate::error::ApiError;

/// The name of the session cookie.
pub(crate) const SESSION_COOKIE: &str = "cairn_session";

/// What the session cookie's HMAC covers. A new label would end every
/// session of every server, as a new token does.
const SESSION_LABEL: &[u8] = b"cairn web session v1";

/// The session cookie's value for `token`: lowercase hex of
/// HMAC-SHA256(key = token, label).
pub(crate) fn session_value(token: &str) -> String {
    let mut mac =
        Hmac::<Sha256>::new_from_slice(token.as_bytes()).expect("HMAC takes keys of any length");
    mac.update(SESSION_LABEL);
    mac.finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Every value the request's cookies give [`SESSION_COOKIE`] (another
/// server on the same host name may have set one too).
fn session_cookies(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| {
            let (name, value) = pair.trim().split_once('=')?;
            (name.trim() == SESSION_COOKIE).then(|| value.trim().trim_matches('"'))
        })
}

/// Compares in time that depends only on the lengths, so a client cannot
/// learn the token a byte at a time from response times.
pub(crate) fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = (a.len() ^ b.len()) as u8 | ((a.len() ^ b.len()) >> 8) as u8;
    for i in 0..a.len().max(b.len()) {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= x ^ y;
    }
    diff == 0 && a.len() == b.len()
}

/// The token of an `Authorization: Bearer <token>` header.
pub(crate) fn bearer(headers: &HeaderMap) -> Option<&str> {
    let v = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = v.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// What a request's `Authorization` header or session cookie says.
pub(crate) enum Check {
    /// No token configured, or the right token or session given.
    Allowed,
    /// No `Authorization` header, and no session cookie that is current.
    /// A stale cookie (the token changed) counts as none: its holder only
    /// has to log in again.
    Missing,
    /// An `Authorization` header with the wrong token or scheme.
    Wrong,
}

/// Whether the request may use the API.
pub(crate) fn check(state: &AppState, headers: &HeaderMap) -> Check {
    let Some(expected) = state.token() else {
        return Check::Allowed;
    };
    if headers.get(header::AUTHORIZATION).is_some() {
        return match bearer(headers) {
            Some(t) if ct_eq(t.as_bytes(), expected.as_bytes()) => Check::Allowed,
            _ => Check::Wrong,
        };
    }
    let session = session_value(expected);
    // Every cookie is compared, so the time taken says nothing of which
    // one came close.
    let mut ok = false;
    for c in session_cookies(headers) {
        ok |= ct_eq(c.as_bytes(), session.as_bytes());
    }
    if ok {
        Check::Allowed
    } else {
        Check::Missing
    }
}

pub(crate) fn unauthorized(missing: bool) -> Response {
    let msg = if missing {
        "this server requires a token: send `Authorization: Bearer <token>`, or log in on the web page"
    } else {
        "the token is wrong"
    };
    let mut r = ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", msg).into_response();
    r.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        header::HeaderValue::from_static("Bearer realm=\"cairn\""),
    );
    r
}

/// Every route needs the token but `/healthz`, the web page (which holds no
/// data, and must load to show its login form), `/v1/session` (the
/// login itself) and the webhooks (`/v1/hooks/{name}`, which check their
/// deliveries' signatures). `/v1/ws` without a token is let through: a WebSocket
/// client may send the token as its first message.
pub(crate) async fn require_token(
    State(state): State<AppState>,
    req: Request,
    next: Next,
) -> Response {
    let path = req.uri().path();
    // A webhook's sender holds no token: the hook checks its signature.
    if path == "/healthz"
        || path == "/v1/session"
        || path.starts_with("/v1/hooks/")
        || crate::ui::is_page(path)
    {
        return next.run(req).await;
    }
    match check(&state, req.headers()) {
        Check::Allowed => next.run(req).await,
        Check::Missing if path == "/v1/ws" => next.run(req).await,
        Check::Missing => unauthorized(true),
        Check::Wrong => unauthorized(false),
    }
}

/// The `Set-Cookie` value of a session (`value` empty and `Max-Age=0` to
/// end it).
fn session_cookie(value: &str, end: bool) -> HeaderValue {
    let max_age = if end { "; Max-Age=0" } else { "" };
    HeaderValue::from_str(&format!(
        "{SESSION_COOKIE}={value}; Path=/; HttpOnly; SameSite=Strict{max_age}"
    ))
    .expect("hex digits make a header value")
}

/// `GET /v1/session`: whether the server needs a token and whether this
/// request carries a valid one (header or cookie). Needs no token itself.
pub(crate) async fn session(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let authenticated = matches!(check(&state, &headers), Check::Allowed);
    Json(Session {
        token_required: state.token().is_some(),
        authenticated,
    })
    .into_response()
}

/// Failed logins an address may make in a [`LOGIN_WINDOW`] before its
/// logins are refused until the window ends.
pub(crate) const LOGIN_FAILURES: u32 = 10;

/// The window failed logins are counted in.
pub(crate) const LOGIN_WINDOW: Duration = Duration::from_secs(60);

/// Addresses the throttle remembers at most; past that the oldest windows
/// are forgotten, so a flood of addresses cannot grow it.
const LOGIN_ADDRESSES: usize = 4096;

/// Failed logins by client address: the login form must not be a way to
/// try tokens as fast as the network allows. Per address, so that someone
/// guessing does not lock everyone else out; the bearer header was never a
/// form and is left as it is.
#[derive(Default)]
pub(crate) struct LoginThrottle(Mutex<HashMap<IpAddr, (Instant, u32)>>);

impl LoginThrottle {
    /// How long `ip` must wait before its next login is looked at, if it
    /// used up its failures.
    fn wait(&self, ip: IpAddr, now: Instant) -> Option<Duration> {
        let map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let &(start, failures) = map.get(&ip)?;
        let end = start + LOGIN_WINDOW;
        (failures >= LOGIN_FAILURES && now < end).then(|| end - now)
    }

    fn failed(&self, ip: IpAddr, now: Instant) {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() >= LOGIN_ADDRESSES && !map.contains_key(&ip) {
            map.retain(|_, (start, _)| now < *start + LOGIN_WINDOW);
            if map.len() >= LOGIN_ADDRESSES {
                if let Some(oldest) = map.iter().min_by_key(|(_, (s, _))| *s).map(|(k, _)| *k) {
                    map.remove(&oldest);
                }
            }
        }
        let entry = map.entry(ip).or_insert((now, 0));
        if now >= entry.0 + LOGIN_WINDOW {
            *entry = (now, 0);
        }
        entry.1 += 1;
    }
}

/// `POST /v1/session {"token"}`: checks the token (in constant time) and
/// answers with the session cookie. A server without a token needs no
/// login and sets no cookie. An address with [`LOGIN_FAILURES`] failed
/// logins in a minute is answered 429 until the minute ends, whatever
/// token it sends.
pub(crate) async fn login(
    State(state): State<AppState>,
    // The connection's extensions carry the client's address (see
    // `listen`); a router served some other way has none and no throttle.
    ext: axum::http::Extensions,
    JsonBody(body): JsonBody<LoginBody>,
) -> Response {
    let Some(expected) = state.token() else {
        return Json(Session {
            token_required: false,
            authenticated: true,
        })
        .into_response();
    };
    let now = Instant::now();
    let ip = ext
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(a)| a.ip());
    if let Some(wait) = ip.and_then(|ip| state.logins().wait(ip, now)) {
        let secs = wait.as_secs().max(1);
        let mut r = ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "too_many_logins",
            format!("too many failed logins from this address: try again in {secs} s"),
        )
        .into_response();
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        return r;
    }
    if !ct_eq(body.token.as_bytes(), expected.as_bytes()) {
        if let Some(ip) = ip {
            state.logins().failed(ip, now);
        }
        return unauthorized(false);
    }
    let mut r = Json(Session {
        token_required: true,
        authenticated: true,
    })
    .into_response();
    r.headers_mut().insert(
        header::SET_COOKIE,
        session_cookie(&session_value(expected), false),
    );
    r
}

/// `DELETE /v1/session`: ends the browser's session (its cookie). Other
/// browsers' sessions stay; changing the token ends them all.
pub(crate) async fn logout() -> Response {
    let mut r = StatusCode::NO_CONTENT.into_response();
    r.headers_mut()
        .insert(header::SET_COOKIE, session_cookie("", true));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ct_eq_compares_whole_strings() {
        assert!(ct_eq(b"secret", b"secret"));
        assert!(!ct_eq(b"secret", b"secreT"));
        assert!(!ct_eq(b"secret", b"secret2"));
        assert!(!ct_eq(b"", b"x"));
        assert!(ct_eq(b"", b""));
        // Lengths that differ by a multiple of 256 must still differ.
        assert!(!ct_eq(&[0u8; 256], b""));
    }

    /// RFC 4231 test case 2 holds the HMAC to the standard's.
    #[test]
    fn hmac_sha256_is_the_standard_one() {
        let mut mac = Hmac::<Sha256>::new_from_slice(b"Jefe").unwrap();
        mac.update(b"what do ya want for nothing?");
        let hex: String = mac
            .finalize()
            .into_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(
            hex,
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn an_address_is_held_after_its_failed_logins_and_only_it() {
        let t = LoginThrottle::default();
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let now = Instant::now();
        for _ in 0..LOGIN_FAILURES - 1 {
            t.failed(a, now);
        }
        assert_eq!(t.wait(a, now), None);
        t.failed(a, now);
        assert_eq!(t.wait(a, now), Some(LOGIN_WINDOW));
        assert_eq!(t.wait(b, now), None, "another address is not held");
        assert_eq!(t.wait(a, now + LOGIN_WINDOW), None, "the window ends");
        t.failed(a, now + LOGIN_WINDOW);
        assert_eq!(
            t.wait(a, now + LOGIN_WINDOW),
            None,
            "a new window counts anew"
        );
    }

    #[test]
    fn the_throttle_forgets_addresses_past_its_bound() {
        let t = LoginThrottle::default();
        let now = Instant::now();
        for i in 0..(LOGIN_ADDRESSES as u32 + 100) {
            t.failed(IpAddr::from(i.to_be_bytes()), now);
        }
        assert!(t.0.lock().unwrap().len() <= LOGIN_ADDRESSES);
    }

    #[test]
    fn the_session_cookie_is_derived_from_the_token_not_the_token() {
        let a = session_value("sekret");
        assert_eq!(a.len(), 64);
        assert!(!a.contains("sekret"));
        assert_eq!(a, session_value("sekret"), "servers sharing a token agree");
        assert_ne!(a, session_value("sekret2"), "a new token ends sessions");
    }

    #[test]
    fn session_cookies_are_found_among_others() {
        let mut h = HeaderMap::new();
        h.append(
            header::COOKIE,
            "a=1; cairn_session=abc ; b=2".parse().unwrap(),
        );
        h.append(header::COOKIE, "cairn_session=\"def\"".parse().unwrap());
        assert_eq!(session_cookies(&h).collect::<Vec<_>>(), ["abc", "def"]);
    }

    #[test]
    fn bearer_scheme_is_case_insensitive() {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, "bearer abc".parse().unwrap());
        assert_eq!(bearer(&h), Some("abc"));
        h.insert(header::AUTHORIZATION, "Basic abc".parse().unwrap());
        assert_eq!(bearer(&h), None);
    }
}
