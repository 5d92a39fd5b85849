//! What starts runs without a person: the schedules and webhooks of
//! `cairn serve` (`--triggers FILE`, and schedules created through the
//! API), as definitions checked like a workflow file (file, line, field).
//!
//! This module only says what a trigger is and when a schedule is due;
//! firing, storing and verifying deliveries belong to the server.

use std::str::FromStr;
use std::time::Duration;

use serde_json::{json, Value};

use crate::model::SecretSource;

/// Most schedules or hooks in one triggers file.
pub const MAX_TRIGGERS: usize = 1000;
/// How late a due time may be and still count as on time, unless a
/// schedule says otherwise.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(60);
/// Most missed due times `catchup: all` fires after downtime, unless a
/// schedule says otherwise.
pub const DEFAULT_CATCHUP_LIMIT: u32 = 10;
/// The ceiling on `catchup_limit`.
pub const MAX_CATCHUP_LIMIT: u32 = 1000;
/// The shortest `every`.
pub const MIN_EVERY: Duration = Duration::from_secs(1);
/// The largest body a hook takes, unless it says otherwise.
pub const DEFAULT_MAX_BODY: u64 = 1024 * 1024;
/// The ceiling on a hook's `max_body`.
pub const MAX_MAX_BODY: u64 = 16 * 1024 * 1024;
/// How far a signed timestamp may be from the server's clock, unless a
/// hook says otherwise.
pub const DEFAULT_TOLERANCE: Duration = Duration::from_secs(300);

/// A triggers file, read.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Triggers {
    /// Its schedules, in file order.
    pub schedules: Vec<ScheduleDef>,
    /// Its webhooks, in file order.
    pub hooks: Vec<HookDef>,
}

/// One schedule: a workflow started at due times.
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduleDef {
    /// Its name: lower-case letters, digits, `-` and `_`.
    pub name: String,
    /// The workflow's name in the server's `--workflows` folder.
    pub workflow: String,
    /// When it is due.
    pub timing: Timing,
    /// The run's input; its strings are templates over `schedule`
    /// (`name`, `dueMs`, `due`).
    pub input: Option<Value>,
    /// What a due time does while a run it started is still going.
    pub overlap: Overlap,
    /// What due times missed while no instance ran do.
    pub catchup: Catchup,
    /// Most missed due times `catchup: all` fires.
    pub catchup_limit: u32,
    /// How late a due time may be found and still be on time.
    pub grace: Duration,
}

/// When a schedule is due.
#[derive(Debug, Clone)]
pub enum Timing {
    /// A cron expression (seconds optional) in a time zone.
    Cron {
        /// As written.
        expr: String,
        /// As the cron crate reads it (seconds first).
        schedule: Box<cron::Schedule>,
        /// An IANA name (`Europe/Paris`) or `UTC`.
        timezone: chrono_tz::Tz,
    },
    /// A fixed interval, due at whole multiples of it since the Unix epoch
    /// (so every instance agrees on the due times).
    Every(Duration),
}

impl PartialEq for Timing {
    fn eq(&self, other: &Timing) -> bool {
        match (self, other) {
            (
                Timing::Cron {
                    expr: a,
                    timezone: ta,
                    ..
                },
                Timing::Cron {
                    expr: b,
                    timezone: tb,
                    ..
                },
            ) => a == b && ta == tb,
            (Timing::Every(a), Timing::Every(b)) => a == b,
            _ => false,
        }
    }
}

/// What a due time does while a run the schedule started is still going.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overlap {
    /// Nothing: the due time is recorded as skipped.
    Skip,
    /// One run waits for the going one to end; more due times meanwhile
    /// are skipped.
    QueueOne,
    /// Another run starts beside it.
    Allow,
}

/// What due times missed while no instance ran do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Catchup {
    /// None of them fires.
    Skip,
    /// The latest of them fires, once.
    Once,
    /// Each fires, oldest first, up to `catchup_limit`.
    All,
}

impl Overlap {
    /// Its name in a triggers file.
    pub fn as_str(self) -> &'static str {
        match self {
            Overlap::Skip => "skip",
            Overlap::QueueOne => "queue_one",
            Overlap::Allow => "allow",
        }
    }
}

impl Catchup {
    /// Its name in a triggers file.
    pub fn as_str(self) -> &'static str {
        match self {
            Catchup::Skip => "skip",
            Catchup::Once => "once",
            Catchup::All => "all",
        }
    }
}

