//! Workspace snapshots and revert with the real binary: an agent's edits
//! (write, edit, bash) undone by `cairn revert` byte for byte with the
//! user's own git repository untouched, `on_retry: revert` giving each
//! retry the files the first attempt had, what `cairn revert` refuses, and
//! a revert killed with SIGKILL half-way that the next `cairn revert`
//! finishes, leaving the files exactly as the snapshot has them; and that
//! a revert touches only what the run changed: another process's files
//! survive it, a file both changed is a conflict (exit 5, `--force`
//! overwrites), `--dry-run` prints the plan and changes nothing, and an
//! `on_retry: revert` leaves another process's file alone (and fails the
//! retry rather than overwrite one the attempt changed too).

mod common;
use common::*;

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use cairn_events::EventKind;

/// Every file, link and folder under `root` with what it holds, leaving out
/// Cairn's store and the tests' own files (and `.git` unless asked).
fn picture(root: &Path, with_git: bool) -> BTreeMap<String, String> {
    fn walk(dir: &Path, rel: &str, with_git: bool, out: &mut BTreeMap<String, String>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            if rel.is_empty() && (name == ".cairn" || name == "sessions.err") {
                continue;
            }
            if name == ".git" && !with_git {
                continue;
            }
            let rel = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            let m = std::fs::symlink_metadata(e.path()).unwrap();
            if m.is_symlink() {
                out.insert(
                    rel,
                    format!("link {:?}", std::fs::read_link(e.path()).unwrap()),
                );
            } else if m.is_dir() {
                out.insert(rel.clone(), "dir".into());
                walk(&e.path(), &rel, with_git, out);
            } else {
                let x = m.permissions().mode() & 0o111 != 0;
                let bytes = std::fs::read(e.path()).unwrap();
                out.insert(rel, format!("x={x} {:?}", String::from_utf8_lossy(&bytes)));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, "", with_git, &mut out);
    out
}

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .current_dir(dir)
        .args(args)
        .env("GIT_AUTHOR_NAME", "t")
        .env("GIT_AUTHOR_EMAIL", "t@example.com")
        .env("GIT_COMMITTER_NAME", "t")
        .env("GIT_COMMITTER_EMAIL", "t@example.com")
        .output()
        .expect("run git");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

const AGENT: &str = r#"
name: edits
models:
  m: { provider: scripted, script: turns.yaml }
nodes:
  - id: fix
    agent:
      model: m
      prompt: Tidy the project.
      tools: [read, write, edit, bash]
  - id: after
    needs: [fix]
    command: ["sh", "-c", "echo after >> notes.txt"]
"#;

const TURNS: &str = r#"
turns:
  - text: Writing, editing and deleting.
    tool_calls:
      - { name: write, args: { path: src/new.rs, content: "fn new() {}\n" } }
      - name: edit
        args:
          path: src/lib.rs
          patch: |
            @@ -1,1 +1,1 @@
            -pub fn old() {}
            +pub fn renamed() {}
      - { name: bash, args: { argv: ["sh", "-c", "rm README.md && mkdir -p build/out && echo obj > build/out/a.o && chmod +x run.sh && printf 'more\\n' >> notes.txt"] } }
  - text: Done.
"#;

#[test]
fn revert_undoes_an_agents_edits_and_leaves_the_users_git_alone() {
    if Command::new("git").arg("--version").output().is_err() {
        eprintln!("SKIPPED revert_undoes_an_agents_edits: no `git` program on this machine");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::create_dir_all(dir.join("src")).unwrap();
    std::fs::write(dir.join("src/lib.rs"), "pub fn old() {}\n").unwrap();
    std::fs::write(dir.join("README.md"), "# project\n").unwrap();
    std::fs::write(dir.join("run.sh"), "echo run\n").unwrap();
    std::fs::write(dir.join("notes.txt"), "notes\n").unwrap();
    std::fs::write(dir.join("edits.yaml"), AGENT).unwrap();
    std::fs::write(dir.join("turns.yaml"), TURNS).unwrap();
    std::fs::write(dir.join(".gitignore"), ".cairn/\nsessions.err\n").unwrap();
    git(dir, &["init", "-q", "-b", "main"]);
    git(dir, &["add", "src", "README.md", "notes.txt", ".gitignore"]);
    git(dir, &["commit", "-q", "-m", "start"]);
    // The user has work of their own staged and not: none of it is Cairn's.
    std::fs::write(dir.join("notes.txt"), "notes\nunstaged line\n").unwrap();
    git(dir, &["add", "run.sh"]);
    let before = picture(dir, false);
    let git_before = picture(&dir.join(".git"), true);
    let status_before = git(dir, &["status", "--porcelain"]);

    let out = cairn(dir, &["run", "edits.yaml", "--run-id", "r1"]);
    expect_code(&out, 0);
    let after_run = picture(dir, false);
    assert!(after_run.contains_key("src/new.rs") && !after_run.contains_key("README.md"));
    assert_ne!(after_run, before);

    // Both file-changing nodes got a snapshot, in their NodeStarted.
    let evs = events(dir, "r1");
    let snaps: Vec<(&str, &str)> = evs
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::NodeStarted { snapshot: Some(s) } => {
                Some((e.scope.node_id.as_deref().unwrap(), s.as_str()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(snaps.len(), 2, "{snaps:?}");
    // The snapshot is a git tree in Cairn's own repository.
    let listing = git(
        dir,
        &[
            "--git-dir",
            ".cairn/snapshots",
            "ls-tree",
            "-r",
            "--name-only",
            snaps[0].1,
        ],
    );
    assert!(listing.lines().any(|l| l == "README.md"), "{listing}");
    assert!(
        !listing.contains(".cairn") && !listing.contains(".git/"),
        "{listing}"
    );

    let out = cairn(dir, &["revert", "r1", "fix"]);
    expect_code(&out, 0);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains(snaps[0].1), "{said}");
    assert_eq!(
        picture(dir, false),
        before,
        "files byte-identical to before the agent"
    );
    assert_eq!(
        picture(&dir.join(".git"), true),
        git_before,
        "the user's .git untouched"
    );
    assert_eq!(git(dir, &["status", "--porcelain"]), status_before);

    // The revert is in the log after the run's end, and the log still
    // keeps the contract.
    let evs = events(dir, "r1");
    let n = evs.len();
    assert!(
        matches!(&evs[n - 2].kind, EventKind::RevertStarted { snapshot } if snapshot == snaps[0].1)
    );
    assert!(matches!(
        &evs[n - 1].kind,
        EventKind::RevertFinished { success: true, .. }
    ));
    assert_eq!(evs[n - 1].scope.node_id.as_deref(), Some("fix"));
    assert_eq!(evs[n - 1].scope.attempt, Some(1));

    // The "before" snapshot it printed puts the agent's work back.
    let before_id = said
        .lines()
        .find_map(|l| l.strip_prefix("the files as they were before this revert are snapshot "))
        .expect("the undo snapshot is said");
    let out = Command::new("git")
        .current_dir(dir)
        .args(["--git-dir", ".cairn/snapshots", "cat-file", "-p"])
        .arg(format!("{before_id}:src/new.rs"))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "fn new() {}\n");
}

#[test]
fn revert_refuses_what_it_cannot_do() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::write(
        dir.join("w.yaml"),
        "name: w\nnodes:\n  - id: v\n    value: 1\n  - id: c\n    needs: [v]\n    command: [\"true\"]\n",
    )
    .unwrap();
    assert_eq!(
        cairn(dir, &["run", "w.yaml", "--run-id", "r"])
            .status
            .code(),
        Some(0)
    );
    for (args, says) in [
        (&["revert", "nope", "c"][..], "no run `nope`"),
        (&["revert", "r", "missing"], "no node `missing`"),
        (&["revert", "r", "v"], "no workspace snapshot"),
        (
            &["revert", "r", "c", "--attempt", "2"],
            "no snapshot before attempt 2",
        ),
        (&["revert", "r", "c", "--iteration", "3"], "no pass 3"),
    ] {
        let out = cairn(dir, args);
        assert_eq!(out.status.code(), Some(4), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{args:?}: {err}");
    }
    // Nothing was logged by the refusals.
    assert!(!events(dir, "r")
        .iter()
        .any(|e| matches!(e.kind, EventKind::RevertStarted { .. })));
}

#[test]
fn a_run_that_is_being_driven_is_not_reverted() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::write(
        dir.join("w.yaml"),
        "name: w\nnodes:\n  - id: c\n    command: [\"sh\", \"-c\", \"echo x > f; sleep 30\"]\n",
    )
    .unwrap();
    let mut run = cairn_session(dir, &["run", "w.yaml", "--run-id", "busy"]);
    let t0 = Instant::now();
    while !dir.join("f").exists() {
        assert!(t0.elapsed() < PATIENCE, "the node never ran");
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = cairn(dir, &["revert", "busy", "c"]);
    let _ = run.kill();
    wait_exit(&mut run);
    assert_eq!(out.status.code(), Some(4));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("being driven by another process"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(dir.join("f").exists(), "nothing was reverted");
}

/// A node that appends a line and fails until the file has three lines.
const RETRIED: &str = r#"
name: retried
nodes:
  - id: flaky
    retry: { attempts: 3, delay: 10ms }
    on_retry: POLICY
    command: ["sh", "-c", "echo try >> tries.txt; [ $(wc -l < tries.txt) -ge 3 ]"]
"#;

#[test]
fn on_retry_revert_gives_every_retry_the_files_the_first_attempt_had() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    // Kept: the third attempt sees the lines of the two before it.
    std::fs::write(dir.join("keep.yaml"), RETRIED.replace("POLICY", "keep")).unwrap();
    let out = cairn(dir, &["run", "keep.yaml", "--run-id", "keep"]);
    expect_code(&out, 0);
    assert_eq!(
        std::fs::read_to_string(dir.join("tries.txt")).unwrap(),
        "try\ntry\ntry\n"
    );
    std::fs::remove_file(dir.join("tries.txt")).unwrap();

    // Reverted: every attempt starts with no tries.txt, so none passes.
    std::fs::write(dir.join("revert.yaml"), RETRIED.replace("POLICY", "revert")).unwrap();
    let out = cairn(dir, &["run", "revert.yaml", "--run-id", "rev"]);
    expect_code(&out, 1);
    assert_eq!(
        std::fs::read_to_string(dir.join("tries.txt")).unwrap(),
        "try\n"
    );
    let evs = events(dir, "rev");
    // Before attempts 2 and 3: the snapshot of the attempt that failed,
    // restored, then the next attempt starts.
    let seq: Vec<String> = evs
        .iter()
        .filter(|e| e.scope.node_id.as_deref() == Some("flaky"))
        .filter_map(|e| {
            let a = e.scope.attempt?;
            Some(match &e.kind {
                EventKind::NodeStarted { snapshot } => {
                    assert!(snapshot.is_some(), "attempt {a} has a snapshot");
                    format!("start{a}")
                }
                EventKind::NodeFailed { .. } => format!("fail{a}"),
                EventKind::NodeRetrying { .. } => format!("retry{a}"),
                EventKind::RevertStarted { .. } => format!("revert{a}"),
                EventKind::RevertFinished { success, .. } => format!("reverted{a}:{success}"),
                _ => return None,
            })
        })
        .collect();
    assert_eq!(
        seq,
        [
            "start1",
            "fail1",
            "retry2",
            "revert1",
            "reverted1:true",
            "start2",
            "fail2",
            "retry3",
            "revert2",
            "reverted2:true",
            "start3",
            "fail3"
        ]
    );
    // Each attempt started from the same files: one snapshot id for all.
    let ids: std::collections::BTreeSet<&str> = evs
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::NodeStarted { snapshot: Some(s) } => Some(s.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(ids.len(), 1, "{ids:?}");
}

#[test]
fn on_retry_revert_is_refused_where_nothing_changes_files() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::write(
        dir.join("w.yaml"),
        "name: w\nnodes:\n  - id: gate\n    approval: ok?\n    on_retry: revert\n  - id: c\n    command: [\"true\"]\n    on_retry: sometimes\n",
    )
    .unwrap();
    let out = cairn(dir, &["validate", "w.yaml"]);
    assert_eq!(out.status.code(), Some(4));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("w.yaml:5") && err.contains("only `agent`, `command` and `tool`"),
        "{err}"
    );
    assert!(
        err.contains("w.yaml:8") && err.contains("`sometimes` is not an on_retry policy"),
        "{err}"
    );
}

/// How many files the crash test's node rewrites: enough that a restore
/// takes a while to write back.
const MANY: usize = 1500;

/// `data/` with [`MANY`] files, and its picture.
fn many_files(dir: &Path) -> BTreeMap<String, String> {
    std::fs::create_dir_all(dir.join("data")).unwrap();
    for i in 0..MANY {
        std::fs::write(dir.join(format!("data/f{i:05}")), format!("original {i}\n")).unwrap();
    }
    picture(&dir.join("data"), false)
}

#[test]
fn a_revert_killed_half_way_is_finished_by_the_next_one() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let original = many_files(dir);
    std::fs::write(
        dir.join("w.yaml"),
        "name: w\nnodes:\n  - id: scribble\n    command: [\"sh\", \"-c\", \"for f in data/*; do echo scribbled > $f; done; touch data/extra\"]\n",
    )
    .unwrap();
    let out = cairn(dir, &["run", "w.yaml", "--run-id", "big"]);
    expect_code(&out, 0);
    assert!(dir.join("data/extra").exists());

    let mirror = dir.join(".cairn/logs/big/events.ndjson");
    let mut cut_open = 0;
    let mut whole_at_kill = 0;
    for round in 0..5u64 {
        // Scribble again so each round's revert has everything to write.
        for f in std::fs::read_dir(dir.join("data")).unwrap() {
            std::fs::write(f.unwrap().path(), "scribbled\n").unwrap();
        }
        let starts_before = std::fs::read_to_string(&mirror)
            .unwrap()
            .matches("\"RevertStarted\"")
            .count();
        // The test's own scribbling is another process's change to files
        // the run changed (and a revert since put back): forced.
        let mut child = cairn_session(dir, &["revert", "big", "scribble", "--force"]);
        // Killed at a different moment after its RevertStarted each round.
        let t0 = Instant::now();
        loop {
            let text = std::fs::read_to_string(&mirror).unwrap();
            if text.matches("\"RevertStarted\"").count() > starts_before {
                break;
            }
            assert!(t0.elapsed() < PATIENCE, "the revert never started");
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(round * 8));
        let _ = child.kill();
        wait_exit(&mut child);
        let evs = events(dir, "big");
        let open = matches!(evs.last().unwrap().kind, EventKind::RevertStarted { .. });
        cut_open += usize::from(open);
        // Whatever the moment, no file is torn: each is as it was or as
        // the snapshot has it (renames, never writes in place); and the
        // root is whole (all one or all the other) unless the kill fell
        // in the short window of the renames.
        let now = picture(&dir.join("data"), false);
        let scribbled = format!("x=false {:?}", "scribbled\n");
        for (path, v) in &now {
            assert!(
                *v == scribbled || original.get(path) == Some(v),
                "round {round}: {path} is torn: {v}"
            );
        }
        let whole = now == original || now.values().all(|v| *v == scribbled);
        whole_at_kill += usize::from(whole);

        // The next revert finishes the open one, then does its own.
        let out = cairn(dir, &["revert", "big", "scribble", "--force"]);
        expect_code(&out, 0);
        let said = String::from_utf8_lossy(&out.stdout);
        assert_eq!(said.contains("left half-way"), open, "{said}");
        assert!(
            picture(&dir.join("data"), false) == original,
            "round {round}: every file as the snapshot has it"
        );
        // Every revert in the log ended, the open one by the next process.
        let evs = events(dir, "big");
        let starts = evs
            .iter()
            .filter(|e| matches!(e.kind, EventKind::RevertStarted { .. }))
            .count();
        let ends = evs
            .iter()
            .filter(|e| matches!(e.kind, EventKind::RevertFinished { .. }))
            .count();
        assert_eq!(starts, ends, "round {round}");
    }
    eprintln!(
        "{cut_open} of 5 kills landed while the revert was under way; the root was whole at {whole_at_kill}"
    );
    assert!(
        cut_open > 0,
        "no kill landed during a revert: {}",
        sessions_err(dir)
    );
}

#[test]
fn a_resume_finishes_a_retrys_revert_that_a_kill_cut_short() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    // `.git` is left out of snapshots and reverts: the node's own marker
    // of having scribbled once survives the revert.
    std::fs::create_dir_all(dir.join(".git")).unwrap();
    let original = many_files(dir);
    std::fs::write(
        dir.join("w.yaml"),
        r#"name: w
nodes:
  - id: scribble
    retry: { attempts: 2, delay: 10ms }
    on_retry: revert
    command: ["sh", "-c", "[ -e .git/once ] && exit 1; touch .git/once; for f in data/*; do echo scribbled > $f; done; exit 1"]
"#,
    )
    .unwrap();
    let mirror = dir.join(".cairn/logs/rr/events.ndjson");
    let mut run = cairn_session(dir, &["run", "w.yaml", "--run-id", "rr"]);
    let t0 = Instant::now();
    while !std::fs::read_to_string(&mirror)
        .unwrap_or_default()
        .contains("\"RevertStarted\"")
    {
        assert!(t0.elapsed() < PATIENCE, "the retry's revert never started");
        std::thread::sleep(Duration::from_millis(1));
    }
    let _ = run.kill();
    wait_exit(&mut run);
    let evs = events(dir, "rr");
    let open = matches!(evs.last().unwrap().kind, EventKind::RevertStarted { .. });
    eprintln!("the kill cut the revert short: {open}");

    let out = cairn(dir, &["resume", "rr"]);
    expect_code(&out, 1);
    let evs = events(dir, "rr");
    let resumed_at = evs
        .iter()
        .position(|e| matches!(e.kind, EventKind::RunStarted { resumed: true, .. }))
        .expect("resumed");
    if open {
        // The open revert is finished before anything else of the resume.
        assert!(
            matches!(
                evs[resumed_at + 1].kind,
                EventKind::RevertFinished { success: true, .. }
            ),
            "{:?}",
            evs[resumed_at + 1].kind
        );
    }
    let starts = evs
        .iter()
        .filter(|e| matches!(e.kind, EventKind::RevertStarted { .. }))
        .count();
    let ends = evs
        .iter()
        .filter(|e| matches!(e.kind, EventKind::RevertFinished { .. }))
        .count();
    assert_eq!(starts, ends);
    // Attempt 2 did not scribble: the files are the snapshot's.
    assert!(
        picture(&dir.join("data"), false) == original,
        "the files as before attempt 1"
    );
    assert!(evs
        .iter()
        .any(|e| matches!(e.kind, EventKind::NodeStarted { .. }) && e.scope.attempt == Some(2)));
}

