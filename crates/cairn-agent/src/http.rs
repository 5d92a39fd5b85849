//! One streamed POST with the retries a model call may make before its
//! answer begins, and reading its body with an idle timeout.
//!
//! A request is sent again on 408, 409, 429 and 5xx answers, and when the
//! connection fails, or drops or stays silent before the first byte of the
//! body; the wait honours `retry-after-ms` and `retry-after` (seconds or an
//! HTTP date). Once a byte of the body arrived nothing is sent again: the
//! answer may be paid for, and the engine decides what to do.

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures::stream::BoxStream;
use futures::StreamExt;
use reqwest::header::HeaderMap;
use reqwest::StatusCode;

use crate::client::StreamEvent;
use crate::config::{backoff, idle_of, max_honoured, retry_of};
use crate::error::{ModelError, ModelErrorKind};
use crate::message::ModelResponse;
use crate::sse::{SseEvent, SseParser};
use cairn_models::ModelConfig;

/// Most bytes of an error answer's body read (for its message).
const MAX_ERROR_BODY: usize = 64 << 10;

/// A streamed answer whose first bytes arrived.
pub(crate) struct Body {
    first: Option<Bytes>,
    rest: BoxStream<'static, reqwest::Result<Bytes>>,
    idle: Duration,
    key: String,
}

impl Body {
    /// The next chunk; `None` at the end of the body. No byte for the idle
    /// timeout, or a broken connection, is `Interrupted` (the answer had
    /// begun).
    pub(crate) async fn next(&mut self) -> Result<Option<Bytes>, ModelError> {
        if let Some(b) = self.first.take() {
            return Ok(Some(b));
        }
        match tokio::time::timeout(self.idle, self.rest.next()).await {
            Err(_) => Err(ModelError::new(
                ModelErrorKind::IdleTimeout,
                format!("no byte of the answer for {:?}", self.idle),
            )),
            Ok(None) => Ok(None),
            Ok(Some(Ok(b))) => Ok(Some(b)),
            Ok(Some(Err(e))) => Err(ModelError::new(
                ModelErrorKind::Interrupted,
                format!(
                    "the answer's stream broke: {}",
                    scrub(&e.to_string(), &self.key)
                ),
            )),
        }
    }
}

/// Sends `body` to `url` with `headers`, retrying as the model's policy
/// says until an answer's body begins.
pub(crate) async fn post_streamed(
    http: &HttpClient,
    config: &ModelConfig,
    url: &str,
    headers: HeaderMap,
    body: Vec<u8>,
    key: &str,
    on: &mut (dyn for<'e> FnMut(StreamEvent<'e>) + Send),
) -> Result<Body, ModelError> {
    let retry = retry_of(config);
    let attempts = retry.attempts;
    let idle = idle_of(config);
    let mut n = 1;
    loop {
        // A client that could not be built for want of descriptors is a
        // failed try, like a connection that could not be made.
        let tried = match http.get() {
            Ok(client) => send_once(&client, url, &headers, &body, key, idle).await,
            Err(e) if e.kind == ModelErrorKind::Network => {
                Try::Again(cut(&e.message, 200), None, e)
            }
            Err(e) => Try::Fatal(e),
        };
        let (reason, asked, failure) = match tried {
            Try::Answer(body) => return Ok(body),
            Try::Fatal(e) => return Err(e),
            Try::Again(reason, asked, failure) => (reason, asked, failure),
        };
        if n >= attempts {
            return Err(failure);
        }
        n += 1;
        let delay = match asked {
            Some(d) => d.min(max_honoured(&retry)),
            None => backoff(&retry, n),
        };
        on(StreamEvent::Retrying {
            attempt: n,
            reason,
            delay,
        });
        tokio::time::sleep(delay).await;
    }
}

