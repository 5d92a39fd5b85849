//! Wake-ups between processes that share a SQLite store on one machine.
//!
//! SQLite has no LISTEN/NOTIFY, so the store brings its own: each listener
//! binds a datagram socket in Linux's abstract namespace (no file to clean
//! up: the kernel drops the name with the socket) and leaves an empty marker
//! file named after its topic and itself in `<store dir>/wake/<store>/<kind>/`,
//! so that a notifier can find it. A notification is one empty datagram to
//! every listener of the topic; a listener that died is found by the refused
//! send and its marker removed.
//!
//! Markers are files in one folder per kind, not folders per topic: a folder
//! holds a block of the disk, and on a file system mounted with `discard`,
//! removing the last folder of a run's topic waited for the device to discard
//! that block, on the runtime thread that dropped the listener (a thousand
//! runs ending at once held both runtime threads for tens of milliseconds).
//! An empty file has no block to give back.
//!
//! A wake-up carries nothing but "look again": the data is always in the
//! store, so a lost or forged datagram costs a read, never correctness.
//! Abstract sockets belong to a network namespace, so a node's sandbox with
//! a namespace of its own cannot reach them.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::io::ErrorKind;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};

use sha2::{Digest, Sha256};

use cairn_storage::{Listener, StoreError, Topic};

static NEXT_LISTENER: AtomicU64 = AtomicU64::new(1);

/// The wake-up registry of one store.
#[derive(Debug, Clone)]
pub(crate) struct WakeDir {
    dir: PathBuf,
    /// Tells stores apart in the machine-wide abstract namespace.
    store_tag: String,
}

impl WakeDir {
    /// The registry of the store whose database is `db`, kept in `dir`.
    pub(crate) fn new(db: &Path, dir: PathBuf) -> WakeDir {
        let canonical = db
            .parent()
            .and_then(|p| std::fs::canonicalize(p).ok())
            .map(|p| p.join(db.file_name().unwrap_or_default()))
            .unwrap_or_else(|| db.to_path_buf());
        WakeDir {
            dir,
            store_tag: short_hash(canonical.as_os_str().as_encoded_bytes()),
        }
    }

    fn topic_tag(topic: Topic<'_>) -> String {
        short_hash(topic.key().as_bytes())
    }

    /// The folder of every topic of `topic`'s kind. Kinds are kept apart so
    /// that [`WakeDir::notify_all`] lists only its own: every run's driver
    /// listens to its inbox, while a run's events have listeners only when
    /// another process watches it.
    fn kind_dir(&self, topic: Topic<'_>) -> PathBuf {
        let kind = match topic {
            Topic::Inbox(_) => "inbox",
            Topic::Events(_) => "events",
            Topic::Released => "work",
            Topic::Queued => "queued",
        };
        self.dir.join(&self.store_tag).join(kind)
    }

    fn address(&self, topic_tag: &str, name: &str) -> std::io::Result<SocketAddr> {
        let abstract_name = format!("cairn/{}/{topic_tag}/{name}", self.store_tag);
        SocketAddr::from_abstract_name(abstract_name.as_bytes())
    }

    /// Wakes every listener of `topic`. Best effort: a failure only delays
    /// a listener until its own fallback poll.
    pub(crate) fn notify(&self, topic: Topic<'_>) {
        self.notify_all(std::slice::from_ref(&topic));
    }

    /// Wakes the listeners of every topic: one listing per kind finds the
    /// topics anyone listens to, instead of one look per topic, which a
    /// commit of a thousand runs would pay a thousand times.
    pub(crate) fn notify_all(&self, topics: &[Topic<'_>]) {
        let mut listed: Vec<(PathBuf, Listed)> = Vec::new();
        let mut sock: Option<UnixDatagram> = None;
        for &topic in topics {
            let kind = self.kind_dir(topic);
            let i = match listed.iter().position(|(k, _)| *k == kind) {
                Some(i) => i,
                None => {
                    let l = Listed::read(&kind);
                    listed.push((kind, l));
                    listed.len() - 1
                }
            };
            let (kind, l) = &listed[i];
            let tag = Self::topic_tag(topic);
            if let Some(names) = l.markers.get(&tag) {
                let sock = match &sock {
                    Some(s) => s,
                    None => match UnixDatagram::unbound() {
                        Ok(s) => {
                            let _ = s.set_nonblocking(true);
                            sock.insert(s)
                        }
                        Err(_) => return,
                    },
                };
                for name in names {
                    self.wake_one(sock, &tag, name, &kind.join(format!("{tag}-{name}")));
                }
            }
            if l.folders.contains(&tag) {
                self.wake_folder(&tag, &kind.join(&tag));
            }
        }
    }

    /// Sends one wake-up; a listener whose name nobody binds any more died,
    /// and its marker goes.
    fn wake_one(&self, sock: &UnixDatagram, tag: &str, name: &str, marker: &Path) {
        let Ok(addr) = self.address(tag, name) else {
            return;
        };
        match sock.send_to_addr(&[], &addr) {
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::ConnectionRefused => {
                let _ = std::fs::remove_file(marker);
            }
            // A full queue already holds a wake-up for it.
            Err(_) => {}
        }
    }

    /// Wakes the listeners of a topic folder, where builds before the flat
    /// layout leave their markers: such a process may share the store
    /// during an upgrade.
    fn wake_folder(&self, tag: &str, dir: &Path) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        let Ok(sock) = UnixDatagram::unbound() else {
            return;
        };
        let _ = sock.set_nonblocking(true);
        for entry in entries.flatten() {
            if let Some(name) = entry.file_name().to_str() {
                self.wake_one(&sock, tag, name, &entry.path());
            }
        }
    }

