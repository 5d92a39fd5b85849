//! The CLI against a server: a profile in `.cairn.toml` names the server
//! and where its token comes from; `run`, `runs`, `answer`, `approve`,
//! `status`, `scores`, `revert` and `fork` go through it; what needs a store
//! says so; and every
//! command's `--json` is one object of a documented shape.

mod common;
use common::*;

use std::path::Path;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

fn cli(dir: &Path, args: &[&str], token: Option<&str>) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_cairn"));
    c.current_dir(dir)
        .args(args)
        .env_remove("CAIRN_STORE")
        .env_remove("CAIRN_SERVER")
        .env_remove("CAIRN_TOKEN")
        .env_remove("CAIRN_PROFILE")
        .env("XDG_CONFIG_HOME", dir.join("no-user-config"))
        .stdin(Stdio::null());
    match token {
        Some(t) => c.env("CAIRN_TEST_PROD_TOKEN", t),
        None => c.env_remove("CAIRN_TEST_PROD_TOKEN"),
    };
    c.output().expect("run cairn")
}

fn json(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    })
}

const ASKS: &str = r#"
name: asks
nodes:
  - id: branch
    ask: "Which branch?"
    schema: { type: string, enum: [main, release] }
  - id: gate
    needs: [branch]
    approval: "Ship {{ nodes.branch.output }}?"
"#;

