//! The commands that read: `runs`, `status`, `logs`, `validate`, `graph`,
//! `export`, `gc`; and `serve`.

use std::io::Write;
use std::time::Duration;

use anyhow::Context;
use cairn_api::{ActivityEntry, RunDetail, RunMeta};
use cairn_client::{ClientError, EventsQuery};

use crate::remote::client_error;
use cairn_events::{Event, EventType};
use cairn_store::{EventQuery, Journal, RecordStatus, RunFilter, SubscribeError};
use serde_json::Value;

use crate::bad_input;
use crate::cli::{ExportArgs, FileArgs, GcArgs, Global, LogsArgs, RunsArgs, ServeArgs, StatusArgs};
use crate::format::{datetime_ms, duration_ms, event_line, short_value};
use crate::store;

/// `cairn runs`.
pub async fn runs(g: &Global, a: RunsArgs) -> anyhow::Result<u8> {
    let status = match &a.status {
        Some(s) => match RecordStatus::parse(s) {
            Some(st @ (RecordStatus::Pending | RecordStatus::Queued | RecordStatus::Run(_))) => {
                Some(st)
            }
            _ => {
                return Err(bad_input(format!(
                    "--status `{s}`: use one of pending, queued, running, waiting-approval, waiting-input, finished, failed, cancelled"
                )))
            }
        },
        None => None,
    };
    let list = match &g.server {
        Some(url) => {
            let client = crate::remote::client(url, g)?;
            let q = cairn_client::RunsQuery {
                status: a.status.clone(),
                limit: Some(a.limit),
                ..Default::default()
            };
            client.runs(&q).await.map_err(client_error)?
        }
        None => local_runs(g, status, a.limit)?,
    };
    if a.json {
        println!("{}", serde_json::to_string(&list)?);
        return Ok(crate::EXIT_OK);
    }
    print!("{}", render_runs(&list.runs));
    Ok(crate::EXIT_OK)
}

/// The runs of the store, as the API lists them.
fn local_runs(
    g: &Global,
    status: Option<RecordStatus>,
    limit: usize,
) -> anyhow::Result<cairn_api::RunList> {
    let mut list = cairn_api::RunList {
        runs: Vec::new(),
        limit,
        offset: 0,
        next_offset: None,
    };
    if !g.store_exists() {
        // No store yet means no runs: nothing to list, nothing to create.
        return Ok(list);
    }
    let j = store::open(g, false)?;
    let runs = j.backend().list_runs(&RunFilter {
        status,
        limit: Some(limit),
        ..Default::default()
    })?;
    for r in &runs {
        let meta = RunMeta {
            workflow: &r.workflow,
            status: r.status.as_str(),
            parent_run_id: r.parent_run_id.as_ref(),
        };
        let mut summary = cairn_api::RunSummary::new(&r.run_id, &meta, r.created_ms, r.updated_ms);
        if let Some((input, output, cost)) = spent_of(&j, &r.run_id) {
            summary.tokens = Some(cairn_events::TokenTotals {
                input,
                output,
                ..Default::default()
            });
            summary.cost_usd = cost;
        }
        list.runs.push(summary);
    }
    let open: Vec<cairn_events::RunId> = runs
        .iter()
        .filter(|r| !r.status.is_terminal())
        .map(|r| r.run_id.clone())
        .collect();
    let mut drivers = j.backend().drivers(&open)?;
    for s in &mut list.runs {
        s.instance = drivers.remove(&s.run_id);
    }
    j.close();
    Ok(list)
}

/// The runs as a table, child runs indented under their parents.
fn render_runs(runs: &[cairn_api::RunSummary]) -> String {
    if runs.is_empty() {
        return "no runs\n".into();
    }
    let mut out = String::new();
    let order = tree_order(runs);
    let id_w = order
        .iter()
        .map(|&(i, depth)| runs[i].run_id.len() + 2 * depth)
        .max()
        .unwrap_or(3)
        .max(3);
    let wf_w = runs
        .iter()
        .map(|r| r.workflow.len())
        .max()
        .unwrap_or(8)
        .max(8);
    out.push_str(&format!(
        "{:<id_w$}  {:<wf_w$}  {:<16}  {:<20}  UPDATED\n",
        "RUN", "WORKFLOW", "STATUS", "CREATED"
    ));
    for (i, depth) in order {
        let r = &runs[i];
        let indent = "  ".repeat(depth);
        let spent = match &r.tokens {
            Some(t) if t.input + t.output > 0 => {
                let cost = r.cost_usd.map(|c| format!(" ${c:.4}")).unwrap_or_default();
                format!("  {} tokens{cost}", t.input + t.output)
            }
            _ => String::new(),
        };
        let driver = r
            .instance
            .as_ref()
            .map(|i| format!("  driven by {i}"))
            .unwrap_or_default();
        out.push_str(&format!(
            "{:<id_w$}  {:<wf_w$}  {:<16}  {:<20}  {}{spent}{driver}\n",
            format!("{indent}{}", r.run_id),
            r.workflow,
            r.status,
            datetime_ms(r.created_ms),
            datetime_ms(r.updated_ms)
        ));
    }
    out
}

