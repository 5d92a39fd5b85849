//! What a replay costs: a suite of 20 recorded runs (`cairn test`), each
//! read from its bundle into a fresh store and replayed.
//!
//! ```sh
//! cargo bench -p cairn-engine --bench replay
//! ```
//!
//! Each recorded run is a command that writes a file, then an agent of 12
//! steps (a scripted model that answers at once, 11 `read`/`grep` calls
//! over a small project), then a value. The baseline is the same run
//! recorded, measured in the same process: a replay does what the run did
//! (the command and the tools run for real, in its copy of the root) less
//! the model, plus reading the original and restoring its first snapshot.
//!
//! Target: under a second of engine time per replay.

use std::io::BufReader;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_engine::{Engine, EngineOptions, RunOutcome, StartOptions};
use cairn_events::{ReplayOf, RunId};
use cairn_store::{Journal, JournalOptions};
use serde_json::json;

cairn_engine::use_run_allocator!();

const RUNS: usize = 20;
const STEPS: usize = 12;

fn engine(dir: &std::path::Path) -> Engine {
    let journal = Journal::open_sqlite(
        &dir.join(".cairn/cairn.db"),
        JournalOptions { log_dir: None },
    )
    .unwrap();
    Engine::new(
        journal,
        EngineOptions {
            snapshot_dir: Some(dir.join(".cairn/snapshots")),
            ..Default::default()
        },
    )
}

fn project(dir: &std::path::Path) -> std::path::PathBuf {
    std::fs::create_dir_all(dir.join("src")).unwrap();
    for i in 0..20 {
        std::fs::write(
            dir.join(format!("src/f{i}.txt")),
            format!("line one of {i}\nthe greeting is Helo\n").repeat(20),
        )
        .unwrap();
    }
    let mut turns: Vec<serde_json::Value> = (0..STEPS - 1)
        .map(|i| {
            let call = if i % 2 == 0 {
                json!({"name": "read", "args": {"path": format!("src/f{i}.txt")}})
            } else {
                json!({"name": "grep", "args": {"pattern": "Helo", "path": "src"}})
            };
            json!({"text": format!("step {i}"), "tool_calls": [call], "usage": {"input": 500 + i, "output": 20}})
        })
        .collect();
    turns.push(json!({"text": "the greeting is misspelled in every file", "usage": {"input": 900, "output": 12}}));
    std::fs::write(
        dir.join("turns.json"),
        json!({ "turns": turns }).to_string(),
    )
    .unwrap();
    let yaml = format!(
        r#"name: recorded
models:
  m: {{ provider: scripted, script: turns.json }}
nodes:
  - id: prep
    command: ["sh", "-c", "echo ready > prep.txt"]
  - id: look
    needs: [prep]
    agent:
      model: m
      prompt: "Find the misspelling (run {{{{ input.n }}}})."
      tools: [read, grep]
      max_steps: {}
  - id: done
    needs: [look]
    value: "{{{{ nodes.look.output }}}}"
output: "{{{{ nodes.done.output }}}}"
"#,
        STEPS + 1
    );
    let path = dir.join("wf.yaml");
    std::fs::write(&path, yaml).unwrap();
    path
}

