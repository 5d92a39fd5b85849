//! Fuzzes sandbox path resolution: whatever the input, a path that resolves
//! must resolve to something beneath the root.
//!
//! Run (nightly and cargo-fuzz required), from the repository root:
//!     cargo +nightly fuzz run resolve -- -max_total_time=60
#![no_main]

use std::os::fd::AsRawFd;
use std::os::unix::fs::symlink;
use std::path::PathBuf;
use std::sync::OnceLock;

use cairn_tools::Sandbox;
use libfuzzer_sys::fuzz_target;

struct Fixture {
    root: PathBuf,
    sandbox: Sandbox,
}

/// A root full of symlinks that lead out, built once per fuzzing process.
fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let outer = std::env::temp_dir().join(format!("cairn-fuzz-{}", std::process::id()));
        let root = outer.join("root");
        std::fs::create_dir_all(root.join("sub/deeper")).unwrap();
        std::fs::create_dir_all(outer.join("outside")).unwrap();
        std::fs::write(outer.join("outside/secret"), "secret").unwrap();
        std::fs::write(root.join("file"), "inside").unwrap();
        let links: &[(&str, &str)] = &[
            ("rel_out", "../outside/secret"),
            ("dir_out", "../outside"),
            ("chain1", "chain2"),
            ("chain2", "sub/../../outside"),
            ("proc_root", "/proc/self/root"),
            ("sub/up_in", "../file"),
            ("sub/deeper/up_out", "../../../outside"),
        ];
        for (name, target) in links {
            let _ = symlink(target, root.join(name));
        }
        let root = root.canonicalize().unwrap();
        let sandbox = Sandbox::new(&root).unwrap();
        Fixture { root, sandbox }
    })
}

fuzz_target!(|data: &[u8]| {
    let f = fixture();
    let input = String::from_utf8_lossy(data);
    if let Ok((fd, _)) = f.sandbox.resolve(&input) {
        let real = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap();
        assert!(real.starts_with(&f.root), "{input:?} resolved to {}", real.display());
    }
});
