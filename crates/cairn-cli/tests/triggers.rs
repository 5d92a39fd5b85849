//! Schedules and webhooks through the real binary (`cairn serve
//! --triggers`): a schedule every second fires each due time once, with
//! two instances on one PostgreSQL store and across a restart of one on
//! SQLite; a webhook signed GitHub's way starts one run however often it
//! is delivered, and a replayed, a badly signed or an oversized delivery
//! starts none.

mod common;
use common::{free_port, wait_until};

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cairn_events::{EventKind, RunId, TriggerKind};
use cairn_store::prelude::*;
use cairn_store::{Backend, Cursor, FireOutcome, FireRecord, RunFilter};
use hmac::{Hmac, KeyInit, Mac};
use serde_json::{json, Value};

const PING: &str = r#"
name: ping
input:
  type: object
nodes:
  - id: a
    value: { got: "{{ input }}" }
"#;

/// Waits for a person: a schedule's run that stays going.
const GATED: &str = r#"
name: gated
nodes:
  - id: gate
    approval: "go?"
"#;

const SECRET: &str = "It's a Secret to Everybody";

/// A `cairn serve` with the triggers file of `dir`, killed if the test
/// fails half-way.
struct Served(Option<Child>);

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Served {
    fn start(dir: &Path, store_args: &[&str], port: u16) -> Served {
        let child = Command::new(env!("CARGO_BIN_EXE_cairn"))
            .args(store_args)
            .arg("serve")
            .arg("--addr")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--workflows")
            .arg(dir.join("wf"))
            .arg("--triggers")
            .arg(dir.join("triggers.yaml"))
            .env_remove("CAIRN_TOKEN")
            .env_remove("CAIRN_LOG_DIR")
            .env("HOOK_SECRET", SECRET)
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        wait_until("the server answers", || {
            http(port, "GET", "/healthz", &[], "").is_some()
        });
        Served(Some(child))
    }

    /// SIGTERM, and the wait for the exit.
    fn stop(mut self) {
        let mut c = self.0.take().unwrap();
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        common::wait_exit(&mut c);
    }

    /// SIGKILL: a crash.
    fn kill(mut self) {
        let mut c = self.0.take().unwrap();
        c.kill().unwrap();
        c.wait().unwrap();
    }
}

/// One HTTP/1.1 exchange: the status and body, or `None` when nothing
/// answers.
fn http(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Option<(u16, String)> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if method == "POST" {
        req.push_str("Content-Type: application/json\r\n");
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).ok()?;
    s.write_all(body.as_bytes()).ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let status = text.get(9..12)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    // Chunked bodies: the test's answers are small, one chunk.
    let body = if text
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        body.split_once("\r\n")
            .map_or("", |(_, rest)| rest)
            .rsplit_once("\r\n0\r\n")
            .map_or(body, |(b, _)| b)
    } else {
        body
    };
    Some((status, body.to_string()))
}

fn json_of(port: u16, path: &str) -> Value {
    let (status, body) = http(port, "GET", path, &[], "").unwrap();
    assert_eq!(status, 200, "{path}: {body}");
    serde_json::from_str(&body).unwrap()
}

fn folder(triggers: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("wf")).unwrap();
    std::fs::write(dir.path().join("wf/ping.yaml"), PING).unwrap();
    std::fs::write(dir.path().join("wf/gated.yaml"), GATED).unwrap();
    std::fs::write(dir.path().join("triggers.yaml"), triggers).unwrap();
    dir
}

/// The due times of a schedule's runs in `b`, each once, checked: each
/// run's `RunStarted` names the schedule and that due time, once.
fn scheduled_runs(b: &dyn Backend, schedule: &str) -> Vec<i64> {
    let prefix = format!("sched-{schedule}-");
    let mut dues = Vec::new();
    for rec in b
        .list_runs(&RunFilter {
            limit: Some(10_000),
            ..Default::default()
        })
        .unwrap()
    {
        let Some(due) = rec.run_id.as_str().strip_prefix(&prefix) else {
            continue;
        };
        let due: i64 = due.parse().unwrap();
        let starts: Vec<_> = common::store::decoded_events(b, rec.run_id.as_str())
            .into_iter()
            .filter_map(|e| match e.kind {
                EventKind::RunStarted {
                    trigger, resumed, ..
                } => Some((trigger, resumed)),
                _ => None,
            })
            .filter(|(_, resumed)| !resumed)
            .collect();
        assert_eq!(starts.len(), 1, "{}: {starts:?}", rec.run_id);
        let t = starts[0]
            .0
            .clone()
            .expect("a scheduled run names its trigger");
        assert_eq!(
            (t.kind, t.name.as_str(), t.due_ms),
            (TriggerKind::Schedule, schedule, Some(due))
        );
        dues.push(due);
    }
    dues.sort();
    dues
}

