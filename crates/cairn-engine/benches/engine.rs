//! Engine overhead: workflows of 10,000 `value` nodes on a real SQLite store.
//!
//! `cargo bench -p cairn-engine --bench engine` (about half a minute).
//!
//! Cases, each in a child process of this binary so that its peak memory
//! (VmHWM) is its own:
//!
//! - chain: `n1` needs `n0`, `n2` needs `n1`, ... 10,000 nodes;
//! - fan-out: one root and 9,999 nodes that need it;
//! - journal: the same number of events as the chain run wrote, appended
//!   straight through the journal (`RunLog::append` then one `sync`): the
//!   cost of the log alone, which the engine cannot go below.
//!
//! Value nodes do no work, so a run's wall time (start until the run's end
//! is durable) divided by its nodes is the engine's overhead per node:
//! planning, scheduling, template context, events and their commits.
//! `CAIRN_BENCH_NODES` changes the node count.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use cairn_engine::{Engine, EngineOptions, RunOutcome, StartOptions};
use cairn_events::{EventKind, Scope};
use cairn_store::{Journal, JournalOptions};
use serde_json::json;

const TARGET_US_PER_NODE: f64 = 100.0;
const TARGET_PEAK_MB: f64 = 100.0;

fn nodes() -> usize {
    std::env::var("CAIRN_BENCH_NODES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000)
}

/// What one child process measured.
#[derive(Debug, Clone)]
struct Measure {
    case: String,
    nodes: usize,
    events: u64,
    load_ms: f64,
    wall_ms: f64,
    peak_mb: f64,
}

fn workflow(shape: &str, n: usize) -> String {
    let mut y = String::with_capacity(n * 48);
    y.push_str(&format!("name: bench-{shape}\nnodes:\n"));
    for i in 0..n {
        y.push_str(&format!("  - id: n{i}\n    value: {i}\n"));
        match (shape, i) {
            (_, 0) => {}
            ("chain", _) => y.push_str(&format!("    needs: [n{}]\n", i - 1)),
            _ => y.push_str("    needs: [n0]\n"),
        }
    }
    y
}

/// Peak resident set of this process, from /proc/self/status.
fn peak_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
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

fn run_workflow(shape: &str, n: usize) -> Measure {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wf.yaml");
    std::fs::write(&path, workflow(shape, n)).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let journal = journal(dir.path());
    let t0 = Instant::now();
    let wf = cairn_workflow::load(&path).expect("load the workflow");
    let load_ms = t0.elapsed().as_secs_f64() * 1e3;
    let engine = Engine::new(journal.clone(), EngineOptions::default());
    let count = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let c2 = count.clone();
    let opts = StartOptions {
        observer: Some(Arc::new(move |_| {
            c2.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        })),
        ..StartOptions::default()
    };
    let t0 = Instant::now();
    let outcome = rt.block_on(async {
        engine
            .start(wf, json!({}), opts)
            .await
            .expect("start")
            .wait()
            .await
    });
    let wall_ms = t0.elapsed().as_secs_f64() * 1e3;
    assert!(
        matches!(outcome, RunOutcome::Finished(_)),
        "the {shape} run ended {outcome:?}"
    );
    journal.close();
    Measure {
        case: shape.to_string(),
        nodes: n,
        events: count.load(std::sync::atomic::Ordering::Relaxed),
        load_ms,
        wall_ms,
        peak_mb: peak_mb(),
    }
}

/// The journal alone: as many events as a run wrote, of the kinds a value
/// node writes (pending, started, finished with its output).
fn run_journal(n: usize, events: u64) -> Measure {
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let journal = journal(dir.path());
    let t0 = Instant::now();
    rt.block_on(async {
        let log = journal.run_log("bench-journal").expect("run log");
        for i in 0..events {
            let node = format!("n{}", (i / 3) as usize % n.max(1));
            let scope = Scope::node(node, 0);
            let kind = match i % 3 {
                0 => EventKind::NodePending {
                    layer_index: Some(0),
                },
                1 => {
                    log.append(scope.with_attempt(1), EventKind::NodeStarted {});
                    continue;
                }
                _ => {
                    log.append(
                        scope.with_attempt(1),
                        EventKind::NodeFinished {
                            duration_ms: 0,
                            output: Some(json!(i)),
                            cached: None,
                        },
                    );
                    continue;
                }
            };
            log.append(scope, kind);
        }
        log.sync().await.expect("sync");
    });
    let wall_ms = t0.elapsed().as_secs_f64() * 1e3;
    journal.close();
    Measure {
        case: "journal".into(),
        nodes: n,
        events,
        load_ms: 0.0,
        wall_ms,
        peak_mb: peak_mb(),
    }
}

fn child(args: &[&str]) -> Measure {
    let exe = std::env::current_exe().unwrap();
    let out = Command::new(exe)
        .arg("--case")
        .args(args)
        .output()
        .expect("run the bench case");
    assert!(
        out.status.success(),
        "case {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("MEASURE "))
        .expect("the case printed its measure");
    let f: Vec<&str> = line.split_whitespace().collect();
    Measure {
        case: f[0].to_string(),
        nodes: f[1].parse().unwrap(),
        events: f[2].parse().unwrap(),
        load_ms: f[3].parse().unwrap(),
        wall_ms: f[4].parse().unwrap(),
        peak_mb: f[5].parse().unwrap(),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--case") {
        let case = args[i + 1].as_str();
        let n: usize = args[i + 2].parse().unwrap();
        let m = match case {
            "journal" => run_journal(n, args[i + 3].parse().unwrap()),
            shape => run_workflow(shape, n),
        };
        println!(
            "MEASURE {} {} {} {:.3} {:.3} {:.1}",
            m.case, m.nodes, m.events, m.load_ms, m.wall_ms, m.peak_mb
        );
        return;
    }
    let n = nodes();
    let chain = child(&["chain", &n.to_string()]);
    let fanout = child(&["fanout", &n.to_string()]);
    let base = child(&["journal", &n.to_string(), &chain.events.to_string()]);

    println!();
    println!("engine overhead, {n} value nodes on SQLite (WAL), NDJSON mirror on");
    println!(
        "{:<8} {:>8} {:>9} {:>10} {:>11} {:>10} {:>14} {:>9}",
        "case", "events", "load ms", "run ms", "µs/node", "peak MB", "× journal/ev", "verdict"
    );
    let base_us_per_event = base.wall_ms * 1e3 / base.events as f64;
    for m in [&chain, &fanout] {
        let per_node = m.wall_ms * 1e3 / m.nodes as f64;
        let per_event = m.wall_ms * 1e3 / m.events as f64;
        let ok = per_node <= TARGET_US_PER_NODE && m.peak_mb < TARGET_PEAK_MB;
        println!(
            "{:<8} {:>8} {:>9.1} {:>10.1} {:>11.1} {:>10.1} {:>14.2} {:>9}",
            m.case,
            m.events,
            m.load_ms,
            m.wall_ms,
            per_node,
            m.peak_mb,
            per_event / base_us_per_event,
            if ok { "ok" } else { "MISSED" }
        );
    }
    println!(
        "{:<8} {:>8} {:>9} {:>10.1} {:>11} {:>10.1} {:>14.2} {:>9}",
        "journal", base.events, "-", base.wall_ms, "-", base.peak_mb, 1.0, "baseline"
    );
    println!(
        "targets: ≤ {TARGET_US_PER_NODE} µs of engine overhead per node, peak memory < {TARGET_PEAK_MB} MB; \
         journal = the same number of events appended straight to the log ({base_us_per_event:.2} µs/event)"
    );
}