    /// Registers a listener of `topic`.
    pub(crate) fn listen(&self, topic: Topic<'_>) -> Result<Box<dyn Listener>, StoreError> {
        let tag = Self::topic_tag(topic);
        let dir = self.kind_dir(topic);
        let name = format!(
            "{}-{}",
            std::process::id(),
            NEXT_LISTENER.fetch_add(1, Ordering::Relaxed)
        );
        let addr = self
            .address(&tag, &name)
            .map_err(|e| StoreError::io(&dir, e))?;
        let sock = UnixDatagram::bind_addr(&addr).map_err(|e| StoreError::io(&dir, e))?;
        sock.set_nonblocking(true)
            .map_err(|e| StoreError::io(&dir, e))?;
        let marker = dir.join(format!("{tag}-{name}"));
        if let Err(e) = std::fs::write(&marker, b"") {
            if e.kind() != ErrorKind::NotFound {
                return Err(StoreError::io(&marker, e));
            }
            // The kind's folder is made once and stays.
            std::fs::create_dir_all(&dir).map_err(|e| StoreError::io(&dir, e))?;
            std::fs::write(&marker, b"").map_err(|e| StoreError::io(&marker, e))?;
        }
        Ok(Box::new(SocketListener {
            std: Some(sock),
            tokio: None,
            marker,
        }))
    }
}

/// What one listing of a kind's folder found.
#[derive(Default)]
struct Listed {
    /// Listener names by topic tag, from markers `<tag>-<name>`.
    markers: HashMap<String, Vec<String>>,
    /// Topic folders of builds before the flat layout.
    folders: HashSet<String>,
}

impl Listed {
    fn read(kind: &Path) -> Listed {
        let mut l = Listed::default();
        let Ok(entries) = std::fs::read_dir(kind) else {
            // Nobody ever listened: the common case, one syscall.
            return l;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            // Tags are hex, so the first `-` ends one.
            match name.split_once('-') {
                Some((tag, who)) => l
                    .markers
                    .entry(tag.to_string())
                    .or_default()
                    .push(who.to_string()),
                None => {
                    l.folders.insert(name.to_string());
                }
            }
        }
        l
    }
}

fn short_hash(bytes: &[u8]) -> String {
    hex_prefix(&Sha256::digest(bytes), 12)
}

fn hex_prefix(bytes: &[u8], n: usize) -> String {
    bytes.iter().take(n).map(|b| format!("{b:02x}")).collect()
}

/// A registered listener; unregisters itself when dropped.
struct SocketListener {
    /// The socket until the first wait, which needs a runtime to register it.
    std: Option<UnixDatagram>,
    tokio: Option<tokio::net::UnixDatagram>,
    marker: PathBuf,
}

impl Listener for SocketListener {
    fn wait(&mut self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            if self.tokio.is_none() {
                let Some(std) = self.std.take() else {
                    return std::future::pending().await;
                };
                match tokio::net::UnixDatagram::from_std(std) {
                    Ok(s) => self.tokio = Some(s),
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot watch for wake-ups; falling back to polling");
                        return std::future::pending().await;
                    }
                }
            }
            let sock = self.tokio.as_ref().expect("set above");
            let mut buf = [0u8; 16];
            if sock.recv(&mut buf).await.is_err() {
                return std::future::pending().await;
            }
            // Several wake-ups that queued meanwhile ask for one look.
            while sock.try_recv(&mut buf).is_ok() {}
        })
    }
}

impl Drop for SocketListener {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.marker);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A process of a build that kept a folder per topic may share the
    /// store during an upgrade: its listeners are still woken.
    #[test]
    fn listeners_in_topic_folders_are_woken() {
        let dir = tempfile::tempdir().unwrap();
        let wake = WakeDir::new(&dir.path().join("s.db"), dir.path().join("wake"));
        let topic = Topic::Inbox("r");
        let tag = WakeDir::topic_tag(topic);
        let name = format!("{}-legacy", std::process::id());
        let sock = UnixDatagram::bind_addr(&wake.address(&tag, &name).unwrap()).unwrap();
        sock.set_nonblocking(true).unwrap();
        let folder = wake.kind_dir(topic).join(&tag);
        std::fs::create_dir_all(&folder).unwrap();
        std::fs::write(folder.join(&name), b"").unwrap();
        // A marker of a listener that died goes when a wake-up finds it.
        let dead = folder.join(format!("{}-gone", std::process::id()));
        std::fs::write(&dead, b"").unwrap();
        wake.notify(topic);
        let mut buf = [0u8; 4];
        assert_eq!(
            sock.recv(&mut buf).unwrap(),
            0,
            "a wake-up is an empty datagram"
        );
        assert!(!dead.exists(), "the dead listener's marker stayed");
        assert!(folder.join(&name).exists());
    }
}