#[test]
fn gc_deletes_the_snapshots_no_run_names_any_more() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let wf = |text: &str| {
        format!("name: w\nnodes:\n  - id: c\n    command: [\"sh\", \"-c\", \"echo {text} > out.txt\"]\n")
    };
    std::fs::write(dir.join("a.yaml"), wf("first")).unwrap();
    expect_code(&cairn(dir, &["run", "a.yaml", "--run-id", "old"]), 0);
    let objects = || walk_count(&dir.join(".cairn/snapshots/objects"));
    let after_old = objects();
    // A gc that keeps every run keeps every object its logs name.
    let out = cairn(dir, &["gc", "--older-than", "7d", "--snapshot-grace", "0s"]);
    expect_code(&out, 0);
    assert_eq!(objects(), after_old);
    // The run goes; then its snapshots (the root's current files stay,
    // as its stat cache names them).
    std::fs::write(dir.join("out.txt"), "edited since\n").unwrap();
    std::fs::write(dir.join("b.yaml"), wf("second")).unwrap();
    expect_code(&cairn(dir, &["run", "b.yaml", "--run-id", "new"]), 0);
    let out = cairn(dir, &["gc", "--older-than", "0s", "--snapshot-grace", "0s"]);
    expect_code(&out, 0);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("deleted 2 runs"), "{said}");
    assert!(said.contains("workspace snapshot object"), "{said}");
    assert!(objects() < after_old, "{said}");
    // Within the grace period, nothing is pruned.
    expect_code(&cairn(dir, &["run", "a.yaml", "--run-id", "again"]), 0);
    let before = objects();
    std::fs::remove_dir_all(dir.join(".cairn/logs")).unwrap();
    let out = cairn(dir, &["gc", "--older-than", "0s"]);
    expect_code(&out, 0);
    assert_eq!(objects(), before);
}