/// Every due time from the first to the last has its run: none skipped,
/// none twice (the ids are the due times, so twice would be one run).
fn contiguous(dues: &[i64], step: i64) {
    for w in dues.windows(2) {
        assert_eq!(w[1] - w[0], step, "a due time without its run: {dues:?}");
    }
}

#[test]
fn a_schedule_every_second_fires_once_per_due_time_across_two_instances() {
    let Some(server) = cairn_postgres::testing::server_or_skip() else {
        return;
    };
    let db = format!("triggers_fleet_{}", std::process::id());
    let store = cairn_postgres::testing::create_database(server, &db);
    struct Drop_(&'static str, String);
    impl Drop for Drop_ {
        fn drop(&mut self) {
            cairn_postgres::testing::drop_database(self.0, &self.1);
        }
    }
    let _dropped = Drop_(server, db);
    let dir = folder(
        r#"
schedules:
  - name: tick
    workflow: ping
    every: 1s
    input: { due: "{{ schedule.dueMs }}" }
"#,
    );
    let args = ["--store", store.as_str(), "--lease-ttl", "2s"];
    let (p1, p2) = (free_port(), free_port());
    let a = Served::start(dir.path(), &args, p1);
    let b = Served::start(dir.path(), &args, p2);
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_millis(4500));
    a.stop();
    b.stop();
    let elapsed = t0.elapsed().as_secs() as usize;
    let backend = cairn_postgres::PgBackend::open(&store).unwrap();
    let dues = scheduled_runs(&backend, "tick");
    assert!(
        dues.len() >= elapsed - 1 && dues.len() <= elapsed + 2,
        "{} runs in about {elapsed} s: {dues:?}",
        dues.len()
    );
    contiguous(&dues, 1000);
    // The history: each due time decided once, and started.
    let fires = backend.schedules().unwrap().fires("tick", 1000).unwrap();
    let started: BTreeSet<i64> = fires
        .iter()
        .filter(|f| f.outcome == FireOutcome::Started)
        .map(|f| f.due_ms)
        .collect();
    assert_eq!(
        started,
        dues.iter().copied().collect::<BTreeSet<_>>(),
        "{fires:?}"
    );
    assert_eq!(fires.len(), dues.len(), "{fires:?}");
}

#[test]
fn a_restart_in_the_middle_of_a_due_time_fires_it_once() {
    let dir = folder(
        r#"
schedules:
  - name: tick
    workflow: ping
    every: 1s
  - name: late
    workflow: ping
    every: 1s
    grace: 200ms
    catchup: once
"#,
    );
    let db = dir.path().join("cairn.db");
    let args = ["--store", db.to_str().unwrap()];
    let port = free_port();
    // A crash at some point of a second, and a restart at once.
    let s = Served::start(dir.path(), &args, port);
    std::thread::sleep(Duration::from_millis(2300));
    s.kill();
    let s = Served::start(dir.path(), &args, port);
    std::thread::sleep(Duration::from_millis(2000));
    s.stop();
    let b = cairn_store::SqliteBackend::open(&db).unwrap();
    let dues = scheduled_runs(&b, "tick");
    assert!(dues.len() >= 3, "{dues:?}");
    contiguous(&dues, 1000);

    // A crash between deciding a due time and starting its run: the fire
    // is left `firing`. The next start takes it up, once.
    let due = dues[0] - 10_000;
    let run = RunId::parse(&format!("sched-tick-{due}")).unwrap();
    {
        let store = b.schedules().unwrap();
        let rec = store.get_schedule("tick").unwrap().unwrap();
        let fire = FireRecord {
            schedule: "tick".into(),
            due_ms: due,
            decided_ms: due,
            outcome: FireOutcome::Firing,
            run_id: Some(run.clone()),
            detail: None,
        };
        assert!(store
            .advance_schedule("tick", rec.cursor, rec.cursor, &[fire])
            .unwrap());
    }
    // Downtime past `late`'s grace: its missed due times fire once.
    std::thread::sleep(Duration::from_millis(2500));
    let s = Served::start(dir.path(), &args, port);
    wait_until("the decided fire's run", || {
        b.get_run(&run)
            .unwrap()
            .is_some_and(|r| r.status.is_terminal())
    });
    std::thread::sleep(Duration::from_millis(1500));
    s.stop();
    let dues = scheduled_runs(&b, "tick");
    assert!(dues.contains(&due));
    let store = b.schedules().unwrap();
    let fire = store
        .fires("tick", 1000)
        .unwrap()
        .into_iter()
        .find(|f| f.due_ms == due)
        .unwrap();
    assert_eq!(fire.outcome, FireOutcome::Started);
    // `late`: the due times of the downtime were missed but for one run.
    let late = store.fires("late", 1000).unwrap();
    let missed: Vec<&FireRecord> = late
        .iter()
        .filter(|f| f.outcome == FireOutcome::Missed)
        .collect();
    assert!(!missed.is_empty(), "{late:?}");
    assert!(
        missed[0].detail.as_deref().unwrap_or("").contains("missed"),
        "{missed:?}"
    );
    scheduled_runs(&b, "late");
}

