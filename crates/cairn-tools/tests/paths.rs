//! The adversarial path suite: nothing resolves outside the root, and every
//! refusal says why.

mod common;

use std::ffi::OsStr;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use cairn_tools::{NoopObserver, Sandbox, ToolContext, ToolError, ToolRegistry};
use proptest::prelude::*;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

const SECRET: &str = "SECRET-OUTSIDE-THE-ROOT";

/// outer/
///   outside/secret.txt, outside/dir/
///   root/ file.txt, sub/inner.txt, and symlinks of every kind
struct Layout {
    _dir: tempfile::TempDir,
    outer: PathBuf,
    root: PathBuf,
}

fn layout() -> Layout {
    let dir = tempfile::tempdir().unwrap();
    let outer = dir.path().canonicalize().unwrap();
    let outside = outer.join("outside");
    let root = outer.join("root");
    std::fs::create_dir_all(outside.join("dir")).unwrap();
    std::fs::write(outside.join("secret.txt"), SECRET).unwrap();
    std::fs::write(outside.join("dir/secret.txt"), SECRET).unwrap();
    std::fs::create_dir_all(root.join("sub/deeper")).unwrap();
    std::fs::write(root.join("file.txt"), "inside\n").unwrap();
    std::fs::write(root.join("sub/inner.txt"), "inner\n").unwrap();
    symlink("../outside/secret.txt", root.join("rel_out")).unwrap();
    symlink(outside.join("secret.txt"), root.join("abs_out")).unwrap();
    symlink("../outside", root.join("dir_out")).unwrap();
    symlink("chain2", root.join("chain1")).unwrap();
    symlink("sub/../chain3", root.join("chain2")).unwrap();
    symlink("../outside/secret.txt", root.join("chain3")).unwrap();
    symlink("/proc/self/root", root.join("proc_root")).unwrap();
    symlink("../../rel_out", root.join("sub/deeper/up_out")).unwrap();
    // Symlinks that stay inside are fine.
    symlink("sub/inner.txt", root.join("in_link")).unwrap();
    symlink("../file.txt", root.join("sub/up_in")).unwrap();
    // A non-UTF-8 name inside, and one pointing outside.
    std::fs::write(
        root.join(OsStr::from_bytes(b"caf\xe9.txt")),
        "latin1 name\n",
    )
    .unwrap();
    symlink(
        "../outside/secret.txt",
        root.join(OsStr::from_bytes(b"\xff\xfe")),
    )
    .unwrap();
    Layout {
        _dir: dir,
        outer,
        root,
    }
}

fn path_reason(err: &ToolError) -> &str {
    match err {
        ToolError::Path { reason, .. } => reason,
        other => panic!("expected a path error, got {other:?}"),
    }
}

async fn call(sandbox: &Sandbox, tool: &str, args: Value) -> Result<Value, ToolError> {
    let ctx = ToolContext::new(
        sandbox,
        "r",
        "n",
        0,
        1,
        1,
        &NoopObserver,
        CancellationToken::new(),
    );
    ToolRegistry::builtin().call(tool, args, &ctx).await
}

