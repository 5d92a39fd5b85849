//! Secrets through the real binary: read from the environment, a file and
//! a command; given to the nodes that name them; and never in any byte
//! Cairn writes (the store's files, the NDJSON mirror, snapshots), where
//! outputs, errors and tool results hold `***` instead.

use std::path::Path;
use std::process::{Command, Output, Stdio};

const FROM_ENV: &str = "tok-env-5f2a9c";
const FROM_FILE: &str = "tok-file-81d3e0";
const FROM_COMMAND: &str = "tok-cmd-44b7aa";

fn cairn(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cairn"))
        .current_dir(dir)
        .args(args)
        .env_remove("CAIRN_STORE")
        .env_remove("CAIRN_LOG_DIR")
        .env("CAIRN_TEST_SECRET_TOKEN", FROM_ENV)
        .stdin(Stdio::null())
        .output()
        .expect("run cairn")
}

/// Every file under `dir`, as bytes.
fn every_byte(dir: &Path, out: &mut Vec<(String, Vec<u8>)>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let path = entry.path();
        let ft = entry.file_type().unwrap();
        if ft.is_dir() {
            every_byte(&path, out);
        } else if ft.is_file() {
            let bytes = std::fs::read(&path).unwrap();
            // Snapshot objects are zlib streams: read what they hold too.
            let mut inflated = Vec::new();
            if std::io::Read::read_to_end(
                &mut flate2::read::ZlibDecoder::new(&bytes[..]),
                &mut inflated,
            )
            .is_ok()
            {
                out.push((format!("{} (inflated)", path.display()), inflated));
            }
            out.push((path.display().to_string(), bytes));
        }
    }
}

