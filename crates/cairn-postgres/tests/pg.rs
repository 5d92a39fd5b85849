//! What the PostgreSQL backend promises beyond the conformance suite:
//! migrations, leases and the fence between processes (each "process" here
//! is a backend of its own, with its own owner id and connections),
//! wake-ups across backends, and the journal running over it.

use cairn_postgres::testing as common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_events::{Event, EventKind, OutputStream, Scope};
use cairn_postgres::{PgBackend, PgOptions, SCHEMA_VERSION};
use cairn_store::prelude::*;
use cairn_store::{EventQuery, Journal, JournalOptions, RunRecord, StoreError, StoredEvent, Topic};
use common::Scratch;

const LONG: Duration = Duration::from_secs(10);
const SHORT: Duration = Duration::from_millis(300);

fn ttl(ttl: Duration) -> PgOptions {
    PgOptions {
        lease_ttl: ttl,
        ..PgOptions::default()
    }
}

fn record(run: &str) -> RunRecord {
    RunRecord {
        run_id: cairn_events::RunId::parse(run).unwrap(),
        workflow: "wf".into(),
        workflow_path: "wf.yaml".into(),
        workflow_hash: "abc".into(),
        workflow_source: "name: wf\n".into(),
        input: serde_json::json!({"n": 1}),
        status: cairn_storage::RecordStatus::Pending,
        created_ms: 1,
        updated_ms: 1,
        parent_run_id: None,
    }
}

fn output(run: &str, seq: u64) -> StoredEvent {
    StoredEvent::from_event(&Event {
        run_id: cairn_events::RunId::parse(run).unwrap(),
        seq: cairn_events::Seq(seq),
        timestamp_ms: seq as i64,
        scope: Scope::node("a", 0).with_attempt(1),
        kind: EventKind::NodeOutput {
            text: format!("{run} {seq}"),
            stream: OutputStream::Stdout,
        },
    })
}

fn started() -> EventKind {
    EventKind::RunStarted {
        workflow: "wf".into(),
        workflow_hash: "abc".into(),
        input: None,
        resumed: false,
        parent_run_id: None,
        parent_node_id: None,
        depth: 0,
        forked_from: None,
        trigger: None,
        replay_of: None,
    }
}

