//! Memory of a long-lived `cairn serve` across waves of runs.
//!
//! Starts the real `cairn serve` (SQLite, a temporary folder), then runs
//! waves of runs against it: each run a command node and two agent nodes
//! streaming from the scripted model (no network), each run followed over
//! SSE to its end. After each wave it waits a few seconds and reads the
//! server's resident memory (VmRSS). A server that gives back what finished
//! runs held stays level: every wave's RSS within 10% of the first wave's
//! (the baseline, measured in the same run).
//!
//! `cargo bench -p cairn-cli --bench serve_memory`. Environment:
//! `CAIRN_BENCH_WAVES` (default 3), `CAIRN_BENCH_RUNS` (runs per wave,
//! default 300), `CAIRN_BENCH_STARTS` (start requests in flight, default
//! 16), `CAIRN_BENCH_SETTLE_SECS` (the wait after a wave, default 5),
//! `CAIRN_BENCH_BIN` (another `cairn` binary to measure, to compare
//! builds; default the one cargo built).
//! Bounded: it gives up after 30 minutes.

#[path = "../tests/waves/mod.rs"]
mod waves;

use std::time::{Duration, Instant};

const GIVE_UP: Duration = Duration::from_secs(30 * 60);

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    waves::raise_fd_limit();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let r = rt.block_on(async { tokio::time::timeout(GIVE_UP, bench()).await });
    if r.is_err() {
        eprintln!("serve_memory: gave up after {} s", GIVE_UP.as_secs());
        std::process::exit(1);
    }
}

async fn bench() {
    let n_waves = env("CAIRN_BENCH_WAVES", 3).max(1);
    let runs = env("CAIRN_BENCH_RUNS", 300).max(1);
    let starts = env("CAIRN_BENCH_STARTS", 16).max(1);
    let settle = Duration::from_secs(env("CAIRN_BENCH_SETTLE_SECS", 5) as u64);
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());

    let dir = tempfile::tempdir().unwrap();
    let bin = std::env::var_os("CAIRN_BENCH_BIN")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_cairn").into());
    let served = waves::Served::start(&bin, dir.path(), runs + 64).await;
    let idle = served.rss_kb();
    println!(
        "serve_memory: {n_waves} waves of {runs} runs on one cairn serve (SQLite), {cores} cores; idle RSS {:.1} MB",
        mb(idle)
    );
    let mut first = None;
    for i in 1..=n_waves {
        let t0 = Instant::now();
        let w = waves::wave(&served.url, runs, starts).await;
        let took = t0.elapsed();
        if !w.failed.is_empty() {
            let err = std::fs::read_to_string(dir.path().join("serve.err")).unwrap_or_default();
            panic!(
                "wave {i}: {} of {runs} runs did not finish, e.g. {:?}\nserve said:\n{}",
                w.failed.len(),
                &w.failed[..w.failed.len().min(5)],
                tail(&err, 4000),
            );
        }
        tokio::time::sleep(settle).await;
        let rss = served.rss_kb();
        let base = *first.get_or_insert(rss);
        println!(
            "serve_memory: wave {i}: {} runs finished in {:.1} s ({} events); RSS {} s after: {:.1} MB, {:.2}x wave 1 (anonymous {:.1} MB, {} threads)",
            w.finished,
            took.as_secs_f64(),
            w.events,
            settle.as_secs(),
            mb(rss),
            rss as f64 / base as f64,
            mb(served.status("RssAnon")),
            served.status("Threads"),
        );
    }
    let last = served.rss_kb();
    let base = first.unwrap_or(last);
    println!(
        "serve_memory: growth after wave 1: {:.1} MB over {} more waves ({:.1} KB per run); peak RSS (VmHWM) {:.1} MB",
        (mb(last) - mb(base)),
        n_waves - 1,
        (last as f64 - base as f64) / ((n_waves - 1).max(1) * runs) as f64,
        mb(served.status("VmHWM")),
    );
}

fn mb(kb: u64) -> f64 {
    kb as f64 / 1024.0
}

fn tail(s: &str, n: usize) -> &str {
    let mut i = s.len().saturating_sub(n);
    while !s.is_char_boundary(i) {
        i += 1;
    }
    &s[i..]
}
