//! Webhooks: `POST /v1/hooks/{name}` starts the hook's workflow with the
//! delivery's body, once its signature is checked.
//!
//! Checks come before anything is read as JSON or stored, cheapest first:
//! the size, the signature (HMAC-SHA256 of what the hook says is signed,
//! compared in constant time), the signed timestamp against the clock
//! (a replay of an old delivery), then the body as JSON. A redelivery of
//! the same event (its idempotency key) finds the run the first delivery
//! started: the run's id is made from the hook and the key, so that two
//! deliveries at once, on two instances, start one run.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine as _;
use cairn_api::HookAccepted;
use cairn_events::{RunId, Trigger, TriggerKind};
use cairn_workflow::triggers::{HookDef, Idempotency, SigEncoding};
use cairn_workflow::SecretSource;
use hmac::{Hmac, KeyInit, Mac};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::api::{blocking, AppState};
use crate::error::ApiError;

/// Longest idempotency key kept (in `RunStarted.trigger.deliveryId`).
const MAX_KEY: usize = 256;
/// Most bytes of a hook's secret read from a file.
const MAX_SECRET_BYTES: u64 = 64 * 1024;

/// A hook ready to take deliveries: its definition and its secret's value.
pub(crate) struct Hook {
    def: HookDef,
    secret: Option<Vec<u8>>,
}

/// The server's hooks, by name, and what their deliveries came to.
#[derive(Default)]
pub(crate) struct Hooks {
    by_name: HashMap<String, Hook>,
    counts: Mutex<BTreeMap<(String, &'static str), u64>>,
}

/// Why a hook cannot be set up (a secret that cannot be read).
#[derive(Debug, thiserror::Error)]
#[error("hook `{hook}`: its secret ({from}) cannot be read: {reason}")]
pub struct HookSetupError {
    hook: String,
    from: String,
    reason: String,
}

impl Hooks {
    /// Reads every hook's secret now, so that a server whose hook cannot
    /// check signatures refuses to start rather than refusing deliveries.
    pub(crate) fn new(defs: &[HookDef], base: &std::path::Path) -> Result<Hooks, HookSetupError> {
        let mut by_name = HashMap::new();
        for def in defs {
            let secret = match &def.secret {
                None => None,
                Some(src) => Some(read_secret(src, base).map_err(|reason| HookSetupError {
                    hook: def.name.clone(),
                    from: src.to_string(),
                    reason,
                })?),
            };
            by_name.insert(
                def.name.clone(),
                Hook {
                    def: def.clone(),
                    secret,
                },
            );
        }
        Ok(Hooks {
            by_name,
            counts: Mutex::default(),
        })
    }

    fn count(&self, hook: &str, outcome: &'static str) {
        // An unknown name is the sender's text: one label for all of them.
        let hook = if self.by_name.contains_key(hook) {
            hook
        } else {
            ""
        };
        let mut m = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        *m.entry((hook.to_string(), outcome)).or_default() += 1;
    }

    /// The counters in Prometheus' text form.
    pub(crate) fn render(&self) -> String {
        let m = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = String::from(
            "# HELP cairn_hook_deliveries_total Webhook deliveries to this instance, by hook (empty: no such hook) and what came of them.\n\
             # TYPE cairn_hook_deliveries_total counter\n",
        );
        for ((h, o), n) in m.iter() {
            out.push_str(&format!(
                "cairn_hook_deliveries_total{{hook=\"{h}\",outcome=\"{o}\"}} {n}\n"
            ));
        }
        out
    }
}

fn read_secret(src: &SecretSource, base: &std::path::Path) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let mut value = match src {
        SecretSource::Env(name) => std::env::var(name)
            .map_err(|_| format!("the environment has no `{name}`"))?
            .into_bytes(),
        SecretSource::File(path) => {
            let path = base.join(path);
            let f = std::fs::File::open(&path).map_err(|e| e.to_string())?;
            let mut buf = Vec::new();
            f.take(MAX_SECRET_BYTES + 1)
                .read_to_end(&mut buf)
                .map_err(|e| e.to_string())?;
            if buf.len() as u64 > MAX_SECRET_BYTES {
                return Err(format!("larger than {MAX_SECRET_BYTES} bytes"));
            }
            buf
        }
        SecretSource::Command(_) => return Err("a hook's secret is `env` or `file`".into()),
    };
    if value.last() == Some(&b'\n') {
        value.pop();
    }
    if value.is_empty() {
        return Err("it is empty".into());
    }
    Ok(value)
}

/// A refusal, counted under `outcome`.
fn refuse(
    hooks: &Hooks,
    hook: &str,
    outcome: &'static str,
    status: StatusCode,
    message: impl Into<String>,
) -> ApiError {
    hooks.count(hook, outcome);
    ApiError::new(status, outcome, message)
}

fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// Whether one of `given` is the HMAC of `payload` under `secret`.
fn signed(secret: &[u8], payload: &[u8], given: &[String], encoding: SigEncoding) -> bool {
    given.iter().any(|sig| {
        let bytes = match encoding {
            SigEncoding::Hex => hex_decode(sig.trim()),
            SigEncoding::Base64 => base64::engine::general_purpose::STANDARD
                .decode(sig.trim())
                .ok(),
        };
        let Some(bytes) = bytes else { return false };
        let mut mac =
            Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes keys of any length");
        mac.update(payload);
        // Constant time: the comparison tells nothing of how close a guess was.
        mac.verify_slice(&bytes).is_ok()
    })
}

fn hex_decode(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || s.len() > 256 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// The run a delivery starts: one per hook and idempotency key.
fn delivery_run_id(hook: &str, key: &str) -> RunId {
    let digest = Sha256::digest(key.as_bytes());
    let hex: String = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
    RunId::parse(&format!("hook-{hook}-{hex}")).expect("hook names make run ids")
}

/// `POST /v1/hooks/{name}`.
pub(crate) async fn deliver(
    State(state): State<AppState>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let hooks = state.hooks();
    let Some(hook) = hooks.by_name.get(&name) else {
        return Err(refuse(
            hooks,
            &name,
            "unknown_hook",
            StatusCode::NOT_FOUND,
            "no such hook".to_string(),
        ));
    };
    if state.draining() {
        return Err(refuse(
            hooks,
            &name,
            "shutting_down",
            StatusCode::SERVICE_UNAVAILABLE,
            "the server is stopping and takes no new runs; deliver again",
        ));
    }
    let def = &hook.def;
    let max = def.max_body as usize;
    if headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
        .is_some_and(|n| n > def.max_body)
    {
        return Err(too_large(hooks, &name, def.max_body));
    }
    let body = match axum::body::to_bytes(body, max).await {
        Ok(b) => b,
        Err(_) => return Err(too_large(hooks, &name, def.max_body)),
    };
    let header = |h: &str| headers.get(h).and_then(|v| v.to_str().ok());
    if let Some(secret) = &hook.secret {
        let sig = &def.signature;
        let Some(value) = header(&sig.header) else {
            return Err(refuse(
                hooks,
                &name,
                "unsigned",
                StatusCode::UNAUTHORIZED,
                format!("the delivery has no `{}` header", sig.header),
            ));
        };
        let (given, in_header) = sig.read_header(value);
        let ts = in_header.or_else(|| {
            sig.timestamp_header
                .as_deref()
                .and_then(header)
                .map(str::to_string)
        });
        if sig.has_timestamp() && ts.is_none() {
            return Err(refuse(
                hooks,
                &name,
                "unsigned",
                StatusCode::UNAUTHORIZED,
                "the delivery's signature has no timestamp",
            ));
        }
        let payload = sig.payload_bytes(&body, ts.as_deref());
        if given.is_empty() || !signed(secret, &payload, &given, sig.encoding) {
            return Err(refuse(
                hooks,
                &name,
                "bad_signature",
                StatusCode::UNAUTHORIZED,
                format!("the `{}` header does not sign this delivery", sig.header),
            ));
        }
        // Only a signed timestamp is trusted, so this check comes after.
        if let Some(ts) = ts {
            let Ok(at) = ts.trim().parse::<i64>() else {
                return Err(refuse(
                    hooks,
                    &name,
                    "bad_signature",
                    StatusCode::UNAUTHORIZED,
                    "the signed timestamp is not a Unix time in seconds",
                ));
            };
            let off = (now_secs() - at).unsigned_abs();
            if off > sig.tolerance.as_secs() {
                return Err(refuse(
                    hooks,
                    &name,
                    "replayed",
                    StatusCode::UNAUTHORIZED,
                    format!(
                        "the delivery was signed {off} s away from now, more than the {} s allowed: a replay, or a clock off",
                        sig.tolerance.as_secs()
                    ),
                ));
            }
        }
    }
    let parsed: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            return Err(refuse(
                hooks,
                &name,
                "malformed",
                StatusCode::BAD_REQUEST,
                format!("the body is not JSON: {e}"),
            ))
        }
    };
    if cairn_workflow::check_depth(&parsed).is_err() {
        return Err(refuse(
            hooks,
            &name,
            "malformed",
            StatusCode::BAD_REQUEST,
            "the body is nested too deep",
        ));
    }
    let key = match &def.idempotency {
        None => None,
        Some(Idempotency::Header(h)) => Some(header(h).map(str::to_string)),
        Some(Idempotency::Field(p)) => Some(parsed.pointer(p).and_then(|v| match v {
            Value::String(s) => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        })),
    };
    let key = match key {
        None => None,
        Some(Some(k)) if !k.is_empty() && k.len() <= MAX_KEY => Some(k),
        Some(_) => {
            return Err(refuse(
                hooks,
                &name,
                "malformed",
                StatusCode::BAD_REQUEST,
                format!(
                    "the delivery has no idempotency key ({}), or one longer than {MAX_KEY} bytes",
                    match &def.idempotency {
                        Some(Idempotency::Header(h)) => format!("header `{h}`"),
                        Some(Idempotency::Field(p)) => format!("field `{p}`"),
                        None => String::new(),
                    }
                ),
            ))
        }
    };
    let run_id = match &key {
        Some(k) => delivery_run_id(&name, k),
        None => cairn_engine::new_run_id(),
    };
    // A redelivery: the first one's run.
    if key.is_some() {
        let (st, id) = (state.clone(), run_id.clone());
        let seen = blocking(move || Ok(st.journal().backend().get_run(&id)?.is_some())).await?;
        if seen {
            hooks.count(&name, "duplicate");
            return Ok(duplicate(run_id));
        }
    }
    let input = match &def.input {
        None => parsed,
        Some(template) => {
            let lower: serde_json::Map<String, Value> = headers
                .iter()
                .filter_map(|(k, v)| Some((k.as_str().to_string(), json!(v.to_str().ok()?))))
                .collect();
            let ctx = json!({"body": parsed, "headers": lower});
            match cairn_workflow::Templates::new().render_value(template, &ctx) {
                Ok(v) => v,
                Err(e) => {
                    return Err(refuse(
                        hooks,
                        &name,
                        "malformed",
                        StatusCode::UNPROCESSABLE_ENTITY,
                        format!("the hook's input could not be made from this body: {e}"),
                    ))
                }
            }
        }
    };
    let dir = state.cfg().workflows_dir.clone();
    let max_wf = state.cfg().max_workflow_bytes;
    let wf_name = def.workflow.clone();
    let wf = blocking(move || crate::workflows::load(dir.as_deref(), &wf_name, max_wf)).await?;
    let opts = cairn_engine::StartOptions {
        run_id: Some(run_id.clone()),
        trigger: Some(Trigger {
            kind: TriggerKind::Webhook,
            name: name.clone(),
            due_ms: None,
            delivery_id: key.clone(),
        }),
        ..Default::default()
    };
    match state.engine().submit(wf, input, opts).await {
        Ok(_) => {
            hooks.count(&name, "started");
            Ok((
                StatusCode::CREATED,
                Json(HookAccepted {
                    run_id,
                    duplicate: false,
                }),
            )
                .into_response())
        }
        // The same event delivered twice at once: the other started it.
        Err(cairn_engine::EngineError::Store(cairn_store::StoreError::RunExists(_))) => {
            hooks.count(&name, "duplicate");
            Ok(duplicate(run_id))
        }
        Err(e) => {
            hooks.count(&name, "failed");
            Err(e.into())
        }
    }
}

