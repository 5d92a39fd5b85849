//! Helpers the CLI's integration tests share: waiting for a `cairn` child
//! without hanging CI, and reading what it said.

// Each test binary uses its own subset.
#![allow(dead_code)]

pub mod store;

use std::io::Read;
use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

/// Upper bound on any wait in these tests: a hang fails instead of blocking CI.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// Waits for `child` to exit; fails the test past [`PATIENCE`].
pub fn wait_exit(child: &mut Child) -> ExitStatus {
    let t0 = Instant::now();
    loop {
        if let Some(s) = child.try_wait().expect("wait for cairn") {
            return s;
        }
        assert!(
            t0.elapsed() < PATIENCE,
            "cairn did not end within {PATIENCE:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// All of an exited child's standard error (it must have been piped).
pub fn stderr_of(child: &mut Child) -> String {
    let mut err = String::new();
    child
        .stderr
        .take()
        .expect("stderr is piped")
        .read_to_string(&mut err)
        .expect("read stderr");
    err
}

/// Starts the `cairn` binary in `dir` with the store `dir/.cairn/cairn.db`,
/// no key or store from the environment, and its standard error appended
/// to `dir/sessions.err` (every session of a crash test, for its failure
/// message).
pub fn cairn_session(dir: &std::path::Path, args: &[&str]) -> Child {
    cairn_session_on(dir, &["--store", ".cairn/cairn.db"], args)
}

/// [`cairn_session`] on the store `store_args` name (e.g. `--store
/// postgres://...`).
pub fn cairn_session_on(dir: &std::path::Path, store_args: &[&str], args: &[&str]) -> Child {
    let err = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("sessions.err"))
        .expect("open sessions.err");
    std::process::Command::new(env!("CARGO_BIN_EXE_cairn"))
        .current_dir(dir)
        .args(args)
        .args(store_args)
        .env_remove("CAIRN_STORE")
        .env_remove("CAIRN_LOG_DIR")
        .env_remove("OPENAI_API_KEY")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::from(err))
        .spawn()
        .expect("spawn cairn")
}

/// What the sessions of a crash test said on standard error.
pub fn sessions_err(dir: &std::path::Path) -> String {
    std::fs::read_to_string(dir.join("sessions.err")).unwrap_or_default()
}

/// The crash loop: runs `first` (which starts run `run`), SIGKILLs it after
/// a random pause of `pause.0 + rand % pause.1` ms, resumes, and so on,
/// `kills` times at most, then resumes once more to the end. `state` says
/// whether the run's log has begun and whether it shows the run's end (a
/// kill can land after `RunFinished` is committed, and then there is
/// nothing to resume). A session that exits on its own must exit 0;
/// `explain` says why it did not.
pub fn kill_and_resume(
    dir: &std::path::Path,
    first: &[&str],
    run: &str,
    kills: usize,
    pause: (u64, u64),
    state: impl Fn() -> (bool, bool),
    explain: impl Fn(Option<i32>) -> String,
) {
    kill_and_resume_on(
        dir,
        &["--store", ".cairn/cairn.db"],
        first,
        run,
        kills,
        pause,
        state,
        explain,
    )
}

/// [`kill_and_resume`] on the store `store_args` name. Every resume comes
/// right after the kill, with `--no-wait`: a killed process's leases must be
/// free at once (on PostgreSQL, taken over on the machine where it died).
#[allow(clippy::too_many_arguments)]
pub fn kill_and_resume_on(
    dir: &std::path::Path,
    store_args: &[&str],
    first: &[&str],
    run: &str,
    kills: usize,
    pause: (u64, u64),
    state: impl Fn() -> (bool, bool),
    explain: impl Fn(Option<i32>) -> String,
) {
    let mut seed = std::process::id() as u64 * 2654435761 % 1_000_003 + 1;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut started = false;
    for _ in 0..kills {
        let mut child = if started {
            cairn_session_on(dir, store_args, &["resume", run, "--no-wait"])
        } else {
            cairn_session_on(dir, store_args, first)
        };
        std::thread::sleep(Duration::from_millis(pause.0 + next() % pause.1));
        if let Some(status) = child.try_wait().unwrap() {
            assert_eq!(status.code(), Some(0), "{}", explain(status.code()));
            return;
        }
        child.kill().unwrap(); // SIGKILL
        wait_exit(&mut child);
        let (begun, ended) = state();
        started = started || begun;
        if ended {
            return;
        }
    }
    let mut child = cairn_session_on(dir, store_args, &["resume", run, "--no-wait"]);
    let status = wait_exit(&mut child);
    assert_eq!(
        status.code(),
        Some(0),
        "the final resume: {}",
        explain(status.code())
    );
}

/// A port free on loopback a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `GET /metrics` of the server on `port`, as text (status line and
/// headers included).
pub fn metrics(port: u16) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    text
}

