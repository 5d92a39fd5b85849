//! Snapshots and restores of real folders: what comes back is byte for byte
//! what was there, what snapshots leave out is left alone, and git itself
//! reads the trees.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::Path;

use cairn_snapshot::{ObjectId, Options, SkipReason, SnapshotError, SnapshotStore};
use proptest::prelude::*;

/// Everything a restore must bring back: per path, what it is and holds.
fn picture(root: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    fn walk(dir: &Path, rel: &str, out: &mut BTreeMap<String, String>) {
        for e in fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            let rel = if rel.is_empty() {
                name.clone()
            } else {
                format!("{rel}/{name}")
            };
            let m = fs::symlink_metadata(e.path()).unwrap();
            if m.is_symlink() {
                let t = fs::read_link(e.path()).unwrap();
                out.insert(rel, format!("link -> {}", t.display()));
            } else if m.is_dir() {
                out.insert(rel.clone(), "dir".into());
                walk(&e.path(), &rel, out);
            } else {
                let x = m.permissions().mode() & 0o111 != 0;
                let bytes = fs::read(e.path()).unwrap();
                out.insert(
                    rel,
                    format!("file x={x} {}", String::from_utf8_lossy(&bytes)),
                );
            }
        }
    }
    walk(root, "", &mut out);
    out
}

fn store(dir: &Path) -> SnapshotStore {
    SnapshotStore::open(dir.join("snapshots"), Options::default()).unwrap()
}

#[test]
fn a_restore_brings_back_every_file_byte_for_byte() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    fs::create_dir_all(root.join("src/deep/er")).unwrap();
    fs::write(root.join("README"), "hello\n").unwrap();
    fs::write(root.join("src/main.rs"), "fn main() {}\n").unwrap();
    fs::write(root.join("src/deep/er/x.bin"), [0u8, 1, 2, 255, 0]).unwrap();
    fs::write(root.join("run.sh"), "#!/bin/sh\necho hi\n").unwrap();
    fs::set_permissions(root.join("run.sh"), fs::Permissions::from_mode(0o755)).unwrap();
    symlink("src/main.rs", root.join("link")).unwrap();
    fs::create_dir(root.join("will-be-file")).unwrap();
    fs::write(root.join("will-be-file/inner"), "x").unwrap();
    fs::write(root.join("will-be-dir"), "y").unwrap();
    let before = picture(&root);
    let s = store(tmp.path());
    let snap = s.snapshot(&root, &[]).unwrap();
    assert_eq!(snap.files, 7);

    // What an agent might do.
    fs::write(root.join("README"), "changed\n").unwrap();
    fs::remove_file(root.join("src/main.rs")).unwrap();
    fs::write(root.join("src/new.rs"), "new").unwrap();
    fs::create_dir_all(root.join("made/a/b")).unwrap();
    fs::write(root.join("made/a/b/c"), "c").unwrap();
    fs::set_permissions(root.join("run.sh"), fs::Permissions::from_mode(0o644)).unwrap();
    fs::remove_file(root.join("link")).unwrap();
    symlink("/etc/passwd", root.join("link")).unwrap();
    fs::remove_dir_all(root.join("will-be-file")).unwrap();
    fs::write(root.join("will-be-file"), "now a file").unwrap();
    fs::remove_file(root.join("will-be-dir")).unwrap();
    fs::create_dir(root.join("will-be-dir")).unwrap();
    fs::write(root.join("will-be-dir/z"), "z").unwrap();
    fs::create_dir(root.join("empty")).unwrap();
    assert_ne!(picture(&root), before);

    let done = s.restore(&root, snap.id, &[]).unwrap();
    assert!(done.written >= 5 && done.removed >= 5, "{done:?}");
    assert_eq!(picture(&root), before);
    // The restore's own "before" is a snapshot too: restoring it redoes
    // what the restore undid.
    s.restore(&root, done.before, &[]).unwrap();
    assert_eq!(
        picture(&root).get("made/a/b/c").map(String::as_str),
        Some("file x=false c")
    );
    s.restore(&root, snap.id, &[]).unwrap();
    assert_eq!(picture(&root), before);
}