/// How one try of a model call went.
enum Try {
    /// The answer's body began.
    Answer(Body),
    /// A failure no retry mends.
    Fatal(ModelError),
    /// A failure a retry may mend: why (for the retry's event), the wait
    /// the server asked for, and the error if no try is left.
    Again(String, Option<Duration>, ModelError),
}

/// One try: sends the request and waits for the answer's first bytes,
/// each within `idle`.
async fn send_once(
    client: &reqwest::Client,
    url: &str,
    headers: &HeaderMap,
    body: &[u8],
    key: &str,
    idle: Duration,
) -> Try {
    let sent = client
        .post(url)
        .headers(headers.clone())
        .body(body.to_vec())
        .send();
    let (reason, asked, failure) = match tokio::time::timeout(idle, sent).await {
        Err(_) => (
            "no answer in time".to_string(),
            None,
            ModelError::new(
                ModelErrorKind::IdleTimeout,
                format!("the server did not answer within {idle:?}"),
            ),
        ),
        Ok(Err(e)) => {
            // With its causes: reqwest's own text ("error sending request")
            // leaves out what failed (a refused connection, a certificate
            // nobody vouches for).
            let msg = scrub(&causes(&e), key);
            (
                format!("connection: {}", cut(&msg, 200)),
                None,
                ModelError::new(
                    ModelErrorKind::Network,
                    format!("cannot reach {url}: {msg}"),
                ),
            )
        }
        Ok(Ok(resp)) if resp.status().is_success() => {
            let mut rest = resp.bytes_stream().boxed();
            // The body's first bytes: until they arrive, a drop or a
            // silence is still a failed try, not a broken answer.
            match tokio::time::timeout(idle, rest.next()).await {
                Ok(Some(Ok(first))) => {
                    return Try::Answer(Body {
                        first: Some(first),
                        rest,
                        idle,
                        key: key.to_string(),
                    })
                }
                Err(_) => (
                    "no byte of the answer in time".to_string(),
                    None,
                    ModelError::new(
                        ModelErrorKind::IdleTimeout,
                        format!("no byte of the answer for {idle:?}"),
                    ),
                ),
                Ok(None) => (
                    "empty answer".to_string(),
                    None,
                    ModelError::new(ModelErrorKind::Protocol, "the answer's body was empty"),
                ),
                Ok(Some(Err(e))) => {
                    let msg = scrub(&e.to_string(), key);
                    (
                        format!("connection dropped: {}", cut(&msg, 200)),
                        None,
                        ModelError::new(
                            ModelErrorKind::Network,
                            format!("the connection dropped before the answer: {msg}"),
                        ),
                    )
                }
            }
        }
        Ok(Ok(resp)) => {
            let status = resp.status();
            let asked = retry_after(resp.headers(), SystemTime::now());
            let text = error_body(resp, key).await;
            let kind = match status.as_u16() {
                401 | 403 => ModelErrorKind::Auth,
                429 => ModelErrorKind::RateLimited,
                408 | 409 => ModelErrorKind::Network,
                s if s >= 500 => ModelErrorKind::Server,
                _ => ModelErrorKind::BadRequest,
            };
            let mut err = ModelError::new(
                kind,
                format!("{url} answered {status}: {}", cut(&text, 500)),
            );
            err.status = Some(status.as_u16());
            if !retried_status(status) {
                return Try::Fatal(err);
            }
            (format!("http {}", status.as_u16()), asked, err)
        }
    };
    Try::Again(reason, asked, failure)
}

/// The address of `config`'s provider: the model's `base_url`, else the
/// provider's own, without a trailing `/`.
pub(crate) fn base_url(config: &ModelConfig) -> &str {
    config
        .base_url
        .as_deref()
        .or(config.provider.def().base_url)
        .unwrap_or_default()
        .trim_end_matches('/')
}

