//! What every run of an engine shares: the journal and the tools.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use cairn_snapshot::SnapshotStore;
use cairn_store::Journal;
use cairn_tools::process::NetworkPolicy;
use cairn_tools::{Limits, Sandbox, ToolRegistry};
use cairn_workflow::{Isolation, NodeSandbox, ResourceLimits, Workflow};

use crate::node::NodeError;

pub(crate) struct Services {
    pub journal: Journal,
    pub tools: ToolRegistry,
    sandboxes: Mutex<HashMap<String, Arc<Sandbox>>>,
    /// The engine these services belong to, for nodes that start child
    /// runs. Weak: the engine owns the services.
    engine: Weak<crate::Inner>,
    /// Most parents a child run may have.
    pub max_depth: u32,
    /// This store's identity, in every process a run starts
    /// ([`cairn_tools::STORE_ENV`]).
    pub store_tag: String,
    /// Where workspace snapshots go ([`crate::EngineOptions::snapshot_dir`]).
    snapshot_dir: Option<PathBuf>,
    /// The snapshot repository, opened when a node first needs it.
    snapshots: std::sync::OnceLock<Result<Arc<SnapshotStore>, String>>,
    /// Whether the folders of [`Services::kept_paths`] were made.
    kept_made: std::sync::Once,
}

impl Services {
    pub fn new(
        journal: Journal,
        tools: ToolRegistry,
        engine: Weak<crate::Inner>,
        max_depth: u32,
        snapshot_dir: Option<PathBuf>,
    ) -> Self {
        // Where control groups go is decided when the first process of any
        // run starts (`cairn_tools::process`), before it starts: a run of
        // value nodes never probes.
        let store_tag = journal.backend().store_id();
        let snapshot_dir = snapshot_dir
            .or_else(|| {
                let db = journal.files().into_iter().next()?;
                Some(db.parent()?.join("snapshots"))
            })
            .map(|d| absolute(&d));
        Services {
            snapshot_dir,
            snapshots: std::sync::OnceLock::new(),
            kept_made: std::sync::Once::new(),
            journal,
            tools,
            sandboxes: Mutex::new(HashMap::new()),
            engine,
            max_depth,
            store_tag,
        }
    }

    /// Where replays keep their copies of the root: `replays` beside the
    /// snapshot repository. `None` for an engine that keeps no snapshots.
    pub fn replay_dir(&self) -> Option<PathBuf> {
        Some(self.snapshot_dir.as_ref()?.parent()?.join("replays"))
    }

    /// The root folder `wf` runs its nodes in.
    pub fn root_of(wf: &Workflow) -> PathBuf {
        match &wf.sandbox.root {
            Some(r) if Path::new(r).is_absolute() => r.into(),
            Some(r) => wf.base_dir.join(r),
            None => wf.base_dir.clone(),
        }
    }

    /// The variables that mark a process as `run_id`'s in this store, so
    /// that a resume after a crash can find and kill what the dead engine
    /// left running, and nothing else.
    pub fn process_env(&self, run_id: &cairn_events::RunId) -> [(String, String); 2] {
        [
            (cairn_tools::RUN_ENV.to_string(), run_id.to_string()),
            (cairn_tools::STORE_ENV.to_string(), self.store_tag.clone()),
        ]
    }

    /// The snapshot repository, unless this engine keeps none; an error
    /// when it cannot be made (said once per attempt that wanted one).
    pub fn snapshot_store(&self) -> Option<Result<Arc<SnapshotStore>, String>> {
        let dir = self.snapshot_dir.as_ref()?;
        Some(
            self.snapshots
                .get_or_init(|| {
                    let backend = self.journal.backend().clone();
                    SnapshotStore::open(dir, cairn_snapshot::Options::default())
                        .map(|s| match backend.snapshot_objects() {
                            // A store many machines share keeps the
                            // objects too; the folder is this machine's copy.
                            Some(_) => s.with_mirror(Arc::new(StoreObjects(backend))),
                            None => s,
                        })
                        .map(Arc::new)
                        .map_err(|e| format!("the snapshot repository: {e}"))
                })
                .clone(),
        )
    }

