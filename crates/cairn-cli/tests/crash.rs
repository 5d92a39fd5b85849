//! The crash test: the real `cairn` binary runs a workflow of a few hundred
//! command nodes, is killed with SIGKILL at random moments over and over, and
//! is resumed until the run is done. Afterwards the store must show every
//! node finished exactly once, `seq` without a gap, and no side effect beyond
//! the attempts the log started; no process of a killed run may survive the
//! resume that follows. On PostgreSQL too (when `CAIRN_TEST_PG` is set),
//! where every resume comes right after the kill, with leases that would
//! last a minute: a killed process's lease is taken over at once on its
//! machine, and a resume that had to wait fails the test (`--no-wait`).

mod common;
use common::store::Store;
use common::*;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cairn_events::{Event, EventKind};
use cairn_store::EventQuery;

/// Kills of `cairn run`/`cairn resume` before the final resume.
const KILLS: usize = 15;
const CHAINS: usize = 16;
const CHAIN_LEN: usize = 10;
const FANOUT: usize = 100;
/// Fan-out nodes whose command leaves a long-lived grandchild: if a resume
/// did not kill the process groups a killed run left behind, these would
/// still be alive when checked.
const SLOW: usize = 3;

/// A small xorshift generator: the test needs varied delays, not crypto.
struct Rng(u64);

impl Rng {
    fn seeded() -> Rng {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        let seed = std::env::var("CAIRN_CRASH_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(t | 1);
        eprintln!("crash test seed {seed} (CAIRN_CRASH_SEED reruns it)");
        Rng(seed)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// The workflow: a root, chains hanging off it, a wide fan-out, and a join.
/// Every command appends its node's id to `side-effects.txt`.
fn workflow(marker: &str) -> (String, Vec<String>) {
    let mut ids = Vec::new();
    let mut y = String::from(
        // The default retry policy (one attempt): an attempt a kill
        // interrupts is run again by the resume all the same.
        "name: crash\nconcurrency: 8\nnodes:\n",
    );
    let mut node = |y: &mut String, id: &str, needs: &[String], extra: &str| {
        ids.push(id.to_string());
        y.push_str(&format!("  - id: {id}\n"));
        if !needs.is_empty() {
            y.push_str(&format!("    needs: [{}]\n", needs.join(", ")));
        }
        let script = format!("echo {id} >> side-effects.txt{extra}");
        y.push_str(&format!(
            "    command: [\"sh\", \"-c\", {}]\n",
            serde_json::to_string(&script).unwrap()
        ));
    };
    node(&mut y, "root", &[], "");
    let mut tails = Vec::new();
    for c in 0..CHAINS {
        let mut prev = "root".to_string();
        for i in 0..CHAIN_LEN {
            let id = format!("c{c}_{i}");
            node(&mut y, &id, &[prev.clone()], "");
            prev = id;
        }
        tails.push(prev);
    }
    for f in 0..FANOUT {
        let id = format!("f{f}");
        // Two commands, so the inner shell is not replaced by `sleep` and
        // keeps the marker in its argv.
        let extra = if f < SLOW {
            format!("; sh -c 'sleep 5; true' {marker}")
        } else {
            String::new()
        };
        node(&mut y, &id, &["root".to_string()], &extra);
        if f % 10 == 0 {
            tails.push(id);
        }
    }
    node(&mut y, "join", &tails, "");
    (y, ids)
}

fn cairn(dir: &Path, store: &Store, args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_cairn"))
        .current_dir(dir)
        .args(args)
        .args(store.args())
        .env_remove("CAIRN_STORE")
        .env_remove("CAIRN_LOG_DIR")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn cairn")
}

/// Processes whose command line carries `marker`.
fn marked(marker: &str) -> BTreeSet<u32> {
    let mut out = BTreeSet::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(cmd) = std::fs::read(e.path().join("cmdline")) {
            if String::from_utf8_lossy(&cmd).contains(marker) {
                out.insert(pid);
            }
        }
    }
    out
}

fn alive_with(pid: u32, marker: &str) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| String::from_utf8_lossy(&c).contains(marker))
        .unwrap_or(false)
}