/// What a run spent on models: input and output tokens, and the cost
/// when known.
type Spent = Option<(u64, u64, Option<f64>)>;

/// What a run spent, from its latest summary (a run still going has none
/// yet).
fn spent_of(j: &cairn_store::Journal, run: &cairn_events::RunId) -> Spent {
    let q = cairn_store::EventQuery {
        types: vec![EventType::RunSummary],
        ..Default::default()
    };
    let last = j.backend().read_events(run, &q).ok()?.pop()?;
    match last.decode().ok()?.kind {
        cairn_events::EventKind::RunSummary {
            tokens, cost_usd, ..
        } => Some((tokens.input, tokens.output, cost_usd)),
        _ => None,
    }
}

/// The listed runs as a tree: each run, then its children (newest first,
/// as listed) indented one level deeper; a run whose parent is not in the
/// list stands at the top. Indexes into `runs`, with depths.
fn tree_order(runs: &[cairn_api::RunSummary]) -> Vec<(usize, usize)> {
    use std::collections::HashMap;
    let at: HashMap<&str, usize> = runs
        .iter()
        .enumerate()
        .map(|(i, r)| (r.run_id.as_str(), i))
        .collect();
    let mut kids: HashMap<usize, Vec<usize>> = HashMap::new();
    let mut tops = Vec::new();
    for (i, r) in runs.iter().enumerate() {
        match r.parent_run_id.as_deref().and_then(|p| at.get(p)) {
            Some(&p) if p != i => kids.entry(p).or_default().push(i),
            _ => tops.push(i),
        }
    }
    let mut out = Vec::with_capacity(runs.len());
    let mut stack: Vec<(usize, usize)> = tops.into_iter().rev().map(|i| (i, 0)).collect();
    while let Some((i, depth)) = stack.pop() {
        if out.len() > runs.len() {
            break;
        }
        out.push((i, depth));
        if let Some(k) = kids.get(&i) {
            stack.extend(k.iter().rev().map(|&c| (c, depth + 1)));
        }
    }
    out
}

/// `cairn status`: the run's state as the server's `GET /v1/runs/{id}`
/// shows it, whether read from a server or from the store here.
pub async fn status(g: &Global, a: StatusArgs) -> anyhow::Result<u8> {
    // Said under the table of a run that has not ended: who drives it.
    let mut driver_note = None;
    let v = match &g.server {
        Some(url) => {
            let client = crate::remote::client(url, g)?;
            let run = store::run_id(&a.run)?;
            let v = client.run(&run).await.map_err(client_error)?;
            let ended = matches!(
                v.as_value()["status"].as_str(),
                Some("finished" | "failed" | "cancelled")
            );
            if !ended && !a.json {
                let gates = crate::people::open_gates_remote(&client, &run)
                    .await
                    .map_err(client_error)?;
                if !gates.is_empty() {
                    let mut note =
                        crate::people::describe(&run, &gates, &format!(" --server {url}"));
                    note.push_str(&format!(
                        "(through {url}: the server drives the run and goes on once answered)"
                    ));
                    driver_note = Some(note);
                }
            }
            v
        }
        None => {
            let engine = store::engine(g, false)?;
            let rec = store::require_run(engine.journal(), &a.run)?;
            let st = engine.state(&rec.run_id)?;
            let meta = RunMeta {
                workflow: &rec.workflow,
                status: rec.status.as_str(),
                parent_run_id: rec.parent_run_id.as_ref(),
            };
            let mut v = RunDetail::new(&st, &meta);
            let backend = engine.journal().backend();
            v.with_child_states(|child| Some(backend.get_run(child).ok()??.status.to_string()));
            if !st.status.is_some_and(|s| s.is_terminal()) {
                let mut note = String::new();
                let gates = crate::people::open_gates(&engine, &rec.run_id)?;
                if !gates.is_empty() {
                    note.push_str(&crate::people::describe(&rec.run_id, &gates, ""));
                    note.push('\n');
                }
                note.push_str(&driver_line(backend.as_ref(), &rec.run_id));
                driver_note = Some(note);
            }
            engine.journal().close();
            v
        }
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print!("{}", render_status(v.as_value()));
        if let Some(note) = driver_note {
            println!("\n{note}");
        }
    }
    Ok(crate::EXIT_OK)
}

