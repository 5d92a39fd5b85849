//! How events, times and values read for people.

use cairn_events::{Event, EventKind};
use serde_json::Value;

/// A duration: `850ms`, `1.24s`, `2m03s`, `1h02m`.
pub fn duration_ms(ms: u64) -> String {
    if ms < 1_000 {
        format!("{ms}ms")
    } else if ms < 60_000 {
        format!("{:.2}s", ms as f64 / 1000.0)
    } else if ms < 3_600_000 {
        format!("{}m{:02}s", ms / 60_000, (ms / 1000) % 60)
    } else {
        format!("{}h{:02}m", ms / 3_600_000, (ms / 60_000) % 60)
    }
}

/// Civil date from days since 1970-01-01 (proleptic Gregorian).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// `2024-05-01 14:03:22Z` (UTC: the store keeps Unix milliseconds).
pub fn datetime_ms(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (y, m, d) = civil(secs.div_euclid(86_400));
    let s = secs.rem_euclid(86_400);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}Z",
        s / 3600,
        (s / 60) % 60,
        s % 60
    )
}

/// `14:03:22.123` (UTC), for event lines where the date rarely changes.
pub fn time_ms(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let s = secs.rem_euclid(86_400);
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        s / 3600,
        (s / 60) % 60,
        s % 60,
        ms.rem_euclid(1000)
    )
}

/// A value on one line, cut to `max` characters.
pub fn short_value(v: &Value, max: usize) -> String {
    let s = match v {
        Value::String(s) => s.trim_end().to_string(),
        other => other.to_string(),
    };
    truncate(&s.replace('\n', "⏎"), max)
}

/// Cuts text to `max` characters, marking the cut.
pub fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(max.saturating_sub(1)).collect();
        t.push('…');
        t
    }
}

/// The node a scoped event concerns, as people read it: `path`, with
/// `#iteration` for loop passes after the first and `@attempt` when known.
pub fn scope_label(ev: &Event) -> String {
    let Some(node) = &ev.scope.node_id else {
        return String::new();
    };
    let mut s = node.to_string();
    if let Some(it) = ev.scope.iteration.filter(|&i| i > 0) {
        s.push_str(&format!("#{it}"));
    }
    if let Some(a) = ev.scope.attempt {
        s.push_str(&format!("@{a}"));
    }
    s
}

/// One event as a line for people: seq, time, type, node and what matters.
pub fn event_line(ev: &Event) -> String {
    let node = scope_label(ev);
    let detail = event_detail(&ev.kind);
    let mut line = format!(
        "{:>5} {} {:<20}",
        ev.seq,
        time_ms(ev.timestamp_ms),
        ev.type_name()
    );
    if !node.is_empty() {
        line.push(' ');
        line.push_str(&node);
    }
    if !detail.is_empty() {
        line.push_str("  ");
        line.push_str(&detail);
    }
    line
}

/// What an event says beyond its type and scope.
pub fn event_detail(kind: &EventKind) -> String {
    match kind {
        EventKind::RunStarted {
            workflow, resumed, ..
        } => format!(
            "workflow {workflow}{}",
            if *resumed { " (resumed)" } else { "" }
        ),
        EventKind::RunStatusChanged { status } => status.as_str().to_string(),
        EventKind::RunFinished {
            duration_ms: d,
            output,
        } => match output {
            Some(o) => format!("in {}; output {}", duration_ms(*d), short_value(o, 80)),
            None => format!("in {}", duration_ms(*d)),
        },
        EventKind::RunFailed { error } => format!("{}: {}", error.kind, error.message),
        EventKind::RunCancelled { reason } => reason.clone().unwrap_or_default(),
        EventKind::RunSummary {
            duration_ms: d,
            nodes,
            ..
        } => format!(
            "{}: {} finished, {} failed, {} skipped, {} cancelled",
            duration_ms(*d),
            nodes.finished,
            nodes.failed,
            nodes.skipped,
            nodes.cancelled
        ),
        EventKind::NodeStarted { snapshot } => snapshot
            .as_deref()
            .map(|s| format!("snapshot={s}"))
            .unwrap_or_default(),
        EventKind::NodeOutput { text, stream } => {
            let stream = serde_json::to_value(stream)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default();
            format!("{stream}: {}", truncate(text.trim_end_matches('\n'), 200))
        }
        EventKind::NodeFinished {
            duration_ms: d,
            output,
            ..
        } => match output {
            Some(o) => format!(
                "in {}; output {}",
                duration_ms(*d),
                short_value(&o.value(), 80)
            ),
            None => format!("in {}", duration_ms(*d)),
        },
        EventKind::NodeFailed {
            error, will_retry, ..
        } => format!(
            "{}: {}{}",
            error.kind,
            error.message,
            if *will_retry { " (will retry)" } else { "" }
        ),
        EventKind::NodeRetrying { delay_ms } => format!("in {}", duration_ms(*delay_ms)),
        EventKind::NodeSkipped { reason } => reason.clone(),
        EventKind::NodeCancelled { reason } => reason.clone().unwrap_or_default(),
        EventKind::ApprovalRequested { message } => message.clone().unwrap_or_default(),
        EventKind::ApprovalGranted { decided_by, note }
        | EventKind::ApprovalDenied { decided_by, note } => {
            let mut s = String::new();
            if let Some(b) = decided_by {
                s.push_str(&format!("by {b}"));
            }
            if let Some(n) = note {
                if !s.is_empty() {
                    s.push_str("; ");
                }
                s.push_str(&format!("note: {n}"));
            }
            s
        }
        other => crate::reload::reload_detail(other).unwrap_or_else(|| generic_detail(other)),
    }
}

/// `key=value` pairs of the event's own fields, for types without a
/// hand-written line.
fn generic_detail(kind: &EventKind) -> String {
    let Ok(Value::Object(map)) = serde_json::to_value(kind) else {
        return String::new();
    };
    map.iter()
        .filter(|(k, _)| k.as_str() != "type")
        .map(|(k, v)| format!("{k}={}", short_value(v, 60)))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_naturally() {
        assert_eq!(duration_ms(850), "850ms");
        assert_eq!(duration_ms(1_240), "1.24s");
        assert_eq!(duration_ms(123_000), "2m03s");
        assert_eq!(duration_ms(3_720_000), "1h02m");
    }

    #[test]
    fn dates_are_utc_civil_dates() {
        assert_eq!(datetime_ms(0), "1970-01-01 00:00:00Z");
        // 2000-02-29 12:34:56 UTC, a leap day.
        assert_eq!(datetime_ms(951_827_696_000), "2000-02-29 12:34:56Z");
        assert_eq!(time_ms(951_827_696_789), "12:34:56.789");
    }

    #[test]
    fn long_values_are_cut() {
        assert_eq!(truncate("abcdef", 4), "abc…");
        assert_eq!(short_value(&serde_json::json!("a\nb"), 10), "a⏎b");
    }
}