fn github_signature(body: &str) -> String {
    let mut mac = Hmac::<sha2_011::Sha256>::new_from_slice(SECRET.as_bytes()).unwrap();
    mac.update(body.as_bytes());
    let hex: String = mac
        .finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("sha256={hex}")
}

fn stripe_signature(ts: i64, body: &str) -> String {
    let mut mac = Hmac::<sha2_011::Sha256>::new_from_slice(SECRET.as_bytes()).unwrap();
    mac.update(format!("{ts}.{body}").as_bytes());
    let hex: String = mac
        .finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("t={ts},v1={hex}")
}

#[test]
fn a_webhook_starts_one_run_per_event_and_none_for_a_bad_delivery() {
    let dir = folder(
        r#"
hooks:
  - name: github
    workflow: ping
    secret: { env: HOOK_SECRET }
    idempotency: { header: X-GitHub-Delivery }
    input: { repo: "{{ body.repository.full_name }}", event: "{{ headers['x-github-event'] }}" }
  - name: stripe
    workflow: ping
    secret: { env: HOOK_SECRET }
    signature:
      header: Stripe-Signature
      format: "t={timestamp},v1={signature}"
      payload: "{timestamp}.{body}"
      tolerance: 5m
    idempotency: { field: /id }
    max_body: 2KiB
"#,
    );
    let db = dir.path().join("cairn.db");
    let port = free_port();
    let s = Served::start(dir.path(), &["--store", db.to_str().unwrap()], port);
    let body = r#"{"repository":{"full_name":"acme/app"},"action":"opened"}"#;
    let sig = github_signature(body);
    let deliver = |delivery: &str, sig: &str, body: &str| {
        http(
            port,
            "POST",
            "/v1/hooks/github",
            &[
                ("X-Hub-Signature-256", sig),
                ("X-GitHub-Delivery", delivery),
                ("X-GitHub-Event", "pull_request"),
            ],
            body,
        )
        .unwrap()
    };
    // Delivered three times (GitHub's redelivery): one run.
    let mut runs = BTreeSet::new();
    for i in 0..3 {
        let (status, answer) = deliver("72d3162e-cc78-11e3-81ab-4c9367dc0958", &sig, body);
        assert_eq!(status, if i == 0 { 201 } else { 200 }, "{answer}");
        let v: Value = serde_json::from_str(&answer).unwrap();
        assert_eq!(v["duplicate"], json!(i > 0));
        runs.insert(v["runId"].as_str().unwrap().to_string());
    }
    assert_eq!(runs.len(), 1);
    let run = runs.into_iter().next().unwrap();
    // Badly signed (another body under the same signature, a wrong
    // secret), unsigned, malformed: none starts anything.
    let other = r#"{"repository":{"full_name":"evil/app"}}"#;
    assert_eq!(deliver("d-2", &sig, other).0, 401);
    assert_eq!(deliver("d-2", "sha256=00", other).0, 401);
    let (status, answer) = http(
        port,
        "POST",
        "/v1/hooks/github",
        &[("X-GitHub-Delivery", "d-3")],
        body,
    )
    .unwrap();
    assert_eq!(
        (status, answer.contains("unsigned")),
        (401, true),
        "{answer}"
    );
    assert_eq!(deliver("d-4", &github_signature("{nope"), "{nope").0, 400);
    assert_eq!(
        http(port, "POST", "/v1/hooks/nobody", &[], "{}").unwrap().0,
        404
    );

    // Stripe's way: a timestamp in the signature's header, signed with
    // the body. A fresh one starts a run; the same event replayed after
    // the tolerance starts none, even rightly signed.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let event = r#"{"id":"evt_1","type":"invoice.paid"}"#;
    let stripe = |sig: &str, body: &str| {
        http(
            port,
            "POST",
            "/v1/hooks/stripe",
            &[("Stripe-Signature", sig)],
            body,
        )
        .unwrap()
    };
    let (status, answer) = stripe(&stripe_signature(now, event), event);
    assert_eq!(status, 201, "{answer}");
    let replayed = r#"{"id":"evt_0","type":"invoice.paid"}"#;
    let (status, answer) = stripe(&stripe_signature(now - 600, replayed), replayed);
    assert_eq!(
        (status, answer.contains("replayed")),
        (401, true),
        "{answer}"
    );
    // A timestamp changed after signing no longer signs.
    let sig = stripe_signature(now - 600, replayed).replacen(
        &format!("t={}", now - 600),
        &format!("t={now}"),
        1,
    );
    assert_eq!(stripe(&sig, replayed).0, 401);
    // Oversized: past the hook's 2 KiB, refused before it is read.
    let big = format!(r#"{{"id":"evt_2","pad":"{}"}}"#, "x".repeat(4096));
    let (status, answer) = stripe(&stripe_signature(now, &big), &big);
    assert_eq!(
        (status, answer.contains("oversized")),
        (413, true),
        "{answer}"
    );

    let metrics = common::metrics(port);
    for line in [
        r#"cairn_hook_deliveries_total{hook="github",outcome="started"} 1"#,
        r#"cairn_hook_deliveries_total{hook="github",outcome="duplicate"} 2"#,
        r#"cairn_hook_deliveries_total{hook="github",outcome="bad_signature"} 2"#,
        r#"cairn_hook_deliveries_total{hook="github",outcome="unsigned"} 1"#,
        r#"cairn_hook_deliveries_total{hook="github",outcome="malformed"} 1"#,
        r#"cairn_hook_deliveries_total{hook="",outcome="unknown_hook"} 1"#,
        r#"cairn_hook_deliveries_total{hook="stripe",outcome="started"} 1"#,
        r#"cairn_hook_deliveries_total{hook="stripe",outcome="replayed"} 1"#,
        r#"cairn_hook_deliveries_total{hook="stripe",outcome="bad_signature"} 1"#,
        r#"cairn_hook_deliveries_total{hook="stripe",outcome="oversized"} 1"#,
    ] {
        assert!(metrics.contains(line), "{line} in\n{metrics}");
    }
    let b = cairn_store::SqliteBackend::open(&db).unwrap();
    wait_until("the hook's run ends", || {
        b.get_run(&RunId::parse(&run).unwrap())
            .unwrap()
            .is_some_and(|r| r.status.is_terminal())
    });
    s.stop();
    // Two runs in all: the GitHub event's and the fresh Stripe event's.
    let all = b.list_runs(&RunFilter::default()).unwrap();
    assert_eq!(
        all.len(),
        2,
        "{:?}",
        all.iter().map(|r| r.run_id.as_str()).collect::<Vec<_>>()
    );
    let events = common::store::decoded_events(&b, &run);
    let EventKind::RunStarted { input, trigger, .. } = &events[0].kind else {
        panic!("{:?}", events[0]);
    };
    assert_eq!(
        input.as_ref().unwrap(),
        &json!({"repo": "acme/app", "event": "pull_request"})
    );
    let t = trigger.as_ref().unwrap();
    assert_eq!(
        (t.kind, t.name.as_str(), t.delivery_id.as_deref()),
        (
            TriggerKind::Webhook,
            "github",
            Some("72d3162e-cc78-11e3-81ab-4c9367dc0958")
        )
    );
}

#[test]
fn schedules_are_managed_through_the_api() {
    let dir = folder(
        r#"
schedules:
  - name: filed
    workflow: ping
    cron: "0 0 3 * * *"
    timezone: Europe/Paris
"#,
    );
    let db = dir.path().join("cairn.db");
    let port = free_port();
    let s = Served::start(dir.path(), &["--store", db.to_str().unwrap()], port);
    let post = |path: &str, body: &str| http(port, "POST", path, &[], body).unwrap();
    let def = json!({"name": "hourly", "workflow": "ping", "cron": "0 * * * *", "input": {"n": "{{ schedule.name }}"}}).to_string();
    let (status, answer) = post("/v1/schedules", &def);
    assert_eq!(status, 201, "{answer}");
    assert_eq!(post("/v1/schedules", &def).0, 409);
    // A bad definition names its field.
    let (status, answer) = post(
        "/v1/schedules",
        r#"{"name": "bad", "workflow": "ping", "cron": "61 * * * *"}"#,
    );
    assert_eq!((status, answer.contains("cron")), (400, true), "{answer}");
    let (status, answer) = post(
        "/v1/schedules",
        r#"{"name": "x", "workflow": "nope", "every": "1s"}"#,
    );
    assert_eq!(status, 404, "{answer}");
    let list = json_of(port, "/v1/schedules");
    let names: Vec<&str> = list["schedules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["filed", "hourly"]);
    assert_eq!(list["schedules"][0]["fromFile"], json!(true));
    // Its next due time is the next whole hour.
    let next = list["schedules"][1]["nextDueMs"].as_i64().unwrap();
    assert_eq!(next % 3_600_000, 0);

    let (status, paused) = post("/v1/schedules/hourly/pause", "{}");
    assert_eq!(status, 200);
    assert_eq!(
        serde_json::from_str::<Value>(&paused).unwrap()["paused"],
        json!(true)
    );
    assert_eq!(post("/v1/schedules/hourly/trigger", "{}").0, 409);
    assert_eq!(post("/v1/schedules/hourly/resume", "{}").0, 200);
    // By hand: a run now, in the history.
    let (status, fired) = post("/v1/schedules/hourly/trigger", "{}");
    assert_eq!(status, 201, "{fired}");
    let fired: Value = serde_json::from_str(&fired).unwrap();
    assert_eq!(fired["outcome"], "started");
    let run = fired["runId"].as_str().unwrap().to_string();
    let b = cairn_store::SqliteBackend::open(&db).unwrap();
    wait_until("the run by hand ends", || {
        b.get_run(&RunId::parse(&run).unwrap())
            .unwrap()
            .is_some_and(|r| r.status.is_terminal())
    });
    let events = common::store::decoded_events(&b, &run);
    let EventKind::RunStarted { input, trigger, .. } = &events[0].kind else {
        panic!()
    };
    assert_eq!(input.as_ref().unwrap(), &json!({"n": "hourly"}));
    assert_eq!(trigger.as_ref().unwrap().due_ms, fired["dueMs"].as_i64());
    let fires = json_of(port, "/v1/schedules/hourly/fires");
    assert_eq!(fires["fires"][0]["runId"], json!(run));

    // The file's schedule is the file's.
    let (status, answer) = http(port, "DELETE", "/v1/schedules/filed", &[], "").unwrap();
    assert_eq!((status, answer.contains("schedule_from_file")), (409, true));
    assert_eq!(
        http(port, "DELETE", "/v1/schedules/hourly", &[], "")
            .unwrap()
            .0,
        204
    );
    assert_eq!(
        http(port, "GET", "/v1/schedules/hourly", &[], "")
            .unwrap()
            .0,
        404
    );
    s.stop();
}

#[test]
fn queue_one_keeps_one_due_time_for_when_the_going_run_ends() {
    let dir = folder(
        r#"
schedules:
  - name: gate
    workflow: gated
    every: 1s
    overlap: queue_one
"#,
    );
    let db = dir.path().join("cairn.db");
    let port = free_port();
    let s = Served::start(dir.path(), &["--store", db.to_str().unwrap()], port);
    let b = cairn_store::SqliteBackend::open(&db).unwrap();
    let store = b.schedules().unwrap();
    // The first run waits for its approval; the next due time is queued,
    // the ones after it skipped.
    wait_until("a queued and a skipped due time", || {
        let fires = store.fires("gate", 100).unwrap();
        fires.iter().any(|f| f.outcome == FireOutcome::Queued)
            && fires.iter().any(|f| f.outcome == FireOutcome::Skipped)
    });
    let first = scheduled_runs(&b, "gate");
    assert_eq!(first.len(), 1, "{first:?}");
    let queued = store
        .fires("gate", 100)
        .unwrap()
        .into_iter()
        .find(|f| f.outcome == FireOutcome::Queued)
        .unwrap()
        .due_ms;
    assert_eq!(
        store
            .get_schedule("gate")
            .unwrap()
            .unwrap()
            .cursor
            .pending_due_ms,
        Some(queued)
    );
    let (status, answer) = http(
        port,
        "POST",
        &format!("/v1/runs/sched-gate-{}/approvals/gate", first[0]),
        &[],
        r#"{"approved": true}"#,
    )
    .unwrap();
    assert_eq!(status, 200, "{answer}");
    // The queued due time's run starts once the first has ended.
    wait_until("the queued due time's run", || {
        scheduled_runs(&b, "gate").contains(&queued)
    });
    s.stop();
    let cursor: Cursor = store.get_schedule("gate").unwrap().unwrap().cursor;
    assert_ne!(cursor.pending_due_ms, Some(queued));
}

#[test]
fn a_bad_triggers_file_is_refused_with_its_line() {
    let dir = folder(
        r#"
schedules:
  - name: tick
    workflow: ping
    every: 1s
    overlap: sometimes
hooks:
  - name: open
    workflow: ping
"#,
    );
    let out = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args([
            "--store",
            "cairn.db",
            "serve",
            "--addr",
            "127.0.0.1:0",
            "--workflows",
            "wf",
            "--triggers",
            "triggers.yaml",
        ])
        .current_dir(dir.path())
        .env_remove("CAIRN_TOKEN")
        .output()
        .unwrap();
    common::expect_code(&out, 4);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("triggers.yaml:6"), "{err}");
    assert!(err.contains("sometimes"), "{err}");
    assert!(err.contains("needs a `secret`"), "{err}");
    // A schedule whose workflow is not in the folder.
    std::fs::write(
        dir.path().join("triggers.yaml"),
        "schedules:\n  - { name: t, workflow: missing, every: 1s }\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args([
            "--store",
            "cairn.db",
            "serve",
            "--addr",
            "127.0.0.1:0",
            "--workflows",
            "wf",
            "--triggers",
            "triggers.yaml",
        ])
        .current_dir(dir.path())
        .env_remove("CAIRN_TOKEN")
        .output()
        .unwrap();
    common::expect_code(&out, 4);
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing"));
}