#[test]
fn git_folders_and_excluded_paths_are_never_touched() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    fs::create_dir_all(root.join(".git/objects")).unwrap();
    fs::write(root.join(".git/index"), "the user's index").unwrap();
    fs::create_dir_all(root.join(".cairn")).unwrap();
    fs::write(root.join(".cairn/cairn.db"), "store").unwrap();
    fs::write(root.join("a.txt"), "a").unwrap();
    let s = SnapshotStore::open(root.join(".cairn/snapshots"), Options::default()).unwrap();
    let exclude = [root.join(".cairn")];
    let snap = s.snapshot(&root, &exclude).unwrap();
    assert_eq!(
        s.list(snap.id).unwrap(),
        [("a.txt".to_string(), cairn_snapshot::Mode::File)]
    );

    fs::write(root.join(".git/index"), "changed by git").unwrap();
    fs::write(root.join(".git/new"), "new").unwrap();
    fs::write(root.join(".cairn/cairn.db"), "store, later").unwrap();
    fs::write(root.join("a.txt"), "edited").unwrap();
    s.restore(&root, snap.id, &exclude).unwrap();
    assert_eq!(fs::read_to_string(root.join("a.txt")).unwrap(), "a");
    assert_eq!(
        fs::read_to_string(root.join(".git/index")).unwrap(),
        "changed by git"
    );
    assert!(root.join(".git/new").exists());
    assert_eq!(
        fs::read_to_string(root.join(".cairn/cairn.db")).unwrap(),
        "store, later"
    );
}

#[test]
fn snapshots_are_incremental() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    for d in 0..5 {
        fs::create_dir_all(root.join(format!("d{d}"))).unwrap();
        for f in 0..20 {
            fs::write(root.join(format!("d{d}/f{f}")), format!("{d}/{f}")).unwrap();
        }
    }
    let s = store(tmp.path());
    let first = s.snapshot(&root, &[]).unwrap();
    // 100 blobs, 5 folders and the root.
    assert_eq!(first.objects_added, 106);
    let again = s.snapshot(&root, &[]).unwrap();
    assert_eq!(
        (again.id, again.objects_added, again.bytes_added),
        (first.id, 0, 0)
    );
    fs::write(root.join("d3/f7"), "edited").unwrap();
    let third = s.snapshot(&root, &[]).unwrap();
    // The new blob, its folder's tree and the root's tree.
    assert_eq!(third.objects_added, 3);
    assert_ne!(third.id, first.id);
    // A new process reads the cache from its file and finds the same.
    let fresh = store(tmp.path());
    assert_eq!(fresh.snapshot(&root, &[]).unwrap().id, third.id);
}

#[test]
fn files_over_the_limit_are_left_out_and_left_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    fs::create_dir_all(&root).unwrap();
    fs::write(root.join("big"), vec![b'x'; 2000]).unwrap();
    fs::write(root.join("small"), "s").unwrap();
    let s = SnapshotStore::open(
        tmp.path().join("snapshots"),
        Options {
            max_file_bytes: 1000,
            ..Options::default()
        },
    )
    .unwrap();
    let snap = s.snapshot(&root, &[]).unwrap();
    assert_eq!(snap.files, 1);
    assert_eq!(snap.skipped.len(), 1);
    assert_eq!(snap.skipped[0].why, SkipReason::TooLarge { bytes: 2000 });
    fs::write(root.join("big"), vec![b'y'; 3000]).unwrap();
    fs::write(root.join("small"), "changed").unwrap();
    s.restore(&root, snap.id, &[]).unwrap();
    assert_eq!(fs::read(root.join("big")).unwrap(), vec![b'y'; 3000]);
    assert_eq!(fs::read_to_string(root.join("small")).unwrap(), "s");
}

#[test]
fn a_root_past_the_limits_is_refused_before_anything_is_stored() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    fs::create_dir_all(root.join("a/b")).unwrap();
    for i in 0..30 {
        fs::write(root.join(format!("a/b/{i}")), "0123456789").unwrap();
    }
    let opts = |files, bytes| Options {
        max_files: files,
        max_total_bytes: bytes,
        ..Options::default()
    };
    let objects = |s: &SnapshotStore| fs::read_dir(s.dir().join("objects")).unwrap().count();
    let s = SnapshotStore::open(tmp.path().join("s1"), opts(20, 1 << 20)).unwrap();
    let err = s.snapshot(&root, &[]).unwrap_err();
    assert!(matches!(err, SnapshotError::TooLarge(_)), "{err}");
    assert!(err.to_string().contains("more than 20 files"), "{err}");
    assert_eq!(objects(&s), 0, "nothing stored");
    let s = SnapshotStore::open(tmp.path().join("s2"), opts(1000, 200)).unwrap();
    assert!(s
        .snapshot(&root, &[])
        .unwrap_err()
        .to_string()
        .contains("MiB"));
    // Within the limits, then past them once the root grows: refused too.
    let s = SnapshotStore::open(tmp.path().join("s3"), opts(35, 1 << 20)).unwrap();
    s.snapshot(&root, &[]).unwrap();
    for i in 30..40 {
        fs::write(root.join(format!("a/{i}")), "x").unwrap();
    }
    assert!(matches!(
        s.snapshot(&root, &[]),
        Err(SnapshotError::TooLarge(_))
    ));
}

