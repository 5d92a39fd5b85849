//! The built-in tools on real files and processes.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::time::Duration;

use cairn_tools::{
    idempotency_key, Limits, Sandbox, Tool, ToolContext, ToolError, ToolRegistry, ToolSpec,
};
use common::{wait_all_dead, wait_none_with_arg, Recorder};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

struct Env {
    dir: tempfile::TempDir,
    sandbox: Sandbox,
    rec: Recorder,
}

fn env() -> Env {
    env_with(Limits::default())
}

fn env_with(limits: Limits) -> Env {
    let dir = tempfile::tempdir().unwrap();
    let sandbox = Sandbox::new(dir.path()).unwrap().with_limits(limits);
    Env {
        dir,
        sandbox,
        rec: Recorder::default(),
    }
}

impl Env {
    async fn call(&self, tool: &str, args: Value) -> Result<Value, ToolError> {
        let ctx = ToolContext::new(
            &self.sandbox,
            "run",
            "node",
            0,
            1,
            1,
            &self.rec,
            CancellationToken::new(),
        );
        ToolRegistry::builtin().call(tool, args, &ctx).await
    }
    fn put(&self, rel: &str, content: &str) {
        let p = self.dir.path().join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, content).unwrap();
    }
    fn get(&self, rel: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(rel)).unwrap()
    }
}

#[tokio::test]
async fn read_whole_file_and_line_ranges() {
    let e = env();
    e.put("a.txt", "one\ntwo\nthree\nfour\n");
    let out = e.call("read", json!({"path": "a.txt"})).await.unwrap();
    assert_eq!(
        out,
        json!({"path": "a.txt", "content": "one\ntwo\nthree\nfour\n", "lines": 4})
    );
    let out = e
        .call(
            "read",
            json!({"path": "a.txt", "from_line": 2, "to_line": 3}),
        )
        .await
        .unwrap();
    assert_eq!(out["content"], "two\nthree\n");
    assert_eq!(out["lines"], 2);
    let out = e
        .call("read", json!({"path": "a.txt", "from_line": 4}))
        .await
        .unwrap();
    assert_eq!(out["content"], "four\n");
    let out = e
        .call("read", json!({"path": "a.txt", "from_line": 9}))
        .await
        .unwrap();
    assert_eq!(out["content"], "");
    let err = e
        .call(
            "read",
            json!({"path": "a.txt", "from_line": 3, "to_line": 2}),
        )
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "read: bad argument `to_line`: 2 is before from_line 3"
    );
    let err = e
        .call("read", json!({"path": "a.txt", "from_line": 0}))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), "bad_args");
}

#[tokio::test]
async fn read_refuses_files_over_the_limit_but_reads_a_small_range_of_them() {
    let e = env_with(Limits {
        max_output_bytes: 100,
        timeout: Duration::from_secs(5),
    });
    let big: String = (0..50).map(|i| format!("line {i}\n")).collect();
    e.put("big.txt", &big);
    let err = e
        .call("read", json!({"path": "big.txt"}))
        .await
        .unwrap_err();
    assert!(
        matches!(err, ToolError::TooLarge { size, limit: 100, .. } if size == big.len() as u64),
        "{err}"
    );
    assert!(err.to_string().contains("over the limit of 100 bytes"));
    let out = e
        .call(
            "read",
            json!({"path": "big.txt", "from_line": 10, "to_line": 11}),
        )
        .await
        .unwrap();
    assert_eq!(out["content"], "line 9\nline 10\n");
    let err = e
        .call(
            "read",
            json!({"path": "big.txt", "from_line": 1, "to_line": 40}),
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind(), "too_large");
}

#[tokio::test]
async fn write_creates_parents_reports_hash_and_keeps_mode() {
    let e = env();
    let out = e
        .call(
            "write",
            json!({"path": "new/deep/f.txt", "content": "héllo"}),
        )
        .await
        .unwrap();
    let sha = hex::encode(Sha256::digest("héllo".as_bytes()));
    assert_eq!(
        out,
        json!({"path": "new/deep/f.txt", "bytes": 6, "sha256": sha})
    );
    assert_eq!(e.get("new/deep/f.txt"), "héllo");
    e.put("run.sh", "#!/bin/sh\necho a\n");
    let p = e.dir.path().join("run.sh");
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o750)).unwrap();
    e.call(
        "write",
        json!({"path": "run.sh", "content": "#!/bin/sh\necho b\n"}),
    )
    .await
    .unwrap();
    assert_eq!(
        std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
        0o750
    );
    // No temporary file is left behind.
    let names: Vec<_> = std::fs::read_dir(e.dir.path())
        .unwrap()
        .map(|d| d.unwrap().file_name())
        .collect();
    assert!(
        names
            .iter()
            .all(|n| !n.to_string_lossy().starts_with(".cairn-tmp")),
        "{names:?}"
    );
    let err = e
        .call("write", json!({"path": "new", "content": "x"}))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("is a directory"), "{err}");
    let err = e
        .call("write", json!({"path": "x", "content": 3}))
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "write: bad argument `content`: expected a string, got a number"
    );
    let err = e
        .call("write", json!({"path": "x", "content": "y", "mode": 1}))
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("bad argument `mode`: unknown argument"),
        "{err}"
    );
}