#[tokio::test]
async fn escapes_are_refused_with_a_reason() {
    let l = layout();
    let sb = Sandbox::new(&l.root).unwrap();
    let outer = l.outer.display().to_string();
    let root = l.root.display().to_string();
    let cases: Vec<(String, &str)> = vec![
        ("../outside/secret.txt".into(), "outside the sandbox root"),
        (
            "sub/../../outside/secret.txt".into(),
            "outside the sandbox root",
        ),
        (
            format!("{outer}/outside/secret.txt"),
            "absolute path outside",
        ),
        (
            format!("{root}/../outside/secret.txt"),
            "outside the sandbox root",
        ),
        ("/etc/passwd".into(), "absolute path outside"),
        ("/proc/self/root/etc/passwd".into(), "absolute path outside"),
        ("rel_out".into(), "outside the sandbox root"),
        ("abs_out".into(), "outside the sandbox root"),
        ("dir_out/secret.txt".into(), "outside the sandbox root"),
        ("chain1".into(), "outside the sandbox root"),
        ("sub/deeper/up_out".into(), "outside the sandbox root"),
        ("proc_root/etc/passwd".into(), "outside the sandbox root"),
        ("file.txt\0/../x".into(), "NUL byte"),
        ("".into(), "is empty"),
        ("missing.txt".into(), "does not exist"),
        ("file.txt/x".into(), "not a directory"),
    ];
    for (path, want) in &cases {
        let err = call(&sb, "read", json!({"path": path})).await.unwrap_err();
        let reason = path_reason(&err);
        assert!(reason.contains(want), "{path:?}: {reason}");
        assert!(!err.to_string().contains(SECRET));
        assert!(sb.resolve(path).is_err(), "{path:?} resolved");
    }
    // The magic link of an open descriptor is refused even when reached
    // through a path that lies beneath the root.
    let f = std::fs::File::open(l.outer.join("outside/secret.txt")).unwrap();
    symlink(
        format!("/proc/self/fd/{}", f.as_raw_fd()),
        l.root.join("fd_link"),
    )
    .unwrap();
    let err = call(&sb, "read", json!({"path": "fd_link"}))
        .await
        .unwrap_err();
    assert!(path_reason(&err).contains("outside"), "{err}");
}

#[tokio::test]
async fn paths_inside_work_including_symlinks_that_stay_inside() {
    let l = layout();
    let sb = Sandbox::new(&l.root).unwrap();
    for (path, want) in [
        ("file.txt", "inside\n"),
        ("in_link", "inner\n"),
        ("sub/up_in", "inside\n"),
        ("sub/../file.txt", "inside\n"),
        ("./sub/./inner.txt", "inner\n"),
    ] {
        let out = call(&sb, "read", json!({"path": path})).await.unwrap();
        assert_eq!(out["content"], want, "{path}");
    }
    let abs = l.root.join("file.txt").display().to_string();
    let out = call(&sb, "read", json!({"path": abs})).await.unwrap();
    assert_eq!(out["path"], "file.txt");
    let err = call(&sb, "read", json!({"path": "sub"})).await.unwrap_err();
    assert!(path_reason(&err).contains("directory"));
}

#[tokio::test]
async fn writes_and_edits_never_land_outside() {
    let l = layout();
    let sb = Sandbox::new(&l.root).unwrap();
    for path in [
        "../evil.txt",
        "dir_out/evil.txt",
        "dir_out/new/evil.txt",
        "chain1",
        "abs_out",
    ] {
        let res = call(&sb, "write", json!({"path": path, "content": "pwned"})).await;
        // Writing over a symlink replaces the link itself (rename does not
        // follow it); anything else must be refused.
        if let Ok(out) = &res {
            assert!(["chain1", "abs_out"].contains(&path), "{path}: {out}");
            assert!(std::fs::symlink_metadata(l.root.join(path))
                .unwrap()
                .is_file());
        }
    }
    let err = call(
        &sb,
        "edit",
        json!({"path": "rel_out", "patch": "@@ -1 +1 @@\n-x\n+y\n"}),
    )
    .await
    .unwrap_err();
    assert!(path_reason(&err).contains("outside"));
    assert!(!l.outer.join("evil.txt").exists());
    assert!(!l.outer.join("outside/evil.txt").exists());
    assert!(!l.outer.join("outside/new").exists());
    assert_eq!(
        std::fs::read_to_string(l.outer.join("outside/secret.txt")).unwrap(),
        SECRET
    );
}