#[test]
fn a_link_planted_in_place_of_a_folder_is_not_written_through() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let outside = tmp.path().join("outside");
    fs::create_dir_all(root.join("sub")).unwrap();
    fs::create_dir_all(&outside).unwrap();
    fs::write(root.join("sub/file"), "mine").unwrap();
    let s = store(tmp.path());
    let snap = s.snapshot(&root, &[]).unwrap();
    // A hostile program swaps the folder for a link to somewhere else.
    fs::remove_dir_all(root.join("sub")).unwrap();
    symlink(&outside, root.join("sub")).unwrap();
    s.restore(&root, snap.id, &[]).unwrap();
    assert!(fs::symlink_metadata(root.join("sub")).unwrap().is_dir());
    assert_eq!(fs::read_to_string(root.join("sub/file")).unwrap(), "mine");
    assert_eq!(
        fs::read_dir(&outside).unwrap().count(),
        0,
        "nothing written outside"
    );
}

#[test]
fn unknown_and_malformed_ids_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    fs::create_dir_all(&root).unwrap();
    let s = store(tmp.path());
    let missing: ObjectId = "0123456789abcdef0123456789abcdef01234567".parse().unwrap();
    assert!(matches!(
        s.restore(&root, missing, &[]),
        Err(SnapshotError::Missing(_))
    ));
    assert!("../../x".parse::<ObjectId>().is_err());
    // An empty root is the empty tree, and restoring it empties the root.
    let empty = s.snapshot(&root, &[]).unwrap();
    assert_eq!(empty.id, ObjectId::EMPTY_TREE);
    fs::write(root.join("x"), "x").unwrap();
    s.restore(&root, empty.id, &[]).unwrap();
    assert_eq!(fs::read_dir(&root).unwrap().count(), 0);
}

#[test]
fn a_damaged_object_is_found_before_anything_is_written() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    fs::create_dir_all(&root).unwrap();
    fs::write(root.join("a"), "a").unwrap();
    let s = store(tmp.path());
    let snap = s.snapshot(&root, &[]).unwrap();
    let hex = snap.id.to_string();
    let obj = tmp
        .path()
        .join("snapshots/objects")
        .join(&hex[..2])
        .join(&hex[2..]);
    fs::set_permissions(&obj, fs::Permissions::from_mode(0o644)).unwrap();
    fs::write(&obj, "not zlib").unwrap();
    fs::write(root.join("a"), "kept").unwrap();
    assert!(matches!(
        s.restore(&root, snap.id, &[]),
        Err(SnapshotError::Corrupt { .. })
    ));
    assert_eq!(fs::read_to_string(root.join("a")).unwrap(), "kept");
}

