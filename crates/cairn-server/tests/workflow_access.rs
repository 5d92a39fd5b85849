//! `POST /v1/runs` starts only workflows named inside the server's
//! workflows folder, refuses files too large before reading them, and never
//! echoes what a file holds.

mod common;

use common::*;
use serde_json::Value;

/// Text that must never come back in a response.
const SECRET: &str = "root:$6$S3CRETHASH:19000:0:99999:7:::\ndaemon:*:19000:0:99999:7:::\n";

fn start_body(workflow: &str) -> String {
    serde_json::json!({ "workflow": workflow }).to_string()
}

async fn post_start(srv: &TestServer, workflow: &str) -> (u16, String, Value) {
    let (s, b) = raw(
        srv.addr,
        &request("POST", "/v1/runs", None, &start_body(workflow)),
    )
    .await;
    let v: Value = serde_json::from_str(&b).unwrap_or(Value::Null);
    (s, b, v)
}

fn code(v: &Value) -> &str {
    v["error"]["code"].as_str().unwrap_or("")
}

fn assert_no_secret(body: &str) {
    assert!(
        !body.contains("S3CRETHASH") && !body.contains("daemon") && !body.contains("root:"),
        "a response echoes a file's content: {body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_names_inside_the_workflows_folder_start_runs() {
    let srv = TestServer::start(None).await;
    let outside = srv.dir.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let secret = outside.join("shadow");
    std::fs::write(&secret, SECRET).unwrap();
    let valid = "name: ok\nnodes:\n  - id: a\n    value: 1\n";
    std::fs::write(outside.join("ok.yaml"), valid).unwrap();
    srv.workflow("ok", valid);
    let wf = srv.dir.path().join("workflows");
    std::fs::create_dir_all(wf.join("team")).unwrap();
    std::fs::write(wf.join("team/nested.yml"), valid).unwrap();
    // Symlinks that lead out: to a file, and through a folder.
    std::os::unix::fs::symlink(&secret, wf.join("shadow.yaml")).unwrap();
    std::os::unix::fs::symlink(&outside, wf.join("out")).unwrap();
    // A symlink that stays inside is fine.
    std::os::unix::fs::symlink(wf.join("ok.yaml"), wf.join("alias.yaml")).unwrap();

    for name in ["ok", "ok.yaml", "team/nested", "team/nested.yml", "alias"] {
        let (s, b, _) = post_start(&srv, name).await;
        assert_eq!(s, 201, "{name}: {b}");
    }

    let absolute = secret.display().to_string();
    let escaping = "../outside/shadow".to_string();
    for name in [
        absolute.as_str(),
        escaping.as_str(),
        "/etc/passwd",
        "team/../ok",
        ".hidden",
        "",
    ] {
        let (s, b, v) = post_start(&srv, name).await;
        assert_eq!(s, 400, "{name}: {b}");
        assert!(
            matches!(code(&v), "invalid_workflow_name" | "bad_request"),
            "{name}: {b}"
        );
        assert!(
            b.contains("`workflow`"),
            "the error names the parameter: {b}"
        );
        assert_no_secret(&b);
    }

    for name in ["shadow", "shadow.yaml", "out/ok", "out/ok.yaml"] {
        let (s, b, v) = post_start(&srv, name).await;
        assert_eq!(
            (s, code(&v)),
            (403, "workflow_outside_folder"),
            "{name}: {b}"
        );
        assert!(b.contains("`workflow`"), "{b}");
        assert_no_secret(&b);
    }

    let (s, b, v) = post_start(&srv, "missing").await;
    assert_eq!((s, code(&v)), (404, "workflow_not_found"), "{b}");
    assert!(
        !b.contains(&srv.dir.path().display().to_string()),
        "errors do not tell where the folder is: {b}"
    );
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_workflows_folder_no_name_is_started() {
    let srv = TestServer::start_with(None, |c| c.workflows_dir = None).await;
    let path = srv.workflow("ok", "name: ok\nnodes:\n  - id: a\n    value: 1\n");
    for name in ["ok", path.to_str().unwrap()] {
        let (s, b, v) = post_start(&srv, name).await;
        assert_eq!((s, code(&v)), (403, "workflows_disabled"), "{b}");
        assert!(b.contains("--workflows"), "{b}");
    }
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_files_are_located_never_quoted() {
    let srv = TestServer::start(None).await;
    // Not a workflow at all, inside the folder.
    srv.workflow("shadow", SECRET);
    srv.workflow("creds", "password: S3CRETHASH\ntoken: daemon\n");
    srv.workflow("syntax", "name: x\nnodes: [ {id: S3CRETHASH, value: 1\n");
    std::fs::write(
        srv.dir.path().join("workflows/binary.yaml"),
        b"\xff\xfeS3CRETHASH\x00",
    )
    .unwrap();
    srv.workflow("typo", "name: typo\nnodes:\n  - id: a\n    valeu: 1\n");

    for name in ["shadow", "creds", "syntax", "binary", "typo"] {
        let (s, b, v) = post_start(&srv, name).await;
        assert_eq!((s, code(&v)), (400, "invalid_workflow"), "{name}: {b}");
        assert!(b.contains("`workflow`"), "{b}");
        assert_no_secret(&b);
        if let Some(details) = v["error"]["details"].as_array() {
            for d in details {
                let keys: Vec<&str> = d.as_object().unwrap().keys().map(String::as_str).collect();
                assert_eq!(keys, ["file", "line", "column", "field"], "{b}");
            }
        }
    }
    // A real workflow's mistake is still found: by line and field.
    let (_, b, v) = post_start(&srv, "typo").await;
    let details = v["error"]["details"].as_array().unwrap();
    assert!(
        details
            .iter()
            .any(|d| d["file"] == "typo.yaml" && d["line"] == 4 && d["field"] == "nodes[0]"),
        "{b}"
    );
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_over_the_limit_are_refused_before_they_are_read() {
    let srv = TestServer::start_with(None, |c| c.max_workflow_bytes = 1024).await;
    let small = "name: small\nnodes:\n  - id: a\n    value: 1\n";
    srv.workflow("small", small);
    let big = format!("{small}# {}\n", "x".repeat(2048));
    srv.workflow("big", &big);
    // Sparse: huge by its metadata, nothing on disk; reading it whole would
    // take 16 GiB.
    let f = std::fs::File::create(srv.dir.path().join("workflows/huge.yaml")).unwrap();
    f.set_len(16 << 30).unwrap();

    let (s, b, _) = post_start(&srv, "small").await;
    assert_eq!(s, 201, "{b}");
    for name in ["big", "huge"] {
        let (s, b, v) = post_start(&srv, name).await;
        assert_eq!((s, code(&v)), (413, "workflow_too_large"), "{name}: {b}");
        assert!(b.contains("1024"), "the error says the limit: {b}");
    }
    // A FIFO in the folder does not hang the request.
    let fifo = srv.dir.path().join("workflows/pipe.yaml");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let (s, b, _) = post_start(&srv, "pipe").await;
    assert_eq!(s, 400, "{b}");
    srv.stop().await;
}