fn walk_count(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .map(|r| {
            r.flatten()
                .map(|e| {
                    if e.path().is_dir() {
                        walk_count(&e.path())
                    } else {
                        1
                    }
                })
                .sum()
        })
        .unwrap_or(0)
}

/// A node that appends to the file the project has and makes one.
const EDITS: &str = r#"
name: edits
nodes:
  - id: edit
    command: ["sh", "-c", "echo run >> a.txt; echo new > made.txt; mkdir -p out/deep && echo o > out/deep/o.txt"]
"#;

#[test]
fn a_revert_touches_only_what_the_run_changed() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::write(dir.join("w.yaml"), EDITS).unwrap();
    std::fs::write(dir.join("a.txt"), "mine\n").unwrap();
    std::fs::write(dir.join("keep.txt"), "kept\n").unwrap();
    let before = picture(dir, false);
    expect_code(&cairn(dir, &["run", "w.yaml", "--run-id", "r"]), 0);
    // Another process, after the run: a file of its own made, a file the
    // run never touched changed, a folder of its own beside the run's.
    std::fs::write(dir.join("other.txt"), "another process\n").unwrap();
    std::fs::write(dir.join("keep.txt"), "changed by another\n").unwrap();
    std::fs::create_dir_all(dir.join("out/theirs")).unwrap();
    std::fs::write(dir.join("out/theirs/t.txt"), "theirs\n").unwrap();
    let after = picture(dir, false);

    // The dry run prints the plan and changes nothing.
    let out = cairn(dir, &["revert", "r", "edit", "--dry-run"]);
    expect_code(&out, 0);
    let said = String::from_utf8_lossy(&out.stdout);
    for line in [
        "write   a.txt",
        "remove  made.txt",
        "remove  out/deep/o.txt",
    ] {
        assert!(said.contains(line), "{line}: {said}");
    }
    assert!(
        !said.contains("other.txt") && !said.contains("keep.txt"),
        "{said}"
    );
    let out = cairn(dir, &["revert", "r", "edit", "--dry-run", "--json"]);
    expect_code(&out, 0);
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(plan["write"], serde_json::json!(["a.txt"]), "{plan}");
    assert_eq!(
        plan["remove"],
        serde_json::json!(["made.txt", "out/deep/o.txt"]),
        "{plan}"
    );
    assert_eq!(plan["applied"], false);
    assert_eq!(picture(dir, false), after, "a dry run changes nothing");
    assert!(!events(dir, "r")
        .iter()
        .any(|e| matches!(e.kind, EventKind::RevertStarted { .. })));

    // The revert: the run's changes undone, the other process's kept.
    let out = cairn(dir, &["revert", "r", "edit"]);
    expect_code(&out, 0);
    let now = picture(dir, false);
    let mut want = before.clone();
    want.insert("other.txt".into(), after["other.txt"].clone());
    want.insert("keep.txt".into(), after["keep.txt"].clone());
    for p in ["out", "out/theirs", "out/theirs/t.txt"] {
        want.insert(p.into(), after[p].clone());
    }
    assert_eq!(now, want, "only the run's changes undone");
}

