//! A new user's trip, as a test: the README's tour through the real
//! binary, in a copy of the examples (runs write their files there), then
//! the daily-use features the README points at: a failure handler and a
//! branch, a question answered without its id, validate catching a typo,
//! a starter project.

mod common;
use common::*;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// `cairn` in `dir`, no store or server from the environment: the store
/// is found as the README says (`.cairn/` here).
fn cairn_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cairn"))
        .current_dir(dir)
        .args(args)
        .env_remove("CAIRN_STORE")
        .env_remove("CAIRN_SERVER")
        .env_remove("CAIRN_TOKEN")
        .env_remove("CAIRN_PROFILE")
        .env_remove("CAIRN_LOG_DIR")
        .env("XDG_CONFIG_HOME", dir.join(".no-user-config"))
        .stdin(Stdio::null())
        .output()
        .expect("run cairn")
}

fn says(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target: PathBuf = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

#[test]
fn the_readme_tour_then_daily_use() {
    let home = tempfile::tempdir().unwrap();
    let here = home.path();
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    copy_dir(&examples, &here.join("examples"));

    // The README's first command.
    let hello = cairn_in(here, &["run", "examples/hello.yaml"]);
    expect_code(&hello, 0);

    // The tour.
    let v = cairn_in(here, &["validate", "examples/triage.yaml"]);
    expect_code(&v, 0);
    assert!(says(&v).contains("ok: triage (6 nodes)"), "{}", says(&v));
    let g = cairn_in(here, &["graph", "examples/triage.yaml"]);
    expect_code(&g, 0);
    assert!(says(&g).starts_with("flowchart"), "{}", says(&g));
    expect_code(
        &cairn_in(
            here,
            &[
                "run",
                "examples/triage.yaml",
                "--run-id",
                "demo",
                "--exit-on-wait",
            ],
        ),
        3,
    );
    let st = cairn_in(here, &["status", "demo"]);
    assert!(
        says(&st).contains("cairn approve demo publish_gate"),
        "{}",
        says(&st)
    );
    expect_code(
        &cairn_in(
            here,
            &["approve", "demo", "publish_gate", "--note", "looks right"],
        ),
        0,
    );
    expect_code(&cairn_in(here, &["resume", "demo"]), 0);
    expect_code(&cairn_in(here, &["status", "demo"]), 0);
    let logs = cairn_in(here, &["logs", "demo", "--type", "NodeFinished"]);
    expect_code(&logs, 0);
    assert!(says(&logs).contains("NodeFinished"));
    expect_code(&cairn_in(here, &["run", "examples/tools.yaml"]), 0);
    // The agent asks once: elsewhere than a terminal the run waits for the
    // answer, which needs no id.
    expect_code(
        &cairn_in(
            here,
            &[
                "run",
                "examples/agent/agent.yaml",
                "--run-id",
                "ag",
                "--exit-on-wait",
            ],
        ),
        3,
    );
    let asked = cairn_in(here, &["status", "ag"]);
    assert!(says(&asked).contains("asks:"), "{}", says(&asked));
    expect_code(&cairn_in(here, &["answer", "ag", "yes"]), 0);
    expect_code(&cairn_in(here, &["resume", "ag"]), 0);
    // The agent's activity says what each action was about, and why.
    let story = cairn_in(here, &["activity", "ag"]);
    expect_code(&story, 0);
    for told in [
        "Read work/README.md (fix)",
        "Searched for `Helo` in work (fix)",
        "why: The task names the file; the README may say how it is run.",
    ] {
        assert!(says(&story).contains(told), "{told}: {}", says(&story));
    }
    expect_code(
        &cairn_in(
            here,
            &["run", "examples/team/team.yaml", "--run-id", "team"],
        ),
        0,
    );
    let act = cairn_in(here, &["activity", "team"]);
    expect_code(&act, 0);
    let runs = cairn_in(here, &["runs"]);
    expect_code(&runs, 0);
    for run in ["demo", "ag", "team"] {
        assert!(says(&runs).contains(run), "{}", says(&runs));
    }
    let doctor = cairn_in(here, &["doctor"]);
    assert!(
        matches!(doctor.status.code(), Some(0 | 1)),
        "{}",
        says(&doctor)
    );

    // From a subfolder, the same store.
    let sub = here.join("examples/team");
    assert!(says(&cairn_in(&sub, &["runs"])).contains("demo"));

    // Daily use: a branch and its failure handlers.
    let bug = cairn_in(
        here,
        &[
            "run",
            "examples/route.yaml",
            "--run-id",
            "b1",
            "--input",
            r#"{"kind": "bug"}"#,
        ],
    );
    expect_code(&bug, 0);
    let broke = cairn_in(
        here,
        &[
            "run",
            "examples/route.yaml",
            "--run-id",
            "b2",
            "--input",
            r#"{"kind": "bug", "break": true}"#,
        ],
    );
    expect_code(&broke, 1);
    let st = says(&cairn_in(here, &["status", "b2"]));
    assert!(st.contains("branch route chose bug"), "{st}");
    assert!(st.contains("fix failed:"), "{st}");
    // A typo is caught before anything runs, with its place and a hint.
    std::fs::write(
        here.join("typo.yaml"),
        "name: typo\nnodes:\n  - id: a\n    value: 1\n  - id: b\n    needs: [a]\n    value: \"{{ nodes.a.outptu }}\"\n",
    )
    .unwrap();
    let typo = cairn_in(here, &["run", "typo.yaml"]);
    expect_code(&typo, 4);
    assert!(says(&typo).contains("typo.yaml:7:"), "{}", says(&typo));
    assert!(
        says(&typo).contains("did you mean `output`?"),
        "{}",
        says(&typo)
    );

    // A starter project of one's own.
    let mine = here.join("mine");
    std::fs::create_dir(&mine).unwrap();
    expect_code(&cairn_in(&mine, &["init"]), 0);
    expect_code(&cairn_in(&mine, &["run", "workflow.yaml"]), 0);
}
