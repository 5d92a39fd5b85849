//! The `cairn` binary driven as users drive it: real processes, a real store
//! in a temporary folder, real child commands.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

struct Env {
    dir: tempfile::TempDir,
}

impl Env {
    fn new() -> Env {
        Env {
            dir: tempfile::tempdir().expect("temp dir"),
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn store(&self) -> PathBuf {
        self.path().join(".cairn/cairn.db")
    }

    fn mirror(&self, run: &str) -> PathBuf {
        self.path()
            .join(".cairn/logs")
            .join(run)
            .join("events.ndjson")
    }

    /// `cairn` in the temp folder, with the default store layout there.
    fn cmd(&self) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_cairn"));
        c.current_dir(self.path())
            .env_remove("CAIRN_STORE")
            .env_remove("CAIRN_LOG_DIR")
            .env_remove("CAIRN_TOKEN")
            .stdin(Stdio::null());
        c
    }

    fn run(&self, args: &[&str]) -> Output {
        let child = self
            .cmd()
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn cairn");
        wait_output(child)
    }

    fn spawn(&self, args: &[&str]) -> Child {
        self.cmd()
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn cairn")
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.path().join(name);
        std::fs::write(&p, text).expect("write file");
        p
    }

    /// `cairn status --json`, once the run exists.
    fn state(&self, run: &str) -> Option<Value> {
        let out = self.run(&["status", run, "--json"]);
        if out.status.code() != Some(0) {
            return None;
        }
        serde_json::from_slice(&out.stdout).ok()
    }

    /// Polls the run's state until `pred` holds.
    fn wait_state(&self, run: &str, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let start = Instant::now();
        loop {
            if let Some(v) = self.state(run) {
                if pred(&v) {
                    return v;
                }
            }
            assert!(start.elapsed() < PATIENCE, "run {run} never got to: {what}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn wait_output(mut child: Child) -> Output {
    let start = Instant::now();
    loop {
        if child.try_wait().expect("try_wait").is_some() {
            return child.wait_with_output().expect("output");
        }
        if start.elapsed() > PATIENCE {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "cairn did not exit; stdout:\n{}\nstderr:\n{}",
                text(&out.stdout),
                text(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[track_caller]
fn assert_code(out: &Output, code: i32) {
    assert_eq!(
        out.status.code(),
        Some(code),
        "stdout:\n{}\nstderr:\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
}

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

const GATED: &str = r#"
name: gated
nodes:
  - id: prepare
    command: ["echo", "ready"]
  - id: gate
    needs: [prepare]
    approval: "Ship {{ nodes.prepare.output | trim }}?"
  - id: ship
    needs: [gate]
    value: "shipped: {{ 'yes' if nodes.gate.output.approved else 'no' }}"
output: "{{ nodes.ship.output }}"
"#;

#[test]
fn hello_finishes_and_logs_json_is_the_mirror_byte_for_byte() {
    let env = Env::new();
    let hello = examples().join("hello.yaml");
    let out = env.run(&["run", hello.to_str().unwrap(), "--run-id", "h1"]);
    assert_code(&out, 0);
    let stdout = text(&out.stdout);
    assert!(stdout.contains("run h1 finished"), "{stdout}");
    assert!(stdout.contains("output: "), "{stdout}");

    let mirror = std::fs::read(env.mirror("h1")).expect("mirror written");
    let logs = env.run(&["logs", "h1", "--json"]);
    assert_code(&logs, 0);
    assert_eq!(text(&logs.stdout), text(&mirror));
    // Every line is an event of this run, in seq order from 1.
    for (i, line) in text(&mirror).lines().enumerate() {
        let v: Value = serde_json::from_str(line).expect("event JSON");
        assert_eq!(v["runId"], "h1");
        assert_eq!(v["seq"], (i + 1) as u64);
    }

    // Human lines, filtered by type.
    let logs = env.run(&[
        "logs",
        "h1",
        "--type",
        "RunFinished",
        "--type",
        "RunStarted",
    ]);
    assert_code(&logs, 0);
    let lines: Vec<String> = text(&logs.stdout).lines().map(str::to_string).collect();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(lines[0].contains("RunStarted") && lines[0].contains("workflow hello"));
    assert!(lines[1].contains("RunFinished"));

    // --since skips what was seen.
    let all = text(&mirror).lines().count();
    let tail = env.run(&["logs", "h1", "--json", "--since", "3"]);
    assert_eq!(text(&tail.stdout).lines().count(), all - 3);
    assert!(text(&tail.stdout).starts_with("{\"type\""));

    // The status comes from the reducer: every node finished, with outputs.
    let st = env.state("h1").expect("status");
    assert_eq!(st["status"], "finished");
    let nodes = st["nodes"].as_array().unwrap();
    assert!(nodes.iter().all(|n| n["status"] == "finished"), "{st}");
    let report = nodes.iter().find(|n| n["nodeId"] == "report").unwrap();
    assert_eq!(report["output"]["planets"], 3);
    let human = env.run(&["status", "h1"]);
    assert_code(&human, 0);
    assert!(text(&human.stdout).contains("greet_each[2].say"));

    // export rewrites the mirror from the store, identically.
    std::fs::remove_file(env.mirror("h1")).unwrap();
    let exp = env.run(&["export", "h1"]);
    assert_code(&exp, 0);
    assert_eq!(std::fs::read(env.mirror("h1")).unwrap(), mirror);

    let runs = env.run(&["runs", "--json"]);
    assert_code(&runs, 0);
    let list: Value = serde_json::from_slice(&runs.stdout).unwrap();
    let first = &list["runs"][0];
    assert_eq!(first["runId"], "h1");
    assert_eq!(first["status"], "finished");

    // The Activity view: the same entries as JSON and as lines, chained.
    let act = env.run(&["activity", "h1", "--json"]);
    assert_code(&act, 0);
    let page: Value = serde_json::from_slice(&act.stdout).unwrap();
    assert_eq!(page["runId"], "h1");
    let entries: Vec<Value> = serde_json::from_value(page["activity"].clone()).unwrap();
    assert!(entries.len() >= 3, "{entries:?}");
    assert_eq!(entries[0]["kind"], "run");
    for pair in entries.windows(2) {
        assert_eq!(pair[1]["previousActivityId"], pair[0]["id"]);
    }
    assert_eq!(
        entries.last().unwrap()["title"]
            .as_str()
            .map(|t| t.starts_with("Run finished")),
        Some(true)
    );
    let lines = env.run(&["activity", "h1"]);
    assert_code(&lines, 0);
    let lines = text(&lines.stdout);
    assert_eq!(lines.lines().count(), entries.len(), "{lines}");
    assert!(lines.contains("greet_each[2].say"), "{lines}");
    assert_code(&env.run(&["activity", "no-such-run"]), 4);
}

#[test]
fn run_json_prints_the_stored_lines() {
    let env = Env::new();
    let hello = examples().join("hello.yaml");
    let out = env.run(&[
        "run",
        hello.to_str().unwrap(),
        "--run-id",
        "j1",
        "--json",
        "--input",
        r#"{"who": "Cairn"}"#,
    ]);
    assert_code(&out, 0);
    let mirror = std::fs::read_to_string(env.mirror("j1")).unwrap();
    assert_eq!(text(&out.stdout), mirror);
    assert!(mirror.contains("Hello, Cairn"));
    // The summary for people goes to stderr, out of the NDJSON's way.
    assert!(text(&out.stderr).contains("run j1 finished"));
}

#[test]
fn bad_input_exits_4_and_writes_nothing() {
    let env = Env::new();
    let bad = env.write(
        "bad.yaml",
        "name: bad\nnodes:\n  - id: a\n    command: [\"true\"]\n    needs: [nope]\n  - id: b\n    valu: 3\n",
    );
    let out = env.run(&["run", bad.to_str().unwrap()]);
    assert_code(&out, 4);
    let err = text(&out.stderr);
    assert!(err.contains("bad.yaml:5:"), "{err}");
    assert!(err.contains("nodes[1].valu"), "{err}");
    assert!(
        !env.path().join(".cairn").exists(),
        "nothing may be written"
    );

    let v = env.run(&["validate", bad.to_str().unwrap()]);
    assert_code(&v, 4);
    assert_eq!(
        text(&v.stderr)
            .lines()
            .filter(|l| l.starts_with("error: "))
            .count(),
        3
    );

    let schema = env.write(
        "typed.yaml",
        "name: typed\ninput:\n  type: object\n  required: [n]\n  properties:\n    n: { type: integer }\nnodes:\n  - id: a\n    value: 1\n",
    );
    let typed = schema.to_str().unwrap();
    for input in [r#"{"n": "x"}"#, "{}", "{not json"] {
        let out = env.run(&["run", typed, "--input", input]);
        assert_code(&out, 4);
    }
    let missing = env.run(&["run", typed, "--input", "@nowhere.json"]);
    assert_code(&missing, 4);
    assert!(text(&missing.stderr).contains("nowhere.json"));
    let bad_id = env.run(&["run", typed, "--input", r#"{"n": 1}"#, "--run-id", "../x"]);
    assert_code(&bad_id, 4);
    let nofile = env.run(&["run", "no-such.yaml"]);
    assert_code(&nofile, 4);
    assert!(
        !env.path().join(".cairn").exists(),
        "nothing may be written"
    );

    // Usage errors and unknown runs are bad input too.
    assert_code(&env.run(&["run"]), 4);
    assert_code(&env.run(&["frobnicate"]), 4);
    assert_code(&env.run(&["run", typed, "--max-concurrency", "0"]), 4);
    assert_code(&env.run(&["status", "nope"]), 4);
    assert!(
        !env.path().join(".cairn").exists(),
        "nothing may be written"
    );

    let ok = env.run(&["run", typed, "--input", r#"{"n": 1}"#, "--run-id", "t1"]);
    assert_code(&ok, 0);
    assert_code(&env.run(&["status", "nope"]), 4);
    assert_code(&env.run(&["logs", "nope"]), 4);
    assert_code(&env.run(&["approve", "nope", "gate"]), 4);
    assert_code(&env.run(&["runs", "--status", "sleeping"]), 4);
    assert_code(&env.run(&["logs", "t1", "--type", "NoSuchEvent"]), 4);
    // The id is taken.
    assert_code(
        &env.run(&["run", typed, "--input", r#"{"n": 1}"#, "--run-id", "t1"]),
        4,
    );
    // A finished run has nothing to resume.
    assert_code(&env.run(&["resume", "t1"]), 4);
}

#[test]
fn a_corrupt_store_is_bad_input() {
    let env = Env::new();
    std::fs::create_dir_all(env.path().join(".cairn")).unwrap();
    std::fs::write(
        env.store(),
        b"this is not a database, just some text\n".repeat(200),
    )
    .unwrap();
    let hello = examples().join("hello.yaml");
    let out = env.run(&["run", hello.to_str().unwrap()]);
    assert_code(&out, 4);
    assert!(
        text(&out.stderr).contains("cairn.db"),
        "{}",
        text(&out.stderr)
    );
    assert_code(&env.run(&["runs"]), 4);
}

#[test]
fn validate_and_graph() {
    let env = Env::new();
    let hello = examples().join("hello.yaml");
    let out = env.run(&["validate", hello.to_str().unwrap()]);
    assert_code(&out, 0);
    assert_eq!(text(&out.stdout), "ok: hello (8 nodes)\n");
    let g = env.run(&["graph", hello.to_str().unwrap()]);
    assert_code(&g, 0);
    let chart = text(&g.stdout);
    assert!(chart.starts_with("flowchart TD\n"), "{chart}");
    assert!(chart.contains("planets --> letters"), "{chart}");
    assert!(chart.contains("subgraph greet_each"), "{chart}");
    for example in ["triage.yaml", "tools.yaml"] {
        let p = examples().join(example);
        assert_code(&env.run(&["validate", p.to_str().unwrap()]), 0);
    }
    assert!(!env.path().join(".cairn").exists());
}

#[test]
fn exit_on_wait_then_approve_from_another_process_then_resume() {
    let env = Env::new();
    let wf = env.write("gated.yaml", GATED);
    let wf = wf.to_str().unwrap();
    let out = env.run(&["run", wf, "--run-id", "g1", "--exit-on-wait"]);
    assert_code(&out, 3);
    assert!(
        text(&out.stdout).contains("cairn approve g1 gate"),
        "{}",
        text(&out.stdout)
    );
    let st = env.state("g1").unwrap();
    assert_eq!(st["status"], "waiting-approval");

    let waiting = env.run(&["runs", "--status", "waiting-approval", "--json"]);
    assert!(text(&waiting.stdout).contains("\"g1\""));

    let ok = env.run(&["approve", "g1", "gate", "--note", "fine", "--by", "alice"]);
    assert_code(&ok, 0);
    // Deciding twice is refused.
    assert_code(&env.run(&["deny", "g1", "gate"]), 4);

    let resumed = env.run(&["resume", "g1"]);
    assert_code(&resumed, 0);
    assert!(text(&resumed.stdout).contains("output: shipped: yes"));
    let st = env.state("g1").unwrap();
    assert_eq!(st["status"], "finished");
    let gate = st["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["nodeId"] == "gate")
        .unwrap();
    assert_eq!(gate["decision"]["by"], "alice");
    assert_eq!(gate["decision"]["note"], "fine");
    // `prepare` ran once, before the wait: resume does not repeat it.
    let prepare = st["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["nodeId"] == "prepare")
        .unwrap();
    assert_eq!(prepare["attempts"].as_array().unwrap().len(), 1);

    let logs = env.run(&["logs", "g1", "--json"]);
    assert_eq!(logs.stdout, std::fs::read(env.mirror("g1")).unwrap());
}

const ASKING: &str = r#"
name: asking
nodes:
  - id: branch
    ask: "Which branch should the fix go to?"
    schema: { type: string, enum: [main, release] }
  - id: use
    needs: [branch]
    value: "going to {{ nodes.branch.output }}"
output: "{{ nodes.use.output }}"
"#;

#[test]
fn a_question_exits_3_is_answered_from_another_process_and_resumed() {
    let env = Env::new();
    let wf = env.write("asking.yaml", ASKING);
    let out = env.run(&[
        "run",
        wf.to_str().unwrap(),
        "--run-id",
        "q1",
        "--exit-on-wait",
    ]);
    assert_code(&out, 3);
    let st = env.state("q1").unwrap();
    assert_eq!(st["status"], "waiting-input");
    let (rid, q) = st["questions"].as_object().unwrap().iter().next().unwrap();
    assert_eq!(q["prompt"], "Which branch should the fix go to?");
    assert!(
        text(&out.stdout).contains(&format!("cairn answer q1 {rid}")),
        "{}",
        text(&out.stdout)
    );

    // An answer outside the schema is refused with the reason; nothing changes.
    let bad = env.run(&["answer", "q1", rid, "develop"]);
    assert_code(&bad, 4);
    assert!(
        text(&bad.stderr).contains("does not match its schema"),
        "{}",
        text(&bad.stderr)
    );
    assert_code(&env.run(&["answer", "q1", "q-0000000000000000", "main"]), 4);
    assert_eq!(env.state("q1").unwrap()["status"], "waiting-input");

    assert_code(
        &env.run(&["answer", "q1", rid, "release", "--by", "bob"]),
        0,
    );
    // Answering twice is refused.
    assert_code(&env.run(&["answer", "q1", rid, "main"]), 4);
    let resumed = env.run(&["resume", "q1"]);
    assert_code(&resumed, 0);
    let st = env.state("q1").unwrap();
    assert_eq!(st["output"], "going to release");
    assert_eq!(st["questions"][rid.as_str()]["answer"], "release");
    assert_eq!(st["questions"][rid.as_str()]["answeredBy"], "bob");
    let logs = text(&env.run(&["logs", "q1", "--json"]).stdout);
    let received: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("\"InputReceived\""))
        .collect();
    assert_eq!(received.len(), 1, "{logs}");
    assert!(
        received[0].contains("\"answer\":\"release\""),
        "{}",
        received[0]
    );
}

#[test]
fn a_waiting_run_is_decided_by_a_second_process() {
    let env = Env::new();
    let wf = env.write("gated.yaml", GATED);
    let wf = wf.to_str().unwrap();
    let runner = env.spawn(&["run", wf, "--run-id", "w1"]);
    env.wait_state("w1", "waiting-approval", |v| {
        v["status"] == "waiting-approval"
    });
    let ok = env.run(&["approve", "w1", "gate"]);
    assert_code(&ok, 0);
    let out = wait_output(runner);
    assert_code(&out, 0);
    let stdout = text(&out.stdout);
    assert!(stdout.contains("output: shipped: yes"), "{stdout}");
    assert!(text(&out.stderr).contains("cairn approve w1 gate"));

    // Denied: the gate fails, and with it the run.
    let runner = env.spawn(&["run", wf, "--run-id", "w2"]);
    env.wait_state("w2", "waiting-approval", |v| {
        v["status"] == "waiting-approval"
    });
    assert_code(&env.run(&["deny", "w2", "gate", "--note", "not today"]), 0);
    let out = wait_output(runner);
    assert_code(&out, 1);
    assert!(
        text(&out.stdout).contains("run w2 failed"),
        "{}",
        text(&out.stdout)
    );
}

/// Processes whose command line is exactly `argv`.
fn processes_running(argv: &[&str]) -> Vec<u32> {
    let want: Vec<u8> = argv.iter().flat_map(|a| a.bytes().chain([0])).collect();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            if cmdline == want {
                found.push(pid);
            }
        }
    }
    found
}

#[test]
fn cancel_from_another_process_kills_the_command() {
    let env = Env::new();
    // A duration no other test uses, so the process can be told apart.
    let wf = env.write(
        "slow.yaml",
        "name: slow\nnodes:\n  - id: nap\n    command: [\"sleep\", \"4713\"]\n  - id: after\n    needs: [nap]\n    value: 1\n",
    );
    let runner = env.spawn(&["run", wf.to_str().unwrap(), "--run-id", "c1"]);
    env.wait_state("c1", "nap running", |v| {
        v["nodes"].as_array().is_some_and(|n| {
            n.iter()
                .any(|n| n["nodeId"] == "nap" && n["status"] == "running")
        })
    });
    let start = Instant::now();
    while processes_running(&["sleep", "4713"]).is_empty() {
        assert!(start.elapsed() < PATIENCE, "sleep never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    let c = env.run(&["cancel", "c1", "--reason", "enough"]);
    assert_code(&c, 0);
    let out = wait_output(runner);
    assert_code(&out, 2);
    assert!(text(&out.stdout).contains("run c1 cancelled"));
    assert!(
        processes_running(&["sleep", "4713"]).is_empty(),
        "the command's process must be gone"
    );
    let st = env.state("c1").unwrap();
    assert_eq!(st["status"], "cancelled");
    // A cancelled run cannot be cancelled again, nor resumed.
    assert_code(&env.run(&["cancel", "c1"]), 4);
    assert_code(&env.run(&["resume", "c1"]), 4);
}

#[test]
fn gc_deletes_old_finished_runs_and_their_logs() {
    let env = Env::new();
    let hello = examples().join("hello.yaml");
    let wf = env.write("gated.yaml", GATED);
    assert_code(
        &env.run(&["run", hello.to_str().unwrap(), "--run-id", "old"]),
        0,
    );
    assert_code(
        &env.run(&[
            "run",
            wf.to_str().unwrap(),
            "--run-id",
            "parked",
            "--exit-on-wait",
        ]),
        3,
    );
    assert!(env.mirror("old").exists());

    let none = env.run(&["gc", "--older-than", "7d"]);
    assert_code(&none, 0);
    assert!(text(&none.stdout).contains("deleted 0 runs"));
    assert!(env.mirror("old").exists());

    assert_code(&env.run(&["gc", "--older-than", "7 days"]), 4);
    assert_code(&env.run(&["gc"]), 4);

    // Make sure "now minus 0s" is after the run's last change.
    std::thread::sleep(Duration::from_millis(5));
    let gc = env.run(&["gc", "--older-than", "0s"]);
    assert_code(&gc, 0);
    assert!(
        text(&gc.stdout).contains("deleted old"),
        "{}",
        text(&gc.stdout)
    );
    assert!(!env.mirror("old").exists());
    assert!(!env.path().join(".cairn/logs/old").exists());
    assert_code(&env.run(&["status", "old"]), 4);
    // A run waiting for a person is not finished: it stays.
    assert_eq!(env.state("parked").unwrap()["status"], "waiting-approval");
    assert!(env.mirror("parked").exists());
}

#[test]
fn no_log_and_custom_store_paths() {
    let env = Env::new();
    let hello = examples().join("hello.yaml");
    let store = env.path().join("elsewhere/db.sqlite");
    let out = env.run(&[
        "--store",
        store.to_str().unwrap(),
        "--no-log",
        "run",
        hello.to_str().unwrap(),
        "--run-id",
        "n1",
    ]);
    assert_code(&out, 0);
    assert!(store.exists());
    assert!(!env.path().join("elsewhere/logs/n1").exists());
    assert!(!env.path().join(".cairn").exists());
    // The store still has every event; export writes the mirror on demand.
    let mut c = env.cmd();
    c.env("CAIRN_STORE", &store).args(["export", "n1"]);
    let exp = wait_output(
        c.stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    assert_code(&exp, 0);
    assert!(env.path().join("elsewhere/logs/n1/events.ndjson").exists());
}

#[test]
fn help_documents_the_exit_codes() {
    let env = Env::new();
    let out = env.run(&["--help"]);
    assert_code(&out, 0);
    let help = text(&out.stdout);
    for line in [
        "0  the run finished",
        "3  the run is waiting",
        "4  bad input",
    ] {
        assert!(help.contains(line), "{help}");
    }
}

/// `cairn serve` on a free port; returns the child and its base URL.
fn serve(env: &Env) -> (Child, String) {
    use std::io::BufRead;
    let mut child = env.spawn(&["serve", "--addr", "127.0.0.1:0"]);
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if let Some(url) = line.split("listening on ").nth(1) {
                let _ = tx.send(url.trim().to_string());
            }
        }
    });
    let url = rx
        .recv_timeout(PATIENCE)
        .expect("cairn serve says where it listens");
    (child, url)
}

#[test]
fn status_and_logs_through_a_server() {
    let env = Env::new();
    let hello = examples().join("hello.yaml");
    assert_code(
        &env.run(&["run", hello.to_str().unwrap(), "--run-id", "s1"]),
        0,
    );
    let mirror = std::fs::read_to_string(env.mirror("s1")).unwrap();
    let (mut server, url) = serve(&env);

    let st = env.run(&["status", "s1", "--json", "--server", &url]);
    assert_code(&st, 0);
    let remote: Value = serde_json::from_slice(&st.stdout).unwrap();
    let local = env.state("s1").unwrap();
    assert_eq!(remote["status"], "finished");
    assert_eq!(remote["nodes"], local["nodes"]);

    let page = env.run(&["logs", "s1", "--json", "--server", &url]);
    assert_code(&page, 0);
    assert_eq!(text(&page.stdout), mirror);
    let follow = env.run(&["logs", "s1", "--json", "--follow", "--server", &url]);
    assert_code(&follow, 0);
    assert_eq!(text(&follow.stdout), mirror);
    let filtered = env.run(&["logs", "s1", "--server", &url, "--node", "report"]);
    assert_code(&filtered, 0);
    let lines = text(&filtered.stdout);
    assert!(
        !lines.is_empty() && lines.lines().all(|l| l.contains(" report")),
        "{lines}"
    );

    // Unknown runs are bad input there too.
    assert_code(&env.run(&["status", "nope", "--server", &url]), 4);

    // SAFETY: signalling the server process this test started.
    unsafe { libc::kill(server.id() as i32, libc::SIGTERM) };
    let start = Instant::now();
    while server.try_wait().unwrap().is_none() {
        if start.elapsed() > PATIENCE {
            let _ = server.kill();
            panic!("cairn serve did not stop on SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // Nothing listens any more: reaching it is an error, not bad input.
    assert_code(&env.run(&["status", "s1", "--server", &url]), 1);
}

/// A stored workflow changed after the run started (say, by a process that
/// reached the store) is refused by `resume`, which would otherwise run
/// the changed file.
#[test]
fn resume_refuses_a_stored_workflow_changed_behind_its_back() {
    let env = Env::new();
    let wf = env.write("gated.yaml", GATED);
    let out = env.run(&[
        "run",
        wf.to_str().unwrap(),
        "--run-id",
        "t1",
        "--exit-on-wait",
    ]);
    assert_code(&out, 3);
    let db = rusqlite::Connection::open(env.path().join(".cairn/cairn.db")).unwrap();
    let changed = db
        .execute(
            "UPDATE workflow_sources SET source = source || '\n# changed\n' WHERE run_id = 't1'",
            [],
        )
        .unwrap();
    assert_eq!(changed, 1);
    drop(db);
    let resumed = env.run(&["resume", "t1"]);
    assert_code(&resumed, 1);
    let err = text(&resumed.stderr);
    assert!(err.contains("changed outside Cairn"), "{err}");
    // Nothing ran: the run still waits at its gate.
    assert_eq!(env.state("t1").unwrap()["status"], "waiting-approval");
}
