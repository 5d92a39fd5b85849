//! Bundles (`cairn export --bundle`): a recorded run in one text file that
//! can live in git beside the workflow it tests, and be replayed on any
//! machine: the run's row, its workflow generations, its log, its tool
//! calls' rows, the same of every child run it started, and the objects of
//! its first workspace snapshot (what a replay's copy of the root starts
//! from).
//!
//! One JSON object a line, each with one key naming what it holds:
//! `bundle` (the header: format, version, run), then `run`, `generation`,
//! `event`, `toolCall` per run, `object` (id, kind, base64), and `end`
//! (the line count and the SHA-256 of every line before it). Reading one
//! checks all of it before anything is written: the format and version,
//! the trailer's hash, every event against its run and seq, every object
//! against its id.

use std::io::{BufRead, Write};
use std::sync::Arc;

use base64::Engine as _;
use cairn_events::{Event, EventKind, RunId};
use cairn_snapshot::{Kind, MemoryMirror, MirroredObject, ObjectId, ObjectMirror};
use cairn_store::{
    Backend, EventQuery, GenerationRecord, PinnedFile, RecordStatus, RunRecord, StoredEvent,
    ToolCallRecord, ToolCallStatus,
};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::{Engine, EngineError};

/// The header's `format`.
pub const FORMAT: &str = "cairn-bundle";
/// The header's `version`: what this Cairn writes and reads.
pub const VERSION: u64 = 1;
/// Longest line read (an object's base64 is one line).
const MAX_LINE: u64 = 512 << 20;
/// Most runs (the run and its children, at any depth) one bundle holds.
const MAX_RUNS: usize = 10_000;
/// Events appended at a time.
const PAGE: usize = 2_000;

/// What an export wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Exported {
    /// The run and its children.
    pub runs: usize,
    pub events: u64,
    pub tool_calls: u64,
    /// Snapshot objects.
    pub objects: usize,
}

/// What an import read into the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Imported {
    /// The bundle's run.
    pub run_id: RunId,
    /// Every run it held, the top one first.
    pub runs: Vec<RunId>,
    /// Whether the store held the runs already (the same bundle read
    /// before): nothing was written then.
    pub already: bool,
}

fn bad(why: impl Into<String>) -> EngineError {
    EngineError::ReplayRefused {
        reason: format!("not a readable bundle: {}", why.into()),
    }
}

impl Engine {
    /// Writes run `run_id` as a bundle to `out`.
    pub async fn export_bundle(
        &self,
        run_id: &RunId,
        out: Box<dyn Write + Send>,
    ) -> Result<Exported, EngineError> {
        let id = run_id.clone();
        let store = self.inner.services.snapshot_store();
        self.blocking(move |e| export(e.backend().as_ref(), &id, store, out))
            .await
    }

    /// Reads a bundle into this store (and its objects into this engine's
    /// snapshot repository). A bundle whose runs the store holds already,
    /// with the same logs, is taken as read.
    pub async fn import_bundle(
        &self,
        input: Box<dyn BufRead + Send>,
    ) -> Result<Imported, EngineError> {
        let store = self.inner.services.snapshot_store();
        self.blocking(move |e| import(e.backend().as_ref(), store, input))
            .await
    }
}

/// The run and every child run it started, at any depth, the run first.
fn family(b: &dyn Backend, run: &RunId) -> Result<Vec<(RunId, Vec<Event>)>, EngineError> {
    let mut out = Vec::new();
    let mut todo = vec![run.clone()];
    while let Some(id) = todo.pop() {
        if out.iter().any(|(r, _): &(RunId, _)| *r == id) {
            continue;
        }
        if out.len() >= MAX_RUNS {
            return Err(EngineError::ReplayRefused {
                reason: format!("run `{run}` has more than {MAX_RUNS} child runs to bundle"),
            });
        }
        let events: Vec<Event> = b
            .read_events(&id, &EventQuery::default())?
            .iter()
            .map(|s| crate::decode_row(&id, s))
            .collect::<Result<_, _>>()?;
        for ev in &events {
            if let EventKind::DelegationStarted { child_run_id, .. } = &ev.kind {
                todo.push(child_run_id.clone());
            }
        }
        out.push((id, events));
    }
    Ok(out)
}

