//! Resource limits counted over a whole sandboxed process tree, in a
//! control group: each test runs a tree that only a tree-wide limit
//! catches, and checks that the exact limit is named and that the group is
//! gone afterwards.

use std::path::Path;
use std::time::Duration;

use cairn_tools::cairn_sandbox::cgroup::{self, Limit};
use cairn_tools::cairn_sandbox::{Confinement, ResourceLimits};
use cairn_tools::{run_process, NetworkPolicy, NoopObserver, ProcessOutcome, ProcessSpec};
use tokio_util::sync::CancellationToken;

const PYTHON: &str = "/usr/bin/python3";

/// Whether the sandbox and a group for `what` exist here; says why not.
fn available(what: fn(&cgroup::Support) -> bool) -> bool {
    let walls = cairn_tools::cairn_sandbox::probe()
        .checks
        .iter()
        .take(4)
        .all(|c| c.ok);
    if !walls {
        eprintln!("skipped: this machine has no user namespaces (see `cairn doctor`)");
        return false;
    }
    let s = cgroup::support();
    if !what(s) {
        eprintln!(
            "skipped: no control group counts this limit here ({})",
            s.detail
        );
        return false;
    }
    true
}

fn python() -> bool {
    let ok = Path::new(PYTHON).exists();
    if !ok {
        eprintln!("skipped: {PYTHON} is missing");
    }
    ok
}

/// One tree at a time, so that a group left behind is this tree's.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn run(root: &Path, limits: ResourceLimits, script: &str) -> ProcessOutcome {
    run_for(root, limits, script, Duration::from_secs(120)).await
}

async fn run_for(
    root: &Path,
    limits: ResourceLimits,
    script: &str,
    timeout: Duration,
) -> ProcessOutcome {
    let _turn = ONE_AT_A_TIME.lock().await;
    let mut spec = ProcessSpec::new(
        vec!["sh".into(), "-c".into(), script.into()],
        root.to_path_buf(),
    );
    spec.network = NetworkPolicy::Allow;
    spec.timeout = Some(timeout);
    let mut conf = Confinement::new(root);
    conf.limits = limits;
    spec.confine = Some(conf);
    let out = run_process(spec, &NoopObserver, CancellationToken::new())
        .await
        .expect("run");
    assert_eq!(
        cgroup::support().leftovers(),
        Vec::<std::path::PathBuf>::new(),
        "a group outlived its process tree"
    );
    out
}

#[tokio::test]
async fn a_process_limit_holds_for_root_too() {
    if !available(|s| s.processes.is_some()) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let limits = ResourceLimits {
        processes: Some(20),
        ..Default::default()
    };
    // 60 sleepers at once from a tree allowed 20 tasks.
    let out = run(
        dir.path(),
        limits,
        "for i in $(seq 1 60); do sleep 5 & done; wait",
    )
    .await;
    let tree = out.tree.expect("the group counted the limits");
    assert!(tree.processes);
    assert_eq!(tree.hit, Some(Limit::Processes), "{out:?}");
    let why = out.resource_limit(&limits).expect("a resource limit");
    assert!(why.contains("process limit (20)"), "{why}");

    // A tree within the limit runs to its end.
    let out = run(
        dir.path(),
        limits,
        "for i in $(seq 1 5); do sleep 0 & done; wait; echo done",
    )
    .await;
    assert!(out.success(), "{out:?}");
    assert_eq!(out.tree.and_then(|t| t.hit), None);
    assert_eq!(out.resource_limit(&limits), None);
}

#[tokio::test]
async fn memory_is_counted_over_the_whole_tree() {
    if !available(|s| s.memory.is_some()) || !python() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let limits = ResourceLimits {
        memory_bytes: Some(160 << 20),
        ..Default::default()
    };
    // Each holds 100 MiB, under the limit; both at once are over it.
    let hold =
        |n: u32| format!("{PYTHON} -c 'import time; x = b\"{n}\" * (100 << 20); time.sleep(3)'");
    let script = format!(
        "{} & a=$!; {} & b=$!; wait $a; s=$?; wait $b; exit $(( s + $? ))",
        hold(1),
        hold(2)
    );
    let out = run(dir.path(), limits, &script).await;
    let tree = out.tree.expect("the group counted the limits");
    assert!(tree.memory);
    assert_eq!(tree.hit, Some(Limit::Memory), "{out:?}");
    let why = out.resource_limit(&limits).expect("a resource limit");
    assert!(why.contains("memory limit"), "{why}");

    // One of them alone fits.
    let out = run(dir.path(), limits, &hold(1)).await;
    assert!(out.success(), "{out:?}");
    assert_eq!(out.resource_limit(&limits), None);
}

#[tokio::test]
async fn cpu_time_is_counted_over_the_whole_tree() {
    if !available(|s| s.cpu.is_some()) || !python() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let limits = ResourceLimits {
        cpu_seconds: Some(1),
        ..Default::default()
    };
    // Three workers of 0.6 CPU seconds each: none over the limit alone
    // (a per-process limit would let them finish), 1.8 s together.
    let work = format!("{PYTHON} -c 'import time\nwhile time.process_time() < 0.6: pass'");
    let script = format!("{work} & {work} & {work} & wait; echo finished");
    let out = run(dir.path(), limits, &script).await;
    let tree = out.tree.expect("the group counted the limits");
    assert!(tree.cpu);
    assert_eq!(tree.hit, Some(Limit::CpuTime), "{out:?}");
    assert!(!out.stdout.contains("finished"), "{out:?}");
    let why = out.resource_limit(&limits).expect("a resource limit");
    assert!(why.contains("CPU-time limit (1s)"), "{why}");
}

#[tokio::test]
async fn no_limits_no_group() {
    if !available(|s| s.any()) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = run(dir.path(), ResourceLimits::default(), "exit 0").await;
    assert!(out.success(), "{out:?}");
    assert_eq!(out.tree, None);
}

#[tokio::test]
async fn a_timed_out_tree_is_a_timeout_and_its_group_goes() {
    if !available(|s| s.processes.is_some()) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let limits = ResourceLimits {
        processes: Some(50),
        ..Default::default()
    };
    // Sleepers that outlive the shell's own end keep the group busy until
    // the runner kills them.
    let out = run_for(
        dir.path(),
        limits,
        "for i in 1 2 3; do setsid sleep 60 & done; sleep 60",
        Duration::from_millis(500),
    )
    .await;
    assert!(out.timed_out, "{out:?}");
    assert_eq!(out.resource_limit(&limits), None);
}