/// Where a provider wants its key.
pub(crate) enum KeyHeader {
    /// `Authorization: Bearer <key>`.
    Bearer,
    /// A header of its own (`x-api-key`).
    Named(&'static str),
}

/// The headers of a JSON request with `key` where the provider wants it,
/// marked sensitive (never logged); an empty key (a local server of
/// one's own) sends none.
pub(crate) fn json_headers(key: &str, at: KeyHeader) -> Result<HeaderMap, ModelError> {
    use reqwest::header::{HeaderName, HeaderValue, AUTHORIZATION, CONTENT_TYPE};
    let mut headers = HeaderMap::new();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if key.is_empty() {
        return Ok(headers);
    }
    let (name, text) = match at {
        KeyHeader::Bearer => (AUTHORIZATION, format!("Bearer {key}")),
        KeyHeader::Named(n) => (HeaderName::from_static(n), key.to_string()),
    };
    let mut v = HeaderValue::from_str(&text).map_err(|_| {
        ModelError::new(
            ModelErrorKind::Auth,
            "the API key is not a valid header value",
        )
    })?;
    v.set_sensitive(true);
    headers.insert(name, v);
    Ok(headers)
}

/// A wire format's answer, built from the stream's events.
pub(crate) trait Decoder: Default {
    /// The event that ends an answer, named in the error of a stream that
    /// stops before it.
    const END: &'static str;

    /// Takes one event; true at the end of the answer.
    fn take(
        &mut self,
        ev: &SseEvent,
        on: &mut (dyn for<'e> FnMut(StreamEvent<'e>) + Send),
    ) -> Result<bool, ModelError>;

    /// Whether the body ending here ends the answer properly. A format
    /// with an end event says no (the default): a body that stops before
    /// it was cut. One without (Gemini's) says yes once it saw what a
    /// whole answer carries last.
    fn at_eof(&self) -> bool {
        false
    }

    /// The whole answer.
    fn finish(self, config: &ModelConfig) -> Result<ModelResponse, ModelError>;
}

/// One streamed model call: the POST with its retries, the stream read
/// into `D`'s answer, all within the model's whole-call timeout.
pub(crate) async fn call_sse<D: Decoder>(
    http: &HttpClient,
    config: &ModelConfig,
    url: &str,
    headers: HeaderMap,
    body: Vec<u8>,
    key: &str,
    on: &mut (dyn for<'e> FnMut(StreamEvent<'e>) + Send),
) -> Result<ModelResponse, ModelError> {
    let call = async {
        let mut stream = post_streamed(http, config, url, headers, body, key, on).await?;
        let mut parser = SseParser::new();
        let mut answer = D::default();
        let mut events = Vec::new();
        while let Some(chunk) = stream.next().await? {
            parser.feed(&chunk, &mut events).map_err(|_| {
                ModelError::new(
                    ModelErrorKind::TooLarge,
                    "the answer is larger than Cairn keeps",
                )
            })?;
            for ev in events.drain(..) {
                if answer.take(&ev, on)? {
                    return answer.finish(config);
                }
            }
        }
        if answer.at_eof() {
            return answer.finish(config);
        }
        Err(ModelError::new(
            ModelErrorKind::Interrupted,
            format!("the answer's stream ended before `{}`", D::END),
        ))
    };
    match config.timeout {
        Some(t) => tokio::time::timeout(t, call).await.unwrap_or_else(|_| {
            Err(ModelError::new(
                ModelErrorKind::Timeout,
                format!("the call took longer than {t:?}"),
            ))
        }),
        None => call.await,
    }
}

/// An answer past what Cairn keeps of one.
pub(crate) fn too_large() -> ModelError {
    ModelError::new(
        ModelErrorKind::TooLarge,
        "the answer is larger than Cairn keeps",
    )
}

/// Statuses a later try may get past.
fn retried_status(s: StatusCode) -> bool {
    matches!(s.as_u16(), 408 | 409 | 429) || s.is_server_error()
}

