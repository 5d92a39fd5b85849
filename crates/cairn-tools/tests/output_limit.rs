//! A command printing gigabytes is cut at the limit while our memory stays
//! flat. Alone in its own test binary so that other tests cannot move the
//! process's peak memory.

mod common;

use std::time::Duration;

use cairn_tools::{run_process, NetworkPolicy, NoopObserver, ProcessSpec};
use common::{argv, status_kb};
use tokio_util::sync::CancellationToken;

const GIB: u64 = 1 << 30;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gigabytes_of_output_keep_memory_flat() {
    let before_rss = status_kb("VmRSS:");
    let before_hwm = status_kb("VmHWM:");
    let total = GIB;
    let mut spec = ProcessSpec::new(
        argv(&[
            "sh",
            "-c",
            &format!("head -c {total} /dev/zero; head -c {total} /dev/zero >&2"),
        ]),
        std::env::temp_dir(),
    );
    spec.network = NetworkPolicy::Allow;
    spec.timeout = Some(Duration::from_secs(120));
    spec.max_output_bytes = 200_000;
    let out = run_process(spec, &NoopObserver, CancellationToken::new())
        .await
        .unwrap();
    assert!(!out.timed_out, "the command should finish, not time out");
    assert_eq!(out.exit_code, Some(0));
    assert_eq!(out.stdout.len(), 200_000);
    assert_eq!(out.stderr.len(), 200_000);
    assert!(out.stdout_truncated && out.stderr_truncated);
    let after_hwm = status_kb("VmHWM:");
    let growth_kb = after_hwm.saturating_sub(before_hwm.max(before_rss));
    eprintln!(
        "2 GiB printed; RSS before {before_rss} kB, peak before {before_hwm} kB, peak after {after_hwm} kB, growth {growth_kb} kB"
    );
    assert!(
        growth_kb < 8 * 1024,
        "peak memory grew by {growth_kb} kB while draining 2 GiB"
    );
}
