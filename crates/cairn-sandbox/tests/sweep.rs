//! Groups a dead engine left behind are removed when the next one starts;
//! a young one is not (its engine may only be invisible from here). A test
//! binary of its own: the sweep runs once per process.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Duration, SystemTime};

use cairn_sandbox::cgroup;

/// Backdates a folder's modification time.
fn age(dir: &Path, by: Duration) {
    let c = CString::new(dir.as_os_str().as_bytes()).unwrap();
    let then = SystemTime::now() - by;
    let secs = then
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let t = libc::timespec {
        tv_sec: secs as libc::time_t,
        tv_nsec: 0,
    };
    // SAFETY: a valid C string and two timespecs.
    let rc = unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), [t, t].as_ptr(), 0) };
    assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
}

#[test]
fn stale_groups_of_dead_engines_are_swept() {
    let before = cgroup::inspect();
    let Some(base) = before.bases().into_iter().next() else {
        eprintln!(
            "skipped: no control group is usable here ({})",
            before.detail
        );
        return;
    };
    // A pid that ran and is gone.
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let stale = base.join(format!("cairn-sbx-{dead}-0"));
    let young = base.join(format!("cairn-sbx-{dead}-1"));
    let _ = std::fs::create_dir(&stale);
    let _ = std::fs::create_dir(&young);
    // The parent of this test is alive: its old group stays.
    let parent = std::os::unix::process::parent_id();
    let alive = base.join(format!("cairn-sbx-{parent}-0"));
    let _ = std::fs::create_dir(&alive);
    age(&stale, Duration::from_secs(3600));
    age(&alive, Duration::from_secs(3600));

    let _ = cgroup::support();
    let (stale_gone, young_kept, alive_kept) = (!stale.exists(), young.exists(), alive.exists());
    for d in [&stale, &young, &alive] {
        let _ = std::fs::remove_dir(d);
    }
    assert!(stale_gone, "{} was not swept", stale.display());
    assert!(young_kept, "{} was swept too early", young.display());
    assert!(
        alive_kept,
        "{} of a living engine was swept",
        alive.display()
    );
}
