//! Sending spans: OTLP's `ExportTraceServiceRequest`, prost-encoded and
//! POSTed over HTTP, in batches, retried while the receiver says it is busy
//! and only within the timeout.

use std::time::{Duration, SystemTime};

use cairn_store::StoreError;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use prost::Message;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use tokio::time::Instant;

use crate::config::OtlpConfig;

/// Most spans in one request: a large run goes as several requests, each
/// well under the 4 MiB receivers commonly accept.
pub const MAX_SPANS_PER_REQUEST: usize = 512;
/// The most of a receiver's answer that is read.
const MAX_ANSWER_BYTES: usize = 64 * 1024;
/// The first wait before a retry; each later one doubles, up to the cap.
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// A refused connection usually means nothing listens: tried again only
/// this many times, so that a missing collector costs little.
const CONNECT_RETRIES: u32 = 2;

/// Why spans were not delivered.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// The receiver answered with an error that retrying cannot fix.
    #[error("the OTLP receiver at {endpoint} refused the spans: HTTP {status}{detail}")]
    Rejected {
        /// Where the spans went.
        endpoint: String,
        /// The HTTP status.
        status: u16,
        /// The start of what it said, if anything.
        detail: String,
    },
    /// No answer within the timeout.
    #[error("the OTLP receiver at {endpoint} did not answer within {timeout_ms} ms")]
    Timeout {
        /// Where the spans went.
        endpoint: String,
        /// The timeout.
        timeout_ms: u128,
    },
    /// The receiver kept saying it was busy (429, 502, 503, 504) until the
    /// timeout left no room for another try.
    #[error("the OTLP receiver at {endpoint} was still answering HTTP {status} when the {timeout_ms} ms timeout ran out")]
    Busy {
        /// Where the spans went.
        endpoint: String,
        /// Its last answer.
        status: u16,
        /// The timeout.
        timeout_ms: u128,
    },
    /// No connection could be made.
    #[error("cannot reach the OTLP receiver at {endpoint}: {detail}")]
    Unreachable {
        /// Where the spans went.
        endpoint: String,
        /// What the connection attempt said.
        detail: String,
    },
    /// The HTTP client could not be set up.
    #[error("cannot set up the OTLP HTTP client: {0}")]
    Client(String),
    /// The run's events could not be read.
    #[error("cannot read the run's events: {0}")]
    Store(#[from] StoreError),
}

/// The requests that carry `spans`, at most [`MAX_SPANS_PER_REQUEST`] spans
/// each, under the resource `resource` describes.
pub fn requests(resource: &[(String, String)], spans: Vec<Span>) -> Vec<ExportTraceServiceRequest> {
    let resource = Resource {
        attributes: resource
            .iter()
            .map(|(k, v)| KeyValue {
                key: k.clone(),
                value: Some(AnyValue {
                    value: Some(any_value::Value::StringValue(v.clone())),
                }),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    let scope = InstrumentationScope {
        name: "cairn".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        ..Default::default()
    };
    let mut out = Vec::with_capacity(spans.len().div_ceil(MAX_SPANS_PER_REQUEST));
    let mut spans = spans.into_iter().peekable();
    while spans.peek().is_some() {
        let batch: Vec<Span> = spans.by_ref().take(MAX_SPANS_PER_REQUEST).collect();
        out.push(ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(resource.clone()),
                scope_spans: vec![ScopeSpans {
                    scope: Some(scope.clone()),
                    spans: batch,
                    schema_url: String::new(),
                }],
                schema_url: String::new(),
            }],
        });
    }
    out
}

/// A request in OTLP's JSON form (hex ids, as a collector's file exporter
/// writes it), on one line.
pub fn to_json(request: &ExportTraceServiceRequest) -> Result<String, serde_json::Error> {
    serde_json::to_string(request)
}

/// Makes ring rustls's crypto provider the process's, once, for https
/// endpoints: reqwest is built without one. One already installed stays.
fn install_tls_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// Sends spans to one OTLP/HTTP receiver.
#[derive(Debug, Clone)]
pub struct OtlpClient {
    cfg: OtlpConfig,
    http: reqwest::Client,
    headers: HeaderMap,
}

