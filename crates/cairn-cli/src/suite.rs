//! `cairn test [DIR]`: a folder of recorded runs (bundles, `cairn export
//! --bundle`) replayed against the workflows as they are now, each judged
//! by what is written beside it, side by side, with a JUnit XML report for
//! CI (docs/replay.md#suites).
//!
//! Every bundle is read into a store of the suite's own, in a temporary
//! folder, so a suite never touches the store or the folders of the
//! project it tests; each replay works in its own copy of its original's
//! root there.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_engine::replay::report::Report;
use cairn_engine::{Engine, EngineOptions, RunOutcome, StartOptions};
use cairn_events::{EventKind, ReplayOf, ReplayTools, RunId};
use cairn_store::{Journal, JournalOptions};
use serde_json::{json, Value};

use crate::cli::{Global, TestArgs};
use crate::{bad_input, store};

/// What a test's file beside its bundle (`NAME.expect.yaml`) says.
#[derive(Debug, Default)]
struct Expect {
    /// The workflow file to replay, instead of the recorded run's own.
    workflow: Option<PathBuf>,
    input: Option<Value>,
    live: bool,
    tools: ReplayTools,
    /// The output equals this.
    output: Option<Value>,
    /// The output matches this JSON Schema.
    output_schema: Option<Value>,
    /// Each scorer scores at least this.
    scores: Vec<(String, f64)>,
    /// How the replay ends: `finished` (the default) or `failed`.
    status: String,
    /// The output is the original's (the default when neither `output`
    /// nor `output_schema` is given).
    same_output: Option<bool>,
}

/// One test's outcome.
struct Outcome {
    name: String,
    bundle: PathBuf,
    replay: Option<RunId>,
    failures: Vec<String>,
    report: Option<Report>,
    duration: Duration,
}

/// `cairn test`.
pub async fn test(g: &Global, a: TestArgs) -> anyhow::Result<u8> {
    let dir = a.dir.clone().unwrap_or_else(|| PathBuf::from("."));
    let bundles = find_bundles(&dir)?;
    if bundles.is_empty() {
        return Err(bad_input(format!(
            "{}: no bundles (*.bundle) to replay; write one with `cairn export --bundle RUN`",
            dir.display()
        )));
    }
    // Every expectation is read before anything runs: a bad one is bad
    // input, not a failed test.
    let mut tests = Vec::new();
    for b in bundles {
        let expect = read_expect(&b)?;
        tests.push((b, expect));
    }
    let scratch = tempfile::Builder::new()
        .prefix("cairn-test-")
        .tempdir()
        .map_err(|e| anyhow::anyhow!("a folder for the suite's store: {e}"))?;
    let engine = suite_engine(g, scratch.path())?;
    let limit = a
        .concurrency
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()))
        .max(1);
    let slots = Arc::new(tokio::sync::Semaphore::new(limit));
    // Bundles are read in one at a time: two bundles of one run (two
    // tests of it) find it read whole, not half-way.
    let reading = Arc::new(tokio::sync::Mutex::new(()));
    let mut tasks = Vec::new();
    for (bundle, expect) in tests {
        let engine = engine.clone();
        let (slots, reading) = (slots.clone(), reading.clone());
        tasks.push(tokio::spawn(async move {
            let _slot = slots.acquire_owned().await;
            run_one(&engine, &reading, bundle, expect).await
        }));
    }
    let mut outcomes = Vec::new();
    for t in tasks {
        outcomes.push(t.await?);
    }
    outcomes.sort_by(|a, b| a.name.cmp(&b.name));
    let failed = outcomes.iter().filter(|o| !o.failures.is_empty()).count();
    if a.json {
        let tests: Vec<Value> = outcomes.iter().map(outcome_json).collect();
        println!(
            "{}",
            json!({"passed": outcomes.len() - failed, "failed": failed, "tests": tests})
        );
    } else {
        for o in &outcomes {
            print_outcome(o);
        }
        println!(
            "{} passed, {failed} failed ({} bundle{})",
            outcomes.len() - failed,
            outcomes.len(),
            if outcomes.len() == 1 { "" } else { "s" }
        );
    }
    if let Some(path) = &a.junit {
        std::fs::write(path, junit(&outcomes))
            .map_err(|e| bad_input(format!("--junit {}: {e}", path.display())))?;
    }
    engine.shutdown(Duration::from_secs(5)).await;
    engine.journal().close();
    if a.keep {
        let kept = scratch.keep();
        eprintln!(
            "the suite's store and copies are kept in {}",
            kept.display()
        );
    }
    Ok(if failed == 0 {
        crate::EXIT_OK
    } else {
        crate::EXIT_DIVERGED
    })
}