/// Lines written with the hash of everything written so far.
struct Lines {
    out: Box<dyn Write + Send>,
    hash: Sha256,
    count: u64,
}

impl Lines {
    fn put(&mut self, v: &Value) -> Result<(), EngineError> {
        let mut line = serde_json::to_string(v).map_err(|e| bad(e.to_string()))?;
        line.push('\n');
        self.hash.update(line.as_bytes());
        self.count += 1;
        self.out
            .write_all(line.as_bytes())
            .map_err(|e| EngineError::ReplayRefused {
                reason: format!("writing the bundle: {e}"),
            })
    }
}

fn export(
    b: &dyn Backend,
    run: &RunId,
    store: Option<Result<Arc<cairn_snapshot::SnapshotStore>, String>>,
    out: Box<dyn Write + Send>,
) -> Result<Exported, EngineError> {
    let top = b
        .get_run(run)?
        .ok_or_else(|| EngineError::run_not_found(run))?;
    let runs = family(b, run)?;
    let first_snapshot = runs[0].1.iter().find_map(|e| match &e.kind {
        EventKind::NodeStarted { snapshot: Some(s) } => Some(s.clone()),
        _ => None,
    });
    let mut lines = Lines {
        out,
        hash: Sha256::new(),
        count: 0,
    };
    lines.put(&json!({"bundle": {
        "format": FORMAT,
        "version": VERSION,
        "run": run.as_str(),
        "workflow": top.workflow,
        "snapshot": first_snapshot,
        "exportedMs": crate::node::now_ms(),
    }}))?;
    let mut done = Exported {
        runs: runs.len(),
        ..Default::default()
    };
    for (id, events) in &runs {
        let rec = b
            .get_run(id)?
            .ok_or_else(|| EngineError::run_not_found(id))?;
        lines.put(&json!({ "run": run_json(&rec) }))?;
        let mut generations = vec![0u64];
        for e in events {
            if let EventKind::WorkflowReloaded { generation, .. } = &e.kind {
                generations.push(*generation);
            }
        }
        generations.dedup();
        for g in generations {
            if let Some(gen) = b.generation(id, g)? {
                lines.put(&json!({ "generation": generation_json(&gen) }))?;
            }
        }
        let mut passes = std::collections::BTreeSet::new();
        for e in events {
            let value: Value =
                serde_json::from_str(&e.to_json()).map_err(|e| bad(e.to_string()))?;
            lines.put(&json!({ "event": value }))?;
            done.events += 1;
            if let Some((node, iteration)) = e.node_key() {
                passes.insert((node.to_string(), iteration));
            }
        }
        for (node, iteration) in passes {
            for call in b.tool_calls(id, &cairn_events::NodePath::from(&node), iteration)? {
                lines.put(&json!({ "toolCall": call_json(&call) }))?;
                done.tool_calls += 1;
            }
        }
    }
    if let Some(snapshot) = &first_snapshot {
        let id: ObjectId = snapshot
            .parse()
            .map_err(|_| bad(format!("snapshot `{snapshot}`")))?;
        let store = match store {
            Some(Ok(s)) => s,
            Some(Err(e)) => {
                return Err(EngineError::SnapshotsUnavailable { detail: e });
            }
            None => return Err(EngineError::NoSnapshots),
        };
        let mirror = Arc::new(MemoryMirror::new());
        store
            .export_snapshot(id, mirror.clone())
            .map_err(|source| EngineError::Files {
                task: crate::FilesTask::ReplayCopy,
                source,
            })?;
        for o in mirror.objects() {
            lines.put(&json!({"object": {
                "id": o.id.to_string(),
                "kind": o.kind.name(),
                "data": base64::engine::general_purpose::STANDARD.encode(&o.body),
            }}))?;
            done.objects += 1;
        }
    }
    let count = lines.count;
    let hash = hex::encode(lines.hash.clone().finalize());
    lines.put(&json!({"end": {"lines": count, "sha256": hash}}))?;
    lines.out.flush().map_err(|e| EngineError::ReplayRefused {
        reason: format!("writing the bundle: {e}"),
    })?;
    Ok(done)
}

/// A bundle read whole and checked.
struct Read {
    run: RunId,
    snapshot: Option<String>,
    runs: Vec<ReadRun>,
    objects: Vec<MirroredObject>,
}