fn events(store: &Store, run: &str) -> Vec<Event> {
    let Some(backend) = store.open() else {
        return Vec::new();
    };
    backend
        .read_events(
            &cairn_events::RunId::parse(run).unwrap(),
            &EventQuery::default(),
        )
        .expect("read events")
        .iter()
        .map(|s| s.decode().expect("stored events decode"))
        .collect()
}

/// How many sessions have started, and whether the latest got past its
/// recovery (which kills what a killed session left running): recovery
/// comes before the session's first node event.
fn sessions(store: &Store, run: &str) -> (usize, bool) {
    let evs = events(store, run);
    let starts: Vec<usize> = evs
        .iter()
        .enumerate()
        .filter(|(_, e)| matches!(e.kind, EventKind::RunStarted { .. }))
        .map(|(i, _)| i)
        .collect();
    let Some(&last) = starts.last() else {
        return (0, false);
    };
    let recovered = evs[last + 1..].iter().any(|e| {
        matches!(
            e.kind,
            EventKind::NodeStarted { snapshot: None }
                | EventKind::NodeFailed { .. }
                | EventKind::NodeFinished { .. }
        )
    });
    (starts.len(), recovered)
}

fn run_exists(store: &Store, run: &str) -> bool {
    store
        .open()
        .and_then(|b| b.get_run(&cairn_events::RunId::parse(run).unwrap()).ok())
        .flatten()
        .is_some()
}

#[test]
fn sigkill_at_random_moments_then_resume_until_done() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::Sqlite(dir.path().join(".cairn/cairn.db"));
    crash_until_done(dir.path(), &store, "sqlite");
}

/// The same on PostgreSQL, in a database of the test's own.
#[test]
fn sigkill_at_random_moments_then_resume_until_done_on_postgres() {
    let Some(server) = cairn_postgres::testing::server_or_skip() else {
        return;
    };
    let name = format!("cairn_crash_{}", std::process::id());
    let url = cairn_postgres::testing::create_database(server, &name);
    let dir = tempfile::tempdir().unwrap();
    crash_until_done(dir.path(), &Store::Pg(url), "pg");
    cairn_postgres::testing::drop_database(server, &name);
}

