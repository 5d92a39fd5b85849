//! Cairn's MCP client: one connection to one MCP server of a workflow.
//!
//! A stdio server is a program Cairn starts itself, as it starts every
//! process ([`cairn_tools::process::spawn_service`]: the workflow's sandbox,
//! its network setting with the filtering proxy for a host list, a process
//! group of its own, death with the engine); rmcp speaks the protocol over
//! its pipes. A streamable HTTP server is reached at its URL
//! with headers whose values the caller read from the environment. Either
//! way the connection lists every tool (all pages) once, and calls them with
//! a time limit and Cairn's idempotency key in the request's `_meta`.
//!
//! What a tool's annotations say becomes Cairn's flags: `readOnlyHint`
//! means no side effect, `idempotentHint` means safe to repeat; a tool that
//! says nothing is treated as side-effecting and not idempotent.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use cairn_tools::process::{spawn_service, ProcessSpec, Service};

use rmcp::model::{CallToolRequestParams, ContentBlock, MetaObject, RequestMetaObject};
use rmcp::service::RunningService;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};

/// How long a server may take to start and answer the handshake and the
/// tool listing.
pub const START_TIMEOUT: Duration = Duration::from_secs(60);

/// Longest stderr line passed on; the rest of a longer line is dropped.
const MAX_STDERR_LINE: usize = 4096;

/// Stderr lines passed on per server; a server that writes more is read
/// and ignored, so it never blocks on a full pipe.
const MAX_STDERR_LINES: usize = 1000;

/// Longest tool description and schema kept (bytes of JSON): a hostile
/// server must not fill every request to the model.
const MAX_TOOL_DEF_BYTES: usize = 64 * 1024;

/// Most tools kept of one server.
pub const MAX_TOOLS: usize = 1000;

/// Why a server cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum McpError {
    /// The server could not be started or connected to.
    #[error("{0}")]
    Start(String),
    /// The server broke the protocol, closed, or did not answer in time.
    #[error("{0}")]
    Protocol(String),
}

/// A tool of a server, as Cairn uses it.
#[derive(Debug, Clone, PartialEq)]
pub struct McpTool {
    /// Its name on the server.
    pub name: String,
    /// What the server says it does.
    pub description: String,
    /// JSON Schema of its arguments (an object schema).
    pub input_schema: Value,
    /// `readOnlyHint`: calling it changes nothing.
    pub read_only: bool,
    /// `idempotentHint`: calling it again with the same arguments is harmless.
    pub idempotent: bool,
}

/// A connected server and the tools it offers.
pub struct Connection {
    service: RunningService<RoleClient, ()>,
    child: Option<Service>,
    tools: Vec<McpTool>,
    start: Duration,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("tools", &self.tools.len())
            .field("pid", &self.child.as_ref().map(Service::pid))
            .finish()
    }
}

