//! A fleet on one PostgreSQL database: runs per second with 1, 2 and 3
//! `cairn serve` instances, and the time from a claimable run to its
//! first node.
//!
//! For each fleet size it makes a database of its own on the server
//! (`CAIRN_BENCH_PG`, else `CAIRN_TEST_PG`, in plain text unless the URL
//! says otherwise), starts the instances (the real binary, child
//! processes, each its own name), and measures two things, every run
//! started through the first instance as a load balancer pinned to one
//! would:
//!
//! - **Burst**: `CAIRN_BENCH_RUNS` runs (default 600) started at once (32
//!   start requests in flight); the time from the first start to the last
//!   run's end, so runs per second started and finished; the CPU of the
//!   instances and of PostgreSQL's processes (utime + stime over the
//!   burst) and the machine's busy cores (`/proc/stat`), to tell how much
//!   the machine's cores, which the instances, PostgreSQL and the bench
//!   share, limit it; and how the runs were spread: the instance that drives each run
//!   (the API's `instance`), sampled while the burst runs (a run that
//!   ended before it was sampled is not counted).
//! - **Claim latency**: `CAIRN_BENCH_PACED` runs (default 200) started one
//!   at a time, `CAIRN_BENCH_GAP_MS` apart (default 20), on an otherwise
//!   idle fleet: from the run's row (queued, `createdMs`) to its first
//!   `NodeStarted`, p50, p99 and max, read from the store afterwards.
//!
//! - **Hand-over** (fleets of two or more): 30 runs waiting for a person,
//!   spread over the fleet; the last instance is sent SIGTERM, and the
//!   time from its exit until the others drive every run it drove (their
//!   `cairn_instance_driven_runs`).
//!
//! The baseline, measured in the same run, is the fleet of one: ratios
//! of runs per second are against it.
//!
//! Two workflows: `value` (two value nodes: Cairn's own work, the claim
//! and the commits) and `command` (a value node, then `true` as a
//! sandboxed command: what a run of commands costs). `CAIRN_BENCH_WORKLOADS`
//! picks (default `value,command`), `CAIRN_BENCH_INSTANCES` the fleet
//! sizes (default `1,2,3`), `CAIRN_BENCH_BIN` another `cairn` binary.
//!
//! `cargo bench -p cairn-cli --bench fleet`. Bounded: gives up after 30
//! minutes.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cairn_client::{wait_healthy, Client, RunId};
use cairn_store::prelude::*;
use serde_json::json;

const GIVE_UP: Duration = Duration::from_secs(30 * 60);
const STALL: Duration = Duration::from_secs(120);

const VALUE: &str = r#"
name: value
nodes:
  - id: a
    value: { x: 1 }
  - id: b
    needs: [a]
    value: { y: 2 }
"#;

/// Waits for a person: what a stopping instance hands over.
const GATED: &str = r#"
name: gated
nodes:
  - id: gate
    approval: "go on?"
"#;

const COMMAND: &str = r#"
name: command
nodes:
  - id: a
    value: { x: 1 }
  - id: b
    needs: [a]
    command: ["true"]
"#;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let r = rt.block_on(async { tokio::time::timeout(GIVE_UP, bench()).await });
    if r.is_err() {
        eprintln!("fleet: gave up after {} s", GIVE_UP.as_secs());
        std::process::exit(1);
    }
}

struct Row {
    workload: String,
    instances: usize,
    runs: usize,
    wall: Duration,
    /// Until the last start was answered.
    starts: Duration,
    cpu_s: f64,
    /// PostgreSQL's processes' CPU over the burst.
    pg_cpu_s: f64,
    /// The whole machine's busy cores over the burst.
    machine_busy: f64,
    spread: Vec<usize>,
    paced: Vec<f64>,
    /// The runs the last instance drove when it was sent SIGTERM, and how
    /// long until the others drove all of them (fleets of two or more).
    handover: Option<(usize, Duration)>,
}

