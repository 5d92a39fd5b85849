//! Engine overhead by workflow shape and size, on a real SQLite store.
//!
//! `cargo bench -p cairn-engine --bench engine`: every case at 1,000, 10,000
//! and 100,000 nodes, 1 to 2 minutes on a 2-core machine (the 100,000 runs
//! take most of it; plus the build). `CAIRN_BENCH_SIZES=1000,10000` picks sizes,
//! `CAIRN_BENCH_CASES=chain,fanin` picks cases.
//!
//! Cases, each run in a child process of this binary so that its peak memory
//! (VmHWM) is its own:
//!
//! - chain: `n1` needs `n0`, `n2` needs `n1`, ...;
//! - fanout: one root and N - 1 nodes that need it;
//! - fanin: one root, N - 2 nodes that need it, and one join that needs them all;
//! - foreach: a `for_each` over a list of N - 2 items, one value node each
//!   (`{{ item }}`);
//! - loop: a loop of N - 1 passes of one value node;
//! - templated: a chain whose nodes read their predecessor
//!   (`{{ nodes.n41.output + 1 }}`), so every render looks into `nodes`;
//! - nested: an outer loop of N / 20 passes, each running 19 loops of one pass
//!   nested in each other around one value node (loops in loops at scale);
//! - deep: 200 loops of one pass nested in each other (201 nodes whatever the
//!   size): the plan's recursion at depth;
//! - journal (the baseline, once per size): the chain's number of events
//!   appended straight through the journal (`RunLog::append`, then one
//!   `sync`): the cost of the log alone, which the engine cannot go below.
//!
//! Value nodes do no work, so a run's wall time (start until the run's end is
//! durable) is the engine plus its log. The table prints, per node: the total
//! (wall / nodes), and the engine's overhead in two ways: wall minus what the
//! journal baseline takes for the same number of events (its µs per event ×
//! the case's events), divided by nodes; and the CPU time of the engine's
//! threads (the runtime's workers, where the driver runs) divided by nodes,
//! read from each thread's `schedstat`, beside the CPU time of the store's
//! writer thread. The first includes whatever the store does differently
//! under the engine than under the baseline, and the machine's noise; the
//! second is the engine's own work whatever the store and the neighbours do. It also prints the case's time per
//! event over the journal's (`× journal`), the peak memory, and per shape the
//! growth of the per-node total and overhead from the smallest to the largest
//! size. Every case checks that every node instance finished. Runs shorter
//! than a second are noisy on a shared machine, so each case (and the
//! baseline) runs `20,000 / N` times (1 to 10, `CAIRN_BENCH_REPEAT` to
//! change it) and the median run by wall time counts, with the median of
//! each CPU time over the runs; peak memory is the highest seen.
//! Each case sets up the allocators as the CLI does (jemalloc with one
//! arena, glibc's malloc, which SQLite uses, with two; the parse's freed
//! memory returned after loading); `CAIRN_BENCH_MALLOC_DEFAULT=1` leaves
//! the arenas and the parse's memory alone, to compare.
//!
//! `CAIRN_BENCH_STORE=postgres` runs every case and the journal baseline on
//! PostgreSQL instead (the server `CAIRN_TEST_PG` names, e.g.
//! `postgres://postgres@127.0.0.1:5432/postgres`): each child process opens a
//! `PgBackend` on a schema of its own, dropped when the case ends, under the
//! same journal (NDJSON mirror on), so the table compares the engine with the
//! journal on the same store. The store's CPU (`log CPU`) then counts the
//! PostgreSQL client's threads (`cairn-pg`) with the writer's; the server's
//! own processes are in neither column. Without `CAIRN_TEST_PG` it says so
//! and measures nothing. E.g. `CAIRN_BENCH_STORE=postgres
//! CAIRN_BENCH_SIZES=10000 CAIRN_BENCH_CASES=chain,fanout cargo bench -p
//! cairn-engine --bench engine`.

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use cairn_engine::{Engine, EngineOptions, RunOutcome, StartOptions};
use cairn_events::{EventKind, Scope};
use cairn_store::{Journal, JournalOptions};
use serde_json::json;

