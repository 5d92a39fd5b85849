//! How `cairn replay` tells where a replay and its original part, and
//! bundles written and read (`cairn export --bundle`).

use std::path::{Path, PathBuf};

use cairn_engine::replay::report::{Divergence, Report, RequestDiff};
use cairn_engine::Engine;
use cairn_events::RunId;
use serde_json::Value;

use crate::cli::{ExportArgs, Global};
use crate::{bad_input, store};

/// `cairn export --bundle`: the run in one file.
pub async fn export_bundle(g: &Global, a: ExportArgs) -> anyhow::Result<u8> {
    let (engine, _telemetry) = store::driving_engine(g, false)?;
    let run = store::require_run(engine.journal(), &a.run)?.run_id;
    let path = a
        .out
        .unwrap_or_else(|| PathBuf::from(format!("{run}.bundle")));
    let to_stdout = path.as_os_str() == "-";
    let out: Box<dyn std::io::Write + Send> = if to_stdout {
        Box::new(std::io::BufWriter::new(std::io::stdout()))
    } else {
        // Written beside, then renamed: a bundle is whole or not there.
        let tmp = path.with_extension("bundle.partial");
        let file = std::fs::File::create(&tmp)
            .map_err(|e| bad_input(format!("{}: {e}", tmp.display())))?;
        Box::new(std::io::BufWriter::new(file))
    };
    let done = engine.export_bundle(&run, out).await?;
    if !to_stdout {
        std::fs::rename(path.with_extension("bundle.partial"), &path)?;
        eprintln!(
            "{}: run {run} ({} run{}, {} events, {} tool calls, {} snapshot objects)",
            path.display(),
            done.runs,
            if done.runs == 1 { "" } else { "s" },
            done.events,
            done.tool_calls,
            done.objects
        );
    }
    Ok(crate::EXIT_OK)
}

/// The bundle file `arg` names, if it names a file (a run id never
/// holds a `/` or a `.`, and is no file here).
pub fn bundle_path(arg: &str) -> Option<PathBuf> {
    let p = Path::new(arg);
    p.is_file().then(|| p.to_path_buf())
}

/// Reads the bundle at `path` into the engine's store (a bundle read
/// before is taken as read); the id of its run.
pub async fn import(engine: &Engine, path: &Path) -> anyhow::Result<RunId> {
    let file =
        std::fs::File::open(path).map_err(|e| bad_input(format!("{}: {e}", path.display())))?;
    let imported = engine
        .import_bundle(Box::new(std::io::BufReader::new(file)))
        .await
        .map_err(|e| bad_input(format!("{}: {e}", path.display())))?;
    Ok(imported.run_id)
}

/// Prints the report: one JSON object with `--json`, else a few lines.
pub fn print(r: &Report, json: bool) {
    if json {
        println!("{}", serde_json::to_string(r).expect("a report serializes"));
        return;
    }
    println!(
        "replay {} of run {}: {} model step{} answered from the record, {} new",
        r.replay,
        r.original,
        r.steps_replayed,
        if r.steps_replayed == 1 { "" } else { "s" },
        r.steps_new
    );
    match &r.divergence {
        None => println!("no divergence: the replay asked nothing the original did not"),
        Some(d) => print_divergence(d, r.stopped),
    }
    print_nodes(r);
    if r.same_output {
        println!("output: the same as the original's");
    } else {
        println!("output differs:");
        println!("  original: {}", short(r.output.original.as_ref()));
        println!("  replay:   {}", short(r.output.replay.as_ref()));
    }
}

/// The exit code of `cairn replay`: 6 when the replay stopped at a
/// divergence, else the run's own.
pub fn exit_code(r: &Report, run_code: u8) -> u8 {
    if r.stopped {
        crate::EXIT_DIVERGED
    } else {
        run_code
    }
}

fn print_divergence(d: &Divergence, stopped: bool) {
    let at = match (d.iteration, d.step) {
        (0, Some(s)) => format!("node `{}` step {s}", d.node_id),
        (i, Some(s)) => format!("node `{}` (pass {i}) step {s}", d.node_id),
        (0, None) => format!("node `{}`", d.node_id),
        (i, None) => format!("node `{}` (pass {i})", d.node_id),
    };
    println!(
        "diverged at {at} ({}): {}{}",
        d.kind,
        d.message,
        if stopped {
            "; the replay stopped there"
        } else {
            ""
        }
    );
    if let Some(req) = &d.request {
        print_request(req);
    }
}

fn print_request(req: &RequestDiff) {
    if !req.original_found {
        println!("  the original made no request at that place (it had answered already)");
    }
    if let Some(s) = &req.system {
        println!("  system prompt:");
        println!(
            "{}",
            indent(&cairn_engine::replay::report::line_diff(
                s.original.as_deref().unwrap_or(""),
                s.replay.as_deref().unwrap_or("")
            ))
        );
    }
    for m in &req.messages {
        let role = m
            .role
            .replay
            .as_deref()
            .or(m.role.original.as_deref())
            .unwrap_or("message");
        let note = match (&m.text.original, &m.text.replay) {
            (None, Some(_)) => " (the replay's only)",
            (Some(_), None) => " (the original's only)",
            _ => "",
        };
        println!("  message {} ({role}){note}:", m.index);
        print!("{}", indent(&m.diff));
    }
    let list = |what: &str, names: &[String]| {
        if !names.is_empty() {
            println!("  tools {what}: {}", names.join(", "));
        }
    };
    list("added", &req.tools_added);
    list("removed", &req.tools_removed);
    list("changed (description or parameters)", &req.tools_changed);
}

fn print_nodes(r: &Report) {
    if r.nodes.is_empty() {
        return;
    }
    let name = |n: &cairn_engine::replay::report::NodeCompared| match n.iteration {
        0 => n.node_id.clone(),
        i => format!("{}[{i}]", n.node_id),
    };
    let width = r
        .nodes
        .iter()
        .map(|n| name(n).len())
        .max()
        .unwrap_or(4)
        .max(4);
    println!("{:width$}  {:<40}  {:<40}", "node", "original", "replay");
    for n in &r.nodes {
        let side = |status: &str, out: Option<&Value>, err: Option<&Value>| {
            let detail = match (out, err) {
                (_, Some(e)) => e
                    .get("kind")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
                (Some(o), None) => short(Some(o)),
                (None, None) => String::new(),
            };
            cut(&format!("{status} {detail}"), 40)
        };
        println!(
            "{:width$}  {:<40}  {:<40}{}",
            name(n),
            side(
                &n.status.original,
                n.output.original.as_ref(),
                n.error.original.as_ref()
            ),
            side(
                &n.status.replay,
                n.output.replay.as_ref(),
                n.error.replay.as_ref()
            ),
            if n.same { "" } else { "  differs" }
        );
    }
}

fn short(v: Option<&Value>) -> String {
    match v {
        None => "(none)".into(),
        Some(v) => cut(&v.to_string(), 200),
    }
}

fn cut(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let mut out: String = s.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

fn indent(text: &str) -> String {
    text.lines().map(|l| format!("    {l}\n")).collect()
}