/// Who drives a run that has not ended: a process holding its lease, or
/// nobody, and then how to go on.
fn driver_line(backend: &dyn cairn_store::Backend, run: &cairn_events::RunId) -> String {
    match backend.lease_holder(run) {
        Ok(Some(held)) => format!("driven by {}", held.holder),
        Ok(None) => format!(
            "no process drives this run (the one that did stopped or died): \
             `cairn resume {run}` continues it"
        ),
        Err(e) => format!("who drives this run is unknown: {e}"),
    }
}

/// `cairn activity`: the run's Activity view, one line per entry (a child
/// run's entries indented under the delegation), or the entries as JSON.
pub async fn activity(g: &Global, a: StatusArgs) -> anyhow::Result<u8> {
    let entries: Vec<ActivityEntry> = match &g.server {
        Some(url) => {
            let client = crate::remote::client(url, g)?;
            let run = store::run_id(&a.run)?;
            client.activity(&run).await.map_err(client_error)?.activity
        }
        None => {
            let engine = store::engine(g, false)?;
            let rec = store::require_run(engine.journal(), &a.run)?;
            let entries = cairn_server::run_activity(engine.journal().backend().as_ref(), &rec);
            engine.journal().close();
            entries?.into_iter().map(ActivityEntry::from).collect()
        }
    };
    if a.json {
        // One object, as the API's `GET /v1/runs/{id}/activity`.
        let page = cairn_api::ActivityPage {
            run_id: store::run_id(&a.run)?,
            activity: entries,
        };
        println!("{}", serde_json::to_string_pretty(&page)?);
    } else {
        print!("{}", render_activity(&entries));
    }
    Ok(crate::EXIT_OK)
}

/// Activity entries for people: when (from the first entry), status,
/// node, what, how long, and the error of those that failed.
fn render_activity(entries: &[ActivityEntry]) -> String {
    let t0 = entries.iter().map(|e| e.started_ms).min().unwrap_or(0);
    let mut out = String::new();
    // How deep each child run is, from its parent's depth.
    let mut depth: std::collections::HashMap<cairn_events::RunId, usize> = Default::default();
    for e in entries {
        let started = e.started_ms;
        let indent = match &e.delegated_by {
            Some(by) => {
                let d = depth.get(&by.run_id).copied().unwrap_or(0) + 1;
                depth.insert(e.run_id.clone(), d);
                "  ".repeat(d)
            }
            None => String::new(),
        };
        let took = match e.ended_ms {
            Some(end) => format!(
                "  ({})",
                crate::format::duration_ms((end - started).max(0) as u64)
            ),
            None => String::new(),
        };
        out.push_str(&format!(
            "{indent}+{:<8} {:<9} {:<20} {}{took}\n",
            crate::format::duration_ms((started - t0).max(0) as u64),
            e.status,
            e.node_id.as_deref().unwrap_or(""),
            e.title,
        ));
        if let Some(why) = &e.reasoning {
            out.push_str(&format!("{indent}{:>10}why: {why}\n", ""));
        }
        if let Some(err) = &e.error {
            out.push_str(&format!(
                "{indent}{:>10}{}\n",
                "",
                err.lines().next().unwrap_or("")
            ));
        }
    }
    out
}

/// The state for people: a header, then one line per node pass.
fn render_status(v: &Value) -> String {
    let mut out = String::new();
    status_header(v, &mut out);
    status_relations(v, &mut out);
    status_nodes(v, &mut out);
    out
}

