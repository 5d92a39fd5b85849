//! A long-lived `cairn serve` gives back what finished runs held: after
//! each wave of runs its resident memory is back within 10% of where it was
//! after the first wave, whatever the number of waves, but for the pages of
//! the store that SQLite's page caches keep. (Each run's state in the
//! store's journal, with its live channel, used to stay for the life of
//! the process: half a megabyte per run ever run.)
//!
//! The caches are bounded (16 MiB for the writer's connection, 2 MiB for
//! each of up to four readers) but fill as the store grows: each wave
//! adds about 1.5 MB of pages, which the writer's cache keeps, so 30
//! waves of 100 runs climb to about 1.6x the first wave's RSS and then
//! stay there. A wave's RSS may exceed the first's by what the store
//! grew since, up to those caches' size; a leak of memory per run does
//! not hide in that allowance for long.

mod waves;

use std::time::Duration;

/// Waves after the first: enough that a leak of a few KB per run shows.
const WAVES: usize = 4;
const RUNS: usize = 100;
/// Slack beyond 10%, for the allocator's and the kernel's noise.
const SLACK_KB: u64 = 8 * 1024;
/// What SQLite's page caches may hold at most: the writer's 16 MiB and
/// four readers' 2 MiB (`cairn-sqlite`'s `WRITE_CACHE_KIB`,
/// `READ_POOL_MAX`, SQLite's default `cache_size`).
const PAGE_CACHES_KB: u64 = (16 + 4 * 2) * 1024;

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
            rss.push((served.rss_kb(), store_kb(dir.path())));
        }
        rss
    })
    .await
    .expect("the waves ended within 10 minutes");
    eprintln!("serve's RSS and the store's size after each wave, KiB: {rss:?}");
    let (first, first_store) = rss[0];
    for (i, &(r, store)) in rss.iter().enumerate().skip(1) {
        let cached = store.saturating_sub(first_store).min(PAGE_CACHES_KB);
        let bound = first + first / 10 + SLACK_KB + cached;
        assert!(
            r <= bound,
            "after wave {} serve's RSS is {r} KiB, more than 10% (+{SLACK_KB} KiB, +{cached} KiB the store grew, which SQLite's caches may keep) over {first} KiB after wave 1; all waves (RSS, store): {rss:?}",
            i + 1
        );
    }
}

/// The store's used pages, in KiB, as a reader sees them (what the
/// write-ahead log holds counted, whether or not it was checkpointed).
fn store_kb(dir: &std::path::Path) -> u64 {
    let c = rusqlite::Connection::open_with_flags(
        dir.join("cairn.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .expect("open the store read-only");
    let pragma = |p: &str| {
        c.query_row(&format!("PRAGMA {p}"), [], |r| r.get::<_, i64>(0))
            .expect("a pragma of the store")
    };
    ((pragma("page_count") - pragma("freelist_count")) * pragma("page_size")) as u64 / 1024
}
