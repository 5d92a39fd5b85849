//! Append throughput on PostgreSQL: the journal against a bare tokio-postgres
//! insert loop, measured in the same run.
//!
//! `CAIRN_TEST_PG=postgres://postgres@127.0.0.1:5432/postgres cargo bench -p
//! cairn-postgres --bench append` (about 30 s on a quiet machine). Without
//! `CAIRN_TEST_PG` it says so and measures SQLite's commit latency only.
//! `CAIRN_BENCH_SIZES` picks the sizes (default 10000,100000; 0 for none),
//! `CAIRN_BENCH_REPEAT` how many times each case runs (default 5 at 10,000
//! events or less, 3 above; the median counts, the cases taking turns).
//! Every measurement gets schemas of its own, dropped right after.
//!
//! - journal: `Journal::open` over a `PgBackend` in a fresh schema, no NDJSON
//!   mirror, `RunLog::append` of N events of the kinds a value node writes
//!   (pending, started, finished with its output: the engine bench's
//!   `journal` baseline), then one `sync`. Stamping, sequencing and JSON
//!   serialization are included; group commit decides the transactions. The
//!   backend is wrapped in a pass-through that counts the batches the writer
//!   commits and the time they take (nothing else);
//! - bare (the baseline): a tokio-postgres connection inserting the same rows
//!   (serialized beforehand, so it measures the database and the wire only)
//!   into a schema the backend made (so the `events` table, its primary key
//!   and its node index are the store's) with the statement the store uses
//!   (`INSERT ... SELECT * FROM UNNEST(...)`), BEGIN/INSERT/COMMIT per batch,
//!   the batches as large as the journal's were on average in the same case
//!   (`CAIRN_BENCH_BATCH` to fix it);
//! - 8 runs: 8 runs appending at once (8 threads, one `RunLog` each, N / 8
//!   events each) through one journal, whose writer commits them together,
//!   against 8 bare connections inserting N / 8 rows each at once;
//! - to tell where the journal's time goes, the same rows on ONE connection,
//!   every run's rows interleaved as the journal's writer gets them: the bare
//!   INSERT loop (`1 conn/s`, 8 runs only: what one writer connection can
//!   do), the statements `PgBackend::append` sends, each waiting for the one
//!   before (`store SQL`: BEGIN, the lease fence, the INSERT, the run rows'
//!   UPDATE, COMMIT), and the same with the middle three pipelined
//!   (`pipelined`);
//! - commit latency: `append_durable` of one event at a time, 1,000 times,
//!   on SQLite (a temporary file, WAL, `synchronous=NORMAL`) and on
//!   PostgreSQL (`synchronous_commit` as the server has it), side by side;
//!   beside them the journal on PostgreSQL with its NOTIFY after each commit
//!   dropped, and the three loops above with one event per transaction. The
//!   lines take turns by rounds of 50 events, so that a busy spell of the
//!   machine falls on all of them.

mod common;
use common::Counting;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Barrier};
use std::time::Instant;

use cairn_events::{Event, EventKind, Scope};
use cairn_postgres::testing::{self, Scratch};
use cairn_postgres::PgOptions;
use cairn_store::{Backend, Journal, JournalOptions, StoredEvent};
use serde_json::json;

/// The journal's share of the bare loop's rate it should reach.
const TARGET_RATIO: f64 = 0.5;
const CONCURRENT_RUNS: usize = 8;
const LATENCY_N: usize = 1_000;
/// `append_durable` calls before the measured ones (connections, statements).
const LATENCY_WARMUP: usize = 20;

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

fn env_usize(name: &str) -> Option<usize> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

/// Event `i` of a log of `nodes` value nodes, as the engine bench's journal
/// baseline appends them: pending, started, finished with its output.
fn event(i: u64, nodes: u64) -> (Scope, EventKind) {
    let node = format!("n{}", (i / 3) % nodes.max(1));
    let scope = Scope::node(node, 0);
    match i % 3 {
        0 => (
            scope,
            EventKind::NodePending {
                layer_index: Some(0),
            },
        ),
        1 => (
            scope.with_attempt(1),
            EventKind::NodeStarted { snapshot: None },
        ),
        _ => (
            scope.with_attempt(1),
            EventKind::NodeFinished {
                duration_ms: 0,
                output: Some(json!(i).into()),
                cached: None,
                snapshot: None,
            },
        ),
    }
}

