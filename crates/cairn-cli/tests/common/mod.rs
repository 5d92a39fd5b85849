//! Helpers the CLI's integration tests share: waiting for a `cairn` child
//! without hanging CI, and reading what it said.

// Each test binary uses its own subset.
#![allow(dead_code)]

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