impl OtlpClient {
    /// A client for the receiver `cfg` names.
    pub fn new(cfg: OtlpConfig) -> Result<OtlpClient, ExportError> {
        install_tls_provider();
        let mut headers = HeaderMap::new();
        for (k, v) in &cfg.headers {
            let name = HeaderName::from_bytes(k.as_bytes())
                .map_err(|_| ExportError::Client(format!("`{k}` is not a header name")))?;
            let value = HeaderValue::from_str(v).map_err(|_| {
                ExportError::Client(format!("the value of `{k}` is not a header value"))
            })?;
            headers.insert(name, value);
        }
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/x-protobuf"),
        );
        let http = reqwest::Client::builder()
            .user_agent(concat!("cairn/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(cfg.timeout)
            .build()
            .map_err(|e| ExportError::Client(e.to_string()))?;
        Ok(OtlpClient { cfg, http, headers })
    }

    /// The settings it sends with.
    pub fn config(&self) -> &OtlpConfig {
        &self.cfg
    }

    /// Sends `spans` in as many requests as they need; each request gets
    /// the whole timeout. Stops at the first request that fails.
    pub async fn export(&self, spans: Vec<Span>) -> Result<(), ExportError> {
        for request in requests(&self.cfg.resource, spans) {
            self.send(request.encode_to_vec()).await?;
        }
        Ok(())
    }

    /// POSTs one encoded request, retrying 429, 502, 503 and 504 (after
    /// `Retry-After` when the receiver gives one, else with a doubling
    /// backoff) while the timeout allows.
    async fn send(&self, body: Vec<u8>) -> Result<(), ExportError> {
        let deadline = Instant::now() + self.cfg.timeout;
        let endpoint = &self.cfg.endpoint;
        let timeout_ms = self.cfg.timeout.as_millis();
        let mut tries = 0u32;
        let mut refused = 0u32;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let request = self
                .http
                .post(endpoint)
                .headers(self.headers.clone())
                .body(body.clone())
                .send();
            let answer = match tokio::time::timeout(left, request).await {
                Err(_) => {
                    return Err(ExportError::Timeout {
                        endpoint: endpoint.clone(),
                        timeout_ms,
                    })
                }
                Ok(Err(e)) if e.is_connect() && refused < CONNECT_RETRIES => {
                    refused += 1;
                    let wait = backoff(tries);
                    tries += 1;
                    if Instant::now() + wait >= deadline {
                        return Err(unreachable_error(endpoint, &e));
                    }
                    tokio::time::sleep(wait).await;
                    continue;
                }
                Ok(Err(e)) if e.is_timeout() => {
                    return Err(ExportError::Timeout {
                        endpoint: endpoint.clone(),
                        timeout_ms,
                    })
                }
                Ok(Err(e)) => return Err(unreachable_error(endpoint, &e)),
                Ok(Ok(a)) => a,
            };
            let status = answer.status();
            if status.is_success() {
                let bytes = read_capped(answer, deadline).await;
                if let Ok(r) = ExportTraceServiceResponse::decode(bytes.as_slice()) {
                    if let Some(p) = r.partial_success {
                        if p.rejected_spans > 0 || !p.error_message.is_empty() {
                            tracing::warn!(
                                endpoint = %endpoint,
                                rejected = p.rejected_spans,
                                message = %p.error_message,
                                "the OTLP receiver took only part of the spans"
                            );
                        }
                    }
                }
                return Ok(());
            }
            if matches!(status.as_u16(), 429 | 502 | 503 | 504) {
                let wait = retry_after(answer.headers(), SystemTime::now())
                    .unwrap_or_else(|| backoff(tries));
                tries += 1;
                if Instant::now() + wait >= deadline {
                    return Err(ExportError::Busy {
                        endpoint: endpoint.clone(),
                        status: status.as_u16(),
                        timeout_ms,
                    });
                }
                tokio::time::sleep(wait).await;
                continue;
            }
            let said = read_capped(answer, deadline).await;
            return Err(ExportError::Rejected {
                endpoint: endpoint.clone(),
                status: status.as_u16(),
                detail: printable(&said),
            });
        }
    }
}