    /// The workflow's sandbox root and what snapshots of it leave out:
    /// what the sandbox hides ([`Services::kept_paths`]).
    pub fn workspace(&self, wf: &Workflow) -> Result<(PathBuf, Vec<PathBuf>), NodeError> {
        let sandbox = self.workflow_sandbox(wf)?;
        let root = sandbox.root().to_path_buf();
        let hidden = hidden_paths(&root, self.kept_paths());
        Ok((root, hidden))
    }

    /// Every path Cairn keeps for this engine, absolute: the store's files
    /// (database, WAL, shared memory, rollback journal, run locks, wake-up
    /// markers), the NDJSON mirrors' folder, and the workspace snapshot
    /// repository. No process a node starts may see any of them, wherever
    /// they lie (in its root, beside it, elsewhere), and no snapshot may
    /// hold them: the sandbox's hidden list and the snapshot walk's
    /// exclusions are both made from this list and nothing else
    /// ([`Services::workspace`], `workflow_sandbox`).
    ///
    /// A feature that keeps files of its own adds their paths here (and
    /// makes them before any node runs, as [`Services::make_kept`] does, so
    /// that no node can plant them first); nowhere else.
    pub fn kept_paths(&self) -> Vec<PathBuf> {
        let mut kept = self.journal.files();
        kept.extend(self.snapshot_dir.iter().cloned());
        let mut out: Vec<PathBuf> = Vec::with_capacity(kept.len());
        for p in kept.iter().map(|p| absolute(p)) {
            if !out.contains(&p) {
                out.push(p);
            }
        }
        out
    }

    /// Makes the folders of [`Services::kept_paths`] that Cairn would only
    /// make later (the snapshot repository's, the mirrors'), once per
    /// engine and before any sandbox exists: a path that does not exist
    /// cannot be covered in a sandbox, and one in a node's root could be
    /// planted by the node (a folder of its own, a link elsewhere) for the
    /// engine to use. The store makes its own ([`cairn_store::Backend::files`]).
    fn make_kept(&self) {
        self.kept_made.call_once(|| {
            let log_dir = self.journal.log_dir().map(absolute);
            for dir in self.snapshot_dir.iter().chain(log_dir.iter()) {
                if let Err(e) = std::fs::create_dir_all(dir) {
                    tracing::warn!(folder = %dir.display(), error = %e, "cannot make a folder Cairn keeps");
                }
            }
        });
    }

    /// The engine, unless it is gone (then nothing may start).
    pub fn engine(&self) -> Option<crate::Engine> {
        self.engine.upgrade().map(|inner| crate::Engine { inner })
    }

    /// The sandbox a node's tool calls run in: the workflow's (built once
    /// per workflow text), with the node's own lower limits when it has any.
    /// Limits only ever go down: workflow ≥ node ≥ call.
    /// The node's `sandbox:` overrides the workflow's isolation and limits.
    pub fn sandbox_for(
        &self,
        wf: &Workflow,
        node_output: Option<usize>,
        node_timeout: Option<Duration>,
        node_sandbox: &NodeSandbox,
    ) -> Result<Arc<Sandbox>, NodeError> {
        let base = self.workflow_sandbox(wf)?;
        if node_output.is_none()
            && node_timeout.is_none()
            && *node_sandbox == NodeSandbox::default()
        {
            return Ok(base);
        }
        let ceiling = base.limits();
        let limits = Limits {
            max_output_bytes: node_output.map_or(ceiling.max_output_bytes, |b| {
                b.min(ceiling.max_output_bytes)
            }),
            timeout: node_timeout.map_or(ceiling.timeout, |t| t.min(ceiling.timeout)),
        };
        let isolation = node_sandbox
            .isolation
            .map_or(base.isolation(), isolation_of);
        let resources = resources_of(wf.sandbox.limits.overridden_by(node_sandbox.limits));
        let sandbox = base
            .derive(limits)
            .map_err(|e| NodeError::fatal("sandbox", e.to_string()))?
            .with_isolation(isolation)
            .with_resources(resources);
        Ok(Arc::new(sandbox))
    }