fn crash_until_done(dir: &Path, store: &Store, tag: &str) {
    let marker = format!("cairn-crash-orphan-{tag}-{}", std::process::id());
    let (yaml, ids) = workflow(&marker);
    std::fs::write(dir.join("crash.yaml"), yaml).unwrap();
    let run = "crash-run";
    let mut rng = Rng::seeded();

    let mut kills = 0;
    let mut ended_early = None;
    // Orphans a killed session left, to be gone once a resume has recovered.
    let mut orphans: BTreeSet<u32> = BTreeSet::new();
    let mut checked_orphans = 0;
    let mut started = false;
    while kills < KILLS {
        let before = if started { sessions(store, run).0 } else { 0 };
        // A resume never waits for a lease: one held by the process just
        // killed must be taken over at once, or the resume fails (exit 4).
        let mut child = if started {
            cairn(dir, store, &["resume", run, "--no-wait"])
        } else {
            cairn(dir, store, &["run", "crash.yaml", "--run-id", run])
        };
        std::thread::sleep(Duration::from_millis(20 + rng.below(281)));
        if let Some(status) = child.try_wait().unwrap() {
            let code = status.code();
            let err = stderr_of(&mut child);
            if code == Some(0) {
                ended_early = Some(kills);
                break;
            }
            panic!("cairn exited with {code:?} before being killed: {err}");
        }
        child.kill().unwrap(); // SIGKILL
        wait_exit(&mut child);
        kills += 1;
        // Killed before the run existed: `run` it again.
        started = started || run_exists(store, run);
        if !started {
            continue;
        }
        // A session that recovered killed the orphans seen before it.
        let (now, recovered) = sessions(store, run);
        if !orphans.is_empty() && now > before && recovered {
            let t0 = Instant::now();
            while orphans.iter().any(|&p| alive_with(p, &marker)) {
                assert!(
                    t0.elapsed() < Duration::from_secs(2),
                    "processes of a killed run survived the resume: {:?}",
                    orphans
                        .iter()
                        .filter(|&&p| alive_with(p, &marker))
                        .collect::<Vec<_>>()
                );
                std::thread::sleep(Duration::from_millis(10));
            }
            checked_orphans += orphans.len();
            orphans.clear();
        }
        orphans.extend(marked(&marker));
    }

    if ended_early.is_none() {
        let mut child = cairn(dir, store, &["resume", run, "--no-wait"]);
        let status = wait_exit(&mut child);
        let err = stderr_of(&mut child);
        assert_eq!(status.code(), Some(0), "the final resume failed: {err}");
    }
    eprintln!(
        "{kills} kills (run ended early: {ended_early:?}); {checked_orphans} orphans checked"
    );

    // No process of any session survives.
    let left = marked(&marker);
    assert!(left.is_empty(), "processes survived the run: {left:?}");

    let evs = events(store, run);
    // seq 1..n without a gap, one RunStarted per session, one end.
    for (i, e) in evs.iter().enumerate() {
        assert_eq!(
            e.seq,
            cairn_events::Seq(i as u64 + 1),
            "seq gap at position {i}"
        );
    }
    let sessions = evs
        .iter()
        .filter(|e| matches!(e.kind, EventKind::RunStarted { .. }))
        .count();
    assert!(
        sessions >= 2,
        "the run was never resumed ({sessions} sessions)"
    );
    assert!(
        matches!(evs.last().unwrap().kind, EventKind::RunFinished { .. }),
        "the run did not finish: {}",
        evs.last().unwrap().to_json()
    );
    assert_eq!(
        evs.iter().filter(|e| e.kind.is_terminal()).count(),
        1,
        "more than one terminal event"
    );
    // Layers open at a crash are closed by a later session, never started
    // twice while open.
    let mut open = std::collections::BTreeSet::new();
    for e in &evs {
        match &e.kind {
            EventKind::LayerStarted { layer_index, .. } => {
                assert!(
                    open.insert(*layer_index),
                    "seq {}: layer {layer_index} started twice",
                    e.seq
                );
            }
            EventKind::LayerFinished { layer_index, .. } => {
                assert!(
                    open.remove(layer_index),
                    "seq {}: layer {layer_index} finished but not open",
                    e.seq
                );
            }
            _ => {}
        }
    }
    assert!(open.is_empty(), "layers never finished: {open:?}");

    // Per node: one NodeFinished, nothing after it, and no more side effects
    // than started attempts.
    let mut finished: BTreeMap<&str, usize> = BTreeMap::new();
    let mut starts: BTreeMap<&str, u32> = BTreeMap::new();
    let mut first_attempt_finished: BTreeSet<&str> = BTreeSet::new();
    let mut after_finish: Vec<String> = Vec::new();
    for e in &evs {
        let Some(id) = e.scope.node_id.as_deref() else {
            continue;
        };
        if finished.get(id).copied().unwrap_or(0) > 0 {
            after_finish.push(format!("seq {} {} of {id}", e.seq, e.type_name()));
        }
        match &e.kind {
            EventKind::NodeFailed {
                error, will_retry, ..
            } => {
                // The commands never fail: every failure is a kill's, and
                // a kill is not the node's failure.
                assert_eq!(error.kind, "interrupted", "seq {}: {}", e.seq, e.to_json());
                assert!(
                    will_retry,
                    "seq {}: an interrupted attempt was not run again",
                    e.seq
                );
            }
            EventKind::NodeStarted { .. } => *starts.entry(id).or_default() += 1,
            EventKind::NodeFinished { .. } => {
                *finished.entry(id).or_default() += 1;
                if e.scope.attempt == Some(1) {
                    first_attempt_finished.insert(id);
                }
            }
            _ => {}
        }
    }
    assert!(
        after_finish.is_empty(),
        "events after NodeFinished: {after_finish:?}"
    );
    let text = std::fs::read_to_string(dir.join("side-effects.txt")).unwrap();
    let mut lines: BTreeMap<&str, u32> = BTreeMap::new();
    for l in text.lines() {
        *lines.entry(l.trim()).or_default() += 1;
    }
    let mut retried = 0;
    for id in &ids {
        let id = id.as_str();
        assert_eq!(
            finished.get(id),
            Some(&1),
            "{id} finished {:?} times",
            finished.get(id)
        );
        let n = lines.get(id).copied().unwrap_or(0);
        let s = starts[id];
        assert!(n >= 1, "{id} finished without its side effect");
        assert!(
            n <= s,
            "{id}: {n} side effects but {s} attempts started: a command ran outside a logged attempt"
        );
        if first_attempt_finished.contains(id) {
            assert_eq!(n, 1, "{id} finished on its first attempt yet ran {n} times");
        }
        if s > 1 {
            retried += 1;
        }
    }
    let unknown: Vec<&&str> = lines
        .keys()
        .filter(|l| !ids.iter().any(|i| i == *l))
        .collect();
    assert!(
        unknown.is_empty(),
        "side effects of unknown nodes: {unknown:?}"
    );
    eprintln!(
        "{} nodes finished once; {retried} needed more than one attempt; {} events",
        ids.len(),
        evs.len()
    );
}

