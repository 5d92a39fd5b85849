//! `cairn store copy`, driven as users drive it: real runs (a finished one,
//! one waiting at an approval gate with a child run and an agent's tool
//! call), copied SQLite -> PostgreSQL -> SQLite with the real binary, then
//! compared through the library: every event's JSON, the run rows, the tool
//! calls, the pending commands. The copy must resume where the original
//! would have.
//!
//! The PostgreSQL test needs a server: `CAIRN_TEST_PG`, e.g.
//! `postgres://postgres@127.0.0.1:5432/postgres`; it makes a database of
//! its own there and drops it at the end. Without the variable it says so
//! and passes; with it set and nothing answering, it fails.

mod common;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use cairn_events::RunCommand;
use cairn_store::{Backend, EventQuery, RunFilter, SqliteBackend, StoredEvent, ToolCallRecord};

const CHILD: &str = r#"
name: child
input:
  type: object
  properties: { k: { type: integer } }
nodes:
  - id: double
    value: "{{ input.k * 2 }}"
output: "{{ nodes.double.output }}"
"#;

const TURNS: &str = r#"
turns:
  - text: Reading the note.
    tool_calls:
      - { name: read, args: { path: note.txt } }
  - text: The note says hi.
"#;

/// A command, an agent that calls a tool (a tool call record), a child run,
/// then a gate that waits.
const PARENT: &str = r#"
name: parent
models:
  s: { provider: scripted, script: turns.yaml }
nodes:
  - id: prepare
    command: ["echo", "ready"]
  - id: look
    agent:
      model: s
      prompt: Read the note.
      tools: [read]
  - id: kid
    needs: [prepare]
    workflow: child.yaml
    input: { k: 21 }
  - id: gate
    needs: [look, kid]
    approval: "Ship?"
  - id: ship
    needs: [gate]
    value: "shipped {{ nodes.kid.output }}"
output: "{{ nodes.ship.output }}"
"#;

/// A folder with the workflows, a finished run `h1` (examples/hello.yaml)
/// and a run `g1` waiting at its gate (with a child run), in `src.db`.
struct Env {
    dir: tempfile::TempDir,
}