#[test]
fn git_reads_the_trees() {
    let Ok(out) = std::process::Command::new("git").arg("--version").output() else {
        eprintln!("SKIPPED git_reads_the_trees: no `git` program on this machine");
        return;
    };
    assert!(out.status.success());
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    fs::create_dir_all(root.join("a/b")).unwrap();
    fs::write(root.join("a/b/c.txt"), "c\n").unwrap();
    fs::write(root.join("a.txt"), "a\n").unwrap();
    fs::write(root.join("a-b"), "ab\n").unwrap();
    symlink("a.txt", root.join("l")).unwrap();
    let s = store(tmp.path());
    let snap = s.snapshot(&root, &[]).unwrap();
    let git = |args: &[&str]| {
        let out = std::process::Command::new("git")
            .arg("--git-dir")
            .arg(s.dir())
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let listing = git(&["ls-tree", "-r", &snap.id.to_string()]);
    let names: Vec<&str> = listing
        .lines()
        .map(|l| l.split('\t').nth(1).unwrap())
        .collect();
    assert_eq!(names, ["a-b", "a.txt", "a/b/c.txt", "l"]);
    assert!(listing.contains("120000 blob"));
    // git's own check of the objects finds nothing wrong.
    git(&["fsck", "--strict", "--no-dangling"]);
    assert_eq!(
        git(&["cat-file", "-p", &format!("{}:a/b/c.txt", snap.id)]),
        "c\n"
    );
}

#[derive(Debug, Clone)]
enum Op {
    Write(u8, u8, Vec<u8>),
    Remove(u8, u8),
    MakeDir(u8, u8),
    Link(u8, u8),
    Exec(u8, u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (
            0..3u8,
            0..4u8,
            proptest::collection::vec(any::<u8>(), 0..64)
        )
            .prop_map(|(d, f, b)| Op::Write(d, f, b)),
        (0..3u8, 0..4u8).prop_map(|(d, f)| Op::Remove(d, f)),
        (0..3u8, 0..4u8).prop_map(|(d, f)| Op::MakeDir(d, f)),
        (0..3u8, 0..4u8).prop_map(|(d, f)| Op::Link(d, f)),
        (0..3u8, 0..4u8).prop_map(|(d, f)| Op::Exec(d, f)),
    ]
}

fn apply(root: &Path, ops: &[Op]) {
    let path = |d: u8, f: u8| root.join(format!("d{d}")).join(format!("f{f}"));
    for o in ops {
        let _ = match o {
            Op::Write(d, f, b) => fs::create_dir_all(root.join(format!("d{d}")))
                .and_then(|_| fs::write(path(*d, *f), b)),
            Op::Remove(d, f) => {
                let p = path(*d, *f);
                fs::remove_file(&p).or_else(|_| fs::remove_dir_all(&p))
            }
            Op::MakeDir(d, f) => fs::create_dir_all(path(*d, *f).join("inner"))
                .and_then(|_| fs::write(path(*d, *f).join("inner/x"), "x")),
            Op::Link(d, f) => fs::create_dir_all(root.join(format!("d{d}")))
                .and_then(|_| symlink(format!("../d{}", (d + 1) % 3), path(*d, *f))),
            Op::Exec(d, f) => fs::set_permissions(path(*d, *f), fs::Permissions::from_mode(0o755)),
        };
    }
}

/// Only what snapshots keep: no empty folders.
fn kept(p: BTreeMap<String, String>) -> BTreeMap<String, String> {
    let files: Vec<String> = p
        .iter()
        .filter(|(_, v)| *v != "dir")
        .map(|(k, _)| k.clone())
        .collect();
    p.into_iter()
        .filter(|(k, v)| *v != "dir" || files.iter().any(|f| f.starts_with(&format!("{k}/"))))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
    #[test]
    fn whatever_happens_after_a_snapshot_a_restore_undoes_it(
        setup in proptest::collection::vec(op(), 0..12),
        mess in proptest::collection::vec(op(), 1..16),
    ) {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        fs::create_dir_all(&root).unwrap();
        apply(&root, &setup);
        let s = store(tmp.path());
        let snap = s.snapshot(&root, &[]).unwrap();
        let before = kept(picture(&root));
        apply(&root, &mess);
        s.restore(&root, snap.id, &[]).unwrap();
        prop_assert_eq!(kept(picture(&root)), before);
    }
}

#[test]
fn a_prune_keeps_what_is_named_or_cached_and_deletes_the_rest() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    fs::create_dir_all(root.join("d")).unwrap();
    fs::write(root.join("d/kept"), "in both").unwrap();
    fs::write(root.join("gone"), "only in the first").unwrap();
    let s = store(tmp.path());
    let first = s.snapshot(&root, &[]).unwrap();
    fs::remove_file(root.join("gone")).unwrap();
    fs::write(root.join("d/new"), "only in the second").unwrap();
    let second = s.snapshot(&root, &[]).unwrap();
    // Within the grace period nothing goes, named or not.
    let none = s.prune(&[], std::time::Duration::from_secs(3600)).unwrap();
    assert_eq!(none.objects, 0);
    // Past it: the first snapshot's own objects go (its trees and the blob
    // only it had); the second's, and what the root's cache names, stay.
    let pruned = s.prune(&[second.id], std::time::Duration::ZERO).unwrap();
    assert!(pruned.objects >= 3, "{pruned:?}");
    assert!(matches!(
        s.restore(&root, first.id, &[]),
        Err(SnapshotError::Missing(_))
    ));
    fs::write(root.join("d/kept"), "changed").unwrap();
    s.restore(&root, second.id, &[]).unwrap();
    assert_eq!(fs::read_to_string(root.join("d/kept")).unwrap(), "in both");
    assert_eq!(
        fs::read_to_string(root.join("d/new")).unwrap(),
        "only in the second"
    );
    // A new snapshot of the unchanged root still reads back whole.
    let third = s.snapshot(&root, &[]).unwrap();
    assert_eq!(third.id, second.id);
    assert_eq!(s.list(third.id).unwrap().len(), 2);
}