/// A `bash` tool call's processes do not outlive a SIGKILL of the engine,
/// whether they stayed in the call's group or left it with `setsid`: the
/// sandbox's PID namespace dies with the engine (`PR_SET_PDEATHSIG` chain).
/// The resume then runs the interrupted call again.
#[test]
fn a_resume_kills_what_bash_calls_left_running() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let marker = format!("cairn-bash-orphan-{}", std::process::id());
    // Two leftovers: one in the call's group, one that left it. The first
    // attempt hangs; the attempt the resume runs again ends at once.
    let script = format!(
        "if [ -f again ]; then exit 0; fi; touch again; \
         setsid sh -c 'sleep 300; true' {marker}-setsid & \
         sh -c 'sleep 300; true' {marker}-group & \
         sleep 300"
    );
    let yaml = format!(
        "name: bashy\nnodes:\n  - id: work\n    tool: bash\n    args: {{ argv: [\"sh\", \"-c\", {}], timeout: 10m }}\n",
        serde_json::to_string(&script).unwrap()
    );
    std::fs::write(dir.join("bashy.yaml"), yaml).unwrap();
    let store = Store::Sqlite(dir.join(".cairn/cairn.db"));
    let mut child = cairn(dir, &store, &["run", "bashy.yaml", "--run-id", "b1"]);
    // Wait for the two leftovers themselves: the processes whose last
    // argument is the tag (the call's own shell names both tags inside its
    // script).
    let both = || {
        let m = marked(&marker);
        let has = |tail: &str| {
            let tag = format!("{marker}-{tail}");
            m.iter().any(|&p| {
                std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| {
                    c.split(|&b| b == 0)
                        .rfind(|a| !a.is_empty())
                        .is_some_and(|last| last == tag.as_bytes())
                })
            })
        };
        has("setsid") && has("group")
    };
    let t0 = Instant::now();
    while !both() {
        assert!(t0.elapsed() < PATIENCE, "the bash call never started");
        std::thread::sleep(Duration::from_millis(10));
    }
    let left = marked(&marker);
    child.kill().unwrap(); // SIGKILL
    wait_exit(&mut child);
    let t0 = Instant::now();
    while left.iter().any(|&p| alive_with(p, &marker)) {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "processes of the bash call survived the engine"
        );
        std::thread::sleep(Duration::from_millis(10));
    }

    let mut resume = cairn(dir, &store, &["resume", "b1"]);
    let status = wait_exit(&mut resume);
    let err = stderr_of(&mut resume);
    assert_eq!(status.code(), Some(0), "{err}");
    let evs = events(&store, "b1");
    assert!(evs.iter().any(|e| matches!(
        &e.kind,
        EventKind::NodeFailed { error, will_retry: true, .. } if error.kind == "interrupted"
    )));
    assert!(matches!(
        evs.last().unwrap().kind,
        EventKind::RunFinished { .. }
    ));
}