struct ReadRun {
    rec: RunRecord,
    generations: Vec<GenerationRecord>,
    events: Vec<StoredEvent>,
    calls: Vec<ToolCallRecord>,
}

fn read(mut input: Box<dyn BufRead + Send>) -> Result<Read, EngineError> {
    let mut hash = Sha256::new();
    let mut count = 0u64;
    let mut header: Option<(RunId, Option<String>)> = None;
    let mut runs: Vec<ReadRun> = Vec::new();
    let mut objects = Vec::new();
    let mut ended = false;
    let mut buf = Vec::new();
    loop {
        buf.clear();
        let n = std::io::Read::take(&mut input, MAX_LINE + 1)
            .read_until(b'\n', &mut buf)
            .map_err(|e| bad(format!("reading: {e}")))?;
        if n == 0 {
            break;
        }
        if n as u64 > MAX_LINE {
            return Err(bad(format!(
                "line {} is longer than {MAX_LINE} bytes",
                count + 1
            )));
        }
        if ended {
            return Err(bad("lines after its end"));
        }
        let at = count + 1;
        let line: Value =
            serde_json::from_slice(&buf).map_err(|e| bad(format!("line {at} is not JSON: {e}")))?;
        let Some((tag, body)) = line
            .as_object()
            .and_then(|m| (m.len() == 1).then(|| m.iter().next()).flatten())
        else {
            return Err(bad(format!("line {at} is not an object of one key")));
        };
        let field = |name: &str| body.get(name).cloned().unwrap_or(Value::Null);
        match (tag.as_str(), &header) {
            ("bundle", None) if at == 1 => {
                if field("format") != json!(FORMAT) {
                    return Err(bad(format!("its format is not `{FORMAT}`")));
                }
                let version = field("version").as_u64().unwrap_or(0);
                if version != VERSION {
                    return Err(bad(format!(
                        "version {version}: this Cairn reads version {VERSION}"
                    )));
                }
                let run = run_id(&field("run"), at)?;
                let snapshot = field("snapshot").as_str().map(str::to_string);
                header = Some((run, snapshot));
            }
            (_, None) => return Err(bad("its first line is not its header")),
            ("run", Some(_)) => {
                if runs.len() >= MAX_RUNS {
                    return Err(bad(format!("more than {MAX_RUNS} runs")));
                }
                runs.push(ReadRun {
                    rec: run_from(body, at)?,
                    generations: Vec::new(),
                    events: Vec::new(),
                    calls: Vec::new(),
                });
            }
            ("generation", Some(_)) => {
                let r = runs
                    .last_mut()
                    .ok_or_else(|| bad("a generation before any run"))?;
                let g = generation_from(body, at)?;
                if g.run_id != r.rec.run_id {
                    return Err(bad(format!("line {at}: a generation of another run")));
                }
                r.generations.push(g);
            }
            ("event", Some(_)) => {
                let r = runs
                    .last_mut()
                    .ok_or_else(|| bad("an event before any run"))?;
                let ev = Event::from_json(&body.to_string())
                    .map_err(|e| bad(format!("line {at}: {e}")))?;
                if ev.run_id != r.rec.run_id || ev.seq.get() != r.events.len() as u64 + 1 {
                    return Err(bad(format!(
                        "line {at}: event {} of run {} where seq {} of run {} comes",
                        ev.seq,
                        ev.run_id,
                        r.events.len() + 1,
                        r.rec.run_id
                    )));
                }
                r.events.push(StoredEvent::from_event(&ev));
            }
            ("toolCall", Some(_)) => {
                let r = runs
                    .last_mut()
                    .ok_or_else(|| bad("a tool call before any run"))?;
                let c = call_from(body, at)?;
                if c.run_id != r.rec.run_id {
                    return Err(bad(format!("line {at}: a tool call of another run")));
                }
                r.calls.push(c);
            }
            ("object", Some(_)) => {
                let id: ObjectId = field("id")
                    .as_str()
                    .and_then(|s| s.parse().ok())
                    .ok_or_else(|| bad(format!("line {at}: no object id")))?;
                let kind = field("kind")
                    .as_str()
                    .and_then(Kind::parse)
                    .ok_or_else(|| bad(format!("line {at}: no object kind")))?;
                let body = base64::engine::general_purpose::STANDARD
                    .decode(field("data").as_str().unwrap_or_default())
                    .map_err(|e| bad(format!("line {at}: {e}")))?;
                objects.push(MirroredObject { id, kind, body });
            }
            ("end", Some(_)) => {
                let lines = field("lines").as_u64();
                let sum = field("sha256");
                let ours = hex::encode(hash.clone().finalize());
                if lines != Some(count) || sum.as_str() != Some(ours.as_str()) {
                    return Err(bad("its end does not match its lines (cut or changed)"));
                }
                ended = true;
            }
            (other, Some(_)) => return Err(bad(format!("line {at}: unknown `{other}`"))),
        }
        hash.update(&buf);
        count += 1;
    }
    if !ended {
        return Err(bad("it has no end line (cut short?)"));
    }
    let (run, snapshot) = header.ok_or_else(|| bad("it is empty"))?;
    if runs.first().map(|r| &r.rec.run_id) != Some(&run) {
        return Err(bad("its first run is not the one its header names"));
    }
    Ok(Read {
        run,
        snapshot,
        runs,
        objects,
    })
}