/// `cairn <store_args> serve` on `port`, starting the workflows of `dir`,
/// without a token, quiet.
pub fn serve(dir: &std::path::Path, store_args: &[&str], port: u16) -> Child {
    std::process::Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(store_args)
        .arg("serve")
        .arg("--addr")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--workflows")
        .arg(dir)
        .env_remove("CAIRN_TOKEN")
        .env_remove("CAIRN_LOG_DIR")
        .current_dir(dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

/// `cairn <args>` in `dir` with the store `dir/.cairn/cairn.db`, no store
/// from the environment and nothing on its standard input; waits for it.
pub fn cairn(dir: &std::path::Path, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_cairn"))
        .current_dir(dir)
        .args(args)
        .args(["--store", ".cairn/cairn.db"])
        .env_remove("CAIRN_STORE")
        .env_remove("CAIRN_LOG_DIR")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run cairn")
}

/// Run `run`'s whole log from `dir/.cairn/cairn.db`, checked against the
/// event contract.
pub fn events(dir: &std::path::Path, run: &str) -> Vec<cairn_events::Event> {
    use cairn_store::prelude::*;
    let b = cairn_store::SqliteBackend::open(&dir.join(".cairn/cairn.db")).expect("open the store");
    let evs: Vec<cairn_events::Event> = b
        .read_events(
            &cairn_events::RunId::parse(run).unwrap(),
            &cairn_store::EventQuery::default(),
        )
        .unwrap()
        .iter()
        .map(|e| e.decode().unwrap())
        .collect();
    cairn_events::check_log(&evs).unwrap_or_else(|e| panic!("run {run} breaks the contract: {e}"));
    evs
}

/// Run `run`'s NDJSON mirror as it is now (empty before its first event).
pub fn mirror(dir: &std::path::Path, run: &str) -> String {
    std::fs::read_to_string(dir.join(format!(".cairn/logs/{run}/events.ndjson")))
        .unwrap_or_default()
}

/// Fails unless `out` exited with `code`, showing what it said on stderr.
pub fn expect_code(out: &std::process::Output, code: i32) {
    assert_eq!(
        out.status.code(),
        Some(code),
        "stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Waits until `f` holds; fails the test past [`PATIENCE`], naming `what`.
pub fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < PATIENCE, "waited too long for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Three nodes that write files (`fetch.txt` appended, `build.txt`
/// rewritten from the input's `x`) and join their outputs: the forks' and
/// reverts' workflow.
pub const PIPE: &str = r#"
name: pipe
input:
  type: object
  properties: { x: { type: integer } }
nodes:
  - id: fetch
    command: ["sh", "-c", "echo fetched >> fetch.txt; echo F"]
  - id: build
    needs: [fetch]
    command: ["sh", "-c", "echo built-{{ input.x }} > build.txt; echo B{{ input.x }}"]
  - id: join
    needs: [build]
    value: "{{ nodes.fetch.output }}{{ nodes.build.output }}"
output: "{{ nodes.join.output }}"
"#;
