//! A model's limits on a PostgreSQL store are every instance's: two
//! `cairn run` processes on one store, each with agents on a model that
//! allows one call at a time, never have two answers streaming at once,
//! and say that they waited.

mod common;

use std::process::Stdio;
use std::sync::atomic::{AtomicI64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use cairn_agent::testing::{FakeProvider, Reply};
use serde_json::json;

/// One Chat Completions answer in four pieces, 100 ms apart.
fn slow_answer() -> Reply {
    let mut events: Vec<String> = ["the ", "answer ", "is ", "here"]
        .iter()
        .map(|p| json!({"choices": [{"index": 0, "delta": {"content": p}}]}).to_string())
        .collect();
    events.push(
        json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 4}})
        .to_string(),
    );
    events.push("[DONE]".into());
    Reply::sse(events).every(Duration::from_millis(100))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_on_one_postgresql_store_share_a_models_concurrency() {
    let Some(pg) = cairn_postgres::testing::server_or_skip() else {
        return;
    };
    let db = format!("cairn_limits_{}", std::process::id());
    let store = cairn_postgres::testing::create_database(pg, &db);
    let server = FakeProvider::start().await;
    // An answer lasts at least 400 ms; an arrival counts as in flight for
    // 300 ms of it, so two arrivals counted at once did overlap.
    let in_flight = Arc::new(AtomicI64::new(0));
    let most = Arc::new(AtomicI64::new(0));
    {
        let (in_flight, most) = (in_flight.clone(), most.clone());
        let rt = tokio::runtime::Handle::current();
        server.respond_with(move |_| {
            let now = in_flight.fetch_add(1, SeqCst) + 1;
            most.fetch_max(now, SeqCst);
            let in_flight = in_flight.clone();
            rt.spawn(async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                in_flight.fetch_sub(1, SeqCst);
            });
            slow_answer()
        });
    }
    let dir = tempfile::tempdir().unwrap();
    let yaml = format!(
        "name: t\nmodels:\n  m: {{ provider: openai, model: gpt-4o, base_url: \"{}\", max_concurrency: 1 }}\nnodes:\n  - id: a\n    agent: {{ model: m, prompt: one }}\n  - id: b\n    agent: {{ model: m, prompt: two }}\n",
        server.url()
    );
    std::fs::write(dir.path().join("wf.yaml"), yaml).unwrap();
    let start = |id: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_cairn"))
            .current_dir(dir.path())
            .args(["--store", &store, "run", "wf.yaml", "--run-id", id])
            .env_remove("CAIRN_STORE")
            .env_remove("CAIRN_LOG_DIR")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (one, two) = (start("one"), start("two"));
    let (one, two) = tokio::task::spawn_blocking(move || {
        (
            one.wait_with_output().unwrap(),
            two.wait_with_output().unwrap(),
        )
    })
    .await
    .unwrap();
    assert!(one.status.success(), "{one:?}");
    assert!(two.status.success(), "{two:?}");
    assert_eq!(server.requests().len(), 4);
    assert_eq!(most.load(SeqCst), 1, "two answers streamed at once");
    let waits = cairn_postgres::testing::query_i64(
        &store,
        "SELECT count(*) FROM public.events e JOIN public.event_types t ON t.type = e.type \
         WHERE t.name = 'AgentWaiting'",
    );
    assert!(waits >= 2, "four agents, one place: {waits} waits");
    let open = cairn_postgres::testing::query_i64(
        &store,
        "SELECT count(*) FROM public.model_calls WHERE open_until_ms IS NOT NULL",
    );
    assert_eq!(open, 0, "every place given back");
    cairn_postgres::testing::drop_database(pg, &db);
}
