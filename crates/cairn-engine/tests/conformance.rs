//! Conformance of the engine to the event contract, on random workflows.
//!
//! Proptest generates workflows (random DAGs of `value`, `command`, `tool`
//! and `approval` nodes, `loop` and `for_each` groups, `if`, retries and
//! `on_failure`), writes them as YAML, and runs them on a real SQLite store
//! while a task answers approvals and another cancels the run at a random
//! moment. Some runs exit when they wait for a person, are decided (or
//! cancelled) from outside, and resumed.
//!
//! Some runs are stopped in the middle, once or more, at a random event:
//! the engine shuts down with no grace (attempts stay open in the log, as a
//! crash leaves them), the journal is closed, and a new engine over a new
//! journal on the same store file resumes the run, as another process
//! would. Some command nodes say `on_interrupt: fail`. In some runs the
//! decisions and the cancel come from another process (a second engine on
//! a second journal), through the run's inbox and its wake-up, at random
//! moments; a cancel may race the run's end (it is sent when the run's
//! `RunSummary` is seen), and in some runs every decided gate gets a
//! second, late decision that must be refused.
//!
//! Every run's log is then checked against the contract's ordering rules
//! and guarantees 1 to 6 across sessions, every attempt a stop left open
//! against its closing by the next session (`NodeFailed` of kind
//! `interrupted`, run again unless `on_interrupt: fail`), every command's
//! answer against the log (accepted: its event is there, once; refused: an
//! inbox `Diagnostic` gives the reason, or the run had ended), and the
//! nodes' final states against a model of what the workflow must do (which
//! takes how an interrupted command ended as given: a flaky command's
//! counter also counts the attempt a stop cut off).
//!
//! The same cases run on PostgreSQL too (a schema of their own per case,
//! on the server `CAIRN_TEST_PG` names; skipped, saying so, when it is not
//! set, failed when it is set and nothing answers).
//!
//! `CAIRN_CONFORMANCE_CASES=N` runs more cases than the default 64 (and a
//! third as many on PostgreSQL).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cairn_engine::{Engine, EngineError, EngineOptions, RunOutcome, StartOptions};
use cairn_events::{Event, EventKind, InboxReply, NodeStatus, RunCommand, RunState, RunStatus};
use cairn_store::{EventQuery, Journal, JournalOptions};
use proptest::prelude::*;
use proptest::sample::Index;
use serde_json::{json, Value};

// ---------------------------------------------------------------- model ----

/// What a leaf node does.
#[derive(Debug, Clone)]
enum Leaf {
    /// `value: "v-<id>"`.
    Value,
    /// A command that succeeds: `true`, `echo hi`, `sh -c "exit 0"`.
    Ok(u8),
    /// `sh -c "exit N"`, N > 0: fails every attempt.
    Fail(u8),
    /// Fails its first N attempts, then succeeds (a counter file).
    Flaky(u8),
    /// An approval, granted or denied.
    Approval(bool),
    /// `tool: read` of a file that exists (or not).
    Read(bool),
}

impl Leaf {
    /// A leaf that runs a process, which a stop can interrupt.
    fn is_command(&self) -> bool {
        matches!(self, Leaf::Ok(_) | Leaf::Fail(_) | Leaf::Flaky(_))
    }
}

/// The output a command leaf `n<i>` ends with when it finishes.
fn leaf_output(l: &Leaf) -> Option<Value> {
    match l {
        Leaf::Ok(1) => Some(json!("hi")),
        Leaf::Ok(_) | Leaf::Flaky(_) => Some(json!("")),
        _ => None,
    }
}

#[derive(Debug, Clone)]
enum Kind {
    Leaf(Leaf),
    /// `until: "iteration >= until"`, `max_iterations: max`.
    Loop {
        until: u32,
        max: u32,
        body: Vec<Gen>,
    },
    /// `for_each` over a list of `len` numbers.
    ForEach {
        len: usize,
        body: Vec<Gen>,
    },
}

/// One generated node; `needs` index earlier siblings.
#[derive(Debug, Clone)]
struct Gen {
    needs: Vec<Index>,
    cond: Option<bool>,
    attempts: u32,
    cont: bool,
    /// `on_interrupt: fail` (command leaves only).
    no_rerun: bool,
    kind: Kind,
}

/// One generated case.
#[derive(Debug, Clone)]
struct Case {
    nodes: Vec<Gen>,
    concurrency: usize,
    /// Exit when waiting for a person; decide (or cancel) offline and resume.
    exit_on_wait: bool,
    /// Cancel once the observer has seen this many events (or, with
    /// `exit_on_wait`, at the first wait), gracefully or not.
    cancel: Option<(u64, bool)>,
    /// Stop the engine with no grace once the observer has seen this many
    /// events, and resume the run in a new engine over a new journal.
    stops: Vec<u64>,
    /// Decisions and the cancel come from a second engine on a second
    /// journal (always so when the run is stopped).
    remote: bool,
    /// The cancel waits for the run's `RunSummary`: it races the end.
    cancel_at_end: bool,
    /// Every accepted decision is followed by the opposite one, late.
    late: bool,
}

impl Case {
    fn remote(&self) -> bool {
        self.remote || !self.stops.is_empty()
    }
}

fn leaf(top: bool) -> BoxedStrategy<Leaf> {
    let mut choices: Vec<BoxedStrategy<Leaf>> = vec![
        Just(Leaf::Value).boxed(),
        (0u8..3).prop_map(Leaf::Ok).boxed(),
        (1u8..4).prop_map(Leaf::Fail).boxed(),
        (1u8..3).prop_map(Leaf::Flaky).boxed(),
        any::<bool>().prop_map(Leaf::Read).boxed(),
    ];
    if top {
        choices.push(any::<bool>().prop_map(Leaf::Approval).boxed());
    }
    proptest::strategy::Union::new(choices).boxed()
}

fn gen_leaf(top: bool) -> impl Strategy<Value = Gen> {
    (
        prop::collection::vec(any::<Index>(), 0..3),
        prop::option::weighted(0.25, any::<bool>()),
        1u32..4,
        prop::bool::weighted(0.4),
        prop::bool::weighted(0.3),
        leaf(top),
    )
        .prop_map(|(needs, cond, attempts, cont, no_rerun, l)| {
            // Approvals and tools fail for good; a retry policy on them is moot.
            let attempts = match l {
                Leaf::Approval(_) | Leaf::Read(_) => 1,
                _ => attempts,
            };
            let command = matches!(l, Leaf::Ok(_) | Leaf::Fail(_) | Leaf::Flaky(_));
            Gen {
                needs,
                cond,
                attempts,
                cont,
                no_rerun: no_rerun && command,
                kind: Kind::Leaf(l),
            }
        })
}

fn gen_node() -> impl Strategy<Value = Gen> {
    let body = || prop::collection::vec(gen_leaf(false), 1..4);
    prop_oneof![
        6 => gen_leaf(true),
        1 => (prop::collection::vec(any::<Index>(), 0..2), prop::option::weighted(0.2, any::<bool>()),
              0u32..3, 1u32..4, body())
            .prop_map(|(needs, cond, until, max, body)| Gen {
                needs, cond, attempts: 1, cont: false, no_rerun: false,
                kind: Kind::Loop { until, max, body },
            }),
        1 => (prop::collection::vec(any::<Index>(), 0..2), prop::option::weighted(0.2, any::<bool>()),
              0usize..4, body())
            .prop_map(|(needs, cond, len, body)| Gen {
                needs, cond, attempts: 1, cont: false, no_rerun: false,
                kind: Kind::ForEach { len, body },
            }),
    ]
}

fn gen_case() -> impl Strategy<Value = Case> {
    (
        prop::collection::vec(gen_node(), 1..8),
        1usize..5,
        prop::bool::weighted(0.3),
        prop::option::weighted(0.3, (1u64..60, any::<bool>())),
        prop::option::weighted(0.35, prop::collection::btree_set(1u64..40, 1..4)),
        prop::bool::weighted(0.3),
        prop::bool::weighted(0.3),
        prop::bool::weighted(0.5),
    )
        .prop_map(
            |(nodes, concurrency, exit_on_wait, cancel, stops, remote, cancel_at_end, late)| Case {
                nodes,
                concurrency,
                exit_on_wait,
                cancel,
                stops: stops.map(|s| s.into_iter().collect()).unwrap_or_default(),
                remote,
                cancel_at_end,
                late,
            },
        )
}

/// The needs of node `i` among its siblings, as indices.
fn needs_of(g: &Gen, i: usize) -> BTreeSet<usize> {
    if i == 0 {
        return BTreeSet::new();
    }
    g.needs.iter().map(|ix| ix.index(i)).collect()
}

fn id_of(i: usize) -> String {
    format!("n{i}")
}

// ----------------------------------------------------------------- YAML ----