impl Timing {
    /// Reads a cron expression of 5 fields (minute first), 6 (second
    /// first) or 7 (and a year). Days of the week are 0–7 or names, 0 and
    /// 7 both Sunday, as in crontab.
    pub fn cron(expr: &str, timezone: &str) -> Result<Timing, String> {
        let tz = chrono_tz::Tz::from_str(timezone).map_err(|_| {
            format!("`{timezone}` is not a time zone (an IANA name such as Europe/Paris, or UTC)")
        })?;
        let fields: Vec<&str> = expr.split_whitespace().collect();
        let mut fields: Vec<String> = match fields.len() {
            5 => std::iter::once("0")
                .chain(fields.iter().copied())
                .map(String::from)
                .collect(),
            6 | 7 => fields.iter().map(|s| s.to_string()).collect(),
            n => {
                return Err(format!(
                    "`{expr}` has {n} fields; a cron expression has 5 (minute hour day month weekday), 6 (seconds first) or 7 (and a year)"
                ))
            }
        };
        fields[5] = weekdays_as_names(&fields[5]);
        let schedule = cron::Schedule::from_str(&fields.join(" "))
            .map_err(|e| format!("`{expr}` is not a cron expression: {e}"))?;
        if schedule.upcoming(tz).next().is_none() {
            return Err(format!("`{expr}` is never due again"));
        }
        Ok(Timing::Cron {
            expr: expr.to_string(),
            schedule: Box::new(schedule),
            timezone: tz,
        })
    }

    /// The first due time strictly after `after_ms` (Unix ms), if any.
    pub fn next_after(&self, after_ms: i64) -> Option<i64> {
        match self {
            Timing::Every(every) => {
                let step = every.as_millis().max(1) as i64;
                Some((after_ms.div_euclid(step) + 1) * step)
            }
            Timing::Cron {
                schedule, timezone, ..
            } => {
                use chrono::TimeZone;
                let at = timezone.timestamp_millis_opt(after_ms).single()?;
                schedule.after(&at).next().map(|d| d.timestamp_millis())
            }
        }
    }
}