async fn bench() {
    let server = std::env::var("CAIRN_BENCH_PG")
        .or_else(|_| std::env::var("CAIRN_TEST_PG"))
        .unwrap_or_else(|_| {
            "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable".to_string()
        });
    let runs = env("CAIRN_BENCH_RUNS", 600).max(1);
    let paced = env("CAIRN_BENCH_PACED", 200);
    let gap = Duration::from_millis(env("CAIRN_BENCH_GAP_MS", 20) as u64);
    let sizes: Vec<usize> = std::env::var("CAIRN_BENCH_INSTANCES")
        .unwrap_or_else(|_| "1,2,3".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .filter(|n| *n > 0)
        .collect();
    let workloads: Vec<String> = std::env::var("CAIRN_BENCH_WORKLOADS")
        .unwrap_or_else(|_| "value,command".into())
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| s == "value" || s == "command")
        .collect();
    let bin: PathBuf = std::env::var_os("CAIRN_BENCH_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_cairn").into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "fleet: {cores} cores, load {}; {runs} runs at once, then {paced} runs {} ms apart; fleets of {sizes:?}; workloads {workloads:?}",
        loadavg(),
        gap.as_millis()
    );
    let mut rows = Vec::new();
    for workload in &workloads {
        for &n in &sizes {
            let row = fleet(&bin, &server, workload, n, runs, paced, gap).await;
            row.print(
                rows.iter()
                    .find(|r: &&Row| r.workload == row.workload && r.instances == 1),
            );
            rows.push(row);
        }
    }
    println!("\n| workload | instances | runs | burst time | runs/s | vs 1 instance | instances' cores | PostgreSQL's cores | machine's cores busy | spread | first node p50 | p99 | max | SIGTERM hand-over |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|");
    for r in &rows {
        let base = rows
            .iter()
            .find(|b| b.workload == r.workload && b.instances == 1);
        r.table_line(base);
    }
}

impl Row {
    fn rate(&self) -> f64 {
        self.runs as f64 / self.wall.as_secs_f64()
    }

    fn ratio(&self, base: Option<&Row>) -> String {
        base.map_or("-".into(), |b| format!("{:.2}x", self.rate() / b.rate()))
    }

    fn print(&self, base: Option<&Row>) {
        let wall = self.wall.as_secs_f64();
        println!(
            "{} x{}: {} runs in {:.2} s (started in {:.2} s) = {:.0} runs/s ({} the fleet of one); CPU: instances {:.2} cores, PostgreSQL {:.2} cores, machine {:.2} of its cores busy; spread {:?}; first node p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms ({} paced runs); {}",
            self.workload,
            self.instances,
            self.runs,
            wall,
            self.starts.as_secs_f64(),
            self.rate(),
            self.ratio(base),
            self.cpu_s / wall,
            self.pg_cpu_s / wall,
            self.machine_busy,
            self.spread,
            pct(&self.paced, 50.0),
            pct(&self.paced, 99.0),
            pct(&self.paced, 100.0),
            self.paced.len(),
            self.handover_text(),
        );
    }

    fn handover_text(&self) -> String {
        match self.handover {
            Some((runs, t)) => format!(
                "{runs} waiting runs handed over in {:.0} ms after the SIGTERMed instance exited",
                t.as_secs_f64() * 1000.0
            ),
            None => "no hand-over (one instance)".into(),
        }
    }

    fn table_line(&self, base: Option<&Row>) {
        let wall = self.wall.as_secs_f64();
        println!(
            "| {} | {} | {} | {:.2} s | {:.0} | {} | {:.2} | {:.2} | {:.2} | {:?} | {:.1} ms | {:.1} ms | {:.1} ms | {} |",
            self.workload,
            self.instances,
            self.runs,
            wall,
            self.rate(),
            self.ratio(base),
            self.cpu_s / wall,
            self.pg_cpu_s / wall,
            self.machine_busy,
            self.spread,
            pct(&self.paced, 50.0),
            pct(&self.paced, 99.0),
            pct(&self.paced, 100.0),
            self.handover
                .map_or("-".into(), |(r, t)| format!("{r} in {:.0} ms", t.as_secs_f64() * 1000.0)),
        );
    }
}

/// The instances of one fleet, stopped (SIGTERM, then waited for) when it
/// goes.
struct Instances(Vec<Child>);

impl Drop for Instances {
    fn drop(&mut self) {
        for c in &self.0 {
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        }
        for c in &mut self.0 {
            let _ = c.wait();
        }
    }
}