#[test]
fn the_cli_shows_and_acts_on_schedules_here_and_through_a_server() {
    let dir = folder(
        r#"
schedules:
  - name: filed
    workflow: ping
    cron: "0 0 3 * * *"
    timezone: Europe/Paris
"#,
    );
    let db = dir.path().join("cairn.db");
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let s = Served::start(dir.path(), &["--store", db.to_str().unwrap()], port);
    let cairn = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_cairn"))
            .args(args)
            .current_dir(dir.path())
            .env_remove("CAIRN_TOKEN")
            .env_remove("CAIRN_STORE")
            .output()
            .unwrap()
    };
    let text = |o: &std::process::Output| String::from_utf8_lossy(&o.stdout).to_string();
    let out = cairn(&["schedules", "--server", &url]);
    common::expect_code(&out, 0);
    assert!(
        text(&out).contains("filed") && text(&out).contains("cron 0 0 3 * * * (Europe/Paris)"),
        "{}",
        text(&out)
    );
    common::expect_code(
        &cairn(&["schedules", "pause", "filed", "--server", &url]),
        0,
    );
    let out = cairn(&["schedules", "show", "filed", "--json", "--server", &url]);
    common::expect_code(&out, 0);
    let v: Value = serde_json::from_str(&text(&out)).unwrap();
    assert_eq!(v["schedule"]["paused"], json!(true));
    common::expect_code(
        &cairn(&["schedules", "resume", "filed", "--server", &url]),
        0,
    );
    let out = cairn(&["schedules", "trigger", "filed", "--server", &url]);
    common::expect_code(&out, 0);
    assert!(
        text(&out).starts_with("started sched-filed-"),
        "{}",
        text(&out)
    );
    common::expect_code(&cairn(&["schedules", "show", "nope", "--server", &url]), 4);
    s.stop();

    // Here, in the store: the same list; the history has the run by hand.
    let store = db.to_str().unwrap();
    let out = cairn(&["--store", store, "schedules", "show", "filed"]);
    common::expect_code(&out, 0);
    assert!(
        text(&out).contains("started") && text(&out).contains("by hand"),
        "{}",
        text(&out)
    );
    common::expect_code(
        &cairn(&["--store", store, "schedules", "pause", "filed"]),
        0,
    );
    let out = cairn(&["--store", store, "schedules", "--json"]);
    let v: Value = serde_json::from_str(&text(&out)).unwrap();
    assert_eq!(v["schedules"][0]["paused"], json!(true));
    common::expect_code(
        &cairn(&["--store", store, "schedules", "resume", "filed"]),
        0,
    );
    // The file's schedule is the file's; a run by hand needs the server.
    common::expect_code(
        &cairn(&["--store", store, "schedules", "delete", "filed"]),
        4,
    );
    common::expect_code(
        &cairn(&["--store", store, "schedules", "trigger", "filed"]),
        4,
    );
}