#[tokio::test]
async fn write_refuses_content_over_the_limit() {
    let e = env_with(Limits {
        max_output_bytes: 10,
        timeout: Duration::from_secs(5),
    });
    let err = e
        .call("write", json!({"path": "f", "content": "12345678901"}))
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "content is 11 bytes, over the limit of 10 bytes"
    );
    assert!(!e.dir.path().join("f").exists());
}

#[tokio::test]
async fn edit_applies_a_unified_diff() {
    let e = env();
    e.put(
        "src/lib.rs",
        "fn a() {}\n\nfn b() {\n    1\n}\n\nfn c() {}\n",
    );
    let patch = "--- a/src/lib.rs\n+++ b/src/lib.rs\n@@ -3,3 +3,3 @@\n fn b() {\n-    1\n+    2\n }\n@@ -7 +7,2 @@\n fn c() {}\n+fn d() {}\n";
    let out = e
        .call("edit", json!({"path": "src/lib.rs", "patch": patch}))
        .await
        .unwrap();
    let want = "fn a() {}\n\nfn b() {\n    2\n}\n\nfn c() {}\nfn d() {}\n";
    assert_eq!(e.get("src/lib.rs"), want);
    assert_eq!(out["hunks"], 2);
    assert_eq!(out["sha256"], hex::encode(Sha256::digest(want.as_bytes())));
}

#[tokio::test]
async fn a_hunk_that_does_not_match_fails_and_leaves_the_file_untouched() {
    let e = env();
    let original = "alpha\nbeta\ngamma\ndelta\n";
    e.put("f.txt", original);
    let before = std::fs::metadata(e.dir.path().join("f.txt")).unwrap();
    // First hunk fits, second does not: nothing may be written.
    let patch =
        "@@ -1,2 +1,2 @@\n alpha\n-beta\n+BETA\n@@ -3,2 +3,2 @@\n gamma\n-epsilon\n+EPSILON\n";
    let err = e
        .call("edit", json!({"path": "f.txt", "patch": patch}))
        .await
        .unwrap_err();
    match &err {
        ToolError::Hunk {
            index,
            header,
            reason,
            ..
        } => {
            assert_eq!(*index, 2);
            assert_eq!(header, "@@ -3,2 +3,2 @@");
            assert!(
                reason.contains("line 4 is `delta` but the hunk expects `epsilon`"),
                "{reason}"
            );
        }
        other => panic!("expected a hunk error, got {other}"),
    }
    assert_eq!(err.kind(), "hunk");
    assert_eq!(e.get("f.txt"), original);
    let after = std::fs::metadata(e.dir.path().join("f.txt")).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!(before.ino(), after.ino(), "the file was replaced");
    let err = e
        .call("edit", json!({"path": "f.txt", "patch": "just text"}))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("contains no hunk"), "{err}");
    let err = e
        .call(
            "edit",
            json!({"path": "f.txt", "patch": "--- /dev/null\n+++ b/f.txt\n@@ -0,0 +1 @@\n+x\n"}),
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("use `write`"), "{err}");
    let err = e
        .call(
            "edit",
            json!({"path": "nope.txt", "patch": "@@ -1 +1 @@\n-a\n+b\n"}),
        )
        .await
        .unwrap_err();
    assert_eq!(err.to_string(), "path `nope.txt` does not exist");
}