#[test]
fn a_selective_restore_touches_only_the_paths_it_is_given() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    fs::create_dir_all(root.join("src")).unwrap();
    fs::write(root.join("src/a.rs"), "a1").unwrap();
    fs::write(root.join("gone"), "was here").unwrap();
    fs::write(root.join("x"), "a file").unwrap();
    fs::write(root.join("theirs"), "t1").unwrap();
    let store = store(tmp.path());
    let snap = store.snapshot(&root, &[]).unwrap();
    let flat = store.flat(snap.id).unwrap();
    assert_eq!(
        flat.keys().cloned().collect::<Vec<_>>(),
        [&b"gone"[..], b"src/a.rs", b"theirs", b"x"]
    );
    assert_eq!(flat[&b"x"[..]].0, cairn_snapshot::Mode::File);

    // The run's changes...
    fs::write(root.join("src/a.rs"), "a2").unwrap();
    fs::create_dir_all(root.join("new/deep")).unwrap();
    fs::write(root.join("new/deep/b"), "b").unwrap();
    fs::remove_file(root.join("gone")).unwrap();
    fs::remove_file(root.join("x")).unwrap();
    fs::create_dir(root.join("x")).unwrap();
    fs::write(root.join("x/inside"), "i").unwrap();
    // ... and someone else's.
    fs::write(root.join("theirs"), "t2").unwrap();
    fs::write(root.join("other"), "o").unwrap();

    let paths: Vec<Vec<u8>> = ["src/a.rs", "new/deep/b", "gone", "x", "x/inside"]
        .iter()
        .map(|p| p.as_bytes().to_vec())
        .collect();
    let r = store.restore_paths(&root, snap.id, &paths, &[]).unwrap();
    assert_eq!(r.written, 3);
    let now = picture(&root);
    assert_eq!(now["src/a.rs"], "file x=false a1");
    assert_eq!(now["gone"], "file x=false was here");
    assert_eq!(now["x"], "file x=false a file");
    assert!(!now.contains_key("new"), "{now:?}");
    assert_eq!(now["theirs"], "file x=false t2");
    assert_eq!(now["other"], "file x=false o");
    // Restoring what it was before the restore undoes it, for these paths.
    store.restore_paths(&root, r.before, &paths, &[]).unwrap();
    assert_eq!(picture(&root)["src/a.rs"], "file x=false a2");
    assert_eq!(picture(&root)["x/inside"], "file x=false i");
}

#[test]
fn a_selective_restore_refuses_what_is_in_the_way_and_odd_paths() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    fs::create_dir_all(root.join("d")).unwrap();
    fs::write(root.join("d/f"), "f").unwrap();
    let store = store(tmp.path());
    let snap = store.snapshot(&root, &[]).unwrap();
    fs::remove_dir_all(root.join("d")).unwrap();
    fs::write(root.join("d"), "someone's file").unwrap();
    let e = store
        .restore_paths(&root, snap.id, &[b"d/f".to_vec()], &[])
        .unwrap_err();
    assert!(matches!(e, SnapshotError::Conflict(_)), "{e}");
    assert_eq!(fs::read(root.join("d")).unwrap(), b"someone's file");
    for bad in [&b""[..], b"/etc/passwd", b"a/../b", b"a//b", b"./a", b"a/"] {
        let e = store
            .restore_paths(&root, snap.id, &[bad.to_vec()], &[])
            .unwrap_err();
        assert!(matches!(e, SnapshotError::BadPath(_)), "{e}");
    }
}