/// A node whose root holds the triggers file rewrites it to add a hook that
/// takes unsigned deliveries: the running server never reads it again, so
/// the hook does not exist and the node's text starts nothing.
#[test]
fn a_node_that_rewrites_the_triggers_file_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let wf = dir.path().join("wf");
    std::fs::create_dir(&wf).unwrap();
    std::fs::write(wf.join("ping.yaml"), PING).unwrap();
    // Its root is its folder, which holds the triggers file.
    std::fs::write(
        wf.join("rewrite.yaml"),
        r#"
name: rewrite
nodes:
  - id: plant
    command: ["sh", "-c", "printf 'hooks:\n  - { name: open, workflow: ping, unsigned: true }\n' > triggers.yaml && echo planted"]
"#,
    )
    .unwrap();
    let triggers = "schedules:\n  - { name: tick, workflow: rewrite, every: 1s }\n";
    std::fs::write(wf.join("triggers.yaml"), triggers).unwrap();
    let db = dir.path().join("cairn.db");
    let port = free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(["--store", db.to_str().unwrap(), "serve", "--addr"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("--workflows")
        .arg(&wf)
        .arg("--triggers")
        .arg(wf.join("triggers.yaml"))
        .env_remove("CAIRN_TOKEN")
        .env_remove("CAIRN_LOG_DIR")
        .current_dir(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let s = Served(Some(child));
    wait_until("the server answers", || {
        http(port, "GET", "/healthz", &[], "").is_some()
    });
    let b = cairn_store::SqliteBackend::open(&db).unwrap();
    wait_until("two scheduled runs ended", || {
        scheduled_runs(&b, "tick").len() >= 2
            && b.list_runs(&RunFilter::default())
                .unwrap()
                .iter()
                .filter(|r| r.status.is_terminal())
                .count()
                >= 2
    });
    // The node did plant its file.
    let planted = std::fs::read_to_string(wf.join("triggers.yaml")).unwrap();
    assert!(planted.contains("unsigned: true"), "{planted}");
    let (status, answer) = http(port, "POST", "/v1/hooks/open", &[], r#"{"x":1}"#).unwrap();
    assert_eq!(
        (status, answer.contains("unknown_hook")),
        (404, true),
        "{answer}"
    );
    // The schedule goes on as the file said when the server started.
    let list = json_of(port, "/v1/schedules");
    assert_eq!(list["schedules"].as_array().unwrap().len(), 1, "{list}");
    assert_eq!(list["schedules"][0]["name"], "tick");
    s.stop();
    let runs = b.list_runs(&RunFilter::default()).unwrap();
    assert!(
        runs.iter()
            .all(|r| r.run_id.as_str().starts_with("sched-tick-")),
        "{:?}",
        runs.iter().map(|r| r.run_id.as_str()).collect::<Vec<_>>()
    );
}
