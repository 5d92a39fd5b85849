//! A node races the engine's revert: while `cairn revert --force` puts
//! back the files a finished run changed, a node of another run in the
//! same root swaps a folder of the root with a link to a folder outside it
//! (`renameat2(RENAME_EXCHANGE)` in a tight loop, inside its sandbox). The
//! engine runs unsandboxed, so a revert that resolved `work/a.txt` by name
//! would write (or delete, or read into a snapshot) the outside file of
//! that name. It walks and restores through descriptors with no link
//! followed, so the outside folder is byte for byte what it was, nothing
//! was created in it, and no snapshot object holds its canary. `--force`
//! keeps the conflict check (which refuses a revert over paths something
//! else changed, as the swap does) from stopping the race before it starts.

use super::common::wait_exit;
use super::{python, sandbox_available};
use cairn_store::prelude::*;
use cairn_store::{EventQuery, SqliteBackend};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const CANARY: &str = "CANARY-revert-race-7d2e";

/// The attacking node: swaps `work` and `link` until the test is done.
const SWAPPER: &str = r#"
import ctypes, os, platform, time
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
nr = 316 if platform.machine() == "x86_64" else 276
end = time.time() + 60
while time.time() < end and not os.path.exists("stop"):
    libc.syscall(nr, -100, b"work", -100, b"link", 2)
# Leave the root as it was found: `work` a folder, `link` the link.
if os.path.islink("work"):
    libc.syscall(nr, -100, b"work", -100, b"link", 2)
"#;

/// The run whose changes are reverted: one node that changes `work`.
const WRITER: &str = r#"name: revert-race-writer
nodes:
  - id: writer
    command: ["sh", "-c", "for f in a.txt b.txt in/c.txt new.txt; do echo changed > work/$f; done"]
"#;

fn swapper_workflow() -> String {
    format!(
        "name: revert-race-swapper\nnodes:\n  - id: swapper\n    command: [\"python3\", \"-c\", {}]\n",
        serde_json::to_string(SWAPPER).unwrap()
    )
}

/// Every entry under `dir`: bytes of files, targets of links.
fn exact(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            let v = if m.is_symlink() {
                std::fs::read_link(&p)
                    .unwrap()
                    .into_os_string()
                    .into_encoded_bytes()
            } else if m.is_dir() {
                stack.push(p.clone());
                b"dir".to_vec()
            } else {
                std::fs::read(&p).unwrap()
            };
            out.insert(p, v);
        }
    }
    out
}

/// How many loose objects of the repository hold `needle` once inflated.
fn objects_holding(repo: &Path, needle: &str) -> usize {
    let out = Command::new("python3")
        .args([
            "-c",
            "import os, sys, zlib\nn = 0\nfor d, _, fs in os.walk(sys.argv[1]):\n    for f in fs:\n        n += sys.argv[2].encode() in zlib.decompress(open(os.path.join(d, f), 'rb').read())\nprint(n)",
        ])
        .arg(repo.join("objects"))
        .arg(needle)
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

#[test]
fn a_node_swapping_a_folder_for_a_link_cannot_send_a_revert_outside() {
    if !sandbox_available() || !python() {
        return;
    }
    // Under the build's folder, not /tmp (the sandbox's /tmp is its own).
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let top = tmp.path().canonicalize().unwrap();
    let root = top.join("root");
    let outside = top.join("outside");
    for d in [root.join("work/in"), outside.join("in")] {
        std::fs::create_dir_all(d).unwrap();
    }
    for f in ["a.txt", "b.txt", "in/c.txt"] {
        std::fs::write(root.join("work").join(f), format!("work {f}\n")).unwrap();
        std::fs::write(outside.join(f), format!("{CANARY} {f}\n")).unwrap();
    }
    std::os::unix::fs::symlink(&outside, root.join("link")).unwrap();
    std::fs::write(root.join("writer.yaml"), WRITER).unwrap();
    std::fs::write(root.join("swapper.yaml"), swapper_workflow()).unwrap();
    let before = exact(&outside);

    let cairn = |args: &[&str]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_cairn"));
        c.current_dir(&root)
            .args(args)
            .args(["--store", ".cairn/cairn.db"])
            .env_remove("CAIRN_STORE")
            .env_remove("CAIRN_LOG_DIR")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        c
    };
    let status = wait_exit(
        &mut cairn(&["run", "writer.yaml", "--run-id", "w"])
            .spawn()
            .unwrap(),
    );
    assert_eq!(status.code(), Some(0), "the writer run failed");

    // The attacker: a node of another run, swapping while the reverts run.
    let mut swapper = cairn(&["run", "swapper.yaml", "--run-id", "s"])
        .spawn()
        .expect("spawn cairn");
    let t0 = std::time::Instant::now();
    while !root.join(".cairn/cairn.db").exists() || started_of(&root, "s", "\"NodeStarted\"") == 0 {
        assert!(
            t0.elapsed() < super::common::PATIENCE,
            "the swapper never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    // Reverts of the writer's node, one after the other, while it swaps.
    // Each either restores or stops at a swapped folder (a root that
    // changes under it is an error); none may go outside.
    let mut codes = Vec::new();
    for _ in 0..30 {
        let s = wait_exit(
            &mut cairn(&["revert", "w", "writer", "--force"])
                .spawn()
                .unwrap(),
        );
        codes.push(s.code());
    }
    std::fs::write(root.join("stop"), "").unwrap();
    let status = wait_exit(&mut swapper);
    assert_eq!(status.code(), Some(0), "the swapper run failed");
    let reverts = started_of(&root, "w", "\"RevertStarted\"");
    eprintln!("{reverts} reverts raced the swapper; exit codes {codes:?}");
    assert!(
        reverts > 0,
        "no revert started: the race proves nothing ({codes:?})"
    );

    assert_eq!(
        exact(&outside),
        before,
        "a revert wrote, deleted or created something outside the root"
    );
    assert_eq!(
        objects_holding(&root.join(".cairn/snapshots"), CANARY),
        0,
        "a snapshot read a file outside the root"
    );
}

/// How many events of `run` contain `needle`.
fn started_of(root: &Path, run: &str, needle: &str) -> usize {
    let Ok(backend) = SqliteBackend::open(&root.join(".cairn/cairn.db")) else {
        return 0;
    };
    backend
        .read_events(
            &cairn_events::RunId::parse(run).unwrap(),
            &EventQuery::default(),
        )
        .map(|evs| {
            evs.into_iter()
                .filter(|e| e.json.to_string().contains(needle))
                .count()
        })
        .unwrap_or(0)
}
