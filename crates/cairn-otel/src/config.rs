//! The exporter's settings, from OpenTelemetry's standard environment
//! variables. With no endpoint set, exporting is off.

use std::time::Duration;

use reqwest::header::{HeaderName, HeaderValue};

/// The export timeout when none is set (OpenTelemetry's default).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// The service name when none is set.
pub const DEFAULT_SERVICE_NAME: &str = "cairn";
/// The one protocol supported.
pub const PROTOCOL: &str = "http/protobuf";

/// Where and how spans are sent.
#[derive(Debug, Clone, PartialEq)]
pub struct OtlpConfig {
    /// The URL requests are POSTed to (`.../v1/traces`).
    pub endpoint: String,
    /// Headers added to every request (authentication, tenant), decoded.
    pub headers: Vec<(String, String)>,
    /// How long one export request may take, retries included.
    pub timeout: Duration,
    /// The resource's attributes, `service.name` first.
    pub resource: Vec<(String, String)>,
}

/// A setting the exporter cannot work with. Each names the variable.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    /// A protocol other than `http/protobuf`.
    #[error("{var}={value}: Cairn sends traces over OTLP with http/protobuf only (not grpc or http/json); set {var}=http/protobuf or unset it, and point the endpoint at the collector's OTLP/HTTP port (usually 4318)")]
    Protocol {
        /// The variable.
        var: &'static str,
        /// What it says.
        value: String,
    },
    /// A traces exporter other than `otlp` or `none`.
    #[error(
        "OTEL_TRACES_EXPORTER={0}: Cairn exports traces with `otlp` only (or not at all: `none`)"
    )]
    Exporter(String),
    /// An endpoint that is not an http(s) URL.
    #[error("{var}={value}: not an http:// or https:// URL")]
    Endpoint {
        /// The variable.
        var: &'static str,
        /// What it says.
        value: String,
    },
    /// A timeout that is not a positive number of milliseconds.
    #[error("{var}={value}: write the timeout in milliseconds, above 0 (e.g. 10000)")]
    Timeout {
        /// The variable.
        var: &'static str,
        /// What it says.
        value: String,
    },
    /// A list entry that is not `key=value`, or a header name or value
    /// HTTP does not allow.
    #[error("{var}: `{entry}` is not a valid key=value pair ({why})")]
    Pair {
        /// The variable.
        var: &'static str,
        /// The entry, as written.
        entry: String,
        /// What is wrong with it.
        why: &'static str,
    },
}

impl OtlpConfig {
    /// The settings from the process's environment; `Ok(None)` when
    /// exporting is off (no endpoint, `OTEL_SDK_DISABLED=true` or
    /// `OTEL_TRACES_EXPORTER=none`).
    pub fn from_env() -> Result<Option<OtlpConfig>, ConfigError> {
        OtlpConfig::from_vars(|k| std::env::var(k).ok())
    }

