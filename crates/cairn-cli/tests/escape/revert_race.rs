//! A node races the engine's revert: while `on_retry: revert` puts the
//! files of a failing node back before each retry, another node of the
//! run swaps a folder of the root with a link to a folder outside it
//! (`renameat2(RENAME_EXCHANGE)` in a tight loop). The engine runs
//! unsandboxed, so a revert that resolved `work/a.txt` by name would write
//! (or delete, or read into a snapshot) the outside file of that name. It
//! walks and restores through descriptors with no link followed, so the
//! outside folder is byte for byte what it was, nothing was created in it,
//! and no snapshot object holds its canary.

use super::common::wait_exit;
use super::{python, sandbox_available};
use cairn_store::{Backend, EventQuery, SqliteBackend};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const CANARY: &str = "CANARY-revert-race-7d2e";

/// The node: swaps `work` and `link` for six seconds.
const SWAPPER: &str = r#"
import ctypes, os, platform, time
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
nr = 316 if platform.machine() == "x86_64" else 276
end = time.time() + 6
while time.time() < end:
    libc.syscall(nr, -100, b"work", -100, b"link", 2)
"#;

fn workflow() -> String {
    format!(
        r#"name: revert-race
nodes:
  - id: swapper
    command: ["python3", "-c", {swapper}]
  - id: flaky
    retry: {{ attempts: 12, delay: 10ms }}
    on_retry: revert
    command: ["sh", "-c", "for f in a.txt b.txt in/c.txt new.txt; do echo changed > work/$f; done 2>/dev/null; sleep 0.2; exit 1"]
"#,
        swapper = serde_json::to_string(SWAPPER).unwrap()
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
    std::fs::write(root.join("w.yaml"), workflow()).unwrap();
    let before = exact(&outside);

    // Several runs: a revert that meets a swapped folder stops (the node
    // fails, not retried), and one that finds the attempt's files changed
    // by something else (the swap) is refused before it starts, so a run
    // races one revert at most; runs go on until three have.
    let mut reverts = 0;
    for n in 0..20 {
        if reverts >= 3 {
            break;
        }
        let run = format!("race{n}");
        let mut child = Command::new(env!("CARGO_BIN_EXE_cairn"))
            .current_dir(&root)
            .args([
                "run",
                "w.yaml",
                "--run-id",
                &run,
                "--store",
                ".cairn/cairn.db",
            ])
            .env_remove("CAIRN_STORE")
            .env_remove("CAIRN_LOG_DIR")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn cairn");
        let status = wait_exit(&mut child);
        // The run fails (flaky never passes); what matters is where the
        // reverts went.
        assert_eq!(status.code(), Some(1), "run {run} did not end as a failure");
        let backend = SqliteBackend::open(&root.join(".cairn/cairn.db")).expect("open the store");
        let log: Vec<String> = backend
            .read_events(&run, &EventQuery::default())
            .expect("read events")
            .into_iter()
            .map(|e| e.json.to_string())
            .collect();
        let started = log
            .iter()
            .filter(|e| e.contains("\"RevertStarted\""))
            .count();
        assert!(
            started > 0,
            "no revert ran, the race proves nothing:\n{log:#?}"
        );
        reverts += started;
        assert_eq!(
            exact(&outside),
            before,
            "run {run}: a revert wrote, deleted or created something outside the root"
        );
    }
    assert!(
        reverts > 0,
        "no revert ran in 20 runs: the race proves nothing"
    );
    eprintln!("{reverts} reverts raced the swapper");

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