fn contains(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

const WORKFLOW: &str = r#"
name: secrets
# The secret's file is beside the workflow, outside the sandbox root that
# snapshots keep.
sandbox: { root: work }
env:
  GREETING: hello
secrets:
  TOKEN: { env: CAIRN_TEST_SECRET_TOKEN }
  DB: { file: db.secret }
  NPM: { command: ["cat", "npm.secret"] }
nodes:
  - id: show
    secrets: [TOKEN, DB]
    command: ["sh", "-c", "echo \"$GREETING token=$TOKEN db=$DB npm=${NPM:-unset}\""]
  - id: tool
    needs: [show]
    secrets: [NPM]
    tool: bash
    args: { argv: ["sh", "-c", "echo npm=$NPM token=${TOKEN:-unset}"] }
  - id: leak
    needs: [tool]
    secrets: [TOKEN]
    on_failure: continue
    command: ["sh", "-c", "echo \"refused $TOKEN\" >&2; exit 1"]
  - id: unnamed
    needs: [tool]
    command: ["sh", "-c", "echo token=${TOKEN:-unset}"]
  # A node that writes its secret into the root: the snapshots taken around
  # it leave that file out.
  - id: write
    needs: [unnamed]
    secrets: [TOKEN]
    command: ["sh", "-c", "printf 'token=%s\n' \"$TOKEN\" > .npmrc; echo kept > notes.txt"]
"#;

#[test]
fn secrets_reach_their_nodes_and_nothing_cairn_writes() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("db.secret"), format!("{FROM_FILE}\n")).unwrap();
    std::fs::create_dir(dir.path().join("work")).unwrap();
    std::fs::write(dir.path().join("npm.secret"), FROM_COMMAND).unwrap();
    std::fs::write(dir.path().join("wf.yaml"), WORKFLOW).unwrap();
    let out = cairn(dir.path(), &["run", "wf.yaml", "--run-id", "s1", "--json"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    for secret in [FROM_ENV, FROM_FILE, FROM_COMMAND] {
        assert!(!stdout.contains(secret), "stdout shows {secret}: {stdout}");
        assert!(!stderr.contains(secret), "stderr shows {secret}: {stderr}");
    }
    let status = cairn(dir.path(), &["status", "s1", "--json"]);
    let state: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let output = |node: &str| {
        state["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["nodeId"] == node)
            .unwrap_or_else(|| panic!("{node} in {state}"))
            .clone()
    };
    // Each node got what it names, masked in what was kept.
    assert_eq!(output("show")["output"], "hello token=*** db=*** npm=unset");
    let tool = output("tool")["output"].to_string();
    assert!(
        tool.contains("npm=***") && tool.contains("token=unset"),
        "{tool}"
    );
    assert_eq!(output("leak")["status"], "failed");
    // Its stderr, as the log tells it, is masked.
    let mirror = std::fs::read_to_string(dir.path().join(".cairn/logs/s1/events.ndjson")).unwrap();
    assert!(mirror.contains("refused ***"), "{mirror}");
    assert_eq!(output("unnamed")["output"], "token=unset");
    // The node's file is its own, as written; the snapshots kept the rest.
    let npmrc = std::fs::read_to_string(dir.path().join("work/.npmrc")).unwrap();
    assert_eq!(npmrc, format!("token={FROM_ENV}\n"));
    assert_eq!(output("write")["status"], "finished");
    let mut objects = Vec::new();
    every_byte(&dir.path().join(".cairn/snapshots"), &mut objects);
    assert!(
        objects.iter().any(|(_, b)| contains(b, "kept\n")),
        "the snapshot after `write` keeps notes.txt"
    );
    // A revert of `write` snapshots the root as it is now: the file with
    // the secret is left out of that snapshot too, and left alone.
    let reverted = cairn(dir.path(), &["revert", "s1", "write"]);
    assert_eq!(
        reverted.status.code(),
        Some(0),
        "{}{}",
        String::from_utf8_lossy(&reverted.stdout),
        String::from_utf8_lossy(&reverted.stderr)
    );
    assert!(
        !dir.path().join("work/notes.txt").exists(),
        "the revert removes what `write` made"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("work/.npmrc")).unwrap(),
        format!("token={FROM_ENV}\n")
    );
    // Not one byte Cairn wrote holds a value.
    let mut files = Vec::new();
    every_byte(&dir.path().join(".cairn"), &mut files);
    assert!(files.iter().any(|(p, _)| p.ends_with("events.ndjson")));
    for (path, bytes) in &files {
        for secret in [FROM_ENV, FROM_FILE, FROM_COMMAND] {
            assert!(!contains(bytes, secret), "{path} holds {secret}");
        }
    }
}

#[test]
fn a_secret_that_cannot_be_read_stops_the_run_before_it_starts() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("wf.yaml"),
        "name: missing\nsecrets:\n  GONE: { env: CAIRN_TEST_NO_SUCH_SECRET }\n  DB: { file: nope.secret }\nnodes:\n  - id: a\n    secrets: [GONE]\n    command: [\"true\"]\n",
    )
    .unwrap();
    let out = cairn(dir.path(), &["run", "wf.yaml", "--run-id", "m1"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{stderr}");
    assert!(
        stderr.contains("secret `DB`") || stderr.contains("secret `GONE`"),
        "{stderr}"
    );
    assert!(
        stderr.contains("CAIRN_TEST_NO_SUCH_SECRET") || stderr.contains("nope.secret"),
        "{stderr}"
    );
    // Nothing was written: no run.
    let runs = cairn(dir.path(), &["runs", "--json"]);
    assert!(!String::from_utf8_lossy(&runs.stdout).contains("m1"));
}

#[test]
fn undeclared_secrets_and_templates_of_secrets_are_refused_by_validate() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("wf.yaml"),
        "name: bad\nsecrets:\n  TOKEN: { env: T }\nnodes:\n  - id: a\n    secrets: [TOKNE]\n    command: [\"echo\", \"{{ secrets.TOKEN }}\"]\n",
    )
    .unwrap();
    let out = cairn(dir.path(), &["validate", "wf.yaml"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{stderr}");
    assert!(
        stderr.contains("secret `TOKNE` is not declared"),
        "{stderr}"
    );
    assert!(stderr.contains("did you mean `TOKEN`?"), "{stderr}");
}

/// A node that writes its secret into a file that was there before (an
/// attacker hiding a change from the snapshots): the file is withheld
/// from every snapshot, so to the history the node removed it; a revert
/// then refuses rather than skip it silently (exit 5, the file as it is);
/// --force does not make it read the file either: the restore stops on
/// that path (exit 1) and a person puts it back. No object ever holds the
/// value.
#[test]
fn a_secret_written_into_an_existing_file_does_not_hide_the_change_from_a_revert() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("work")).unwrap();
    std::fs::write(dir.path().join("work/config.txt"), "original\n").unwrap();
    std::fs::write(
        dir.path().join("wf.yaml"),
        r#"
name: taint
sandbox: { root: work }
secrets:
  TOKEN: { env: CAIRN_TEST_SECRET_TOKEN }
nodes:
  - id: taint
    secrets: [TOKEN]
    command: ["sh", "-c", "printf 'x=%s\n' \"$TOKEN\" >> config.txt"]
"#,
    )
    .unwrap();
    let out = cairn(dir.path(), &["run", "wf.yaml", "--run-id", "t1"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tainted = format!("original\nx={FROM_ENV}\n");
    let config = || std::fs::read_to_string(dir.path().join("work/config.txt")).unwrap();
    assert_eq!(config(), tainted);
    let refused = cairn(dir.path(), &["revert", "t1", "taint"]);
    assert_eq!(
        refused.status.code(),
        Some(5),
        "{}{}",
        String::from_utf8_lossy(&refused.stdout),
        String::from_utf8_lossy(&refused.stderr)
    );
    assert_eq!(config(), tainted, "a refused revert touches nothing");
    let forced = cairn(dir.path(), &["revert", "t1", "taint", "--force"]);
    assert_eq!(
        forced.status.code(),
        Some(1),
        "{}{}",
        String::from_utf8_lossy(&forced.stdout),
        String::from_utf8_lossy(&forced.stderr)
    );
    assert!(String::from_utf8_lossy(&forced.stderr).contains("snapshots leave out"));
    assert_eq!(
        config(),
        tainted,
        "the file that holds the secret is never read"
    );
    let mut files = Vec::new();
    every_byte(&dir.path().join(".cairn"), &mut files);
    for (path, bytes) in &files {
        assert!(!contains(bytes, FROM_ENV), "{path} holds the secret");
    }
}