/// The bundles under `dir`, at any depth, in the order of their paths.
fn find_bundles(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    if !dir.is_dir() {
        return Err(bad_input(format!("{}: no such folder", dir.display())));
    }
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let entries =
            std::fs::read_dir(&d).map_err(|e| bad_input(format!("{}: {e}", d.display())))?;
        for entry in entries {
            let entry = entry?;
            let path = entry.path();
            let kind = entry.file_type()?;
            if kind.is_dir() && !entry.file_name().to_string_lossy().starts_with('.') {
                todo.push(path);
            } else if kind.is_file() && path.extension().is_some_and(|e| e == "bundle") {
                out.push(path);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// `NAME.expect.yaml` (or `.json`) beside `NAME.bundle`, read and
/// checked; none means the defaults.
fn read_expect(bundle: &Path) -> anyhow::Result<Expect> {
    let stem = bundle.with_extension("");
    let candidates = ["expect.yaml", "expect.yml", "expect.json"]
        .map(|ext| PathBuf::from(format!("{}.{ext}", stem.display())));
    let Some(path) = candidates.iter().find(|p| p.is_file()) else {
        return Ok(Expect {
            status: "finished".into(),
            ..Default::default()
        });
    };
    let text =
        std::fs::read_to_string(path).map_err(|e| bad_input(format!("{}: {e}", path.display())))?;
    let v = cairn_workflow::parse_data(&text, path)?;
    parse_expect(&v, path)
}

fn parse_expect(v: &Value, path: &Path) -> anyhow::Result<Expect> {
    let bad = |field: &str, why: &str| bad_input(format!("{}: `{field}`: {why}", path.display()));
    let Some(top) = v.as_object() else {
        return Err(bad(
            "(top)",
            "an object of workflow, input, live, tools, expect",
        ));
    };
    let mut e = Expect {
        status: "finished".into(),
        ..Default::default()
    };
    for (k, val) in top {
        match k.as_str() {
            "workflow" => {
                let p = val
                    .as_str()
                    .ok_or_else(|| bad("workflow", "a path (relative to this file)"))?;
                e.workflow = Some(path.parent().unwrap_or(Path::new(".")).join(p));
            }
            "input" => e.input = Some(val.clone()),
            "live" => e.live = val.as_bool().ok_or_else(|| bad("live", "true or false"))?,
            "tools" => {
                e.tools = match val.as_str() {
                    Some("real") => ReplayTools::Real,
                    Some("recorded") => ReplayTools::Recorded,
                    _ => return Err(bad("tools", "`real` or `recorded`")),
                }
            }
            "expect" => {
                let Some(ex) = val.as_object() else {
                    return Err(bad("expect", "an object"));
                };
                for (k, val) in ex {
                    match k.as_str() {
                        "output" => e.output = Some(val.clone()),
                        "output_schema" => {
                            if !val.is_object() && !val.is_boolean() {
                                return Err(bad("expect.output_schema", "a JSON Schema"));
                            }
                            e.output_schema = Some(val.clone());
                        }
                        "scores" => {
                            let Some(m) = val.as_object() else {
                                return Err(bad(
                                    "expect.scores",
                                    "scorer names and their least scores",
                                ));
                            };
                            for (name, min) in m {
                                let min = min.as_f64().ok_or_else(|| {
                                    bad(&format!("expect.scores.{name}"), "a number")
                                })?;
                                e.scores.push((name.clone(), min));
                            }
                        }
                        "status" => {
                            e.status = match val.as_str() {
                                Some(s @ ("finished" | "failed")) => s.to_string(),
                                _ => return Err(bad("expect.status", "`finished` or `failed`")),
                            }
                        }
                        "same_output" => {
                            e.same_output = Some(
                                val.as_bool()
                                    .ok_or_else(|| bad("expect.same_output", "true or false"))?,
                            )
                        }
                        other => {
                            return Err(bad(
                                &format!("expect.{other}"),
                                "unknown (output, output_schema, scores, status, same_output)",
                            ))
                        }
                    }
                }
            }
            other => return Err(bad(other, "unknown (workflow, input, live, tools, expect)")),
        }
    }
    Ok(e)
}

/// The suite's store and engine, in `dir`.
fn suite_engine(g: &Global, dir: &Path) -> anyhow::Result<Engine> {
    let db = dir.join(".cairn/cairn.db");
    let url = cairn_store::StoreUrl::parse(&db.display().to_string())?;
    let backend = cairn_store::open(
        &url,
        &cairn_store::OpenOptions {
            create: true,
            lease_ttl: Some(store::lease_ttl(g)?),
            reads_first: false,
            instance: None,
        },
    )?;
    let journal = Journal::open(backend, JournalOptions { log_dir: None })?;
    Ok(Engine::new(
        journal,
        EngineOptions {
            snapshot_dir: Some(dir.join(".cairn/snapshots")),
            ..Default::default()
        },
    ))
}

async fn run_one(
    engine: &Engine,
    reading: &tokio::sync::Mutex<()>,
    bundle: PathBuf,
    expect: Expect,
) -> Outcome {
    let name = bundle
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let t0 = Instant::now();
    let mut out = Outcome {
        name,
        bundle: bundle.clone(),
        replay: None,
        failures: Vec::new(),
        report: None,
        duration: Duration::ZERO,
    };
    if let Err(e) = replay_and_judge(engine, reading, &bundle, &expect, &mut out).await {
        out.failures.push(format!("{e:#}"));
    }
    out.duration = t0.elapsed();
    out
}

async fn replay_and_judge(
    engine: &Engine,
    reading: &tokio::sync::Mutex<()>,
    bundle: &Path,
    expect: &Expect,
    out: &mut Outcome,
) -> anyhow::Result<()> {
    let original = {
        let _one_at_a_time = reading.lock().await;
        crate::replay::import(engine, bundle).await?
    };
    let wf = match &expect.workflow {
        Some(p) => cairn_workflow::load_tree(p)
            .map_err(|e| anyhow::anyhow!("workflow {}: {e}", p.display()))?,
        None => engine.definition_of(&original).await?,
    };
    let input = match &expect.input {
        Some(i) => i.clone(),
        None => engine
            .journal()
            .backend()
            .get_run(&original)?
            .map(|r| r.input)
            .unwrap_or(Value::Null),
    };
    let replay = cairn_engine::new_run_id();
    out.replay = Some(replay.clone());
    let handle = engine
        .start(
            wf,
            input,
            StartOptions {
                run_id: Some(replay.clone()),
                // Nobody answers a suite: a question the original never
                // asked stops the replay instead of waiting for ever.
                exit_on_wait: true,
                replay: Some(ReplayOf {
                    run_id: original.clone(),
                    live: expect.live,
                    tools: expect.tools,
                }),
                ..Default::default()
            },
        )
        .await?;
    let outcome = handle.wait().await;
    let backend = engine.journal().backend().clone();
    let (o, r) = (original.clone(), replay.clone());
    let report = tokio::task::spawn_blocking(move || {
        cairn_engine::replay::report::report(backend.as_ref(), &o, &r)
    })
    .await??;
    judge(
        engine,
        expect,
        &outcome,
        &report,
        &replay,
        &mut out.failures,
    )?;
    out.report = Some(report);
    Ok(())
}

fn judge(
    engine: &Engine,
    expect: &Expect,
    outcome: &RunOutcome,
    report: &Report,
    replay: &RunId,
    failures: &mut Vec<String>,
) -> anyhow::Result<()> {
    if let Some(d) = &report.divergence {
        if !expect.live {
            failures.push(format!("diverged: {}", d.message));
        }
    }
    let status = match outcome {
        RunOutcome::Finished(_) => "finished",
        RunOutcome::Failed(_) => "failed",
        RunOutcome::Cancelled => "cancelled",
        RunOutcome::Waiting => "waiting for a person",
        _ => "stopped",
    };
    if status != expect.status {
        let why = match outcome {
            RunOutcome::Failed(e) => format!(": {}", e.message),
            _ => String::new(),
        };
        failures.push(format!(
            "the replay {status}{why}, expected {}",
            expect.status
        ));
    }
    let output = report.output.replay.clone();
    if let Some(want) = &expect.output {
        if output.as_ref() != Some(want) {
            failures.push(format!(
                "output {} is not the expected {want}",
                output.as_ref().map_or("(none)".into(), Value::to_string)
            ));
        }
    }
    if let Some(schema) = &expect.output_schema {
        let value = output.clone().unwrap_or(Value::Null);
        if let Some(problem) = cairn_engine::schema_problem(schema, &value) {
            failures.push(format!("output does not match output_schema: {problem}"));
        }
    }
    let same = expect
        .same_output
        .unwrap_or(expect.output.is_none() && expect.output_schema.is_none());
    if same && !report.same_output {
        failures.push(format!(
            "output {} is not the original's {}",
            output.as_ref().map_or("(none)".into(), Value::to_string),
            report
                .output
                .original
                .as_ref()
                .map_or("(none)".into(), Value::to_string)
        ));
    }
    if !expect.scores.is_empty() {
        let scores = scores_of(engine, replay)?;
        for (name, min) in &expect.scores {
            match scores.iter().rev().find(|(n, _)| n == name) {
                Some((_, s)) if *s >= *min => {}
                Some((_, s)) => failures.push(format!("scorer `{name}` scored {s}, under {min}")),
                None => failures.push(format!("scorer `{name}` gave no score")),
            }
        }
    }
    Ok(())
}

/// The scores a run's scorers gave, in the log's order.
fn scores_of(engine: &Engine, run: &RunId) -> anyhow::Result<Vec<(String, f64)>> {
    let stored = engine
        .journal()
        .backend()
        .read_events(run, &cairn_store::EventQuery::default())?;
    let mut out = Vec::new();
    for s in &stored {
        if let Ok(ev) = s.decode() {
            if let EventKind::ScorerFinished {
                scorer_name, score, ..
            } = ev.kind
            {
                out.push((scorer_name, score));
            }
        }
    }
    Ok(out)
}

fn print_outcome(o: &Outcome) {
    let ms = o.duration.as_millis();
    if o.failures.is_empty() {
        let steps = o.report.as_ref().map_or(0, |r| r.steps_replayed);
        println!(
            "ok    {} ({ms} ms, {steps} model steps from the record)",
            o.name
        );
        return;
    }
    println!("FAIL  {} ({ms} ms)", o.name);
    for f in &o.failures {
        println!("      {f}");
    }
    if let Some(r) = &o.report {
        if let Some(d) = &r.divergence {
            if let Some(req) = &d.request {
                for m in req.messages.iter().take(3) {
                    println!("      message {}:", m.index);
                    for line in m.diff.lines().take(20) {
                        println!("        {line}");
                    }
                }
            }
        }
    }
}

fn outcome_json(o: &Outcome) -> Value {
    json!({
        "name": o.name,
        "bundle": o.bundle.display().to_string(),
        "replay": o.replay.as_ref().map(RunId::as_str),
        "passed": o.failures.is_empty(),
        "failures": o.failures,
        "durationMs": o.duration.as_millis() as u64,
        "report": o.report,
    })
}

/// The JUnit XML of a suite: one `testsuite` named `cairn`, a `testcase`
/// per bundle, a `failure` for each that failed.
fn junit(outcomes: &[Outcome]) -> String {
    let failed = outcomes.iter().filter(|o| !o.failures.is_empty()).count();
    let total: f64 = outcomes.iter().map(|o| o.duration.as_secs_f64()).sum();
    let mut x = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    x.push_str(&format!(
        "<testsuites tests=\"{}\" failures=\"{failed}\" time=\"{total:.3}\">\n  <testsuite name=\"cairn\" tests=\"{}\" failures=\"{failed}\" errors=\"0\" time=\"{total:.3}\">\n",
        outcomes.len(),
        outcomes.len()
    ));
    for o in outcomes {
        x.push_str(&format!(
            "    <testcase classname=\"cairn.replay\" name=\"{}\" file=\"{}\" time=\"{:.3}\"",
            xml(&o.name),
            xml(&o.bundle.display().to_string()),
            o.duration.as_secs_f64()
        ));
        if o.failures.is_empty() {
            x.push_str("/>\n");
            continue;
        }
        x.push_str(">\n");
        x.push_str(&format!(
            "      <failure message=\"{}\">{}</failure>\n",
            xml(&o.failures[0]),
            xml(&o.failures.join("\n"))
        ));
        x.push_str("    </testcase>\n");
    }
    x.push_str("  </testsuite>\n</testsuites>\n");
    x
}

/// Text safe in XML, attributes included; characters XML 1.0 cannot
/// hold are dropped.
fn xml(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\t' | '\n' | '\r' => out.push(c),
            c if (c as u32) < 0x20 || c == '\u{fffe}' || c == '\u{ffff}' => {}
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn junit_escapes_what_xml_cannot_hold() {
        assert_eq!(xml("a<b>&\"c'\u{1}"), "a&lt;b&gt;&amp;&quot;c&apos;");
    }

    #[test]
    fn an_expectation_names_the_field_it_gets_wrong() {
        let p = Path::new("t.expect.yaml");
        let e = parse_expect(&json!({"expect": {"scores": {"judge": "high"}}}), p).unwrap_err();
        assert!(
            e.to_string().contains("`expect.scores.judge`: a number"),
            "{e}"
        );
        let e = parse_expect(&json!({"expekt": 1}), p).unwrap_err();
        assert!(e.to_string().contains("`expekt`: unknown"), "{e}");
        let e = parse_expect(&json!({"tools": "fake"}), p).unwrap_err();
        assert!(e.to_string().contains("`tools`"), "{e}");
        let ok = parse_expect(
            &json!({"live": true, "tools": "recorded", "expect": {"output": 1, "scores": {"j": 0.5}}}),
            p,
        )
        .unwrap();
        assert!(ok.live && ok.tools == ReplayTools::Recorded);
        assert_eq!(ok.scores, vec![("j".to_string(), 0.5)]);
    }
}