/// Every entry under `root` with its bytes (files), target (links) or
/// nothing (folders and the rest): what "nothing changed" compares.
fn exact(root: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    fn walk(dir: &Path, rel: &str, out: &mut BTreeMap<String, Vec<u8>>) {
        for e in fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let rel = format!("{rel}/{}", e.file_name().to_string_lossy());
            let m = fs::symlink_metadata(e.path()).unwrap();
            if m.is_symlink() {
                let t = fs::read_link(e.path()).unwrap();
                out.insert(rel, t.as_os_str().as_encoded_bytes().to_vec());
            } else if m.is_dir() {
                out.insert(rel.clone(), b"dir".to_vec());
                walk(&e.path(), &rel, out);
            } else if m.is_file() {
                out.insert(rel, fs::read(e.path()).unwrap());
            } else {
                out.insert(rel, b"other".to_vec());
            }
        }
    }
    walk(root, "", &mut out);
    out
}

#[test]
fn a_walk_changes_nothing_in_the_root_and_leaves_out_nested_stores() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    fs::create_dir_all(root.join("sub/.cairn/snapshots")).unwrap();
    fs::create_dir_all(root.join(".cairn")).unwrap();
    fs::write(root.join(".cairn/cairn.db"), "store").unwrap();
    fs::write(root.join("sub/.cairn/snapshots/x"), "nested store").unwrap();
    // A write tool's temporary file in another node, and a user's file
    // that looks like a restore's stage: both are someone's, both stay.
    fs::write(root.join(".cairn-tmp-123-4-5"), "half of a tool's write").unwrap();
    fs::create_dir(root.join(".cairn-stage-1-2-3")).unwrap();
    fs::write(root.join(".cairn-stage-1-2-3/f"), "mine").unwrap();
    fs::write(root.join("sub/.cairn-file"), "a file named like it").unwrap();
    let before = exact(&root);
    let store = store(tmp.path());
    let s = store.snapshot(&root, &[]).unwrap();
    assert_eq!(exact(&root), before, "a walk changed the root");
    let names: Vec<String> = store
        .list(s.id)
        .unwrap()
        .into_iter()
        .map(|(p, _)| p)
        .collect();
    assert_eq!(
        names,
        [
            ".cairn-stage-1-2-3/f",
            ".cairn-tmp-123-4-5",
            "sub/.cairn-file"
        ]
    );
    // A restore leaves the nested stores alone too.
    fs::write(root.join("new"), "n").unwrap();
    store.restore(&root, s.id, &[]).unwrap();
    let mut after = exact(&root);
    assert!(
        after.remove("/new").is_none(),
        "the restore kept a new file"
    );
    assert_eq!(after, before);
}

#[test]
fn an_interrupted_restores_stage_is_found_by_its_record_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    fs::create_dir_all(&root).unwrap();
    fs::write(root.join("a"), "a").unwrap();
    let store = store(tmp.path());
    let s = store.snapshot(&root, &[]).unwrap();
    // What a kill while staging leaves: the record, then the folder.
    let stage = ".cairn-stage-999-0-1";
    let records: Vec<_> = fs::read_dir(store.dir().join("cairn"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "lock"))
        .collect();
    assert_eq!(records.len(), 1);
    let record = records[0].with_extension("stage");
    fs::write(&record, format!("cairn-stage 1\n{stage}\n")).unwrap();
    fs::create_dir_all(root.join(stage).join("sub")).unwrap();
    fs::write(root.join(stage).join("0"), "staged").unwrap();
    // The stage holds a link to outside: removed, not followed.
    let outside = tmp.path().join("outside");
    fs::create_dir(&outside).unwrap();
    fs::write(outside.join("keep"), "keep").unwrap();
    symlink(&outside, root.join(stage).join("sub/out")).unwrap();
    // A look-alike that is no record's: the user's.
    fs::create_dir(root.join(".cairn-stage-1-1-1")).unwrap();
    fs::write(root.join(".cairn-stage-1-1-1/f"), "mine").unwrap();

    let snap = store.snapshot(&root, &[]).unwrap();
    let names: Vec<String> = store
        .list(snap.id)
        .unwrap()
        .into_iter()
        .map(|(p, _)| p)
        .collect();
    assert_eq!(names, [".cairn-stage-1-1-1/f", "a"], "the stage is skipped");
    assert!(root.join(stage).exists(), "a walk removes nothing");

    fs::write(root.join("a"), "changed").unwrap();
    store.restore(&root, s.id, &[]).unwrap();
    assert!(!root.join(stage).exists(), "the recorded stage is removed");
    assert!(!record.exists(), "and its record");
    assert_eq!(fs::read(outside.join("keep")).unwrap(), b"keep");
    assert_eq!(fs::read(root.join("a")).unwrap(), b"a");
    // The look-alike was not in snapshot `s`: the restore removes it as
    // any other file the snapshot does not have, by its walk, not its name.
    assert!(!root.join(".cairn-stage-1-1-1").exists());
}