impl Connection {
    /// Starts a stdio server (`spec`: its argv, folder, environment and
    /// sandbox, as every process of Cairn is started) and connects to it.
    /// `on_stderr` gets its stderr, a line at a time (bounded).
    pub async fn stdio(
        spec: ProcessSpec,
        on_stderr: impl Fn(&str) + Send + Sync + 'static,
    ) -> Result<Connection, McpError> {
        let t0 = Instant::now();
        let program = spec.argv.first().cloned().unwrap_or_default();
        let mut service = spawn_service(spec)
            .map_err(|e| McpError::Start(format!("cannot start `{program}`: {e}")))?;
        let child = service.child_mut();
        let (Some(stdout), Some(stdin)) = (child.stdout.take(), child.stdin.take()) else {
            return Err(McpError::Start("the server's pipes are missing".into()));
        };
        if let Some(stderr) = child.stderr.take() {
            tokio::spawn(async move {
                let mut lines = BufReader::new(stderr);
                let mut buf = Vec::new();
                let mut passed = 0;
                loop {
                    buf.clear();
                    match lines.read_until(b'\n', &mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {}
                    }
                    if passed >= MAX_STDERR_LINES {
                        continue;
                    }
                    passed += 1;
                    let end = buf.len().min(MAX_STDERR_LINE);
                    let line = String::from_utf8_lossy(&buf[..end]);
                    let line = line.trim_end();
                    if !line.is_empty() {
                        on_stderr(line);
                    }
                    if passed == MAX_STDERR_LINES {
                        on_stderr("(further stderr of this server is not kept)");
                    }
                }
            });
        }
        let service_rpc = match tokio::time::timeout(START_TIMEOUT, ().serve((stdout, stdin))).await
        {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                return Err(McpError::Start(format!(
                    "`{program}` did not complete the MCP handshake: {e}"
                )))
            }
            Err(_) => {
                return Err(McpError::Start(format!(
                    "`{program}` did not complete the MCP handshake within {}s",
                    START_TIMEOUT.as_secs()
                )))
            }
        };
        Self::ready(service_rpc, Some(service), t0).await
    }

    /// Connects to a streamable HTTP server at `url`, sending `headers`
    /// with every request.
    pub async fn http(url: &str, headers: &[(String, String)]) -> Result<Connection, McpError> {
        use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
        use rmcp::transport::StreamableHttpClientTransport;
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            let _ = rustls::crypto::ring::default_provider().install_default();
        });
        let t0 = Instant::now();
        let mut custom = HashMap::new();
        for (k, v) in headers {
            let name = http::HeaderName::from_bytes(k.as_bytes())
                .map_err(|_| McpError::Start(format!("`{k}` is not a valid header name")))?;
            let mut value = http::HeaderValue::from_str(v).map_err(|_| {
                McpError::Start(format!(
                    "the value of header `{k}` is not a valid header value"
                ))
            })?;
            value.set_sensitive(true);
            custom.insert(name, value);
        }
        let mut config = StreamableHttpClientTransportConfig::with_uri(url.to_string());
        config.custom_headers = custom;
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| McpError::Start(format!("HTTP client: {e}")))?;
        let transport = StreamableHttpClientTransport::with_client(client, config);
        let service = match tokio::time::timeout(START_TIMEOUT, ().serve(transport)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                return Err(McpError::Start(format!(
                    "cannot connect to the MCP server at {url}: {e}"
                )))
            }
            Err(_) => {
                return Err(McpError::Start(format!(
                    "the MCP server at {url} did not answer within {}s",
                    START_TIMEOUT.as_secs()
                )))
            }
        };
        Self::ready(service, None, t0).await
    }

    /// Lists the tools (every page) of a connected server.
    async fn ready(
        service: RunningService<RoleClient, ()>,
        child: Option<Service>,
        t0: Instant,
    ) -> Result<Connection, McpError> {
        let listed = tokio::time::timeout(START_TIMEOUT, service.list_all_tools())
            .await
            .map_err(|_| McpError::Protocol("listing the tools timed out".into()))?
            .map_err(|e| McpError::Protocol(format!("cannot list the tools: {e}")))?;
        let mut tools = Vec::new();
        for t in listed.into_iter().take(MAX_TOOLS) {
            let annotations = t.annotations.clone().unwrap_or_default();
            let mut description = t.description.as_deref().unwrap_or("").to_string();
            if description.len() > MAX_TOOL_DEF_BYTES {
                let mut end = MAX_TOOL_DEF_BYTES;
                while !description.is_char_boundary(end) {
                    end -= 1;
                }
                description.truncate(end);
            }
            let schema = Value::Object((*t.input_schema).clone());
            let input_schema = if schema.to_string().len() > MAX_TOOL_DEF_BYTES {
                json!({"type": "object"})
            } else {
                schema
            };
            let read_only = annotations.read_only_hint == Some(true);
            tools.push(McpTool {
                name: t.name.to_string(),
                description,
                input_schema,
                read_only,
                idempotent: read_only || annotations.idempotent_hint == Some(true),
            });
        }
        Ok(Connection {
            service,
            child,
            tools,
            start: t0.elapsed(),
        })
    }

    /// The server's tools, in the order it listed them.
    pub fn tools(&self) -> &[McpTool] {
        &self.tools
    }

    /// How long starting and listing took.
    pub fn start_time(&self) -> Duration {
        self.start
    }

    /// The process id of a stdio server.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Service::pid)
    }

    /// Calls `tool` with `args` (a JSON object), sending `key` as
    /// `_meta["cairn/idempotencyKey"]`. The inner error is the tool's own
    /// (`isError`); the outer one the connection's.
    pub async fn call(
        &self,
        tool: &str,
        args: Value,
        key: &str,
        timeout: Duration,
    ) -> Result<Result<Value, String>, McpError> {
        let mut params = CallToolRequestParams::new(tool.to_string());
        params.arguments = match args {
            Value::Object(m) => Some(m),
            Value::Null => None,
            other => {
                return Ok(Err(format!(
                    "the arguments must be a JSON object, not {other}"
                )))
            }
        };
        let mut meta = serde_json::Map::new();
        meta.insert(
            "cairn/idempotencyKey".into(),
            Value::String(key.to_string()),
        );
        params.meta = Some(RequestMetaObject(MetaObject(meta)));
        let result = tokio::time::timeout(timeout, self.service.call_tool(params))
            .await
            .map_err(|_| {
                McpError::Protocol(format!("the tool did not answer within {}", human(timeout)))
            })?
            .map_err(|e| McpError::Protocol(e.to_string()))?;
        let text: Vec<String> = result
            .content
            .iter()
            .map(|c| match c {
                ContentBlock::Text(t) => t.text.clone(),
                other => serde_json::to_string(other).unwrap_or_default(),
            })
            .collect();
        if result.is_error == Some(true) {
            return Ok(Err(if text.is_empty() {
                "the tool reported an error".into()
            } else {
                text.join("\n")
            }));
        }
        Ok(Ok(match result.structured_content {
            Some(v) => v,
            None => Value::String(text.join("\n")),
        }))
    }

    /// Whether the connection is gone (the server exited or hung up).
    pub fn is_closed(&self) -> bool {
        self.service.is_transport_closed()
    }

    /// Ends the session and stops the server.
    pub async fn close(self) {
        let Connection { service, child, .. } = self;
        let _ = tokio::time::timeout(Duration::from_secs(2), service.cancel()).await;
        drop(child);
    }
}

fn human(d: Duration) -> String {
    if d.as_secs() >= 1 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}
