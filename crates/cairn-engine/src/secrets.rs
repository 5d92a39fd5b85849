//! A run's secrets: read from their sources when the run starts or
//! resumes, given to the processes of the nodes that name them, and masked
//! in everything the run writes (WORKFLOW.md, "Secrets and environment").
//!
//! Values live in this process's memory only: never in an event, the
//! store, the mirror, a trace or the web page. A resume reads them again,
//! so a rotated token is picked up and a removed one stops the resume
//! before anything runs.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;
use std::time::{Duration, Instant};

use cairn_events::Redactor;
use std::sync::Arc;

use cairn_workflow::{NodeSpec, SecretSource, Workflow};

use crate::error::EngineError;

/// Longest a secret's command may take.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);

/// Most bytes of a secret read from a file or a command.
const MAX_SECRET_BYTES: u64 = 64 * 1024;

/// The values of a run's declared secrets, and what masks them.
#[derive(Default)]
pub struct Secrets {
    values: BTreeMap<String, String>,
    redactor: Redactor,
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Names only, never values.
        f.debug_struct("Secrets")
            .field("names", &self.values.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Secrets {
    /// Reads every secret `wf` declares; the first that cannot be read is
    /// the error, naming the secret and its source, never a value.
    /// Blocking: a secret's command may take a while.
    pub fn resolve(
        declared: &BTreeMap<String, SecretSource>,
        base_dir: &Path,
    ) -> Result<Secrets, EngineError> {
        let mut values = BTreeMap::new();
        for (name, source) in declared {
            let value = read(base_dir, source).map_err(|reason| EngineError::Secret {
                name: name.clone(),
                from: source.to_string(),
                reason,
            })?;
            values.insert(name.clone(), value);
        }
        let redactor = Redactor::new(values.values().cloned());
        Ok(Secrets { values, redactor })
    }

    /// Whether the workflow declares none.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// A secret's value.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(String::as_str)
    }

    /// The values a workspace snapshot must not keep: a file that holds
    /// one is left out of it (as the redactor, values too short to tell
    /// apart from ordinary text are not looked for).
    pub fn to_withhold(&self) -> Arc<Vec<Vec<u8>>> {
        Arc::new(
            self.values
                .values()
                .filter(|v| v.len() >= cairn_events::MIN_SECRET_LEN)
                .map(|v| v.as_bytes().to_vec())
                .collect(),
        )
    }

    /// What masks the values in a run's records.
    pub fn redactor(&self) -> Redactor {
        self.redactor.clone()
    }

    /// The variables a node's processes get besides their own: the
    /// workflow's `env`, then the secrets the node names.
    pub fn process_env(&self, wf: &Workflow, spec: &NodeSpec) -> Vec<(String, String)> {
        let mut env: Vec<(String, String)> =
            wf.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        for name in &spec.secrets {
            if let Some(v) = self.values.get(name) {
                env.push((name.clone(), v.clone()));
            }
        }
        env
    }
}

/// The secrets `wf` declares, read on a blocking thread (a secret's
/// command may take a while).
pub(crate) async fn resolve_for(wf: &Workflow) -> Result<Arc<Secrets>, EngineError> {
    if wf.secrets.is_empty() {
        return Ok(Arc::default());
    }
    let (declared, dir) = (wf.secrets.clone(), wf.base_dir.clone());
    match tokio::task::spawn_blocking(move || Secrets::resolve(&declared, &dir)).await {
        Ok(r) => r.map(Arc::new),
        Err(e) => match e.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            Err(_) => Err(EngineError::ShuttingDown),
        },
    }
}

/// One secret's value from its source, one trailing newline dropped.
fn read(base_dir: &Path, source: &SecretSource) -> Result<String, String> {
    let mut value = match source {
        SecretSource::Env(var) => match std::env::var(var) {
            Ok(v) => v,
            Err(std::env::VarError::NotPresent) => return Err("it is not set".into()),
            Err(std::env::VarError::NotUnicode(_)) => {
                return Err("its value is not UTF-8 text".into())
            }
        },
        SecretSource::File(path) => {
            let path = base_dir.join(path);
            let file = std::fs::File::open(&path).map_err(|e| e.to_string())?;
            let mut text = String::new();
            file.take(MAX_SECRET_BYTES + 1)
                .read_to_string(&mut text)
                .map_err(|e| e.to_string())?;
            if text.len() as u64 > MAX_SECRET_BYTES {
                return Err(format!("it is larger than {MAX_SECRET_BYTES} bytes"));
            }
            text
        }
        SecretSource::Command(argv) => run(base_dir, argv)?,
    };
    if value.ends_with('\n') {
        value.pop();
        if value.ends_with('\r') {
            value.pop();
        }
    }
    if value.is_empty() {
        return Err("it is empty".into());
    }
    Ok(value)
}

/// A secret's command's standard output. Runs without a shell in the
/// workflow's folder with the engine's environment (a password manager's
/// CLI needs its session), its stderr left to the terminal.
fn run(base_dir: &Path, argv: &[String]) -> Result<String, String> {
    let mut child = std::process::Command::new(&argv[0])
        .args(&argv[1..])
        .current_dir(base_dir)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("it could not start: {e}"))?;
    let mut out = child.stdout.take().expect("stdout is piped");
    let reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let r = (&mut out).take(MAX_SECRET_BYTES + 1).read_to_end(&mut buf);
        r.map(|_| buf)
    });
    let deadline = Instant::now() + COMMAND_TIMEOUT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "it took longer than {}s",
                    COMMAND_TIMEOUT.as_secs()
                ));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => return Err(e.to_string()),
        }
    };
    let buf = reader
        .join()
        .map_err(|_| "its output could not be read".to_string())?
        .map_err(|e| e.to_string())?;
    if !status.success() {
        return Err(format!("it exited with {status}"));
    }
    if buf.len() as u64 > MAX_SECRET_BYTES {
        return Err(format!("it printed more than {MAX_SECRET_BYTES} bytes"));
    }
    String::from_utf8(buf).map_err(|_| "it printed something that is not UTF-8 text".into())
}