#[test]
fn a_path_both_changed_is_a_conflict_that_force_overwrites() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::write(dir.join("w.yaml"), EDITS).unwrap();
    std::fs::write(dir.join("a.txt"), "mine\n").unwrap();
    expect_code(&cairn(dir, &["run", "w.yaml", "--run-id", "r"]), 0);
    // Another process edits the file the run appended to, and deletes the
    // one the run made.
    std::fs::write(dir.join("a.txt"), "mine\nrun\ntheirs\n").unwrap();
    std::fs::remove_file(dir.join("made.txt")).unwrap();
    let after = picture(dir, false);

    for args in [
        &["revert", "r", "edit"][..],
        &["revert", "r", "edit", "--dry-run"],
    ] {
        let out = cairn(dir, args);
        expect_code(&out, 5);
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            said.contains(
                "conflict a.txt: the run left a file, and something else changed it since"
            ),
            "{args:?}: {said}"
        );
        // made.txt is gone already, as the point has it: no conflict.
        assert!(!said.contains("made.txt"), "{said}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("1 path(s)") && err.contains("--force"),
            "{err}"
        );
        assert_eq!(picture(dir, false), after, "{args:?}: nothing touched");
    }
    assert!(!events(dir, "r")
        .iter()
        .any(|e| matches!(e.kind, EventKind::RevertStarted { .. })));

    let out = cairn(dir, &["revert", "r", "edit", "--force"]);
    expect_code(&out, 0);
    assert!(String::from_utf8_lossy(&out.stdout).contains("overwrote (--force) a.txt"));
    assert_eq!(
        std::fs::read_to_string(dir.join("a.txt")).unwrap(),
        "mine\n"
    );
    assert!(!dir.join("out").exists());
}

