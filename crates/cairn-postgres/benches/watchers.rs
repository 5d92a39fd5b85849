//! Watcher latency across instances on PostgreSQL: from `RunLog::append` in
//! one process to `Subscription::next` in another.
//!
//! `CAIRN_TEST_PG=postgres://postgres@127.0.0.1:5432/postgres cargo bench -p
//! cairn-postgres --bench watchers` (about 15 s). Without `CAIRN_TEST_PG`
//! it says so and measures nothing.
//!
//! A writer `Journal` over one `PgBackend` appends the events of one run, one
//! every 2 ms (`CAIRN_BENCH_EVENTS` of them, default 2,000; `RunLog::append`,
//! not durable: group commit as the engine writes), each carrying the
//! wall-clock time it was appended at, in ns, as its output text. Watchers
//! subscribe to the run from its start and note, per event, the time they
//! got it minus that time. Two cases, each with `CAIRN_BENCH_WATCHERS`
//! watchers (default 100):
//!
//! - other instance: the watchers are on a second `Journal` over a second
//!   `PgBackend` on the same schema, in a child process of this binary
//!   (`--watcher`): they learn of commits by LISTEN/NOTIFY and read the
//!   events from the database, as a server on another machine would;
//! - same process (the baseline): the watchers are on the writer's own
//!   journal, which hands them each commit directly.
//!
//! Each case prints p50, p99 and max over every watcher and event, checks
//! that every watcher got every event exactly once and in seq order, and
//! (for the other instance) how many reads the watchers' backend made.

mod common;
use common::Counting;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_events::{EventKind, OutputStream, Scope};
use cairn_postgres::testing::{self, Scratch};
use cairn_postgres::PgOptions;
use cairn_store::{Backend, Journal, JournalOptions};

const INTERVAL: Duration = Duration::from_millis(2);
/// How long the watchers get, once subscribed, to make their first read and
/// register for wake-ups before the writer starts.
const SETTLE: Duration = Duration::from_millis(300);
/// How long the watchers may take, after the last append, to see it all.
const GRACE: Duration = Duration::from_secs(60);

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// What the watchers of one case saw.
#[derive(Debug, Default)]
struct Seen {
    /// Receive minus send time of every event at every watcher, in µs.
    latencies_us: Vec<f64>,
    /// Watchers that got all `events` events, each once, in seq order.
    complete: usize,
    /// Events out of order, repeated, unreadable, or errors.
    faults: usize,
    /// The first fault, to show.
    first_fault: Option<String>,
}

impl Seen {
    fn fault(&mut self, what: String) {
        self.faults += 1;
        self.first_fault.get_or_insert(what);
    }
}

/// One watcher: every event of `run` from its start up to seq `events`.
/// Returns its latencies in µs, or what went wrong after them.
async fn watch(
    journal: Journal,
    run: String,
    events: u64,
    subscribed: Arc<AtomicUsize>,
) -> (Vec<f64>, Result<(), String>) {
    let mut out = Vec::with_capacity(events as usize);
    // `subscribe` reads the store: off the runtime's workers.
    let sub = tokio::task::spawn_blocking(move || {
        journal.subscribe(&cairn_events::RunId::parse(&run).unwrap(), 0)
    })
    .await;
    subscribed.fetch_add(1, Ordering::SeqCst);
    let mut sub = match sub {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return (out, Err(format!("subscribe: {e}"))),
        Err(e) => return (out, Err(format!("subscribe: {e}"))),
    };
    let mut last = 0;
    let deadline =
        tokio::time::Instant::now() + INTERVAL * events as u32 + GRACE + Duration::from_secs(5);
    while last < events {
        let next = match tokio::time::timeout_at(deadline, sub.next()).await {
            Ok(Some(Ok(ev))) => ev,
            Ok(Some(Err(e))) => return (out, Err(format!("after seq {last}: {e}"))),
            Ok(None) => return (out, Err(format!("ended after seq {last}"))),
            Err(_) => return (out, Err(format!("timed out after seq {last}"))),
        };
        let got = now_ns();
        if next.seq != last + 1 {
            return (out, Err(format!("seq {} came after seq {last}", next.seq)));
        }
        last = next.seq;
        match next.decode().map(|e| e.kind) {
            Ok(EventKind::NodeOutput { text, .. }) => match text.parse::<u64>() {
                Ok(sent) => out.push(got.saturating_sub(sent) as f64 / 1e3),
                Err(_) => return (out, Err(format!("seq {last}: no send time in `{text}`"))),
            },
            other => return (out, Err(format!("seq {last}: unexpected event {other:?}"))),
        }
    }
    (out, Ok(()))
}

