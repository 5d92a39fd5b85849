//! Wall time of a one-node run through the real `cairn` binary, against
//! `/bin/true` measured in the same run.
//!
//! Each round runs, one after the other: `/bin/true` (the cost of starting
//! any process on this machine, the baseline), `cairn --version` (the cost
//! of starting this binary: loading, relocating, parsing flags), `cairn run`
//! of a workflow with one value node on a fresh store (a folder of its own
//! each round, created by the run), and `cairn run` of the same workflow on
//! an existing store (one store for every round, which a first run made).
//! Rounds interleave the cases, so that a change in the machine's load
//! falls on all of them alike. Each case prints the median and the minimum
//! of its rounds in milliseconds and its median over the baseline's, and
//! the median CPU time (user and system) of its process: on a machine busy
//! with other work the wall time mostly measures waiting for a core, and
//! the CPU time is the steadier figure of what a change saved.
//!
//! `cargo bench -p cairn-cli --bench startup`. Environment:
//! `CAIRN_BENCH_ROUNDS` (default 50), `CAIRN_BENCH_BIN` (another `cairn`
//! binary to measure, to compare builds; default the one cargo built).
//! The target (issue 25): a one-node run under 5 ms of wall time, fresh
//! store or existing. Printed, not asserted: a bench reports, and the
//! machine it runs on decides the milliseconds.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

/// The one-node workflow.
const WORKFLOW: &str = "name: one\nnodes:\n  - id: a\n    value: 1\n";

/// The target of a one-node run's wall time.
const TARGET_MS: f64 = 5.0;

/// The runs of the crowded store.
const CROWDED_RUNS: usize = 20_000;

fn main() {
    let rounds = std::env::var("CAIRN_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50usize)
        .max(1);
    let bin: PathBuf = std::env::var_os("CAIRN_BENCH_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_cairn").into());
    let dir = tempfile::tempdir().expect("a temporary folder");
    let wf = dir.path().join("one.yaml");
    std::fs::write(&wf, WORKFLOW).expect("the workflow file");
    let existing = dir.path().join("existing").join("cairn.db");
    // The existing store: made by a first run, as a user's would be.
    run_once(&bin, dir.path(), &existing, &wf);
    let crowded = dir.path().join("crowded").join("cairn.db");
    fill(&crowded, CROWDED_RUNS);
    run_once(&bin, dir.path(), &crowded, &wf);

    let cases = [
        "/bin/true",
        "cairn --version",
        "run, fresh store",
        "run, existing store",
        "run, 20,000 runs",
    ];
    let mut times: Vec<Vec<Timing>> = vec![Vec::with_capacity(rounds); cases.len()];
    for round in 0..rounds {
        times[0].push(timed(Command::new("/bin/true")));
        let mut version = Command::new(&bin);
        version.arg("--version");
        times[1].push(timed(version));
        let fresh = dir.path().join(format!("fresh-{round}")).join("cairn.db");
        times[2].push(run_once(&bin, dir.path(), &fresh, &wf));
        times[3].push(run_once(&bin, dir.path(), &existing, &wf));
        times[4].push(run_once(&bin, dir.path(), &crowded, &wf));
        // A fresh store is made once and measured once: not kept.
        let _ = std::fs::remove_dir_all(fresh.parent().expect("the store's folder"));
    }

    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "startup: {rounds} rounds of each case, {cores} cores, binary {}",
        bin.display()
    );
    // The machine's load decides the wall times: said with them.
    println!("load average at the end: {}", load_average());
    println!(
        "{:<22} {:>9} {:>9} {:>12} {:>10}",
        "case", "median ms", "min ms", "× /bin/true", "cpu ms"
    );
    let wall = |t: &[Timing]| t.iter().map(|t| t.wall_ms).collect::<Vec<_>>();
    let cpu = |t: &[Timing]| t.iter().map(|t| t.cpu_ms).collect::<Vec<_>>();
    let base = median(&wall(&times[0]));
    for (case, t) in cases.iter().zip(&times) {
        let w = wall(t);
        println!(
            "{case:<22} {:>9.2} {:>9.2} {:>11.1}× {:>10.2}",
            median(&w),
            min(&w),
            median(&w) / base,
            median(&cpu(t))
        );
    }
    for (case, t) in cases.iter().zip(&times).skip(2) {
        let m = median(&wall(t));
        println!(
            "target: {case} under {TARGET_MS} ms: median {m:.2} ms, {}",
            if m < TARGET_MS { "met" } else { "MISSED" }
        );
    }
}

/// One process's times, in milliseconds.
#[derive(Debug, Clone, Copy)]
struct Timing {
    /// From spawning it to reaping it, as seen from here.
    wall_ms: f64,
    /// The user and system CPU time the kernel charged it (and any
    /// process it waited for).
    cpu_ms: f64,
}

/// One `cairn run` of the workflow on `store`; panics unless the run
/// finished (a failed run is no measure of a run).
fn run_once(bin: &Path, cwd: &Path, store: &Path, wf: &Path) -> Timing {
    let mut c = Command::new(bin);
    c.current_dir(cwd)
        .arg("run")
        .arg("--store")
        .arg(store)
        .arg(wf)
        // The user's settings would change what is measured.
        .env_remove("CAIRN_STORE")
        .env_remove("CAIRN_LOG_DIR")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
    timed(c)
}

/// Makes a store of `runs` runs (rows only: their logs are not what is
/// measured), as a store is after months of use.
fn fill(store: &Path, runs: usize) {
    use cairn_store::prelude::*;
    let b = cairn_store::SqliteBackend::open(store).expect("the crowded store");
    for i in 0..runs {
        let run_id = cairn_events::RunId::parse(&format!("old-{i}")).expect("a run id");
        b.create_run(&cairn_store::RunRecord {
            run_id,
            workflow: "one".into(),
            workflow_path: "one.yaml".into(),
            workflow_hash: format!("{i:064x}"),
            workflow_source: WORKFLOW.into(),
            input: serde_json::json!({}),
            status: cairn_store::RecordStatus::Run(cairn_events::RunStatus::Finished),
            created_ms: i as i64,
            updated_ms: i as i64,
            parent_run_id: None,
        })
        .expect("a run's row");
    }
}

/// Runs a command to its end with its output discarded.
fn timed(mut c: Command) -> Timing {
    c.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // Children are run one at a time: the growth of the reaped children's
    // CPU time is this one's.
    let cpu0 = children_cpu_ms();
    let t0 = Instant::now();
    let out = c.output().expect("the command starts");
    let wall_ms = t0.elapsed().as_secs_f64() * 1000.0;
    let cpu_ms = children_cpu_ms() - cpu0;
    assert!(
        out.status.success(),
        "{c:?} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Timing { wall_ms, cpu_ms }
}

/// The 1, 5 and 15 minute load averages, where Linux tells them.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

/// The user and system CPU time of every child reaped so far, in ms.
fn children_cpu_ms() -> f64 {
    // SAFETY: getrusage writes one rusage into the zeroed value it is given.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru);
        ru
    };
    let ms = |t: libc::timeval| t.tv_sec as f64 * 1000.0 + t.tv_usec as f64 / 1000.0;
    ms(ru.ru_utime) + ms(ru.ru_stime)
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

fn min(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::INFINITY, f64::min)
}