/// What `cairn status` says of the run itself: its id, workflow, status,
/// times, progress, error, output and tokens.
fn status_header(v: &Value, out: &mut String) {
    let s = |k: &str| v[k].as_str().unwrap_or("").to_string();
    out.push_str(&format!("run       {}\n", s("runId")));
    out.push_str(&format!("workflow  {}\n", s("workflow")));
    if let Some(g) = v["generation"].as_u64().filter(|&g| g > 0) {
        // Reloaded (`--watch`): which definition the run uses now.
        out.push_str(&format!("reloaded  generation {g}\n"));
    }
    out.push_str(&format!("status    {}\n", s("status")));
    if let Some(start) = v["startedMs"].as_i64() {
        out.push_str(&format!("started   {}\n", datetime_ms(start)));
        if let Some(end) = v["endedMs"].as_i64() {
            out.push_str(&format!(
                "ended     {} (after {})\n",
                datetime_ms(end),
                duration_ms(end.saturating_sub(start).max(0) as u64)
            ));
        }
    }
    if let Some(p) = v["progress"].as_f64() {
        out.push_str(&format!("progress  {:.0}%\n", p * 100.0));
    }
    if let Some(r) = v["resumes"].as_u64().filter(|&r| r > 0) {
        out.push_str(&format!("resumes   {r}\n"));
    }
    if let Some(f) = v.get("forkedFrom") {
        out.push_str(&format!(
            "forked    from {} at seq {}\n",
            f["runId"].as_str().unwrap_or("?"),
            f["seq"]
        ));
    }
    if let Some(r) = v.get("openRevert") {
        out.push_str(&format!(
            "revert    of node {} to snapshot {} is half-way: `cairn revert` finishes it\n",
            r["nodeId"].as_str().unwrap_or("?"),
            r["snapshot"].as_str().unwrap_or("?")
        ));
    }
    if let Some(e) = v.get("error").filter(|e| !e.is_null()) {
        out.push_str(&format!(
            "error     {}: {}\n",
            e["kind"].as_str().unwrap_or(""),
            e["message"].as_str().unwrap_or("")
        ));
    }
    if let Some(o) = v.get("output").filter(|o| !o.is_null()) {
        out.push_str(&format!("output    {}\n", short_value(o, 200)));
    }
    let t = &v["tokens"];
    let (tin, tout) = (
        t["input"].as_u64().unwrap_or(0),
        t["output"].as_u64().unwrap_or(0),
    );
    if tin + tout > 0 {
        let cost = v["costUsd"]
            .as_f64()
            .map(|c| format!(", ${c:.4}"))
            .unwrap_or_default();
        out.push_str(&format!("tokens    {tin} in, {tout} out{cost}\n"));
    }
}

/// The questions that wait for an answer, the parent of a child run and
/// the children of a parent.
fn status_relations(v: &Value, out: &mut String) {
    let s = |k: &str| v[k].as_str().unwrap_or("").to_string();
    if let Some(qs) = v["questions"].as_object() {
        for (rid, q) in qs.iter().filter(|(_, q)| q["answer"].is_null()) {
            out.push_str(&format!(
                "question  {rid} from {}: {}\n          answer: cairn answer {} {rid} '<answer>'\n",
                q["nodeId"].as_str().unwrap_or("?"),
                short_value(&q["prompt"], 120),
                s("runId")
            ));
        }
    }
    if let Some(p) = v["parentRunId"].as_str() {
        out.push_str(&format!(
            "parent    {p} (node {})\n",
            v["parentNodeId"].as_str().unwrap_or("?")
        ));
    }
    for c in v["children"].as_array().map_or(&[][..], |c| c) {
        out.push_str(&format!(
            "child     {}  {:<16}  {} ({}) from {}\n",
            c["runId"].as_str().unwrap_or("?"),
            c["state"].as_str().or(c["status"].as_str()).unwrap_or("?"),
            c["agent"].as_str().unwrap_or("?"),
            c["workflow"].as_str().unwrap_or("?"),
            c["nodeId"].as_str().unwrap_or("?"),
        ));
    }
}

/// The table of nodes, one line each (nothing when the run has none).
fn status_nodes(v: &Value, out: &mut String) {
    let nodes = v["nodes"].as_array().cloned().unwrap_or_default();
    if nodes.is_empty() {
        return;
    }
    let label = |n: &Value| {
        let id = n["nodeId"].as_str().unwrap_or("?");
        match n["iteration"].as_u64().unwrap_or(0) {
            0 => id.to_string(),
            i => format!("{id}#{i}"),
        }
    };
    let w = nodes
        .iter()
        .map(|n| label(n).chars().count())
        .max()
        .unwrap_or(4)
        .clamp(4, 48);
    out.push('\n');
    out.push_str(&format!(
        "{:<w$}  {:<16}  {:>8}  {:>9}  OUTPUT / ERROR\n",
        "NODE", "STATUS", "ATTEMPTS", "DURATION"
    ));
    for n in &nodes {
        let line = format!(
            "{:<w$}  {:<16}  {:>8}  {:>9}  {}",
            label(n),
            n["status"].as_str().unwrap_or("?"),
            n["attempts"].as_array().map_or(0, |a| a.len()),
            node_duration(n),
            node_tail(n)
        );
        out.push_str(line.trim_end());
        out.push('\n');
    }
}

/// How long a node took: its duration, or for a node that did not
/// finish, the time its attempts took.
fn node_duration(n: &Value) -> String {
    n["durationMs"]
        .as_u64()
        .or_else(|| {
            let a = n["attempts"].as_array()?;
            let start = a.first()?["startedMs"].as_i64()?;
            let end = a.last()?["endedMs"].as_i64()?;
            Some(end.saturating_sub(start).max(0) as u64)
        })
        .map(duration_ms)
        .unwrap_or_default()
}