#[tokio::test]
async fn grep_and_bash_cwd_stay_inside() {
    let l = layout();
    let sb = Sandbox::new(&l.root).unwrap();
    let out = call(&sb, "grep", json!({"pattern": "SECRET|inside|latin1"}))
        .await
        .unwrap();
    let matches: Vec<String> = serde_json::from_value(out["matches"].clone()).unwrap();
    assert!(matches.iter().all(|m| !m.contains(SECRET)), "{matches:?}");
    assert!(
        matches.contains(&"file.txt:1:inside".to_string()),
        "{matches:?}"
    );
    // The non-UTF-8 name is found and shown lossily.
    assert!(
        matches.contains(&"caf\u{fffd}.txt:1:latin1 name".to_string()),
        "{matches:?}"
    );
    for path in ["..", "dir_out", "../outside"] {
        let err = call(&sb, "grep", json!({"pattern": "S", "path": path}))
            .await
            .unwrap_err();
        assert!(path_reason(&err).contains("outside"), "{path}: {err}");
        let err = call(&sb, "bash", json!({"argv": ["pwd"], "cwd": path}))
            .await
            .unwrap_err();
        assert!(path_reason(&err).contains("outside"), "{path}: {err}");
    }
    let out = call(&sb, "bash", json!({"argv": ["pwd"], "cwd": "sub"}))
        .await
        .unwrap();
    assert_eq!(out["stdout"], format!("{}/sub\n", l.root.display()));
}

/// A racing thread keeps swapping `swap` between a real folder and a symlink
/// to the outside while reads and writes go through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_symlink_swapped_in_by_a_racing_thread_never_escapes() {
    let l = layout();
    let sb = Sandbox::new(&l.root).unwrap();
    // `swap` is always present: a real folder or a symlink to the outside,
    // exchanged atomically (renameat2 RENAME_EXCHANGE) as fast as possible.
    let swap = l.root.join("swap");
    std::fs::create_dir(&swap).unwrap();
    std::fs::write(swap.join("secret.txt"), "inside\n").unwrap();
    let other = l.root.join("swap_other");
    symlink("../outside/dir", &other).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let racer = {
        let stop = stop.clone();
        let a = std::ffi::CString::new(swap.as_os_str().as_bytes()).unwrap();
        let b = std::ffi::CString::new(other.as_os_str().as_bytes()).unwrap();
        std::thread::spawn(move || {
            let mut swaps = 0u64;
            while !stop.load(Ordering::Relaxed) {
                // SAFETY: valid C strings.
                let rc = unsafe {
                    libc::renameat2(
                        libc::AT_FDCWD,
                        a.as_ptr(),
                        libc::AT_FDCWD,
                        b.as_ptr(),
                        libc::RENAME_EXCHANGE,
                    )
                };
                assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
                swaps += 1;
            }
            swaps
        })
    };
    let (mut inside_reads, mut refusals) = (0, 0);
    for i in 0..1000 {
        match call(&sb, "read", json!({"path": "swap/secret.txt"})).await {
            Ok(out) => {
                assert_eq!(out["content"], "inside\n", "escaped on iteration {i}");
                inside_reads += 1;
            }
            Err(e) => {
                assert!(!e.to_string().contains(SECRET));
                refusals += 1;
            }
        }
        let _ = call(&sb, "write", json!({"path": "swap/w.txt", "content": "x"})).await;
        assert!(
            !l.outer.join("outside/dir/w.txt").exists(),
            "write escaped on iteration {i}"
        );
    }
    stop.store(true, Ordering::Relaxed);
    let swaps = racer.join().unwrap();
    eprintln!("{swaps} swaps, {inside_reads} reads inside, {refusals} refusals");
    assert!(swaps > 0);
    assert!(
        inside_reads > 0 && refusals > 0,
        "the race should have produced both outcomes"
    );
    assert_eq!(
        std::fs::read_to_string(l.outer.join("outside/dir/secret.txt")).unwrap(),
        SECRET
    );
}