#[tokio::test]
async fn grep_honours_gitignore_globs_and_case() {
    let e = env();
    e.put("src/main.rs", "fn main() {\n    // TODO: more\n}\n");
    e.put("src/util.py", "# todo later\nx = 1\n");
    e.put("target/gen.rs", "// TODO generated\n");
    e.put(".gitignore", "target/\n");
    e.put(".hidden/x.rs", "// TODO hidden\n");
    e.put("bin.dat", "TODO\0binary");
    let out = e.call("grep", json!({"pattern": "TODO"})).await.unwrap();
    assert_eq!(
        out,
        json!({"matches": ["src/main.rs:2:    // TODO: more"], "truncated": false})
    );
    let out = e
        .call("grep", json!({"pattern": "todo", "ignore_case": true}))
        .await
        .unwrap();
    assert_eq!(
        out["matches"],
        json!([
            "src/main.rs:2:    // TODO: more",
            "src/util.py:1:# todo later"
        ])
    );
    let out = e
        .call(
            "grep",
            json!({"pattern": "todo", "ignore_case": true, "glob": "*.py"}),
        )
        .await
        .unwrap();
    assert_eq!(out["matches"], json!(["src/util.py:1:# todo later"]));
    let out = e
        .call("grep", json!({"pattern": "x = \\d", "path": "src/util.py"}))
        .await
        .unwrap();
    assert_eq!(out["matches"], json!(["src/util.py:2:x = 1"]));
    let out = e
        .call("grep", json!({"pattern": "nothing-matches-this"}))
        .await
        .unwrap();
    assert_eq!(out, json!({"matches": [], "truncated": false}));
    let err = e.call("grep", json!({"pattern": "a(b"})).await.unwrap_err();
    assert_eq!(err.kind(), "pattern");
    assert!(err.to_string().starts_with("bad pattern `a(b`: "), "{err}");
}

#[tokio::test]
async fn grep_output_is_cut_at_the_limit() {
    let e = env_with(Limits {
        max_output_bytes: 200,
        timeout: Duration::from_secs(5),
    });
    let body: String = (0..100).map(|i| format!("match {i}\n")).collect();
    e.put("f.txt", &body);
    let out = e.call("grep", json!({"pattern": "match"})).await.unwrap();
    assert_eq!(out["truncated"], true);
    let matches = out["matches"].as_array().unwrap();
    assert!(!matches.is_empty());
    assert_eq!(matches[0], "f.txt:1:match 0");
    let total: usize = matches.iter().map(|m| m.as_str().unwrap().len() + 1).sum();
    assert!(total <= 200);
}

#[tokio::test]
async fn bash_runs_argv_without_a_shell_in_the_root() {
    let e = env();
    let out = e
        .call("bash", json!({"argv": ["echo", "$HOME", "a b"]}))
        .await
        .unwrap();
    assert_eq!(
        out,
        json!({"exitCode": 0, "stdout": "$HOME a b\n", "stderr": "", "truncated": false})
    );
    e.put("sub/marker", "");
    let out = e
        .call("bash", json!({"argv": ["ls"], "cwd": "sub"}))
        .await
        .unwrap();
    assert_eq!(out["stdout"], "marker\n");
    let out = e
        .call(
            "bash",
            json!({"argv": ["sh", "-c", "echo $GREETING"], "env": {"GREETING": "hi"}}),
        )
        .await
        .unwrap();
    assert_eq!(out["stdout"], "hi\n");
    assert_eq!(*e.rec.stdout.lock().unwrap(), "$HOME a b\nmarker\nhi\n");
}

#[tokio::test]
async fn bash_non_zero_exit_is_an_error_with_code_and_output() {
    let e = env();
    let err = e
        .call(
            "bash",
            json!({"argv": ["sh", "-c", "echo partial; echo 'boom: it broke' >&2; exit 7"]}),
        )
        .await
        .unwrap_err();
    match &err {
        ToolError::Exit {
            code,
            stdout,
            stderr,
            ..
        } => {
            assert_eq!(*code, Some(7));
            assert_eq!(stdout, "partial\n");
            assert_eq!(stderr, "boom: it broke\n");
        }
        other => panic!("{other}"),
    }
    assert_eq!(
        err.to_string(),
        "command exited with code 7: boom: it broke"
    );
    let info = err.to_error_info();
    assert_eq!(info.kind, "exit");
    assert_eq!(info.details.unwrap()["exitCode"], 7);
    let err = e
        .call("bash", json!({"argv": ["cairn-no-such-tool"]}))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), "spawn");
    let err = e.call("bash", json!({"argv": []})).await.unwrap_err();
    assert_eq!(err.to_string(), "bash: bad argument `argv`: is empty");
    let err = e
        .call("bash", json!({"argv": ["true"], "timeout": "5 parsecs"}))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("bad argument `timeout`"), "{err}");
}