/// As many nodes as a chain that writes `events` events has (six each).
fn nodes_for(events: u64) -> u64 {
    (events / 6).max(1)
}

/// The rows the journal would store for `run` (seq from 1), serialized.
fn rows(run: &str, events: u64) -> Vec<StoredEvent> {
    let nodes = nodes_for(events);
    let ts = now_ms();
    (0..events)
        .map(|i| {
            let (scope, kind) = event(i, nodes);
            StoredEvent::from_event(&Event {
                run_id: cairn_events::RunId::parse(run).unwrap(),
                seq: (i + 1).into(),
                timestamp_ms: ts,
                scope,
                kind,
            })
        })
        .collect()
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// What one measurement of the journal saw.
#[derive(Debug, Clone, Copy)]
struct JournalRun {
    rate: f64,
    /// Mean events per committed batch.
    batch: f64,
    /// Share of the wall time the writer spent inside `Backend::append`.
    busy: f64,
    /// Mean time of one `Backend::append`, in ms.
    batch_ms: f64,
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// `runs` runs of `total / runs` events each, appended at once through one
/// journal on a fresh schema, then synced.
fn journal_case(scratch: &Scratch, runs: usize, total: u64) -> JournalRun {
    let schema = scratch.schema();
    let pg: Arc<dyn Backend> = Arc::new(scratch.open(&schema, PgOptions::default()));
    let counting = Arc::new(Counting::new(pg));
    let journal = Journal::open(counting.clone(), JournalOptions::default()).unwrap();
    let rt = runtime();
    let per_run = total / runs as u64;
    let nodes = nodes_for(per_run);
    // Leases and last seqs are taken before the clock starts.
    let logs: Vec<_> = (0..runs)
        .map(|r| {
            let id = cairn_events::RunId::parse(&format!("bench-{r}")).unwrap();
            journal.run_log(&id).unwrap()
        })
        .collect();
    let start = Barrier::new(runs + 1);
    let t0 = std::thread::scope(|s| {
        for log in &logs {
            let (start, handle) = (&start, rt.handle().clone());
            s.spawn(move || {
                start.wait();
                for i in 0..per_run {
                    let (scope, kind) = event(i, nodes);
                    log.append(scope, kind);
                }
                handle.block_on(log.sync()).expect("sync");
            });
        }
        // Before the appenders start, so that the clock sees all they do.
        let t0 = Instant::now();
        start.wait();
        t0
    });
    let wall = t0.elapsed().as_secs_f64();
    drop(logs);
    journal.close();
    let batches = counting.batches.load(Ordering::Relaxed).max(1) as f64;
    let append_s = counting.append_ns.load(Ordering::Relaxed) as f64 / 1e9;
    let out = JournalRun {
        rate: (per_run * runs as u64) as f64 / wall,
        batch: counting.events.load(Ordering::Relaxed) as f64 / batches,
        busy: append_s / wall,
        batch_ms: append_s * 1e3 / batches,
    };
    drop(journal);
    drop(counting);
    drop_schema(scratch, &schema);
    out
}

fn drop_schema(scratch: &Scratch, schema: &str) {
    testing::sql(
        scratch.url,
        &format!("DROP SCHEMA IF EXISTS {schema} CASCADE"),
    );
}

/// The owner of the bare loops' lease rows.
const BARE_OWNER: &str = "bare";

/// A schema for a bare loop, made by the backend itself (so its tables are
/// the store's, `events` and its index included), then left alone; with a
/// live lease row of [`BARE_OWNER`] for each run, which is what the fence of
/// the store-shaped loops finds, as the journal's finds its own.
fn bare_schema(scratch: &Scratch, runs: usize) -> String {
    let schema = scratch.schema();
    drop(scratch.open(&schema, PgOptions::default()));
    let leases: String = (0..runs)
        .map(|r| {
            format!(
                "INSERT INTO leases (run_id, owner, expires_at) \
                 VALUES ('bench-{r}', '{BARE_OWNER}', now() + interval '1 hour');"
            )
        })
        .collect();
    scratch.sql_in(&schema, &leases);
    schema
}

/// How a bare loop sends a batch.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Shape {
    /// BEGIN, the INSERT, COMMIT: three round trips.
    Insert,
    /// What `PgBackend::append` sends (see src/events.rs and src/lease.rs):
    /// BEGIN, the lease fence (`SELECT ... FOR SHARE`), the INSERT, the run
    /// rows' UPDATE, COMMIT, each waiting for the one before: five.
    Store,
    /// The same five statements with the fence, the INSERT and the UPDATE
    /// pipelined (sent together, answers read after): three round trips.
    Pipelined,
}

/// The store's statements (see src/events.rs and src/lease.rs) on a bare
/// schema, prepared on one connection.
struct Statements {
    insert: tokio_postgres::Statement,
    fence: tokio_postgres::Statement,
    update: tokio_postgres::Statement,
}

/// A connection to the server, driven on the current runtime, with the
/// statements prepared.
async fn connect(url: &str, schema: &str) -> (tokio_postgres::Client, Statements) {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    let insert = format!(
        "INSERT INTO {schema}.events (run_id, seq, type, node_id, timestamp_ms, json) \
         SELECT * FROM UNNEST($1::text[], $2::int8[], $3::text[], $4::text[], $5::int8[], $6::text[])"
    );
    let fence = format!(
        "SELECT run_id, owner <> $2 AND expires_at > clock_timestamp() \
         FROM {schema}.leases WHERE run_id = ANY($1::text[]) ORDER BY run_id FOR SHARE"
    );
    let update = format!(
        "UPDATE {schema}.runs AS r \
         SET updated_ms = GREATEST(r.updated_ms, u.ts), status = COALESCE(u.status, r.status) \
         FROM UNNEST($1::text[], $2::int8[], $3::text[]) AS u (run_id, ts, status) \
         WHERE r.run_id = u.run_id"
    );
    let st = Statements {
        insert: client.prepare(&insert).await.expect("prepare"),
        fence: client.prepare(&fence).await.expect("prepare"),
        update: client.prepare(&update).await.expect("prepare"),
    };
    (client, st)
}

/// Commits `chunk` in one transaction shaped as `shape`.
async fn send_batch(
    client: &mut tokio_postgres::Client,
    st: &Statements,
    chunk: &[StoredEvent],
    shape: Shape,
) {
    type Param<'a> = &'a (dyn tokio_postgres::types::ToSql + Sync);
    let runs: Vec<&str> = chunk.iter().map(|r| r.run_id.as_str()).collect();
    let seqs: Vec<i64> = chunk.iter().map(|r| r.seq as i64).collect();
    let types: Vec<&str> = chunk.iter().map(|r| r.type_name.as_str()).collect();
    let nodes: Vec<Option<&str>> = chunk.iter().map(|r| r.node_id.as_deref()).collect();
    let ts: Vec<i64> = chunk.iter().map(|r| r.timestamp_ms).collect();
    let json: Vec<&str> = chunk.iter().map(|r| &*r.json).collect();
    let cols: [Param; 6] = [&runs, &seqs, &types, &nodes, &ts, &json];
    // The run rows' update: per run, its latest timestamp.
    let mut run_ids: Vec<&str> = Vec::new();
    let mut run_ts: Vec<i64> = Vec::new();
    for r in chunk {
        match run_ids.iter().position(|x| *x == r.run_id) {
            Some(i) => run_ts[i] = run_ts[i].max(r.timestamp_ms),
            None => {
                run_ids.push(&r.run_id);
                run_ts.push(r.timestamp_ms);
            }
        }
    }
    let statuses: Vec<Option<String>> = vec![None; run_ids.len()];
    let fence_params: [Param; 2] = [&run_ids, &BARE_OWNER];
    let update_params: [Param; 3] = [&run_ids, &run_ts, &statuses];
    let tx = client.transaction().await.expect("begin");
    let fenced = match shape {
        Shape::Insert => {
            tx.execute(&st.insert, &cols).await.expect("insert");
            Vec::new()
        }
        Shape::Store => {
            let f = tx.query(&st.fence, &fence_params).await.expect("fence");
            tx.execute(&st.insert, &cols).await.expect("insert");
            tx.execute(&st.update, &update_params)
                .await
                .expect("update");
            f
        }
        Shape::Pipelined => {
            let (f, _, _) = futures::try_join!(
                tx.query(&st.fence, &fence_params),
                tx.execute(&st.insert, &cols),
                tx.execute(&st.update, &update_params),
            )
            .expect("fence, insert, update");
            f
        }
    };
    assert!(
        fenced.iter().all(|r| !r.get::<_, bool>(1)),
        "a bare loop's lease is its own"
    );
    tx.commit().await.expect("commit");
}

/// Loops on `streams.len()` connections at once, each inserting its
/// stream's rows in transactions of `batch` rows shaped as `shape`; the wall
/// time in s.
fn bare_case(
    scratch: &Scratch,
    schema: &str,
    streams: &[Vec<StoredEvent>],
    batch: usize,
    shape: Shape,
) -> f64 {
    let rt = runtime();
    rt.block_on(async {
        // Connected and prepared before the clock starts.
        let mut clients = Vec::new();
        for _ in streams {
            clients.push(connect(scratch.url, schema).await);
        }
        let t0 = Instant::now();
        let loops = clients
            .iter_mut()
            .zip(streams)
            .map(|((client, st), rows)| async move {
                for chunk in rows.chunks(batch.max(1)) {
                    send_batch(client, st, chunk, shape).await;
                }
            });
        futures::future::join_all(loops).await;
        t0.elapsed().as_secs_f64()
    })
}

/// The rows of `runs` runs of `total / runs` events each, one stream per
/// run, or (`one_stream`) interleaved in one, as threads appending at once
/// would queue them for the journal's writer.
fn streams(runs: usize, total: u64, one_stream: bool) -> Vec<Vec<StoredEvent>> {
    let per_run = total / runs as u64;
    let data: Vec<Vec<StoredEvent>> = (0..runs)
        .map(|r| rows(&format!("bench-{r}"), per_run))
        .collect();
    if !one_stream || runs == 1 {
        return data;
    }
    let mut all = Vec::with_capacity(total as usize);
    let mut iters: Vec<_> = data.into_iter().map(Vec::into_iter).collect();
    loop {
        let before = all.len();
        all.extend(iters.iter_mut().filter_map(Iterator::next));
        if all.len() == before {
            break;
        }
    }
    vec![all]
}

/// Events per second of a bare loop on a fresh schema, dropped after.
fn bare_rate(scratch: &Scratch, streams: &[Vec<StoredEvent>], batch: usize, shape: Shape) -> f64 {
    let runs = streams
        .iter()
        .flatten()
        .map(|r| r.run_id.as_str())
        .collect::<std::collections::BTreeSet<_>>()
        .len();
    let schema = bare_schema(scratch, runs);
    let wall = bare_case(scratch, &schema, streams, batch, shape);
    drop_schema(scratch, &schema);
    streams.iter().map(Vec::len).sum::<usize>() as f64 / wall
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The journal and the bare loops, alternated `reps` times; medians.
struct Compared {
    journal: f64,
    /// The baseline: one connection per run, INSERT only.
    bare: f64,
    /// Every run's rows on one connection, INSERT only (8 runs only).
    one_conn: Option<f64>,
    /// One connection, the store's statements one after the other.
    store_sql: f64,
    /// One connection, the store's statements pipelined.
    pipelined: f64,
    batch: f64,
    busy: f64,
    batch_ms: f64,
    bare_batch: usize,
}

fn compare(scratch: &Scratch, runs: usize, total: u64, reps: usize) -> Compared {
    let mut journal = Vec::new();
    let (mut bare, mut one_conn, mut store_sql, mut pipelined) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut bare_batch = 0;
    let per_run = streams(runs, total, false);
    let one = streams(runs, total, true);
    for _ in 0..reps {
        journal.push(journal_case(scratch, runs, total));
        let mean_batch = median(journal.iter().map(|j| j.batch).collect());
        bare_batch = env_usize("CAIRN_BENCH_BATCH")
            .unwrap_or(mean_batch.round() as usize)
            .max(1);
        bare.push(bare_rate(scratch, &per_run, bare_batch, Shape::Insert));
        if runs > 1 {
            one_conn.push(bare_rate(scratch, &one, bare_batch, Shape::Insert));
        }
        store_sql.push(bare_rate(scratch, &one, bare_batch, Shape::Store));
        pipelined.push(bare_rate(scratch, &one, bare_batch, Shape::Pipelined));
    }
    Compared {
        journal: median(journal.iter().map(|j| j.rate).collect()),
        bare: median(bare),
        one_conn: (runs > 1).then(|| median(one_conn)),
        store_sql: median(store_sql),
        pipelined: median(pipelined),
        batch: median(journal.iter().map(|j| j.batch).collect()),
        busy: median(journal.iter().map(|j| j.busy).collect()),
        batch_ms: median(journal.iter().map(|j| j.batch_ms).collect()),
        // As the bare loops of one run saw it.
        bare_batch: bare_batch.min(per_run[0].len()),
    }
}

/// One way of committing events one at a time, measured a round at a
/// time so that the ways take turns (and share the machine's moods).
enum Probe {
    /// `append_durable` on a journal.
    Journal {
        journal: Journal,
        log: Option<cairn_store::RunLog>,
        rt: tokio::runtime::Runtime,
        next: u64,
    },
    /// A bare loop of one-row transactions.
    Bare {
        rt: tokio::runtime::Runtime,
        client: tokio_postgres::Client,
        st: Statements,
        rows: Vec<StoredEvent>,
        next: usize,
        shape: Shape,
        schema: String,
    },
}

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

impl Probe {
    fn journal(journal: Journal) -> Probe {
        let log = journal
            .run_log(&cairn_events::RunId::parse("bench-latency").unwrap())
            .unwrap();
        Probe::Journal {
            journal,
            log: Some(log),
            rt: current_thread(),
            next: 0,
        }
    }

    fn bare(scratch: &Scratch, shape: Shape) -> Probe {
        let schema = bare_schema(scratch, 1);
        let rt = current_thread();
        let (client, st) = rt.block_on(connect(scratch.url, &schema));
        Probe::Bare {
            rt,
            client,
            st,
            rows: rows("bench-0", (LATENCY_N + LATENCY_WARMUP) as u64),
            next: 0,
            shape,
            schema,
        }
    }

    /// The commit latencies, in µs, of the next `k` events.
    fn measure(&mut self, k: usize) -> Vec<f64> {
        let total = (LATENCY_N + LATENCY_WARMUP) as u64;
        match self {
            Probe::Journal { log, rt, next, .. } => {
                let log = log.as_ref().expect("open until finished");
                rt.block_on(async {
                    let mut out = Vec::with_capacity(k);
                    for _ in 0..k {
                        let (scope, kind) = event(*next, nodes_for(total));
                        *next += 1;
                        let t = Instant::now();
                        log.append_durable(scope, kind)
                            .await
                            .expect("append_durable");
                        out.push(t.elapsed().as_secs_f64() * 1e6);
                    }
                    out
                })
            }
            Probe::Bare {
                rt,
                client,
                st,
                rows,
                next,
                shape,
                ..
            } => rt.block_on(async {
                let mut out = Vec::with_capacity(k);
                for _ in 0..k {
                    let row = &rows[*next..*next + 1];
                    *next += 1;
                    let t = Instant::now();
                    send_batch(client, st, row, *shape).await;
                    out.push(t.elapsed().as_secs_f64() * 1e6);
                }
                out
            }),
        }
    }

    fn finish(self, scratch: Option<&Scratch>) {
        match self {
            Probe::Journal {
                journal, mut log, ..
            } => {
                drop(log.take());
                journal.close();
            }
            Probe::Bare {
                rt, client, schema, ..
            } => {
                drop(client);
                drop(rt);
                if let Some(scratch) = scratch {
                    drop_schema(scratch, &schema);
                }
            }
        }
    }
}

/// Rounds of this many events per way, the ways taking turns.
const LATENCY_ROUND: usize = 50;

/// Each probe's latencies over `LATENCY_N` events, after `LATENCY_WARMUP`.
fn latencies(probes: &mut [Probe]) -> Vec<Vec<f64>> {
    for p in probes.iter_mut() {
        p.measure(LATENCY_WARMUP);
    }
    let mut out = vec![Vec::with_capacity(LATENCY_N); probes.len()];
    let mut done = 0;
    while done < LATENCY_N {
        let k = LATENCY_ROUND.min(LATENCY_N - done);
        for (p, o) in probes.iter_mut().zip(&mut out) {
            o.extend(p.measure(k));
        }
        done += k;
    }
    out
}

fn percentiles(mut v: Vec<f64>) -> (f64, f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1];
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    (at(0.5), at(0.99), v[v.len() - 1], mean)
}

fn print_latency(name: &str, v: Vec<f64>) {
    let (p50, p99, max, mean) = percentiles(v);
    println!(
        "{name:<34} {:>9.0} {:>9.0} {:>9.0} {:>9.0} {:>10.0}",
        p50,
        p99,
        max,
        mean,
        1e6 / mean
    );
}

fn main() {
    // `cargo bench` passes `--bench`; nothing here takes arguments.
    let sizes: Vec<u64> = list_env("CAIRN_BENCH_SIZES", &[10_000, 100_000]);
    let scratch = Scratch::new();
    if scratch.is_none() {
        println!(
            "PostgreSQL skipped: {} is not set (e.g. \
             {}=postgres://postgres@127.0.0.1:5432/postgres); only SQLite's commit latency follows",
            testing::ENV,
            testing::ENV
        );
    }

    if let Some(scratch) = &scratch {
        let server = server_settings(scratch.url);
        println!();
        println!(
            "append on PostgreSQL ({server}): journal (RunLog::append x N, then sync; no mirror) \
             against a bare tokio-postgres loop (UNNEST insert, one transaction per batch)"
        );
        println!(
            "events of the kinds a value node writes (pending, started, finished); \
             median of the repeats; batch = mean events per journal commit"
        );
        println!(
            "{:<8} {:>7} {:>4} {:>10} {:>10} {:>6} {:>10} {:>10} {:>10} {:>6} {:>6} {:>8} {:>6}",
            "case",
            "events",
            "reps",
            "journal/s",
            "bare/s",
            "ratio",
            "1 conn/s",
            "store SQL",
            "pipelined",
            "batch",
            "bare b",
            "ms/batch",
            "writer"
        );
        for &n in sizes.iter().filter(|&&n| n > 0) {
            let reps = env_usize("CAIRN_BENCH_REPEAT").unwrap_or(if n <= 10_000 { 5 } else { 3 });
            for (case, runs) in [("one run", 1), ("8 runs", CONCURRENT_RUNS)] {
                let c = compare(scratch, runs, n, reps);
                let ratio = c.journal / c.bare;
                println!(
                    "{:<8} {:>7} {:>4} {:>10.0} {:>10.0} {:>5.0}% {:>10} {:>10.0} {:>10.0} {:>6.0} {:>6} {:>8.2} {:>5.0}%{}",
                    case,
                    n,
                    reps,
                    c.journal,
                    c.bare,
                    100.0 * ratio,
                    c.one_conn.map_or("-".to_string(), |r| format!("{r:.0}")),
                    c.store_sql,
                    c.pipelined,
                    c.batch,
                    c.bare_batch,
                    c.batch_ms,
                    100.0 * c.busy,
                    if ratio >= TARGET_RATIO { "" } else { "  MISSED" }
                );
            }
        }
        println!(
            "target: the journal at least {:.0}% of the bare loop (ratio). bare: a connection per \
             run, BEGIN/INSERT/COMMIT per batch; 8 runs: {CONCURRENT_RUNS} RunLogs on threads \
             through one journal against {CONCURRENT_RUNS} connections, N / {CONCURRENT_RUNS} \
             events each. On one connection, every run's rows interleaved as the journal's \
             writer gets them: 1 conn/s the same INSERT loop, store SQL the statements \
             PgBackend::append sends (fence, INSERT, run UPDATE, each waiting for the one \
             before), pipelined the same with the three sent at once. batch: mean events per \
             journal commit (bare b: the bare loops' batch); ms/batch: mean time of one \
             Backend::append; writer: share of the wall time the journal's writer spent in it",
            100.0 * TARGET_RATIO
        );
    }

    println!();
    println!("commit latency of append_durable, one event at a time (x{LATENCY_N}, µs)");
    println!(
        "{:<34} {:>9} {:>9} {:>9} {:>9} {:>10}",
        "store", "p50", "p99", "max", "mean", "events/s"
    );
    let dir = tempfile::tempdir().unwrap();
    let sqlite = Journal::open_sqlite(&dir.path().join("cairn.db"), JournalOptions::default())
        .expect("open the SQLite store");
    let mut names = vec!["SQLite (WAL, synchronous=NORMAL)"];
    let mut probes = vec![Probe::journal(sqlite)];
    if let Some(scratch) = &scratch {
        let open = |mute: bool| {
            let pg: Arc<dyn Backend> =
                Arc::new(scratch.open(&scratch.schema(), PgOptions::default()));
            let backend = Counting {
                mute,
                ..Counting::new(pg)
            };
            Journal::open(Arc::new(backend), JournalOptions::default()).unwrap()
        };
        names.extend([
            "PostgreSQL, journal",
            "PostgreSQL, journal, no NOTIFY",
            "PostgreSQL, bare INSERT, 1 row/txn",
            "PostgreSQL, store SQL, 1 row/txn",
            "PostgreSQL, pipelined, 1 row/txn",
        ]);
        probes.extend([
            Probe::journal(open(false)),
            Probe::journal(open(true)),
            Probe::bare(scratch, Shape::Insert),
            Probe::bare(scratch, Shape::Store),
            Probe::bare(scratch, Shape::Pipelined),
        ]);
    }
    let results = latencies(&mut probes);
    for (name, v) in names.iter().zip(results) {
        print_latency(name, v);
    }
    for p in probes {
        p.finish(scratch.as_ref());
    }
    println!(
        "(rounds of {LATENCY_ROUND} events per line, the lines taking turns; PostgreSQL as in \
         the header above; no NOTIFY: the journal's wake-up after each commit dropped by a \
         pass-through backend; bare INSERT, store SQL and pipelined: the loops of the table, \
         one event per transaction, on one connection)"
    );
}

/// The server's version and commit durability, as the table header shows
/// them.
fn server_settings(url: &str) -> String {
    let url = url.to_string();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .ok()?;
            tokio::spawn(conn);
            let row = client
                .query_one(
                    "SELECT current_setting('server_version'), \
                     current_setting('synchronous_commit'), current_setting('fsync')",
                    &[],
                )
                .await
                .ok()?;
            let (v, sc, fsync): (String, String, String) = (row.get(0), row.get(1), row.get(2));
            let major = v.split_whitespace().next().unwrap_or(&v).to_string();
            Some(format!("{major}, synchronous_commit={sc}, fsync={fsync}"))
        })
        .unwrap_or_else(|| "server settings unknown".into())
    })
    .join()
    .unwrap_or_else(|_| "server settings unknown".into())
}