/// A node's last column: its error, output, reason or approval message,
/// after what its agent did.
fn node_tail(n: &Value) -> String {
    let tail = if let Some(e) = n.get("error").filter(|e| !e.is_null()) {
        format!(
            "{}: {}",
            e["kind"].as_str().unwrap_or(""),
            e["message"].as_str().unwrap_or("")
        )
    } else if let Some(o) = n.get("output").filter(|o| !o.is_null()) {
        short_value(o, 60)
    } else if let Some(r) = n["reason"].as_str() {
        r.to_string()
    } else if let Some(m) = n["approvalMessage"].as_str() {
        m.to_string()
    } else {
        String::new()
    };
    let mut tail = short_value(&Value::String(tail), 100);
    if let Some(a) = n.get("agent").filter(|a| a.is_object()) {
        let tokens =
            a["inputTokens"].as_u64().unwrap_or(0) + a["outputTokens"].as_u64().unwrap_or(0);
        let cost = a["costUsd"]
            .as_f64()
            .map(|c| format!(" ${c:.4}"))
            .unwrap_or_default();
        tail = format!(
            "[step {}, {} tool calls, {tokens} tokens{cost}] {tail}",
            a["step"].as_u64().unwrap_or(0),
            a["toolCalls"].as_u64().unwrap_or(0)
        );
    }
    tail
}

/// Reads `--type` values: event types of the contract's catalog.
fn event_types(types: &[String]) -> anyhow::Result<Vec<EventType>> {
    types
        .iter()
        .map(|t| {
            t.parse().map_err(|_| {
                bad_input(format!(
                    "--type `{t}` is not an event type (e.g. RunStarted, NodeFinished, NodeFailed, ApprovalRequested)"
                ))
            })
        })
        .collect()
}

/// Whether an event passes `--type` and `--node` (for streams that cannot
/// filter at the source).
fn selected(a: &LogsArgs, type_name: &str, node: Option<&str>) -> bool {
    (a.types.is_empty() || a.types.iter().any(|t| t == type_name))
        && a.node.as_deref().is_none_or(|n| node == Some(n))
}

/// Prints one event: its JSON text as it is, or a line for people (which
/// needs the decoded event).
fn print_event(out: &mut impl Write, json: &str, as_json: bool) -> anyhow::Result<()> {
    if as_json {
        out.write_all(json.as_bytes())?;
        out.write_all(b"\n")?;
    } else {
        let ev =
            Event::from_json(json).with_context(|| format!("cannot read this event: {json}"))?;
        writeln!(out, "{}", event_line(&ev))?;
    }
    Ok(())
}

/// `cairn logs`.
pub async fn logs(g: &Global, a: LogsArgs) -> anyhow::Result<u8> {
    let types = event_types(&a.types)?;
    if let Some(url) = g.server.clone() {
        return logs_from_server(&url, g.token.clone(), &a).await;
    }
    let (j, run) = if a.follow {
        wait_for_run(g, &a).await?
    } else {
        let j = store::open(g, false)?;
        let run = store::require_run(&j, &a.run)?.run_id;
        (j, run)
    };
    let stdout = std::io::stdout();
    if !a.follow {
        let mut q = EventQuery {
            after: a.since,
            types,
            node: a.node.clone(),
            limit: Some(5000),
        };
        let mut out = std::io::BufWriter::new(stdout.lock());
        loop {
            let page = j.backend().read_events(&run, &q)?;
            for e in &page {
                print_event(&mut out, &e.json, a.json)?;
            }
            match page.last() {
                Some(l) if page.len() == 5000 => q.after = l.seq,
                _ => break,
            }
        }
        out.flush()?;
        j.close();
        return Ok(crate::EXIT_OK);
    }
    // Follow: until the run's terminal event (a run that waits or is
    // interrupted keeps the stream open: it may be resumed).
    let mut sub = j.subscribe(&run, a.since)?;
    loop {
        match sub.next().await {
            Some(Ok(e)) => {
                if selected(&a, &e.type_name, e.node_id.as_deref()) {
                    let mut out = stdout.lock();
                    print_event(&mut out, &e.json, a.json)?;
                    out.flush()?;
                }
            }
            Some(Err(SubscribeError::Lagged { last_seq })) => {
                sub = j.subscribe(&run, last_seq)?;
            }
            Some(Err(SubscribeError::Store(e))) => return Err(e.into()),
            None => break,
        }
    }
    j.close();
    Ok(crate::EXIT_OK)
}

/// `--timeout` of `logs --follow`, checked.
fn follow_timeout(a: &LogsArgs) -> anyhow::Result<Duration> {
    cairn_workflow::parse_duration(&a.timeout).map_err(|_| {
        bad_input(format!(
            "--timeout `{}`: write a duration, e.g. 30s or 5m",
            a.timeout
        ))
    })
}

