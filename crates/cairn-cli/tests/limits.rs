//! Hostile input to the real `cairn` binary: alias bombs, deep nesting, huge files, deep
//! inputs and outputs. Each is refused with a clear error and exit code 4 (or fails its node),
//! in bounded memory: every command's peak resident memory is read from `wait4`.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

/// What a command's peak memory must stay under, whatever it was given.
const MAX_RSS_MB: u64 = 100;

/// What one `cairn` process did.
struct Ran {
    code: i32,
    stdout: String,
    stderr: String,
    /// Peak resident memory, from the kernel's accounting of the child.
    max_rss_mb: u64,
}

struct Env {
    dir: tempfile::TempDir,
}

impl Env {
    fn new() -> Env {
        Env {
            dir: tempfile::tempdir().expect("temp dir"),
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.path().join(name);
        std::fs::write(&p, text).expect("write file");
        p
    }

    /// Runs `cairn args` in the temp folder and waits for it with `wait4`, which reports the
    /// child's own peak memory.
    // The child is reaped by `wait4`, which clippy does not know of.
    #[allow(clippy::zombie_processes)]
    fn run(&self, args: &[&str]) -> Ran {
        let mut child = Command::new(env!("CARGO_BIN_EXE_cairn"))
            .args(args)
            .current_dir(self.path())
            .env_remove("CAIRN_STORE")
            .env_remove("CAIRN_LOG_DIR")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn cairn");
        let drain = |mut r: Box<dyn Read + Send>| {
            std::thread::spawn(move || {
                let mut s = String::new();
                let _ = r.read_to_string(&mut s);
                s
            })
        };
        let out = drain(Box::new(child.stdout.take().unwrap()));
        let err = drain(Box::new(child.stderr.take().unwrap()));
        let pid = child.id() as libc::pid_t;
        let mut status = 0;
        // SAFETY: a zeroed rusage is a valid value for wait4 to fill.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: `pid` is our own child, not yet waited for; both pointers are valid.
        let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        assert_eq!(r, pid, "wait4: {}", std::io::Error::last_os_error());
        let code = if libc::WIFEXITED(status) {
            libc::WEXITSTATUS(status)
        } else {
            -libc::WTERMSIG(status)
        };
        Ran {
            code,
            stdout: out.join().unwrap(),
            stderr: err.join().unwrap(),
            // ru_maxrss is in kilobytes on Linux.
            max_rss_mb: usage.ru_maxrss as u64 / 1024,
        }
    }
}

/// Asserts `cairn validate` refuses `file` with exit code 4, saying `needle` at `file:line`,
/// in bounded memory.
#[track_caller]
fn refused(env: &Env, file: &str, line: usize, needle: &str) {
    let r = env.run(&["validate", file]);
    eprintln!("validate {file}: exit {}, peak {} MB", r.code, r.max_rss_mb);
    assert_eq!(r.code, 4, "stdout: {}\nstderr: {}", r.stdout, r.stderr);
    assert!(r.stderr.contains(needle), "{}", r.stderr);
    assert!(
        r.stderr.contains(&format!("{file}:{line}:")),
        "no `{file}:{line}:` in {}",
        r.stderr
    );
    assert!(
        r.max_rss_mb < MAX_RSS_MB,
        "validate {file} peaked at {} MB",
        r.max_rss_mb
    );
}

#[test]
fn validate_refuses_an_alias_bomb_in_bounded_memory() {
    let env = Env::new();
    let mut y = String::from("name: t\nx0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n");
    for i in 1..10 {
        let p = i - 1;
        y.push_str(&format!(
            "x{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
        ));
    }
    y.push_str("nodes:\n  - id: a\n    value: *a9\n");
    assert!(y.len() < 600);
    env.write("bomb.yaml", &y);
    refused(&env, "bomb.yaml", 7, "alias expansion exceeds 100000 nodes");
}

#[test]
fn validate_refuses_a_file_past_the_size_limit_without_reading_it() {
    let env = Env::new();
    let path = env.path().join("huge.yaml");
    // Sparse: nothing is written to disk; reading it would take 64 MiB of memory.
    let f = std::fs::File::create(&path).unwrap();
    f.set_len(cairn_workflow::limits::MAX_FILE_BYTES + 1)
        .unwrap();
    drop(f);
    let r = env.run(&["validate", "huge.yaml"]);
    assert_eq!(r.code, 4, "{}", r.stderr);
    assert!(
        r.stderr
            .contains("huge.yaml: the workflow file is too large: 67108865 bytes"),
        "{}",
        r.stderr
    );
    assert!(r.max_rss_mb < 40, "peaked at {} MB", r.max_rss_mb);
}

/// `levels` loops nested in each other around one value node.
fn nested_loops(levels: usize) -> String {
    let mut y = String::from("name: t\nnodes:\n");
    let mut pad = String::from("  ");
    for _ in 0..levels {
        y.push_str(&format!(
            "{pad}- id: a\n{pad}  loop:\n{pad}    until: \"true\"\n{pad}    max_iterations: 1\n{pad}    nodes:\n"
        ));
        pad.push_str("      ");
    }
    y.push_str(&format!("{pad}- id: v\n{pad}  value: 1\n"));
    y
}

#[test]
fn validate_takes_groups_up_to_the_limit_and_refuses_deeper() {
    let env = Env::new();
    let max = cairn_workflow::limits::MAX_GROUP_DEPTH;
    env.write("at.yaml", &nested_loops(max));
    let r = env.run(&["validate", "at.yaml"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stdout.contains(&format!("({} nodes)", max + 1)),
        "{}",
        r.stdout
    );

    env.write("past.yaml", &nested_loops(max + 1));
    refused(
        &env,
        "past.yaml",
        5 * (max + 1) + 3,
        "groups (loop, for_each) nested deeper than 200 levels",
    );
}

#[test]
fn validate_refuses_deep_yaml_and_deep_values() {
    let env = Env::new();
    env.write(
        "yaml.yaml",
        &format!(
            "name: t\nnodes:\n  - id: a\n    value:\n      {}1\n",
            "- ".repeat(100_000)
        ),
    );
    refused(&env, "yaml.yaml", 5, "YAML nested deeper than 1024 levels");

    let past = format!("{}1{}", "[".repeat(65), "]".repeat(65));
    env.write(
        "value.yaml",
        &format!("name: t\nnodes:\n  - id: a\n    value: {{k: {past}}}\n"),
    );
    refused(&env, "value.yaml", 4, "nested deeper than 64 levels");
}

/// JSON `levels` arrays deep.
fn deep_json(levels: usize) -> String {
    format!("{}1{}", "[".repeat(levels), "]".repeat(levels))
}

#[test]
fn run_refuses_an_input_past_the_depth_limit() {
    let env = Env::new();
    env.write("wf.yaml", "name: t\nnodes:\n  - id: a\n    value: 1\n");
    let r = env.run(&["run", "wf.yaml", "--input", &deep_json(65)]);
    assert_eq!(r.code, 4, "{}", r.stderr);
    assert!(
        r.stderr.contains("more than the 64 allowed"),
        "{}",
        r.stderr
    );
    // Nothing was started.
    let runs = env.run(&["runs", "--json"]);
    assert_eq!(runs.code, 0, "{}", runs.stderr);
    let list: serde_json::Value = serde_json::from_str(&runs.stdout).unwrap();
    assert_eq!(list["runs"], serde_json::json!([]), "{}", runs.stdout);

    let ok = env.run(&["run", "wf.yaml", "--input", &deep_json(64)]);
    assert_eq!(ok.code, 0, "{}", ok.stderr);
}

#[test]
fn a_command_output_past_the_depth_limit_fails_its_node_and_the_run_stays_readable() {
    let env = Env::new();
    // 100 deep: within serde_json's reach, past Cairn's; 130 deep: past both.
    env.write("d100.json", &deep_json(100));
    env.write("d130.json", &deep_json(130));
    env.write("d64.json", &deep_json(64));
    env.write(
        "wf.yaml",
        "name: deep-output\nnodes:\n\
         \x20 - id: d100\n    command: [cat, d100.json]\n    output: json\n    on_failure: continue\n\
         \x20 - id: d130\n    command: [cat, d130.json]\n    output: json\n    on_failure: continue\n\
         \x20 - id: d64\n    command: [cat, d64.json]\n    output: json\n",
    );
    let r = env.run(&["run", "wf.yaml", "--run-id", "deep"]);
    assert!(!r.stderr.contains("cannot show event"), "{}", r.stderr);

    let st = env.run(&["status", "deep", "--json"]);
    assert_eq!(st.code, 0, "{}", st.stderr);
    let st: Value = serde_json::from_str(&st.stdout).expect("status JSON");
    let node = |id: &str| {
        st["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["nodeId"] == id)
            .cloned()
            .unwrap_or_else(|| panic!("no node {id} in {st}"))
    };
    assert_eq!(node("d100")["status"], "failed", "{st}");
    assert_eq!(node("d130")["status"], "failed", "{st}");
    assert_eq!(node("d64")["status"], "finished", "{st}");
    let all = st.to_string();
    assert!(all.contains("more than the 64 allowed"), "{all}");
    assert!(all.contains("recursion limit exceeded"), "{all}");

    // Every event reads back.
    let logs = env.run(&["logs", "deep", "--json"]);
    assert_eq!(logs.code, 0, "{}", logs.stderr);
    for line in logs.stdout.lines() {
        serde_json::from_str::<Value>(line).expect("an event that reads back");
    }
    // Resume reads the whole log before it finds there is nothing to do.
    let resumed = env.run(&["resume", "deep"]);
    assert_eq!(resumed.code, 4, "{}", resumed.stderr);
    assert!(!resumed.stderr.contains("invalid"), "{}", resumed.stderr);
    assert!(
        resumed.stderr.contains("nothing to resume"),
        "{}",
        resumed.stderr
    );
}

/// `levels` for_each groups of one element nested in each other around one value node.
fn nested_for_each(levels: usize) -> String {
    let mut y = String::from("name: t\nnodes:\n");
    let mut pad = String::from("  ");
    for _ in 0..levels {
        y.push_str(&format!(
            "{pad}- id: e\n{pad}  for_each: \"[1]\"\n{pad}  nodes:\n"
        ));
        pad.push_str("    ");
    }
    y.push_str(&format!("{pad}- id: v\n{pad}  value: 1\n"));
    y
}

#[test]
fn runs_at_the_group_limit_finish_and_read_back() {
    let env = Env::new();
    let max = cairn_workflow::limits::MAX_GROUP_DEPTH;
    // A group's output holds its members': these nest 200 and 400 levels
    // deep, past serde_json's default limit, and must still read back.
    env.write("loops.yaml", &nested_loops(max));
    env.write("each.yaml", &nested_for_each(max));
    for (file, run) in [("loops.yaml", "loops"), ("each.yaml", "each")] {
        let r = env.run(&["run", file, "--run-id", run]);
        assert_eq!(r.code, 0, "{file}: {}", r.stderr);
        assert!(!r.stderr.contains("cannot show event"), "{}", r.stderr);
        let st = env.run(&["status", run, "--json"]);
        assert_eq!(st.code, 0, "{run}: {}", st.stderr);
        // The run's own status comes first (the JSON is too deep for serde_json's reader).
        let first = st.stdout.find("\"status\":").expect("a status");
        assert!(
            st.stdout[first..].starts_with("\"status\": \"finished\""),
            "{}",
            st.stdout
        );
        let logs = env.run(&["logs", run]);
        assert_eq!(logs.code, 0, "{run}: {}", logs.stderr);
        assert!(
            r.max_rss_mb < MAX_RSS_MB,
            "{run} peaked at {} MB",
            r.max_rss_mb
        );
    }
}
