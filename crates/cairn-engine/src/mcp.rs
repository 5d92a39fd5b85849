//! A run's MCP servers: started once per driver session when a node first
//! needs one (`McpServerStarting`, then `McpServerConnected` with its tool
//! count and start time, or `McpServerDisconnected` with why it could not
//! start), their stderr logged as `McpServerStderr`, and stopped before the
//! run ends or stops (`McpServerDisconnected`). A resume starts them again
//! when a node needs them.
//!
//! stdio servers run in the workflow's sandbox (root, hidden store, limits)
//! with its network setting: shut by the kernel, open, or a host list
//! served by the filtering proxy, as for every process of the run. Their
//! environment is the workflow's `env`, the secrets of the node that needs
//! them and what the server declares: a node that names other secrets (or
//! none) gets a server of its own, so no node reaches a secret through a
//! server another node started.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use cairn_events::{EventKind, Scope};
use cairn_mcp::Connection;
use cairn_store::RunLog;
use cairn_workflow::{McpServerDef, McpTransport, NodeSandbox, Workflow};
use tokio::sync::{Mutex, OnceCell};

use crate::services::Services;

/// One server's connection, made at most once (concurrent first uses wait
/// for the same start).
type Slot = Arc<OnceCell<Result<Arc<Connection>, String>>>;

/// The MCP servers of one driver session of a run.
pub(crate) struct McpPool {
    wf: Arc<Workflow>,
    services: Arc<Services>,
    log: Arc<RunLog>,
    /// By [`slot_key`]: a server started for a node that names secrets is
    /// that node's (and its like's), never shared with a node that does not.
    slots: Mutex<HashMap<String, (String, Slot)>>,
}

/// A started server's key: its name, and the names of the variables the
/// node gives its processes (the workflow's `env` and the node's secrets).
fn slot_key(server: &str, env: &[(String, String)]) -> String {
    let mut names: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    let mut key = server.to_string();
    for n in names {
        key.push('\0');
        key.push_str(n);
    }
    key
}

impl McpPool {
    pub(crate) fn new(wf: Arc<Workflow>, services: Arc<Services>, log: Arc<RunLog>) -> Self {
        McpPool {
            wf,
            services,
            log,
            slots: Mutex::new(HashMap::new()),
        }
    }

    /// The connection to `server` for a node whose processes get `env`
    /// (the workflow's `env`, then the secrets the node names), started on
    /// first use. A stdio server gets those variables like the node's
    /// commands do, so it is shared only by nodes that give the same ones.
    /// A server that hung up since is started again.
    pub(crate) async fn connect(
        &self,
        server: &str,
        env: &[(String, String)],
    ) -> Result<Arc<Connection>, String> {
        let key = slot_key(server, env);
        let slot = {
            let mut slots = self.slots.lock().await;
            let stale = slots
                .get(&key)
                .and_then(|(_, s)| s.get())
                .is_some_and(|r| r.as_ref().is_ok_and(|c| c.is_closed()));
            if stale {
                self.log.append(
                    Scope::run(),
                    EventKind::McpServerDisconnected {
                        server: server.to_string(),
                        reason: Some("the server hung up; starting it again".into()),
                    },
                );
                slots.remove(&key);
            }
            slots
                .entry(key)
                .or_insert_with(|| (server.to_string(), Slot::default()))
                .1
                .clone()
        };
        slot.get_or_init(|| self.start(server, env)).await.clone()
    }