async fn fleet(
    bin: &Path,
    server: &str,
    workload: &str,
    n: usize,
    runs: usize,
    paced: usize,
    gap: Duration,
) -> Row {
    let db = format!("cairn_fleet_bench_{}_{workload}_{n}", std::process::id());
    let store = cairn_postgres::testing::create_database(server, &db);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join(format!("{workload}.yaml")),
        if workload == "value" { VALUE } else { COMMAND },
    )
    .unwrap();
    std::fs::write(dir.path().join("gated.yaml"), GATED).unwrap();
    let ports: Vec<u16> = (0..n).map(|_| free_port()).collect();
    let instances = Instances(
        ports
            .iter()
            .enumerate()
            .map(|(i, p)| serve(bin, dir.path(), &store, &format!("i{i}"), *p))
            .collect(),
    );
    let mut clients = Vec::new();
    for p in &ports {
        let url = format!("http://127.0.0.1:{p}");
        wait_healthy(&url, Duration::from_secs(60)).await.unwrap();
        clients.push(Client::new(&url, None).unwrap());
    }
    let backend = cairn_postgres::PgBackend::open(&store).unwrap();
    let pids: Vec<u32> = instances.0.iter().map(|c| c.id()).collect();

    // The burst.
    let cpu0: u64 = pids.iter().map(|p| cpu_ticks(*p)).sum();
    let (pg0, machine0) = (postgres_ticks(), machine_ticks());
    let t0 = Instant::now();
    let started = start_all(&clients[0], workload, runs).await;
    let starts = t0.elapsed();
    let mut driver: std::collections::HashMap<String, usize> = Default::default();
    let mut last = (0, Instant::now());
    loop {
        let ended = ended(&store);
        if ended >= runs {
            break;
        }
        // Who drives what, while runs are driven: one list of the running
        // runs (their drivers in one look at the leases).
        if let Ok(list) = clients[0]
            .get_json("/v1/runs?status=running&limit=500")
            .await
        {
            for r in list["runs"].as_array().into_iter().flatten() {
                let (Some(run), Some(i)) = (
                    r["runId"].as_str(),
                    r["instance"]
                        .as_str()
                        .and_then(|s| s.strip_prefix('i'))
                        .and_then(|s| s.parse::<usize>().ok()),
                ) else {
                    continue;
                };
                driver.entry(run.to_string()).or_insert(i.min(n - 1));
            }
        }
        if ended != last.0 {
            last = (ended, Instant::now());
        }
        assert!(
            last.1.elapsed() < STALL,
            "{workload} x{n}: stalled at {ended} of {runs} runs"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let wall = t0.elapsed();
    let mut spread = vec![0usize; n];
    for i in driver.values() {
        spread[*i] += 1;
    }
    let cpu1: u64 = pids.iter().map(|p| cpu_ticks(*p)).sum();
    let cpu_s = (cpu1 - cpu0) as f64 / ticks_per_second();
    let pg_cpu_s = postgres_ticks().saturating_sub(pg0) as f64 / ticks_per_second();
    let machine1 = machine_ticks();
    let machine_busy = (machine1.0.saturating_sub(machine0.0)) as f64
        / (machine1.1.saturating_sub(machine0.1)).max(1) as f64
        * std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    check_finished(&backend, &started);

    // Paced runs, one at a time on the idle fleet.
    let mut paced_runs = Vec::new();
    for _ in 0..paced {
        paced_runs.push(start_one(&clients[0], workload).await);
        tokio::time::sleep(gap).await;
    }
    let t = Instant::now();
    while ended(&store) < runs + paced {
        assert!(t.elapsed() < STALL, "{workload} x{n}: paced runs stalled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    check_finished(&backend, &paced_runs);
    let mut delays = Vec::new();
    for run in &paced_runs {
        let rec = backend.get_run(run).unwrap().unwrap();
        let first = backend
            .read_events(
                run,
                &cairn_store::EventQuery {
                    types: vec![cairn_events::EventType::NodeStarted],
                    limit: Some(1),
                    ..Default::default()
                },
            )
            .unwrap();
        let at = first[0].decode().unwrap().timestamp_ms;
        delays.push((at - rec.created_ms) as f64);
    }
    let mut instances = instances;
    let handover = if n > 1 {
        Some(hand_over(&mut instances, &clients, &ports, n).await)
    } else {
        None
    };
    drop(instances);
    drop(backend);
    cairn_postgres::testing::drop_database(server, &db);
    Row {
        workload: workload.to_string(),
        instances: n,
        runs,
        wall,
        starts,
        cpu_s,
        pg_cpu_s,
        machine_busy,
        spread,
        paced: delays,
        handover,
    }
}

/// Starts 30 runs that wait for a person, spread over the fleet, then
/// sends SIGTERM to the last instance and measures how long until the
/// others drive every run it drove (each instance's `/metrics`).
async fn hand_over(
    instances: &mut Instances,
    clients: &[Client],
    ports: &[u16],
    n: usize,
) -> (usize, Duration) {
    const WAITING: usize = 30;
    for _ in 0..WAITING {
        start_one(&clients[0], "gated").await;
    }
    let t = Instant::now();
    all_driven_by(
        ports,
        WAITING,
        Duration::from_millis(20),
        t,
        "the waiting runs were never all driven",
    )
    .await;
    let last = n - 1;
    let theirs = driven(ports[last], last).await;
    let mut child = instances.0.remove(last);
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let t0 = Instant::now();
    let _ = tokio::task::spawn_blocking(move || child.wait()).await;
    all_driven_by(
        &ports[..last],
        WAITING,
        Duration::from_millis(5),
        t0,
        "the stopped instance's runs were never taken over",
    )
    .await;
    (theirs, t0.elapsed())
}

/// The runs instance `i` (on `port`) drives, by its `/metrics`.
async fn driven(port: u16, i: usize) -> usize {
    let text = reqwest_metrics(port).await;
    let sample = format!("cairn_instance_driven_runs{{instance=\"i{i}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&sample)?.trim().parse::<usize>().ok())
        .unwrap_or(0)
}

/// Waits, looking every `every`, until the instances on `ports` (named
/// `i0`, `i1`, ... in order) drive `runs` runs between them.
async fn all_driven_by(
    ports: &[u16],
    runs: usize,
    every: Duration,
    since: Instant,
    otherwise: &str,
) {
    loop {
        let mut sum = 0;
        for (i, p) in ports.iter().enumerate() {
            sum += driven(*p, i).await;
        }
        if sum == runs {
            return;
        }
        assert!(since.elapsed() < STALL, "{otherwise}");
        tokio::time::sleep(every).await;
    }
}

/// An instance's `/metrics`.
async fn reqwest_metrics(port: u16) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
        return String::new();
    };
    let req =
        format!("GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n");
    if s.write_all(req.as_bytes()).await.is_err() {
        return String::new();
    }
    let mut text = String::new();
    let _ = s.read_to_string(&mut text).await;
    text
}

fn serve(bin: &Path, dir: &Path, store: &str, name: &str, port: u16) -> Child {
    Command::new(bin)
        .args(["--store", store, "--instance-name", name])
        .args([
            "serve",
            "--addr",
            &format!("127.0.0.1:{port}"),
            "--workflows",
        ])
        .arg(dir)
        .current_dir(dir)
        .env_remove("CAIRN_TOKEN")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

async fn start_one(client: &Client, workload: &str) -> RunId {
    let accepted = client
        .post_json("/v1/runs", &json!({ "workflow": workload }))
        .await
        .unwrap();
    RunId::parse(accepted["runId"].as_str().unwrap()).unwrap()
}

/// Starts `runs` runs, 32 requests in flight.
async fn start_all(client: &Client, workload: &str, runs: usize) -> Vec<RunId> {
    let sem = std::sync::Arc::new(tokio::sync::Semaphore::new(32));
    let mut tasks = Vec::new();
    for _ in 0..runs {
        let (client, workload, sem) = (client.clone(), workload.to_string(), sem.clone());
        tasks.push(tokio::spawn(async move {
            let _permit = sem.acquire().await.unwrap();
            start_one(&client, &workload).await
        }));
    }
    let mut ids = Vec::new();
    for t in tasks {
        ids.push(t.await.unwrap());
    }
    ids
}

/// Runs of the store that have ended: one count, on a connection of its
/// own, so that the poll costs the server little.
fn ended(store: &str) -> usize {
    cairn_postgres::testing::query_i64(
        store,
        "SELECT count(*) FROM runs WHERE status IN ('finished', 'failed', 'cancelled')",
    )
    .max(0) as usize
}

fn check_finished(backend: &cairn_postgres::PgBackend, runs: &[RunId]) {
    for run in runs {
        let rec = backend.get_run(run).unwrap().unwrap();
        assert_eq!(rec.status.as_str(), "finished", "{run} did not finish");
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// utime + stime of a process, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0;
    };
    let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = after.split_whitespace().collect();
    let get = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    // Fields 14 and 15 of stat, counted after the name's `)`.
    get(11) + get(12)
}

/// utime + stime of every process named `postgres` (the server's
/// backends and its background processes), in clock ticks.
fn postgres_ticks() -> u64 {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return 0;
    };
    procs
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.trim() == "postgres")
        })
        .map(cpu_ticks)
        .sum()
}

/// The machine's busy and total CPU time (`/proc/stat`'s first line), in
/// clock ticks over all cores.
fn machine_ticks() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let v: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let total: u64 = v.iter().take(8).sum();
    // idle and iowait are not busy.
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    (total.saturating_sub(idle), total)
}

fn ticks_per_second() -> f64 {
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn pct(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let i = ((p / 100.0) * (s.len() - 1) as f64).round() as usize;
    s[i.min(s.len() - 1)]
}