/// The wait a server asks for: `retry-after-ms`, else `retry-after` as
/// seconds or as an HTTP date.
pub(crate) fn retry_after(h: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let text = |name: &str| h.get(name).and_then(|v| v.to_str().ok()).map(str::trim);
    if let Some(ms) = text("retry-after-ms").and_then(|v| v.parse::<f64>().ok()) {
        if ms.is_finite() && ms >= 0.0 {
            return Some(Duration::from_secs_f64(ms.min(1e9) / 1000.0));
        }
    }
    let v = text("retry-after")?;
    if let Ok(secs) = v.parse::<f64>() {
        return (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs.min(1e6)));
    }
    let at = httpdate::parse_http_date(v).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// An error answer's text, bounded, without the key.
async fn error_body(resp: reqwest::Response, key: &str) -> String {
    let mut stream = resp.bytes_stream();
    let mut buf = Vec::new();
    while let Ok(Some(Ok(chunk))) =
        tokio::time::timeout(Duration::from_secs(5), stream.next()).await
    {
        buf.extend_from_slice(&chunk);
        if buf.len() >= MAX_ERROR_BODY {
            buf.truncate(MAX_ERROR_BODY);
            break;
        }
    }
    let text = String::from_utf8_lossy(&buf);
    // The provider's own message, when it sends the usual JSON (Google's
    // APIs may wrap it in an array).
    let msg = serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .map(|v| match v {
            serde_json::Value::Array(mut a) if !a.is_empty() => a.swap_remove(0),
            v => v,
        })
        .and_then(|v| {
            v["error"]["message"]
                .as_str()
                .or(v["message"].as_str())
                .map(str::to_string)
        })
        .unwrap_or_else(|| text.trim().to_string());
    scrub(&msg, key)
}

/// `text` with every occurrence of the key blanked out: servers echo
/// requests in their errors, and errors reach logs.
pub(crate) fn scrub(text: &str, key: &str) -> String {
    if key.len() < 4 {
        return text.to_string();
    }
    text.replace(key, "[redacted]")
}