// The allocator the `cairn` binary runs with.
cairn_engine::use_run_allocator!();

const TARGET_OVERHEAD_US: f64 = 50.0;
const TARGET_PEAK_MB: f64 = 150.0;
const TARGET_GROWTH: f64 = 1.5;
const NEST_DEPTH: usize = 20;
const DEEP_LEVELS: usize = 200;
const CASES: &[&str] = &[
    "chain",
    "fanout",
    "fanin",
    "foreach",
    "loop",
    "templated",
    "nested",
    "deep",
];

/// A comma-separated list from the environment, or `default`.
fn list_env<T: std::str::FromStr + Clone>(name: &str, default: &[T]) -> Vec<T> {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => v
            .split(',')
            .map(|s| {
                s.trim()
                    .parse()
                    .unwrap_or_else(|_| panic!("{name}: cannot read `{s}`"))
            })
            .collect(),
        _ => default.to_vec(),
    }
}

/// What one child process measured.
#[derive(Debug, Clone)]
struct Measure {
    case: String,
    nodes: usize,
    events: u64,
    load_ms: f64,
    wall_ms: f64,
    /// Peak resident memory while loading the workflow file.
    load_mb: f64,
    /// Peak resident memory from the run's start to its end.
    peak_mb: f64,
    /// CPU time of the runtime's threads (the driver and what it spawns).
    engine_cpu_ms: f64,
    /// CPU time of the store's writer thread.
    store_cpu_ms: f64,
}

/// CPU time so far of this process's threads other than the main one, in
/// ms: (the store's writer, every other thread). From each thread's
/// `schedstat` (nanoseconds on a CPU).
fn thread_cpu_ms() -> (f64, f64) {
    let me = std::process::id().to_string();
    let (mut store, mut other) = (0.0, 0.0);
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return (f64::NAN, f64::NAN);
    };
    for t in tasks.flatten() {
        if t.file_name().to_string_lossy() == me {
            continue;
        }
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        let ns: f64 = std::fs::read_to_string(t.path().join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse().ok())
            .unwrap_or(0.0);
        // On PostgreSQL the writer waits on the client's runtime, which
        // does the store's work: both are the store's.
        if comm.starts_with("cairn-store") || comm.starts_with("cairn-pg") {
            store += ns / 1e6;
        } else {
            other += ns / 1e6;
        }
    }
    (store, other)
}

/// The workflow of one case at `n` nodes, and how many node instances it
/// runs (each writes one `NodeFinished`).
fn workflow(shape: &str, n: usize) -> (String, usize) {
    let mut y = String::with_capacity(n * 48);
    y.push_str(&format!("name: bench-{shape}\nnodes:\n"));
    let n = n.max(2);
    let instances = match shape {
        "chain" | "fanout" | "fanin" | "templated" => {
            for i in 0..n {
                y.push_str(&format!("  - id: n{i}\n"));
                match shape {
                    "templated" if i > 0 => y.push_str(&format!(
                        "    value: \"{{{{ nodes.n{}.output + 1 }}}}\"\n",
                        i - 1
                    )),
                    _ => y.push_str(&format!("    value: {i}\n")),
                }
                match (shape, i) {
                    (_, 0) => {}
                    ("chain" | "templated", _) => y.push_str(&format!("    needs: [n{}]\n", i - 1)),
                    ("fanin", i) if i == n - 1 => {
                        let all: Vec<String> = (1..n - 1).map(|j| format!("n{j}")).collect();
                        y.push_str(&format!("    needs: [{}]\n", all.join(", ")));
                    }
                    _ => y.push_str("    needs: [n0]\n"),
                }
            }
            n
        }
        "foreach" => {
            let items: Vec<String> = (0..n - 2).map(|i| i.to_string()).collect();
            y.push_str(&format!(
                "  - id: items\n    value: [{}]\n",
                items.join(", ")
            ));
            y.push_str(concat!(
                "  - id: each\n    needs: [items]\n    for_each: \"nodes.items.output\"\n",
                "    nodes:\n      - id: v\n        value: \"{{ item }}\"\n",
            ));
            n
        }
        "loop" => {
            let passes = n - 1;
            y.push_str(&format!(
                "  - id: l\n    loop:\n      until: \"iteration >= {}\"\n      max_iterations: {passes}\n      nodes:\n        - id: v\n          value: 1\n",
                passes - 1
            ));
            n
        }
        "nested" => {
            // An outer loop whose every pass runs NEST_DEPTH - 1 loops of one
            // pass nested in each other, the innermost holding one value node.
            let passes = (n / NEST_DEPTH).max(1);
            y.push_str(&format!(
                "  - id: o\n    loop:\n      until: \"iteration >= {}\"\n      max_iterations: {passes}\n      nodes:\n",
                passes - 1
            ));
            nest(&mut y, 8, NEST_DEPTH - 1);
            passes * NEST_DEPTH + 1
        }
        "deep" => {
            // DEEP_LEVELS loops of one pass nested in each other, whatever `n`.
            y.push_str("  - id: d\n    loop:\n      until: \"true\"\n      max_iterations: 1\n      nodes:\n");
            nest(&mut y, 8, DEEP_LEVELS - 1);
            DEEP_LEVELS + 1
        }
        other => panic!("unknown case `{other}`"),
    };
    (y, instances)
}