/// Polls until `ready` finds the run, saying once on stderr that it waits;
/// bad input when `--timeout` passes first.
async fn poll_for_run<T, F, Fut>(a: &LogsArgs, mut ready: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Option<T>>>,
{
    let timeout = follow_timeout(a)?;
    let deadline = tokio::time::Instant::now() + timeout;
    let mut said = false;
    loop {
        if let Some(found) = ready().await? {
            return Ok(found);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(bad_input(format!(
                "no run `{}` started within {} (--timeout)",
                a.run, a.timeout
            )));
        }
        if !said {
            eprintln!(
                "waiting for run `{}` to start (--timeout {})…",
                a.run, a.timeout
            );
            said = true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The store and the run to follow, once the run exists: `logs --follow`
/// started before the run (in a script, beside the `cairn run` that makes
/// it) waits for it instead of failing.
async fn wait_for_run(g: &Global, a: &LogsArgs) -> anyhow::Result<(Journal, cairn_events::RunId)> {
    let id = store::run_id(&a.run)?;
    poll_for_run(a, || {
        let id = id.clone();
        async move {
            if !g.store_exists() {
                return Ok(None);
            }
            let j = store::open(g, false)?;
            match j.backend().get_run(&id)? {
                Some(rec) => Ok(Some((j, rec.run_id))),
                None => {
                    j.close();
                    Ok(None)
                }
            }
        }
    })
    .await
}

async fn logs_from_server(url: &str, token: Option<String>, a: &LogsArgs) -> anyhow::Result<u8> {
    let client = cairn_client::Client::new(url, token).map_err(|e| bad_input(e.to_string()))?;
    let run = store::run_id(&a.run)?;
    let stdout = std::io::stdout();
    if a.follow {
        poll_for_run(a, || async {
            match client.run(&run).await {
                Ok(_) => Ok(Some(())),
                Err(ClientError::Status { status: 404, .. }) => Ok(None),
                Err(e) => Err(client_error(e)),
            }
        })
        .await?;
        let mut stream = client
            .events(&run, a.since, false)
            .await
            .map_err(client_error)?;
        while let Some(line) = stream.next_event().await {
            let line = line.map_err(client_error)?;
            let v: Value = serde_json::from_str(&line)
                .with_context(|| format!("the server sent an invalid event: {line}"))?;
            if selected(a, v["type"].as_str().unwrap_or(""), v["nodeId"].as_str()) {
                let mut out = stdout.lock();
                print_event(&mut out, &line, a.json)?;
                out.flush()?;
            }
        }
        return Ok(crate::EXIT_OK);
    }
    let mut q = EventsQuery {
        after: a.since,
        types: a.types.clone(),
        node: a.node.clone(),
        limit: Some(5000),
    };
    loop {
        let page = client.events_page(&run, &q).await.map_err(client_error)?;
        let mut out = stdout.lock();
        for e in &page.events {
            // The store's text, as the server sent it.
            print_event(&mut out, e.get(), a.json)?;
        }
        out.flush()?;
        match page.next_after {
            Some(n) => q.after = n,
            None => break,
        }
    }
    Ok(crate::EXIT_OK)
}

fn count_nodes(nodes: &[cairn_workflow::NodeSpec]) -> usize {
    nodes
        .iter()
        .map(|n| 1 + n.kind.children().map_or(0, count_nodes))
        .sum()
}

/// `cairn validate`.
pub fn validate(a: FileArgs) -> anyhow::Result<u8> {
    if !a.file.is_file() {
        return Err(bad_input(format!(
            "{}: no such workflow file",
            a.file.display()
        )));
    }
    match cairn_workflow::load_tree(&a.file) {
        Ok(wf) => {
            let children = wf.child_paths().len();
            let also = match children {
                0 => String::new(),
                1 => ", 1 child workflow".to_string(),
                n => format!(", {n} child workflows"),
            };
            if a.json {
                let v = serde_json::json!({
                    "ok": true,
                    "workflow": wf.name,
                    "nodes": count_nodes(&wf.nodes),
                    "childWorkflows": children,
                });
                println!("{v}");
            } else {
                println!("ok: {} ({} nodes{also})", wf.name, count_nodes(&wf.nodes));
            }
            Ok(crate::EXIT_OK)
        }
        Err(e) => {
            if a.json {
                let problems: Vec<Value> = e.problems.iter().map(|p| p.to_json()).collect();
                println!(
                    "{}",
                    serde_json::json!({ "ok": false, "problems": problems })
                );
            } else {
                for p in &e.problems {
                    eprintln!("error: {p}");
                }
            }
            Ok(crate::EXIT_BAD_INPUT)
        }
    }
}

/// `cairn graph`.
pub fn graph(a: FileArgs) -> anyhow::Result<u8> {
    if a.json {
        return Err(bad_input(
            "`cairn graph` prints Mermaid; --json is `validate`'s",
        ));
    }
    if !a.file.is_file() {
        return Err(bad_input(format!(
            "{}: no such workflow file",
            a.file.display()
        )));
    }
    let wf = cairn_workflow::load(&a.file)?;
    print!("{}", wf.mermaid());
    Ok(crate::EXIT_OK)
}

/// `cairn export`.
pub fn export(g: &Global, a: ExportArgs) -> anyhow::Result<u8> {
    let j = store::open(g, false)?;
    let run = store::require_run(&j, &a.run)?.run_id;
    let path = j.export(&run, &g.log_dir())?;
    j.close();
    println!("{}", path.display());
    Ok(crate::EXIT_OK)
}

/// Parses `--older-than`: an integer and one of s, m, h, d, w.
pub fn parse_age(s: &str) -> anyhow::Result<Duration> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let bad = || {
        bad_input(format!(
            "--older-than `{s}`: write an integer and a unit: 30m, 12h, 7d, 2w"
        ))
    };
    let n: u64 = num.parse().map_err(|_| bad())?;
    let secs = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3_600,
        "d" => 86_400,
        "w" => 604_800,
        _ => return Err(bad()),
    };
    n.checked_mul(secs).map(Duration::from_secs).ok_or_else(bad)
}

/// `cairn gc`.
pub async fn gc(g: &Global, a: GcArgs) -> anyhow::Result<u8> {
    let age = parse_age(&a.older_than)?;
    let grace = parse_age(&a.snapshot_grace).map_err(|_| {
        bad_input(format!(
            "--snapshot-grace `{}`: write an integer and a unit: 0s, 30m, 1h",
            a.snapshot_grace
        ))
    })?;
    if !g.store_exists() {
        println!("deleted 0 runs");
        return Ok(crate::EXIT_OK);
    }
    let j = store::open(g, false)?;
    let cutoff = crate::display::now_ms().saturating_sub(age.as_millis() as i64);
    let deleted = j.backend().delete_finished_before(cutoff)?;
    // The workspace snapshots no run names any more go with them (what
    // was used in the last hour stays: a snapshot under way in another
    // process is named only once it is taken).
    let engine = cairn_engine::Engine::new(
        j.clone(),
        cairn_engine::EngineOptions {
            snapshot_dir: store::snapshot_dir(g),
            ..Default::default()
        },
    );
    let pruned = engine.prune_snapshots(grace).await?;
    j.close();
    let log_dir = g.log_dir();
    for id in &deleted {
        // Ids were validated as file names when the runs were created.
        let dir = log_dir.join(id.as_str());
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => eprintln!("warning: {}: {e}", dir.display()),
        }
        println!("deleted {id}");
    }
    println!(
        "deleted {} run{}",
        deleted.len(),
        if deleted.len() == 1 { "" } else { "s" }
    );
    let pruned = pruned.unwrap_or_default();
    for (p, where_) in [(Some(pruned.local), ""), (pruned.shared, " from the store")] {
        if let Some(p) = p.filter(|p| p.objects > 0) {
            println!(
                "deleted {} workspace snapshot object{}{where_} ({:.1} MiB) no run names",
                p.objects,
                if p.objects == 1 { "" } else { "s" },
                p.bytes as f64 / (1024.0 * 1024.0)
            );
        }
    }
    Ok(crate::EXIT_OK)
}

/// A timeout flag's duration, above zero; bad input naming `flag` and
/// `examples` otherwise.
fn timeout_flag(flag: &str, text: &str, examples: &str) -> anyhow::Result<std::time::Duration> {
    cairn_workflow::parse_duration(text)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| {
            bad_input(format!(
                "{flag} `{text}`: write a duration above zero, e.g. {examples}"
            ))
        })
}

