//! A node that swaps folders and links while the engine walks and
//! restores its root: `renameat2(RENAME_EXCHANGE)` in a loop between a
//! real folder and a link to a folder outside the root, and swaps set off
//! by inotify the moment the engine opens a folder. Afterwards nothing
//! outside the root was opened (inotify on the outside folders), written
//! or deleted (its files byte for byte, nothing new), and no stored object
//! holds the outside files' canary.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use cairn_snapshot::{Options, SnapshotStore};

const CANARY: &str = "CANARY-3f1c9a7e-outside-the-root";

fn c(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

/// `renameat2(a, b, RENAME_EXCHANGE)`: the two names trade places in one
/// step, as a node's `mv --exchange` would.
fn exchange(a: &Path, b: &Path) -> bool {
    // SAFETY: valid C strings; AT_FDCWD with absolute paths.
    unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            libc::AT_FDCWD,
            c(a).as_ptr(),
            libc::AT_FDCWD,
            c(b).as_ptr(),
            libc::RENAME_EXCHANGE,
        ) == 0
    }
}

/// Every entry under `dir` with its bytes (files) or target (links).
fn exact(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let m = fs::symlink_metadata(&p).unwrap();
            let v = if m.is_symlink() {
                fs::read_link(&p).unwrap().as_os_str().as_bytes().to_vec()
            } else if m.is_dir() {
                stack.push(p.clone());
                b"dir".to_vec()
            } else {
                fs::read(&p).unwrap()
            };
            out.insert(p, v);
        }
    }
    out
}

/// An inotify descriptor watching `dirs` for anything at all: opened,
/// read, listed, written, created, deleted, moved.
fn watch(dirs: &[PathBuf]) -> i32 {
    // SAFETY: plain system calls with valid arguments.
    unsafe {
        let fd = libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC);
        assert!(fd >= 0);
        for d in dirs {
            assert!(libc::inotify_add_watch(fd, c(d).as_ptr(), libc::IN_ALL_EVENTS) >= 0);
        }
        fd
    }
}

/// What the watch saw, as (mask, name) pairs.
fn events(fd: i32) -> Vec<(u32, String)> {
    let mut out = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        // SAFETY: a valid descriptor and buffer.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            return out;
        }
        let mut i = 0;
        while i < n as usize {
            // SAFETY: the kernel wrote whole inotify_event records.
            let ev = unsafe { &*(buf.as_ptr().add(i) as *const libc::inotify_event) };
            let name_at = i + std::mem::size_of::<libc::inotify_event>();
            let name = &buf[name_at..name_at + ev.len as usize];
            let name = String::from_utf8_lossy(name.split(|&b| b == 0).next().unwrap_or(b""));
            out.push((ev.mask, name.into_owned()));
            i = name_at + ev.len as usize;
        }
    }
}

/// Every loose object's bytes, inflated.
fn all_objects(repo: &Path) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for d in fs::read_dir(repo.join("objects")).unwrap() {
        let d = d.unwrap().path();
        if !d.is_dir() {
            continue;
        }
        for f in fs::read_dir(&d).unwrap() {
            let bytes = fs::read(f.unwrap().path()).unwrap();
            let mut inflated = Vec::new();
            flate2::read::ZlibDecoder::new(&bytes[..])
                .read_to_end(&mut inflated)
                .unwrap();
            out.push(inflated);
        }
    }
    out
}

struct Ground {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    outside: PathBuf,
    repo: PathBuf,
}

/// A root with a folder `work` and a link `link` to a folder outside, and
/// `sub/deep` with `sub/deeplink` to another; the outside folders hold
/// canary files.
fn ground() -> Ground {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let outside = tmp.path().join("outside");
    for d in [
        root.join("work/in"),
        root.join("sub/deep"),
        outside.join("inner"),
    ] {
        fs::create_dir_all(d).unwrap();
    }
    for (i, f) in ["a.txt", "b.txt", "in/c.txt"].iter().enumerate() {
        fs::write(root.join("work").join(f), format!("work file {i}\n")).unwrap();
        fs::write(
            outside.join(f.replace("in/", "inner/")),
            format!("{CANARY} {i}\n"),
        )
        .ok();
    }
    fs::write(outside.join("a.txt"), format!("{CANARY} a\n")).unwrap();
    fs::write(outside.join("in"), format!("{CANARY} in\n")).unwrap();
    fs::write(outside.join("inner/x"), format!("{CANARY} x\n")).unwrap();
    fs::write(root.join("sub/deep/x"), "deep\n").unwrap();
    fs::write(root.join("top"), "top\n").unwrap();
    symlink(&outside, root.join("link")).unwrap();
    symlink(outside.join("inner"), root.join("sub/deeplink")).unwrap();
    let repo = tmp.path().join("repo");
    Ground {
        _tmp: tmp,
        root,
        outside,
        repo,
    }
}