fn import(
    b: &dyn Backend,
    store: Option<Result<Arc<cairn_snapshot::SnapshotStore>, String>>,
    input: Box<dyn BufRead + Send>,
) -> Result<Imported, EngineError> {
    let bundle = read(input)?;
    let ids: Vec<RunId> = bundle.runs.iter().map(|r| r.rec.run_id.clone()).collect();
    // Read before: the same runs, with the same logs, are taken as read.
    let mut there = 0;
    for r in &bundle.runs {
        if b.get_run(&r.rec.run_id)?.is_some() {
            let ours = b.read_events(&r.rec.run_id, &EventQuery::default())?;
            let same = ours.len() == r.events.len()
                && ours.iter().zip(&r.events).all(|(a, b)| a.json == b.json);
            if !same {
                return Err(EngineError::ReplayRefused {
                    reason: format!(
                        "this store has a run `{}` already, with another log",
                        r.rec.run_id
                    ),
                });
            }
            there += 1;
        }
    }
    if there > 0 && there < bundle.runs.len() {
        return Err(EngineError::ReplayRefused {
            reason: "this store holds some of the bundle's runs and not others".into(),
        });
    }
    let already = there == bundle.runs.len();
    if !already {
        for r in &bundle.runs {
            b.create_run(&r.rec)?;
            for g in &r.generations {
                b.put_generation(g)?;
            }
            for page in r.events.chunks(PAGE) {
                b.append(page)?;
            }
            for c in &r.calls {
                b.put_tool_call(c)?;
            }
        }
    }
    if let Some(snapshot) = &bundle.snapshot {
        let id: ObjectId = snapshot
            .parse()
            .map_err(|_| bad(format!("snapshot `{snapshot}`")))?;
        let store = match store {
            Some(Ok(s)) => s,
            Some(Err(e)) => return Err(EngineError::SnapshotsUnavailable { detail: e }),
            None => return Err(EngineError::NoSnapshots),
        };
        let mirror = Arc::new(MemoryMirror::new());
        mirror.put(&bundle.objects).map_err(bad)?;
        store
            .import_snapshot(id, mirror)
            .map_err(|source| EngineError::Files {
                task: crate::FilesTask::ReplayCopy,
                source,
            })?;
    }
    Ok(Imported {
        run_id: bundle.run,
        runs: ids,
        already,
    })
}

fn run_id(v: &Value, at: u64) -> Result<RunId, EngineError> {
    v.as_str()
        .and_then(|s| RunId::parse(s).ok())
        .ok_or_else(|| bad(format!("line {at}: no run id")))
}

fn text(v: &Value, name: &str, at: u64) -> Result<String, EngineError> {
    v.get(name)
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| bad(format!("line {at}: no `{name}`")))
}

fn int(v: &Value, name: &str, at: u64) -> Result<i64, EngineError> {
    v.get(name)
        .and_then(Value::as_i64)
        .ok_or_else(|| bad(format!("line {at}: no `{name}`")))
}

fn run_json(r: &RunRecord) -> Value {
    json!({
        "runId": r.run_id.as_str(),
        "workflow": r.workflow,
        "workflowPath": r.workflow_path,
        "workflowHash": r.workflow_hash,
        "workflowSource": r.workflow_source,
        "input": r.input,
        "status": r.status.as_str(),
        "createdMs": r.created_ms,
        "updatedMs": r.updated_ms,
        "parentRunId": r.parent_run_id.as_ref().map(RunId::as_str),
    })
}