#[test]
fn fifos_sockets_and_devices_in_the_root_do_not_block_a_walk() {
    use std::os::unix::ffi::OsStrExt;
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    fs::create_dir_all(&root).unwrap();
    fs::write(root.join("f"), "f").unwrap();
    let c = |name: &str| std::ffi::CString::new(root.join(name).as_os_str().as_bytes()).unwrap();
    // SAFETY: valid C strings.
    assert_eq!(unsafe { libc::mkfifo(c("fifo").as_ptr(), 0o644) }, 0);
    let _sock = std::os::unix::net::UnixListener::bind(root.join("sock")).unwrap();
    // A character device like /dev/zero, where the kernel lets us make
    // one (root in a container usually may; elsewhere a FIFO must do).
    // SAFETY: valid C string.
    let dev = unsafe {
        libc::mknod(
            c("zero").as_ptr(),
            libc::S_IFCHR | 0o666,
            libc::makedev(1, 5),
        )
    } == 0;
    let (tx, rx) = std::sync::mpsc::channel();
    let walk_root = root.clone();
    let repo = tmp.path().to_path_buf();
    std::thread::spawn(move || {
        let store = store(&repo);
        let s = store
            .snapshot(&walk_root, &[])
            .map(|s| (s.files, s.skipped.len()));
        let _ = tx.send(s.map_err(|e| e.to_string()));
    });
    let (files, skipped) = rx
        .recv_timeout(std::time::Duration::from_secs(30))
        .expect("the walk did not finish: it blocked on a FIFO or a device")
        .unwrap();
    assert_eq!(files, 1);
    assert_eq!(skipped, if dev { 3 } else { 2 });
}

/// Every object of the repository at `dir`, inflated.
fn inflated_objects(dir: &Path) -> Vec<Vec<u8>> {
    use std::io::Read;
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let raw = fs::read(&p).unwrap();
                let mut text = Vec::new();
                if flate2::read::ZlibDecoder::new(&raw[..])
                    .read_to_end(&mut text)
                    .is_ok()
                {
                    out.push(text);
                } else {
                    out.push(raw);
                }
            }
        }
    }
    out
}

#[test]
fn files_and_links_that_hold_a_withheld_value_are_left_out_and_left_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    fs::create_dir_all(root.join("conf")).unwrap();
    let secret = b"tok-51c0ffee9d".to_vec();
    fs::write(
        root.join("conf/.npmrc"),
        b"//registry/:_authToken=tok-51c0ffee9d\n",
    )
    .unwrap();
    fs::write(root.join("plain.txt"), "nothing to hide").unwrap();
    symlink("tok-51c0ffee9d", root.join("link")).unwrap();
    let s = store(tmp.path());
    let snap = s
        .snapshot_withholding(&root, &[], std::slice::from_ref(&secret))
        .unwrap();
    let mut held: Vec<(String, SkipReason)> = snap
        .skipped
        .iter()
        .map(|k| (k.path.clone(), k.why.clone()))
        .collect();
    held.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        held,
        vec![
            ("conf/.npmrc".to_string(), SkipReason::HoldsSecret),
            ("link".to_string(), SkipReason::HoldsSecret),
        ]
    );
    let listed: Vec<String> = s
        .list(snap.id)
        .unwrap()
        .into_iter()
        .map(|(p, _)| p)
        .collect();
    assert_eq!(listed, vec!["plain.txt".to_string()]);
    // No object of the repository holds the value, stored or compressed.
    let objects = inflated_objects(&tmp.path().join("snapshots"));
    assert!(!objects.is_empty());
    for o in &objects {
        assert!(
            memchr_find(o, &secret).is_none(),
            "an object holds the secret: {}",
            String::from_utf8_lossy(o)
        );
    }
    // A second snapshot reads the file again (it was never remembered) and
    // leaves it out again.
    let again = s
        .snapshot_withholding(&root, &[], std::slice::from_ref(&secret))
        .unwrap();
    assert_eq!(again.id, snap.id);
    assert_eq!(again.skipped.len(), 2);
    // Putting a path back leaves what was withheld as it is.
    fs::write(root.join("plain.txt"), "changed").unwrap();
    s.restore_paths(&root, snap.id, &[b"plain.txt".to_vec()], &[])
        .unwrap();
    assert_eq!(
        fs::read_to_string(root.join("plain.txt")).unwrap(),
        "nothing to hide"
    );
    assert_eq!(
        fs::read(root.join("conf/.npmrc")).unwrap(),
        b"//registry/:_authToken=tok-51c0ffee9d\n"
    );
}