    /// The most bytes of a result the workflow's sandbox keeps.
    pub fn sandbox_limit(&self, wf: &Workflow) -> usize {
        self.workflow_sandbox(wf)
            .map(|s| s.limits().max_output_bytes)
            .unwrap_or(Limits::default().max_output_bytes)
    }

    fn workflow_sandbox(&self, wf: &Workflow) -> Result<Arc<Sandbox>, NodeError> {
        // By the definition and the root: a replay runs the same
        // definition in a copy of the root.
        let cache_key = format!("{}\0{}", wf.hash, wf.sandbox.root.as_deref().unwrap_or(""));
        if let Some(s) = self.sandboxes.lock().unwrap().get(&cache_key) {
            return Ok(s.clone());
        }
        let root = Services::root_of(wf);
        let defaults = Limits::default();
        let limits = Limits {
            max_output_bytes: wf
                .sandbox
                .max_output_bytes
                .map_or(defaults.max_output_bytes, |b| b as usize),
            timeout: wf.sandbox.tool_timeout.unwrap_or(defaults.timeout),
        }
        .capped();
        let network = if wf.sandbox.network {
            NetworkPolicy::Allow
        } else {
            NetworkPolicy::Deny
        };
        let mut sandbox = Sandbox::new(&root)
            .map_err(|e| NodeError::fatal("sandbox", e.to_string()))?
            .with_network(network)
            .with_limits(limits);
        if !wf.sandbox.network_hosts.is_empty() {
            let hosts = cairn_tools::HostRules::parse(&wf.sandbox.network_hosts)
                .map_err(|e| NodeError::fatal("sandbox", format!("sandbox.network: {e}")))?;
            sandbox = sandbox.with_network_hosts(hosts);
        }
        self.make_kept();
        let hidden = hidden_paths(sandbox.root(), self.kept_paths());
        let sandbox = sandbox
            .with_env(vec![(
                cairn_tools::STORE_ENV.to_string(),
                self.store_tag.clone(),
            )])
            .with_hidden(hidden)
            .with_isolation(isolation_of(wf.sandbox.isolation))
            .with_resources(resources_of(wf.sandbox.limits))
            .with_read_only(read_only_of(wf, &root));
        let sandbox = Arc::new(sandbox);
        self.sandboxes
            .lock()
            .unwrap()
            .insert(cache_key, sandbox.clone());
        Ok(sandbox)
    }
}

/// What the sandbox shows read-only: the workflow's `read_only` folders,
/// and the files that define what the run does (the workflow, its child
/// workflows, its models' scripts) where they lie in the root, so that no
/// node rewrites the definition of its own walls or of a later node's
/// (docs/reload.md#pinned-files). Their texts are pinned anyway; this
/// keeps a person's file as the person left it.
fn read_only_of(wf: &Workflow, root: &Path) -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = wf.sandbox.read_only.iter().map(PathBuf::from).collect();
    let mut files = vec![wf.path.clone()];
    match &wf.pinned {
        Some(pinned) => files.extend(pinned.keys().cloned()),
        None => {
            files.extend(wf.child_paths().iter().map(|(p, _)| wf.resolve(p)));
            files.extend(
                wf.models
                    .values()
                    .filter_map(|m| m.script.as_ref())
                    .map(|s| wf.base_dir.join(s)),
            );
        }
    }
    let Ok(root) = root.canonicalize() else {
        return paths;
    };
    for f in files {
        if let Ok(real) = f.canonicalize() {
            if real.starts_with(&root) && real != root && !paths.contains(&real) {
                paths.push(real);
            }
        }
    }
    paths
}

fn isolation_of(i: Isolation) -> cairn_tools::Isolation {
    match i {
        Isolation::Namespaces => cairn_tools::Isolation::Namespaces,
        Isolation::None => cairn_tools::Isolation::None,
    }
}

/// The workflow's limits as rlimits (CPU time rounded up to whole seconds).
fn resources_of(l: ResourceLimits) -> cairn_tools::cairn_sandbox::ResourceLimits {
    cairn_tools::cairn_sandbox::ResourceLimits {
        memory_bytes: l.memory_bytes,
        processes: l.processes,
        cpu_seconds: l.cpu.map(|d| d.as_secs() + u64::from(d.subsec_nanos() > 0)),
    }
}