    /// The settings from variables `get` looks up (empty counts as unset).
    pub fn from_vars(
        get: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<OtlpConfig>, ConfigError> {
        let get = |k: &str| {
            get(k)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        if get("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        if let Some(list) = get("OTEL_TRACES_EXPORTER") {
            let names: Vec<String> = list
                .split(',')
                .map(|n| n.trim().to_ascii_lowercase())
                .filter(|n| !n.is_empty())
                .collect();
            if names.iter().any(|n| n == "none") {
                return Ok(None);
            }
            if names.iter().any(|n| n != "otlp") {
                return Err(ConfigError::Exporter(list));
            }
        }
        let endpoint = match (
            get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
            get("OTEL_EXPORTER_OTLP_ENDPOINT"),
        ) {
            (Some(url), _) => checked_url("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", url)?,
            (None, Some(base)) => {
                let base = checked_url("OTEL_EXPORTER_OTLP_ENDPOINT", base)?;
                format!("{}/v1/traces", base.trim_end_matches('/'))
            }
            (None, None) => return Ok(None),
        };
        for var in [
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ] {
            // The signal's own setting wins; the general one is read only
            // when the signal's is unset.
            if let Some(p) = get(var) {
                if p != PROTOCOL {
                    return Err(ConfigError::Protocol { var, value: p });
                }
                break;
            }
        }
        let headers = match first_set(
            &get,
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
            "OTEL_EXPORTER_OTLP_HEADERS",
        ) {
            Some((var, list)) => {
                let pairs = pairs(var, &list)?;
                for (k, v) in &pairs {
                    // Header values are often secrets: errors name the key.
                    let entry = || format!("{k}=…");
                    if HeaderName::from_bytes(k.as_bytes()).is_err() {
                        return Err(ConfigError::Pair {
                            var,
                            entry: entry(),
                            why: "not a header name",
                        });
                    }
                    if HeaderValue::from_str(v).is_err() {
                        return Err(ConfigError::Pair {
                            var,
                            entry: entry(),
                            why: "not a header value",
                        });
                    }
                }
                pairs
            }
            None => Vec::new(),
        };
        let timeout = match first_set(
            &get,
            "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
            "OTEL_EXPORTER_OTLP_TIMEOUT",
        ) {
            Some((var, ms)) => match ms.parse::<u64>() {
                Ok(n) if n > 0 => Duration::from_millis(n),
                _ => return Err(ConfigError::Timeout { var, value: ms }),
            },
            None => DEFAULT_TIMEOUT,
        };
        let resource = resource(&get)?;
        Ok(Some(OtlpConfig {
            endpoint,
            headers,
            timeout,
            resource,
        }))
    }
}

/// The resource every span is sent under, from the process's environment:
/// `OTEL_RESOURCE_ATTRIBUTES`, with `service.name` first (from
/// `OTEL_SERVICE_NAME`, else those attributes, else `cairn`).
pub fn resource_from_env() -> Result<Vec<(String, String)>, ConfigError> {
    resource(&|k: &str| {
        std::env::var(k)
            .ok()
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    })
}

fn resource(get: &impl Fn(&str) -> Option<String>) -> Result<Vec<(String, String)>, ConfigError> {
    let mut resource = match get("OTEL_RESOURCE_ATTRIBUTES") {
        Some(list) => pairs("OTEL_RESOURCE_ATTRIBUTES", &list)?,
        None => Vec::new(),
    };
    let service = get("OTEL_SERVICE_NAME")
        .or_else(|| {
            resource
                .iter()
                .find(|(k, _)| k == "service.name")
                .map(|(_, v)| v.clone())
        })
        .unwrap_or_else(|| DEFAULT_SERVICE_NAME.to_string());
    resource.retain(|(k, _)| k != "service.name");
    resource.insert(0, ("service.name".into(), service));
    Ok(resource)
}

/// The signal's variable if set, else the general one, with its name.
fn first_set(
    get: &impl Fn(&str) -> Option<String>,
    signal: &'static str,
    general: &'static str,
) -> Option<(&'static str, String)> {
    get(signal)
        .map(|v| (signal, v))
        .or_else(|| get(general).map(|v| (general, v)))
}

fn checked_url(var: &'static str, value: String) -> Result<String, ConfigError> {
    match reqwest::Url::parse(&value) {
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.host_str().is_some() => Ok(value),
        _ => Err(ConfigError::Endpoint { var, value }),
    }
}

/// `key1=value1,key2=value2`, keys and values trimmed and percent-decoded
/// (the W3C Baggage form the specification names).
fn pairs(var: &'static str, list: &str) -> Result<Vec<(String, String)>, ConfigError> {
    let mut out = Vec::new();
    for entry in list.split(',') {
        if entry.trim().is_empty() {
            continue;
        }
        // Values are often secrets: errors show the key only.
        let shown = match entry.split_once('=') {
            Some((k, _)) => format!("{}=…", k.trim()),
            None => entry.trim().to_string(),
        };
        let bad = |why| ConfigError::Pair {
            var,
            entry: shown.clone(),
            why,
        };
        let (k, v) = entry.split_once('=').ok_or_else(|| bad("no `=`"))?;
        let k = percent_decode(k.trim()).ok_or_else(|| bad("bad percent-encoding"))?;
        let v = percent_decode(v.trim()).ok_or_else(|| bad("bad percent-encoding"))?;
        if k.is_empty() {
            return Err(bad("empty key"));
        }
        out.push((k, v));
    }
    Ok(out)
}

/// `%XX` sequences decoded as UTF-8; `None` for a broken sequence or text
/// that is not UTF-8 once decoded.
fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3)?;
            let hex = std::str::from_utf8(hex).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn cfg(vars: &[(&str, &str)]) -> Result<Option<OtlpConfig>, ConfigError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        OtlpConfig::from_vars(|k| map.get(k).cloned())
    }

    #[test]
    fn nothing_set_is_off() {
        assert_eq!(cfg(&[]), Ok(None));
        assert_eq!(cfg(&[("OTEL_SERVICE_NAME", "x")]), Ok(None));
        assert_eq!(cfg(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "  ")]), Ok(None));
    }

    #[test]
    fn endpoints_follow_the_specification() {
        let c = cfg(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://h:4318")])
            .unwrap()
            .unwrap();
        assert_eq!(c.endpoint, "http://h:4318/v1/traces");
        let c = cfg(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://h:4318/base/")])
            .unwrap()
            .unwrap();
        assert_eq!(c.endpoint, "http://h:4318/base/v1/traces");
        // The signal's endpoint is used as it is.
        let c = cfg(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://h:4318"),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "https://t/custom"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(c.endpoint, "https://t/custom");
        assert_eq!(c.timeout, DEFAULT_TIMEOUT);
        assert_eq!(c.resource, vec![("service.name".into(), "cairn".into())]);
        assert!(matches!(
            cfg(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "localhost:4318")]),
            Err(ConfigError::Endpoint { .. })
        ));
    }

    #[test]
    fn disabling_wins() {
        let on = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://h:4318");
        assert_eq!(cfg(&[on, ("OTEL_SDK_DISABLED", "TRUE")]), Ok(None));
        assert_eq!(cfg(&[on, ("OTEL_TRACES_EXPORTER", "none")]), Ok(None));
        assert!(cfg(&[on, ("OTEL_TRACES_EXPORTER", "otlp")])
            .unwrap()
            .is_some());
        assert!(cfg(&[on, ("OTEL_SDK_DISABLED", "false")])
            .unwrap()
            .is_some());
        assert_eq!(
            cfg(&[on, ("OTEL_TRACES_EXPORTER", "zipkin")]),
            Err(ConfigError::Exporter("zipkin".into()))
        );
    }

    #[test]
    fn only_http_protobuf_is_accepted() {
        let on = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://h:4318");
        let e = cfg(&[on, ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")]).unwrap_err();
        assert!(
            e.to_string().contains("OTEL_EXPORTER_OTLP_PROTOCOL=grpc"),
            "{e}"
        );
        assert!(e.to_string().contains("http/protobuf"), "{e}");
        assert!(cfg(&[on, ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")]).is_err());
        assert!(cfg(&[on, ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")])
            .unwrap()
            .is_some());
        // The signal's own setting wins over the general one.
        assert!(cfg(&[
            on,
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf"),
        ])
        .unwrap()
        .is_some());
        assert!(matches!(
            cfg(&[
                on,
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
                ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc"),
            ]),
            Err(ConfigError::Protocol {
                var: "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
                ..
            })
        ));
    }

    #[test]
    fn headers_timeouts_and_resources_are_read() {
        let c = cfg(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://h:4318"),
            (
                "OTEL_EXPORTER_OTLP_HEADERS",
                "api-key=secret%20one , x-tenant=a%3Db,",
            ),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
            (
                "OTEL_RESOURCE_ATTRIBUTES",
                "service.name=ignored,deployment.environment=ci",
            ),
            ("OTEL_SERVICE_NAME", "agents"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            c.headers,
            vec![
                ("api-key".into(), "secret one".into()),
                ("x-tenant".into(), "a=b".into())
            ]
        );
        assert_eq!(c.timeout, Duration::from_millis(2500));
        assert_eq!(
            c.resource,
            vec![
                ("service.name".into(), "agents".into()),
                ("deployment.environment".into(), "ci".into())
            ]
        );
        // The signal's headers and timeout replace the general ones.
        let c = cfg(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://h:4318"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "a=1"),
            ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "b=2"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
            ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "700"),
            ("OTEL_RESOURCE_ATTRIBUTES", "service.name=from-resource"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(c.headers, vec![("b".into(), "2".into())]);
        assert_eq!(c.timeout, Duration::from_millis(700));
        assert_eq!(c.resource[0].1, "from-resource");
        for (var, value) in [
            ("OTEL_EXPORTER_OTLP_HEADERS", "novalue"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "a=%zz"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "bad name=1"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "a=line%0Abreak"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "ten"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "0"),
            ("OTEL_RESOURCE_ATTRIBUTES", "=x"),
        ] {
            let r = cfg(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://h:4318"),
                (var, value),
            ]);
            let e = r.expect_err(value);
            assert!(e.to_string().contains(var), "{e}");
        }
    }
}