fn q(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

fn yaml(case: &Case) -> String {
    let mut y = String::from("name: conformance\nnodes:\n");
    write_nodes(&mut y, &case.nodes, "", 1, None);
    y
}

/// `marker` names the group instance inside the template of a flaky
/// command's counter file, so that every instance counts its own attempts.
fn write_nodes(y: &mut String, nodes: &[Gen], path: &str, depth: usize, marker: Option<&str>) {
    let pad = "  ".repeat(depth);
    for (i, g) in nodes.iter().enumerate() {
        let id = id_of(i);
        y.push_str(&format!("{pad}- id: {id}\n"));
        let needs: Vec<String> = needs_of(g, i).into_iter().map(id_of).collect();
        if !needs.is_empty() {
            y.push_str(&format!("{pad}  needs: [{}]\n", needs.join(", ")));
        }
        if let Some(c) = g.cond {
            let e = if c { "1 < 2" } else { "2 < 1" };
            y.push_str(&format!("{pad}  if: {}\n", q(e)));
        }
        if g.attempts > 1 {
            y.push_str(&format!(
                "{pad}  retry: {{ attempts: {}, delay: 1ms, backoff: fixed }}\n",
                g.attempts
            ));
        }
        if g.cont {
            y.push_str(&format!("{pad}  on_failure: continue\n"));
        }
        if g.no_rerun {
            y.push_str(&format!("{pad}  on_interrupt: fail\n"));
        }
        let full = format!("{path}{id}");
        match &g.kind {
            Kind::Leaf(l) => match l {
                Leaf::Value => y.push_str(&format!("{pad}  value: {}\n", q(&format!("v-{id}")))),
                Leaf::Ok(0) => y.push_str(&format!("{pad}  command: [\"true\"]\n")),
                Leaf::Ok(1) => y.push_str(&format!("{pad}  command: [\"echo\", \"hi\"]\n")),
                Leaf::Ok(_) => {
                    y.push_str(&format!("{pad}  command: [\"sh\", \"-c\", \"exit 0\"]\n"))
                }
                Leaf::Fail(n) => y.push_str(&format!(
                    "{pad}  command: [\"sh\", \"-c\", {}]\n",
                    q(&format!("echo failing >&2; exit {n}"))
                )),
                Leaf::Flaky(k) => {
                    let file = format!(
                        ".flaky-{}{}",
                        full.replace(['.', '[', ']'], "_"),
                        marker.unwrap_or("")
                    );
                    let script = format!(
                        "f={file}; n=$(cat $f 2>/dev/null || echo 0); echo $((n+1)) > $f; [ \"$n\" -ge {k} ]"
                    );
                    y.push_str(&format!(
                        "{pad}  command: [\"sh\", \"-c\", {}]\n",
                        q(&script)
                    ));
                }
                Leaf::Approval(_) => {
                    y.push_str(&format!("{pad}  approval: {}\n", q(&format!("go {id}?"))))
                }
                Leaf::Read(exists) => {
                    let f = if *exists { "data.txt" } else { "missing.txt" };
                    y.push_str(&format!(
                        "{pad}  tool: read\n{pad}  args: {{ path: {f} }}\n"
                    ));
                }
            },
            Kind::Loop { until, max, body } => {
                y.push_str(&format!(
                    "{pad}  loop:\n{pad}    until: {}\n{pad}    max_iterations: {max}\n{pad}    nodes:\n",
                    q(&format!("iteration >= {until}"))
                ));
                write_nodes(
                    y,
                    body,
                    &format!("{full}."),
                    depth + 3,
                    Some("-{{ iteration }}"),
                );
            }
            Kind::ForEach { len, body } => {
                let list: Vec<String> = (0..*len).map(|i| (i * 10).to_string()).collect();
                y.push_str(&format!(
                    "{pad}  for_each: {}\n{pad}  nodes:\n",
                    q(&format!("[{}]", list.join(", ")))
                ));
                write_nodes(
                    y,
                    body,
                    &format!("{full}-each-"),
                    depth + 2,
                    Some("-{{ index }}"),
                );
            }
        }
    }
}

// ------------------------------------------------------------ the oracle ----

/// What the model says about one node instance when nothing stops the run.
#[derive(Debug, Clone, PartialEq)]
struct Expect {
    status: NodeStatus,
    /// How many attempts start (`NodeStarted` events).
    attempts: u32,
    /// The output of a finished leaf whose output is known.
    output: Option<Value>,
    /// Its siblings it needs, as instance keys.
    needs: Vec<(String, u32)>,
    /// `on_interrupt: fail`.
    no_rerun: bool,
    /// A command whose attempts may fail: once an attempt of it was
    /// interrupted, it may end either way (a flaky command's counter counts
    /// the interrupted attempt too, and the rerun takes a retry's place).
    may_fail: bool,
    /// A leaf that runs a process.
    command: bool,
    /// A `loop` or `for_each`: a resume re-enters it, no attempt of it is
    /// interrupted.
    group: bool,
}

/// The final states the log shows for instances whose attempts a stop
/// interrupted: the model takes them as given and predicts the rest.
type Overrides = BTreeMap<(String, u32), NodeStatus>;

/// Plays the workflow through in dependency order, the way it must go when
/// nothing cancels it, with the instances of `given` ending as it says.
/// Returns whether a node fails with `on_failure: fail` (then the run must
/// fail, and nodes may be cancelled instead).
fn simulate(
    nodes: &[Gen],
    path: &str,
    iteration: u32,
    given: &Overrides,
    out: &mut BTreeMap<(String, u32), Expect>,
) -> bool {
    let mut fatal = false;
    let mut status: Vec<NodeStatus> = Vec::new();
    for (i, g) in nodes.iter().enumerate() {
        let id = format!("{path}{}", id_of(i));
        let needs = needs_of(g, i);
        let blocked = needs.iter().any(|&j| status[j] != NodeStatus::Finished);
        let need_keys = needs
            .iter()
            .map(|&j| (format!("{path}{}", id_of(j)), iteration))
            .collect();
        let given_status = given.get(&(id.clone(), iteration)).copied();
        let (st, attempts, output) = if blocked || g.cond == Some(false) {
            (NodeStatus::Skipped, 0, None)
        } else {
            match &g.kind {
                Kind::Leaf(l) if given_status.is_some() && l.is_command() => {
                    let st = given_status.unwrap();
                    let output = (st == NodeStatus::Finished)
                        .then(|| leaf_output(l))
                        .flatten();
                    (st, g.attempts, output)
                }
                Kind::Leaf(l) => match l {
                    Leaf::Value => (
                        NodeStatus::Finished,
                        1,
                        Some(json!(format!("v-{}", id_of(i)))),
                    ),
                    Leaf::Ok(1) => (NodeStatus::Finished, 1, Some(json!("hi"))),
                    Leaf::Ok(_) => (NodeStatus::Finished, 1, Some(json!(""))),
                    Leaf::Fail(_) => (NodeStatus::Failed, g.attempts, None),
                    Leaf::Flaky(k) if (*k as u32) < g.attempts => {
                        (NodeStatus::Finished, *k as u32 + 1, Some(json!("")))
                    }
                    Leaf::Flaky(_) => (NodeStatus::Failed, g.attempts, None),
                    Leaf::Approval(true) => (NodeStatus::Finished, 1, None),
                    Leaf::Approval(false) => (NodeStatus::Failed, 1, None),
                    Leaf::Read(true) => (NodeStatus::Finished, 1, None),
                    Leaf::Read(false) => (NodeStatus::Failed, 1, None),
                },
                Kind::Loop { until, max, body } => {
                    let passes = (*until + 1).min(*max);
                    for p in 0..passes {
                        fatal |= simulate(body, &format!("{id}."), p, given, out);
                    }
                    (NodeStatus::Finished, 1, None)
                }
                Kind::ForEach { len, body } => {
                    for e in 0..*len {
                        fatal |= simulate(body, &format!("{id}[{e}]."), iteration, given, out);
                    }
                    (NodeStatus::Finished, 1, None)
                }
            }
        };
        if st == NodeStatus::Failed && !g.cont {
            fatal = true;
        }
        status.push(st);
        out.insert(
            (id, iteration),
            Expect {
                status: st,
                attempts,
                output,
                needs: need_keys,
                no_rerun: g.no_rerun,
                may_fail: matches!(g.kind, Kind::Leaf(Leaf::Fail(_) | Leaf::Flaky(_))),
                group: !matches!(g.kind, Kind::Leaf(_)),
                command: matches!(&g.kind, Kind::Leaf(l) if l.is_command()),
            },
        );
    }
    fatal
}

// --------------------------------------------------------------- running ----

type Events = Arc<Mutex<Vec<Event>>>;

/// Everything one case produced.
struct Ran {
    run_id: String,
    observed: Vec<Event>,
    outcome: RunOutcome,
    /// Whether a cancel request was accepted.
    cancelled: bool,
    /// Events delivered by subscriptions: (asked after, delivered).
    subscriptions: Vec<(u64, Vec<(u64, String)>)>,
    /// Sessions that drove the run (a start, then each resume).
    sessions: usize,
    /// Every command sent to the run, with its answer.
    sent: Vec<Sent>,
}

/// One command sent to the run, and the sender's answer.
#[derive(Debug, Clone)]
struct Sent {
    /// Carried by the event the command causes: a decision's note, a
    /// cancel's reason.
    marker: String,
    command: RunCommand,
    /// A second decision for a gate already decided: must be refused.
    late: bool,
    answer: Result<Event, String>,
}

/// Sends commands, each with a marker of its own, and keeps the answers.
#[derive(Clone, Default)]
struct Commands {
    sent: Arc<Mutex<Vec<Sent>>>,
    next: Arc<std::sync::atomic::AtomicU64>,
}

impl Commands {
    fn marker(&self) -> String {
        let n = self.next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        format!("cmd-{n}")
    }

    /// Grants or denies `node`'s approval; true when accepted.
    async fn decide(&self, engine: &Engine, run: &str, node: &str, yes: bool, late: bool) -> bool {
        let marker = self.marker();
        let (node_id, note, by) = (node.to_string(), Some(marker.clone()), Some("prop".into()));
        let command = if yes {
            RunCommand::Approve { node_id, note, by }
        } else {
            RunCommand::Deny { node_id, note, by }
        };
        self.send(engine, run, command, marker, late).await
    }

    /// Cancels the run; true when accepted.
    async fn cancel(&self, engine: &Engine, run: &str, graceful: bool) -> bool {
        let marker = self.marker();
        let command = RunCommand::Cancel {
            graceful,
            reason: Some(marker.clone()),
            by: None,
        };
        self.send(engine, run, command, marker, false).await
    }

    async fn send(
        &self,
        engine: &Engine,
        run: &str,
        command: RunCommand,
        marker: String,
        late: bool,
    ) -> bool {
        // A sender that hangs is a failure the check reports, with the log.
        let answer = match tokio::time::timeout(
            Duration::from_secs(60),
            engine.send(&cairn_events::RunId::parse(run).unwrap(), command.clone()),
        )
        .await
        {
            Ok(r) => r.map_err(|e| e.to_string()),
            Err(_) => Err(format!("{HUNG}: no answer within 60 s")),
        };
        let ok = answer.is_ok();
        self.sent.lock().unwrap().push(Sent {
            marker,
            command,
            late,
            answer,
        });
        ok
    }

    fn taken(&self) -> Vec<Sent> {
        self.sent.lock().unwrap().clone()
    }
}

const HUNG: &str = "hung";

/// Where a case keeps its files (workflow, mirror) and its store: the
/// SQLite file in the folder, or a PostgreSQL schema of its own.
struct Place {
    dir: std::path::PathBuf,
    pg: Option<(&'static str, String)>,
}

impl std::ops::Deref for Place {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.dir
    }
}

/// A journal over the case's store, as another process opens it.
fn open_journal(place: &Place) -> Journal {
    let opts = JournalOptions {
        log_dir: Some(place.join("logs")),
    };
    match &place.pg {
        Some((url, schema)) => {
            let backend = cairn_postgres::PgBackend::open_with(
                url,
                cairn_postgres::PgOptions {
                    schema: Some(schema.clone()),
                    ..Default::default()
                },
            )
            .unwrap();
            Journal::open(Arc::new(backend), opts).unwrap()
        }
        None => Journal::open_sqlite(&place.join("cairn.db"), opts).unwrap(),
    }
}

/// Waits for one session of the run; at a stop signal, shuts the engine
/// down with no grace first, which leaves running attempts open in the
/// log as a crash does. True when the engine was shut down (the session
/// may have ended the run or exited to wait all the same).
async fn session(
    engine: &Engine,
    handle: cairn_engine::RunHandle,
    stops: &mut tokio::sync::mpsc::UnboundedReceiver<()>,
) -> (RunOutcome, bool) {
    let wait = handle.wait();
    tokio::pin!(wait);
    tokio::select! {
        o = &mut wait => return (o, false),
        Some(()) = stops.recv() => {}
    }
    within(engine.shutdown(Duration::ZERO)).await;
    (within(wait).await, true)
}

/// Another process takes over from a stopped one: the old journal is
/// closed, a new one opens the same store file.
fn take_over(dir: &Place, driving: &mut Journal, engine: &mut Engine) {
    driving.close();
    *driving = open_journal(dir);
    *engine = Engine::new(driving.clone(), EngineOptions::default());
}

/// How a run the log shows ended ended.
fn ended(state: &RunState) -> Option<RunOutcome> {
    match state.status? {
        RunStatus::Finished => Some(RunOutcome::Finished(state.output.clone())),
        RunStatus::Failed => Some(RunOutcome::Failed(
            state.error.clone().expect("a failed run has its error"),
        )),
        RunStatus::Cancelled => Some(RunOutcome::Cancelled),
        _ => None,
    }
}

/// Resumes the run, waiting while another process holds it (a sender that
/// found nobody driving it applies its command with the run's driver).
/// `Err` with the run's end when such a command ended it.
async fn resume(
    engine: &Engine,
    run_id: &str,
    opts: &StartOptions,
) -> Result<cairn_engine::RunHandle, RunOutcome> {
    for _ in 0..500 {
        match within(engine.resume(&cairn_events::RunId::parse(run_id).unwrap(), opts.clone()))
            .await
        {
            Ok(h) => return Ok(h),
            Err(EngineError::LeaseHeld { .. }) => {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => {
                let state = engine
                    .state(&cairn_events::RunId::parse(run_id).unwrap())
                    .unwrap();
                return Err(ended(&state).unwrap_or_else(|| panic!("resume: {e}")));
            }
        }
    }
    panic!("the run stayed busy in another process");
}

async fn run_case(case: &Case, dir: &Place, journal: Journal, run_id: &str) -> Ran {
    let mut engine = Engine::new(journal.clone(), EngineOptions::default());
    let mut driving = journal.clone();
    // Another process that sends commands (and applies them when nobody
    // drives the run).
    let remote = case.remote().then(|| {
        let j = open_journal(dir);
        (Engine::new(j.clone(), EngineOptions::default()), j)
    });
    let path = dir.join("wf.yaml");
    std::fs::write(&path, yaml(case)).unwrap();
    std::fs::write(dir.join("data.txt"), "some data\n").unwrap();
    let wf = cairn_workflow::load(&path).unwrap_or_else(|e| panic!("generated workflow: {e}"));

    let events: Events = Arc::default();
    // Approvals seen, decisions to make, stops, and the cancel trigger: all
    // driven from the observer through channels, since it must not block.
    let (ask_tx, mut ask_rx) = tokio::sync::mpsc::unbounded_channel::<(String, u64)>();
    let (cancel_tx, mut cancel_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let (sub_tx, mut sub_rx) = tokio::sync::mpsc::unbounded_channel::<u64>();
    let (stop_tx, mut stop_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let cancel_at = if case.exit_on_wait || (case.remote() && case.cancel_at_end) {
        None
    } else {
        case.cancel.map(|c| c.0)
    };
    let cancel_at_end = !case.exit_on_wait && case.remote() && case.cancel_at_end;
    // A mid-run subscription from the seq the observer reaches at this count.
    let sub_at = 1 + (case.nodes.len() as u64 * 7) % 23;
    let observer = {
        let events = events.clone();
        let stops = case.stops.clone();
        Arc::new(move |ev: &Event| {
            let mut evs = events.lock().unwrap();
            evs.push(ev.clone());
            let n = evs.len() as u64;
            if let EventKind::ApprovalRequested { .. } = ev.kind {
                let _ = ask_tx.send((ev.scope.node_id.clone().unwrap().to_string(), ev.seq.get()));
            }
            if Some(n) == cancel_at
                || (cancel_at_end && matches!(ev.kind, EventKind::RunSummary { .. }))
            {
                let _ = cancel_tx.send(());
            }
            if n == sub_at {
                let _ = sub_tx.send(ev.seq.get());
            }
            if stops.contains(&n) {
                let _ = stop_tx.send(());
            }
        })
    };
    let opts = StartOptions {
        run_id: Some(cairn_events::RunId::parse(run_id).unwrap()),
        max_concurrency: Some(case.concurrency),
        exit_on_wait: case.exit_on_wait,
        observer: Some(observer),
        watch: false,
        trigger: None,
        replay: None,
    };

    // A subscription that joins before the run exists and follows it live.
    let live = {
        let mut sub = journal
            .subscribe(&cairn_events::RunId::parse(run_id).unwrap(), 0)
            .unwrap();
        tokio::spawn(async move {
            let mut got = Vec::new();
            while let Some(ev) = sub.next().await {
                let ev = ev.expect("live subscription failed");
                got.push((ev.seq, ev.json.to_string()));
            }
            (0, got)
        })
    };
    let (done_tx, mut done_rx) = tokio::sync::oneshot::channel::<()>();
    let mid = {
        let journal = journal.clone();
        let run_id = run_id.to_string();
        tokio::spawn(async move {
            // The run may end before the observer reaches `sub_at`.
            let after = tokio::select! {
                biased;
                a = sub_rx.recv() => a?,
                _ = &mut done_rx => return None,
            };
            // The observer runs before the commit. A subscriber asks after
            // a seq it has seen, i.e. one already committed; one asking
            // after a seq that is not (yet) in the store and turns out to be
            // the terminal event would wait for more forever.
            while journal
                .backend()
                .last_seq(&cairn_events::RunId::parse(&run_id).unwrap())
                .unwrap()
                < after
            {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            let mut sub = journal
                .subscribe(&cairn_events::RunId::parse(&run_id).unwrap(), after)
                .unwrap();
            let mut got = Vec::new();
            while let Some(ev) = sub.next().await {
                let ev = ev.expect("mid-run subscription failed");
                got.push((ev.seq, ev.json.to_string()));
            }
            Some((after, got))
        })
    };

    let decisions: HashMap<String, bool> = case
        .nodes
        .iter()
        .enumerate()
        .filter_map(|(i, g)| match g.kind {
            Kind::Leaf(Leaf::Approval(yes)) => Some((id_of(i), yes)),
            _ => None,
        })
        .collect();
    let commands = Commands::default();
    // Senders stop taking work when the run has ended; what they are
    // sending then is answered before the case is checked.
    let (over_tx, over_rx) = tokio::sync::watch::channel(false);
    let mut senders = Vec::new();
    if !case.exit_on_wait {
        let engine = remote.as_ref().map_or(engine.clone(), |r| r.0.clone());
        let from_afar = remote.is_some();
        let run_id = run_id.to_string();
        let decisions = decisions.clone();
        let commands = commands.clone();
        let late = case.late;
        let mut over = over_rx.clone();
        senders.push(tokio::spawn(async move {
            loop {
                let (node, seq) = tokio::select! {
                    biased;
                    Some(a) = ask_rx.recv() => a,
                    _ = over.changed() => break,
                };
                // Another process learns of the question from the store,
                // once it is committed.
                while from_afar
                    && engine
                        .journal()
                        .backend()
                        .last_seq(&cairn_events::RunId::parse(&run_id).unwrap())
                        .unwrap()
                        < seq
                {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                // A run that is failing or cancelled may no longer wait.
                let yes = decisions[&node];
                if commands.decide(&engine, &run_id, &node, yes, false).await && late {
                    commands.decide(&engine, &run_id, &node, !yes, true).await;
                }
            }
        }));
    }
    if let Some((_, graceful)) = case.cancel.filter(|_| !case.exit_on_wait) {
        let engine = remote.as_ref().map_or(engine.clone(), |r| r.0.clone());
        let run_id = run_id.to_string();
        let commands = commands.clone();
        let mut over = over_rx.clone();
        senders.push(tokio::spawn(async move {
            tokio::select! {
                biased;
                Some(()) = cancel_rx.recv() => {
                    commands.cancel(&engine, &run_id, graceful).await;
                }
                _ = over.changed() => {}
            }
        }));
    }

    let handle = within(engine.start(wf, json!({}), opts.clone()))
        .await
        .unwrap();
    let mut sessions = 1;
    let (mut outcome, mut stopped) = session(&engine, handle, &mut stop_rx).await;
    loop {
        if stopped {
            take_over(dir, &mut driving, &mut engine);
        }
        assert!(sessions < 30, "too many sessions");
        match outcome {
            RunOutcome::Interrupted => {
                assert!(!case.stops.is_empty(), "interrupted without a stop");
                (outcome, stopped) = match resume(&engine, run_id, &opts).await {
                    Ok(h) => {
                        sessions += 1;
                        session(&engine, h, &mut stop_rx).await
                    }
                    Err(o) => (o, false),
                };
            }
            RunOutcome::Waiting => {
                assert!(case.exit_on_wait, "waiting without exit_on_wait");
                let sender = remote.as_ref().map_or(engine.clone(), |r| r.0.clone());
                if let Some((_, graceful)) = case.cancel {
                    // Nobody drives the run: the cancel ends it right here.
                    assert!(
                        commands.cancel(&sender, run_id, graceful).await,
                        "offline cancel refused: {:?}",
                        commands.taken().last()
                    );
                    outcome = RunOutcome::Cancelled;
                    break;
                }
                let state = engine
                    .state(&cairn_events::RunId::parse(run_id).unwrap())
                    .unwrap();
                let waiting: Vec<String> = state
                    .nodes
                    .iter()
                    .filter(|n| n.status == NodeStatus::WaitingApproval)
                    .map(|n| n.node_id.to_string())
                    .collect();
                assert!(
                    !waiting.is_empty(),
                    "Waiting, but no node waits for approval"
                );
                for node in waiting {
                    let yes = decisions[&node];
                    if !commands.decide(&sender, run_id, &node, yes, false).await {
                        // An earlier denial may have failed the run.
                        let ended = engine
                            .state(&cairn_events::RunId::parse(run_id).unwrap())
                            .unwrap()
                            .status;
                        assert!(
                            ended.is_some_and(|s| s.is_terminal()),
                            "offline decision refused: {:?}",
                            commands.taken().last()
                        );
                        break;
                    }
                    if case.late {
                        commands.decide(&sender, run_id, &node, !yes, true).await;
                    }
                }
                // A decision applied while nobody drove the run may have
                // ended it already: a denied gate failed the run, or the
                // last gate finished what was left.
                let state = engine
                    .state(&cairn_events::RunId::parse(run_id).unwrap())
                    .unwrap();
                if let Some(o) = ended(&state) {
                    outcome = o;
                    break;
                }
                assert!(
                    !state.status.is_some_and(|s| s.is_terminal()),
                    "an offline decision ended the run as {:?}",
                    state.status
                );
                (outcome, stopped) = match resume(&engine, run_id, &opts).await {
                    Ok(h) => {
                        sessions += 1;
                        session(&engine, h, &mut stop_rx).await
                    }
                    Err(o) => (o, false),
                };
            }
            _ => break,
        }
    }
    // What the senders are sending is answered; nothing more is sent.
    let _ = over_tx.send(true);
    for s in senders {
        within(s).await.unwrap();
    }
    if let Some((_, j)) = &remote {
        j.close();
    }
    driving.close();
    // Every session's events are committed once its handle returns.
    let _ = done_tx.send(());
    let mut subscriptions = vec![within(live).await.unwrap()];
    if let Some(s) = within(mid).await.unwrap() {
        subscriptions.push(s);
    }
    let observed = events.lock().unwrap().clone();
    let sent = commands.taken();
    let cancelled = sent
        .iter()
        .any(|s| matches!(s.command, RunCommand::Cancel { .. }) && s.answer.is_ok());
    Ran {
        run_id: run_id.to_string(),
        observed,
        outcome,
        cancelled,
        subscriptions,
        sessions,
        sent,
    }
}

/// Bounds every wait: a hung run is a failure, not a hung test suite.
async fn within<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(60), f)
        .await
        .expect("the run did not get there within 60 s")
}

// -------------------------------------------------------------- checking ----

/// Where one node instance stands in the contract's per-node grammar.
#[derive(Debug, Clone, PartialEq)]
enum Phase {
    Pending,
    Running(u32),
    /// `NodeFailed(a, willRetry)` seen; `NodeRetrying(a+1)` must follow.
    Failing(u32),
    /// `NodeRetrying(a)` seen; `NodeStarted(a)` comes next.
    Retrying(u32),
    Done,
}

#[derive(Debug, Default)]
struct NodeLog {
    phase: Option<Phase>,
    started: u32,
    gate: u8,
    terminal: Option<&'static str>,
    /// Open tool calls of the current attempt.
    tools: BTreeSet<u32>,
    last_tool: u32,
    started_without_attempt_end: bool,
    /// Attempts a stop interrupted.
    interrupted: u32,
}

impl Phase {
    /// Why an event of an attempt cannot come in this phase.
    fn outside(&self) -> String {
        match self {
            Phase::Pending => "before NodeStarted",
            Phase::Running(_) => "inside an attempt",
            Phase::Failing(_) => "NodeFailed(willRetry) not followed by NodeRetrying",
            Phase::Retrying(_) => "between NodeRetrying and NodeStarted",
            Phase::Done => "event after the node ended",
        }
        .into()
    }

    /// The attempt that runs, or why an event of one cannot come now.
    fn running(&self) -> Result<u32, String> {
        match self {
            Phase::Running(a) => Ok(*a),
            p => Err(p.outside()),
        }
    }
}

/// An attempt-scoped event names the attempt that runs.
fn own_attempt(running: u32, attempt: Option<u32>) -> Result<u32, String> {
    if attempt != Some(running) {
        return Err(format!("attempt {attempt:?} inside attempt {running}"));
    }
    Ok(running)
}

impl NodeLog {
    /// Takes one event of this node instance through the contract's
    /// per-node grammar. Every event type has its arm: a new one does not
    /// compile until it says where it may come.
    fn step(
        &mut self,
        kind: &EventKind,
        attempt: Option<u32>,
        node_id: &str,
        finished_ids: &mut BTreeSet<String>,
    ) -> Result<(), String> {
        use EventKind as K;
        let pending = matches!(kind, K::NodePending { .. });
        let phase = match (self.phase.clone(), pending) {
            (None, true) => {
                self.phase = Some(Phase::Pending);
                return Ok(());
            }
            (None, false) => return Err("first event of a node is not NodePending".into()),
            (Some(_), true) => return Err("NodePending twice".into()),
            (Some(Phase::Done), false) => return Err("event after the node ended".into()),
            (Some(p), false) => p,
        };
        match kind {
            K::NodeStarted { .. } => self.start(&phase, attempt)?,
            K::NodeSkipped { .. } => self.skip(&phase, attempt)?,
            K::NodeCancelled { .. } => self.cancel(&phase, attempt)?,
            K::NodeRetrying { .. } => self.retry(&phase, attempt)?,
            K::NodeFinished { .. } => {
                own_attempt(phase.running()?, attempt)?;
                if !self.tools.is_empty() {
                    return Err("attempt ended with open tool calls".into());
                }
                self.end("finished");
                finished_ids.insert(node_id.to_string());
            }
            K::NodeFailed { will_retry, .. } => {
                let a = own_attempt(phase.running()?, attempt)?;
                if *will_retry {
                    self.phase = Some(Phase::Failing(a));
                } else {
                    self.end("failed");
                }
            }
            K::ToolCallStarted { tool_seq, .. } => {
                own_attempt(phase.running()?, attempt)?;
                if *tool_seq != self.last_tool + 1 {
                    return Err("toolSeq does not count up from 1".into());
                }
                self.last_tool = *tool_seq;
                self.tools.insert(*tool_seq);
            }
            K::ToolCallFinished { tool_seq, .. } => {
                own_attempt(phase.running()?, attempt)?;
                if !self.tools.remove(tool_seq) {
                    return Err("ToolCallFinished without its ToolCallStarted".into());
                }
            }
            K::NodeWaitingApproval {} => {
                phase.running()?;
                if self.gate != 0 {
                    return Err("NodeWaitingApproval twice".into());
                }
                self.gate = 1;
            }
            K::ApprovalRequested { .. } => {
                phase.running()?;
                if self.gate != 1 {
                    return Err("ApprovalRequested not right after NodeWaitingApproval".into());
                }
                self.gate = 2;
            }
            K::ApprovalGranted { .. } | K::ApprovalDenied { .. } => {
                phase.running()?;
                if self.gate != 2 {
                    return Err("a decision without ApprovalRequested, or twice".into());
                }
                self.gate = 3;
            }
            // Of the attempt that runs, naming it.
            K::NodeOutput { .. } | K::NodeHeartbeat { .. } | K::NetworkAccess { .. } => {
                own_attempt(phase.running()?, attempt)?;
            }
            // Inside an attempt, with no rule of their own here.
            K::NodePending { .. }
            | K::RunStarted { .. }
            | K::RunStatusChanged { .. }
            | K::RunCancelRequested { .. }
            | K::RunSummary { .. }
            | K::RunFinished { .. }
            | K::RunFailed { .. }
            | K::RunCancelled { .. }
            | K::FrameCommitted { .. }
            | K::LayerStarted { .. }
            | K::LayerFinished { .. }
            | K::EdgeTraversed { .. }
            | K::BranchResolved { .. }
            | K::ChapterStarted { .. }
            | K::ChapterFinished { .. }
            | K::NodeWaitingInput { .. }
            | K::InputRequested { .. }
            | K::InputReceived { .. }
            | K::AgentStepStarted { .. }
            | K::AgentStepFinished { .. }
            | K::AgentGenerationRetried { .. }
            | K::AgentContextCompacted { .. }
            | K::AgentWaiting { .. }
            | K::AgentEvent { .. }
            | K::TokenUsageReported { .. }
            | K::DelegationStarted { .. }
            | K::DelegationFinished { .. }
            | K::McpServerStarting { .. }
            | K::McpServerConnected { .. }
            | K::McpServerStderr { .. }
            | K::McpServerDisconnected { .. }
            | K::Diagnostic { .. }
            | K::RevertStarted { .. }
            | K::RevertFinished { .. }
            | K::WorkflowReloadDetected { .. }
            | K::WorkflowReloaded { .. }
            | K::WorkflowReloadFailed { .. }
            | K::WorkflowReloadUnsafe { .. }
            | K::ScorerStarted { .. }
            | K::ScorerFinished { .. }
            | K::ScorerFailed { .. }
            | K::RunHijackRequested { .. }
            | K::RunHijacked { .. } => {
                phase.running()?;
            }
        }
        let gate_event = matches!(
            kind,
            K::NodeWaitingApproval {} | K::ApprovalRequested { .. }
        );
        if matches!(phase, Phase::Running(_)) && self.gate == 1 && !gate_event {
            return Err("NodeWaitingApproval not followed by ApprovalRequested".into());
        }
        Ok(())
    }

    fn end(&mut self, terminal: &'static str) {
        self.phase = Some(Phase::Done);
        self.terminal = Some(terminal);
    }

    /// `NodeStarted`: the first attempt, or the one a retry announced.
    fn start(&mut self, phase: &Phase, attempt: Option<u32>) -> Result<(), String> {
        match *phase {
            Phase::Pending => {
                if attempt != Some(1) {
                    return Err("first attempt is not 1".into());
                }
                self.started += 1;
                self.phase = Some(Phase::Running(1));
            }
            Phase::Retrying(a) => {
                if attempt != Some(a) {
                    return Err("NodeStarted does not continue the announced attempt".into());
                }
                self.started += 1;
                self.phase = Some(Phase::Running(a));
                self.tools.clear();
                self.last_tool = 0;
            }
            Phase::Running(_) => return Err("NodeStarted inside an attempt".into()),
            ref p => return Err(p.outside()),
        }
        Ok(())
    }

    /// `NodeSkipped`: only before any attempt.
    fn skip(&mut self, phase: &Phase, attempt: Option<u32>) -> Result<(), String> {
        match phase {
            Phase::Pending => {
                if attempt.is_some() || self.started > 0 {
                    return Err("skipped with an attempt".into());
                }
                self.end("skipped");
                Ok(())
            }
            Phase::Running(_) => Err("skipped after it started".into()),
            p => Err(p.outside()),
        }
    }

    /// `NodeCancelled`: before any attempt (none named), between attempts
    /// (the last one that ran named), or of the attempt that runs.
    fn cancel(&mut self, phase: &Phase, attempt: Option<u32>) -> Result<(), String> {
        match *phase {
            Phase::Pending => {
                if attempt.is_some() {
                    return Err("cancelled with an attempt that never started".into());
                }
            }
            Phase::Retrying(next) => {
                // The announced attempt never started, so the event names
                // the last one that ran.
                if attempt != Some(next - 1) {
                    return Err(
                        "cancelled between attempts without the last attempt that ran".into(),
                    );
                }
                self.started_without_attempt_end = true;
            }
            Phase::Running(a) => {
                if attempt.is_some() && attempt != Some(a) {
                    return Err("cancelled naming another attempt".into());
                }
                if attempt.is_none() {
                    return Err("a started attempt cancelled without its attempt".into());
                }
            }
            ref p => return Err(p.outside()),
        }
        self.end("cancelled");
        Ok(())
    }

    /// `NodeRetrying`: after `NodeFailed(willRetry)`, naming the next attempt.
    fn retry(&mut self, phase: &Phase, attempt: Option<u32>) -> Result<(), String> {
        match *phase {
            Phase::Failing(a) => {
                if attempt != Some(a + 1) {
                    return Err("NodeRetrying does not name the next attempt".into());
                }
                self.phase = Some(Phase::Retrying(a + 1));
                Ok(())
            }
            Phase::Running(_) => Err("NodeRetrying inside an attempt".into()),
            ref p => Err(p.outside()),
        }
    }
}

/// The walk of a log's events against the workflow: frames, layers and
/// edges, and each node instance's grammar.
struct Walk<'a> {
    /// What each instance would do undisturbed.
    plain: &'a BTreeMap<(String, u32), Expect>,
    frame: u64,
    /// Layers started, with whether they are still open.
    layers: HashMap<u32, bool>,
    /// Nodes that finished, for the edges that leave them.
    finished_ids: BTreeSet<String>,
    nodes: BTreeMap<(String, u32), NodeLog>,
    /// Attempts a stop left open, which the resume that follows must close
    /// before anything else happens to their nodes.
    to_close: BTreeMap<(String, u32), u32>,
}

impl Walk<'_> {
    /// The rules of the run's own events. Every event type has its arm.
    fn run_event(&mut self, e: &Event) -> Result<(), String> {
        use EventKind as K;
        let at = e.seq;
        match &e.kind {
            K::RunStarted { resumed, .. } => {
                if *resumed {
                    self.resumed(at)?;
                }
            }
            K::FrameCommitted { frame_no, .. } => {
                // Frames count up by one; nodes appear only after a frame.
                if *frame_no != self.frame + 1 {
                    return Err(format!("seq {at}: frame {frame_no} after {}", self.frame));
                }
                self.frame = *frame_no;
            }
            K::LayerStarted { layer_index, .. } => {
                if self.layers.insert(*layer_index, true) == Some(true) {
                    return Err(format!("seq {at}: layer {layer_index} started twice"));
                }
            }
            K::LayerFinished { layer_index, .. } => {
                if self.layers.insert(*layer_index, false) != Some(true) {
                    return Err(format!(
                        "seq {at}: layer {layer_index} finished but not started"
                    ));
                }
            }
            K::EdgeTraversed { from, to, .. } => {
                if !self.finished_ids.contains(from) {
                    return Err(format!(
                        "seq {at}: edge {from} -> {to} before {from} finished"
                    ));
                }
            }
            K::RunFinished { .. } | K::RunFailed { .. } | K::RunCancelled { .. } => {
                // Also across resumes: a layer open at a stop is closed by
                // the engine that resumes the run.
                let mut open: Vec<_> = self
                    .layers
                    .iter()
                    .filter(|(_, o)| **o)
                    .map(|(l, _)| *l)
                    .collect();
                open.sort_unstable();
                if !open.is_empty() {
                    return Err(format!("seq {at}: the run ended with layers {open:?} open"));
                }
            }
            // No rule at the run's level.
            K::RunStatusChanged { .. }
            | K::RunCancelRequested { .. }
            | K::RunSummary { .. }
            | K::BranchResolved { .. }
            | K::ChapterStarted { .. }
            | K::ChapterFinished { .. }
            | K::NodePending { .. }
            | K::NodeStarted { .. }
            | K::NodeHeartbeat { .. }
            | K::NodeOutput { .. }
            | K::NodeFinished { .. }
            | K::NodeFailed { .. }
            | K::NodeRetrying { .. }
            | K::NodeSkipped { .. }
            | K::NodeCancelled { .. }
            | K::NodeWaitingApproval {}
            | K::NodeWaitingInput { .. }
            | K::ApprovalRequested { .. }
            | K::ApprovalGranted { .. }
            | K::ApprovalDenied { .. }
            | K::InputRequested { .. }
            | K::InputReceived { .. }
            | K::AgentStepStarted { .. }
            | K::AgentStepFinished { .. }
            | K::AgentGenerationRetried { .. }
            | K::AgentContextCompacted { .. }
            | K::AgentWaiting { .. }
            | K::AgentEvent { .. }
            | K::TokenUsageReported { .. }
            | K::ToolCallStarted { .. }
            | K::ToolCallFinished { .. }
            | K::DelegationStarted { .. }
            | K::DelegationFinished { .. }
            | K::McpServerStarting { .. }
            | K::McpServerConnected { .. }
            | K::McpServerStderr { .. }
            | K::McpServerDisconnected { .. }
            | K::NetworkAccess { .. }
            | K::Diagnostic { .. }
            | K::RevertStarted { .. }
            | K::RevertFinished { .. }
            | K::WorkflowReloadDetected { .. }
            | K::WorkflowReloaded { .. }
            | K::WorkflowReloadFailed { .. }
            | K::WorkflowReloadUnsafe { .. }
            | K::ScorerStarted { .. }
            | K::ScorerFinished { .. }
            | K::ScorerFailed { .. }
            | K::RunHijackRequested { .. }
            | K::RunHijacked { .. } => {}
        }
        Ok(())
    }

    /// A resume: what the stop left open is closed first.
    fn resumed(&mut self, at: cairn_events::Seq) -> Result<(), String> {
        if let Some((k, a)) = self.to_close.iter().next() {
            return Err(format!(
                "seq {at}: a new session, and attempt {a} of {}#{} left open by a stop is still not closed",
                k.0, k.1
            ));
        }
        // Open attempts other than gates waiting for (or given) a
        // decision were cut off by the stop.
        for (k, nl) in &self.nodes {
            if let Some(Phase::Running(a)) = nl.phase {
                let group = self.plain.get(k).is_some_and(|x| x.group);
                if nl.gate == 0 && !group {
                    self.to_close.insert(k.clone(), a);
                }
            }
        }
        Ok(())
    }

    /// The rules of a node instance's event (none for a run's event).
    fn node_event(&mut self, e: &Event) -> Result<(), String> {
        let Some((id, it)) = e.node_key() else {
            return Ok(());
        };
        let key = (id.to_string(), it);
        let nl = self.nodes.entry(key.clone()).or_default();
        let phase = nl.phase.clone();
        let err = |m: &str| {
            format!(
                "seq {} {} of {}#{}: {m} (phase {phase:?})",
                e.seq,
                e.type_name(),
                key.0,
                key.1
            )
        };
        if self.frame == 0 {
            return Err(err("node event before any frame"));
        }
        let attempt = e.scope.attempt;
        let interrupted =
            matches!(&e.kind, EventKind::NodeFailed { error, .. } if error.kind == "interrupted");
        if let Some(a) = self.to_close.remove(&key) {
            let Some(x) = self.plain.get(&key) else {
                return Err(err("the workflow has no such instance"));
            };
            // Only this attempt's NodeFailed, as interrupted, may come.
            let closing = if let EventKind::NodeFailed { will_retry, .. } = &e.kind {
                Some(*will_retry)
            } else {
                None
            }
            .filter(|_| interrupted && attempt == Some(a));
            let Some(will_retry) = closing else {
                return Err(err(&format!(
                    "attempt {a}, left open by a stop, is not closed first as interrupted"
                )));
            };
            if will_retry == x.no_rerun {
                return Err(err(&format!(
                    "an interrupted attempt with on_interrupt {} has willRetry {will_retry}",
                    if x.no_rerun { "fail" } else { "rerun" }
                )));
            }
            nl.interrupted += 1;
        } else if interrupted {
            return Err(err(
                "an attempt failed as interrupted that no stop left open",
            ));
        }
        nl.step(&e.kind, attempt, &key.0, &mut self.finished_ids)
            .map_err(|m| err(&m))
    }
}

fn check(case: &Case, dir: &Path, journal: &Journal, ran: &Ran) -> Result<(), String> {
    let stored = journal
        .backend()
        .read_events(
            &cairn_events::RunId::parse(&ran.run_id).unwrap(),
            &EventQuery::default(),
        )
        .map_err(|e| e.to_string())?;
    let evs: Vec<Event> = stored
        .iter()
        .map(|s| s.decode().map_err(|e| format!("seq {}: {e}", s.seq)))
        .collect::<Result<_, _>>()?;
    let evs = &evs;
    let n = evs.len() as u64;
    // Envelope and guarantee 1: seq 1..n, no gap, one order.
    for (i, e) in evs.iter().enumerate() {
        if e.seq != cairn_events::Seq(i as u64 + 1) {
            return Err(format!("event #{i} has seq {} (want {})", e.seq, i + 1));
        }
        if e.run_id != ran.run_id {
            return Err(format!("seq {} has runId {}", e.seq, e.run_id));
        }
        if i > 0 && e.timestamp_ms < evs[i - 1].timestamp_ms {
            return Err(format!("seq {}: timestamp goes back", e.seq));
        }
        if e.to_json() != *stored[i].json {
            return Err(format!("seq {}: stored JSON does not round-trip", e.seq));
        }
        let s = &stored[i];
        if s.seq != e.seq.get() || s.type_name != e.type_name() || s.node_id != e.scope.node_id {
            return Err(format!(
                "seq {}: stored columns disagree with the JSON",
                e.seq
            ));
        }
    }
    // Guarantee 1: the observer saw the store's events, byte for byte. Only
    // what was written while no engine drove the run (an offline decision
    // or cancel between sessions) escapes it.
    let mut seen = ran.observed.iter().peekable();
    for e in evs {
        match seen.peek() {
            Some(o) if o.seq == e.seq => {
                if o.to_json() != e.to_json() {
                    return Err(format!("seq {}: observer and store differ", e.seq));
                }
                seen.next();
            }
            _ => {
                // Commands applied while no engine drove the run carry out
                // their consequences (a gate finishes or fails, dependents
                // are skipped, a cancel ends the run) but start nothing.
                let offline = !matches!(
                    e.kind,
                    EventKind::RunStarted { .. }
                        | EventKind::NodeStarted { .. }
                        | EventKind::NodeOutput { .. }
                        | EventKind::NodeRetrying { .. }
                        | EventKind::ToolCallStarted { .. }
                );
                if !(case.exit_on_wait || case.remote()) || !offline {
                    return Err(format!(
                        "seq {} {} never reached the observer",
                        e.seq,
                        e.type_name()
                    ));
                }
            }
        }
    }
    if let Some(o) = seen.next() {
        return Err(format!(
            "the observer saw seq {} out of order or not in the store",
            o.seq
        ));
    }
    // Guarantee 5: the NDJSON mirror holds the same lines.
    let mirror = std::fs::read_to_string(dir.join("logs").join(&ran.run_id).join("events.ndjson"))
        .map_err(|e| format!("NDJSON mirror: {e}"))?;
    let lines: Vec<&str> = mirror.lines().collect();
    if lines.len() != stored.len() || !mirror.ends_with('\n') {
        return Err(format!(
            "mirror has {} lines, store {}",
            lines.len(),
            stored.len()
        ));
    }
    for (l, s) in lines.iter().zip(&stored) {
        if *l != &*s.json {
            return Err(format!("seq {}: mirror line differs from the store", s.seq));
        }
    }
    // Guarantee 3: subscriptions deliver after+1.. exactly once, in order.
    let mut subs = ran.subscriptions.clone();
    let after = (n * 3 + 1) / 5; // one more, joined after the run
    let mut late = Vec::new();
    let rt_sub = journal
        .subscribe(&cairn_events::RunId::parse(&ran.run_id).unwrap(), after)
        .map_err(|e| e.to_string())?;
    drain(rt_sub, &mut late);
    subs.push((after, late));
    let mut rt_all = Vec::new();
    drain(
        journal
            .subscribe(&cairn_events::RunId::parse(&ran.run_id).unwrap(), n)
            .map_err(|e| e.to_string())?,
        &mut rt_all,
    );
    subs.push((n, rt_all));
    for (after, got) in &subs {
        let want: Vec<(u64, String)> = stored
            .iter()
            .filter(|s| s.seq > *after)
            .map(|s| (s.seq, s.json.to_string()))
            .collect();
        if *got != want {
            let seqs: Vec<u64> = got.iter().map(|g| g.0).collect();
            return Err(format!(
                "subscription after {after} delivered seqs {seqs:?}, want {}..={n}",
                after + 1
            ));
        }
    }
    // Guarantee 4: the reducer over the store, the mirror and the observed
    // events agree, and `Engine::state` is that fold.
    let run_id = cairn_events::RunId::parse(&ran.run_id).unwrap();
    let from_observed = if ran.observed.len() == evs.len() {
        RunState::from_events(&run_id, ran.observed.iter())
    } else {
        RunState::from_events(&run_id, evs.iter())
    };
    let from_store = RunState::from_events(&run_id, evs.iter());
    let from_mirror_evs: Vec<Event> = lines.iter().map(|l| Event::from_json(l).unwrap()).collect();
    let from_mirror = RunState::from_events(&run_id, from_mirror_evs.iter());
    if from_observed != from_store || from_store != from_mirror {
        return Err("folds of observer, store and mirror differ".into());
    }
    let engine_state = Engine::new(journal.clone(), EngineOptions::default())
        .state(&cairn_events::RunId::parse(&ran.run_id).unwrap())
        .map_err(|e| e.to_string())?;
    if engine_state != from_store {
        return Err("Engine::state differs from a fresh fold of the store".into());
    }
    let state = from_store;

    // Run-level: sessions, terminal, guarantee 6.
    if !matches!(evs[0].kind, EventKind::RunStarted { resumed: false, .. }) {
        return Err("the log does not open with RunStarted(resumed=false)".into());
    }
    let terminals: Vec<usize> = evs
        .iter()
        .enumerate()
        .filter(|(_, e)| e.kind.is_terminal())
        .map(|(i, _)| i)
        .collect();
    if terminals != vec![evs.len() - 1] {
        return Err(format!(
            "terminal events at {terminals:?} of {} (guarantee 6)",
            evs.len()
        ));
    }
    let last = &evs[evs.len() - 1].kind;
    let (want_status, ok) = match (&ran.outcome, last) {
        (RunOutcome::Finished(_), EventKind::RunFinished { .. }) => (RunStatus::Finished, true),
        (RunOutcome::Failed(_), EventKind::RunFailed { .. }) => (RunStatus::Failed, true),
        (RunOutcome::Cancelled, EventKind::RunCancelled { .. }) => (RunStatus::Cancelled, true),
        _ => (RunStatus::Failed, false),
    };
    if !ok {
        return Err(format!(
            "outcome {:?} but the log ends with {}",
            ran.outcome,
            evs.last().unwrap().type_name()
        ));
    }
    if state.status != Some(want_status) {
        return Err(format!(
            "folded status {:?}, want {want_status:?}",
            state.status
        ));
    }
    let n_starts = evs
        .iter()
        .filter(|e| matches!(e.kind, EventKind::RunStarted { .. }))
        .count();
    for e in evs.iter().skip(1) {
        if let EventKind::RunStarted { resumed, .. } = e.kind {
            if !resumed {
                return Err(format!(
                    "seq {}: a second RunStarted not marked resumed",
                    e.seq
                ));
            }
        }
    }
    if n_starts != ran.sessions {
        return Err(format!(
            "{n_starts} RunStarted for {} sessions",
            ran.sessions
        ));
    }
    check_commands(ran, evs)?;
    let cancel_requested = evs
        .iter()
        .any(|e| matches!(e.kind, EventKind::RunCancelRequested { .. }));
    if ran.cancelled != cancel_requested {
        return Err(format!(
            "cancel accepted: {}, RunCancelRequested logged: {cancel_requested}",
            ran.cancelled
        ));
    }
    if cancel_requested != (ran.outcome == RunOutcome::Cancelled) {
        return Err(format!(
            "cancel requested: {cancel_requested}, outcome {:?}",
            ran.outcome
        ));
    }
    // A summary precedes the end and counts what the fold counts.
    let summary = evs.iter().rev().find_map(|e| match &e.kind {
        EventKind::RunSummary { nodes, .. } => Some(nodes.clone()),
        _ => None,
    });
    let count = |s: NodeStatus| state.nodes.iter().filter(|x| x.status == s).count() as u64;
    if let Some(s) = summary {
        let folded = (
            count(NodeStatus::Finished),
            count(NodeStatus::Failed),
            count(NodeStatus::Skipped),
            count(NodeStatus::Cancelled),
        );
        if (s.finished, s.failed, s.skipped, s.cancelled) != folded {
            return Err(format!("RunSummary counts {s:?}, fold {folded:?}"));
        }
    } else if !((case.exit_on_wait || case.remote()) && ran.cancelled) {
        return Err("no RunSummary".into());
    }

    // The contract's rules the log alone shows, as cairn-events checks every
    // log; then this test's stricter ones, which know the workflow.
    cairn_events::check_log(evs)?;
    // What each instance would do undisturbed, for its `on_interrupt`.
    let mut plain = BTreeMap::new();
    simulate(&case.nodes, "", 0, &Overrides::new(), &mut plain);
    let mut walk = Walk {
        plain: &plain,
        frame: 0,
        layers: HashMap::new(),
        finished_ids: BTreeSet::new(),
        nodes: BTreeMap::new(),
        to_close: BTreeMap::new(),
    };
    for e in evs {
        walk.run_event(e)?;
        walk.node_event(e)?;
    }
    let Walk {
        layers,
        nodes,
        to_close,
        ..
    } = walk;
    if let Some((k, a)) = to_close.iter().next() {
        return Err(format!(
            "attempt {a} of {}#{}, left open by a stop, was never closed",
            k.0, k.1
        ));
    }
    // For a run that ended: every layer that started has finished unless
    // the run was stopped; every mounted node reached a terminal state.
    for (key, nl) in &nodes {
        if nl.phase != Some(Phase::Done) {
            return Err(format!(
                "{}#{} never ended (phase {:?})",
                key.0, key.1, nl.phase
            ));
        }
        if nl.gate == 3 && nl.terminal == Some("cancelled") {
            // Decided, then cancelled before it acted: allowed.
        }
        let folded = state.node(&key.0, key.1).map(|s| s.status.as_str());
        if folded != nl.terminal {
            return Err(format!(
                "{}#{}: log ends {:?}, fold says {folded:?}",
                key.0, key.1, nl.terminal
            ));
        }
    }
    if ran.outcome == RunOutcome::Finished(None) || matches!(ran.outcome, RunOutcome::Finished(_)) {
        if let Some((l, _)) = layers.iter().find(|(_, open)| **open) {
            return Err(format!("layer {l} never finished in a finished run"));
        }
    }

    // The model: what each node instance must have come to, given how the
    // commands a stop interrupted ended.
    let mut given = Overrides::new();
    for (key, nl) in &nodes {
        if nl.interrupted == 0 {
            continue;
        }
        let Some(x) = plain.get(key) else {
            return Err(format!("{}#{} is not in the workflow", key.0, key.1));
        };
        let got = state.node(&key.0, key.1).unwrap().status;
        match got {
            NodeStatus::Finished if x.no_rerun => {
                return Err(format!(
                    "{}#{} finished though an attempt was interrupted and it says on_interrupt: fail",
                    key.0, key.1
                ));
            }
            NodeStatus::Failed if x.command && !x.no_rerun && !x.may_fail => {
                return Err(format!(
                    "{}#{}: an interrupted attempt was run again, yet the node failed",
                    key.0, key.1
                ));
            }
            NodeStatus::Finished | NodeStatus::Failed if x.command => {
                given.insert(key.clone(), got);
            }
            _ => {}
        }
    }
    let mut expect = BTreeMap::new();
    let fatal = simulate(&case.nodes, "", 0, &given, &mut expect);
    let exact = !fatal && !cancel_requested;
    if exact && !matches!(ran.outcome, RunOutcome::Finished(_)) {
        return Err(format!(
            "nothing should stop this run, yet it ended {:?}",
            ran.outcome
        ));
    }
    if fatal && !cancel_requested && !matches!(ran.outcome, RunOutcome::Failed(_)) {
        return Err(format!(
            "a node fails with on_failure=fail, yet the run ended {:?}",
            ran.outcome
        ));
    }
    for (key, nl) in &nodes {
        let Some(x) = expect.get(key) else {
            return Err(format!(
                "{}#{} was mounted but the workflow has no such instance",
                key.0, key.1
            ));
        };
        let got = state.node(&key.0, key.1).unwrap();
        // A stopping run cancels what has not ended, and takes no more
        // retries: a node that needed them may end failed instead.
        let cut_short = got.status == NodeStatus::Failed && nl.started < x.attempts;
        if got.status != x.status && got.status != NodeStatus::Cancelled && !cut_short {
            return Err(format!(
                "{}#{} ended {}, want {} (or cancelled)",
                key.0,
                key.1,
                got.status.as_str(),
                x.status.as_str()
            ));
        }
        // A run that stops takes no more retries, so attempts are exact
        // only when nothing stops it, nor interrupts the node.
        if exact && nl.interrupted == 0 && nl.started != x.attempts {
            return Err(format!(
                "{}#{} ended {} after {} attempts, want {}",
                key.0,
                key.1,
                got.status.as_str(),
                nl.started,
                x.attempts
            ));
        }
        if nl.started > x.attempts.max(1) + nl.interrupted {
            return Err(format!(
                "{}#{} started {} attempts, at most {}",
                key.0, key.1, nl.started, x.attempts
            ));
        }
        if got.status == NodeStatus::Finished {
            if let Some(o) = &x.output {
                if got.output.as_ref().map(|g| g.to_value()).as_ref() != Some(o) {
                    return Err(format!(
                        "{}#{} output {:?}, want {o}",
                        key.0, key.1, got.output
                    ));
                }
            }
        }
        // Dependents of nodes that did not finish never start.
        for need in &x.needs {
            let ns = state.node(&need.0, need.1).map(|s| s.status);
            if ns != Some(NodeStatus::Finished) && nl.started > 0 {
                return Err(format!(
                    "{}#{} started though its need {} is {:?}",
                    key.0, key.1, need.0, ns
                ));
            }
            if matches!(ns, Some(NodeStatus::Failed | NodeStatus::Skipped))
                && !matches!(got.status, NodeStatus::Skipped | NodeStatus::Cancelled)
            {
                return Err(format!(
                    "{}#{} is {} though its need {} is {:?}",
                    key.0,
                    key.1,
                    got.status.as_str(),
                    need.0,
                    ns
                ));
            }
        }
    }
    if exact {
        let mounted: BTreeSet<&(String, u32)> = nodes.keys().collect();
        let want: BTreeSet<&(String, u32)> = expect.keys().collect();
        if mounted != want {
            let missing: Vec<_> = want.difference(&mounted).collect();
            let extra: Vec<_> = mounted.difference(&want).collect();
            return Err(format!(
                "mounted instances differ: missing {missing:?}, extra {extra:?}"
            ));
        }
    }
    Ok(())
}

/// Every command's answer against the log: an accepted command's event is
/// the one its sender got, and is in the log once; a refused command's is
/// not there, and an inbox `Diagnostic` gives the reason the sender got
/// unless the run had ended before the command was taken.
fn check_commands(ran: &Ran, evs: &[Event]) -> Result<(), String> {
    let ended = evs.last().is_some_and(|e| e.kind.is_terminal());
    // Seqs of the events that carry each command's marker.
    let mut carried: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    let mut refusals: BTreeMap<String, usize> = BTreeMap::new();
    let mut acceptances: BTreeSet<u64> = BTreeSet::new();
    for e in evs {
        let marker = match &e.kind {
            EventKind::ApprovalGranted { note, .. } | EventKind::ApprovalDenied { note, .. } => {
                note.as_deref()
            }
            EventKind::RunCancelRequested { reason, .. } => reason.as_deref(),
            _ => {
                match InboxReply::parse(e) {
                    Some(r) if r.accepted => {
                        acceptances.insert(e.seq.get());
                    }
                    Some(r) => *refusals.entry(r.message).or_default() += 1,
                    None => {}
                }
                continue;
            }
        };
        let Some(m) = marker else {
            return Err(format!(
                "seq {} {}: no command's marker",
                e.seq,
                e.type_name()
            ));
        };
        carried.entry(m).or_default().push(e.seq.get());
    }
    for s in &ran.sent {
        let at = carried.remove(s.marker.as_str()).unwrap_or_default();
        let what = format!("{} {}", s.command.name(), s.marker);
        match &s.answer {
            Ok(ev) => {
                let stored = evs.get((ev.seq.get() as usize).wrapping_sub(1));
                if stored.map(|e| e.to_json()) != Some(ev.to_json()) {
                    return Err(format!(
                        "{what}: the answer is not the log's event at seq {}",
                        ev.seq
                    ));
                }
                if s.late {
                    return Err(format!(
                        "{what}: a decision for a gate already decided was accepted (seq {})",
                        ev.seq
                    ));
                }
                if s.command.is_result(ev) {
                    if at != [ev.seq.get()] {
                        return Err(format!(
                            "{what}: accepted with seq {}, the log has its event at {at:?}",
                            ev.seq
                        ));
                    }
                } else if !acceptances.remove(&ev.seq.get()) || !at.is_empty() {
                    return Err(format!(
                        "{what}: accepted with seq {}, neither its event nor an inbox reply",
                        ev.seq
                    ));
                }
            }
            Err(msg) => {
                if msg.starts_with(HUNG) || msg.contains("did not take") {
                    return Err(format!("{what}: {msg}"));
                }
                if !at.is_empty() {
                    return Err(format!(
                        "{what}: refused ({msg}), yet its event is at {at:?}"
                    ));
                }
                let run_over = msg.contains("has already ended") || msg.contains("ended before");
                match refusals.get_mut(msg) {
                    Some(n) if *n > 0 => *n -= 1,
                    _ if ended && run_over => {}
                    _ => {
                        return Err(format!(
                            "{what}: refused ({msg}) without an inbox Diagnostic saying so"
                        ))
                    }
                }
            }
        }
    }
    if let Some((m, at)) = carried.iter().next() {
        return Err(format!("seqs {at:?} carry {m}, which nobody sent"));
    }
    if let Some((m, _)) = refusals.iter().find(|(_, n)| **n > 0) {
        return Err(format!("an inbox refusal no sender got: {m}"));
    }
    if let Some(at) = acceptances.first() {
        return Err(format!("seq {at}: an inbox acceptance no sender got"));
    }
    Ok(())
}

/// Drains a subscription of a run that has ended, on a runtime of its own
/// (the caller is not async).
fn drain(mut sub: cairn_store::Subscription, out: &mut Vec<(u64, String)>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        while let Some(ev) = tokio::time::timeout(Duration::from_secs(10), sub.next())
            .await
            .expect("a subscription of an ended run did not end")
        {
            let ev = ev.expect("subscription failed");
            out.push((ev.seq, ev.json.to_string()));
        }
    });
}

