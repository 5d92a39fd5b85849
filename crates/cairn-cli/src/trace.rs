//! OpenTelemetry: the exporter that commands driving runs carry (each run's
//! trace is sent when a driver stops driving it), and `cairn trace`.

use std::io::Write;
use std::sync::{Arc, Mutex};

use cairn_client::{Client, ClientError, EventsQuery, RunsQuery};
use cairn_events::{Event, RunId};
use cairn_otel::proto::trace::v1::Span;
use cairn_otel::{OtlpClient, OtlpConfig, RunReader, TraceExporter};
use cairn_store::{EventQuery, Journal, StoredEvent};
use tokio::sync::mpsc;

use crate::cli::{Global, TraceArgs};
use crate::remote::client_error;
use crate::{bad_input, store};

/// Failures kept for the end of a command, at most.
const KEPT_FAILURES: usize = 10;

/// The OTLP client the environment asks for (`OTEL_*`), or `None` when
/// exporting is off. A setting Cairn cannot use is bad input, reported
/// before anything runs.
pub fn otlp_client() -> anyhow::Result<Option<OtlpClient>> {
    let Some(cfg) = OtlpConfig::from_env().map_err(|e| bad_input(e.to_string()))? else {
        return Ok(None);
    };
    Ok(Some(
        OtlpClient::new(cfg).map_err(|e| bad_input(e.to_string()))?,
    ))
}

/// When a failed export is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Report {
    /// After the command's own output (`run`, `resume`, ...): a warning in
    /// the middle of the progress display would garble it.
    AtEnd,
    /// At once, on stderr, prefixed (`cairn serve`, which runs for days).
    AsTheyCome(&'static str),
}

/// A command's exporter of traces, off when the environment sets none.
pub struct Telemetry {
    exporter: Option<TraceExporter>,
    failures: Arc<Mutex<Vec<String>>>,
}

impl Telemetry {
    /// Starts exporting through `client`, reading runs from `journal`'s
    /// store; does nothing without a client.
    pub fn start(client: Option<OtlpClient>, journal: &Journal, report: Report) -> Telemetry {
        let failures = Arc::new(Mutex::new(Vec::new()));
        let exporter = client.map(|client| {
            let kept = failures.clone();
            let on_error: cairn_otel::ErrorHook = Arc::new(move |run: &str, e| {
                let line = format!("the trace of run {run} was not exported: {e}");
                match report {
                    Report::AsTheyCome(who) => eprintln!("{who}: {line}"),
                    Report::AtEnd => {
                        let mut kept = kept.lock().unwrap_or_else(|p| p.into_inner());
                        if kept.len() < KEPT_FAILURES {
                            kept.push(line);
                        }
                    }
                }
            });
            TraceExporter::start(client, journal.backend().clone(), Some(on_error))
        });
        Telemetry { exporter, failures }
    }

    /// What the engine calls when one of its drivers stops driving a run.
    pub fn hook(&self) -> Option<cairn_engine::RunStopped> {
        let exporter = self.exporter.clone()?;
        Some(Arc::new(
            move |run: &RunId, _: &cairn_engine::RunOutcome| exporter.run_stopped(run),
        ))
    }

    /// Waits for the queued exports, at most the export timeout, then says
    /// on stderr what failed. Never fails the command.
    pub async fn finish(&self) {
        let Some(exporter) = &self.exporter else {
            return;
        };
        let limit = exporter.timeout();
        if !exporter.flush(limit).await {
            eprintln!(
                "warning: trace export did not finish within {} ms (OTEL_EXPORTER_OTLP_TIMEOUT); `cairn trace <run>` sends a run's trace again",
                limit.as_millis()
            );
        }
        let failures =
            std::mem::take(&mut *self.failures.lock().unwrap_or_else(|p| p.into_inner()));
        for f in failures {
            eprintln!("warning: {f}");
        }
    }
}

/// `cairn trace`: one run's trace, with its child runs', sent to the
/// OTLP endpoint or printed as OTLP JSON.
pub async fn trace(g: &Global, a: TraceArgs) -> anyhow::Result<u8> {
    let run = store::run_id(&a.run)?;
    let (client, resource) = exporter(&a)?;
    let journal = store::open(g, false)?;
    store::require_run(&journal, &a.run)?;
    let backend = journal.backend().clone();
    let sent = send_tree(client, resource, move |each| {
        Ok(cairn_otel::visit_tree(backend.as_ref(), &run, each)?)
    })
    .await;
    journal.close();
    sent
}

/// `cairn trace` through a server: the same spans, with the same ids, built
/// here from the run's events and child runs read over the API.
pub async fn trace_remote(url: &str, g: &Global, a: TraceArgs) -> anyhow::Result<u8> {
    let run = store::run_id(&a.run)?;
    let (client, resource) = exporter(&a)?;
    let reader = ServerReader {
        client: crate::remote::client(url, g)?,
        rt: tokio::runtime::Handle::current(),
    };
    send_tree(client, resource, move |each| {
        cairn_otel::visit_tree(&reader, &run, each)
    })
    .await
}