fn unreachable_error(endpoint: &str, e: &reqwest::Error) -> ExportError {
    // reqwest's own message repeats the URL; its causes say what happened
    // (refused, no such host).
    let mut detail = String::new();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        let text = s.to_string();
        if !detail.contains(&text) {
            if !detail.is_empty() {
                detail.push_str(": ");
            }
            detail.push_str(&text);
        }
        source = s.source();
    }
    if detail.is_empty() {
        detail = e.to_string();
    }
    ExportError::Unreachable {
        endpoint: endpoint.to_string(),
        detail,
    }
}

/// The wait before try `tries + 1`: 100 ms, doubling, at most 5 s.
fn backoff(tries: u32) -> Duration {
    FIRST_BACKOFF
        .saturating_mul(2u32.saturating_pow(tries.min(16)))
        .min(MAX_BACKOFF)
}

/// `Retry-After` in seconds or as an HTTP date, relative to `now`.
fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let v = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(secs) = v.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(v).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// At most [`MAX_ANSWER_BYTES`] of an answer's body, read before the
/// deadline; what could not be read is left.
async fn read_capped(mut answer: reqwest::Response, deadline: Instant) -> Vec<u8> {
    let mut out = Vec::new();
    while out.len() < MAX_ANSWER_BYTES {
        match tokio::time::timeout_at(deadline, answer.chunk()).await {
            Ok(Ok(Some(chunk))) => {
                let room = MAX_ANSWER_BYTES - out.len();
                out.extend_from_slice(&chunk[..chunk.len().min(room)]);
            }
            _ => break,
        }
    }
    out
}

/// The start of a receiver's error text, for a message: `": text"`, or
/// nothing when it is empty or binary (a protobuf `Status`).
fn printable(body: &[u8]) -> String {
    let Ok(text) = std::str::from_utf8(body) else {
        return String::new();
    };
    let text = text.trim();
    if text.is_empty()
        || text
            .chars()
            .any(|c| c.is_control() && c != '\n' && c != '\t')
    {
        return String::new();
    }
    let cut: String = text.chars().take(300).collect();
    format!(": {cut}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_reads_seconds_and_dates() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        let mut h = HeaderMap::new();
        h.insert(RETRY_AFTER, HeaderValue::from_static("3"));
        assert_eq!(retry_after(&h, now), Some(Duration::from_secs(3)));
        let later = httpdate::fmt_http_date(now + Duration::from_secs(7));
        h.insert(RETRY_AFTER, HeaderValue::from_str(&later).unwrap());
        assert_eq!(retry_after(&h, now), Some(Duration::from_secs(7)));
        h.insert(RETRY_AFTER, HeaderValue::from_static("soon"));
        assert_eq!(retry_after(&h, now), None);
    }

    #[test]
    fn backoff_doubles_up_to_its_cap() {
        assert_eq!(backoff(0), Duration::from_millis(100));
        assert_eq!(backoff(3), Duration::from_millis(800));
        assert_eq!(backoff(40), MAX_BACKOFF);
    }

    #[test]
    fn spans_are_split_into_bounded_requests() {
        let spans = vec![Span::default(); MAX_SPANS_PER_REQUEST * 2 + 1];
        let resource = vec![("service.name".to_string(), "cairn".to_string())];
        let reqs = requests(&resource, spans);
        let sizes: Vec<usize> = reqs
            .iter()
            .map(|r| r.resource_spans[0].scope_spans[0].spans.len())
            .collect();
        assert_eq!(sizes, vec![MAX_SPANS_PER_REQUEST, MAX_SPANS_PER_REQUEST, 1]);
        assert!(requests(&resource, Vec::new()).is_empty());
        let json = to_json(&reqs[2]).unwrap();
        assert!(json.contains(r#""stringValue":"cairn""#), "{json}");
    }
}
