//! Confined programs see the planned view and nothing else.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::Arc;

use cairn_sandbox::{Confinement, Network};

fn run(conf: &Confinement, cwd: &Path, script: &str) -> Output {
    let prep = Arc::new(conf.prepare(cwd).expect("prepare"));
    let p2 = prep.clone();
    let mut cmd = Command::new("/bin/sh");
    cmd.args(["-c", script])
        .current_dir(cwd)
        .stdin(Stdio::null())
        .env_clear()
        .env("PATH", "/usr/bin:/bin");
    // SAFETY: enter is async-signal-safe.
    unsafe {
        cmd.pre_exec(move || p2.enter());
    }
    match cmd.output() {
        Ok(o) => o,
        Err(e) => panic!(
            "spawn: {e}; sandbox: {:?}",
            prep.failure().map(|f| f.into_error().to_string())
        ),
    }
}

fn available() -> bool {
    let ok = cairn_sandbox::probe().checks.iter().take(4).all(|c| c.ok);
    if !ok {
        eprintln!("skipped: this machine has no user namespaces (see `cairn doctor`)");
    }
    ok
}

#[test]
fn the_view_is_the_plan() {
    if !available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(root.join(".cairn")).unwrap();
    std::fs::write(root.join(".cairn/cairn.db"), "store").unwrap();
    std::fs::write(dir.path().join("outside"), "x").unwrap();
    let mut conf = Confinement::new(&root);
    conf.hidden.push(root.join(".cairn"));
    let out = run(
        &conf,
        &root,
        r#"set -u
echo pid=$$
echo hi > inside && echo write-inside=ok
cat .cairn/cairn.db 2>/dev/null && echo store-readable
echo x > .cairn/new 2>/dev/null && echo store-writable
test -e ../outside && echo outside-visible
echo x > /usr/x 2>/dev/null && echo usr-writable
test -s /etc/shadow && echo shadow-readable
echo tmp > /tmp/t && echo tmp=ok
ls /proc | grep -c '^[0-9]' 
test -e /var/run/postgresql && echo pg-visible
echo done"#,
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success());
    assert!(stdout.contains("pid=1\n"));
    assert!(stdout.contains("write-inside=ok"));
    assert!(stdout.contains("tmp=ok"));
    for bad in [
        "store-readable",
        "store-writable",
        "outside-visible",
        "usr-writable",
        "shadow-readable",
        "pg-visible",
    ] {
        assert!(!stdout.contains(bad), "{bad}");
    }
    assert_eq!(
        std::fs::read_to_string(root.join("inside")).unwrap(),
        "hi\n"
    );
    assert!(!root.join(".cairn/new").exists());
    let _ = Network::None;
}

#[test]
fn hidden_paths_outside_the_root_are_simply_absent() {
    if !available() {
        return;
    }
    // The store beside the root, in a folder the root lies in: the sandbox
    // must not try to cover what it does not show.
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("workflows");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(dir.path().join("cairn.db"), "store").unwrap();
    std::fs::create_dir_all(dir.path().join("logs")).unwrap();
    let mut conf = Confinement::new(&root);
    conf.hidden = vec![dir.path().join("cairn.db"), dir.path().join("logs")];
    let out = run(
        &conf,
        &root,
        "test ! -e ../cairn.db && test ! -e ../logs && echo ok",
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "ok\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn only_the_standard_streams_are_inherited() {
    if !available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // An inheritable descriptor the engine "leaked" (no close-on-exec).
    let f = std::fs::File::open("/etc/hostname")
        .unwrap_or_else(|_| std::fs::File::open("/etc/passwd").unwrap());
    use std::os::fd::AsRawFd;
    // SAFETY: dup2 onto an unused number; closed below.
    let leaked = unsafe { libc::dup2(f.as_raw_fd(), 77) };
    assert_eq!(leaked, 77);
    let conf = Confinement::new(dir.path());
    let out = run(
        &conf,
        dir.path(),
        "test -e /proc/self/fd/77 && echo leaked; echo done",
    );
    // SAFETY: closing the descriptor made above.
    unsafe { libc::close(77) };
    assert_eq!(String::from_utf8_lossy(&out.stdout), "done\n");
}

#[test]
fn read_only_folders_under_tmp_are_shown_read_only() {
    if !available() {
        return;
    }
    // Both the root and the folders shown read-only live where the sandbox
    // mounts its private /tmp and /var/tmp (tempfile's default is /tmp).
    let root = tempfile::tempdir().unwrap();
    let tools = tempfile::tempdir().unwrap();
    std::fs::write(tools.path().join("data"), "shown\n").unwrap();
    let prog = tools.path().join("prog");
    std::fs::write(&prog, "#!/bin/sh\necho ran\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o755)).unwrap();
    let var = Path::new("/var/tmp")
        .is_dir()
        .then(|| tempfile::tempdir_in("/var/tmp").unwrap());
    if let Some(v) = &var {
        std::fs::write(v.path().join("data"), "var\n").unwrap();
    }
    let mut conf = Confinement::new(root.path());
    conf.read_only.push(tools.path().into());
    conf.read_only
        .extend(var.iter().map(|v| v.path().to_path_buf()));
    let t = tools.path().display();
    let v = var
        .as_ref()
        .map_or("/nonexistent".into(), |v| v.path().display().to_string());
    let out = run(
        &conf,
        root.path(),
        &format!(
            r#"cat {t}/data
{t}/prog
echo x > {t}/new 2>/dev/null && echo tools-writable
echo x >> {t}/data 2>/dev/null && echo data-writable
test -d {v} && cat {v}/data
echo x > {v}/new 2>/dev/null && echo var-writable
echo private > /tmp/p && cat /tmp/p
echo hi > here && echo root=ok"#
        ),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        stdout.contains("shown\n"),
        "the folder under /tmp is missing"
    );
    assert!(stdout.contains("ran\n"), "its program did not run");
    assert!(stdout.contains("private\n") && stdout.contains("root=ok"));
    if var.is_some() {
        assert!(
            stdout.contains("var\n"),
            "the folder under /var/tmp is missing"
        );
    }
    for bad in ["tools-writable", "data-writable", "var-writable"] {
        assert!(!stdout.contains(bad), "{bad}");
    }
    assert!(!tools.path().join("new").exists());
    assert_eq!(
        std::fs::read_to_string(tools.path().join("data")).unwrap(),
        "shown\n"
    );
}