/// `p` made absolute without following its last component: canonical
/// where it exists, else its canonical folder and its name, else joined to
/// the working directory.
fn absolute(p: &Path) -> PathBuf {
    if let Ok(c) = p.canonicalize() {
        return c;
    }
    let parent = match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    match (parent.canonicalize(), p.file_name()) {
        (Ok(dir), Some(name)) => dir.join(name),
        _ => std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf()),
    }
}

/// What processes must not see of what Cairn keeps ([`Services::kept_paths`]):
/// a folder of it inside the sandbox root (`.cairn`) is hidden whole, so
/// nothing can be created in it either; paths directly in the root (a
/// store given as `--store cairn.db`), or outside it, are hidden one by
/// one.
fn hidden_paths(root: &Path, files: Vec<PathBuf>) -> Vec<PathBuf> {
    let mut hidden: Vec<PathBuf> = Vec::new();
    for f in files {
        let abs = match f.parent().map(|d| (d, d.canonicalize())) {
            Some((_, Ok(dir))) if dir.starts_with(root) && dir != root => dir,
            Some((_, Ok(dir))) => match f.file_name() {
                Some(name) => dir.join(name),
                None => continue,
            },
            _ => f,
        };
        if !hidden.contains(&abs) {
            hidden.push(abs);
        }
    }
    hidden
}

/// The store's snapshot objects ([`cairn_store::SnapshotObjects`]) as the
/// mirror of the snapshot repository, for a store many machines share.
struct StoreObjects(Arc<dyn cairn_store::Backend>);

impl StoreObjects {
    fn objects(&self) -> Result<&dyn cairn_store::SnapshotObjects, String> {
        self.0
            .snapshot_objects()
            .ok_or_else(|| "the store keeps no snapshot objects".to_string())
    }
}

impl cairn_snapshot::ObjectMirror for StoreObjects {
    fn holds(
        &self,
        ids: &[cairn_snapshot::ObjectId],
    ) -> Result<std::collections::HashSet<cairn_snapshot::ObjectId>, String> {
        let raw: Vec<[u8; 20]> = ids.iter().map(|i| i.0).collect();
        self.objects()?
            .objects_held(&raw)
            .map(|held| held.into_iter().map(cairn_snapshot::ObjectId).collect())
            .map_err(|e| e.to_string())
    }

    fn put(&self, objects: &[cairn_snapshot::MirroredObject]) -> Result<(), String> {
        let rows: Vec<cairn_store::StoredObject> = objects
            .iter()
            .map(|o| cairn_store::StoredObject {
                id: o.id.0,
                kind: o.kind.name().to_string(),
                body: o.body.clone(),
            })
            .collect();
        self.objects()?
            .put_objects(&rows)
            .map_err(|e| e.to_string())
    }

    fn get(
        &self,
        ids: &[cairn_snapshot::ObjectId],
    ) -> Result<Vec<cairn_snapshot::MirroredObject>, String> {
        let raw: Vec<[u8; 20]> = ids.iter().map(|i| i.0).collect();
        let rows = self
            .objects()?
            .get_objects(&raw)
            .map_err(|e| e.to_string())?;
        Ok(rows
            .into_iter()
            .filter_map(|r| {
                Some(cairn_snapshot::MirroredObject {
                    id: cairn_snapshot::ObjectId(r.id),
                    kind: cairn_snapshot::Kind::parse(&r.kind)?,
                    body: r.body,
                })
            })
            .collect())
    }

    fn retain(
        &self,
        live: &std::collections::HashSet<cairn_snapshot::ObjectId>,
        grace: Duration,
    ) -> Result<(u64, u64, u64), String> {
        let live: std::collections::HashSet<[u8; 20]> = live.iter().map(|i| i.0).collect();
        let before = std::time::SystemTime::now()
            .checked_sub(grace)
            .unwrap_or(std::time::UNIX_EPOCH)
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        self.objects()?
            .retain_objects(&live, before)
            .map_err(|e| e.to_string())
    }
}