#[test]
fn a_node_swapping_folders_for_links_never_sends_a_walk_or_a_restore_outside() {
    let g = ground();
    let store = SnapshotStore::open(&g.repo, Options::default()).unwrap();
    let first = store.snapshot(&g.root, &[]).unwrap();
    let outside_before = exact(&g.outside);
    let watch_fd = watch(&[g.outside.clone(), g.outside.join("inner")]);

    let stop = Arc::new(AtomicBool::new(false));
    let swaps = Arc::new(AtomicU64::new(0));
    // The node: swaps `work` and `link` as fast as it can.
    let looping = {
        let (stop, swaps, root) = (stop.clone(), swaps.clone(), g.root.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if exchange(&root.join("work"), &root.join("link")) {
                    swaps.fetch_add(1, Ordering::Relaxed);
                }
                std::thread::yield_now();
            }
        })
    };
    // And swaps `sub/deep` for its link the moment anything opens it.
    let triggered = {
        let (stop, swaps, root) = (stop.clone(), swaps.clone(), g.root.clone());
        std::thread::spawn(move || {
            // SAFETY: plain system calls with valid arguments.
            let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC) };
            let mask = libc::IN_OPEN | libc::IN_ACCESS | libc::IN_CLOSE_NOWRITE;
            // SAFETY: as above.
            unsafe { libc::inotify_add_watch(fd, c(&root.join("sub/deep")).as_ptr(), mask) };
            let mut buf = [0u8; 4096];
            while !stop.load(Ordering::Relaxed) {
                let mut pfd = libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd.
                if unsafe { libc::poll(&mut pfd, 1, 20) } > 0 {
                    // SAFETY: a valid descriptor and buffer.
                    unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
                    if exchange(&root.join("sub/deep"), &root.join("sub/deeplink")) {
                        swaps.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            // SAFETY: ours to close.
            unsafe { libc::close(fd) };
        })
    };

    let paths: Vec<Vec<u8>> = ["work/a.txt", "work/in/c.txt", "sub/deep/x", "link"]
        .iter()
        .map(|p| p.as_bytes().to_vec())
        .collect();
    let (mut walked, mut restored, mut refused) = (0, 0, 0);
    for i in 0..300 {
        match store.snapshot(&g.root, &[]) {
            Ok(_) => walked += 1,
            Err(_) => refused += 1,
        }
        let r = match i % 3 {
            0 => store.restore(&g.root, first.id, &[]),
            1 => store.restore_paths(&g.root, first.id, &paths, &[]),
            _ => continue,
        };
        match r {
            Ok(_) => restored += 1,
            Err(_) => refused += 1,
        }
    }
    stop.store(true, Ordering::Relaxed);
    looping.join().unwrap();
    triggered.join().unwrap();

    let seen = events(watch_fd);
    // SAFETY: ours to close.
    unsafe { libc::close(watch_fd) };
    assert!(
        seen.is_empty(),
        "something outside the root was opened, read or changed: {seen:?}"
    );
    assert_eq!(
        exact(&g.outside),
        outside_before,
        "the outside folder changed"
    );
    for obj in all_objects(&g.repo) {
        assert!(
            !obj.windows(CANARY.len()).any(|w| w == CANARY.as_bytes()),
            "a stored object holds an outside file"
        );
    }
    // Restores that stopped took their stage with them.
    let left: Vec<_> = fs::read_dir(&g.root)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.as_bytes().starts_with(b".cairn-stage-"))
        .collect();
    assert!(left.is_empty(), "stages left in the root: {left:?}");
    let swaps = swaps.load(Ordering::Relaxed);
    assert!(swaps > 100, "the node hardly raced: {swaps} swaps");
    assert!(
        walked > 0 && restored > 0,
        "walked {walked}, restored {restored}, refused {refused}"
    );
    eprintln!("{swaps} swaps; {walked} walks, {restored} restores done, {refused} refused");
}