/// Starts `watchers` watchers of `run` on `journal` and returns once all
/// have subscribed and had time to make their first read and register for
/// wake-ups; the handle gives what they saw once they are done.
fn start_watchers(
    rt: &tokio::runtime::Runtime,
    journal: &Journal,
    run: &str,
    watchers: usize,
    events: u64,
) -> tokio::task::JoinHandle<Seen> {
    let subscribed = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..watchers)
        .map(|_| {
            rt.spawn(watch(
                journal.clone(),
                run.to_string(),
                events,
                subscribed.clone(),
            ))
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    while subscribed.load(Ordering::SeqCst) < watchers && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(SETTLE);
    rt.spawn(async move {
        let mut seen = Seen::default();
        for t in tasks {
            match t.await {
                Ok((lat, r)) => {
                    seen.latencies_us.extend(lat);
                    match r {
                        Ok(()) => seen.complete += 1,
                        Err(e) => seen.fault(e),
                    }
                }
                Err(e) => seen.fault(format!("watcher task: {e}")),
            }
        }
        seen
    })
}

/// Appends `events` events of `run` on `journal`, one every `INTERVAL`,
/// each carrying its append time; then waits for them to be committed.
fn write(journal: &Journal, run: &str, events: u64) {
    let log = journal
        .run_log(&cairn_events::RunId::parse(run).unwrap())
        .expect("the writer's run log");
    let start = Instant::now();
    for i in 0..events {
        let due = start + INTERVAL * i as u32;
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        log.append(
            Scope::node("w", 0).with_attempt(1),
            EventKind::NodeOutput {
                text: now_ns().to_string(),
                stream: OutputStream::Stdout,
            },
        );
    }
    log.sync_blocking().expect("the writer's events committed");
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// The child process: the watchers on a journal of their own over a second
/// backend. Prints `READY` once they are subscribed, then `SEEN` lines.
fn watcher_process(url: &str, schema: &str, run: &str, watchers: usize, events: u64) {
    let backend = open_backend(url, schema);
    let counting = Arc::new(Counting::new(backend));
    let journal = Journal::open(counting.clone(), JournalOptions::default()).unwrap();
    let rt = runtime();
    let done = start_watchers(&rt, &journal, run, watchers, events);
    let (reads0, last0) = (
        counting.reads.load(Ordering::Relaxed),
        counting.last_seqs.load(Ordering::Relaxed),
    );
    println!("READY");
    std::io::stdout().flush().unwrap();
    let seen = rt.block_on(done).expect("the watchers' results");
    let reads = counting.reads.load(Ordering::Relaxed) - reads0;
    let last_seqs = counting.last_seqs.load(Ordering::Relaxed) - last0;
    let read_ms = counting.read_ns.load(Ordering::Relaxed) as f64 / 1e6;
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "COUNTS {} {} {} {} {read_ms:.1}",
        seen.complete, seen.faults, reads, last_seqs
    )
    .unwrap();
    if let Some(f) = &seen.first_fault {
        writeln!(out, "FAULT {f}").unwrap();
    }
    // One line per thousand latencies, in whole µs.
    for chunk in seen.latencies_us.chunks(1000) {
        let line: Vec<String> = chunk.iter().map(|l| format!("{l:.0}")).collect();
        writeln!(out, "LAT {}", line.join(" ")).unwrap();
    }
    out.flush().unwrap();
    drop(out);
    journal.close();
}

/// A backend on a schema the writer made.
fn open_backend(url: &str, schema: &str) -> Arc<dyn Backend> {
    Arc::new(
        cairn_postgres::PgBackend::open_with(
            url,
            PgOptions {
                schema: Some(schema.to_string()),
                ..PgOptions::default()
            },
        )
        .expect("open the watchers' backend"),
    )
}

/// Reads and checks for the other-instance case.
struct Remote {
    reads: u64,
    last_seqs: u64,
    read_ms: f64,
}

/// The watchers in a child process on a backend of their own.
fn other_instance(
    scratch: &Scratch,
    schema: &str,
    writer: &Journal,
    watchers: usize,
    events: u64,
) -> (Seen, Remote) {
    let run = "watch-remote";
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--watcher",
            scratch.url,
            schema,
            run,
            &watchers.to_string(),
            &events.to_string(),
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the watchers' process");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    loop {
        match lines.next() {
            Some(Ok(l)) if l == "READY" => break,
            Some(Ok(_)) => {}
            _ => panic!("the watchers' process ended before it was ready"),
        }
    }
    write(writer, run, events);
    let mut seen = Seen::default();
    let mut remote = Remote {
        reads: 0,
        last_seqs: 0,
        read_ms: 0.0,
    };
    for l in lines {
        let l = l.expect("the watchers' output");
        if let Some(rest) = l.strip_prefix("LAT ") {
            seen.latencies_us
                .extend(rest.split_whitespace().map(|v| v.parse::<f64>().unwrap()));
        } else if let Some(rest) = l.strip_prefix("COUNTS ") {
            let f: Vec<&str> = rest.split_whitespace().collect();
            seen.complete = f[0].parse().unwrap();
            seen.faults = f[1].parse().unwrap();
            remote.reads = f[2].parse().unwrap();
            remote.last_seqs = f[3].parse().unwrap();
            remote.read_ms = f[4].parse().unwrap();
        } else if let Some(rest) = l.strip_prefix("FAULT ") {
            seen.first_fault = Some(rest.to_string());
        }
    }
    let status = child.wait().expect("the watchers' process");
    assert!(status.success(), "the watchers' process failed: {status}");
    (seen, remote)
}