/// Crontab's weekday numbers (0–7, Sunday both ends) as the names the
/// cron crate reads unambiguously (it counts Sunday as 1). Steps (`/2`)
/// are left as numbers.
fn weekdays_as_names(field: &str) -> String {
    const NAMES: [&str; 8] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT", "SUN"];
    field
        .split(',')
        .map(|part| {
            let (range, step) = match part.split_once('/') {
                Some((r, s)) => (r, Some(s)),
                None => (part, None),
            };
            let range = range
                .split('-')
                .map(|d| match d.parse::<usize>() {
                    Ok(n) if n < NAMES.len() => NAMES[n].to_string(),
                    _ => d.to_string(),
                })
                .collect::<Vec<_>>()
                .join("-");
            match step {
                Some(s) => format!("{range}/{s}"),
                None => range,
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

impl ScheduleDef {
    /// The definition as a triggers file or the API writes it: what the
    /// store keeps and [`crate::parse_schedule`] reads back.
    pub fn to_json(&self) -> Value {
        let mut v = json!({
            "name": self.name,
            "workflow": self.workflow,
            "overlap": self.overlap.as_str(),
            "catchup": self.catchup.as_str(),
            "catchup_limit": self.catchup_limit,
            "grace": format!("{}ms", self.grace.as_millis()),
        });
        match &self.timing {
            Timing::Cron { expr, timezone, .. } => {
                v["cron"] = json!(expr);
                v["timezone"] = json!(timezone.name());
            }
            Timing::Every(d) => v["every"] = json!(format!("{}ms", d.as_millis())),
        }
        if let Some(input) = &self.input {
            v["input"] = input.clone();
        }
        v
    }
}

/// One webhook: `POST /v1/hooks/{name}` starts its workflow.
#[derive(Debug, Clone, PartialEq)]
pub struct HookDef {
    /// Its name, the last segment of its address.
    pub name: String,
    /// The workflow's name in the server's `--workflows` folder.
    pub workflow: String,
    /// The signing secret; `None` only with `unsigned: true`.
    pub secret: Option<SecretSource>,
    /// Where the signature is and what it signs.
    pub signature: SignatureDef,
    /// What tells a redelivery from a new event.
    pub idempotency: Option<Idempotency>,
    /// The run's input; its strings are templates over `body` and
    /// `headers` (lower-case names). Absent: the body itself.
    pub input: Option<Value>,
    /// The largest body taken, in bytes.
    pub max_body: u64,
}

/// Where a hook's signature is and what it signs.
#[derive(Debug, Clone, PartialEq)]
pub struct SignatureDef {
    /// The header that carries it (`X-Hub-Signature-256`).
    pub header: String,
    /// The header's form: comma-separated parts, each a literal prefix
    /// and `{signature}` or `{timestamp}` (`sha256={signature}`,
    /// `t={timestamp},v1={signature}`).
    pub format: Vec<(String, SigPart)>,
    /// What the HMAC covers: `{body}` and optionally `{timestamp}` with
    /// literal text between (`{timestamp}.{body}`).
    pub payload: String,
    /// How the signature is written.
    pub encoding: SigEncoding,
    /// A header that carries the timestamp, when the signature's header
    /// does not.
    pub timestamp_header: Option<String>,
    /// How far the signed timestamp may be from the server's clock.
    pub tolerance: Duration,
}

/// A part of a signature header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SigPart {
    /// The HMAC.
    Signature,
    /// The Unix time (seconds) it was signed at.
    Timestamp,
}

/// How a signature is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SigEncoding {
    /// Lower- or upper-case hexadecimal.
    Hex,
    /// Standard base64.
    Base64,
}

/// What tells a redelivery from a new event.
#[derive(Debug, Clone, PartialEq)]
pub enum Idempotency {
    /// A request header (`X-GitHub-Delivery`).
    Header(String),
    /// A JSON pointer into the body (`/id`).
    Field(String),
}

impl SignatureDef {
    /// GitHub's: `X-Hub-Signature-256: sha256=<hex of HMAC(body)>`.
    pub fn github() -> SignatureDef {
        SignatureDef {
            header: "X-Hub-Signature-256".into(),
            format: vec![("sha256=".into(), SigPart::Signature)],
            payload: "{body}".into(),
            encoding: SigEncoding::Hex,
            timestamp_header: None,
            tolerance: DEFAULT_TOLERANCE,
        }
    }

    /// Whether a timestamp is signed (and so checked against the clock).
    pub fn has_timestamp(&self) -> bool {
        self.timestamp_header.is_some() || self.format.iter().any(|(_, p)| *p == SigPart::Timestamp)
    }

    /// The signatures and the timestamp a header's value carries, by
    /// [`SignatureDef::format`]: a sender may give several signatures (a
    /// secret being rotated), any of which may match.
    pub fn read_header(&self, value: &str) -> (Vec<String>, Option<String>) {
        let mut sigs = Vec::new();
        let mut ts = None;
        let parts: Vec<&str> = if self.format.len() == 1 {
            vec![value]
        } else {
            value.split(',').collect()
        };
        for raw in parts {
            let raw = raw.trim();
            // Longest prefix first, so `v1=` is not taken for `v=`.
            let mut best: Option<(&str, SigPart)> = None;
            for (prefix, part) in &self.format {
                if raw.starts_with(prefix.as_str())
                    && best.is_none_or(|(p, _)| p.len() < prefix.len())
                {
                    best = Some((prefix, *part));
                }
            }
            if let Some((prefix, part)) = best {
                let rest = raw[prefix.len()..].to_string();
                match part {
                    SigPart::Signature => sigs.push(rest),
                    SigPart::Timestamp => ts = Some(rest),
                }
            }
        }
        (sigs, ts)
    }

    /// The bytes the HMAC covers, by [`SignatureDef::payload`].
    pub fn payload_bytes(&self, body: &[u8], timestamp: Option<&str>) -> Vec<u8> {
        let mut out = Vec::with_capacity(body.len() + 32);
        let mut rest = self.payload.as_str();
        while !rest.is_empty() {
            if let Some(r) = rest.strip_prefix("{body}") {
                out.extend_from_slice(body);
                rest = r;
            } else if let Some(r) = rest.strip_prefix("{timestamp}") {
                out.extend_from_slice(timestamp.unwrap_or("").as_bytes());
                rest = r;
            } else {
                let c = rest.chars().next().expect("not empty");
                let mut buf = [0; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                rest = &rest[c.len_utf8()..];
            }
        }
        out
    }
}

/// Reads a signature header's format (`sha256={signature}`,
/// `t={timestamp},v1={signature}`).
pub(crate) fn parse_sig_format(s: &str) -> Result<Vec<(String, SigPart)>, String> {
    let mut out = Vec::new();
    let parts: Vec<&str> = s.split(',').collect();
    for p in &parts {
        let (prefix, part) = if let Some(pre) = p.strip_suffix("{signature}") {
            (pre, SigPart::Signature)
        } else if let Some(pre) = p.strip_suffix("{timestamp}") {
            (pre, SigPart::Timestamp)
        } else {
            return Err(format!("`{p}` must end in {{signature}} or {{timestamp}}"));
        };
        if prefix.contains('{') || prefix.contains('}') {
            return Err(format!("`{p}`: one placeholder per part"));
        }
        if parts.len() > 1 && prefix.is_empty() {
            return Err(format!(
                "`{p}`: with several parts each needs a prefix to be told apart (`t=`, `v1=`)"
            ));
        }
        out.push((prefix.trim().to_string(), part));
    }
    let count = |x: SigPart| out.iter().filter(|(_, p)| *p == x).count();
    if count(SigPart::Signature) != 1 {
        return Err("the format needs exactly one {signature}".into());
    }
    if count(SigPart::Timestamp) > 1 {
        return Err("the format has more than one {timestamp}".into());
    }
    Ok(out)
}

/// Whether `s` can name a schedule or a hook.
pub fn is_trigger_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(s: &str) -> i64 {
        chrono::DateTime::parse_from_rfc3339(s)
            .unwrap()
            .timestamp_millis()
    }

    #[test]
    fn every_is_due_on_multiples_since_the_epoch() {
        let t = Timing::Every(Duration::from_secs(30));
        assert_eq!(t.next_after(0), Some(30_000));
        assert_eq!(t.next_after(29_999), Some(30_000));
        assert_eq!(t.next_after(30_000), Some(60_000));
    }

    #[test]
    fn cron_has_seconds_weekdays_as_crontab_and_time_zones() {
        // Five fields: minute first, at second 0.
        let t = Timing::cron("30 9 * * *", "UTC").unwrap();
        assert_eq!(
            t.next_after(ms("2026-03-02T09:00:00Z")),
            Some(ms("2026-03-02T09:30:00Z"))
        );
        // Strictly after.
        assert_eq!(
            t.next_after(ms("2026-03-02T09:30:00Z")),
            Some(ms("2026-03-03T09:30:00Z"))
        );
        // Six fields: every 5 seconds.
        let t = Timing::cron("*/5 * * * * *", "UTC").unwrap();
        assert_eq!(
            t.next_after(ms("2026-03-02T09:00:01Z")),
            Some(ms("2026-03-02T09:00:05Z"))
        );
        // Weekday 1 is Monday and 0 Sunday, as in crontab. 2026-03-01 is a Sunday.
        let mon = Timing::cron("0 9 * * 1", "UTC").unwrap();
        assert_eq!(
            mon.next_after(ms("2026-03-01T00:00:00Z")),
            Some(ms("2026-03-02T09:00:00Z"))
        );
        let sun = Timing::cron("0 9 * * 0", "UTC").unwrap();
        assert_eq!(
            sun.next_after(ms("2026-03-01T00:00:00Z")),
            Some(ms("2026-03-01T09:00:00Z"))
        );
        let weekdays = Timing::cron("0 9 * * 1-5", "UTC").unwrap();
        assert_eq!(
            weekdays.next_after(ms("2026-02-28T10:00:00Z")),
            Some(ms("2026-03-02T09:00:00Z"))
        );
        // In Paris' time: 09:00 there is 08:00 UTC in winter, 07:00 in summer.
        let paris = Timing::cron("0 9 * * *", "Europe/Paris").unwrap();
        assert_eq!(
            paris.next_after(ms("2026-01-10T00:00:00Z")),
            Some(ms("2026-01-10T08:00:00Z"))
        );
        assert_eq!(
            paris.next_after(ms("2026-07-10T00:00:00Z")),
            Some(ms("2026-07-10T07:00:00Z"))
        );
    }

    #[test]
    fn bad_cron_says_why() {
        assert!(Timing::cron("* * *", "UTC")
            .unwrap_err()
            .contains("3 fields"));
        assert!(Timing::cron("61 * * * *", "UTC").is_err());
        assert!(Timing::cron("* * * * *", "Mars/Olympus")
            .unwrap_err()
            .contains("time zone"));
    }

    #[test]
    fn signature_headers_in_github_and_stripe_style() {
        let gh = SignatureDef::github();
        assert_eq!(gh.read_header("sha256=abc"), (vec!["abc".into()], None));
        assert_eq!(gh.read_header("sha1=abc").0, Vec::<String>::new());
        let stripe = SignatureDef {
            header: "Stripe-Signature".into(),
            format: parse_sig_format("t={timestamp},v1={signature}").unwrap(),
            payload: "{timestamp}.{body}".into(),
            ..SignatureDef::github()
        };
        assert_eq!(
            stripe.read_header("t=1492774577,v1=aa,v0=zz,v1=bb"),
            (vec!["aa".into(), "bb".into()], Some("1492774577".into()))
        );
        assert_eq!(stripe.payload_bytes(b"{}", Some("12")), b"12.{}".to_vec());
        assert!(parse_sig_format("{timestamp},{signature}").is_err());
        assert!(parse_sig_format("sha256=").is_err());
        assert!(parse_sig_format("a={signature},b={signature}").is_err());
    }
}
