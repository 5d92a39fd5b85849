//! Bearer-token authentication.

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::api::AppState;
use crate::error::ApiError;

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

/// What the `Authorization` header says about a request.
pub(crate) enum Check {
    /// No token configured, or the right one given.
    Allowed,
    /// No header at all.
    Missing,
    /// A header with the wrong token or scheme.
    Wrong,
}

pub(crate) fn check(state: &AppState, headers: &HeaderMap) -> Check {
    let Some(expected) = state.token() else {
        return Check::Allowed;
    };
    if headers.get(header::AUTHORIZATION).is_none() {
        return Check::Missing;
    }
    match bearer(headers) {
        Some(t) if ct_eq(t.as_bytes(), expected.as_bytes()) => Check::Allowed,
        _ => Check::Wrong,
    }
}

pub(crate) fn unauthorized(missing: bool) -> Response {
    let msg = if missing {
        "this server requires a token: send `Authorization: Bearer <token>`"
    } else {
        "the bearer token is wrong"
    };
    let mut r = ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", msg).into_response();
    r.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        header::HeaderValue::from_static("Bearer realm=\"cairn\""),
    );
    r
}

/// Every route but `/healthz` needs the token. `/v1/ws` without a header is
/// let through: a WebSocket client may send the token as its first message.
pub(crate) async fn require_token(
    State(state): State<AppState>,
    req: Request,
    next: Next,
) -> Response {
    let path = req.uri().path();
    if path == "/healthz" {
        return next.run(req).await;
    }
    match check(&state, req.headers()) {
        Check::Allowed => next.run(req).await,
        Check::Missing if path == "/v1/ws" => next.run(req).await,
        Check::Missing => unauthorized(true),
        Check::Wrong => unauthorized(false),
    }
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

    #[test]
    fn bearer_scheme_is_case_insensitive() {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, "bearer abc".parse().unwrap());
        assert_eq!(bearer(&h), Some("abc"));
        h.insert(header::AUTHORIZATION, "Basic abc".parse().unwrap());
        assert_eq!(bearer(&h), None);
    }
}