/// At most `max` bytes of `s`, cut at a character boundary.
pub(crate) fn cut(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// Makes ring rustls's crypto provider for the process, once: reqwest is
/// built without one. Another already installed stays.
pub fn install_tls_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// The HTTP client of a provider, built when first needed and then kept.
/// Building one opens files (root certificates, the resolver's
/// configuration), so it can fail for want of file descriptors, which
/// passes: such a failure is a `Network` error, retried like a connection
/// that could not be made, and the next try builds again. Any other
/// failure is the configuration's (`Config`).
pub(crate) struct HttpClient(std::sync::OnceLock<reqwest::Client>);

impl HttpClient {
    /// Builds the client now when it can; one that failed for want of
    /// descriptors is built again at the first call.
    pub(crate) fn new() -> Result<HttpClient, ModelError> {
        let c = HttpClient(std::sync::OnceLock::new());
        match c.get() {
            Err(e) if e.kind != ModelErrorKind::Network => Err(e),
            _ => Ok(c),
        }
    }

    /// The client (a handle to the shared one).
    pub(crate) fn get(&self) -> Result<reqwest::Client, ModelError> {
        if let Some(c) = self.0.get() {
            return Ok(c.clone());
        }
        let built = build_client()?;
        Ok(self.0.get_or_init(|| built).clone())
    }
}

/// The TLS set-up every provider's client shares, made once per process:
/// reqwest would otherwise list and parse the system's root certificates
/// for each client it builds (about 3 ms of CPU), and a server starting a
/// thousand agent runs builds a thousand clients. A set-up that could not
/// be made is tried again by the next client.
fn tls_config() -> Result<rustls::ClientConfig, ModelError> {
    use rustls_platform_verifier::BuilderVerifierExt;
    static TLS: std::sync::OnceLock<rustls::ClientConfig> = std::sync::OnceLock::new();
    if let Some(c) = TLS.get() {
        return Ok(c.clone());
    }
    install_tls_provider();
    let provider = rustls::crypto::CryptoProvider::get_default()
        .cloned()
        .unwrap_or_else(|| std::sync::Arc::new(rustls::crypto::ring::default_provider()));
    let made = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .and_then(|b| b.with_platform_verifier());
    let mut config = match made {
        Ok(b) => b.with_no_client_auth(),
        Err(e) => {
            let kind = if out_of_descriptors(&e) {
                ModelErrorKind::Network
            } else {
                ModelErrorKind::Config
            };
            return Err(ModelError::new(kind, format!("HTTP client: TLS: {e}")));
        }
    };
    // reqwest is built without HTTP/2.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TLS.get_or_init(|| config).clone())
}

/// No overall timeout (answers stream for minutes; idle timeouts guard
/// them instead).
fn build_client() -> Result<reqwest::Client, ModelError> {
    reqwest::Client::builder()
        .tls_backend_preconfigured(tls_config()?)
        .connect_timeout(Duration::from_secs(30))
        .build()
        .map_err(|e| {
            let why = causes(&e);
            if out_of_descriptors(&e) {
                ModelError::new(
                    ModelErrorKind::Network,
                    format!("HTTP client: out of file descriptors: {why}"),
                )
            } else {
                ModelError::new(ModelErrorKind::Config, format!("HTTP client: {why}"))
            }
        })
}

/// An error with its causes, `a: b: c` ("builder error" alone says nothing).
fn causes(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(c) = next {
        out.push_str(": ");
        out.push_str(&c.to_string());
        next = c.source();
    }
    out
}

/// Whether `EMFILE` or `ENFILE` is among an error's causes (as an I/O error
/// or, from libraries that keep only the text, as its message).
fn out_of_descriptors(e: &(dyn std::error::Error + 'static)) -> bool {
    // Linux's `ENFILE` and `EMFILE`.
    const ENFILE: i32 = 23;
    const EMFILE: i32 = 24;
    let mut next = Some(e);
    while let Some(c) = next {
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            if matches!(io.raw_os_error(), Some(EMFILE | ENFILE)) {
                return true;
            }
        }
        let text = c.to_string();
        if text.contains("Too many open files") || text.contains("os error 24)") {
            return true;
        }
        next = c.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    #[derive(Debug)]
    struct Wrapped(std::io::Error);
    impl std::fmt::Display for Wrapped {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("builder error")
        }
    }
    impl std::error::Error for Wrapped {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn running_out_of_descriptors_is_told_from_other_causes() {
        let emfile = Wrapped(std::io::Error::from_raw_os_error(24));
        assert!(out_of_descriptors(&emfile));
        assert!(causes(&emfile).starts_with("builder error: "));
        let enfile = std::io::Error::from_raw_os_error(23);
        assert!(out_of_descriptors(&enfile));
        let other = Wrapped(std::io::Error::from_raw_os_error(2));
        assert!(!out_of_descriptors(&other));
    }

    #[test]
    fn retry_after_reads_milliseconds_seconds_and_dates() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        let mut h = HeaderMap::new();
        h.insert("retry-after", HeaderValue::from_static("3"));
        assert_eq!(retry_after(&h, now), Some(Duration::from_secs(3)));
        h.insert("retry-after-ms", HeaderValue::from_static("250"));
        assert_eq!(retry_after(&h, now), Some(Duration::from_millis(250)));
        let mut h = HeaderMap::new();
        let later = httpdate::fmt_http_date(now + Duration::from_secs(7));
        h.insert("retry-after", HeaderValue::from_str(&later).unwrap());
        assert_eq!(retry_after(&h, now), Some(Duration::from_secs(7)));
        h.insert("retry-after", HeaderValue::from_static("soon"));
        assert_eq!(retry_after(&h, now), None);
    }

    #[test]
    fn the_key_never_survives_in_a_message() {
        assert_eq!(
            scrub("bad key sk-abc123 given", "sk-abc123"),
            "bad key [redacted] given"
        );
    }
}