/// `cairn serve`.
pub async fn serve(g: &Global, a: ServeArgs) -> anyhow::Result<u8> {
    // Each run holds a few descriptors: the default soft limit (often
    // 1,024) would stop a busy server long before the machine's does.
    match cairn_server::descriptors::raise_limit() {
        Ok(l) => eprintln!("cairn serve: {l}"),
        Err(e) => eprintln!("cairn serve: file descriptors: the limit cannot be raised: {e}"),
    }
    let addr = a.addr.parse().map_err(|e| {
        bad_input(format!(
            "--addr `{}`: {e} (write HOST:PORT, e.g. 127.0.0.1:7700)",
            a.addr
        ))
    })?;
    if let Some(d) = &a.workflows {
        if !d.is_dir() {
            return Err(bad_input(format!(
                "--workflows {}: not a folder",
                d.display()
            )));
        }
    }
    let header_read_timeout =
        timeout_flag("--header-timeout", &a.header_timeout, "500ms, 10s, 1m")?;
    let body_read_timeout = timeout_flag("--body-timeout", &a.body_timeout, "5s, 30s, 2m")?;
    let checked = cairn_server::ServeConfig {
        addr,
        allowed_hosts: a.allow_hosts.clone(),
        allowed_origins: a.allow_origins.clone(),
        ..Default::default()
    };
    if let Err(e) = checked.validate() {
        return Err(bad_input(format!("cairn serve: {e}")));
    }
    let triggers = match &a.triggers {
        Some(path) => {
            let t = cairn_workflow::load_triggers(path)
                .map_err(|e| bad_input(format!("cairn serve: --triggers: {e}")))?;
            check_trigger_workflows(&t, a.workflows.as_deref(), a.max_workflow_bytes)?;
            t
        }
        None => Default::default(),
    };
    let triggers_dir = a
        .triggers
        .as_deref()
        .and_then(|p| p.parent())
        .filter(|p| !p.as_os_str().is_empty())
        .map_or_else(|| std::path::PathBuf::from("."), std::path::PathBuf::from);
    let otlp = crate::trace::otlp_client()?;
    let journal = store::open(g, true)?;
    // Every run the server drives has its trace exported when its driver
    // stops (docs/otel.md); failures are said as they come.
    let telemetry = crate::trace::Telemetry::start(
        otlp,
        &journal,
        crate::trace::Report::AsTheyCome("cairn serve"),
    );
    // A server drives the runs it is sent commands for, so a decision sent
    // to a run that waited while no server ran takes effect.
    let engine = cairn_server::Engine::new(
        journal.clone(),
        cairn_server::EngineOptions {
            adopt_idle_runs: true,
            on_run_stopped: telemetry.hook(),
            watch: a.watch,
            // Load comes in waves; what a wave freed goes back between them.
            release_memory_when_idle: true,
            snapshot_dir: store::snapshot_dir(g),
            // On a shared store, runs started through any instance (and
            // their children) are queued for the fleet to claim.
            queue: true,
            ..Default::default()
        },
    );
    let cfg = cairn_server::ServeConfig {
        addr,
        token: a.token.filter(|t| !t.is_empty()),
        workflows_dir: a.workflows.clone(),
        max_workflow_bytes: a.max_workflow_bytes,
        allowed_hosts: a.allow_hosts,
        allowed_origins: a.allow_origins,
        max_connections: a.max_connections as usize,
        max_connections_per_client: a.max_connections_per_client.map(|n| n as usize),
        header_read_timeout,
        body_read_timeout,
        // Servers that share a PostgreSQL store take over each other's runs
        // once a dead one's leases expire; a few looks per lease.
        takeover: g
            .store
            .is_postgres()
            .then(|| store::lease_ttl(g).map(|ttl| ttl / 2))
            .transpose()?,
        instance: crate::store::instance_name(g)?
            .unwrap_or_else(cairn_store::default_instance_name),
        worker: a.worker,
        max_runs: a
            .max_runs
            .map_or_else(cairn_server::default_max_runs, |n| n as usize),
        triggers,
        triggers_dir,
        ..Default::default()
    };
    let shutdown = async {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).ok();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = async { match term.as_mut() { Some(s) => { s.recv().await; } None => std::future::pending::<()>().await } } => {}
        }
        eprintln!("cairn serve: stopping");
    };
    let r = cairn_server::serve(cfg, engine, shutdown).await;
    journal.close();
    telemetry.finish().await;
    r?;
    Ok(crate::EXIT_OK)
}

/// Every workflow a triggers file names loads from the workflows folder:
/// a schedule or hook that could never start its run is refused now.
fn check_trigger_workflows(
    t: &cairn_workflow::triggers::Triggers,
    dir: Option<&std::path::Path>,
    max_bytes: u64,
) -> anyhow::Result<()> {
    let names = t
        .schedules
        .iter()
        .map(|s| (format!("schedule `{}`", s.name), &s.workflow))
        .chain(
            t.hooks
                .iter()
                .map(|h| (format!("hook `{}`", h.name), &h.workflow)),
        );
    for (what, wf) in names {
        let Some(dir) = dir else {
            return Err(bad_input(format!(
                "cairn serve: --triggers: {what} names workflow `{wf}`, but there is no --workflows folder"
            )));
        };
        cairn_server::load_workflow(dir, wf, max_bytes)
            .map_err(|e| bad_input(format!("cairn serve: --triggers: {what}: {e}")))?;
    }
    Ok(())
}
