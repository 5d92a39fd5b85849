//! One file-system watcher per engine, shared by every watched run: a
//! server that watches a thousand runs of a few files holds one inotify
//! instance (the kernel allows a user 128 of them) and one watch per
//! folder, not one per run.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;

/// The engine's watcher and who listens to it.
pub(crate) struct Hub {
    watcher: Mutex<notify::RecommendedWatcher>,
    shared: Arc<Mutex<Shared>>,
}

#[derive(Default)]
struct Shared {
    /// Each watched folder with how many subscriptions need it.
    dirs: HashMap<PathBuf, usize>,
    subs: HashMap<u64, Sub>,
    next: u64,
}

struct Sub {
    /// The files this subscription is told about, each as its folder's
    /// watch names it (the folder's canonical path and the file's name).
    files: HashSet<PathBuf>,
    tx: mpsc::UnboundedSender<()>,
}

impl Hub {
    /// A hub with its watcher. Folders are watched rather than files:
    /// editors save by writing a new file and renaming it over the old
    /// one, which ends a watch on the file itself.
    pub(crate) fn new() -> Result<Arc<Hub>, String> {
        let shared: Arc<Mutex<Shared>> = Arc::default();
        let seen = shared.clone();
        let watcher = notify::recommended_watcher(move |ev: notify::Result<notify::Event>| {
            let shared = seen.lock().unwrap_or_else(|p| p.into_inner());
            match ev {
                Ok(ev) => {
                    for sub in shared.subs.values() {
                        if ev.paths.iter().any(|p| sub.files.contains(p)) {
                            let _ = sub.tx.send(());
                        }
                    }
                }
                // Events were lost (the kernel's queue overflowed): every
                // subscriber looks again.
                Err(_) => {
                    for sub in shared.subs.values() {
                        let _ = sub.tx.send(());
                    }
                }
            }
        })
        .map_err(|e| format!("cannot watch files: {e}"))?;
        Ok(Arc::new(Hub {
            watcher: Mutex::new(watcher),
            shared,
        }))
    }

    /// A subscription that is told (`()`, "look again") when one of the
    /// files it is given next changes.
    pub(crate) fn subscribe(self: &Arc<Self>, tx: mpsc::UnboundedSender<()>) -> Subscription {
        let mut shared = self.lock();
        shared.next += 1;
        let id = shared.next;
        shared.subs.insert(
            id,
            Sub {
                files: HashSet::new(),
                tx,
            },
        );
        Subscription {
            hub: self.clone(),
            id,
            dirs: HashSet::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One watched run's files; dropping it stops the watching.
pub(crate) struct Subscription {
    hub: Arc<Hub>,
    id: u64,
    dirs: HashSet<PathBuf>,
}

impl Subscription {
    /// Watches exactly `files` from now on. Returns the files whose folder
    /// cannot be watched (it does not exist, or the watcher refuses it),
    /// with why.
    pub(crate) fn set_files(&mut self, files: &[PathBuf]) -> Vec<(PathBuf, String)> {
        let mut refused = Vec::new();
        let mut keys = HashSet::new();
        let mut wanted: HashMap<PathBuf, Vec<PathBuf>> = HashMap::new();
        for f in files {
            match watch_key(f) {
                Some((dir, key)) => {
                    keys.insert(key);
                    wanted.entry(dir).or_default().push(f.clone());
                }
                None => refused.push((f.clone(), "its folder does not exist".to_string())),
            }
        }
        // The watcher's lock orders the changes to the watched folders; the
        // shared state is never held while the watcher works, since the
        // watcher's thread takes it to hand out events, and adding a watch
        // waits for that thread.
        let mut watcher = self.hub.watcher.lock().unwrap_or_else(|p| p.into_inner());
        let mut dirs = HashSet::new();
        for (dir, its_files) in wanted {
            if self.dirs.contains(&dir) {
                dirs.insert(dir);
                continue;
            }
            let watched = self.hub.lock().dirs.contains_key(&dir);
            if !watched {
                if let Err(e) = watcher.watch(&dir, RecursiveMode::NonRecursive) {
                    let why = e.to_string();
                    refused.extend(its_files.into_iter().map(|f| (f, why.clone())));
                    continue;
                }
            }
            *self.hub.lock().dirs.entry(dir.clone()).or_insert(0) += 1;
            dirs.insert(dir);
        }
        for dir in self.dirs.difference(&dirs) {
            release(&mut watcher, &self.hub, dir);
        }
        self.dirs = dirs;
        if let Some(sub) = self.hub.lock().subs.get_mut(&self.id) {
            sub.files = keys;
        }
        refused
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut watcher = self.hub.watcher.lock().unwrap_or_else(|p| p.into_inner());
        self.hub.lock().subs.remove(&self.id);
        for dir in &self.dirs {
            release(&mut watcher, &self.hub, dir);
        }
    }
}

/// One subscription less needs `dir`; the last one unwatches it.
fn release(watcher: &mut notify::RecommendedWatcher, hub: &Hub, dir: &Path) {
    let last = {
        let mut shared = hub.lock();
        match shared.dirs.get_mut(dir) {
            Some(count) if *count > 1 => {
                *count -= 1;
                false
            }
            Some(_) => {
                shared.dirs.remove(dir);
                true
            }
            None => false,
        }
    };
    if last {
        let _ = watcher.unwatch(dir);
    }
}

/// The folder to watch for `file` and the path its events name it by.
fn watch_key(file: &Path) -> Option<(PathBuf, PathBuf)> {
    let name = file.file_name()?;
    let dir = match file.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let dir = dir.canonicalize().ok()?;
    let key = dir.join(name);
    Some((dir, key))
}
