//! Three `cairn serve` processes on one PostgreSQL database. Runs are started
//! round-robin; each is watched over SSE on an instance other than the one
//! that drives it; a gate is approved through an instance that does not
//! drive its run, and another run cancelled the same way; one instance is
//! SIGKILLed in the middle. Every run must
//! finish (the dead instance's runs taken over once their leases expire),
//! every watcher must see every event exactly once (reconnecting elsewhere
//! with its last seq when its instance dies), the store must hold the same
//! log, and no node may start again after its `NodeFinished`.

mod common;
use common::free_port;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

use cairn_client::{wait_healthy, Client, RunId};
use cairn_events::{Event, EventKind};
use serde_json::{json, Value};

/// Commands that take a while, so that the kill lands in the middle; every
/// attempt leaves a mark, to count what ran.
const LONG: &str = r#"
name: long
nodes:
  - id: a
    command: ["sh", "-c", "echo \"$CAIRN_RUN_ID a\" >> marks; sleep 0.3; echo a"]
  - id: b
    needs: [a]
    command: ["sh", "-c", "echo \"$CAIRN_RUN_ID b\" >> marks; sleep 0.3; echo b"]
  - id: fan
    needs: [b]
    for_each: "[1, 2, 3]"
    nodes:
      - id: step
        command: ["sh", "-c", "echo \"$CAIRN_RUN_ID step\" >> marks; sleep 0.2; echo {{ item }}"]
  - id: c
    needs: [fan]
    command: ["sh", "-c", "echo \"$CAIRN_RUN_ID c\" >> marks; sleep 0.3; echo c"]
  - id: d
    needs: [c]
    value: { done: true }
"#;

const GATED: &str = r#"
name: gated
nodes:
  - id: gate
    approval: "ship?"
  - id: after
    needs: [gate]
    command: ["sh", "-c", "echo shipped"]
"#;

/// Holds its first node until the test writes `go`, so that every run is
/// driven at once and who drives each can be asked.
const HELD: &str = r#"
name: held
nodes:
  - id: a
    command: ["sh", "-c", "echo \"$CAIRN_RUN_ID a\" >> marks; while [ ! -f go ]; do sleep 0.5; done"]
  - id: b
    needs: [a]
    command: ["sh", "-c", "echo \"$CAIRN_RUN_ID b\" >> marks; sleep 0.2; echo b"]
"#;

/// A parent whose child holds until `go`.
const PARENT: &str = r#"
name: parent
nodes:
  - id: call
    workflow: held.yaml
  - id: after
    needs: [call]
    value: { done: true }
"#;

const INSTANCES: usize = 3;
const RUNS: usize = 6;
const LEASE_TTL: &str = "1s";

/// A database of its own on the test server (named after the test and
/// this process's pid), dropped with it, and a folder with the tests'
/// workflows.
struct Fleet {
    server: &'static str,
    db: String,
    store: String,
    dir: tempfile::TempDir,
}

impl Fleet {
    /// `None` when the test server is not configured (the test then says
    /// it skips).
    fn new(prefix: &str) -> Option<Fleet> {
        let server = cairn_postgres::testing::server_or_skip()?;
        let db = format!("{prefix}_{}", std::process::id());
        let store = cairn_postgres::testing::create_database(server, &db);
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("long.yaml"), LONG).unwrap();
        std::fs::write(dir.path().join("gated.yaml"), GATED).unwrap();
        std::fs::write(dir.path().join("held.yaml"), HELD).unwrap();
        std::fs::write(dir.path().join("parent.yaml"), PARENT).unwrap();
        Some(Fleet {
            server,
            db,
            store,
            dir,
        })
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        cairn_postgres::testing::drop_database(self.server, &self.db);
    }
}

/// A client of each server on `ports`, once each answers `/healthz`.
async fn healthy_clients(ports: &[u16]) -> Vec<Client> {
    let mut clients = Vec::new();
    for &p in ports {
        let url = format!("http://127.0.0.1:{p}");
        wait_healthy(&url, Duration::from_secs(30)).await.unwrap();
        clients.push(Client::new(&url, None).unwrap());
    }
    clients
}