#[test]
fn a_profile_names_a_server_and_its_token_and_the_cli_works_through_it() {
    let srv = tempfile::tempdir().unwrap();
    std::fs::write(srv.path().join("asks.yaml"), ASKS).unwrap();
    std::fs::write(
        srv.path().join("done.yaml"),
        "name: done\nnodes:\n  - id: ship\n    value: shipped\noutput: \"{{ nodes.ship.output }}\"\n",
    )
    .unwrap();
    std::fs::write(
        srv.path().join("parent.yaml"),
        "name: parent\nnodes:\n  - id: child\n    workflow: child.yaml\n  - id: gate\n    approval: \"Go on?\"\n",
    )
    .unwrap();
    std::fs::write(
        srv.path().join("child.yaml"),
        "name: child\nnodes:\n  - id: pick\n    ask: \"Which size?\"\n    schema: { type: integer, minimum: 1, maximum: 5 }\n  - id: big_gate\n    needs: [pick]\n    approval: \"Size {{ nodes.pick.output }} ok?\"\n",
    )
    .unwrap();
    std::fs::write(
        srv.path().join("broken.yaml"),
        "name: broken\nnodes:\n  - id: boom\n    command: [\"false\"]\n",
    )
    .unwrap();
    expect_code(
        &cairn(
            srv.path(),
            &["run", "asks.yaml", "--run-id", "r1", "--exit-on-wait"],
        ),
        3,
    );
    let port = free_port();
    let mut server = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .current_dir(srv.path())
        .args(["--store", ".cairn/cairn.db", "serve", "--addr"])
        .arg(format!("127.0.0.1:{port}"))
        .args(["--workflows", "."])
        .env("CAIRN_TOKEN", "s3cret-token")
        .env_remove("CAIRN_LOG_DIR")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_until("the server", || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    let here = tempfile::tempdir().unwrap();
    std::fs::write(
        here.path().join(".cairn.toml"),
        format!(
            "profile = \"prod\"\n[profiles.prod]\nserver = \"http://127.0.0.1:{port}\"\ntoken_env = \"CAIRN_TEST_PROD_TOKEN\"\n"
        ),
    )
    .unwrap();
    let tok = Some("s3cret-token");

    let runs = cli(here.path(), &["runs", "--json"], tok);
    expect_code(&runs, 0);
    assert_eq!(json(&runs)["runs"][0]["runId"], "r1");
    // The one open question needs no id; the answer's JSON is the API's.
    wait_until("the server's resume of r1", || {
        let st = cli(here.path(), &["status", "r1", "--json"], tok);
        json(&st)["questions"]
            .as_object()
            .is_some_and(|q| !q.is_empty())
    });
    let ans = cli(here.path(), &["answer", "r1", "release", "--json"], tok);
    expect_code(&ans, 0);
    assert_eq!(json(&ans)["runId"], "r1");
    wait_until("the gate", || {
        let st = cli(here.path(), &["status", "r1", "--json"], tok);
        json(&st)["status"] == "waiting-approval"
    });
    let dec = cli(here.path(), &["approve", "r1", "gate", "--json"], tok);
    expect_code(&dec, 0);
    assert_eq!(
        json(&dec),
        serde_json::json!({"runId": "r1", "nodeId": "gate", "approved": true})
    );
    wait_until("the end", || {
        let st = cli(here.path(), &["status", "r1", "--json"], tok);
        json(&st)["status"] == "finished"
    });
    expect_code(&cli(here.path(), &["scores", "--json"], tok), 0);

    // `cairn run` through the server: it starts a workflow of the server's
    // folder by name and shows the run to its end, with a local run's
    // exit codes; the commands it suggests go through the server too.
    let url = format!("http://127.0.0.1:{port}");
    let done = cli(here.path(), &["run", "done", "--run-id", "r3"], tok);
    expect_code(&done, 0);
    let said = String::from_utf8_lossy(&done.stdout);
    assert!(said.contains("run r3 finished"), "{said}");
    assert!(said.contains("output: shipped"), "{said}");
    let lines = cli(here.path(), &["run", "done.yaml", "--json"], tok);
    expect_code(&lines, 0);
    let events: Vec<Value> = String::from_utf8_lossy(&lines.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(events.first().unwrap()["type"], "RunStarted");
    assert_eq!(events.last().unwrap()["type"], "RunFinished");
    let failed = cli(here.path(), &["run", "broken"], tok);
    expect_code(&failed, 1);
    assert!(String::from_utf8_lossy(&failed.stdout).contains("failed"));
    let waits = cli(
        here.path(),
        &["run", "asks", "--run-id", "r4", "--exit-on-wait"],
        tok,
    );
    expect_code(&waits, 3);
    let said = String::from_utf8_lossy(&waits.stdout);
    assert!(
        said.contains("cairn answer r4 ") && said.contains(&format!("--server {url}")),
        "{said}"
    );
    // The run stays the server's: answered, it goes on without a resume.
    expect_code(&cli(here.path(), &["answer", "r4", "main"], tok), 0);
    wait_until("r4's gate", || {
        let st = cli(here.path(), &["status", "r4", "--json"], tok);
        json(&st)["status"] == "waiting-approval"
    });
    // A question and an approval inside a child run, answered and decided
    // on the parent through the server, with no id copied.
    let parent = cli(
        here.path(),
        &["run", "parent", "--run-id", "p1", "--exit-on-wait"],
        tok,
    );
    expect_code(&parent, 3);
    wait_until("the child's question", || {
        let st = cli(here.path(), &["status", "p1"], tok);
        String::from_utf8_lossy(&st.stdout).contains("pick (in child run p1.")
    });
    let shown = cli(here.path(), &["status", "p1"], tok);
    let shown = String::from_utf8_lossy(&shown.stdout).into_owned();
    assert!(shown.contains("gate waits for approval: Go on?"), "{shown}");
    assert!(shown.contains("integer from 1 to 5"), "{shown}");
    // The commands it shows go to the same server.
    assert!(
        shown.contains(&format!("cairn answer p1 '<answer>' --server {url}")),
        "{shown}"
    );
    let ok = cli(here.path(), &["answer", "p1", "3"], tok);
    expect_code(&ok, 0);
    assert!(
        String::from_utf8_lossy(&ok.stdout).contains("of child run p1."),
        "{}",
        String::from_utf8_lossy(&ok.stdout)
    );
    wait_until("the child's gate", || {
        let st = cli(here.path(), &["status", "p1"], tok);
        String::from_utf8_lossy(&st.stdout).contains("big_gate (in child run")
    });
    let ok = cli(here.path(), &["approve", "p1", "big_gate"], tok);
    expect_code(&ok, 0);
    assert!(String::from_utf8_lossy(&ok.stdout).contains("of child run"));
    expect_code(&cli(here.path(), &["approve", "p1", "gate"], tok), 0);
    wait_until("p1's end", || {
        let st = cli(here.path(), &["status", "p1", "--json"], tok);
        json(&st)["status"] == "finished"
    });

    // The server runs only the workflows of its folder; bad flags and an
    // id in use are bad input.
    for bad in [
        &["run", "../asks.yaml"][..],
        &["run", "/etc/passwd"],
        &["run", "nope"],
        &["run", "done", "--watch"],
        &["run", "done", "--input", "{"],
        &["run", "done", "--run-id", "r3"],
    ] {
        let out = cli(here.path(), bad, tok);
        expect_code(&out, 4);
    }

    // What needs a store says so; a bad token, a missing token variable
    // and an unknown profile are bad input.
    let gc = cli(here.path(), &["gc", "--older-than", "1d"], tok);
    expect_code(&gc, 4);
    assert!(String::from_utf8_lossy(&gc.stderr).contains("works on a store"));
    expect_code(&cli(here.path(), &["runs"], Some("wrong")), 4);
    let unset = cli(here.path(), &["runs"], None);
    expect_code(&unset, 4);
    assert!(String::from_utf8_lossy(&unset.stderr).contains("CAIRN_TEST_PROD_TOKEN"));
    expect_code(&cli(here.path(), &["--profile", "nope", "runs"], tok), 4);
    // The command line wins over the profile: a store here.
    let local = cli(
        here.path(),
        &["--store", ".cairn/cairn.db", "runs", "--json"],
        tok,
    );
    expect_code(&local, 0);
    assert_eq!(json(&local)["runs"], serde_json::json!([]));

    // SAFETY: signalling the server this test started.
    unsafe { libc::kill(server.id() as i32, libc::SIGTERM) };
    wait_exit(&mut server);
}

#[test]
fn validate_and_doctor_say_it_as_one_object() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ok.yaml"), ASKS).unwrap();
    std::fs::write(
        dir.path().join("bad.yaml"),
        "name: bad\nnodes:\n  - id: a\n    value: \"{{ nodes.b.output }}\"\n",
    )
    .unwrap();
    let ok = cli(dir.path(), &["validate", "ok.yaml", "--json"], None);
    expect_code(&ok, 0);
    assert_eq!(
        json(&ok),
        serde_json::json!({"ok": true, "workflow": "asks", "nodes": 2, "childWorkflows": 0})
    );
    let bad = cli(dir.path(), &["validate", "bad.yaml", "--json"], None);
    expect_code(&bad, 4);
    let v = json(&bad);
    assert_eq!(v["ok"], false);
    assert_eq!(v["problems"][0]["line"], 4);
    assert_eq!(v["problems"][0]["field"], "nodes[0].value");
    let doc = cli(dir.path(), &["doctor", "--json"], None);
    let v = json(&doc);
    assert!(v["sandboxOk"].is_boolean() && v["checks"].as_array().is_some_and(|c| !c.is_empty()));
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A person at another machine reverts and forks a run of the server's:
/// the files are put back on the server's machine, conflicts are refused
/// with the plan shown (exit 5) as a local revert refuses them, and the
/// fork is made and driven by the server and shown here to its end.
#[test]
fn revert_and_fork_go_through_a_server() {
    let srv = tempfile::tempdir().unwrap();
    let root = srv.path();
    std::fs::write(root.join("pipe.yaml"), PIPE).unwrap();
    // Another workflow of the server's folder, for a fork that changes it.
    std::fs::write(
        root.join("pipe2.yaml"),
        PIPE.replace(
            "{{ nodes.fetch.output }}{{ nodes.build.output }}",
            "v2-{{ nodes.build.output }}",
        ),
    )
    .unwrap();
    let orig = cairn(
        root,
        &[
            "run",
            "pipe.yaml",
            "--run-id",
            "orig",
            "--input",
            r#"{"x":1}"#,
        ],
    );
    expect_code(&orig, 0);
    let read = |name: &str| std::fs::read_to_string(root.join(name)).unwrap_or_default();
    assert_eq!(read("build.txt"), "built-1\n");
    let port = free_port();
    let mut server = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .current_dir(root)
        .args(["--store", ".cairn/cairn.db", "serve", "--addr"])
        .arg(format!("127.0.0.1:{port}"))
        .args(["--workflows", "."])
        .env_remove("CAIRN_TOKEN")
        .env_remove("CAIRN_LOG_DIR")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_until("the server", || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    let url = format!("http://127.0.0.1:{port}");
    let here = tempfile::tempdir().unwrap();
    let at = |args: &[&str]| {
        let mut all = vec!["--server", url.as_str()];
        all.extend_from_slice(args);
        cli(here.path(), &all, None)
    };

    // The plan, as the API answers it; nothing touched.
    let plan = at(&["revert", "orig", "build", "--dry-run", "--json"]);
    expect_code(&plan, 0);
    let plan = json(&plan);
    assert_eq!(plan["dryRun"], true, "{plan}");
    assert_eq!(plan["applied"], false, "{plan}");
    assert_eq!(plan["remove"], serde_json::json!(["build.txt"]), "{plan}");
    assert_eq!(read("build.txt"), "built-1\n");

    // Something on the server's machine changed the file since: refused,
    // the conflict shown, nothing done.
    std::fs::write(root.join("build.txt"), "edited by hand\n").unwrap();
    let refused = at(&["revert", "orig", "build"]);
    expect_code(&refused, 5);
    let said = text(&refused);
    assert!(said.contains("conflict build.txt"), "{said}");
    assert!(said.contains("--force"), "{said}");
    assert_eq!(read("build.txt"), "edited by hand\n");
    let refused = at(&["revert", "orig", "build", "--json"]);
    expect_code(&refused, 5);
    assert_eq!(json(&refused)["conflicts"][0]["path"], "build.txt");

    // Forced: put back as it was before `build` (it did not exist).
    let done = at(&["revert", "orig", "build", "--force", "--json"]);
    expect_code(&done, 0);
    let done = json(&done);
    assert_eq!(done["applied"], true, "{done}");
    assert_eq!(done["removed"], 1, "{done}");
    assert!(!root.join("build.txt").exists());

    // A fork at `build` with another input: made and driven by the server,
    // shown here to its end; `fetch` is not run again.
    let fork = at(&[
        "fork",
        "orig",
        "--at",
        "build",
        "--input",
        r#"{"x":2}"#,
        "--run-id",
        "f1",
    ]);
    expect_code(&fork, 0);
    let said = text(&fork);
    assert!(said.contains("forked run f1 from orig at seq"), "{said}");
    assert!(said.contains("run f1 finished"), "{said}");
    assert!(said.contains("output: FB2"), "{said}");
    assert!(
        !said
            .lines()
            .any(|l| l.contains("fetch") && l.contains("attempt")),
        "the copied part is not shown: {said}"
    );
    assert_eq!(read("build.txt"), "built-2\n");
    assert_eq!(read("fetch.txt"), "fetched\n");

    // A fork of the fork, with a workflow of the server's folder, by name;
    // as NDJSON, only its own events. (`orig` is not forked at `join`:
    // its revert deleted build.txt and `f1` made it since, a conflict.)
    let fork = at(&[
        "fork",
        "f1",
        "--at",
        "join",
        "--workflow",
        "pipe2",
        "--run-id",
        "f2",
        "--json",
    ]);
    expect_code(&fork, 0);
    let events: Vec<Value> = String::from_utf8_lossy(&fork.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(events.last().unwrap()["type"], "RunFinished");
    assert_eq!(events.last().unwrap()["output"], "v2-B2");
    // The copied log (its first event at seq 1) is not shown again: the
    // first shown is the fork's own start.
    assert_eq!(events[0]["type"], "RunStarted");
    assert_eq!(events[0]["resumed"], true, "{}", events[0]);
    assert!(events[0]["seq"].as_u64().unwrap() > 1, "{}", events[0]);

    // A dry run answers as the API does and makes no run.
    let dry = at(&["fork", "f1", "--at", "build", "--dry-run", "--json"]);
    expect_code(&dry, 0);
    let dry = json(&dry);
    assert_eq!(dry["made"], false, "{dry}");
    assert_eq!(dry["runId"], Value::Null, "{dry}");
    assert_eq!(dry["from"], "f1", "{dry}");

    // Bad input is exit 4, with the server's reason.
    for bad in [
        &["fork", "nope", "--at", "1"][..],
        &["fork", "orig", "--at", "no_such_node"],
        &["fork", "orig", "--at", "build", "--watch"],
        &[
            "fork",
            "orig",
            "--at",
            "build",
            "--workflow",
            "../pipe.yaml",
        ],
        &["fork", "f1", "--at", "build", "--run-id", "f2"],
        &["revert", "orig", "no_such_node"],
        &["revert", "nope", "build"],
    ] {
        let out = at(bad);
        expect_code(&out, 4);
    }

    // SAFETY: signalling the server this test started.
    unsafe { libc::kill(server.id() as i32, libc::SIGTERM) };
    wait_exit(&mut server);
}
