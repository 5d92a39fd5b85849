//! `cargo bench -p cairn-sandbox`: what confining one process costs, against
//! a plain `std::process::Command` in the same run.

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_sandbox::{Confinement, Network, ResourceLimits};

fn per_spawn(n: u32, mut make: impl FnMut() -> Command) -> Duration {
    make().status().unwrap();
    let t = Instant::now();
    for _ in 0..n {
        let s = make().status().unwrap();
        assert!(s.success());
    }
    t.elapsed() / n
}

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let n = 200;
    let plain = || {
        let mut c = Command::new("/bin/true");
        c.stdin(Stdio::null());
        c
    };
    let base = per_spawn(n, plain);
    println!(
        "plain std::process::Command:   {:>6.0} µs",
        base.as_secs_f64() * 1e6
    );
    let limits = ResourceLimits {
        memory_bytes: Some(1 << 30),
        processes: Some(256),
        cpu_seconds: Some(60),
    };
    let counted = cairn_sandbox::cgroup::support();
    let limited = if counted.any() {
        "sandbox, limits in a cgroup:"
    } else {
        "sandbox, limits as rlimits:"
    };
    for (name, net, limits) in [
        (
            "sandbox, network open:",
            Network::Host,
            ResourceLimits::default(),
        ),
        (
            "sandbox, network none:",
            Network::None,
            ResourceLimits::default(),
        ),
        (limited, Network::None, limits),
    ] {
        let mut conf = Confinement::new(dir.path());
        conf.network = net;
        conf.limits = limits;
        let d = per_spawn(n, || {
            let prep = Arc::new(conf.prepare(dir.path()).unwrap());
            let mut c = plain();
            c.current_dir(dir.path());
            // SAFETY: enter is async-signal-safe.
            unsafe {
                c.pre_exec(move || prep.enter());
            }
            c
        });
        println!(
            "{name:<30} {:>6.0} µs ({:.1}x)",
            d.as_secs_f64() * 1e6,
            d.as_secs_f64() / base.as_secs_f64()
        );
    }
}