fn duplicate(run_id: RunId) -> Response {
    (
        StatusCode::OK,
        Json(HookAccepted {
            run_id,
            duplicate: true,
        }),
    )
        .into_response()
}

fn too_large(hooks: &Hooks, name: &str, max: u64) -> ApiError {
    refuse(
        hooks,
        name,
        "oversized",
        StatusCode::PAYLOAD_TOO_LARGE,
        format!("the body is larger than the hook's {max} bytes"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_are_checked_in_hex_and_base64() {
        let mut mac = Hmac::<Sha256>::new_from_slice(b"s3cret").unwrap();
        mac.update(b"{}");
        let raw = mac.finalize().into_bytes();
        let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        let b64 = base64::engine::general_purpose::STANDARD.encode(raw);
        assert!(signed(
            b"s3cret",
            b"{}",
            std::slice::from_ref(&hex),
            SigEncoding::Hex
        ));
        assert!(signed(
            b"s3cret",
            b"{}",
            &["zz".into(), hex.to_uppercase()],
            SigEncoding::Hex
        ));
        assert!(signed(b"s3cret", b"{}", &[b64], SigEncoding::Base64));
        assert!(!signed(
            b"other",
            b"{}",
            std::slice::from_ref(&hex),
            SigEncoding::Hex
        ));
        assert!(!signed(b"s3cret", b"{ }", &[hex], SigEncoding::Hex));
        assert!(!signed(
            b"s3cret",
            b"{}",
            &["not hex".into()],
            SigEncoding::Hex
        ));
    }

    #[test]
    fn a_delivery_key_makes_one_run_id() {
        assert_eq!(delivery_run_id("gh", "a"), delivery_run_id("gh", "a"));
        assert_ne!(delivery_run_id("gh", "a"), delivery_run_id("gh", "b"));
        assert_ne!(delivery_run_id("gh", "a"), delivery_run_id("gl", "a"));
    }
}
