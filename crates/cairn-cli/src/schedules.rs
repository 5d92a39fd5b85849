//! `cairn schedules`: the schedules of a store (`cairn serve --triggers`
//! and `POST /v1/schedules`), listed and acted on through a server
//! (`--server`) or in the store here.
//!
//! Here, only what the store holds can be done: listing, showing,
//! pausing, resuming and deleting. Starting a schedule's run by hand needs
//! the server that has its workflows folder.

use std::io::Write;

use cairn_api::{FireList, FireView, ScheduleList, ScheduleView};
use cairn_server::schedules::{fire_view, view};
use cairn_store::{Cursor, ScheduleRecord};
use serde_json::Value;

use crate::bad_input;
use crate::cli::{Global, ScheduleAction, SchedulesArgs};
use crate::format::datetime_ms;
use crate::store;

/// `cairn schedules`.
pub async fn schedules(g: &Global, a: SchedulesArgs) -> anyhow::Result<u8> {
    match &g.server {
        Some(url) => remote(url, g, a).await,
        None => local(g, a),
    }
}

fn seg(name: &str) -> String {
    // Names are a-z, 0-9, - and _; anything else is refused by the server
    // as an unknown schedule, so it is sent escaped rather than trusted.
    name.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

async fn remote(url: &str, g: &Global, a: SchedulesArgs) -> anyhow::Result<u8> {
    let c = crate::remote::client(url, g)?;
    let err = crate::remote::client_error;
    match a.action {
        None => {
            let v = c.get_json("/v1/schedules").await.map_err(err)?;
            let list: ScheduleList = serde_json::from_value(v)?;
            print_list(&list.schedules, a.json)
        }
        Some(ScheduleAction::Show { name, fires }) => {
            let v = c
                .get_json(&format!("/v1/schedules/{}", seg(&name)))
                .await
                .map_err(err)?;
            let s: ScheduleView = serde_json::from_value(v)?;
            let v = c
                .get_json(&format!("/v1/schedules/{}/fires", seg(&name)))
                .await
                .map_err(err)?;
            let mut h: FireList = serde_json::from_value(v)?;
            h.fires.truncate(fires);
            print_one(&s, &h.fires, a.json)
        }
        Some(ScheduleAction::Pause { name }) => {
            let v = c
                .post_json(
                    &format!("/v1/schedules/{}/pause", seg(&name)),
                    &serde_json::json!({}),
                )
                .await
                .map_err(err)?;
            acted(v, a.json, &format!("paused {name}"))
        }
        Some(ScheduleAction::Resume { name }) => {
            let v = c
                .post_json(
                    &format!("/v1/schedules/{}/resume", seg(&name)),
                    &serde_json::json!({}),
                )
                .await
                .map_err(err)?;
            acted(v, a.json, &format!("resumed {name}"))
        }
        Some(ScheduleAction::Trigger { name }) => {
            let v = c
                .post_json(
                    &format!("/v1/schedules/{}/trigger", seg(&name)),
                    &serde_json::json!({}),
                )
                .await
                .map_err(err)?;
            let fire: FireView = serde_json::from_value(v.clone())?;
            let run = fire.run_id.map(|r| r.to_string()).unwrap_or_default();
            acted(v, a.json, &format!("started {run}"))
        }
        Some(ScheduleAction::Delete { name }) => {
            c.delete(&format!("/v1/schedules/{}", seg(&name)))
                .await
                .map_err(err)?;
            acted(Value::Null, a.json, &format!("deleted {name}"))
        }
    }
}

fn local(g: &Global, a: SchedulesArgs) -> anyhow::Result<u8> {
    if !g.store_exists() {
        if a.action.is_none() {
            return print_list(&[], a.json);
        }
        return Err(bad_input("no store here, so no schedules"));
    }
    let j = store::open(g, false)?;
    let out = local_in(&j, a);
    j.close();
    out
}

fn local_in(j: &cairn_store::Journal, a: SchedulesArgs) -> anyhow::Result<u8> {
    let backend = j.backend();
    let Some(s) = backend.schedules() else {
        return Err(bad_input("this store keeps no schedules"));
    };
    let get = |name: &str| -> anyhow::Result<ScheduleRecord> {
        s.get_schedule(name)?
            .ok_or_else(|| bad_input(format!("no schedule `{name}`")))
    };
    match a.action {
        None => {
            let list: Vec<ScheduleView> = s.list_schedules()?.into_iter().map(view).collect();
            print_list(&list, a.json)
        }
        Some(ScheduleAction::Show { name, fires }) => {
            let rec = get(&name)?;
            let h: Vec<FireView> = s.fires(&name, fires)?.into_iter().map(fire_view).collect();
            print_one(&view(rec), &h, a.json)
        }
        Some(ScheduleAction::Pause { name }) => {
            let rec = get(&name)?;
            if !rec.paused {
                s.set_paused(&name, true, rec.cursor)?;
            }
            acted(
                to_json(view(get(&name)?)),
                a.json,
                &format!("paused {name}"),
            )
        }
        Some(ScheduleAction::Resume { name }) => {
            let rec = get(&name)?;
            if rec.paused {
                let def = cairn_workflow::parse_schedule(
                    &rec.definition.to_string(),
                    std::path::Path::new(&format!("schedule {name}")),
                )?;
                let cursor = Cursor {
                    next_due_ms: def.timing.next_after(now_ms()),
                    pending_due_ms: None,
                };
                s.set_paused(&name, false, cursor)?;
            }
            acted(
                to_json(view(get(&name)?)),
                a.json,
                &format!("resumed {name}"),
            )
        }
        Some(ScheduleAction::Trigger { name }) => Err(bad_input(format!(
            "starting `{name}`'s run needs the server that has its workflows: \
             `cairn schedules trigger {name} --server URL`"
        ))),
        Some(ScheduleAction::Delete { name }) => {
            let rec = get(&name)?;
            if rec.from_file {
                return Err(bad_input(format!(
                    "schedule `{name}` is declared in the server's triggers file; remove it there (or pause it)"
                )));
            }
            s.delete_schedule(&name)?;
            acted(Value::Null, a.json, &format!("deleted {name}"))
        }
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

fn to_json(v: ScheduleView) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

/// When a definition says it is due, in a few words.
fn when(def: &Value) -> String {
    if let Some(c) = def["cron"].as_str() {
        let tz = def["timezone"].as_str().unwrap_or("UTC");
        format!("cron {c} ({tz})")
    } else if let Some(e) = def["every"].as_str() {
        let ms: u64 = e.trim_end_matches("ms").parse().unwrap_or(0);
        if ms.is_multiple_of(1000) {
            format!("every {}s", ms / 1000)
        } else {
            format!("every {e}")
        }
    } else {
        "?".into()
    }
}

fn print_list(list: &[ScheduleView], json: bool) -> anyhow::Result<u8> {
    let mut out = std::io::stdout().lock();
    if json {
        writeln!(
            out,
            "{}",
            serde_json::to_string(&ScheduleList {
                schedules: list.to_vec()
            })?
        )?;
        return Ok(crate::EXIT_OK);
    }
    if list.is_empty() {
        writeln!(out, "no schedules")?;
        return Ok(crate::EXIT_OK);
    }
    writeln!(
        out,
        "{:<24} {:<20} {:<32} {:<8} {:<21} LAST RUN",
        "NAME", "WORKFLOW", "WHEN", "STATE", "NEXT"
    )?;
    for s in list {
        writeln!(
            out,
            "{:<24} {:<20} {:<32} {:<8} {:<21} {}",
            s.name,
            s.definition["workflow"].as_str().unwrap_or(""),
            when(&s.definition),
            if s.paused { "paused" } else { "active" },
            s.next_due_ms.map_or_else(|| "-".into(), datetime_ms),
            s.last_run_id.as_ref().map_or("-", |r| r.as_str()),
        )?;
    }
    Ok(crate::EXIT_OK)
}

fn print_one(s: &ScheduleView, fires: &[FireView], json: bool) -> anyhow::Result<u8> {
    let mut out = std::io::stdout().lock();
    if json {
        let v = serde_json::json!({"schedule": s, "fires": fires});
        writeln!(out, "{v}")?;
        return Ok(crate::EXIT_OK);
    }
    writeln!(
        out,
        "{} ({})",
        s.name,
        if s.from_file { "triggers file" } else { "API" }
    )?;
    writeln!(
        out,
        "  workflow  {}",
        s.definition["workflow"].as_str().unwrap_or("")
    )?;
    writeln!(out, "  when      {}", when(&s.definition))?;
    for key in ["overlap", "catchup", "catchup_limit", "grace"] {
        if let Some(v) = s.definition.get(key) {
            let text = v.as_str().map_or_else(|| v.to_string(), str::to_string);
            writeln!(out, "  {key:<9} {text}")?;
        }
    }
    if let Some(input) = s.definition.get("input") {
        writeln!(out, "  input     {input}")?;
    }
    writeln!(
        out,
        "  state     {}",
        if s.paused { "paused" } else { "active" }
    )?;
    if let Some(n) = s.next_due_ms {
        writeln!(out, "  next      {}", datetime_ms(n))?;
    }
    if let Some(p) = s.pending_due_ms {
        writeln!(
            out,
            "  waiting   {} (for the going run to end)",
            datetime_ms(p)
        )?;
    }
    if fires.is_empty() {
        writeln!(out, "  no fires yet")?;
        return Ok(crate::EXIT_OK);
    }
    writeln!(out, "  {:<21} {:<8} {:<40} DETAIL", "DUE", "OUTCOME", "RUN")?;
    for f in fires {
        writeln!(
            out,
            "  {:<21} {:<8} {:<40} {}",
            datetime_ms(f.due_ms),
            f.outcome,
            f.run_id.as_ref().map_or("-", |r| r.as_str()),
            f.detail.as_deref().unwrap_or(""),
        )?;
    }
    Ok(crate::EXIT_OK)
}

fn acted(v: Value, json: bool, said: &str) -> anyhow::Result<u8> {
    let mut out = std::io::stdout().lock();
    if json {
        writeln!(out, "{v}")?;
    } else {
        writeln!(out, "{said}")?;
    }
    Ok(crate::EXIT_OK)
}