fn serve(dir: &Path, store: &str, port: u16) -> Child {
    common::serve(dir, &["--store", store, "--lease-ttl", LEASE_TTL], port)
}

/// The instances, killed if the test fails half-way, so that none outlives
/// it.
struct Instances(Vec<Option<Child>>);

impl Drop for Instances {
    fn drop(&mut self) {
        for c in self.0.iter_mut().flatten() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Waits, asking `client`, until `run` waits for its approval.
async fn waiting(client: &Client, run: &str) {
    let t0 = Instant::now();
    let run = RunId::parse(run).unwrap();
    loop {
        let state = client.run(&run).await.unwrap();
        if state["status"] == "waiting-approval" {
            return;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "{state}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What one watcher saw of one run, reconnecting to the next live instance
/// when its own dies.
async fn watch(clients: Vec<Client>, first: usize, run: String) -> Vec<Value> {
    let id = RunId::parse(&run).unwrap();
    let mut seen: Vec<Value> = Vec::new();
    let mut at = first;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        assert!(
            Instant::now() < deadline,
            "watcher of {run} never saw its end"
        );
        let after = seen.last().map_or(0, |v| v["seq"].as_u64().unwrap());
        let mut stream = match clients[at].events(&id, after, false).await {
            Ok(s) => s,
            Err(_) => {
                // This instance is gone: another one serves the same store.
                at = (at + 1) % clients.len();
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let mut ended = false;
        while let Some(line) = stream.next_event().await {
            let Ok(line) = line else { break };
            let v: Value = serde_json::from_str(&line).unwrap();
            ended = matches!(
                v["type"].as_str(),
                Some("RunFinished" | "RunFailed" | "RunCancelled")
            );
            seen.push(v);
        }
        if ended {
            return seen;
        }
        at = (at + 1) % clients.len();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_one_killed_every_run_finishes_and_every_watcher_sees_each_event_once() {
    let Some(fleet) = Fleet::new("cairn_multi") else {
        return;
    };
    let (store, dir) = (fleet.store.as_str(), &fleet.dir);

    let ports: Vec<u16> = (0..INSTANCES).map(|_| free_port()).collect();
    let mut servers = Instances(
        ports
            .iter()
            .map(|&p| Some(serve(dir.path(), store, p)))
            .collect(),
    );
    let clients = healthy_clients(&ports).await;

    // Runs started round-robin (queued: whichever instance's share it is
    // claims each); run i is watched on the instance after the one that
    // started it.
    let mut runs = Vec::new();
    for i in 0..RUNS {
        let run = clients[i % INSTANCES]
            .post_json("/v1/runs", &json!({"workflow": "long"}))
            .await
            .unwrap()["runId"]
            .as_str()
            .unwrap()
            .to_string();
        runs.push(run);
    }
    // A gated run started on instance 1, approved through instance 2.
    let gated = clients[1]
        .post_json("/v1/runs", &json!({"workflow": "gated"}))
        .await
        .unwrap()["runId"]
        .as_str()
        .unwrap()
        .to_string();

    // Another started on instance 2, cancelled through instance 1.
    let cancelled = clients[2]
        .post_json("/v1/runs", &json!({"workflow": "gated"}))
        .await
        .unwrap()["runId"]
        .as_str()
        .unwrap()
        .to_string();

    let mut watchers = Vec::new();
    for (i, run) in runs.iter().chain([&gated, &cancelled]).enumerate() {
        let first = (i % INSTANCES + 1) % INSTANCES;
        watchers.push((
            run.clone(),
            tokio::spawn(watch(clients.clone(), first, run.clone())),
        ));
    }

    // Approve once the gate waits, through an instance that does not drive
    // the run: the command goes through the run's inbox.
    waiting(&clients[2], &gated).await;
    let approved = clients[2]
        .post_json(
            &format!("/v1/runs/{gated}/approvals/gate"),
            &json!({"approved": true, "by": "test"}),
        )
        .await;
    assert!(
        approved.is_ok(),
        "approve through another instance: {approved:?}"
    );
    waiting(&clients[1], &cancelled).await;
    let cancel = clients[1]
        .post_json(
            &format!("/v1/runs/{cancelled}/cancel"),
            &json!({"by": "test"}),
        )
        .await;
    assert!(
        cancel.is_ok(),
        "cancel through another instance: {cancel:?}"
    );

    // Kill instance 0 in the middle of its runs.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let mut dead = servers.0[0].take().unwrap();
    dead.kill().unwrap(); // SIGKILL
    dead.wait().unwrap();

    let mut seen_by: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for (run, w) in watchers {
        let seen = tokio::time::timeout(Duration::from_secs(120), w)
            .await
            .unwrap_or_else(|_| panic!("the watcher of {run} hung"))
            .unwrap();
        seen_by.insert(run, seen);
    }

    let backend = cairn_postgres::PgBackend::open(store).unwrap();
    let mut taken_over = 0;
    for (run, seen) in &seen_by {
        use cairn_store::prelude::*;
        let stored = checked_log(&backend, run, |end| {
            if *run == cancelled {
                matches!(end, EventKind::RunCancelled { .. })
            } else {
                matches!(end, EventKind::RunFinished { .. })
            }
        });
        let stored_json: Vec<Value> = backend
            .read_events(
                &cairn_events::RunId::parse(run).unwrap(),
                &Default::default(),
            )
            .unwrap()
            .iter()
            .map(|s| serde_json::from_str(&s.json).unwrap())
            .collect();
        assert_eq!(
            seen, &stored_json,
            "{run}: the watcher's stream is not the stored log, once each"
        );
        taken_over += usize::from(sessions(&stored) > 1);
    }
    assert!(
        taken_over >= 1,
        "no run was taken over from the killed instance"
    );
    eprintln!("{taken_over} run(s) taken over from the killed instance");

    for s in servers.0.iter_mut().flatten() {
        unsafe {
            libc::kill(s.id() as i32, libc::SIGTERM);
        }
    }
    for s in std::mem::take(&mut servers.0).into_iter().flatten() {
        let mut s = s;
        let status = tokio::task::spawn_blocking(move || s.wait().unwrap())
            .await
            .unwrap();
        assert!(status.success(), "{status:?}");
    }
    drop(backend);
}

/// Waits, asking `client`, until `run` has `status`.
async fn reaches(client: &Client, run: &str, status: &str, within: Duration) {
    let t0 = Instant::now();
    let id = RunId::parse(run).unwrap();
    loop {
        let state = client.run(&id).await.unwrap();
        if state["status"] == status {
            return;
        }
        assert!(
            t0.elapsed() < within,
            "{run} is not {status} after {within:?}: {state}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A SIGTERMed instance gives its runs back and wakes the other instances,
/// which go on with them at once. The lease here lasts ten minutes, so the
/// other instance would find the runs by itself only after five (its
/// periodic look): each run finishing within a minute is the hand-over's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_instance_hands_its_runs_over_at_once() {
    let Some(fleet) = Fleet::new("cairn_handover") else {
        return;
    };
    let (store, dir) = (fleet.store.as_str(), &fleet.dir);
    let ports = [free_port(), free_port()];
    let names = ["first", "second"];
    let long_lease = |p: u16, name: &str| {
        common::serve(
            dir.path(),
            &[
                "--store",
                store,
                "--lease-ttl",
                "600s",
                "--instance-name",
                name,
            ],
            p,
        )
    };
    // The second instance starts once the first has claimed both runs.
    let mut servers = Instances(vec![Some(long_lease(ports[0], names[0])), None]);
    let clients = healthy_clients(&ports[..1]).await;
    let start = |workflow: &'static str| {
        let c = clients[0].clone();
        async move {
            c.post_json("/v1/runs", &json!({ "workflow": workflow }))
                .await
                .unwrap()["runId"]
                .as_str()
                .unwrap()
                .to_string()
        }
    };
    // Both driven by the first instance: one waits for a person, one holds
    // in its first node when the instance stops.
    let gated = start("gated").await;
    waiting(&clients[0], &gated).await;
    let long = start("held").await;
    let t0 = Instant::now();
    while !std::fs::read_to_string(dir.path().join("marks"))
        .unwrap_or_default()
        .contains(&format!("{long} a"))
    {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the held run never reached a"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    servers.0[1] = Some(long_lease(ports[1], names[1]));
    let clients = healthy_clients(&ports).await;

    // Who drives them, asked of the other instance: the first.
    let gated_id = RunId::parse(&gated).unwrap();
    let state = clients[1].run(&gated_id).await.unwrap();
    assert_eq!(state["instance"], "first", "{state}");
    let listed_driver = |v: &Value, run: &str| {
        v["runs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["runId"] == run)
            .and_then(|r| r["instance"].as_str().map(str::to_string))
    };
    let listed = clients[1].get_json("/v1/runs").await.unwrap();
    assert_eq!(listed_driver(&listed, &gated).as_deref(), Some("first"));
    let metrics = common::metrics(ports[0]);
    assert!(
        metrics.contains("cairn_instance_driven_runs{instance=\"first\"} 2"),
        "{metrics}"
    );

    // Stopped while node a holds; a is let go during the stop's grace, so
    // the first instance finishes a and gives the run back before b.
    let mut first = servers.0[0].take().unwrap();
    unsafe { libc::kill(first.id() as i32, libc::SIGTERM) };
    tokio::time::sleep(Duration::from_millis(300)).await;
    std::fs::write(dir.path().join("go"), "").unwrap();
    let status = first.wait().unwrap();
    assert!(
        status.success(),
        "the stopped instance exited with {status}"
    );

    let other = &clients[1];
    reaches(other, &long, "finished", Duration::from_secs(60)).await;
    // The gate still waits, now on the other instance, and its approval
    // there lets the run end.
    waiting(other, &gated).await;
    let state = other.run(&gated_id).await.unwrap();
    assert_eq!(state["instance"], "second", "{state}");
    other
        .post_json(
            &format!("/v1/runs/{gated}/approvals/gate"),
            &json!({"approved": true, "by": "test"}),
        )
        .await
        .unwrap();
    reaches(other, &gated, "finished", Duration::from_secs(60)).await;
    let listed = other.get_json("/v1/runs").await.unwrap();
    assert_eq!(
        listed_driver(&listed, &gated),
        None,
        "an ended run names a driver"
    );
    // Nothing of the long run ran twice past what the stop cut short: the
    // command running at the stop may run again, no finished one does.
    let marks = std::fs::read_to_string(dir.path().join("marks")).unwrap();
    for node in ["a", "b"] {
        let ran = marks
            .lines()
            .filter(|l| *l == format!("{long} {node}"))
            .count();
        assert_eq!(ran, 1, "node {node} ran {ran} times: {marks}");
    }
}

/// `cairn serve --worker` answers only `/healthz` and `/metrics`, and
/// drives runs: here one that an HTTP instance gave back as it stopped,
/// which then goes on with an approval sent by the CLI to the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_serves_only_its_monitors_and_drives_runs() {
    let Some(fleet) = Fleet::new("cairn_worker") else {
        return;
    };
    let (store, dir) = (fleet.store.as_str(), &fleet.dir);
    let (web_port, worker_port) = (free_port(), free_port());
    let args = |name: &'static str| {
        [
            "--store",
            store,
            "--lease-ttl",
            "600s",
            "--instance-name",
            name,
        ]
    };
    let mut servers = Instances(vec![
        Some(common::serve(dir.path(), &args("web"), web_port)),
        None,
    ]);
    let web = Client::new(&format!("http://127.0.0.1:{web_port}"), None).unwrap();
    wait_healthy(
        &format!("http://127.0.0.1:{web_port}"),
        Duration::from_secs(30),
    )
    .await
    .unwrap();
    let gated = web
        .post_json("/v1/runs", &json!({"workflow": "gated"}))
        .await
        .unwrap()["runId"]
        .as_str()
        .unwrap()
        .to_string();
    waiting(&web, &gated).await;

    let worker = std::process::Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(args("worker"))
        .args([
            "serve",
            "--worker",
            "--addr",
            &format!("127.0.0.1:{worker_port}"),
        ])
        .current_dir(dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    servers.0[1] = Some(worker);
    let url = format!("http://127.0.0.1:{worker_port}");
    wait_healthy(&url, Duration::from_secs(30)).await.unwrap();
    let w = Client::new(&url, None).unwrap();
    for path in [
        "/v1/runs",
        &format!("/v1/runs/{gated}"),
        "/openapi.json",
        "/",
    ] {
        let err = w.get_json(path).await.expect_err(path).to_string();
        assert!(err.contains("404"), "{path}: {err}");
    }
    assert!(w
        .post_json("/v1/runs", &json!({"workflow": "gated"}))
        .await
        .is_err());

    // The web instance stops and gives its run back; the worker takes it.
    let mut first = servers.0[0].take().unwrap();
    unsafe { libc::kill(first.id() as i32, libc::SIGTERM) };
    assert!(first.wait().unwrap().success());
    drives(worker_port, "worker", 1, "the worker never took the run").await;
    let approve = std::process::Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(["--store", store, "approve", &gated, "gate", "--by", "test"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(
        approve.status.success(),
        "{}",
        String::from_utf8_lossy(&approve.stderr)
    );
    drives(
        worker_port,
        "worker",
        0,
        "the run never ended on the worker",
    )
    .await;
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(["--store", store, "runs", "--json"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let listed: Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(listed["runs"][0]["status"], "finished", "{listed}");
}

/// Waits until the server on `port`, named `name`, says in `/metrics` that
/// it drives `runs` runs.
async fn drives(port: u16, name: &str, runs: usize, otherwise: &str) {
    let sample = format!("cairn_instance_driven_runs{{instance=\"{name}\"}} {runs}\n");
    let t0 = Instant::now();
    while !common::metrics(port).contains(&sample) {
        assert!(t0.elapsed() < Duration::from_secs(60), "{otherwise}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// An instance per name on the fleet's database (short leases), each on a
/// free port; the ports in the same order.
fn named_instances(fleet: &Fleet, names: &[&str]) -> (Instances, Vec<u16>) {
    let ports: Vec<u16> = names.iter().map(|_| free_port()).collect();
    let servers = ports
        .iter()
        .zip(names)
        .map(|(&p, name)| {
            let args = [
                "--store",
                fleet.store.as_str(),
                "--lease-ttl",
                LEASE_TTL,
                "--instance-name",
                name,
            ];
            Some(common::serve(fleet.dir.path(), &args, p))
        })
        .collect();
    (Instances(servers), ports)
}

/// The runs each instance of `names` (on `ports`) says in `/metrics` that
/// it drives.
fn driven_by(ports: &[u16], names: &[&str]) -> Vec<usize> {
    ports
        .iter()
        .zip(names)
        .map(|(&p, name)| {
            let sample = format!("cairn_instance_driven_runs{{instance=\"{name}\"}} ");
            let text = common::metrics(p);
            let line = text
                .lines()
                .find_map(|l| l.strip_prefix(&sample))
                .unwrap_or_else(|| panic!("no driven runs for {name}: {text}"));
            line.trim().parse().unwrap()
        })
        .collect()
}

/// The checks of the crash tests, on one run's stored log: it ended as
/// `ended` wants, its seqs have no gap, it keeps the contract, and no
/// node started again after it finished. Returns the log.
fn checked_log(
    backend: &cairn_postgres::PgBackend,
    run: &str,
    ended: impl Fn(&EventKind) -> bool,
) -> Vec<Event> {
    use cairn_store::prelude::*;
    let stored: Vec<Event> = backend
        .read_events(
            &cairn_events::RunId::parse(run).unwrap(),
            &Default::default(),
        )
        .unwrap()
        .iter()
        .map(|s| s.decode().unwrap())
        .collect();
    let seqs: Vec<u64> = stored.iter().map(|e| e.seq.get()).collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>(), "{run}");
    assert!(
        ended(&stored.last().unwrap().kind),
        "{run} did not end as it should: {}",
        stored.last().unwrap().to_json()
    );
    cairn_events::check_log(&stored).unwrap_or_else(|e| panic!("{run}: {e}"));
    let mut finished = std::collections::BTreeSet::new();
    for e in &stored {
        let Some(node) = e.scope.node_id.as_deref() else {
            continue;
        };
        let key = (node.to_string(), e.scope.iteration);
        match &e.kind {
            EventKind::NodeFinished { .. } => {
                assert!(finished.insert(key), "{run}: {node} finished twice");
            }
            EventKind::NodeStarted { .. } => {
                assert!(
                    !finished.contains(&key),
                    "{run}: {node} started again after it finished"
                );
            }
            _ => {}
        }
    }
    stored
}

/// How many times a run was started: a take-over adds one.
fn sessions(stored: &[Event]) -> usize {
    stored
        .iter()
        .filter(|e| matches!(e.kind, EventKind::RunStarted { .. }))
        .count()
}

/// [`checked_log`] of a run that must have finished; how many times it
/// was started.
fn check_run(backend: &cairn_postgres::PgBackend, run: &str) -> usize {
    sessions(&checked_log(backend, run, |end| {
        matches!(end, EventKind::RunFinished { .. })
    }))
}

/// 300 runs started through one instance are queued and claimed by all
/// three, each its share (at least a fifth); one instance killed with
/// SIGKILL while they run loses none of them and repeats no finished node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_started_through_one_instance_are_driven_by_all() {
    let Some(fleet) = Fleet::new("cairn_spread") else {
        return;
    };
    let (store, dir) = (fleet.store.as_str(), &fleet.dir);
    const SPREAD: usize = 300;
    let names = ["one", "two", "three"];
    let (mut servers, ports) = named_instances(&fleet, &names);
    let clients = healthy_clients(&ports).await;
    let mut runs = Vec::new();
    for _ in 0..SPREAD {
        let accepted = clients[0]
            .post_json("/v1/runs", &json!({"workflow": "held"}))
            .await
            .unwrap();
        runs.push(accepted["runId"].as_str().unwrap().to_string());
    }
    // Every run driven at once (each holds in its first node), by all three.
    let t0 = Instant::now();
    let counts = loop {
        let counts = driven_by(&ports, &names);
        if counts.iter().sum::<usize>() == SPREAD {
            break counts;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(180),
            "the runs were not all claimed: {counts:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    eprintln!("driven by one, two, three: {counts:?}");
    for (name, n) in names.iter().zip(&counts) {
        assert!(
            *n >= SPREAD / 5,
            "{name} drives {n} of {SPREAD}, less than a fifth: {counts:?}"
        );
    }
    // The API names the driver too.
    let state = clients[1]
        .run(&RunId::parse(&runs[0]).unwrap())
        .await
        .unwrap();
    assert!(
        names.contains(&state["instance"].as_str().unwrap_or_default()),
        "{state}"
    );

    // Let them go, and kill the third instance in the middle.
    std::fs::write(dir.path().join("go"), "").unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    let mut dead = servers.0[2].take().unwrap();
    dead.kill().unwrap();
    dead.wait().unwrap();

    for run in &runs {
        reaches(&clients[0], run, "finished", Duration::from_secs(180)).await;
    }
    let backend = cairn_postgres::PgBackend::open(store).unwrap();
    let taken_over = runs
        .iter()
        .filter(|run| check_run(&backend, run) > 1)
        .count();
    eprintln!("{taken_over} run(s) taken over from the killed instance");
    assert!(
        taken_over >= 1,
        "no run was taken over from the killed instance"
    );
    let marks = std::fs::read_to_string(dir.path().join("marks")).unwrap();
    for run in &runs {
        for node in ["a", "b"] {
            assert!(
                marks.lines().any(|l| l == format!("{run} {node}")),
                "{run} {node} never ran"
            );
        }
    }
    for s in servers.0.iter_mut().flatten() {
        unsafe { libc::kill(s.id() as i32, libc::SIGTERM) };
    }
    for s in std::mem::take(&mut servers.0).into_iter().flatten() {
        let mut s = s;
        let status = tokio::task::spawn_blocking(move || s.wait().unwrap())
            .await
            .unwrap();
        assert!(status.success(), "{status:?}");
    }
    drop(backend);
}

/// A child run is queued like any run: the instance whose share it is
/// claims it, here the one that does not drive its parent, and the parent
/// still finishes once the child has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_run_is_driven_by_another_instance_than_its_parent() {
    let Some(fleet) = Fleet::new("cairn_child") else {
        return;
    };
    let (store, dir) = (fleet.store.as_str(), &fleet.dir);
    let names = ["one", "two"];
    let (_servers, ports) = named_instances(&fleet, &names);
    let clients = healthy_clients(&ports).await;
    let parent = clients[0]
        .post_json("/v1/runs", &json!({"workflow": "parent"}))
        .await
        .unwrap()["runId"]
        .as_str()
        .unwrap()
        .to_string();
    let t0 = Instant::now();
    let (child, child_driver) = loop {
        let listed = clients[1]
            .get_json(&format!("/v1/runs?parent={parent}"))
            .await
            .unwrap();
        let driven = listed["runs"].as_array().unwrap().first().and_then(|r| {
            Some((
                r["runId"].as_str()?.to_string(),
                r["instance"].as_str()?.to_string(),
            ))
        });
        if let Some(found) = driven {
            break found;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the child was never driven: {listed}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let state = clients[1]
        .run(&RunId::parse(&parent).unwrap())
        .await
        .unwrap();
    let parent_driver = state["instance"].as_str().unwrap().to_string();
    assert_ne!(
        parent_driver, child_driver,
        "the child {child} is driven by its parent's instance"
    );
    let child_state = clients[0]
        .run(&RunId::parse(&child).unwrap())
        .await
        .unwrap();
    assert_eq!(child_state["parentRunId"], parent.as_str(), "{child_state}");
    std::fs::write(dir.path().join("go"), "").unwrap();
    reaches(&clients[0], &parent, "finished", Duration::from_secs(60)).await;
    reaches(&clients[1], &child, "finished", Duration::from_secs(60)).await;
    let backend = cairn_postgres::PgBackend::open(store).unwrap();
    check_run(&backend, &parent);
    check_run(&backend, &child);
    // The child's `RunStarted`, written by the instance that claimed it,
    // names its parent and the node that started it.
    use cairn_store::prelude::*;
    let first = backend
        .read_events(
            &cairn_events::RunId::parse(&child).unwrap(),
            &Default::default(),
        )
        .unwrap()[0]
        .decode()
        .unwrap();
    match first.kind {
        EventKind::RunStarted {
            parent_run_id,
            parent_node_id,
            depth,
            ..
        } => {
            assert_eq!(
                parent_run_id.as_ref().map(|r| r.as_str()),
                Some(parent.as_str())
            );
            assert_eq!(parent_node_id.as_deref(), Some("call"));
            assert_eq!(depth, 1);
        }
        other => panic!("{other:?}"),
    }
}

/// An instance claims no more than `--max-runs`: a run beyond it stays
/// queued (so shown, and listed by `?status=queued`) until room is freed;
/// a queued run cancelled ends without running a node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_claims_no_more_than_its_capacity() {
    let Some(fleet) = Fleet::new("cairn_capacity") else {
        return;
    };
    let (store, dir) = (fleet.store.as_str(), &fleet.dir);
    let port = free_port();
    let _servers = Instances(vec![Some(
        std::process::Command::new(env!("CARGO_BIN_EXE_cairn"))
            .args(["--store", store, "--instance-name", "small"])
            .args(["serve", "--max-runs", "1", "--addr"])
            .arg(format!("127.0.0.1:{port}"))
            .arg("--workflows")
            .arg(dir.path())
            .current_dir(dir.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    )]);
    let client = healthy_clients(&[port]).await.remove(0);
    let start = || async {
        client
            .post_json("/v1/runs", &json!({"workflow": "held"}))
            .await
            .unwrap()["runId"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let first = start().await;
    drives(port, "small", 1, "the first run was never claimed").await;
    let (second, third) = (start().await, start().await);
    // Room for one: the others wait, queued, and say so.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for run in [&second, &third] {
        let state = client.run(&RunId::parse(run).unwrap()).await.unwrap();
        assert_eq!(state["status"], "queued", "{state}");
    }
    let queued = client.get_json("/v1/runs?status=queued").await.unwrap();
    let mut listed: Vec<&str> = queued["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["runId"].as_str().unwrap())
        .collect();
    listed.sort();
    let mut expected = vec![second.as_str(), third.as_str()];
    expected.sort();
    assert_eq!(listed, expected, "{queued}");
    let metrics = common::metrics(port);
    for sample in [
        "cairn_instance_capacity{instance=\"small\"} 1\n",
        "cairn_runs_queued 2\n",
        "cairn_fleet_instances 1\n",
    ] {
        assert!(metrics.contains(sample), "{sample}: {metrics}");
    }
    // Cancelled while queued: it ends, and its first node never ran.
    client
        .post_json(&format!("/v1/runs/{third}/cancel"), &json!({"by": "test"}))
        .await
        .unwrap();
    reaches(&client, &third, "cancelled", Duration::from_secs(30)).await;
    // Room freed: the second is claimed once the first ends.
    std::fs::write(dir.path().join("go"), "").unwrap();
    reaches(&client, &first, "finished", Duration::from_secs(60)).await;
    reaches(&client, &second, "finished", Duration::from_secs(60)).await;
    let marks = std::fs::read_to_string(dir.path().join("marks")).unwrap();
    assert!(
        !marks.contains(&third),
        "the cancelled queued run ran a node: {marks}"
    );
    let backend = cairn_postgres::PgBackend::open(store).unwrap();
    use cairn_store::prelude::*;
    let stored: Vec<Event> = backend
        .read_events(&RunId::parse(&third).unwrap(), &Default::default())
        .unwrap()
        .iter()
        .map(|s| s.decode().unwrap())
        .collect();
    cairn_events::check_log(&stored).unwrap();
    assert!(matches!(stored[0].kind, EventKind::RunStarted { .. }));
}

/// `cairn run --queue` against PostgreSQL writes the run as work for the
/// fleet and exits with its id; an instance claims and finishes it. On
/// SQLite it is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_queues_a_run_for_the_fleet() {
    let Some(fleet) = Fleet::new("cairn_cli_queue") else {
        return;
    };
    let (store, dir) = (fleet.store.as_str(), &fleet.dir);
    let port = free_port();
    let _servers = Instances(vec![Some(common::serve(
        dir.path(),
        &["--store", store, "--instance-name", "only"],
        port,
    ))]);
    let client = healthy_clients(&[port]).await.remove(0);
    let queue = |store: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_cairn"))
            .args(["--store", store, "run", "--queue", "held.yaml"])
            .current_dir(dir.path())
            .env_remove("CAIRN_STORE")
            .output()
            .unwrap()
    };
    let out = queue(store);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = String::from_utf8(out.stdout).unwrap().trim().to_string();
    drives(port, "only", 1, "the queued run was never claimed").await;
    std::fs::write(dir.path().join("go"), "").unwrap();
    reaches(&client, &run, "finished", Duration::from_secs(60)).await;
    let out = queue(".cairn/cairn.db");
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--queue"));
}