/// Fails its first attempt after writing; the retry waits long enough for
/// another process to write in between.
const RETRY_WAITS: &str = r#"
name: w
nodes:
  - id: flaky
    retry: { attempts: 2, delay: 2s }
    on_retry: revert
    command: ["sh", "-c", "if [ -e tried.txt ]; then cat tried.txt; exit 0; fi; echo first > tried.txt; exit 1"]
"#;

/// Runs RETRY_WAITS, calling `meanwhile` once the first attempt failed.
fn run_retrying(dir: &Path, run: &str, meanwhile: impl FnOnce()) -> std::process::Output {
    std::fs::write(dir.join("w.yaml"), RETRY_WAITS).unwrap();
    let mirror = dir.join(format!(".cairn/logs/{run}/events.ndjson"));
    let child = cairn_session(dir, &["run", "w.yaml", "--run-id", run]);
    wait_until("the first attempt failed", || {
        std::fs::read_to_string(&mirror)
            .unwrap_or_default()
            .contains("\"NodeRetrying\"")
    });
    meanwhile();
    child.wait_with_output().unwrap()
}

#[test]
fn on_retry_revert_leaves_another_processs_file_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let out = run_retrying(dir, "r", || {
        std::fs::write(dir.join("other.txt"), "another process\n").unwrap();
    });
    // The retry started without tried.txt (reverted) and failed again
    // the same way; the other process's file is as it wrote it.
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        std::fs::read_to_string(dir.join("other.txt")).unwrap(),
        "another process\n"
    );
    let evs = events(dir, "r");
    assert!(evs
        .iter()
        .any(|e| matches!(e.kind, EventKind::RevertFinished { success: true, .. })));
    assert!(evs
        .iter()
        .any(|e| matches!(e.kind, EventKind::NodeStarted { .. }) && e.scope.attempt == Some(2)));

    // Another process changes the very file the attempt wrote: the retry
    // does not overwrite it; it fails (kind `revert`) and says why.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let out = run_retrying(dir, "c", || {
        std::fs::write(dir.join("tried.txt"), "theirs\n").unwrap();
    });
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        std::fs::read_to_string(dir.join("tried.txt")).unwrap(),
        "theirs\n"
    );
    let evs = events(dir, "c");
    assert!(!evs
        .iter()
        .any(|e| matches!(e.kind, EventKind::RevertStarted { .. })));
    assert!(
        evs.iter().any(|e| matches!(&e.kind,
            EventKind::Diagnostic { source, message, .. }
                if source == "revert" && message.contains("tried.txt"))),
        "a diagnostic names the path"
    );
    assert!(evs.iter().any(|e| matches!(&e.kind,
        EventKind::NodeFailed { error, will_retry: false, .. }
            if error.kind == "revert" && error.message.contains("tried.txt"))));
}