fn cases() -> u32 {
    std::env::var("CAIRN_CONFORMANCE_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64)
}

static CASE_NO: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        max_shrink_iters: 64,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_workflows_keep_the_contract(case in gen_case()) {
        let dir = tempfile::tempdir().unwrap();
        let place = Place { dir: dir.path().to_path_buf(), pg: None };
        if let Err(e) = one_case(&case, &place) {
            prop_assert!(false, "{e}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: (cases() / 3).max(1),
        max_shrink_iters: 16,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_workflows_keep_the_contract_on_postgres(case in gen_case()) {
        let Some(scratch) = cairn_postgres::testing::Scratch::new() else {
            return Ok(());
        };
        let dir = tempfile::tempdir().unwrap();
        let place = Place {
            dir: dir.path().to_path_buf(),
            pg: Some((scratch.url, scratch.schema())),
        };
        if let Err(e) = one_case(&case, &place) {
            prop_assert!(false, "{e}");
        }
    }
}

/// Runs one case on its store and checks it; the error says what broke,
/// with the workflow, the commands sent and the stored log.
fn one_case(case: &Case, place: &Place) -> Result<(), String> {
    let journal = open_journal(place);
    let no = CASE_NO.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let run_id = format!("conf-{no}");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let t0 = std::time::Instant::now();
    let ran = rt.block_on(run_case(case, place, journal.clone(), &run_id));
    drop(rt);
    let verdict = check(case, place, &journal, &ran);
    if std::env::var_os("CAIRN_CONFORMANCE_VERBOSE").is_some() {
        eprintln!("{run_id} exit_on_wait={} cancel={:?} stops={:?} remote={}: {} sessions, {} interrupted, {} commands ({} refused), {} events, {:?}, {:?}, {:?}", case.exit_on_wait, case.cancel, case.stops, case.remote(), ran.sessions, ran.observed.iter().filter(|e| matches!(&e.kind, EventKind::NodeFailed { error, .. } if error.kind == "interrupted")).count(), ran.sent.len(), ran.sent.iter().filter(|s| s.answer.is_err()).count(), ran.observed.len(), ran.outcome, t0.elapsed(), verdict.as_ref().err());
    }
    let result = verdict.map_err(|e| {
        // The store's log: events a sender applied while nobody drove
        // the run never reached the observer.
        let dump: Vec<String> = journal
            .backend()
            .read_events(
                &cairn_events::RunId::parse(&ran.run_id).unwrap(),
                &EventQuery::default(),
            )
            .map(|evs| evs.iter().map(|e| e.json.to_string()).collect())
            .unwrap_or_else(|e| vec![format!("unreadable: {e}")]);
        let sent: Vec<String> = ran.sent.iter().map(|s| format!("{s:?}")).collect();
        format!(
            "{e}\n--- workflow:\n{}\n--- case: {:?}\n--- commands:\n{}\n--- log:\n{}",
            yaml(case),
            case,
            sent.join("\n"),
            dump.join("\n")
        )
    });
    journal.close();
    result
}
