//! Commands across processes: how long a decision sent from one process
//! takes to be committed by the process that drives the run.
//!
//! `cargo bench -p cairn-engine --bench inbox` (about ten seconds).
//!
//! A child process (this binary with `--driver`) drives a run of
//! `CAIRN_BENCH_GATES` approval gates in a chain (200 by default) on a
//! SQLite store in a temporary folder. This process waits for each gate
//! through a subscription to the run (woken by the store's wake-ups, as
//! `cairn logs --follow` is), then sends the approval with
//! [`Engine::decide`], the path `cairn approve` and the server take: the
//! command is recorded in the run's inbox, the driver is woken, applies it and
//! commits `ApprovalGranted`, and `decide` returns once the subscription has
//! seen that event committed. The latency is `decide`'s wall time.
//!
//! Baseline, in the same run and store: one `append_durable` of an event to
//! another run from this process, i.e. one commit, which a cross-process
//! command cannot go below (it needs at least two: the inbox row and the
//! event).

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_engine::{Engine, EngineOptions, StartOptions};
use cairn_events::{EventKind, Scope};
use cairn_store::{Journal, JournalOptions, RunRecord};
use serde_json::json;

const TARGET_P99_MS: f64 = 20.0;

fn gates() -> usize {
    std::env::var("CAIRN_BENCH_GATES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200)
}

fn journal(dir: &Path) -> Journal {
    Journal::open_sqlite(
        &dir.join("cairn.db"),
        JournalOptions {
            log_dir: Some(dir.join("logs")),
        },
    )
    .expect("open the store")
}

fn workflow(n: usize) -> String {
    let mut y = String::from("name: gates\nnodes:\n");
    for i in 0..n {
        y.push_str(&format!("  - id: g{i}\n    approval: \"gate {i}\"\n"));
        if i > 0 {
            y.push_str(&format!("    needs: [g{}]\n", i - 1));
        }
    }
    y
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// The child: drives the run to its end.
fn drive(dir: &Path, n: usize) {
    let path = dir.join("gates.yaml");
    std::fs::write(&path, workflow(n)).unwrap();
    let j = journal(dir);
    let engine = Engine::new(j.clone(), EngineOptions::default());
    let outcome = runtime().block_on(async {
        let wf = cairn_workflow::load(&path).unwrap();
        let opts = StartOptions {
            run_id: Some(cairn_events::RunId::parse("bench").unwrap()),
            ..StartOptions::default()
        };
        engine
            .start(wf, json!({}), opts)
            .await
            .unwrap()
            .wait()
            .await
    });
    j.close();
    assert_eq!(outcome.exit_code(), 0, "the driven run ended {outcome:?}");
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--driver") {
        drive(Path::new(&args[i + 1]), args[i + 2].parse().unwrap());
        return;
    }
    let n = gates();
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .arg("--driver")
        .arg(dir.path())
        .arg(n.to_string())
        .stdin(Stdio::null())
        .spawn()
        .expect("start the driving process");

    let j = journal(dir.path());
    let engine = Engine::new(j.clone(), EngineOptions::default());
    let rt = runtime();
    let (latencies, floor) = rt.block_on(async {
        // The child creates the run; wait for it (setup, not measured).
        let t0 = Instant::now();
        while j
            .backend()
            .get_run(&cairn_events::RunId::parse("bench").unwrap())
            .unwrap()
            .is_none()
        {
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "the run never appeared"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let mut events = j
            .subscribe(&cairn_events::RunId::parse("bench").unwrap(), 0)
            .unwrap();
        let mut latencies = Vec::with_capacity(n);
        for i in 0..n {
            let gate = format!("g{i}");
            // Wait until this gate waits, as a person's client would.
            loop {
                let ev = events
                    .next()
                    .await
                    .expect("the run ended early")
                    .expect("subscription");
                if ev.type_name == "NodeWaitingApproval" && ev.node_id.as_deref() == Some(&gate) {
                    break;
                }
            }
            let t = Instant::now();
            engine
                .decide(
                    &cairn_events::RunId::parse("bench").unwrap(),
                    &gate,
                    true,
                    None,
                    Some("bench".into()),
                )
                .await
                .expect("approve");
            latencies.push(t.elapsed().as_secs_f64() * 1e3);
        }
        // The floor: one durable commit from this process, same store.
        j.backend()
            .create_run(&RunRecord {
                run_id: cairn_events::RunId::parse("floor").unwrap(),
                workflow: "floor".into(),
                workflow_path: String::new(),
                workflow_hash: String::new(),
                workflow_source: String::new(),
                input: json!(null),
                status: cairn_store::RecordStatus::Pending,
                created_ms: 0,
                updated_ms: 0,
                parent_run_id: None,
            })
            .unwrap();
        let log = Arc::new(
            j.run_log(&cairn_events::RunId::parse("floor").unwrap())
                .unwrap(),
        );
        let mut floor = Vec::with_capacity(n);
        for i in 0..n {
            let t = Instant::now();
            log.append_durable(
                Scope::node(format!("g{i}"), 0),
                EventKind::ApprovalGranted {
                    decided_by: Some("bench".into()),
                    note: None,
                },
            )
            .await
            .unwrap();
            floor.push(t.elapsed().as_secs_f64() * 1e3);
        }
        (latencies, floor)
    });
    let status = child.wait().unwrap();
    assert!(status.success(), "the driving process failed");
    j.close();

    let mut l = latencies;
    let mut f = floor;
    l.sort_by(|a, b| a.partial_cmp(b).unwrap());
    f.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!();
    println!("cross-process approve until ApprovalGranted is committed, {n} gates, SQLite (WAL)");
    println!(
        "{:<28} {:>8} {:>8} {:>8} {:>8} {:>10}",
        "case", "p50 ms", "p90 ms", "p99 ms", "max ms", "× floor"
    );
    let row = |name: &str, v: &[f64], ratio: f64| {
        println!(
            "{:<28} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>10.2}",
            name,
            percentile(v, 0.5),
            percentile(v, 0.9),
            percentile(v, 0.99),
            v[v.len() - 1],
            ratio
        );
    };
    let floor_p50 = percentile(&f, 0.5);
    row(
        "approve (other process)",
        &l,
        percentile(&l, 0.5) / floor_p50,
    );
    row("floor: one durable commit", &f, 1.0);
    let p99 = percentile(&l, 0.99);
    println!(
        "target: p99 < {TARGET_P99_MS} ms: {}",
        if p99 < TARGET_P99_MS { "ok" } else { "MISSED" }
    );
}
