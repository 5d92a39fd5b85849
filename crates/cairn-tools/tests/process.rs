//! The process runner against real child processes.

mod common;

use std::time::Duration;

use cairn_tools::{
    kill_group, run_process, NetworkPolicy, NoopObserver, ProcessError, ProcessSpec,
};
use common::{alive, argv, wait_all_dead, Recorder};
use tokio_util::sync::CancellationToken;

fn spec(a: &[&str]) -> ProcessSpec {
    let mut s = ProcessSpec::new(argv(a), std::env::temp_dir());
    s.network = NetworkPolicy::Allow;
    s.timeout = Some(Duration::from_secs(30));
    s
}

#[tokio::test]
async fn captures_and_streams_both_streams() {
    let rec = Recorder::default();
    let out = run_process(
        spec(&["sh", "-c", "echo out; echo err >&2; printf 'é€😀'; exit 3"]),
        &rec,
        CancellationToken::new(),
    )
    .await
    .unwrap();
    assert_eq!(out.exit_code, Some(3));
    assert_eq!(out.signal, None);
    assert_eq!(out.stdout, "out\né€😀");
    assert_eq!(out.stderr, "err\n");
    assert!(!out.success());
    assert_eq!(*rec.stdout.lock().unwrap(), out.stdout);
    assert_eq!(*rec.stderr.lock().unwrap(), out.stderr);
    assert_eq!(rec.pids.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn the_spawned_pid_is_the_group_id() {
    let rec = Recorder::default();
    let out = run_process(
        spec(&["cat", "/proc/self/stat"]),
        &rec,
        CancellationToken::new(),
    )
    .await
    .unwrap();
    let after_comm = out.stdout.rsplit(')').next().unwrap();
    let fields: Vec<&str> = after_comm.split_whitespace().collect();
    // state ppid pgrp ...
    let pgrp: u32 = fields[2].parse().unwrap();
    assert_eq!(rec.pids.lock().unwrap()[0], pgrp);
    assert_ne!(pgrp as i32, unsafe { libc::getpgrp() });
}

#[tokio::test]
async fn utf8_split_across_reads_is_streamed_whole() {
    // Print a 4-byte character one byte at a time, with pauses, so reads end
    // inside it.
    let rec = Recorder::default();
    let out = run_process(
        spec(&[
            "sh",
            "-c",
            "printf '\\360'; sleep 0.05; printf '\\237'; sleep 0.05; printf '\\230\\200'",
        ]),
        &rec,
        CancellationToken::new(),
    )
    .await
    .unwrap();
    assert_eq!(out.stdout, "😀");
    assert_eq!(*rec.stdout.lock().unwrap(), "😀");
}

#[tokio::test]
async fn start_failures_are_typed_and_named() {
    let err = run_process(spec(&[]), &NoopObserver, CancellationToken::new())
        .await
        .unwrap_err();
    assert!(matches!(err, ProcessError::EmptyArgv));
    let err = run_process(
        spec(&["cairn-no-such-program-xyz"]),
        &NoopObserver,
        CancellationToken::new(),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, ProcessError::Spawn { .. }));
    assert!(
        err.to_string()
            .starts_with("cannot start `cairn-no-such-program-xyz`: "),
        "{err}"
    );
    let mut s = spec(&["true"]);
    s.cwd = "/nonexistent-cairn-dir".into();
    let err = run_process(s, &NoopObserver, CancellationToken::new())
        .await
        .unwrap_err();
    assert!(matches!(err, ProcessError::Spawn { .. }), "{err}");
    let err = run_process(
        spec(&["echo", "a\0b"]),
        &NoopObserver,
        CancellationToken::new(),
    )
    .await
    .unwrap_err();
    assert!(
        err.to_string().contains("argv[1] contains a NUL byte"),
        "{err}"
    );
}

#[tokio::test]
async fn clean_environment_keeps_only_the_minimum_and_what_is_passed() {
    let mut s = spec(&["env"]);
    s.env = vec![("CAIRN_PASSED".into(), "yes".into())];
    let out = run_process(s, &NoopObserver, CancellationToken::new())
        .await
        .unwrap();
    assert!(
        out.stdout.lines().any(|l| l == "CAIRN_PASSED=yes"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.lines().any(|l| l.starts_with("PATH=")));
    // cargo sets these for the test process; the child must not see them.
    assert!(std::env::var("CARGO_MANIFEST_DIR").is_ok());
    assert!(!out.stdout.contains("CARGO_MANIFEST_DIR"), "{}", out.stdout);
    for line in out.stdout.lines() {
        let key = line.split('=').next().unwrap();
        assert!(
            key == "CAIRN_PASSED" || cairn_tools::process::MINIMAL_ENV_KEYS.contains(&key),
            "unexpected variable {key}"
        );
    }
}

/// Prints the pids of three grandchildren that ignore SIGTERM, then waits.
const STUBBORN: &str = "trap '' TERM; \
    for i in 1 2 3; do sh -c 'trap \"\" TERM; sleep 1000' & echo $!; done; \
    sleep 1000";

fn pids_of(text: &str) -> Vec<i32> {
    text.lines().filter_map(|l| l.trim().parse().ok()).collect()
}

#[tokio::test]
async fn timeout_kills_grandchildren_that_ignore_sigterm() {
    let rec = Recorder::default();
    let mut s = spec(&["sh", "-c", STUBBORN]);
    s.timeout = Some(Duration::from_millis(700));
    let out = run_process(s, &rec, CancellationToken::new())
        .await
        .unwrap();
    assert!(out.timed_out);
    assert!(!out.cancelled);
    assert_eq!(out.signal, Some(libc::SIGKILL));
    let pids = pids_of(&out.stdout);
    assert_eq!(
        pids.len(),
        3,
        "grandchildren should have reported: {:?}",
        out.stdout
    );
    assert_eq!(wait_all_dead(&pids), Vec::<i32>::new());
    assert!(!alive(rec.pids.lock().unwrap()[0] as i32));
}

#[tokio::test]
async fn cancel_kills_the_whole_group() {
    let rec = std::sync::Arc::new(Recorder::default());
    let cancel = CancellationToken::new();
    let (r2, c2) = (rec.clone(), cancel.clone());
    // Cancel once the three grandchildren have announced themselves.
    let watcher = tokio::spawn(async move {
        loop {
            if pids_of(&r2.stdout.lock().unwrap()).len() == 3 {
                c2.cancel();
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    let out = run_process(spec(&["sh", "-c", STUBBORN]), rec.as_ref(), cancel)
        .await
        .unwrap();
    watcher.await.unwrap();
    assert!(out.cancelled);
    assert!(!out.timed_out);
    let pids = pids_of(&out.stdout);
    assert_eq!(pids.len(), 3);
    assert_eq!(wait_all_dead(&pids), Vec::<i32>::new());
}

#[tokio::test]
async fn a_background_grandchild_holding_the_pipe_does_not_hang_the_run() {
    // The leader exits at once; its background child keeps stdout open.
    let out = run_process(
        spec(&["sh", "-c", "sleep 1000 & echo $!; echo done"]),
        &NoopObserver,
        CancellationToken::new(),
    )
    .await
    .unwrap();
    assert!(!out.timed_out, "the run waited for the grandchild");
    assert_eq!(out.exit_code, Some(0));
    let pids = pids_of(&out.stdout);
    assert_eq!(pids.len(), 1);
    assert!(out.stdout.ends_with("done\n"));
    // Left-behind members of the group are killed too.
    assert_eq!(wait_all_dead(&pids), Vec::<i32>::new());
}

#[tokio::test]
async fn output_past_the_cap_is_dropped_and_marked() {
    let mut s = spec(&[
        "sh",
        "-c",
        "head -c 300000 /dev/zero | tr '\\0' a; echo tail >&2",
    ]);
    s.max_output_bytes = 1000;
    let rec = Recorder::default();
    let out = run_process(s, &rec, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(out.exit_code, Some(0));
    assert_eq!(out.stdout.len(), 1000);
    assert!(out.stdout_truncated);
    assert!(!out.stderr_truncated);
    assert_eq!(out.stderr, "tail\n");
    // Only the captured part is streamed.
    assert_eq!(rec.stdout.lock().unwrap().len(), 1000);
}

#[tokio::test]
async fn cap_never_splits_a_character() {
    let mut s = spec(&["sh", "-c", "printf 'ab€€'"]);
    s.max_output_bytes = 4; // "ab" + 2 of the 3 bytes of '€'
    let out = run_process(s, &NoopObserver, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(out.stdout, "ab");
    assert!(out.stdout_truncated);
}

#[test]
fn kill_group_ends_a_leftover_group_and_ignores_missing_ones() {
    use std::os::unix::process::CommandExt;
    let mut child = std::process::Command::new("sleep")
        .arg("1000")
        .process_group(0)
        .spawn()
        .unwrap();
    kill_group(child.id());
    let status = child.wait().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGKILL));
    // Gone already, and the dangerous ids: all no-ops.
    kill_group(child.id());
    kill_group(0);
    kill_group(1);
}