/// `levels` loops of one pass nested in each other at `indent`, the innermost
/// holding one value node.
fn nest(y: &mut String, indent: usize, levels: usize) {
    let mut pad = " ".repeat(indent);
    for _ in 0..levels {
        y.push_str(&format!(
            "{pad}- id: a\n{pad}  loop:\n{pad}    until: \"true\"\n{pad}    max_iterations: 1\n{pad}    nodes:\n"
        ));
        pad.push_str("      ");
    }
    y.push_str(&format!("{pad}- id: v\n{pad}  value: 1\n"));
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

/// Whether `CAIRN_BENCH_STORE` asks for PostgreSQL (SQLite otherwise).
fn on_postgres() -> bool {
    match std::env::var("CAIRN_BENCH_STORE") {
        Ok(s) if s.eq_ignore_ascii_case("postgres") || s.eq_ignore_ascii_case("postgresql") => true,
        Ok(s) if s.is_empty() || s.eq_ignore_ascii_case("sqlite") => false,
        Ok(s) => panic!("CAIRN_BENCH_STORE: `{s}` is neither sqlite nor postgres"),
        Err(_) => false,
    }
}

/// A case's PostgreSQL schema, made for it and dropped (with the scratch)
/// when the case ends; `None` on SQLite.
fn pg_store() -> Option<(cairn_postgres::testing::Scratch, String)> {
    if !on_postgres() {
        return None;
    }
    let scratch = cairn_postgres::testing::Scratch::new()
        .expect("CAIRN_BENCH_STORE=postgres needs a server at CAIRN_TEST_PG");
    let schema = scratch.schema();
    Some((scratch, schema))
}

fn journal(dir: &Path, pg: Option<&(cairn_postgres::testing::Scratch, String)>) -> Journal {
    let opts = JournalOptions {
        log_dir: Some(dir.join("logs")),
    };
    match pg {
        Some((scratch, schema)) => {
            let backend = scratch.open(schema, cairn_postgres::PgOptions::default());
            Journal::open(Arc::new(backend), opts).expect("open the store")
        }
        None => Journal::open_sqlite(&dir.join("cairn.db"), opts).expect("open the store"),
    }
}

fn run_workflow(shape: &str, n: usize) -> Measure {
    let dir = tempfile::tempdir().unwrap();
    // Dropped last: the schema goes once everything that used it has.
    let pg = pg_store();
    let path = dir.path().join("wf.yaml");
    let (yaml, instances) = workflow(shape, n);
    std::fs::write(&path, yaml).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let journal = journal(dir.path(), pg.as_ref());
    let t0 = Instant::now();
    let wf = cairn_workflow::load(&path).expect("load the workflow");
    let load_ms = t0.elapsed().as_secs_f64() * 1e3;
    if std::env::var_os("CAIRN_BENCH_MALLOC_DEFAULT").is_none() {
        cairn_engine::release_free_memory();
    }
    // Loading is the parser's peak, not the engine's: measured apart, then
    // the high-water mark starts again from what is resident now.
    let load_mb = peak_mb();
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let engine = Engine::new(journal.clone(), EngineOptions::default());
    let count = Arc::new(AtomicU64::new(0));
    let finished = Arc::new(AtomicU64::new(0));
    let (c2, f2) = (count.clone(), finished.clone());
    let opts = StartOptions {
        observer: Some(Arc::new(move |ev: &cairn_events::Event| {
            c2.fetch_add(1, Ordering::Relaxed);
            if matches!(ev.kind, EventKind::NodeFinished { .. }) {
                f2.fetch_add(1, Ordering::Relaxed);
            }
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
    let (store_cpu_ms, engine_cpu_ms) = thread_cpu_ms();
    let finished = finished.load(Ordering::Relaxed) as usize;
    assert_eq!(
        finished, instances,
        "the {shape} run finished {finished} node instances, not {instances}"
    );
    journal.close();
    Measure {
        case: shape.to_string(),
        nodes: instances,
        events: count.load(Ordering::Relaxed),
        load_ms,
        wall_ms,
        load_mb,
        peak_mb: peak_mb(),
        engine_cpu_ms,
        store_cpu_ms,
    }
}

/// The journal alone: as many events as a run wrote, of the kinds a value
/// node writes (pending, started, finished with its output).
fn run_journal(n: usize, events: u64) -> Measure {
    let dir = tempfile::tempdir().unwrap();
    let pg = pg_store();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let journal = journal(dir.path(), pg.as_ref());
    let t0 = Instant::now();
    rt.block_on(async {
        let log = journal
            .run_log(&cairn_events::RunId::parse("bench-journal").unwrap())
            .expect("run log");
        for i in 0..events {
            let node = format!("n{}", (i / 3) as usize % n.max(1));
            let scope = Scope::node(node, 0);
            let kind = match i % 3 {
                0 => EventKind::NodePending {
                    layer_index: Some(0),
                },
                1 => {
                    log.append(
                        scope.with_attempt(1),
                        EventKind::NodeStarted { snapshot: None },
                    );
                    continue;
                }
                _ => {
                    log.append(
                        scope.with_attempt(1),
                        EventKind::NodeFinished {
                            duration_ms: 0,
                            output: Some(json!(i).into()),
                            cached: None,
                            snapshot: None,
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
    let (store_cpu_ms, _) = thread_cpu_ms();
    journal.close();
    Measure {
        case: "journal".into(),
        nodes: n,
        events,
        load_ms: 0.0,
        wall_ms,
        load_mb: 0.0,
        peak_mb: peak_mb(),
        engine_cpu_ms: 0.0,
        store_cpu_ms,
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
        load_mb: f[5].parse().unwrap(),
        peak_mb: f[6].parse().unwrap(),
        engine_cpu_ms: f[7].parse().unwrap(),
        store_cpu_ms: f[8].parse().unwrap(),
    }
}

/// How many times a case runs at size `n`: small runs are short enough for
/// a busy machine to double them, so they repeat and the median counts.
fn repeats(n: usize) -> usize {
    std::env::var("CAIRN_BENCH_REPEAT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| (20_000 / n.max(1)).clamp(1, 10))
}

/// The median by wall time of `reps` runs of one case (the faster of the
/// middle two), with the highest peak memory seen and the median of each
/// CPU time taken on its own (the CPU of the run whose wall time is the
/// median is one draw of the machine's noise, up to 1.5 times the median
/// CPU on a shared machine). Not the fastest: that would favour the sizes
/// that repeat most when comparing sizes.
fn median_of(reps: usize, args: &[&str]) -> Measure {
    let mut runs: Vec<Measure> = (0..reps.max(1)).map(|_| child(args)).collect();
    let peak = runs.iter().map(|m| m.peak_mb).fold(0.0, f64::max);
    let median = |f: fn(&Measure) -> f64| {
        let mut v: Vec<f64> = runs.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        v[(v.len() - 1) / 2]
    };
    let engine_cpu_ms = median(|m| m.engine_cpu_ms);
    let store_cpu_ms = median(|m| m.store_cpu_ms);
    runs.sort_by(|a, b| a.wall_ms.total_cmp(&b.wall_ms));
    let mut m = runs.swap_remove((runs.len() - 1) / 2);
    m.peak_mb = peak;
    m.engine_cpu_ms = engine_cpu_ms;
    m.store_cpu_ms = store_cpu_ms;
    m
}

/// Per-node figures of one case against its size's journal baseline.
struct Row {
    /// Wall time per node.
    total_us: f64,
    /// Wall time per node minus the baseline's time for as many events.
    overhead_us: f64,
    /// Wall time over the baseline's time for as many events.
    ratio: f64,
    /// CPU time of the engine's threads per node.
    engine_cpu_us: f64,
    /// CPU time of the store's writer per node.
    store_cpu_us: f64,
}

fn row(m: &Measure, base: &Measure) -> Row {
    let base_us_per_event = base.wall_ms * 1e3 / base.events as f64;
    let log_us = base_us_per_event * m.events as f64;
    let wall_us = m.wall_ms * 1e3;
    let n = m.nodes as f64;
    Row {
        total_us: wall_us / n,
        overhead_us: (wall_us - log_us) / n,
        ratio: wall_us / log_us,
        engine_cpu_us: m.engine_cpu_ms * 1e3 / n,
        store_cpu_us: m.store_cpu_ms * 1e3 / n,
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--case") {
        // As the CLI does: the case's peak is what a `cairn run` would reach.
        if std::env::var_os("CAIRN_BENCH_MALLOC_DEFAULT").is_none() {
            cairn_engine::limit_malloc_arenas();
        }
        let case = args[i + 1].as_str();
        let n: usize = args[i + 2].parse().unwrap();
        let m = match case {
            "journal" => run_journal(n, args[i + 3].parse().unwrap()),
            shape => run_workflow(shape, n),
        };
        println!(
            "MEASURE {} {} {} {:.3} {:.3} {:.1} {:.1} {:.3} {:.3}",
            m.case,
            m.nodes,
            m.events,
            m.load_ms,
            m.wall_ms,
            m.load_mb,
            m.peak_mb,
            m.engine_cpu_ms,
            m.store_cpu_ms
        );
        return;
    }
    // `cargo bench` passes `--bench`; anything else is not ours to read.
    let sizes: Vec<usize> = list_env("CAIRN_BENCH_SIZES", &[1_000, 10_000, 100_000]);
    let defaults: Vec<String> = CASES.iter().map(|c| c.to_string()).collect();
    let cases: Vec<String> = list_env("CAIRN_BENCH_CASES", &defaults);
    let mut results: Vec<(usize, Measure, Row)> = Vec::new();

    println!();
    if on_postgres() {
        if cairn_postgres::testing::server_or_skip().is_none() {
            println!(
                "PostgreSQL skipped: CAIRN_BENCH_STORE=postgres but {} is not set (e.g. {}=postgres://postgres@127.0.0.1:5432/postgres); nothing measured",
                cairn_postgres::testing::ENV,
                cairn_postgres::testing::ENV
            );
            return;
        }
        println!(
            "engine overhead per node on PostgreSQL (CAIRN_TEST_PG, a schema per case), NDJSON \
             mirror on; value nodes; log CPU counts the client's threads (cairn-pg) with the writer's"
        );
    } else {
        println!("engine overhead per node on SQLite (WAL), NDJSON mirror on; value nodes");
    }
    println!(
        "{:<10} {:>7} {:>7} {:>7} {:>8} {:>7} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>7}",
        "case",
        "size",
        "nodes",
        "events",
        "load ms",
        "load MB",
        "run ms",
        "µs/node",
        "overhead",
        "×journal",
        "eng CPU",
        "log CPU",
        "peak MB"
    );
    for &n in &sizes {
        // The chain writes the most events per node; the baseline appends as many.
        let (_, chain_instances) = workflow("chain", n);
        let base_events = (chain_instances as u64) * 6 + 4;
        let reps = repeats(n);
        let base = median_of(reps, &["journal", &n.to_string(), &base_events.to_string()]);
        for case in &cases {
            if case == "deep" && results.iter().any(|(_, m, _)| m.case == "deep") {
                continue;
            }
            let m = median_of(reps, &[case, &n.to_string()]);
            let r = row(&m, &base);
            let ok = r.overhead_us <= TARGET_OVERHEAD_US
                && r.engine_cpu_us <= TARGET_OVERHEAD_US
                && m.peak_mb < TARGET_PEAK_MB;
            println!(
                "{:<10} {:>7} {:>7} {:>7} {:>8.1} {:>7.1} {:>8.1} {:>8.1} {:>8.1} {:>8.2} {:>8.1} {:>8.1} {:>7.1}{}",
                m.case,
                n,
                m.nodes,
                m.events,
                m.load_ms,
                m.load_mb,
                m.wall_ms,
                r.total_us,
                r.overhead_us,
                r.ratio,
                r.engine_cpu_us,
                r.store_cpu_us,
                m.peak_mb,
                if ok { "" } else { "  MISSED" }
            );
            results.push((n, m, r));
        }
        println!(
            "{:<10} {:>7} {:>7} {:>7} {:>8} {:>7} {:>8.1} {:>8.2} {:>8} {:>8.2} {:>8} {:>8.2} {:>7.1}  (per event)",
            "journal",
            n,
            "-",
            base.events,
            "-",
            "-",
            base.wall_ms,
            base.wall_ms * 1e3 / base.events as f64,
            "-",
            1.0,
            "-",
            base.store_cpu_ms * 1e3 / base.events as f64,
            base.peak_mb
        );
    }
    if let (Some(&lo), Some(&hi)) = (sizes.iter().min(), sizes.iter().max()) {
        if lo != hi {
            println!();
            println!(
                "growth of the per-node cost from {lo} to {hi} nodes (target ≤ {TARGET_GROWTH}×)"
            );
            for case in &cases {
                let at = |n: usize| results.iter().find(|(s, m, _)| *s == n && &m.case == case);
                if let (Some(a), Some(b)) = (at(lo), at(hi)) {
                    let total = b.2.total_us / a.2.total_us;
                    let cpu = b.2.engine_cpu_us / a.2.engine_cpu_us;
                    // Below the baseline's own noise the overhead has no ratio.
                    let overhead = if a.2.overhead_us > 0.0 {
                        format!("{:.2}×", b.2.overhead_us / a.2.overhead_us)
                    } else {
                        "n/a".to_string()
                    };
                    println!(
                        "{:<10} total {:>5.2}×  overhead {:>6}  engine CPU {:>5.2}×{}",
                        case,
                        total,
                        overhead,
                        cpu,
                        if total <= TARGET_GROWTH && cpu <= TARGET_GROWTH {
                            ""
                        } else {
                            "  MISSED"
                        }
                    );
                }
            }
        }
    }
    if let Some((_, deep, _)) = results.iter().find(|(_, m, _)| m.case == "deep") {
        // What any run costs however small (the runtime's and the blocking
        // pool's threads, the store's connections, the run's rows, lock and
        // wake-up socket): a thousand nodes make it a few µs per node, but
        // the deep case has 201, so it is shown apart.
        let fixed = median_of(10, &["chain", "2"]);
        let net = (deep.engine_cpu_ms - fixed.engine_cpu_ms) * 1e3 / deep.nodes as f64;
        println!();
        println!(
            "a run's fixed cost (2 value nodes): {:.1} ms wall, {:.1} ms engine CPU; deep's \
             engine CPU net of it: {net:.1} µs per node{}",
            fixed.wall_ms,
            fixed.engine_cpu_ms,
            if net <= TARGET_OVERHEAD_US {
                ""
            } else {
                "  MISSED"
            }
        );
    }
    println!(
        "targets: ≤ {TARGET_OVERHEAD_US} µs of engine overhead per node (both: wall minus the \
         journal's time for as many events, and the engine threads' CPU), peak memory < \
         {TARGET_PEAK_MB} MB, per-node cost within {TARGET_GROWTH}× across sizes; eng CPU and \
         log CPU are µs of CPU per node of the engine's threads and of the store's writer"
    );
}
