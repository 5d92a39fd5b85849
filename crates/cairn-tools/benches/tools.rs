//! `cargo bench -p cairn-tools`: grep over a generated tree (against the `rg`
//! binary when one is installed) and the per-call overhead of `bash true`.
//!
//! Sizes are bounded so a run takes seconds; `CAIRN_BENCH_FILES` raises the
//! tree size.

use std::io::Write;
use std::process::Command;
use std::time::{Duration, Instant};

use cairn_tools::grep::{grep_blocking, GrepQuery};
use cairn_tools::{Isolation, Limits, NoopObserver, Sandbox, ToolContext, ToolRegistry};
use serde_json::json;
use tokio_util::sync::CancellationToken;

fn generate_tree(root: &std::path::Path, files: usize) -> u64 {
    let mut bytes = 0u64;
    for i in 0..files {
        let dir = root.join(format!("pkg{}/mod{}", i % 37, i % 11));
        std::fs::create_dir_all(&dir).unwrap();
        let mut f = std::io::BufWriter::new(
            std::fs::File::create(dir.join(format!("file{i}.rs"))).unwrap(),
        );
        for line in 0..400 {
            let text = if line % 97 == 0 {
                format!("    let value_{line} = compute(); // TODO: check {i}\n")
            } else {
                format!("    let value_{line} = other_function(argument_{line}, {i}) + {line};\n")
            };
            bytes += text.len() as u64;
            f.write_all(text.as_bytes()).unwrap();
        }
    }
    // Ignored content that both searchers must skip.
    std::fs::create_dir_all(root.join("target")).unwrap();
    std::fs::write(root.join(".gitignore"), "target/\n").unwrap();
    std::fs::write(
        root.join("target/big.rs"),
        "// TODO ignored\n".repeat(10_000),
    )
    .unwrap();
    bytes
}

fn best_of<T>(runs: usize, mut f: impl FnMut() -> T) -> (Duration, T) {
    let mut best = Duration::MAX;
    let mut last = None;
    for _ in 0..runs {
        let t = Instant::now();
        let v = f();
        best = best.min(t.elapsed());
        last = Some(v);
    }
    (best, last.unwrap())
}

fn main() {
    let files: usize = std::env::var("CAIRN_BENCH_FILES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3000);
    let dir = tempfile::tempdir().unwrap();
    let bytes = generate_tree(dir.path(), files);
    println!("tree: {files} files, {:.1} MB", bytes as f64 / 1e6);

    let sandbox = Sandbox::new(dir.path()).unwrap().with_limits(Limits {
        max_output_bytes: Limits::MAX_OUTPUT_BYTES,
        timeout: Duration::from_secs(60),
    });
    let query = GrepQuery {
        pattern: r"TODO: check \d+".into(),
        path: ".".into(),
        glob: None,
        ignore_case: false,
    };
    let (ours, (matches, truncated)) = best_of(5, || grep_blocking(&sandbox, &query).unwrap());
    assert!(!truncated);
    println!(
        "grep (cairn): {} matches, best of 5: {:.1} ms",
        matches.len(),
        ours.as_secs_f64() * 1e3
    );

    let rg_available = Command::new("rg")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if rg_available {
        let (theirs, out) = best_of(5, || {
            Command::new("rg")
                .args([
                    "-n",
                    "--no-heading",
                    "--color",
                    "never",
                    r"TODO: check \d+",
                    ".",
                ])
                .current_dir(dir.path())
                .output()
                .unwrap()
        });
        let rg_matches = out
            .stdout
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .count();
        assert_eq!(
            rg_matches,
            matches.len(),
            "rg and cairn disagree on the match count"
        );
        println!(
            "grep (rg):    {} matches, best of 5: {:.1} ms",
            rg_matches,
            theirs.as_secs_f64() * 1e3
        );
        println!(
            "ratio cairn/rg: {:.2}",
            ours.as_secs_f64() / theirs.as_secs_f64()
        );
    } else {
        println!("grep (rg):    SKIPPED, no `rg` binary on PATH (no ratio)");
    }

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let reg = ToolRegistry::builtin();
    let n = 200;
    let per_call = |sandbox: &Sandbox| -> Duration {
        rt.block_on(async {
            let ctx = ToolContext::new(
                sandbox,
                "bench",
                "bash",
                0,
                1,
                1,
                &NoopObserver,
                CancellationToken::new(),
            );
            // Warm up (first spawn pays for page-ins).
            reg.call("bash", json!({"argv": ["true"]}), &ctx)
                .await
                .unwrap();
            let t = Instant::now();
            for _ in 0..n {
                reg.call("bash", json!({"argv": ["true"]}), &ctx)
                    .await
                    .unwrap();
            }
            t.elapsed() / n
        })
    };
    let t = Instant::now();
    for _ in 0..n {
        Command::new("true").status().unwrap();
    }
    let baseline = t.elapsed() / n;
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    println!(
        "std::process::Command `true` (baseline):             {:.0} µs per call over {n} calls",
        us(baseline)
    );
    let open = || {
        Sandbox::new(dir.path())
            .unwrap()
            .with_network(cairn_tools::NetworkPolicy::Allow)
    };
    let shut = || Sandbox::new(dir.path()).unwrap();
    let cases = [
        (
            "bash `true`, no sandbox, network open:              ",
            open().with_isolation(Isolation::None),
        ),
        (
            "bash `true`, no sandbox, network shut (seccomp):    ",
            shut().with_isolation(Isolation::None),
        ),
        (
            "bash `true`, sandbox, network open:                 ",
            open(),
        ),
        (
            "bash `true`, sandbox, network shut (netns+seccomp): ",
            shut(),
        ),
    ];
    for (name, sandbox) in cases {
        let d = per_call(&sandbox);
        println!(
            "{name}{:.0} µs per call ({:.1}x the baseline)",
            us(d),
            d.as_secs_f64() / baseline.as_secs_f64()
        );
    }
}