/// Whatever resolves, resolves to something beneath the root.
fn check_beneath(sb: &Sandbox, root: &Path, input: &str) {
    if let Ok((fd, _rel)) = sb.resolve(input) {
        let real = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap();
        assert!(
            real.starts_with(root),
            "{input:?} resolved to {}",
            real.display()
        );
    }
}

fn component() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("..".to_string()),
        Just(".".to_string()),
        Just("".to_string()),
        Just("sub".to_string()),
        Just("deeper".to_string()),
        Just("rel_out".to_string()),
        Just("abs_out".to_string()),
        Just("dir_out".to_string()),
        Just("chain1".to_string()),
        Just("proc_root".to_string()),
        Just("up_out".to_string()),
        Just("up_in".to_string()),
        Just("in_link".to_string()),
        Just("outside".to_string()),
        Just("root".to_string()),
        Just("proc".to_string()),
        Just("self".to_string()),
        Just("file.txt".to_string()),
        "[a-z.]{1,4}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    /// The bounded, always-on sibling of the cargo-fuzz target.
    #[test]
    fn random_paths_never_resolve_outside(
        parts in proptest::collection::vec(component(), 1..8),
        absolute in 0..3u8,
    ) {
        thread_local! { static L: Layout = layout(); }
        L.with(|l| {
            let sb = Sandbox::new(&l.root).unwrap();
            let rel = parts.join("/");
            let input = match absolute {
                0 => rel,
                1 => format!("{}/{}", l.root.display(), rel),
                _ => format!("/{rel}"),
            };
            check_beneath(&sb, &l.root, &input);
        });
    }
}

/// The store's folder inside the root is out of the file tools' reach: by
/// name, through a symlink, for reads, writes, edits and creating it; the
/// rest of the root still works.
#[tokio::test]
async fn the_store_inside_the_root_is_refused_to_every_file_tool() {
    let l = layout();
    let store = l.root.join(".cairn");
    std::fs::create_dir_all(store.join("logs")).unwrap();
    std::fs::write(store.join("cairn.db"), "events").unwrap();
    symlink("../.cairn", l.root.join("sub/store-link")).unwrap();
    let sb = Sandbox::new(&l.root)
        .unwrap()
        .with_hidden(vec![store.clone()]);
    let cases = [
        ("read", json!({ "path": ".cairn/cairn.db" })),
        (
            "read",
            json!({ "path": store.join("cairn.db").display().to_string() }),
        ),
        ("read", json!({ "path": "sub/store-link/cairn.db" })),
        (
            "write",
            json!({ "path": ".cairn/cairn.db", "content": "forged" }),
        ),
        (
            "write",
            json!({ "path": ".cairn/logs/run.ndjson", "content": "forged" }),
        ),
        (
            "write",
            json!({ "path": "sub/../.cairn/new.lock", "content": "x" }),
        ),
        (
            "edit",
            json!({ "path": ".cairn/cairn.db", "patch": "@@ -1 +1 @@\n-events\n+forged\n" }),
        ),
    ];
    for (tool, args) in cases {
        let err = call(&sb, tool, args.clone()).await.unwrap_err();
        assert!(
            path_reason(&err).contains("store"),
            "{tool} {args}: {err:?}"
        );
    }
    assert_eq!(
        std::fs::read_to_string(store.join("cairn.db")).unwrap(),
        "events"
    );
    assert!(!store.join("new.lock").exists());
    // Removing the store and putting a file in its place is refused too.
    let err = call(&sb, "write", json!({ "path": ".cairn", "content": "x" }))
        .await
        .unwrap_err();
    assert!(path_reason(&err).contains("store"), "{err:?}");
    // The rest of the root is the tools' as before.
    call(
        &sb,
        "write",
        json!({ "path": "sub/ok.txt", "content": "fine" }),
    )
    .await
    .unwrap();
    assert_eq!(
        call(&sb, "read", json!({ "path": "sub/ok.txt" }))
            .await
            .unwrap()["content"],
        json!("fine")
    );
}