impl Env {
    fn new() -> Env {
        let env = Env {
            dir: tempfile::tempdir().expect("temp dir"),
        };
        for (name, text) in [
            ("child.yaml", CHILD),
            ("turns.yaml", TURNS),
            ("parent.yaml", PARENT),
            ("note.txt", "hi\n"),
        ] {
            std::fs::write(env.path().join(name), text).unwrap();
        }
        let hello = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/hello.yaml");
        let src = env.src();
        let out = env.cairn(&src, &["run", hello.to_str().unwrap(), "--run-id", "h1"]);
        assert_code(&out, 0);
        let out = env.cairn(
            &src,
            &["run", "parent.yaml", "--run-id", "g1", "--exit-on-wait"],
        );
        assert_code(&out, 3);
        env
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The store the runs were made in.
    fn src(&self) -> String {
        self.file("src.db")
    }

    fn file(&self, name: &str) -> String {
        self.path().join(name).to_str().unwrap().to_string()
    }

    /// `cairn --store <store> <args>` in the folder.
    fn cairn(&self, store: &str, args: &[&str]) -> Output {
        let child = Command::new(env!("CARGO_BIN_EXE_cairn"))
            .current_dir(self.path())
            .args(args)
            .args(["--store", store])
            .env_remove("CAIRN_STORE")
            .env_remove("CAIRN_LOG_DIR")
            .env_remove("CAIRN_TOKEN")
            .env_remove("OPENAI_API_KEY")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn cairn");
        wait_output(child)
    }

    /// `cairn store copy --from <from> --to <to> <more>`.
    fn copy(&self, from: &str, to: &str, more: &[&str]) -> Output {
        let mut args = vec!["store", "copy", "--from", from, "--to", to];
        args.extend_from_slice(more);
        // --store is ignored by `store copy`; a path that does not exist
        // shows it is never opened.
        let out = self.cairn(&self.file("unused/none.db"), &args);
        assert!(!self.path().join("unused").exists());
        out
    }
}

/// Waits for a child with piped output, reading it as it comes (a full
/// pipe must not stall it); fails the test past [`common::PATIENCE`].
fn wait_output(child: std::process::Child) -> Output {
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(common::PATIENCE) {
        Ok(out) => out.expect("wait for cairn"),
        Err(_) => {
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            panic!("cairn did not exit within {:?}", common::PATIENCE);
        }
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

fn sqlite(path: &str) -> Arc<dyn Backend> {
    Arc::new(SqliteBackend::open(Path::new(path)).expect("open the SQLite store"))
}

fn pg(url: &str) -> Arc<dyn Backend> {
    Arc::new(cairn_postgres::PgBackend::open(url).expect("open the PostgreSQL store"))
}

fn run_ids(b: &dyn Backend) -> Vec<String> {
    b.list_runs(&RunFilter::default())
        .unwrap()
        .into_iter()
        .map(|r| r.run_id.to_string())
        .collect()
}

fn events(b: &dyn Backend, run: &str) -> Vec<StoredEvent> {
    b.read_events(
        &cairn_events::RunId::parse(run).unwrap(),
        &EventQuery::default(),
    )
    .unwrap()
}

/// Every tool call of the run, found from the node passes its log names.
fn tool_calls(b: &dyn Backend, run: &str) -> Vec<ToolCallRecord> {
    let mut passes = std::collections::BTreeSet::new();
    for ev in events(b, run) {
        let ev = ev.decode().unwrap();
        if let (Some(n), Some(i)) = (ev.scope.node_id, ev.scope.iteration) {
            passes.insert((n.to_string(), i));
        }
    }
    passes
        .iter()
        .flat_map(|(n, i)| {
            b.tool_calls(
                &cairn_events::RunId::parse(run).unwrap(),
                &cairn_events::NodePath::from(n),
                *i,
            )
            .unwrap()
        })
        .collect()
}

fn pending(b: &dyn Backend, run: &str) -> Vec<RunCommand> {
    b.pending_commands(&cairn_events::RunId::parse(run).unwrap())
        .unwrap()
        .into_iter()
        .map(|e| e.command)
        .collect()
}

/// `copy` holds every run of `orig`, alike in all that is copied: the same
/// runs listed in the same order, the same rows, every event's JSON (and
/// columns) identical, the same tool calls and pending commands.
#[track_caller]
fn assert_same_runs(orig: &dyn Backend, copy: &dyn Backend) {
    let ids = run_ids(orig);
    assert_eq!(ids.len(), 3, "{ids:?}");
    assert_eq!(run_ids(copy), ids);
    let mut calls = 0;
    for id in &ids {
        assert_eq!(
            copy.get_run(&cairn_events::RunId::parse(id).unwrap())
                .unwrap(),
            orig.get_run(&cairn_events::RunId::parse(id).unwrap())
                .unwrap(),
            "{id}"
        );
        let (a, b) = (events(orig, id), events(copy, id));
        assert!(!a.is_empty());
        assert_eq!(a.len(), b.len(), "{id}");
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(x.json.as_bytes(), y.json.as_bytes(), "{id} seq {}", x.seq);
            assert_eq!(x, y);
        }
        let (a, b) = (tool_calls(orig, id), tool_calls(copy, id));
        assert_eq!(a, b, "{id}");
        calls += a.len();
        assert_eq!(pending(orig, id), pending(copy, id), "{id}");
    }
    assert_eq!(calls, 1, "the agent's one `read` call");
}

fn status(b: &dyn Backend, run: &str) -> String {
    b.get_run(&cairn_events::RunId::parse(run).unwrap())
        .unwrap()
        .unwrap()
        .status
        .to_string()
}

/// Both sides of a copy, once the command has run.
#[track_caller]
fn assert_lines(out: &Output, want: &[&str]) {
    let stdout = text(&out.stdout);
    for w in want {
        assert!(
            stdout.lines().any(|l| l.starts_with(w)),
            "no line `{w}...` in:\n{stdout}\nstderr:\n{}",
            text(&out.stderr)
        );
    }
}

// ---------------------------------------------------------------- PostgreSQL

/// A database of this test's own on the `CAIRN_TEST_PG` server, dropped
/// with it.
struct TestDb {
    server: &'static str,
    name: String,
    url: String,
}

impl TestDb {
    /// `None`, after saying why, when no server is configured.
    fn create() -> Option<TestDb> {
        let server = cairn_postgres::testing::server_or_skip()?;
        static N: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "cairn_copy_{}_{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let url = cairn_postgres::testing::create_database(server, &name);
        Some(TestDb { server, name, url })
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        cairn_postgres::testing::drop_database(self.server, &self.name);
    }
}

#[test]
fn sqlite_to_postgres_to_sqlite_keeps_every_byte_and_the_copy_resumes() {
    let Some(db) = TestDb::create() else {
        return;
    };
    let env = Env::new();
    let (src, back) = (env.src(), env.file("back/b.db"));

    let hello = events(&*sqlite(&src), "h1").len();
    let out = env.copy(&src, &db.url, &[]);
    assert_code(&out, 0);
    assert_lines(
        &out,
        &[
            &format!("copied h1: {hello} events, 0 tool calls"),
            "copied g1: ",
            "copied g1.",
            "copied 3 runs (",
        ],
    );
    let out = env.copy(&db.url, &back, &[]);
    assert_code(&out, 0);
    assert_lines(&out, &["copied 3 runs ("]);

    // And PostgreSQL -> PostgreSQL, into a database of its own.
    let db2 = TestDb::create().unwrap();
    assert_code(&env.copy(&db.url, &db2.url, &[]), 0);
    // One database, spelled two ways, is one store.
    let respelled = match db.url.strip_prefix("postgres://") {
        Some(rest) => format!("postgresql://{rest}"),
        None => db.url.replacen("postgresql://", "postgres://", 1),
    };
    let same = env.copy(&db.url, &respelled, &[]);
    assert_code(&same, 4);
    assert!(text(&same.stderr).contains("the same store"));
    {
        let (s, p, b, p2) = (sqlite(&src), pg(&db.url), sqlite(&back), pg(&db2.url));
        assert_same_runs(&*s, &*p);
        assert_same_runs(&*s, &*b);
        assert_same_runs(&*s, &*p2);
        assert_eq!(status(&*p, "g1"), "waiting-approval");
    }
    drop(db2);
    // What `cairn logs --json` prints is the same bytes in all three.
    for run in ["h1", "g1"] {
        let want = env.cairn(&src, &["logs", run, "--json"]);
        assert_code(&want, 0);
        for store in [&db.url, &back] {
            let got = env.cairn(store, &["logs", run, "--json"]);
            assert_code(&got, 0);
            assert!(got.stdout == want.stdout, "{run} in {store}");
        }
    }

    // Copying again is refused run by run (exit 4: bad input), naming
    // each; with --skip-existing every run is found whole and skipped.
    let again = env.copy(&src, &db.url, &[]);
    assert_code(&again, 4);
    let err = text(&again.stderr);
    for run in ["`h1`", "`g1`"] {
        assert!(err.contains(run) && err.contains("already exists"), "{err}");
    }
    let skip = env.copy(&src, &db.url, &["--skip-existing"]);
    assert_code(&skip, 0);
    assert_lines(
        &skip,
        &[
            "skipped h1: already in the destination",
            "skipped g1: already in the destination",
            "copied 0 runs",
        ],
    );

    // A run whose PostgreSQL lease is held is being driven: refused.
    {
        let p = pg(&db.url);
        let lease = p
            .try_lock_run(&cairn_events::RunId::parse("h1").unwrap())
            .unwrap()
            .expect("h1 is free");
        let out = env.copy(&db.url, &env.file("busy/x.db"), &[]);
        assert_code(&out, 4);
        assert!(
            text(&out.stderr).contains("`h1` is being driven"),
            "{}",
            text(&out.stderr)
        );
        assert_lines(&out, &["copied 2 runs ("]);
        drop(lease);
    }

    // The waiting run is decided and resumed in the PostgreSQL copy, and
    // finishes there; the source still waits.
    assert_code(&env.cairn(&db.url, &["approve", "g1", "gate"]), 0);
    let resumed = env.cairn(&db.url, &["resume", "g1"]);
    assert_code(&resumed, 0);
    assert!(
        text(&resumed.stdout).contains("output: shipped 42"),
        "{}",
        text(&resumed.stdout)
    );
    {
        let (s, p) = (sqlite(&src), pg(&db.url));
        assert_eq!(status(&*p, "g1"), "finished");
        assert_eq!(status(&*s, "g1"), "waiting-approval");
        // `prepare` ran once, in the source, before the copy.
        let prepared = events(&*p, "g1")
            .iter()
            .filter(|e| e.type_name == "NodeStarted" && e.node_id.as_deref() == Some("prepare"))
            .count();
        assert_eq!(prepared, 1);
    }

    // The source again: g1 went on in the destination, so it is skipped as
    // the source's prefix. The SQLite copy made before the resume is
    // completed from the PostgreSQL one.
    let skip = env.copy(&src, &db.url, &["--skip-existing"]);
    assert_code(&skip, 0);
    assert_lines(
        &skip,
        &["skipped g1: already in the destination, where it went on ("],
    );
    let more = env.copy(&db.url, &back, &["--skip-existing"]);
    assert_code(&more, 0);
    assert_lines(&more, &["completed g1: ", "skipped h1: "]);
    let (p, b) = (pg(&db.url), sqlite(&back));
    assert_eq!(events(&*p, "g1"), events(&*b, "g1"));
    assert_eq!(
        p.get_run(&cairn_events::RunId::parse("g1").unwrap())
            .unwrap(),
        b.get_run(&cairn_events::RunId::parse("g1").unwrap())
            .unwrap()
    );
    assert_eq!(status(&*b, "g1"), "finished");
    drop((p, b));
    drop(db);
}

// -------------------------------------------------------------------- SQLite

#[test]
fn a_pending_decision_travels_with_its_run_and_is_applied_in_the_copy() {
    let env = Env::new();
    let (src, dst) = (env.src(), env.file("dst.db"));
    // A decision recorded in the inbox and not applied yet (its process
    // died in between).
    sqlite(&src)
        .put_command(
            &cairn_events::RunId::parse("g1").unwrap(),
            &RunCommand::Approve {
                node_id: "gate".into(),
                note: Some("from the inbox".into()),
                by: Some("alice".into()),
            },
        )
        .unwrap();

    let out = env.copy(&src, &dst, &[]);
    assert_code(&out, 0);
    assert!(
        text(&out.stdout).contains(", 1 tool call, 1 pending command"),
        "{}",
        text(&out.stdout)
    );
    assert_same_runs(&*sqlite(&src), &*sqlite(&dst));
    assert_eq!(pending(&*sqlite(&dst), "g1").len(), 1);

    let resumed = env.cairn(&dst, &["resume", "g1"]);
    assert_code(&resumed, 0);
    let st = env.cairn(&dst, &["status", "g1", "--json"]);
    let st: serde_json::Value = serde_json::from_slice(&st.stdout).unwrap();
    assert_eq!(st["status"], "finished");
    let gate = st["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["nodeId"] == "gate")
        .unwrap();
    assert_eq!(gate["decision"]["by"], "alice");
    assert_eq!(status(&*sqlite(&src), "g1"), "waiting-approval");
}

#[test]
fn a_run_being_driven_is_refused_and_the_others_are_copied() {
    let env = Env::new();
    let (src, dst) = (env.src(), env.file("dst.db"));
    let source = sqlite(&src);
    let lease = source
        .try_lock_run(&cairn_events::RunId::parse("h1").unwrap())
        .unwrap()
        .expect("h1 is free");
    let out = env.copy(&src, &dst, &[]);
    assert_code(&out, 4);
    let err = text(&out.stderr);
    assert!(
        err.contains("`h1` is being driven by a process of the source store"),
        "{err}"
    );
    assert_lines(&out, &["copied g1: ", "copied g1.", "copied 2 runs ("]);
    assert!(text(&out.stdout).contains("; 1 failed"));
    assert_eq!(run_ids(&*sqlite(&dst)).len(), 2);

    drop(lease);
    let out = env.copy(&src, &dst, &["--skip-existing"]);
    assert_code(&out, 0);
    let hello = format!("copied h1: {} events", events(&*source, "h1").len());
    assert_lines(&out, &[&hello, "skipped g1: ", "copied 1 run ("]);
    assert_same_runs(&*source, &*sqlite(&dst));
}

#[test]
fn a_copy_cut_short_is_completed_by_skip_existing_not_skipped() {
    let env = Env::new();
    let (src, dst) = (env.src(), env.file("dst.db"));
    let (s, d) = (sqlite(&src), sqlite(&dst));
    // What a copy that died after its tenth event leaves behind.
    let rec = s
        .get_run(&cairn_events::RunId::parse("h1").unwrap())
        .unwrap()
        .unwrap();
    d.create_run(&rec).unwrap();
    let evs = events(&*s, "h1");
    d.append(&evs[..10]).unwrap();

    let out = env.copy(&src, &dst, &["--run", "h1"]);
    assert_code(&out, 4);
    assert!(text(&out.stderr).contains("already exists"));
    let out = env.copy(&src, &dst, &["--run", "h1", "--skip-existing"]);
    assert_code(&out, 0);
    assert_lines(
        &out,
        &[&format!(
            "completed h1: {} more events ({} in all)",
            evs.len() - 10,
            evs.len()
        )],
    );
    assert_eq!(events(&*d, "h1"), evs);
    assert_eq!(
        d.get_run(&cairn_events::RunId::parse("h1").unwrap())
            .unwrap(),
        s.get_run(&cairn_events::RunId::parse("h1").unwrap())
            .unwrap()
    );
    // --run copies the runs it names (and their children) only.
    assert_eq!(run_ids(&*d), ["h1"]);

    // A destination log that is not the source's prefix is another run's
    // history: refused, never patched.
    let other = env.file("other.db");
    let o = sqlite(&other);
    o.create_run(&rec).unwrap();
    let mut forged = evs[0].clone();
    forged.json = Arc::from(forged.json.replace("\"h1\"", "\"h1\" "));
    o.append(&[forged]).unwrap();
    let out = env.copy(&src, &other, &["--run", "h1", "--skip-existing"]);
    assert_code(&out, 4);
    assert!(
        text(&out.stderr).contains("differs from the source's"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(events(&*o, "h1").len(), 1);
}

#[test]
fn run_names_a_run_with_its_children() {
    let env = Env::new();
    let (src, dst) = (env.src(), env.file("dst.db"));
    let out = env.copy(&src, &dst, &["--run", "g1"]);
    assert_code(&out, 0);
    let ids = run_ids(&*sqlite(&dst));
    assert_eq!(ids.len(), 2, "{ids:?}");
    assert!(ids.contains(&"g1".to_string()));
    let kid = ids.iter().find(|id| *id != "g1").unwrap();
    let child = sqlite(&dst)
        .get_run(&cairn_events::RunId::parse(kid).unwrap())
        .unwrap()
        .unwrap();
    assert_eq!(child.parent_run_id.as_deref(), Some("g1"));
    assert_eq!(child, sqlite(&src).get_run(&child.run_id).unwrap().unwrap());
}

#[test]
fn bad_stores_are_bad_input_and_passwords_are_never_printed() {
    let env = Env::new();
    let src = env.src();
    // A missing source is not created.
    let out = env.copy(&env.file("nowhere.db"), &env.file("dst.db"), &[]);
    assert_code(&out, 4);
    assert!(
        text(&out.stderr).contains("no store at"),
        "{}",
        text(&out.stderr)
    );
    assert!(!env.path().join("nowhere.db").exists());
    // The same store on both sides, by another path.
    let out = env.copy(&src, &env.file("./src.db"), &[]);
    assert_code(&out, 4);
    assert!(text(&out.stderr).contains("the same store"));
    // An unknown run: nothing is copied.
    let out = env.copy(&src, &env.file("dst.db"), &["--run", "nope"]);
    assert_code(&out, 4);
    assert!(text(&out.stderr).contains("no run `nope`"));
    assert!(!env.path().join("dst.db").exists());
    // A server that does not answer, reached with a password.
    for url in [
        "postgres://cairn:hunter2@127.0.0.1:1/db",
        "postgresql://cairn@127.0.0.1:1/db?password=hunter2",
    ] {
        for (from, to) in [(src.as_str(), url), (url, src.as_str())] {
            let out = env.copy(from, to, &[]);
            assert_code(&out, 4);
            let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
            assert!(said.contains("127.0.0.1:1"), "{said}");
            assert!(!said.contains("hunter2"), "{said}");
        }
    }
}