/// Starts a replay of `id` (its own workflow and input), as `cairn test`
/// does.
async fn start_replay(suite: &Engine, id: &RunId) -> cairn_engine::RunHandle {
    let wf = suite.definition_of(id).await.unwrap();
    let input = suite
        .journal()
        .backend()
        .get_run(id)
        .unwrap()
        .unwrap()
        .input;
    suite
        .start(
            wf,
            input,
            StartOptions {
                exit_on_wait: true,
                replay: Some(ReplayOf {
                    run_id: id.clone(),
                    live: false,
                    tools: Default::default(),
                }),
                ..Default::default()
            },
        )
        .await
        .unwrap()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

async fn bench() {
    let here = tempfile::tempdir().unwrap();
    // Bundles go beside the root, not in it: a snapshot of the root would
    // carry the earlier ones.
    let bundles = tempfile::tempdir().unwrap();
    let wf_path = project(here.path());
    let recorder = engine(here.path());
    let mut originals = Vec::new();
    let mut recorded = Vec::new();
    for n in 0..RUNS {
        let wf = cairn_workflow::load(&wf_path).unwrap();
        let t0 = Instant::now();
        let h = recorder
            .start(wf, json!({ "n": n }), StartOptions::default())
            .await
            .unwrap();
        let id = h.run_id.clone();
        let outcome = h.wait().await;
        originals.push(t0.elapsed());
        assert!(matches!(outcome, RunOutcome::Finished(_)), "{outcome:?}");
        let file = bundles.path().join(format!("{id}.bundle"));
        recorder
            .export_bundle(&id, Box::new(std::fs::File::create(&file).unwrap()))
            .await
            .unwrap();
        recorded.push((id, file));
    }
    recorder.journal().close();

    // Elsewhere: a fresh store and folder, as `cairn test` makes.
    let there = tempfile::tempdir().unwrap();
    let suite = engine(there.path());
    let mut imports = Vec::new();
    let mut replays = Vec::new();
    let mut starts = Vec::new();
    for (id, file) in &recorded {
        let t0 = Instant::now();
        let imported = suite
            .import_bundle(Box::new(BufReader::new(std::fs::File::open(file).unwrap())))
            .await
            .unwrap();
        imports.push(t0.elapsed());
        assert_eq!(&imported.run_id, id);
        let t0 = Instant::now();
        let h = start_replay(&suite, id).await;
        let replay: RunId = h.run_id.clone();
        starts.push(t0.elapsed());
        let outcome = h.wait().await;
        replays.push(t0.elapsed());
        assert!(matches!(outcome, RunOutcome::Finished(_)), "{outcome:?}");
        let report =
            cairn_engine::replay::report::report(suite.journal().backend().as_ref(), id, &replay)
                .unwrap();
        assert!(report.same_output && report.divergence.is_none());
        assert_eq!(report.steps_replayed as usize, STEPS);
    }
    // The whole suite again, side by side, as `cairn test` runs it.
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let slots = Arc::new(tokio::sync::Semaphore::new(cores));
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for (id, _) in &recorded {
        let (suite, slots, id) = (suite.clone(), slots.clone(), id.clone());
        tasks.push(tokio::spawn(async move {
            let _slot = slots.acquire_owned().await;
            let h = start_replay(&suite, &id).await;
            matches!(h.wait().await, RunOutcome::Finished(_))
        }));
    }
    for t in tasks {
        assert!(t.await.unwrap());
    }
    let side_by_side = t0.elapsed();
    suite.journal().close();

    let (orig, rep) = (median(originals.clone()), median(replays.clone()));
    let worst = replays.iter().max().copied().unwrap_or_default();
    println!("replay: {RUNS} recorded runs (a command, an agent of {STEPS} steps with 11 tool calls, a value)");
    println!("  recorded (baseline): median {:.1} ms per run", ms(orig));
    println!(
        "  bundle read into a fresh store: median {:.1} ms",
        ms(median(imports))
    );
    println!(
        "  replay: median {:.1} ms, slowest {:.1} ms per run (target: under 1000 ms): {:.2}x the recorded run",
        ms(rep),
        ms(worst),
        rep.as_secs_f64() / orig.as_secs_f64()
    );
    println!(
        "  of which set-up (the original read, its root copied, RunStarted): median {:.1} ms",
        ms(median(starts))
    );
    println!(
        "  the suite side by side ({cores} at once): {:.1} ms for {RUNS}, {:.1} ms per run",
        ms(side_by_side),
        ms(side_by_side) / RUNS as f64
    );
}

fn main() {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(bench());
}