    async fn start(
        &self,
        server: &str,
        node_env: &[(String, String)],
    ) -> Result<Arc<Connection>, String> {
        let Some(def) = self.wf.mcp_servers.get(server) else {
            return Err(format!("the workflow declares no MCP server `{server}`"));
        };
        let (command, args) = match &def.transport {
            McpTransport::Stdio { command, .. } => (command[0].clone(), command[1..].to_vec()),
            McpTransport::Http { url, .. } => (url.clone(), Vec::new()),
        };
        self.log.append(
            Scope::run(),
            EventKind::McpServerStarting {
                server: server.to_string(),
                command,
                args,
            },
        );
        let result = self.open(server, def, node_env).await;
        match &result {
            Ok(conn) => self.log.append(
                Scope::run(),
                EventKind::McpServerConnected {
                    server: server.to_string(),
                    tool_count: conn.tools().len() as u32,
                    start_ms: conn.start_time().as_millis() as u64,
                },
            ),
            Err(e) => self.log.append(
                Scope::run(),
                EventKind::McpServerDisconnected {
                    server: server.to_string(),
                    reason: Some(e.clone()),
                },
            ),
        };
        result.map(Arc::new)
    }

    async fn open(
        &self,
        server: &str,
        def: &McpServerDef,
        node_env: &[(String, String)],
    ) -> Result<Connection, String> {
        match &def.transport {
            McpTransport::Http { url, headers_env } => {
                let mut headers = Vec::new();
                for (header, var) in headers_env {
                    let value = std::env::var(var).map_err(|_| {
                        format!("header `{header}`: environment variable `{var}` is not set")
                    })?;
                    headers.push((header.clone(), value));
                }
                Connection::http(url, &headers)
                    .await
                    .map_err(|e| e.to_string())
            }
            McpTransport::Stdio {
                command,
                env: env_decl,
            } => {
                let sandbox = self
                    .services
                    .sandbox_for(&self.wf, None, None, &NodeSandbox::default())
                    .map_err(|e| e.info.message)?;
                // The workflow's `env` and the node's secrets, then what
                // the server declares (which wins, as a node's `env` does
                // over the workflow's).
                let mut env: Vec<(String, String)> = node_env.to_vec();
                env.extend(env_decl.iter().map(|(k, v)| (k.clone(), v.clone())));
                // So that a resume after a crash finds what the dead engine
                // left running.
                env.extend(self.services.process_env(self.log.run_id()));
                let spec = cairn_tools::process::ProcessSpec {
                    argv: command.clone(),
                    cwd: sandbox.root().to_path_buf(),
                    env,
                    // Only what the server and the node give it, never the
                    // engine's own environment.
                    clear_env: true,
                    timeout: None,
                    max_output_bytes: 0,
                    network: sandbox.network(),
                    confine: sandbox.confinement(),
                    proxy: sandbox.network_hosts(),
                };
                let log = self.log.clone();
                let name = server.to_string();
                Connection::stdio(spec, move |line| {
                    log.append(
                        Scope::run(),
                        EventKind::McpServerStderr {
                            server: name.clone(),
                            message: line.to_string(),
                        },
                    );
                })
                .await
                .map_err(|e| e.to_string())
            }
        }
    }

    /// Whether no server was started in this session: the pool can then
    /// be replaced without stopping anything. A pool busy starting one is
    /// not idle.
    pub(crate) fn is_idle(&self) -> bool {
        self.slots.try_lock().is_ok_and(|s| s.is_empty())
    }

    /// The longest a call to `server`'s tools may take.
    pub(crate) fn timeout(&self, server: &str) -> Duration {
        self.wf
            .mcp_servers
            .get(server)
            .and_then(|d| d.timeout)
            .unwrap_or_else(|| {
                self.wf
                    .sandbox
                    .tool_timeout
                    .unwrap_or(Duration::from_secs(60))
            })
    }

    /// Stops every server that was started, logging why.
    pub(crate) async fn close(&self, reason: &str) {
        let slots: Vec<(String, Slot)> = self.slots.lock().await.drain().map(|(_, v)| v).collect();
        for (server, slot) in slots {
            let Some(Ok(conn)) = slot.get().cloned() else {
                continue;
            };
            drop(slot);
            self.log.append(
                Scope::run(),
                EventKind::McpServerDisconnected {
                    server,
                    reason: Some(reason.to_string()),
                },
            );
            if let Ok(conn) = Arc::try_unwrap(conn) {
                conn.close().await;
            }
        }
    }
}