/// A backend of `schema` whose instance is `name`.
fn named(s: &Scratch, schema: &str, name: &str) -> PgBackend {
    s.open(
        schema,
        PgOptions {
            instance: Some(name.into()),
            ..PgOptions::default()
        },
    )
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn busy_run(err: StoreError) -> String {
    match err {
        StoreError::LeaseHeld { run } => run,
        other => panic!("expected Busy, got {other:?}"),
    }
}

#[test]
fn a_schema_written_by_a_newer_cairn_is_refused() {
    let Some(s) = Scratch::new() else { return };
    let schema = s.schema();
    drop(s.open(&schema, PgOptions::default()));
    // Opening again at the same version changes nothing.
    let b = s.open(&schema, PgOptions::default());
    b.create_run(&record("r")).unwrap();
    drop(b);
    s.sql_in(
        &schema,
        &format!("UPDATE cairn_schema SET version = {}", SCHEMA_VERSION + 1),
    );
    let err = PgBackend::open_with(
        s.url,
        PgOptions {
            schema: Some(schema.clone()),
            ..PgOptions::default()
        },
    )
    .unwrap_err();
    match err {
        StoreError::TooNew {
            found, supported, ..
        } => assert_eq!((found, supported), (SCHEMA_VERSION + 1, SCHEMA_VERSION)),
        other => panic!("expected TooNew, got {other:?}"),
    }
}

#[test]
fn processes_opening_a_new_schema_at_once_all_get_it_migrated_once() {
    let Some(s) = Scratch::new() else { return };
    let schema = s.schema();
    let backends: Vec<PgBackend> = std::thread::scope(|scope| {
        let opening: Vec<_> = (0..4)
            .map(|_| scope.spawn(|| s.open(&schema, PgOptions::default())))
            .collect();
        opening.into_iter().map(|t| t.join().unwrap()).collect()
    });
    backends[0].create_run(&record("r")).unwrap();
    assert!(backends[3]
        .get_run(&cairn_events::RunId::parse("r").unwrap())
        .unwrap()
        .is_some());
    // One version row, at the current version.
    s.sql_in(
        &schema,
        &format!(
            "DO $$ BEGIN IF (SELECT count(*) FROM cairn_schema WHERE version = {SCHEMA_VERSION}) <> 1 \
             THEN RAISE 'bad version rows'; END IF; END $$"
        ),
    );
}

#[test]
fn a_schema_with_another_programs_tables_is_refused() {
    let Some(s) = Scratch::new() else { return };
    let schema = s.schema();
    common::sql(
        s.url,
        &format!("CREATE SCHEMA {schema}; CREATE TABLE {schema}.events (id int);"),
    );
    let err = PgBackend::open_with(
        s.url,
        PgOptions {
            schema: Some(schema),
            ..PgOptions::default()
        },
    )
    .unwrap_err();
    assert!(
        matches!(err, StoreError::Corrupt { ref detail, .. } if detail.contains("events")),
        "{err:?}"
    );
}

#[test]
fn bad_names_and_absent_servers_fail_to_open() {
    let err = PgBackend::open_with(
        "postgres://postgres@127.0.0.1:5432/postgres",
        PgOptions {
            schema: Some("Robert'); DROP TABLE runs;--".into()),
            ..PgOptions::default()
        },
    )
    .unwrap_err();
    assert!(
        matches!(err, StoreError::Open { ref detail, .. } if detail.contains("schema name")),
        "{err:?}"
    );
    assert!(matches!(
        PgBackend::open("mysql://nope").unwrap_err(),
        StoreError::Open { .. }
    ));
    // Port 1 on the loopback: nothing listens there.
    let err = PgBackend::open("postgres://postgres:secret@127.0.0.1:1/postgres").unwrap_err();
    assert!(matches!(err, StoreError::Open { .. }), "{err:?}");
    assert!(!err.to_string().contains("secret"), "{err}");
}

#[test]
fn backends_and_leases_can_be_dropped_inside_a_runtime() {
    let Some(s) = Scratch::new() else { return };
    let schema = s.schema();
    let a = s.open(&schema, PgOptions::default());
    let b = s.open(&schema, PgOptions::default());
    for rt in [
        runtime(),
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap(),
    ] {
        let lease = a
            .try_lock_run(&cairn_events::RunId::parse("r").unwrap())
            .unwrap()
            .expect("a free lease");
        rt.block_on(async {
            // Blocks this task's thread for the release; must not panic.
            drop(lease);
            assert!(
                a.try_lock_run(&cairn_events::RunId::parse("r").unwrap())
                    .unwrap()
                    .is_some(),
                "released"
            );
        });
    }
    runtime().block_on(async move {
        let _held = b
            .try_lock_run(&cairn_events::RunId::parse("s").unwrap())
            .unwrap()
            .expect("a free lease");
        drop(a);
        drop(b);
    });
}

#[test]
fn a_crashed_holders_lease_expires_and_another_process_takes_it() {
    let Some(s) = Scratch::new() else { return };
    let schema = s.schema();
    let lease_ttl = Duration::from_millis(900);
    let a = s.open(&schema, ttl(lease_ttl));
    let b = s.open(&schema, ttl(lease_ttl));
    let held = a
        .try_lock_run(&cairn_events::RunId::parse("r").unwrap())
        .unwrap()
        .expect("a free lease");
    assert!(
        b.try_lock_run(&cairn_events::RunId::parse("r").unwrap())
            .unwrap()
            .is_none(),
        "held by the other"
    );
    // The heartbeat keeps it well past the ttl.
    std::thread::sleep(lease_ttl * 2);
    assert!(
        b.try_lock_run(&cairn_events::RunId::parse("r").unwrap())
            .unwrap()
            .is_none(),
        "renewed while its holder lives"
    );
    // A crash: nothing is released and nothing renews any more.
    std::mem::forget(held);
    drop(a);
    let crashed = Instant::now();
    assert!(
        b.try_lock_run(&cairn_events::RunId::parse("r").unwrap())
            .unwrap()
            .is_none(),
        "a crashed holder's lease lasts its ttl"
    );
    let taken = loop {
        if let Some(l) = b
            .try_lock_run(&cairn_events::RunId::parse("r").unwrap())
            .unwrap()
        {
            break l;
        }
        assert!(crashed.elapsed() < LONG, "the lease never expired");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        crashed.elapsed() >= lease_ttl / 2,
        "{:?}",
        crashed.elapsed()
    );
    drop(taken);
    assert!(b
        .try_lock_run(&cairn_events::RunId::parse("r").unwrap())
        .unwrap()
        .is_some());
}

/// Plants a lease of run `run` held for an hour by `owner`, as a process
/// that crashed would leave it.
fn plant_lease(s: &Scratch, schema: &str, run: &str, owner: &str) {
    s.sql_in(
        schema,
        &format!(
            "INSERT INTO leases (run_id, owner, expires_at) \
             VALUES ('{run}', '{}', clock_timestamp() + interval '1 hour')",
            owner.replace('\'', "''")
        ),
    );
}

/// A process of this machine, started to hold a lease and killed.
fn doomed_process() -> std::process::Child {
    std::process::Command::new("sleep")
        .arg("600")
        .spawn()
        .expect("spawn sleep")
}

#[test]
fn a_lease_of_a_process_that_died_on_this_machine_is_taken_at_once() {
    let Some(s) = Scratch::new() else { return };
    let schema = s.schema();
    let b = s.open(&schema, PgOptions::default());
    let mut holder = doomed_process();
    let pid = holder.id();
    plant_lease(&s, &schema, "r", &common::lease_owner_of(pid));

    // Alive: refused, and said to be driven here.
    assert!(
        b.try_lock_run(&cairn_events::RunId::parse("r").unwrap())
            .unwrap()
            .is_none(),
        "its holder lives"
    );
    let seen = b
        .lease_holder(&cairn_events::RunId::parse("r").unwrap())
        .unwrap()
        .expect("a live holder");
    assert!(seen.alive_here, "{seen:?}");
    assert!(seen.holder.starts_with(&format!("pid {pid}")), "{seen:?}");
    assert!(
        seen.expires_in.unwrap() > Duration::from_secs(60),
        "{seen:?}"
    );

    // Killed: taken at once, an hour before the lease would expire.
    holder.kill().unwrap();
    holder.wait().unwrap();
    assert_eq!(
        b.lease_holder(&cairn_events::RunId::parse("r").unwrap())
            .unwrap(),
        None,
        "a dead holder is nobody"
    );
    let lease = b
        .try_lock_run(&cairn_events::RunId::parse("r").unwrap())
        .unwrap()
        .expect("taken over at once");
    // Now B's: renewed as its own, and refused to others while B lives.
    let c = s.open(&schema, PgOptions::default());
    assert!(c
        .try_lock_run(&cairn_events::RunId::parse("r").unwrap())
        .unwrap()
        .is_none());
    assert!(c
        .lease_holder(&cairn_events::RunId::parse("r").unwrap())
        .unwrap()
        .is_some_and(|h| h.alive_here));
    drop(lease);
    assert!(
        c.try_lock_run(&cairn_events::RunId::parse("r").unwrap())
            .unwrap()
            .is_some(),
        "released by B"
    );
}

#[test]
fn a_reused_pid_is_not_taken_for_the_lease_holder() {
    let Some(s) = Scratch::new() else { return };
    let schema = s.schema();
    let b = s.open(&schema, PgOptions::default());
    // The owner names this very process's pid but another start time: the
    // holder was an earlier process under the same pid.
    let me = common::lease_owner_of(std::process::id());
    let (head, tail) = me.split_once(" start=").unwrap();
    let (start, rest) = tail.split_once(' ').unwrap();
    let earlier: u64 = start.parse::<u64>().unwrap().saturating_sub(1);
    plant_lease(&s, &schema, "r", &format!("{head} start={earlier} {rest}"));
    assert!(
        b.try_lock_run(&cairn_events::RunId::parse("r").unwrap())
            .unwrap()
            .is_some(),
        "the pid's holder is gone"
    );
}

#[test]
fn a_lease_of_another_machine_or_an_unknown_holder_waits_for_its_expiry() {
    let Some(s) = Scratch::new() else { return };
    let schema = s.schema();
    let b = s.open(&schema, PgOptions::default());
    // Another boot: its pid means nothing here, even one that is not running.
    plant_lease(
        &s,
        &schema,
        "elsewhere",
        "00000000000000aa pid=999999 start=1 host=another-boot/pid:[1] name=build-3",
    );
    // An owner id that names nobody (an older Cairn's, say).
    plant_lease(&s, &schema, "unknown", "1234-00000000000000bb");
    for run in ["elsewhere", "unknown"] {
        let id = cairn_events::RunId::parse(run).unwrap();
        assert!(b.try_lock_run(&id).unwrap().is_none(), "{run}");
        let seen = b.lease_holder(&id).unwrap().expect("held");
        assert!(!seen.alive_here, "{run}: {seen:?}");
        let left = seen.expires_in.expect("an expiry");
        assert!(
            left > Duration::from_secs(3000) && left <= Duration::from_secs(3600),
            "{left:?}"
        );
    }
    assert_eq!(
        b.lease_holder(&cairn_events::RunId::parse("elsewhere").unwrap())
            .unwrap()
            .unwrap()
            .holder,
        "pid 999999 on build-3"
    );
    // Expired: taken, as ever.
    s.sql_in(
        &schema,
        "UPDATE leases SET expires_at = clock_timestamp() - interval '1 second'",
    );
    assert_eq!(
        b.lease_holder(&cairn_events::RunId::parse("elsewhere").unwrap())
            .unwrap(),
        None
    );
    assert!(b
        .try_lock_run(&cairn_events::RunId::parse("elsewhere").unwrap())
        .unwrap()
        .is_some());
    assert!(b
        .try_lock_run(&cairn_events::RunId::parse("unknown").unwrap())
        .unwrap()
        .is_some());
}

#[test]
fn of_processes_racing_for_a_dead_holders_lease_exactly_one_wins() {
    let Some(s) = Scratch::new() else { return };
    let schema = s.schema();
    let racers: Vec<PgBackend> = (0..6)
        .map(|_| s.open(&schema, PgOptions::default()))
        .collect();
    for round in 0..10 {
        let run = format!("r{round}");
        let mut holder = doomed_process();
        plant_lease(&s, &schema, &run, &common::lease_owner_of(holder.id()));
        holder.kill().unwrap();
        holder.wait().unwrap();
        let barrier = std::sync::Barrier::new(racers.len());
        let won: Vec<_> = std::thread::scope(|scope| {
            let tries: Vec<_> = racers
                .iter()
                .map(|b| {
                    let (barrier, run) = (&barrier, &run);
                    scope.spawn(move || {
                        barrier.wait();
                        b.try_lock_run(&cairn_events::RunId::parse(run).unwrap())
                            .unwrap()
                    })
                })
                .collect();
            tries.into_iter().map(|t| t.join().unwrap()).collect()
        });
        let winners = won.iter().filter(|l| l.is_some()).count();
        assert_eq!(winners, 1, "round {round}: {winners} took the lease");
    }
}

#[test]
fn the_fence_refuses_writes_to_a_run_leased_by_another_process() {
    let Some(s) = Scratch::new() else { return };
    let schema = s.schema();
    // A renews rarely, so that its lease can be made to lapse by hand, as
    // when a process stalls (a long pause, a network partition).
    let a = s.open(&schema, ttl(Duration::from_secs(60)));
    let b = s.open(&schema, PgOptions::default());
    a.create_run(&record("r")).unwrap();
    let a_lease = a
        .try_lock_run(&cairn_events::RunId::parse("r").unwrap())
        .unwrap()
        .expect("a free lease");
    a.append(&[output("r", 1)]).unwrap();
    assert_eq!(busy_run(b.append(&[output("r", 2)]).unwrap_err()), "r");

    // A stalls and its lease lapses; B takes the run over.
    let mut tries = 0;
    let b_lease = loop {
        s.sql_in(
            &schema,
            "UPDATE leases SET expires_at = clock_timestamp() - interval '1 second' \
             WHERE run_id = 'r'",
        );
        // A's heartbeat may renew it in between: then again.
        if let Some(l) = b
            .try_lock_run(&cairn_events::RunId::parse("r").unwrap())
            .unwrap()
        {
            break l;
        }
        tries += 1;
        assert!(tries < 5, "the lapsed lease could not be taken");
    };
    assert_eq!(
        b.last_seq(&cairn_events::RunId::parse("r").unwrap())
            .unwrap(),
        1
    );

    // A wakes up and writes: refused, and nothing of the batch is kept.
    let err = a.append(&[output("s", 1), output("r", 2)]).unwrap_err();
    assert_eq!(busy_run(err), "r");
    assert_eq!(
        a.last_seq(&cairn_events::RunId::parse("s").unwrap())
            .unwrap(),
        0
    );
    assert_eq!(
        a.last_seq(&cairn_events::RunId::parse("r").unwrap())
            .unwrap(),
        1
    );
    b.append(&[output("r", 2)]).unwrap();

    // A's stale lease, dropped, does not free B's.
    drop(a_lease);
    let c = s.open(&schema, PgOptions::default());
    assert!(
        c.try_lock_run(&cairn_events::RunId::parse("r").unwrap())
            .unwrap()
            .is_none(),
        "B still holds it"
    );
    drop(b_lease);
    assert!(
        c.try_lock_run(&cairn_events::RunId::parse("r").unwrap())
            .unwrap()
            .is_some(),
        "released by B"
    );
    let seqs: Vec<u64> = c
        .read_events(
            &cairn_events::RunId::parse("r").unwrap(),
            &EventQuery::default(),
        )
        .unwrap()
        .iter()
        .map(|e| e.seq)
        .collect();
    assert_eq!(seqs, [1, 2]);
}

#[test]
fn a_notify_from_one_process_wakes_the_listeners_of_another() {
    let Some(s) = Scratch::new() else { return };
    let schema = s.schema();
    let a = s.open(&schema, PgOptions::default());
    let b = s.open(&schema, PgOptions::default());
    // Another store in the same database.
    let elsewhere = s.open(&s.schema(), PgOptions::default());
    runtime().block_on(async {
        let mut inbox = b.listen(Topic::Inbox("r")).unwrap();
        let mut other_run = b.listen(Topic::Inbox("s")).unwrap();
        let mut other_store = elsewhere.listen(Topic::Inbox("r")).unwrap();
        let mut own = a.listen(Topic::Inbox("r")).unwrap();
        a.notify(Topic::Inbox("r"));
        tokio::time::timeout(LONG, inbox.wait())
            .await
            .expect("the other process's listener is woken");
        tokio::time::timeout(LONG, own.wait())
            .await
            .expect("this process's listener is woken");
        assert!(
            tokio::time::timeout(SHORT, own.wait()).await.is_err(),
            "one notify made two wake-ups here (the echo was not skipped)"
        );
        assert!(tokio::time::timeout(SHORT, other_run.wait()).await.is_err());
        assert!(
            tokio::time::timeout(SHORT, other_store.wait())
                .await
                .is_err(),
            "woken by another store's notification"
        );
    });
}

#[test]
fn listeners_are_woken_when_the_wake_up_connection_comes_back() {
    let Some(s) = Scratch::new() else { return };
    let schema = s.schema();
    // A name of its own, to find this backend's wake-up session.
    let app = format!("cairn_t_wake_{}", std::process::id());
    let sep = if s.url.contains('?') { '&' } else { '?' };
    let a = PgBackend::open_with(
        &format!("{}{sep}application_name={app}", s.url),
        PgOptions {
            schema: Some(schema.clone()),
            ..PgOptions::default()
        },
    )
    .unwrap();
    let b = s.open(&schema, PgOptions::default());
    runtime().block_on(async {
        let mut inbox = a.listen(Topic::Inbox("r")).unwrap();
        common::sql(
            s.url,
            &format!(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE application_name = '{app}-wake'"
            ),
        );
        tokio::time::timeout(LONG, inbox.wait())
            .await
            .expect("woken after the connection came back");
        // And it listens again: another process's notify gets through (sent
        // until then, as the reconnection may still be under way).
        let woken = async {
            loop {
                b.notify(Topic::Inbox("r"));
                if tokio::time::timeout(SHORT, inbox.wait()).await.is_ok() {
                    break;
                }
            }
        };
        tokio::time::timeout(LONG, woken)
            .await
            .expect("notifications arrive again");
    });
}

#[test]
fn the_journal_appends_and_subscriptions_see_it_here_and_in_another_process() {
    let Some(s) = Scratch::new() else { return };
    let schema = s.schema();
    let here = Journal::open(
        Arc::new(s.open(&schema, PgOptions::default())),
        JournalOptions::default(),
    )
    .unwrap();
    let there = Journal::open(
        Arc::new(s.open(&schema, PgOptions::default())),
        JournalOptions::default(),
    )
    .unwrap();
    here.backend().create_run(&record("r")).unwrap();
    runtime().block_on(async {
        let mut local = here
            .subscribe(&cairn_events::RunId::parse("r").unwrap(), 0)
            .unwrap();
        let mut remote = there
            .subscribe(&cairn_events::RunId::parse("r").unwrap(), 0)
            .unwrap();
        let log = here
            .run_log(&cairn_events::RunId::parse("r").unwrap())
            .unwrap();
        assert!(
            matches!(
                there.run_log(&cairn_events::RunId::parse("r").unwrap()),
                Err(StoreError::LeaseHeld { .. })
            ),
            "the run is leased by the other journal"
        );
        let first = log.append_durable(Scope::run(), started()).await.unwrap();
        assert_eq!(first.seq, cairn_events::Seq(1));
        for i in 0..3 {
            log.append(
                Scope::node("a", 0).with_attempt(1),
                EventKind::NodeOutput {
                    text: format!("line {i}"),
                    stream: OutputStream::Stdout,
                },
            );
        }
        log.append(
            Scope::run(),
            EventKind::RunFinished {
                output: None,
                duration_ms: 1,
            },
        );
        log.sync().await.unwrap();
        for sub in [&mut local, &mut remote] {
            let mut seqs = Vec::new();
            while let Some(ev) = tokio::time::timeout(LONG, sub.next())
                .await
                .expect("the subscription keeps up")
            {
                seqs.push(ev.unwrap().seq);
            }
            assert_eq!(seqs, [1, 2, 3, 4, 5]);
        }
        drop(log);
    });
    let run = there
        .backend()
        .get_run(&cairn_events::RunId::parse("r").unwrap())
        .unwrap()
        .unwrap();
    assert_eq!(run.status.as_str(), "finished");
    // A dropped RunLog hands its lease to the writer, which gives it back
    // once what the log queued is written: soon after the drop, not at it.
    let deadline = std::time::Instant::now() + LONG;
    while there
        .run_log(&cairn_events::RunId::parse("r").unwrap())
        .is_err()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "released once the log dropped"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Who drives a run: the instance named by the backend that holds its
/// lease, for every backend of the store (its own runs included), and
/// nobody once the lease is given back.
#[test]
fn drivers_name_the_instance_that_holds_each_run() {
    let Some(s) = Scratch::new() else { return };
    let schema = s.schema();
    let named = |name: &str| named(&s, &schema, name);
    let (alpha, beta) = (named("alpha"), named("beta:2"));
    let bad = PgBackend::open_with(
        s.url,
        PgOptions {
            schema: Some(schema.clone()),
            instance: Some("has space".into()),
            ..PgOptions::default()
        },
    );
    assert!(
        matches!(bad, Err(StoreError::Open { .. })),
        "a bad name was taken"
    );
    let (r, q) = (
        cairn_events::RunId::parse("r").unwrap(),
        cairn_events::RunId::parse("q").unwrap(),
    );
    let lease = alpha.try_lock_run(&r).unwrap().unwrap();
    let theirs = beta.try_lock_run(&q).unwrap().unwrap();
    let both = [r.clone(), q.clone()];
    for b in [&alpha, &beta] {
        let d = b.drivers(&both).unwrap();
        assert_eq!(d.get(&r).map(String::as_str), Some("alpha"));
        assert_eq!(d.get(&q).map(String::as_str), Some("beta:2"));
    }
    let held = beta.lease_holder(&r).unwrap().expect("alpha holds r");
    assert_eq!(held.instance.as_deref(), Some("alpha"));
    drop(lease);
    assert_eq!(beta.drivers(&both).unwrap().len(), 1);
    drop(theirs);
    assert!(alpha.drivers(&both).unwrap().is_empty());
}

/// Queued runs are claimed as shares: each of two instances with room
/// takes half, none takes a run twice, a claim is the run's lease, a claim
/// given up unstarted makes the run claimable again, and an instance that
/// leaves stops counting.
#[test]
fn queued_runs_are_claimed_in_shares_and_once() {
    let Some(s) = Scratch::new() else { return };
    let schema = s.schema();
    let named = |name: &str| named(&s, &schema, name);
    let (a, b) = (named("a"), named("b"));
    // Not a claimer yet: nothing to claim, whatever is queued.
    let mut queued = record("q00");
    queued.status = cairn_storage::RecordStatus::Queued;
    a.queue_run(&queued, None).unwrap();
    assert!(a.claim(10).unwrap().is_empty());
    assert!(matches!(
        a.queue_run(&queued, None),
        Err(StoreError::RunExists(_))
    ));
    a.join(100).unwrap();
    b.join(100).unwrap();
    for i in 1..30 {
        let mut rec = record(&format!("q{i:02}"));
        rec.status = cairn_storage::RecordStatus::Queued;
        rec.created_ms = i;
        a.queue_run(&rec, None).unwrap();
    }
    let fleet = a.fleet().unwrap();
    assert_eq!(fleet.queued, 30);
    assert_eq!(fleet.instances.len(), 2);
    let mine = a.claim(100).unwrap();
    assert_eq!(mine.len(), 15, "a takes its half");
    assert!(
        a.claim(100).unwrap().is_empty(),
        "and no more while b has room"
    );
    let theirs = b.claim(4).unwrap();
    assert_eq!(theirs.len(), 4, "b takes no more than it asks");
    let rest = b.claim(100).unwrap();
    assert_eq!(rest.len(), 11);
    let mut all: Vec<String> = mine
        .iter()
        .chain(&theirs)
        .chain(&rest)
        .map(|(r, _)| r.to_string())
        .collect();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 30, "every run claimed once");
    // The oldest first.
    assert_eq!(mine[0].0.as_str(), "q00");
    // A claim is the lease.
    let (run, _) = &mine[0];
    assert!(b.try_lock_run(run).unwrap().is_none());
    assert_eq!(b.drivers(std::slice::from_ref(run)).unwrap()[run], "a");
    let fleet = b.fleet().unwrap();
    assert_eq!(fleet.queued, 0);
    let loads: Vec<(String, u64, bool)> = fleet
        .instances
        .iter()
        .map(|i| (i.instance.clone(), i.driving, i.me))
        .collect();
    assert_eq!(
        loads,
        [("a".to_string(), 15, false), ("b".to_string(), 15, true)]
    );
    // Given up before the run started: claimable again, by whoever has
    // the least.
    let mut mine = mine;
    let (given_back, lease) = mine.remove(0);
    drop(lease);
    let again = a.claim(100).unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].0, given_back);
    // Alone once b leaves: a takes what its room allows.
    b.leave().unwrap();
    drop((theirs, rest, mine));
    for i in 30..40 {
        let mut rec = record(&format!("q{i:02}"));
        rec.status = cairn_storage::RecordStatus::Queued;
        a.queue_run(&rec, None).unwrap();
    }
    assert_eq!(a.fleet().unwrap().instances.len(), 1);
    assert_eq!(
        a.claim(100).unwrap().len(),
        39,
        "all but its own, 10 of them new"
    );
}
