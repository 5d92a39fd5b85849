//! Time and space of a workspace snapshot of a 10,000-file root.
//!
//! `cargo bench -p cairn-snapshot` (`CAIRN_BENCH_FILES` changes the count).
//! The baseline, measured in the same run on the same files, is a plain
//! copy of the root (every file read and written once): what a snapshot
//! that is not incremental would cost at the least. Each case prints its
//! median over several repeats and its ratio to that copy.
//!
//! The files are made, then the bench waits out the stat cache's two
//! seconds of distrust for files written just before a walk, as a real
//! root's files are (an agent's own edits are read again once, then
//! trusted).

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cairn_snapshot::{Options, SnapshotStore};

const REPEATS: usize = 5;

fn main() {
    let n: usize = std::env::var("CAIRN_BENCH_FILES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let tmp = tempfile::tempdir().expect("a temporary folder");
    let root = tmp.path().join("root");
    let bytes = make_root(&root, n);
    std::thread::sleep(Duration::from_millis(2100));
    println!(
        "root: {n} files in {} folders, {:.1} MiB",
        n.div_ceil(100),
        mib(bytes)
    );

    // Baseline: a copy of every file.
    let copy_times: Vec<Duration> = (0..REPEATS)
        .map(|i| {
            let dest = tmp.path().join(format!("copy{i}"));
            let t = Instant::now();
            copy_tree(&root, &dest);
            let d = t.elapsed();
            fs::remove_dir_all(&dest).unwrap();
            d
        })
        .collect();
    let copy = median(copy_times);
    println!(
        "{:<44} {:>10} {:>12} {:>8}",
        "case", "time", "space", "vs copy"
    );
    row("baseline: copy every file", copy, bytes, copy, bytes);

    // First snapshot, into an empty repository (and cold stat cache).
    let mut firsts = Vec::new();
    let mut first_space = 0;
    for i in 0..REPEATS {
        let repo = tmp.path().join(format!("repo{i}"));
        let store = SnapshotStore::open(&repo, Options::default()).unwrap();
        let t = Instant::now();
        let s = store.snapshot(&root, &[]).unwrap();
        firsts.push(t.elapsed());
        first_space = s.bytes_added;
        assert_eq!(s.files as usize, n);
        if i > 0 {
            fs::remove_dir_all(&repo).unwrap();
        }
    }
    row(
        "first snapshot (empty repository)",
        median(firsts),
        first_space,
        copy,
        bytes,
    );
    let repo = tmp.path().join("repo0");

    // Unchanged root, the stat cache in memory (a long-lived engine).
    let store = SnapshotStore::open(&repo, Options::default()).unwrap();
    store.snapshot(&root, &[]).unwrap();
    let (t, space) = measure(|| store.snapshot(&root, &[]).unwrap().bytes_added);
    row("unchanged root, cache in memory", t, space, copy, bytes);

    // Unchanged root, a new process (the cache read from its file).
    let (t, space) = measure(|| {
        let fresh = SnapshotStore::open(&repo, Options::default()).unwrap();
        fresh.snapshot(&root, &[]).unwrap().bytes_added
    });
    row("unchanged root, new process", t, space, copy, bytes);

    // Ten files edited and one added since the last snapshot.
    let mut round = 0;
    let (t, space) = measure(|| {
        round += 1;
        for i in 0..10 {
            let p = file_path(&root, i * 97 % n);
            fs::write(&p, format!("edited in round {round}\n{}", body(i, 2000))).unwrap();
        }
        fs::write(root.join(format!("new-{round}.txt")), body(round, 1500)).unwrap();
        store.snapshot(&root, &[]).unwrap().bytes_added
    });
    row("10 files edited, 1 added", t, space, copy, bytes);

    // Restore: 10 edited, 10 added, 10 deleted since the snapshot.
    let base = store.snapshot(&root, &[]).unwrap().id;
    let mut restore_times = Vec::new();
    for r in 0..REPEATS {
        for i in 0..10 {
            fs::write(file_path(&root, (i * 31 + r) % n), "scribbled").unwrap();
            fs::write(root.join(format!("junk-{r}-{i}")), "junk").unwrap();
            let _ = fs::remove_file(file_path(&root, (i * 53 + 7 + r) % n));
        }
        let t = Instant::now();
        let done = store.restore(&root, base, &[]).unwrap();
        restore_times.push(t.elapsed());
        assert!(done.written >= 10 && done.removed >= 10, "{done:?}");
    }
    row(
        "restore: 10 edited, 10 added, 10 deleted",
        median(restore_times),
        0,
        copy,
        bytes,
    );
    let repo_bytes = du(&repo);
    println!(
        "repository after every case: {:.1} MiB ({:.2}x the root)",
        mib(repo_bytes),
        repo_bytes as f64 / bytes as f64
    );
}

fn measure(mut f: impl FnMut() -> u64) -> (Duration, u64) {
    let mut times = Vec::new();
    let mut spaces = Vec::new();
    for _ in 0..REPEATS {
        let t = Instant::now();
        spaces.push(f());
        times.push(t.elapsed());
    }
    spaces.sort_unstable();
    (median(times), spaces[spaces.len() / 2])
}

fn row(name: &str, t: Duration, space: u64, copy: Duration, copy_bytes: u64) {
    println!(
        "{name:<44} {:>8.2}ms {:>10.1}KiB {:>7.3}x time {:>6.3}x space",
        t.as_secs_f64() * 1e3,
        space as f64 / 1024.0,
        t.as_secs_f64() / copy.as_secs_f64(),
        space as f64 / copy_bytes as f64,
    );
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort_unstable();
    v[v.len() / 2]
}

fn mib(b: u64) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

fn file_path(root: &Path, i: usize) -> PathBuf {
    root.join(format!("d{:03}", i / 100))
        .join(format!("f{:03}.txt", i % 100))
}

/// Text that compresses like source code does (words, not one repeated byte).
fn body(seed: usize, len: usize) -> String {
    const WORDS: [&str; 16] = [
        "fn", "let", "mut", "self", "value", "return", "match", "Some", "None", "error", "path",
        "node", "run", "event", "store", "=>",
    ];
    let mut s = String::with_capacity(len + 16);
    let mut x = seed as u64 * 2_654_435_761 + 1;
    while s.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.push_str(WORDS[(x % 16) as usize]);
        s.push(if x.is_multiple_of(11) { '\n' } else { ' ' });
    }
    s
}

fn make_root(root: &Path, n: usize) -> u64 {
    let mut total = 0;
    for i in 0..n {
        let p = file_path(root, i);
        if i % 100 == 0 {
            fs::create_dir_all(p.parent().unwrap()).unwrap();
        }
        let b = body(i, 1000 + (i * 37) % 3000);
        total += b.len() as u64;
        fs::write(p, b).unwrap();
    }
    total
}

fn copy_tree(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for e in fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dest = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &dest);
        } else {
            fs::copy(e.path(), dest).unwrap();
        }
    }
}

fn du(p: &Path) -> u64 {
    let mut total = 0;
    for e in fs::read_dir(p).unwrap() {
        let e = e.unwrap();
        let m = e.metadata().unwrap();
        total += if m.is_dir() { du(&e.path()) } else { m.len() };
    }
    total
}