/// The resource's attributes every span is sent with.
type Resource = Vec<(String, String)>;

/// Where the spans go: the OTLP endpoint of the environment, or (with
/// `--print`) standard output with the environment's resource.
fn exporter(a: &TraceArgs) -> anyhow::Result<(Option<OtlpClient>, Resource)> {
    let client = if a.print {
        None
    } else {
        Some(otlp_client()?.ok_or_else(|| {
            bad_input(
                "no OTLP endpoint: set OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT), or print the spans with --print",
            )
        })?)
    };
    let resource = match &client {
        Some(c) => c.config().resource.clone(),
        None => cairn_otel::resource_from_env().map_err(|e| bad_input(e.to_string()))?,
    };
    Ok((client, resource))
}

/// Reads the tree on the blocking pool (`read` hands each run's spans to
/// the function it is given), one run at a time, while the run before is
/// sent: a large tree is never held whole.
async fn send_tree(
    client: Option<OtlpClient>,
    resource: Resource,
    read: impl FnOnce(&mut dyn FnMut(Vec<Span>) -> bool) -> anyhow::Result<usize> + Send + 'static,
) -> anyhow::Result<u8> {
    let (tx, mut rx) = mpsc::channel(2);
    let reader =
        tokio::task::spawn_blocking(move || read(&mut |spans| tx.blocking_send(spans).is_ok()));
    let mut spans_sent = 0usize;
    let mut failed = None;
    let mut out = std::io::stdout().lock();
    while let Some(spans) = rx.recv().await {
        let n = spans.len();
        match &client {
            None => {
                for request in cairn_otel::requests(&resource, spans) {
                    writeln!(out, "{}", cairn_otel::to_json(&request)?)?;
                }
            }
            Some(c) => {
                if let Err(e) = c.export(spans).await {
                    failed = Some(e);
                    break;
                }
            }
        }
        spans_sent += n;
    }
    out.flush()?;
    drop(rx);
    let runs = reader.await??;
    if let Some(e) = failed {
        return Err(e.into());
    }
    if let Some(c) = &client {
        eprintln!(
            "exported {spans_sent} spans of {runs} run{} to {}",
            if runs == 1 { "" } else { "s" },
            c.config().endpoint
        );
    }
    Ok(crate::EXIT_OK)
}

/// A server's runs, read for spans: each read waits on the API from the
/// blocking pool, where the tree is read.
struct ServerReader {
    client: Client,
    rt: tokio::runtime::Handle,
}

/// Runs asked for at a time when listing a run's children.
const CHILDREN_PAGE: usize = 1000;

impl RunReader for ServerReader {
    type Error = anyhow::Error;

    fn run_parent(&self, run_id: &RunId) -> anyhow::Result<Option<Option<RunId>>> {
        match self.rt.block_on(self.client.run(run_id)) {
            Ok(detail) => {
                let parent = detail
                    .as_value()
                    .get("parentRunId")
                    .and_then(|p| p.as_str())
                    .and_then(|p| RunId::parse(p).ok());
                Ok(Some(parent))
            }
            Err(ClientError::Status { status: 404, .. }) => Ok(None),
            Err(e) => Err(client_error(e)),
        }
    }

    fn read_events(&self, run_id: &RunId, q: &EventQuery) -> anyhow::Result<Vec<StoredEvent>> {
        let query = EventsQuery {
            after: q.after,
            types: q.types.iter().map(|t| t.as_str().to_string()).collect(),
            node: q.node.clone(),
            limit: q.limit,
        };
        let page = self
            .rt
            .block_on(self.client.events_page(run_id, &query))
            .map_err(client_error)?;
        page.events
            .iter()
            .map(|raw| {
                let text = raw.get();
                let ev = Event::from_json(text).map_err(|e| {
                    anyhow::anyhow!("the server sent an event Cairn cannot read ({e}): {text}")
                })?;
                Ok(StoredEvent {
                    run_id: ev.run_id.clone(),
                    seq: ev.seq.get(),
                    type_name: ev.type_name().to_string(),
                    node_id: ev.scope.node_id.clone(),
                    timestamp_ms: ev.timestamp_ms,
                    json: text.into(),
                })
            })
            .collect()
    }

    fn children(&self, run_id: &RunId) -> anyhow::Result<Vec<RunId>> {
        let mut out = Vec::new();
        loop {
            let q = RunsQuery {
                parent: Some(run_id.clone()),
                limit: Some(CHILDREN_PAGE),
                offset: Some(out.len()),
                ..Default::default()
            };
            let page = self
                .rt
                .block_on(self.client.runs(&q))
                .map_err(client_error)?;
            let n = page.runs.len();
            out.extend(page.runs.into_iter().map(|r| r.run_id));
            if n < CHILDREN_PAGE || out.len() >= cairn_otel::MAX_TREE_RUNS {
                return Ok(out);
            }
        }
    }
}