fn run_from(v: &Value, at: u64) -> Result<RunRecord, EngineError> {
    let status = text(v, "status", at)?;
    Ok(RunRecord {
        run_id: run_id(&v["runId"], at)?,
        workflow: text(v, "workflow", at)?,
        workflow_path: text(v, "workflowPath", at)?,
        workflow_hash: text(v, "workflowHash", at)?,
        workflow_source: text(v, "workflowSource", at)?,
        input: v.get("input").cloned().unwrap_or(Value::Null),
        status: RecordStatus::parse(&status)
            .ok_or_else(|| bad(format!("line {at}: status `{status}`")))?,
        created_ms: int(v, "createdMs", at)?,
        updated_ms: int(v, "updatedMs", at)?,
        parent_run_id: match v.get("parentRunId") {
            Some(Value::Null) | None => None,
            Some(p) => Some(run_id(p, at)?),
        },
    })
}

fn generation_json(g: &GenerationRecord) -> Value {
    json!({
        "runId": g.run_id.as_str(),
        "generation": g.generation,
        "workflowHash": g.workflow_hash,
        "workflowSource": g.workflow_source,
        "files": g.files.iter().map(|f| json!({"path": f.path, "hash": f.hash, "text": f.text})).collect::<Vec<_>>(),
        "createdMs": g.created_ms,
    })
}

fn generation_from(v: &Value, at: u64) -> Result<GenerationRecord, EngineError> {
    let files = v
        .get("files")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|f| {
            Ok(PinnedFile {
                path: text(f, "path", at)?,
                hash: text(f, "hash", at)?,
                text: text(f, "text", at)?,
            })
        })
        .collect::<Result<_, EngineError>>()?;
    Ok(GenerationRecord {
        run_id: run_id(&v["runId"], at)?,
        generation: v
            .get("generation")
            .and_then(Value::as_u64)
            .ok_or_else(|| bad(format!("line {at}: no `generation`")))?,
        workflow_hash: text(v, "workflowHash", at)?,
        workflow_source: text(v, "workflowSource", at)?,
        files,
        created_ms: int(v, "createdMs", at)?,
    })
}

fn call_json(c: &ToolCallRecord) -> Value {
    json!({
        "runId": c.run_id.as_str(),
        "nodeId": c.node_id,
        "iteration": c.iteration,
        "attempt": c.attempt,
        "toolSeq": c.tool_seq,
        "tool": c.tool,
        "idempotencyKey": c.idempotency_key,
        "sideEffect": c.side_effect,
        "idempotent": c.idempotent,
        "input": c.input,
        "output": c.output,
        "startedMs": c.started_ms,
        "finishedMs": c.finished_ms,
        "status": c.status.as_str(),
        "error": c.error,
    })
}

fn call_from(v: &Value, at: u64) -> Result<ToolCallRecord, EngineError> {
    let n = |name: &str| -> Result<u32, EngineError> {
        v.get(name)
            .and_then(Value::as_u64)
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| bad(format!("line {at}: no `{name}`")))
    };
    let status = text(v, "status", at)?;
    let opt = |name: &str| v.get(name).cloned().filter(|x| !x.is_null());
    Ok(ToolCallRecord {
        run_id: run_id(&v["runId"], at)?,
        node_id: text(v, "nodeId", at)?,
        iteration: n("iteration")?,
        attempt: n("attempt")?,
        tool_seq: n("toolSeq")?,
        tool: text(v, "tool", at)?,
        idempotency_key: text(v, "idempotencyKey", at)?,
        side_effect: v.get("sideEffect").and_then(Value::as_bool).unwrap_or(true),
        idempotent: v
            .get("idempotent")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        input: v.get("input").cloned().unwrap_or(Value::Null),
        output: opt("output"),
        started_ms: int(v, "startedMs", at)?,
        finished_ms: v.get("finishedMs").and_then(Value::as_i64),
        status: ToolCallStatus::parse(&status)
            .ok_or_else(|| bad(format!("line {at}: status `{status}`")))?,
        error: opt("error"),
    })
}