/// `cairn --store <postgres> <args>` in `dir`, nothing from the
/// environment's store.
fn cairn_on(dir: &Path, store: &str, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_cairn"))
        .current_dir(dir)
        .args(["--store", store])
        .args(args)
        .env_remove("CAIRN_STORE")
        .env_remove("CAIRN_LOG_DIR")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run cairn")
}

/// On PostgreSQL the snapshot objects are kept in the database too: a
/// run's files are reverted from another machine (here another folder,
/// whose snapshot repository never saw the run), an object damaged in the
/// database is refused rather than restored, and `cairn gc` prunes the
/// database's objects as well as the folder's.
#[test]
fn on_postgres_a_revert_works_where_the_run_never_was() {
    let Some(server) = cairn_postgres::testing::server_or_skip() else {
        return;
    };
    struct Db(&'static str, String);
    impl Drop for Db {
        fn drop(&mut self) {
            cairn_postgres::testing::drop_database(self.0, &self.1);
        }
    }
    let db = Db(server, format!("cairn_snaps_{}", std::process::id()));
    let store = cairn_postgres::testing::create_database(server, &db.1);
    let tmp = tempfile::tempdir().unwrap();
    let (work, here, there, third) = (
        tmp.path().join("work"),
        tmp.path().join("here"),
        tmp.path().join("there"),
        tmp.path().join("third"),
    );
    for d in [&work, &here, &there, &third] {
        std::fs::create_dir_all(d).unwrap();
    }
    std::fs::write(work.join("w.yaml"), EDITS).unwrap();
    std::fs::write(work.join("a.txt"), "mine\n").unwrap();
    let before = picture(&work, false);
    expect_code(
        &cairn_on(&here, &store, &["run", "../work/w.yaml", "--run-id", "r"]),
        0,
    );
    let stored =
        || cairn_postgres::testing::query_i64(&store, "SELECT count(*) FROM snapshot_objects");
    assert!(stored() > 0, "no snapshot object reached the database");
    assert!(walk_count(&here.join(".cairn/snapshots/objects")) > 0);
    assert!(!there.join(".cairn").exists());

    // Elsewhere: the objects come from the database.
    let out = cairn_on(&there, &store, &["revert", "r", "edit"]);
    expect_code(&out, 0);
    assert_eq!(picture(&work, false), before, "the revert from elsewhere");
    assert!(walk_count(&there.join(".cairn/snapshots/objects")) > 0);

    // A damaged copy in the database is refused, not written to the root.
    cairn_postgres::testing::sql(
        &store,
        "UPDATE snapshot_objects SET body = convert_to('planted', 'UTF8') WHERE kind = 'blob'",
    );
    std::fs::write(work.join("a.txt"), "mine\nrun\n").unwrap();
    let out = cairn_on(&third, &store, &["revert", "r", "edit", "--force"]);
    assert!(!out.status.success(), "a damaged object was restored");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("damaged"), "{said}");
    assert_eq!(
        std::fs::read_to_string(work.join("a.txt")).unwrap(),
        "mine\nrun\n"
    );

    // gc: the run goes, and with it its objects, here and in the database.
    let out = cairn_on(
        &there,
        &store,
        &["gc", "--older-than", "0s", "--snapshot-grace", "0s"],
    );
    expect_code(&out, 0);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("from the store"), "{said}");
    assert_eq!(stored(), 0, "{said}");
}
