//! A long-lived `cairn serve` gives back what finished runs held: after
//! each wave of runs its resident memory is back within 10% of where it was
//! after the first wave, whatever the number of waves. (Each run's state
//! in the store's journal, with its live channel, used to stay for the life
//! of the process: half a megabyte per run ever run.)

mod waves;

use std::time::Duration;

/// Waves after the first: enough that a leak of a few KB per run shows.
const WAVES: usize = 4;
const RUNS: usize = 100;
/// Slack beyond 10%, for the allocator's and the kernel's noise.
const SLACK_KB: u64 = 8 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn serve_gives_back_memory_after_each_wave_of_runs() {
    waves::raise_fd_limit();
    let dir = tempfile::tempdir().unwrap();
    let cairn = std::path::Path::new(env!("CARGO_BIN_EXE_cairn"));
    // Bounded, so that a hang fails instead of holding CI.
    let rss = tokio::time::timeout(Duration::from_secs(600), async {
        let served = waves::Served::start(cairn, dir.path(), RUNS + 64).await;
        let mut rss = Vec::new();
        for i in 1..=WAVES {
            let w = waves::wave(&served.url, RUNS, 8).await;
            assert!(
                w.failed.is_empty(),
                "wave {i}: {} runs did not finish, e.g. {:?}\nserve said:\n{}",
                w.failed.len(),
                &w.failed[..w.failed.len().min(3)],
                std::fs::read_to_string(dir.path().join("serve.err")).unwrap_or_default()
            );
            // What finished runs leave to be freed (the writer's releases,
            // the watchers' connections) is let go within moments, and the
            // server gives freed memory back 2 s after its last run ended.
            tokio::time::sleep(Duration::from_secs(3)).await;
            rss.push(served.rss_kb());
        }
        rss
    })
    .await
    .expect("the waves ended within 10 minutes");
    eprintln!("serve's RSS after each wave, KiB: {rss:?}");
    let first = rss[0];
    let bound = first + first / 10 + SLACK_KB;
    for (i, &r) in rss.iter().enumerate().skip(1) {
        assert!(
            r <= bound,
            "after wave {} serve's RSS is {r} KiB, more than 10% (+{SLACK_KB} KiB) over {first} KiB after wave 1; all waves: {rss:?}",
            i + 1
        );
    }
}