fn memchr_find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// A mirror in memory, as the database of a shared store keeps objects.
#[derive(Default)]
struct MemoryMirror(
    std::sync::Mutex<std::collections::HashMap<ObjectId, cairn_snapshot::MirroredObject>>,
);

impl cairn_snapshot::ObjectMirror for MemoryMirror {
    fn holds(&self, ids: &[ObjectId]) -> Result<std::collections::HashSet<ObjectId>, String> {
        let m = self.0.lock().unwrap();
        Ok(ids.iter().filter(|i| m.contains_key(i)).copied().collect())
    }
    fn put(&self, objects: &[cairn_snapshot::MirroredObject]) -> Result<(), String> {
        let mut m = self.0.lock().unwrap();
        for o in objects {
            m.entry(o.id).or_insert_with(|| o.clone());
        }
        Ok(())
    }
    fn get(&self, ids: &[ObjectId]) -> Result<Vec<cairn_snapshot::MirroredObject>, String> {
        let m = self.0.lock().unwrap();
        Ok(ids.iter().filter_map(|i| m.get(i).cloned()).collect())
    }
    fn retain(
        &self,
        live: &std::collections::HashSet<ObjectId>,
        _grace: std::time::Duration,
    ) -> Result<(u64, u64, u64), String> {
        let mut m = self.0.lock().unwrap();
        let before = m.len();
        let mut bytes = 0;
        m.retain(|id, o| {
            let keep = live.contains(id);
            if !keep {
                bytes += o.body.len() as u64;
            }
            keep
        });
        Ok(((before - m.len()) as u64, bytes, m.len() as u64))
    }
}

/// With a mirror, a snapshot taken through one repository restores
/// through another that never saw it (the objects come from the mirror,
/// each checked against its name), and a prune of the mirror keeps what
/// the named snapshots reach.
#[test]
fn a_mirrored_snapshot_restores_through_another_repository() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    fs::create_dir_all(root.join("d/e")).unwrap();
    fs::write(root.join("d/e/deep"), "deep").unwrap();
    fs::write(root.join("top"), "top").unwrap();
    symlink("top", root.join("link")).unwrap();
    let mirror = std::sync::Arc::new(MemoryMirror::default());
    let open = |name: &str| {
        SnapshotStore::open(tmp.path().join(name), Options::default())
            .unwrap()
            .with_mirror(mirror.clone())
    };
    let here = open("here");
    let snap = here.snapshot(&root, &[]).unwrap();
    let before = picture(&root);
    // Trees root, d, d/e; blobs deep, top, and the link's target (= top).
    assert_eq!(mirror.0.lock().unwrap().len(), 5);
    fs::remove_dir_all(root.join("d")).unwrap();
    fs::write(root.join("top"), "changed").unwrap();
    let there = open("there");
    there.restore(&root, snap.id, &[]).unwrap();
    assert_eq!(picture(&root), before);
    // Without the mirror, that repository never had it.
    let alone = SnapshotStore::open(tmp.path().join("alone"), Options::default()).unwrap();
    assert!(matches!(
        alone.restore(&root, snap.id, &[]),
        Err(SnapshotError::Missing(_))
    ));
    // A damaged copy is refused and written nowhere.
    let deep = ObjectId::of(cairn_snapshot::Kind::Blob, b"deep");
    mirror.0.lock().unwrap().get_mut(&deep).unwrap().body = b"planted".to_vec();
    fs::remove_dir_all(root.join("d")).unwrap();
    let third = open("third");
    assert!(matches!(
        third.restore(&root, snap.id, &[]),
        Err(SnapshotError::Corrupt { .. })
    ));
    assert!(!root.join("d").exists());
    // Pruned: a snapshot named keeps what it reaches.
    fs::write(root.join("extra"), "extra").unwrap();
    let second = here.snapshot(&root, &[]).unwrap();
    let pruned = here
        .prune_mirror(&[snap.id], std::time::Duration::ZERO)
        .unwrap()
        .unwrap();
    assert!(pruned.objects >= 2, "{pruned:?}");
    assert!(mirror.0.lock().unwrap().contains_key(&snap.id));
    assert!(!mirror.0.lock().unwrap().contains_key(&second.id));
}