/// On PostgreSQL, a resume of a run whose lease a live process of this
/// machine holds is refused at once (exit 4, naming it); one held by a
/// process of another machine, which this one cannot look at, waits for
/// the lease to expire, saying so, unless `--no-wait` (exit 4).
#[test]
fn a_resume_on_postgres_refuses_a_live_holder_and_waits_for_another_machines() {
    let Some(server) = cairn_postgres::testing::server_or_skip() else {
        return;
    };
    let name = format!("cairn_crash_wait_{}", std::process::id());
    let url = cairn_postgres::testing::create_database(server, &name);
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    // The first attempt hangs; the one a resume runs ends at once.
    let script = "if [ -f again ]; then exit 0; fi; touch again; sleep 300";
    std::fs::write(
        dir.join("w.yaml"),
        format!(
            "name: held\nnodes:\n  - id: work\n    command: [\"sh\", \"-c\", {}]\n",
            serde_json::to_string(script).unwrap()
        ),
    )
    .unwrap();
    let store = Store::Pg(url.clone());
    let mut first = cairn(dir, &store, &["run", "w.yaml", "--run-id", "h"]);
    let t0 = Instant::now();
    while !dir.join("again").exists() {
        assert!(t0.elapsed() < PATIENCE, "the node never started");
        std::thread::sleep(Duration::from_millis(10));
    }

    // Alive on this machine: refused at once, whatever the lease's ttl.
    let mut second = cairn(dir, &store, &["resume", "h"]);
    let status = wait_exit(&mut second);
    let err = stderr_of(&mut second);
    assert_eq!(status.code(), Some(4), "{err}");
    assert!(
        err.contains(&format!(
            "being driven by another process (pid {}",
            first.id()
        )),
        "{err}"
    );
    assert!(!err.contains("waiting"), "{err}");

    // Killed, and its lease made another machine's, for two seconds more.
    first.kill().unwrap();
    wait_exit(&mut first);
    cairn_postgres::testing::sql(
        &url,
        "UPDATE leases SET owner = '00000000000000aa pid=77 start=1 host=another-boot/pid:[1] \
         name=elsewhere', expires_at = clock_timestamp() + interval '2 seconds'",
    );
    let mut refused = cairn(dir, &store, &["resume", "h", "--no-wait"]);
    let status = wait_exit(&mut refused);
    let err = stderr_of(&mut refused);
    assert_eq!(status.code(), Some(4), "{err}");
    assert!(err.contains("(pid 77 on elsewhere)"), "{err}");

    let mut waits = cairn(dir, &store, &["resume", "h"]);
    let status = wait_exit(&mut waits);
    let err = stderr_of(&mut waits);
    assert_eq!(status.code(), Some(0), "{err}");
    assert!(
        err.contains("run h is held by pid 77 on elsewhere until ") && err.contains("waiting"),
        "{err}"
    );
    assert!(matches!(
        events(&store, "h").last().unwrap().kind,
        EventKind::RunFinished { .. }
    ));
    cairn_postgres::testing::drop_database(server, &name);
}