/// The watchers on the writer's own journal.
fn same_process(writer: &Journal, watchers: usize, events: u64) -> Seen {
    let run = "watch-local";
    let rt = runtime();
    let done = start_watchers(&rt, writer, run, watchers, events);
    write(writer, run, events);
    rt.block_on(done).expect("the watchers' results")
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1]
}

fn row(case: &str, seen: &mut Seen, watchers: usize, events: u64) -> bool {
    seen.latencies_us.sort_by(f64::total_cmp);
    let l = &seen.latencies_us;
    let expected = watchers as u64 * events;
    let ok = seen.complete == watchers && seen.faults == 0 && l.len() as u64 == expected;
    println!(
        "{case:<26} {:>9.0} {:>9.0} {:>9.0} {:>9.0} {:>9}/{:<9} {}",
        percentile(l, 0.5),
        percentile(l, 0.99),
        l.last().copied().unwrap_or(f64::NAN),
        l.iter().sum::<f64>() / l.len().max(1) as f64,
        l.len(),
        expected,
        if ok {
            "all once, in order".to_string()
        } else {
            format!(
                "FAILED: {} of {watchers} watchers complete, {} faults{}",
                seen.complete,
                seen.faults,
                seen.first_fault
                    .as_deref()
                    .map(|f| format!(" (first: {f})"))
                    .unwrap_or_default()
            )
        }
    );
    ok
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--watcher") {
        let a = &args[i + 1..];
        watcher_process(
            &a[0],
            &a[1],
            &a[2],
            a[3].parse().unwrap(),
            a[4].parse().unwrap(),
        );
        return;
    }
    // `cargo bench` passes `--bench`; anything else is not ours to read.
    let Some(scratch) = Scratch::new() else {
        println!(
            "PostgreSQL skipped: {} is not set or nothing answers there (e.g. \
             {}=postgres://postgres@127.0.0.1:5432/postgres); nothing measured",
            testing::ENV,
            testing::ENV
        );
        return;
    };
    let watchers = env_usize("CAIRN_BENCH_WATCHERS", 100);
    let events = env_usize("CAIRN_BENCH_EVENTS", 2_000) as u64;
    let schema = scratch.schema();
    let writer = Journal::open(
        Arc::new(scratch.open(&schema, PgOptions::default())),
        JournalOptions::default(),
    )
    .unwrap();

    let (mut remote, counts) = other_instance(&scratch, &schema, &writer, watchers, events);
    let mut local = same_process(&writer, watchers, events);
    writer.close();

    println!();
    println!(
        "append-to-watcher latency on PostgreSQL: {events} events of one run, one every {} ms \
         (RunLog::append), {watchers} watchers from the run's start; µs over every watcher and event",
        INTERVAL.as_millis()
    );
    println!(
        "{:<26} {:>9} {:>9} {:>9} {:>9} {:>19} check",
        "watchers on", "p50", "p99", "max", "mean", "events seen"
    );
    let a = row("another instance (process)", &mut remote, watchers, events);
    let b = row("the writer's journal", &mut local, watchers, events);
    let per_event = |n: u64| n as f64 / events as f64;
    println!(
        "the other instance's backend: {} event reads ({:.1} per event, {:.2} per event and \
         watcher) and {} last_seq queries, {:.0} ms in them (pool of {} connections)",
        counts.reads,
        per_event(counts.reads),
        per_event(counts.reads) / watchers as f64,
        counts.last_seqs,
        counts.read_ms,
        PgOptions::default().pool_size
    );
    if !(a && b) {
        std::process::exit(1);
    }
}