#[tokio::test]
async fn bash_timeout_is_capped_by_the_sandbox_and_kills_the_group() {
    // The call asks for an hour; the sandbox allows a fraction of a second.
    let e = env_with(Limits {
        max_output_bytes: 1000,
        timeout: Duration::from_millis(600),
    });
    // The sleeper's pid as printed is one of the sandbox's PID namespace:
    // it is found from outside by its unusual argument instead.
    let marker = format!("1000.{}", std::process::id());
    let script =
        format!("trap '' TERM; sh -c 'trap \"\" TERM; sleep {marker}' & echo $!; sleep 1000");
    let err = e
        .call(
            "bash",
            json!({"argv": ["sh", "-c", &script], "timeout": "1h"}),
        )
        .await
        .unwrap_err();
    let ToolError::Timeout {
        timeout, stdout, ..
    } = &err
    else {
        panic!("{err}")
    };
    assert_eq!(*timeout, Duration::from_millis(600));
    let _: i32 = stdout.trim().parse().expect("the sleeper started");
    assert_eq!(wait_none_with_arg(&marker), Vec::<i32>::new());
    assert_eq!(err.kind(), "timeout");
}

#[tokio::test]
async fn cancelling_a_call_kills_its_process() {
    let e = env();
    let cancel = CancellationToken::new();
    let ctx = ToolContext::new(&e.sandbox, "run", "node", 0, 1, 1, &e.rec, cancel.clone());
    let reg = ToolRegistry::builtin();
    let c2 = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        c2.cancel();
    });
    let err = reg
        .call("bash", json!({"argv": ["sleep", "1000"]}), &ctx)
        .await
        .unwrap_err();
    assert!(matches!(err, ToolError::Cancelled), "{err}");
    let pid = e.rec.pids.lock().unwrap()[0] as i32;
    assert_eq!(wait_all_dead(&[pid]), Vec::<i32>::new());
}

#[test]
fn specs_declare_side_effects() {
    let reg = ToolRegistry::builtin();
    assert_eq!(reg.names(), ["bash", "edit", "grep", "read", "write"]);
    for spec in reg.specs() {
        let pure = spec.name == "read" || spec.name == "grep";
        assert_eq!(spec.side_effect, !pure, "{}", spec.name);
        assert_eq!(spec.idempotent, pure, "{}", spec.name);
        assert_eq!(spec.args_schema["type"], "object");
    }
    let json = serde_json::to_value(reg.get("write").unwrap().spec()).unwrap();
    assert_eq!(json["sideEffect"], true);
    assert!(reg.get("nope").is_none());
}

/// A custom tool needs only the trait and one `register` call.
struct Echo;

#[async_trait::async_trait]
impl Tool for Echo {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "echo".into(),
            side_effect: false,
            idempotent: true,
            description: "returns its args and key".into(),
            args_schema: json!({"type": "object"}),
        }
    }
    async fn call(&self, args: Value, ctx: &ToolContext<'_>) -> Result<Value, ToolError> {
        Ok(json!({"args": args, "key": ctx.idempotency_key, "attempt": ctx.attempt}))
    }
}

#[tokio::test]
async fn custom_tools_get_a_key_stable_across_attempts() {
    let e = env();
    let mut reg = ToolRegistry::builtin();
    reg.register(Arc::new(Echo));
    assert!(reg.names().contains(&"echo".to_string()));
    let ctx1 = ToolContext::new(
        &e.sandbox,
        "run-9",
        "review.fix",
        2,
        1,
        3,
        &e.rec,
        CancellationToken::new(),
    );
    let ctx2 = ToolContext::new(
        &e.sandbox,
        "run-9",
        "review.fix",
        2,
        4,
        3,
        &e.rec,
        CancellationToken::new(),
    );
    let a = reg.call("echo", json!({"x": 1}), &ctx1).await.unwrap();
    let b = reg.call("echo", json!({"x": 1}), &ctx2).await.unwrap();
    assert_eq!(a["key"], b["key"]);
    assert_ne!(a["attempt"], b["attempt"]);
    assert_eq!(a["key"], idempotency_key("run-9", "review.fix", 2, 3));
    let err = reg.call("nope", json!({}), &ctx1).await.unwrap_err();
    assert_eq!(err.to_string(), "unknown tool `nope`");
}

#[test]
fn idempotency_keys_differ_by_every_part() {
    let k = idempotency_key("r", "n", 0, 1);
    assert!(k.starts_with("ck_") && k.len() == 3 + 64, "{k}");
    assert_eq!(k, idempotency_key("r", "n", 0, 1));
    for other in [
        idempotency_key("r2", "n", 0, 1),
        idempotency_key("r", "n2", 0, 1),
        idempotency_key("r", "n", 1, 1),
        idempotency_key("r", "n", 0, 2),
        // Length prefixes keep field boundaries apart.
        idempotency_key("rn", "", 0, 1),
    ] {
        assert_ne!(k, other);
    }
}
